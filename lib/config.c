/*
 * config.c — resolve options: the caller's struct first, then the environment with
 * the launcher conventions users already have (torchrun: RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK; Slurm:
 * SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS_PER_NODE,
 * SLURM_TASKS_PER_NODE), then CKPT_*, then defaults. Options structs may come from
 * an older caller (a smaller size): fields past its size take their defaults.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "glue.h"

#define DEFAULT_POOL_BYTES  (256ull << 20)
#define DEFAULT_CHUNK_BYTES (16ull << 20)
#define DEFAULT_PORT        29600u
#define CONFIG_MAX_SECRET   4096u   /* bytes of a job secret */
#define CONFIG_MIN_SECRET   16u     /* shorter ones are warned about */
/* CKPT_COMMIT_TREE=auto: node leaders from this many ranks up (and only when the
 * job spans several nodes of more than one rank each). */
#define TREE_AUTO_MIN_WORLD 32
#define CONFIG_MAX_COMPRESS_THREADS 64u

void ckpt_opts_init(struct ckpt_opts *o, size_t size)
{
	struct ckpt_opts d;
	memset(&d, 0, sizeof d);
	d.size = size < sizeof d ? size : sizeof d;
	d.rank = -1;
	d.world = -1;
	d.zstd_level = -1;
	d.log_level = -1;
	d.incremental = -1;
	memcpy(o, &d, d.size);
}

/* Read field f of the caller's struct if it lies within the size they declared. */
#define OPT(o, f, dflt) \
	((o)->size >= offsetof(struct ckpt_opts, f) + sizeof((o)->f) ? (o)->f : (dflt))

static int env_int(const char *name, long lo, long hi, long *out)
{
	const char *v = ckpt_env(name);
	if (!v)
		return 0;
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || *end || x < lo || x > hi)
		return ckpt_err(-EINVAL, "environment %s='%s' is not an integer in [%ld, %ld]",
		                name, v, lo, hi);
	*out = x;
	return 1;
}

/* A count of 64 bits: decimal digits only (no sign, space or suffix), no overflow.
 * 1 and *out when set, 0 when not, -EINVAL naming the variable when malformed. */
static int env_u64(const char *name, uint64_t *out)
{
	const char *v = ckpt_env(name);
	if (!v)
		return 0;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (v[0] < '0' || v[0] > '9' || errno || *end)
		return ckpt_err(-EINVAL, "environment %s='%s' is not a whole number in [0, %llu]",
		                name, v, (unsigned long long)UINT64_MAX);
	*out = x;
	return 1;
}

/* CKPT_COMPRESS: none, zstd[:LEVEL] or bytegroup[:LEVEL], LEVEL 1 to 22. The default
 * levels are argued in docs/perf.md ("Compression"): zstd's 3 as it always was,
 * bytegroup's 1, at which the exponent planes already give nearly all they have. */
static int env_compress(struct glue_config *cfg)
{
	const char *z = ckpt_env("CKPT_COMPRESS");
	cfg->zstd_level = 0;
	if (!z || !strcmp(z, "none"))
		return 0;
	static const struct { const char *name; uint8_t codec; int level; } codecs[] = {
		{ "zstd", IO_CODEC_ZSTD, 3 }, { "bytegroup", IO_CODEC_BYTEGROUP, 1 },
	};
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(codecs); i++) {
		size_t n = strlen(codecs[i].name);
		if (strncmp(z, codecs[i].name, n) || (z[n] && z[n] != ':'))
			continue;
		cfg->compress_codec = codecs[i].codec;
		cfg->zstd_level = codecs[i].level;
		if (!z[n])
			return 0;
		char *end;
		errno = 0;
		long l = strtol(z + n + 1, &end, 10);
		if (errno || end == z + n + 1 || *end || l < 1 || l > 22)
			break;
		cfg->zstd_level = (int)l;
		return 0;
	}
	return ckpt_err(-EINVAL, "CKPT_COMPRESS='%s': expected none, zstd[:LEVEL] or "
	                "bytegroup[:LEVEL] with LEVEL 1 to 22", z);
}

/* Half of this rank's CPUs, at most 4, at least 1 (docs/perf.md, "Compression"):
 * the other half stays the training's, which goes on while a save is in flight.
 * This rank's CPUs: those it is pinned to when the launcher pinned it, else the
 * host's shared by the node's ranks. */
static unsigned default_compress_threads(int node_ranks)
{
	long online = sysconf(_SC_NPROCESSORS_ONLN), n = online;
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < online)
		n = CPU_COUNT(&set);
	else if (node_ranks > 1)
		n = online / node_ranks;
	n /= 2;
	return n < 1 ? 1u : n > 4 ? 4u : (unsigned)n;
}

/* CKPT_GDS: "0"/"off", "1"/"on" (both), or a comma list of "load" and "save". */
static int env_gds(unsigned *out)
{
	const char *v = ckpt_env("CKPT_GDS");
	*out = 0;
	if (!v || !*v || !strcmp(v, "0") || !strcmp(v, "off"))
		return 0;
	if (!strcmp(v, "1") || !strcmp(v, "on")) {
		*out = CKPT_GDS_LOAD | CKPT_GDS_SAVE;
		return 1;
	}
	for (const char *p = v; *p;) {
		size_t n = strcspn(p, ",");
		if (n == 4 && !strncmp(p, "load", 4))
			*out |= CKPT_GDS_LOAD;
		else if (n == 4 && !strncmp(p, "save", 4))
			*out |= CKPT_GDS_SAVE;
		else
			return ckpt_err(-EINVAL, "CKPT_GDS=%s: expected 0, 1, or a list of load and save",
			                v);
		p += n + (p[n] == ',');
	}
	return 1;
}

static int env_size(const char *name, uint64_t *out)
{
	const char *v = ckpt_env(name);
	if (!v)
		return 0;
	if (ckpt_parse_size(v, out))
		return ckpt_err(-EINVAL, "environment %s='%s' is not a size", name, v);
	return 1;
}

/* CKPT_RDMA_DEVICE and CKPT_RDMA_GID, for the rdma transport only: a device name
 * that fits, and a GID index (whether the port has it is known only once rdma_cm
 * picked the port: lib/net/rdma.c checks that). */
static int env_rdma(struct net_rdma_opts *out)
{
	memset(out, 0, sizeof *out);
	const char *dev = ckpt_env("CKPT_RDMA_DEVICE");
	if (dev) {
		if (strlen(dev) >= sizeof out->device)
			return ckpt_err(-EINVAL, "CKPT_RDMA_DEVICE='%.64s...': not a device name (at "
			                "most %zu bytes)", dev, sizeof out->device - 1);
		snprintf(out->device, sizeof out->device, "%s", dev);
	}
	long gid = 0;
	int rc = env_int("CKPT_RDMA_GID", 0, 65535, &gid);
	if (rc < 0)
		return rc;
	out->gid_set = rc == 1;
	out->gid_index = (unsigned)gid;
	return 0;
}

static int resolve_rank_world(const struct ckpt_opts *o, struct glue_config *cfg)
{
	long rank = OPT(o, rank, -1), world = OPT(o, world, -1), v = 0;
	int rc;
	if (rank < 0) {
		if ((rc = env_int("RANK", 0, INT32_MAX, &v)) < 0) return rc;
		if (!rc && (rc = env_int("SLURM_PROCID", 0, INT32_MAX, &v)) < 0) return rc;
		rank = rc ? v : 0;
	}
	if (world < 0) {
		if ((rc = env_int("WORLD_SIZE", 1, INT32_MAX, &v)) < 0) return rc;
		if (!rc && (rc = env_int("SLURM_NTASKS", 1, INT32_MAX, &v)) < 0) return rc;
		world = rc ? v : 1;
	}
	if (world < 1 || rank >= world)
		return ckpt_err(-EINVAL, "rank %ld is not inside world size %ld", rank, world);
	cfg->rank = (int)rank;
	cfg->world = (int)world;
	return 0;
}

/* Slurm's SLURM_TASKS_PER_NODE ("8(x32)", "2(x3),1"): the task count of node
 * `node`, or 0 when the value is malformed or too short. */
static long slurm_tasks_on_node(const char *v, long node)
{
	long seen = 0;
	while (*v) {
		char *end;
		errno = 0;
		long count = strtol(v, &end, 10), rep = 1;
		if (errno || end == v || count < 1)
			return 0;
		v = end;
		if (!strncmp(v, "(x", 2)) {
			rep = strtol(v + 2, &end, 10);
			if (errno || end == v + 2 || rep < 1 || *end != ')')
				return 0;
			v = end + 1;
		}
		if (node < seen + rep)
			return count;
		seen += rep;
		if (*v == ',')
			v++;
		else if (*v)
			return 0;
	}
	return 0;
}

/* Which node this rank is on, and the node's ranks: from CKPT_NODE_SIZE (nodes of
 * that many consecutive ranks), else from the first launcher convention that gives
 * both this rank's place on its node and the node's size. A node's ranks are
 * consecutive (torchrun always; Slurm with its default block distribution).
 * Unknown: a node of one rank (no leader). Values that do not fit are an error
 * only where the hierarchical commit would use them (resolve_tree): a context
 * opened with an explicit rank and world, or by a tool, must not fail over a
 * launcher variable it does not need; *bad gets the reason (else ""). */
static int resolve_node(struct glue_config *cfg, char *bad, size_t cap)
{
	static const struct { const char *local_rank, *size, *node; } conv[] = {
		{ "CKPT_LOCAL_RANK", "CKPT_LOCAL_WORLD_SIZE", "CKPT_NODE_ID" },
		{ "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK" },          /* torchrun */
		{ "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID" },  /* srun */
	};
	long lr = 0, size = 1, node = -1, v = 0;
	const char *src = NULL;
	bad[0] = '\0';
	cfg->node_first = cfg->rank;
	cfg->node_size = 1;
	cfg->node_id = cfg->rank;
	int rc = env_int("CKPT_NODE_SIZE", 1, INT32_MAX, &v);
	if (rc < 0)
		return rc;
	if (rc) {
		lr = cfg->rank % v;
		node = cfg->rank / v;
		/* The last node may be smaller. */
		size = v < cfg->world - (cfg->rank - lr) ? v : cfg->world - (cfg->rank - lr);
		src = "CKPT_NODE_SIZE";
	}
	for (size_t i = 0; !src && i < CKPT_ARRAY_SIZE(conv); i++) {
		long r = 0, n = 0;
		if ((rc = env_int(conv[i].local_rank, 0, INT32_MAX, &r)) == 0)
			continue;                 /* not this launcher */
		int rn = env_int(conv[i].node, 0, INT32_MAX, &node);
		int rs = rc < 0 || rn < 0 ? 0 : env_int(conv[i].size, 1, INT32_MAX, &n);
		if (rc < 0 || rn < 0 || rs < 0) {
			snprintf(bad, cap, "%s", ckpt_err_msg());
			return 0;
		}
		if (!rn)
			node = -1;
		if (!rs && conv[i].local_rank[0] == 'S' && node >= 0 && ckpt_env("SLURM_TASKS_PER_NODE"))
			/* srun without --ntasks-per-node: the per-node counts. */
			n = slurm_tasks_on_node(ckpt_env("SLURM_TASKS_PER_NODE"), node);
		if (n < 1)
			continue;                 /* the node's size is not known */
		lr = r;
		size = n;
		src = conv[i].local_rank;
	}
	if (!src)
		return 0;
	if (lr >= size || lr > cfg->rank || cfg->rank - lr + size > cfg->world) {
		snprintf(bad, cap, "rank %d: local rank %ld on a node of %ld ranks (from %s) does "
		         "not fit world size %d with the node's ranks consecutive", cfg->rank, lr,
		         size, src, cfg->world);
		return 0;
	}
	cfg->node_first = cfg->rank - (int)lr;
	cfg->node_size = (int)size;
	cfg->node_id = node >= 0 ? (int)node : cfg->node_first / (int)size;
	return 0;
}

/* CKPT_COMMIT_TREE=off|auto|on: the hierarchical commit (node leaders relay to the
 * coordinator). Every rank of a job must see the same setting. bad: why the node's
 * ranks are not known ("" if they are). */
static int resolve_tree(struct glue_config *cfg, const char *bad)
{
	const char *t = ckpt_env("CKPT_COMMIT_TREE");
	if (t && strcmp(t, "auto") && strcmp(t, "off") && strcmp(t, "on"))
		return ckpt_err(-EINVAL, "CKPT_COMMIT_TREE='%s': expected off, auto or on", t);
	if (t && !strcmp(t, "on") && bad[0])
		return ckpt_err(-EINVAL, "CKPT_COMMIT_TREE=on: %s", bad);
	if (bad[0])
		ckpt_log(CKPT_LOG_INFO, "node of this rank unknown, no node leader: %s", bad);
	bool multi = cfg->node_size > 1 && cfg->node_size < cfg->world;
	if (!t || !strcmp(t, "auto"))
		cfg->tree = cfg->world >= TREE_AUTO_MIN_WORLD && multi;
	else
		/* on: a node of one rank needs no leader; its rank joins the coordinator
		 * itself. */
		cfg->tree = !strcmp(t, "on") && cfg->node_size > 1;
	return 0;
}

/* The secret of CKPT_JOB_SECRET_FILE: the file's bytes (a trailing newline dropped),
 * 1..CONFIG_MAX_SECRET of them. Like ssh with a key, a file that others may read
 * is refused: its secret is not one (the rule: ckpt_secret_file_read). */
static int secret_from_file(const char *path, char out[CONFIG_MAX_SECRET + 1], size_t *len)
{
	unsigned mode = 0;
	int rc = ckpt_secret_file_read(path, out, CONFIG_MAX_SECRET, len, &mode);
	if (rc == -EPERM)
		return ckpt_err(CKPT_EAUTH, "CKPT_JOB_SECRET_FILE=%s: must be a regular file of this "
		                "user that only this user may read (mode %03o; chmod 600)", path,
		                mode & 0777);
	if (rc == -EMSGSIZE)
		return ckpt_err(CKPT_EAUTH, "CKPT_JOB_SECRET_FILE=%s: the secret must be 1..%u bytes",
		                path, CONFIG_MAX_SECRET);
	if (rc)
		return ckpt_err(rc, "CKPT_JOB_SECRET_FILE=%s", path);
	return 0;
}

/* A job of several ranks authenticates every peer by its secret (docs/protocol.md
 * §1.2): without one, any process that reaches the coordinator's port can join as a
 * missing rank and vote. So a multi-rank job needs a secret, and running without one
 * is the caller's explicit choice (CKPT_OPEN_NO_AUTH or CKPT_AUTH=off), logged. */
static int resolve_auth(struct glue_config *cfg, size_t secret_len, const char *job)
{
	const char *a = ckpt_env("CKPT_AUTH");
	if (a && strcmp(a, "on") && strcmp(a, "off"))
		return ckpt_err(-EINVAL, "CKPT_AUTH='%s': expected on or off", a);
	bool off = (cfg->flags & CKPT_OPEN_NO_AUTH) || (a && !strcmp(a, "off"));
	if (cfg->world <= 1 || (cfg->flags & CKPT_OPEN_READONLY))
		return 0;                 /* no peers: nothing to authenticate */
	if (secret_len) {
		if (secret_len < CONFIG_MIN_SECRET)
			ckpt_log(CKPT_LOG_WARN, "rank %d: the job secret is %zu bytes; use at least %u "
			         "random bytes", cfg->rank, secret_len, CONFIG_MIN_SECRET);
		return 0;
	}
	if (!off)
		return ckpt_err(CKPT_EAUTH, "a job of %d ranks needs a job secret, so that no other "
		                "process can join it and vote: set CKPT_JOB_SECRET (or "
		                "CKPT_JOB_SECRET_FILE, or ckpt_opts.secret) to the same random value on "
		                "every rank, or CKPT_AUTH=off to run without authentication",
		                cfg->world);
	ckpt_log(CKPT_LOG_WARN, "rank %d: job '%s' runs WITHOUT authentication (%s): any process "
	         "that reaches its coordinator can join it as a missing rank and vote", cfg->rank,
	         job ? job : "default", cfg->flags & CKPT_OPEN_NO_AUTH ? "CKPT_OPEN_NO_AUTH"
	                                                               : "CKPT_AUTH=off");
	return 0;
}

static char *dup_or(const char *a, const char *b)
{
	return ckpt_strdup(a ? a : b);
}

static int config_resolve_with(const struct ckpt_opts *o, struct glue_config *cfg,
                               char *file_secret);

/* file_secret holds a secret read from CKPT_JOB_SECRET_FILE while the options are
 * resolved; it is scrubbed here, on every path out. */
int config_log(const struct ckpt_opts *o, struct ckpt_log_sink *sink)
{
	memset(sink, 0, sizeof *sink);
	sink->level = -1;
	sink->rank = CKPT_LOG_NO_RANK;
	if (!o || o->size < offsetof(struct ckpt_opts, flags))
		return 0;                /* config_resolve says what is wrong */
	sink->fn = OPT(o, log_fn, (ckpt_log_fn)NULL);
	sink->arg = OPT(o, log_arg, NULL);
	sink->level = OPT(o, log_level, -1);
	if (sink->level < -1 || sink->level > CKPT_LOG_DEBUG) {
		int bad = sink->level;
		sink->level = -1;
		return ckpt_err(-EINVAL, "log level %d: expected -1 (CKPT_LOG) or %d (error) to "
		                "%d (debug)", bad, CKPT_LOG_ERROR, CKPT_LOG_DEBUG);
	}
	return 0;
}

/* "ckptd://HOST:PORT[,HOST:PORT...]" (HOST may be "[v6 address]") into cfg->ckptd. */
static int parse_target(const char *t, struct glue_config *cfg)
{
	static const char scheme[] = "ckptd://";
	if (strncmp(t, scheme, sizeof scheme - 1) != 0)
		return ckpt_err(-EINVAL, "target '%s': expected ckptd://HOST:PORT[,HOST:PORT...]", t);
	const char *p = t + sizeof scheme - 1;
	unsigned n = 1;
	for (const char *q = p; *q; q++)
		n += *q == ',';
	if (n > GLUE_MAX_CKPTD)
		return ckpt_err(-EINVAL, "target '%s': more than %u ckptd instances", t, GLUE_MAX_CKPTD);
	if (!(cfg->ckptd = ckpt_calloc(n, sizeof *cfg->ckptd)))
		return ckpt_err(-ENOMEM, "target");
	for (unsigned i = 0; i < n; i++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		const char *colon = NULL, *h = p;
		size_t hlen;
		if (len && p[0] == '[') {
			const char *rb = memchr(p, ']', len);
			if (rb && rb + 1 < p + len && rb[1] == ':')
				colon = rb + 1;
			h = p + 1;
			hlen = rb ? (size_t)(rb - h) : 0;
		} else {
			for (size_t k = 0; k < len; k++)
				if (p[k] == ':')
					colon = p + k;
			hlen = colon ? (size_t)(colon - p) : 0;
		}
		char *e = NULL;
		unsigned long port = colon ? strtoul(colon + 1, &e, 10) : 0;
		if (!colon || !hlen || hlen >= sizeof cfg->ckptd[i].host || e != p + len ||
		    e == colon + 1 || port == 0 || port > 65535) {
			int rc = ckpt_err(-EINVAL, "target '%s': instance %u is not HOST:PORT", t, i + 1);
			ckpt_free(cfg->ckptd);
			cfg->ckptd = NULL;
			return rc;
		}
		memcpy(cfg->ckptd[i].host, h, hlen);
		cfg->ckptd[i].port = (unsigned)port;
		p += len + (end ? 1 : 0);
	}
	cfg->nckptd = n;
	return 0;
}

int config_resolve(const struct ckpt_opts *o, struct glue_config *cfg)
{
	char file_secret[CONFIG_MAX_SECRET + 1];
	int rc = config_resolve_with(o, cfg, file_secret);
	explicit_bzero(file_secret, sizeof file_secret);
	if (rc)
		config_free(cfg);       /* what was resolved before the failure (idempotent) */
	return rc;
}

static int config_resolve_with(const struct ckpt_opts *o, struct glue_config *cfg,
                               char *file_secret)
{
	memset(cfg, 0, sizeof *cfg);
	if (!o || o->size < offsetof(struct ckpt_opts, flags))
		return ckpt_err(-EINVAL, "options: size field not set (use ckpt_opts_init)");
	char bad[256] = "";
	int rc = resolve_rank_world(o, cfg);
	if (!rc)
		rc = resolve_node(cfg, bad, sizeof bad);
	if (!rc)
		rc = resolve_tree(cfg, bad);
	if (rc)
		return rc;
	const char *target = OPT(o, target, NULL);
	if (!target)
		target = ckpt_env("CKPT_TARGET");
	if (target && *target && (rc = parse_target(target, cfg)))
		return rc;
	const char *root = OPT(o, root, NULL);
	if (!root)
		root = ckpt_env("CKPT_ROOT");
	if (!root && cfg->nckptd)
		root = "";          /* not used: the shards and the manifest are ckptd's */
	if (!root) {
		config_free(cfg);
		return ckpt_err(-EINVAL, "no checkpoint root (option root or CKPT_ROOT) and no "
		                "ckptd target (option target or CKPT_TARGET)");
	}
	const char *mdir = OPT(o, manifest_dir, NULL);
	if (!mdir)
		mdir = ckpt_env("CKPT_MANIFEST_DIR");
	if (mdir && *mdir) {
		if (cfg->nckptd) {
			config_free(cfg);
			return ckpt_err(-EINVAL, "manifest directory '%s' with a ckptd target: the "
			                "manifest of a job saved through ckptd is the first ckptd's", mdir);
		}
		if (mdir[0] != '/') {
			config_free(cfg);
			return ckpt_err(-EINVAL, "manifest directory '%s': must be an absolute path", mdir);
		}
		if (!(cfg->manifest_dir = ckpt_strdup(mdir)))
			return ckpt_err(-ENOMEM, "options");
	}
	long v = 0;
	cfg->flags = OPT(o, flags, 0u);
	if (cfg->flags & ~(unsigned)(CKPT_OPEN_READONLY | CKPT_OPEN_NO_GC | CKPT_OPEN_RECOVER |
	                             CKPT_OPEN_GROUP_ACCESS | CKPT_OPEN_NO_AUTH))
		return ckpt_err(-EINVAL, "open flags 0x%x: unknown bits", cfg->flags);
	if ((rc = env_int("CKPT_GROUP_ACCESS", 0, 1, &v)) < 0)
		return rc;
	if (rc && v)
		cfg->flags |= CKPT_OPEN_GROUP_ACCESS;
	if (cfg->flags & CKPT_OPEN_RECOVER) {
		if (cfg->flags & CKPT_OPEN_READONLY)
			return ckpt_err(-EINVAL, "open flags: CKPT_OPEN_RECOVER writes a new manifest "
			                "and cannot be read-only");
		cfg->flags |= CKPT_OPEN_NO_GC;
	}
	/* Model weights are often confidential: private unless the caller says so. */
	bool group = cfg->flags & CKPT_OPEN_GROUP_ACCESS;
	cfg->file_mode = group ? 0640u : 0600u;
	cfg->dir_mode = group ? 0750u : 0700u;

	const char *addr = OPT(o, coord_addr, NULL);
	if (!addr) addr = ckpt_env("CKPT_COORD_ADDR");
	if (!addr) addr = ckpt_env("MASTER_ADDR");
	cfg->coord_port = OPT(o, coord_port, 0u);
	if (!cfg->coord_port) {
		if ((rc = env_int("CKPT_COORD_PORT", 1, 65535, &v)) < 0) return rc;
		if (rc) {
			cfg->coord_port = (unsigned)v;
		} else {
			/* MASTER_PORT belongs to the launcher's rendezvous: take the next one. */
			if ((rc = env_int("MASTER_PORT", 1, 65534, &v)) < 0) return rc;
			cfg->coord_port = rc ? (unsigned)v + 1 : DEFAULT_PORT;
		}
	}
	cfg->transport = OPT(o, transport, CKPT_TRANSPORT_AUTO);
	if (cfg->transport == CKPT_TRANSPORT_AUTO) {
		const char *t = ckpt_env("CKPT_TRANSPORT");
		if (!t || !strcmp(t, "tcp")) cfg->transport = CKPT_TRANSPORT_TCP;
		else if (!strcmp(t, "rdma")) cfg->transport = CKPT_TRANSPORT_RDMA;
		else return ckpt_err(-EINVAL, "CKPT_TRANSPORT='%s': expected tcp or rdma", t);
	}
	if (cfg->transport == CKPT_TRANSPORT_RDMA && (rc = env_rdma(&cfg->rdma)))
		return rc;
	/* Saving through ckptd over rdma: chunks RDMA-written into the buffers ckptd
	 * grants (docs/ckptd.md), unless turned off (an older ckptd, a comparison). */
	if ((rc = env_int("CKPT_RDMA_DIRECT", 0, 1, &v)) < 0)
		return rc;
	cfg->rdma_direct = rc ? v != 0 : true;
	const char *job = OPT(o, job_id, NULL);
	if (!job) job = ckpt_env("CKPT_JOB_ID");
	const void *secret = OPT(o, secret, NULL);
	size_t secret_len = OPT(o, secret_len, (size_t)0);
	if (!secret) {
		secret = ckpt_env("CKPT_JOB_SECRET");
		secret_len = secret ? strlen(secret) : 0;
	}
	if (!secret && ckpt_env("CKPT_JOB_SECRET_FILE")) {
		if ((rc = secret_from_file(ckpt_env("CKPT_JOB_SECRET_FILE"), file_secret,
		                           &secret_len)))
			return rc;
		secret = file_secret;
	}
	if ((rc = resolve_auth(cfg, secret_len, job)))
		return rc;

	uint64_t sz;
	cfg->pool_bytes = OPT(o, pool_bytes, (size_t)0);
	if (!cfg->pool_bytes) {
		if ((rc = env_size("CKPT_POOL_BYTES", &sz)) < 0) return rc;
		cfg->pool_bytes = rc ? sz : DEFAULT_POOL_BYTES;
	}
	cfg->chunk_bytes = OPT(o, chunk_bytes, (size_t)0);
	if (!cfg->chunk_bytes) {
		if ((rc = env_size("CKPT_CHUNK_BYTES", &sz)) < 0) return rc;
		cfg->chunk_bytes = rc ? sz : DEFAULT_CHUNK_BYTES;
	}
	if (cfg->chunk_bytes % CKPT_ALIGN || cfg->chunk_bytes > IO_MAX_CHUNK_BYTES)
		return ckpt_err(-EINVAL, "chunk size %zu: must be a multiple of %u and at most %llu",
		                cfg->chunk_bytes, CKPT_ALIGN, (unsigned long long)IO_MAX_CHUNK_BYTES);
	/* The pool must hold at least a few chunks to keep writes in flight. */
	if (cfg->pool_bytes < 2 * cfg->chunk_bytes)
		return ckpt_err(-EINVAL, "pool of %zu bytes is smaller than two chunks of %zu",
		                cfg->pool_bytes, cfg->chunk_bytes);
	cfg->zstd_level = OPT(o, zstd_level, -1);
	int codec = OPT(o, compress_codec, 0);
	if (codec != 0 && codec != CKPT_CODEC_ZSTD && codec != CKPT_CODEC_BYTEGROUP)
		return ckpt_err(-EINVAL, "compress codec %d: expected zstd (%d) or bytegroup (%d)",
		                codec, CKPT_CODEC_ZSTD, CKPT_CODEC_BYTEGROUP);
	cfg->compress_codec = codec == CKPT_CODEC_BYTEGROUP ? IO_CODEC_BYTEGROUP : IO_CODEC_ZSTD;
	if (cfg->zstd_level < 0 && (rc = env_compress(cfg)))
		return rc;
	if (cfg->zstd_level < 0 || cfg->zstd_level > 22)
		return ckpt_err(-EINVAL, "zstd level %d: expected 0 (off) to 22", cfg->zstd_level);
	cfg->compress_threads = OPT(o, compress_threads, 0u);
	if (!cfg->compress_threads) {
		if ((rc = env_int("CKPT_COMPRESS_THREADS", 1, CONFIG_MAX_COMPRESS_THREADS, &v)) < 0)
			return rc;
		cfg->compress_threads = rc ? (unsigned)v : default_compress_threads(cfg->node_size);
	}
	if (cfg->compress_threads > CONFIG_MAX_COMPRESS_THREADS)
		return ckpt_err(-EINVAL, "compress threads %u: at most %u", cfg->compress_threads,
		                CONFIG_MAX_COMPRESS_THREADS);
	cfg->max_inflight = OPT(o, max_inflight, 0u);
	if (!cfg->max_inflight)
		cfg->max_inflight = 2;
	cfg->timeout_ms = OPT(o, timeout_ms, 0u);
	if (!cfg->timeout_ms) {
		if ((rc = env_int("CKPT_TIMEOUT_MS", 1, INT32_MAX, &v)) < 0) return rc;
		cfg->timeout_ms = rc ? (unsigned)v : 120000u;
	}
	cfg->queue_depth = OPT(o, queue_depth, 0u);
	if (!cfg->queue_depth) {
		if ((rc = env_int("CKPT_QUEUE_DEPTH", 1, 4096, &v)) < 0) return rc;
		cfg->queue_depth = rc ? (unsigned)v : 8u;
	}
	if (cfg->queue_depth > 4096)
		return ckpt_err(-EINVAL, "queue depth %u: at most 4096", cfg->queue_depth);

	/* Retention after each commit (0: no such rule); the environment fills what the
	 * options leave at 0. */
	struct { uint64_t *dst, opt; const char *env; } keep[] = {
		{ &cfg->keep_last, OPT(o, keep_last, (uint64_t)0), "CKPT_KEEP_LAST" },
		{ &cfg->keep_every, OPT(o, keep_every, (uint64_t)0), "CKPT_KEEP_EVERY" },
		{ &cfg->keep_seconds, OPT(o, keep_seconds, (uint64_t)0), "CKPT_KEEP_SECONDS" },
	};
	for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
		*keep[i].dst = keep[i].opt;
		if (!keep[i].opt && (rc = env_u64(keep[i].env, keep[i].dst)) < 0)
			return rc;
	}

	/* Incremental saves: off unless the options or CKPT_INCREMENTAL say on (docs/
	 * operations.md says why it is not the default). */
	int inc = OPT(o, incremental, -1);
	if (inc < -1 || inc > 1)
		return ckpt_err(-EINVAL, "incremental %d: expected -1 (the environment), 0 or 1", inc);
	if (inc < 0) {
		if ((rc = env_int("CKPT_INCREMENTAL", 0, 1, &v)) < 0)
			return rc;
		inc = rc ? (int)v : 0;
	}
	cfg->incremental = inc == 1;

	/* The device staging pool: off unless asked for (it takes device memory the
	 * training may want). */
	cfg->device_pool_bytes = OPT(o, device_pool_bytes, (size_t)0);
	if (!cfg->device_pool_bytes) {
		if ((rc = env_size("CKPT_DEVICE_POOL_BYTES", &sz)) < 0) return rc;
		cfg->device_pool_bytes = rc ? sz : 0;
	}
	if (cfg->device_pool_bytes && cfg->device_pool_bytes < cfg->chunk_bytes)
		return ckpt_err(-EINVAL, "device pool of %zu bytes is smaller than one chunk of %zu",
		                cfg->device_pool_bytes, cfg->chunk_bytes);

	cfg->gds = OPT(o, gds, 0u);
	if (cfg->gds & ~(unsigned)(CKPT_GDS_LOAD | CKPT_GDS_SAVE | CKPT_GDS_OFF))
		return ckpt_err(-EINVAL, "gds 0x%x: unknown bits", cfg->gds);
	if (!cfg->gds && (rc = env_gds(&cfg->gds)) < 0)
		return rc;
	if (cfg->gds & CKPT_GDS_OFF)
		cfg->gds = 0;

	cfg->root = ckpt_strdup(root);
	cfg->coord_addr = dup_or(addr, "127.0.0.1");
	cfg->job_id = dup_or(job, "default");
	if (cfg->job_id && strlen(cfg->job_id) > MANIFEST_MAX_JOB_ID) {
		config_free(cfg);
		return ckpt_err(-EINVAL, "job id longer than %u bytes", MANIFEST_MAX_JOB_ID);
	}
	if (secret_len) {
		cfg->secret = ckpt_malloc(secret_len);
		if (cfg->secret)
			memcpy(cfg->secret, secret, secret_len);
		cfg->secret_len = secret_len;
	}
	if (!cfg->root || !cfg->coord_addr || !cfg->job_id || (secret_len && !cfg->secret)) {
		config_free(cfg);
		return ckpt_err(-ENOMEM, "options");
	}
	return 0;
}

void config_free(struct glue_config *cfg)
{
	ckpt_free(cfg->root);
	ckpt_free(cfg->manifest_dir);
	ckpt_free(cfg->ckptd);
	ckpt_free(cfg->coord_addr);
	ckpt_free(cfg->job_id);
	if (cfg->secret) {
		/* The job secret does not outlive the context in freed heap memory. */
		explicit_bzero(cfg->secret, cfg->secret_len);
		ckpt_free(cfg->secret);
	}
	memset(cfg, 0, sizeof *cfg);
}
