/*
 * ctx.c — the context: opening a checkpoint root, the buffer pool, the manifest,
 * and the save worker thread that runs submitted saves in step order.
 *
 * Roles: the coordinator (rank 0 in the embedded default) owns the manifest for
 * writing and garbage-collects at open; every other rank only writes its shard
 * files and opens the manifest read-only, lazily, for loads.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "glue.h"
#include "net/net.h"
#include "snapshot/snapshot.h"

bool glue_is_coordinator(const ckpt_ctx *c)
{
	/* Saving through ckptd, the coordinator is the first instance's. */
	return c->cfg.rank == 0 && !(c->cfg.flags & CKPT_OPEN_READONLY) && !c->cfg.nckptd;
}

int ckpt_rank(const ckpt_ctx *c)
{
	return c ? c->cfg.rank : ckpt_err(-EINVAL, "ckpt_rank: context is NULL");
}

int ckpt_world(const ckpt_ctx *c)
{
	return c ? c->cfg.world : ckpt_err(-EINVAL, "ckpt_world: context is NULL");
}

int glue_elem_size_check(const char *fn, size_t elem_size, size_t min)
{
	if (elem_size < min)
		return ckpt_err(-EINVAL, "%s: element size %zu is below %zu, the struct's "
		                "smallest size", fn, elem_size, min);
	return 0;
}

void glue_elem_put(void *out, size_t i, size_t elem_size, const void *v, size_t have)
{
	unsigned char *p = (unsigned char *)out + i * elem_size;
	size_t n = elem_size < have ? elem_size : have;
	memcpy(p, v, n);
	if (elem_size > n)
		memset(p + n, 0, elem_size - n);
}

/* mkdir -p, one component at a time (the root's parents may not exist yet). */
static int mkdir_p(const char *path, unsigned mode)
{
	char tmp[4096];
	size_t n = strlen(path);
	if (n >= sizeof tmp)
		return ckpt_err(-ENAMETOOLONG, "root path too long");
	memcpy(tmp, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (tmp[i] != '/' && tmp[i] != '\0')
			continue;
		char c = tmp[i];
		tmp[i] = '\0';
		if (mkdir(tmp, (mode_t)mode) < 0 && errno != EEXIST)
			return ckpt_err(-errno, "create directory %s", tmp);
		tmp[i] = c;
	}
	return 0;
}

/* The context's manifest directory, once: every open, check, set-aside and creation
 * of the manifest goes there. */
static int manifest_path_resolve(ckpt_ctx *c)
{
	char own[PATH_MAX];
	const char *p = c->cfg.manifest_dir;
	if (!p) {
		if (ckpt_path_manifest_dir(own, sizeof own, c->cfg.root))
			return ckpt_err(-ENAMETOOLONG, "checkpoint root %.200s...: path too long",
			                c->cfg.root);
		p = own;
	}
	if (!(c->manifest_path = ckpt_strdup(p)))
		return ckpt_err(-ENOMEM, "open");
	return 0;
}

/* What a root holds, for the checks at open (docs/operations.md, "What each refusal
 * means"). */
struct root_state {
	bool     embedded;          /* <root>/manifest exists */
	bool     manifest;          /* the context's manifest directory exists */
	uint64_t nsteps;            /* step directories */
	char     foreign[256];      /* an entry that is not libckpt's ("" if none) */
};

static bool root_entry_ours(const char *name)
{
	uint64_t step;
	return !strcmp(name, CKPT_MANIFEST_NAME) || !strcmp(name, CKPT_LOCK_FILE) ||
	       ckpt_path_parse_step_dir(name, &step) ||
	       !strncmp(name, MANIFEST_NEW_PREFIX, strlen(MANIFEST_NEW_PREFIX)) ||
	       !strncmp(name, MANIFEST_DAMAGED_PREFIX, strlen(MANIFEST_DAMAGED_PREFIX));
}

static int root_scan(const ckpt_ctx *c, struct root_state *st)
{
	const char *root = c->cfg.root;
	memset(st, 0, sizeof *st);
	DIR *d = opendir(root);
	if (!d)
		return ckpt_err(-errno, "checkpoint root %s", root);
	struct dirent *e;
	while ((e = readdir(d))) {
		uint64_t step;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (!strcmp(e->d_name, CKPT_MANIFEST_NAME))
			st->embedded = true;
		else if (ckpt_path_parse_step_dir(e->d_name, &step))
			st->nsteps++;
		else if (!root_entry_ours(e->d_name) && !st->foreign[0])
			snprintf(st->foreign, sizeof st->foreign, "%s", e->d_name);
	}
	closedir(d);
	struct stat sb;
	st->manifest = c->cfg.manifest_dir ? lstat(c->manifest_path, &sb) == 0 : st->embedded;
	return 0;
}

/* The refusal of a populated root without a usable manifest: the code that says
 * "run rebuild", with the cause and the command in the message. */
static int root_refuse(const ckpt_ctx *c, uint64_t nsteps, int cause)
{
	const char *root = c->cfg.root;
	const char *fmt = "checkpoint root %s holds %llu step director%s and no usable manifest, "
	                  "so nothing was changed; to recover the steps from their shard files "
	                  "run: ckpt-inspect %s rebuild%s%s%s";
	/* The cause's message (its own code's words at its end) follows ours. */
	if (cause)
		return ckpt_err_prefix(CKPT_ENOMANIFEST, fmt, root, (unsigned long long)nsteps,
		                       nsteps == 1 ? "y" : "ies", root, GLUE_MANIFEST_OPT(c), "");
	return ckpt_err(CKPT_ENOMANIFEST, fmt, root, (unsigned long long)nsteps,
	                nsteps == 1 ? "y" : "ies", root, GLUE_MANIFEST_OPT(c),
	                " (there is no manifest; if it is kept apart from the root, name its "
	                "directory: CKPT_MANIFEST_DIR, or --manifest-dir for the tools)");
}

/* This machine's name, for messages about what is not on it. */
static void host_name(char *out, size_t cap)
{
	if (gethostname(out, cap - 1) < 0)
		snprintf(out, cap, "?");
	out[cap - 1] = '\0';
}

/* A manifest kept apart from its root that is not on this host: what stands to
 * reason (it is on the node of the coordinator that saved) and what to do. what
 * says who could not go on. */
static int manifest_absent(const ckpt_ctx *c, const char *what)
{
	char host[256];
	host_name(host, sizeof host);
	return ckpt_err(CKPT_ENOMANIFEST, "%s: its manifest directory %s does not exist on host "
	                "%s. A manifest kept apart from its root (CKPT_MANIFEST_DIR) is read only "
	                "where it is, on the coordinator's node when it is on rank 0's local disk: "
	                "open the root there, move the manifest directory here while no job runs, "
	                "or save through ckptd for loads on every node (docs/operations.md, "
	                "\"Multi-node deployments\"); if it was lost, `ckpt-inspect %s rebuild "
	                "--manifest-dir %s` recreates it from the shard files", what,
	                c->manifest_path, host, c->cfg.root, c->manifest_path);
}

/* With a manifest directory apart, a manifest of the root's own (<root>/manifest)
 * is refused rather than passed over: one root has one manifest, and the steps that
 * one records would look lost to the other. Both the same directory is no conflict. */
static int root_own_manifest_check(const ckpt_ctx *c, const struct root_state *rs)
{
	if (!c->cfg.manifest_dir || !rs->embedded)
		return 0;
	char own[PATH_MAX];
	struct stat a, b;
	if (ckpt_path_manifest_dir(own, sizeof own, c->cfg.root))
		return ckpt_err(-ENAMETOOLONG, "checkpoint root %s: path too long", c->cfg.root);
	if (stat(own, &a) == 0 && stat(c->manifest_path, &b) == 0 && a.st_dev == b.st_dev &&
	    a.st_ino == b.st_ino)
		return 0;
	return ckpt_err(-EEXIST, "checkpoint root %s has a manifest of its own (%s) and the "
	                "manifest directory is set to %s: one root has one manifest; to keep it "
	                "apart, move %s to %s while no job runs, or leave the manifest directory "
	                "unset", c->cfg.root, own, c->manifest_path, own, c->manifest_path);
}

/* mkdir -p of the directory that holds path (a manifest directory's parent). */
static int mkdir_parent(const char *path, unsigned mode)
{
	char parent[PATH_MAX];
	const char *slash = strrchr(path, '/');
	if (!slash || slash == path)
		return 0;
	if ((size_t)(slash - path) >= sizeof parent)
		return ckpt_err(-ENAMETOOLONG, "manifest directory %s: path too long", path);
	memcpy(parent, path, (size_t)(slash - path));
	parent[slash - path] = '\0';
	return mkdir_p(parent, mode);
}

/*
 * Is the root one this context may open, and in which state is its manifest? Every
 * rank runs the same read-only checks, so that a root that rank 0 must refuse is
 * refused by every rank at once, not after the commit timeout. Rules (a root's
 * committed steps are never put at risk by opening it):
 *   - a missing root: created by the coordinator role, -ENOENT for readers;
 *   - a manifest directory that holds no usable manifest (manifest_check_file):
 *     refused with CKPT_ENOMANIFEST — never reinitialised (CKPT_OPEN_RECOVER moves it
 *     aside and starts a new one, for rebuild);
 *   - step directories without a manifest: CKPT_ENOMANIFEST (the manifest was lost:
 *     the steps are recoverable with rebuild, and GC must not see them as orphans);
 *   - a non-empty directory with entries that are not libckpt's and no manifest:
 *     CKPT_ENOTROOT (somebody else's data);
 *   - a manifest directory apart (cfg.manifest_dir) and a manifest in the root too:
 *     -EEXIST. A manifest apart may be on rank 0's local disk only: the other ranks
 *     of a saving job, which need no manifest to save, leave its checks to rank 0
 *     when it is not on their host (rank 0 tells them of a refusal at once).
 * *create: the coordinator role may create the manifest.
 */
static int root_prepare(ckpt_ctx *c, bool *create)
{
	const struct glue_config *cfg = &c->cfg;
	struct stat st;
	bool ro = cfg->flags & CKPT_OPEN_READONLY;
	bool coord = glue_is_coordinator(c), recover = cfg->flags & CKPT_OPEN_RECOVER;
	*create = false;
	if (stat(cfg->root, &st) < 0) {
		if (errno != ENOENT || ro)
			return ckpt_err(-errno, "checkpoint root %s", cfg->root);
		if (!coord)
			return 0;        /* rank 0 creates it; this rank writes after BEGIN */
		int rc = mkdir_p(cfg->root, cfg->dir_mode);
		if (rc)
			return rc;
	} else if (!S_ISDIR(st.st_mode)) {
		return ckpt_err(CKPT_ENOTROOT, "checkpoint root %s is not a directory", cfg->root);
	}
	if (!ro && access(cfg->root, W_OK | X_OK) < 0)
		return ckpt_err(-errno, "checkpoint root %s is not writable", cfg->root);
	/* A directory that is plainly not a root (someone's files, no manifest, no step)
	 * is refused before anything is created in it, the lock file included. */
	struct root_state rs;
	int rc = root_scan(c, &rs);
	if (rc)
		return rc;
	if (!rs.manifest && !rs.nsteps && rs.foreign[0])
		return ckpt_err(CKPT_ENOTROOT, "%s is not empty and has no manifest: not a "
		                "checkpoint root (found '%s')", cfg->root, rs.foreign);
	if ((rc = root_own_manifest_check(c, &rs)))
		return rc;
	/* The coordinator holds the root from here on: nobody else creates, moves or
	 * collects anything in it while it decides; what it decides on is scanned again
	 * under the lock. */
	if (coord) {
		c->incarnation = ckpt_random_id();
		if ((rc = lock_take(cfg, c->incarnation, &c->lock_fd)))
			return rc;
		if ((rc = root_scan(c, &rs)))
			return rc;
	}
	if (rs.manifest) {
		rc = manifest_check_file(c->manifest_path);
		if (rc == -ENOENT)
			rc = ckpt_err(CKPT_ENOMANIFEST, "%s has no data.mdb", c->manifest_path);
		if (rc == CKPT_ENOMANIFEST && coord && recover) {
			char moved[4300];
			ckpt_log(CKPT_LOG_WARN, "%s; setting it aside for a rebuild", ckpt_err_msg());
			if ((rc = manifest_set_aside(c->manifest_path, moved, sizeof moved)))
				return rc;
			ckpt_log(CKPT_LOG_WARN, "damaged manifest kept as %s", moved);
			*create = true;
			return 0;
		}
		if (rc == CKPT_ENOMANIFEST)
			return root_refuse(c, rs.nsteps, rc);
		return rc;
	}
	if (cfg->manifest_dir && !coord && !ro)
		return 0;            /* rank 0's node may be the only one that has it */
	if (rs.nsteps && !(coord && recover)) {
		if (!cfg->manifest_dir)
			return root_refuse(c, rs.nsteps, 0);
		char what[PATH_MAX + 64];
		snprintf(what, sizeof what, "checkpoint root %s holds %llu step director%s",
		         cfg->root, (unsigned long long)rs.nsteps, rs.nsteps == 1 ? "y" : "ies");
		return manifest_absent(c, what);
	}
	if (rs.foreign[0])
		return ckpt_err(CKPT_ENOTROOT, "%s is not empty and has no manifest: not a "
		                "checkpoint root (found '%s')", cfg->root, rs.foreign);
	if (coord && cfg->manifest_dir && (rc = mkdir_parent(c->manifest_path, cfg->dir_mode)))
		return rc;
	*create = coord;
	return 0;
}

/* A manifest that knows no step in a root full of step directories is not this
 * root's manifest (a fresh one put in place of the lost one): refused like a
 * missing one, before GC could take the steps for garbage. (Records count here
 * whether they decode or not: a damaged one is reported by GC, not refused.) */
static int root_check_records(ckpt_ctx *c)
{
	int n = manifest_steps_count(c->manifest);
	if (n != 0)
		return n < 0 ? n : 0;
	struct root_state rs;
	int rc = root_scan(c, &rs);
	if (rc || !rs.nsteps)
		return rc;
	ckpt_err(CKPT_ENOMANIFEST, "its manifest holds no record of any step");
	return root_refuse(c, rs.nsteps, CKPT_ENOMANIFEST);
}

/*
 * A manifest kept apart belongs to one root: recorded by the first coordinator that
 * opens it, checked by every opener (manifest_root_bind). And it is the one the
 * root's coordinator writes: each coordinator records its incarnation in it, which
 * its lock file names too, so that a rank of the running job that finds a copy at
 * the same path on its own node (left there when rank 0 moved, or restored from a
 * backup) refuses it instead of loading older steps than the other ranks. (Its
 * ranks load only after they joined the coordinator, which recorded itself first;
 * the coordinator they joined stands for the live one once it is gone, as when rank
 * 0 closed before this rank loads.)
 */
static int manifest_bind(ckpt_ctx *c, struct manifest *m)
{
	if (!c->cfg.manifest_dir)
		return 0;
	char real[PATH_MAX];
	if (!realpath(c->cfg.root, real))
		return ckpt_err(-errno, "checkpoint root %s", c->cfg.root);
	int rc = manifest_root_bind(m, real);
	if (rc)
		return rc;
	if (glue_is_coordinator(c))
		return manifest_coordinator_set(m, c->incarnation);
	uint64_t live = 0, seen = 0;
	if (c->cfg.flags & CKPT_OPEN_READONLY)
		return 0;
	if (!lock_probe(c->cfg.root, &live) || !live)
		live = c->joined_incarnation;
	if (!live)
		return 0;
	rc = manifest_coordinator_get(m, &seen);
	if (rc && rc != CKPT_ENOTFOUND)
		return rc;
	if (seen == live)
		return 0;
	char host[256];
	host_name(host, sizeof host);
	return ckpt_err(CKPT_ENOMANIFEST, "rank %d cannot read checkpoint root %s: the manifest "
	                "directory %s on host %s is not the one the root's coordinator writes "
	                "(its incarnation %016llx, this copy's %016llx): a stale copy at the same "
	                "path, which would give older steps than rank 0's; remove it, and load on "
	                "rank 0's node (docs/operations.md, \"Multi-node deployments\")",
	                c->cfg.rank, c->cfg.root, c->manifest_path, host,
	                (unsigned long long)live, (unsigned long long)seen);
}

static void *worker_main(void *arg)
{
	ckpt_ctx *c = arg;
	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (!c->queue_head && !c->stopping)
			pthread_cond_wait(&c->cond, &c->lock);
		struct ckpt_save *s = c->queue_head;
		if (!s)
			break;               /* stopping and drained */
		c->queue_head = s->next;
		if (!c->queue_head)
			c->queue_tail = NULL;
		s->state = SAVE_RUNNING;
		pthread_mutex_unlock(&c->lock);
		{
			/* The save's lines carry its step. */
			CKPT_LOG_SCOPE(NULL, s->step);
			save_run(c, s);
		}
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	io_engine_destroy(c->save_engine);
	c->save_engine = NULL;
	return NULL;
}

/* Through ckptd: a fresh copy of the job's manifest from its first instance, opened
 * read-only from a private directory that is gone once it is open. */
static int glue_manifest_remote(ckpt_ctx *c, struct manifest **out)
{
	struct manifest **old = ckpt_realloc(c->old_manifests,
	                                     (c->nold_manifests + 1) * sizeof *old);
	if (!old)
		return ckpt_err(-ENOMEM, "manifest copy");
	c->old_manifests = old;
	int rc = c->fetch[0] ? 0 : glue_remote_conn(c, 0, &c->fetch[0]);
	const char *tmp = ckpt_env("TMPDIR");
	char dir[4200], mdir[4300];
	snprintf(dir, sizeof dir, "%s/libckpt-manifest-XXXXXX", tmp ? tmp : "/tmp");
	if (!rc && !mkdtemp(dir))
		rc = ckpt_err(-errno, "private directory for the manifest copy (%s)", dir);
	if (rc)
		return rc;
	ckpt_path_manifest_dir(mdir, sizeof mdir, dir);   /* fits: dir is short */
	if (mkdir(mdir, 0700) < 0)
		rc = ckpt_err(-errno, "create %s", mdir);
	if (!rc)
		rc = remote_manifest_copy(c->fetch[0], mdir);
	if (!rc)
		rc = manifest_open(dir, MANIFEST_RDONLY, out);
	/* The environment holds what it mapped and opened: the names can go. */
	char p[4400];
	snprintf(p, sizeof p, "%s/data.mdb", mdir);
	unlink(p);
	snprintf(p, sizeof p, "%s/lock.mdb", mdir);
	unlink(p);
	rmdir(mdir);
	rmdir(dir);
	if (rc) {
		if (c->fetch[0] && rc != CKPT_ENOTFOUND) {
			remote_close(c->fetch[0]);     /* connect again next time */
			c->fetch[0] = NULL;
		}
		return rc;
	}
	if (c->manifest)
		c->old_manifests[c->nold_manifests++] = c->manifest;
	c->manifest = *out;
	return 0;
}

int glue_manifest(ckpt_ctx *c, struct manifest **out)
{
	int rc = 0;
	pthread_mutex_lock(&c->manifest_lock);
	if (glue_remote(c)) {
		rc = glue_manifest_remote(c, out);
		pthread_mutex_unlock(&c->manifest_lock);
		return rc;
	}
	if (!c->manifest) {
		struct manifest *m;
		rc = manifest_open_dir(c->manifest_path, MANIFEST_RDONLY, &m);
		/* A manifest kept apart is absent here while the root holds steps: it is on
		 * another host (or lost), which the message says; else, as for a root without
		 * one, nothing was saved yet. */
		struct root_state rs;
		if (rc == -ENOENT && c->cfg.manifest_dir && root_scan(c, &rs) == 0 && rs.nsteps) {
			char what[PATH_MAX + 64];
			snprintf(what, sizeof what, "rank %d cannot read checkpoint root %s",
			         c->cfg.rank, c->cfg.root);
			rc = manifest_absent(c, what);
		} else if (rc == -ENOENT) {
			rc = ckpt_err(CKPT_ENOTROOT, "%s has no manifest%s%s: not a checkpoint root "
			              "(or nothing was ever committed there)", c->cfg.root,
			              c->cfg.manifest_dir ? " in " : "", c->cfg.manifest_dir ?
			              c->cfg.manifest_dir : "");
		}
		if (!rc && (rc = manifest_bind(c, m)))
			manifest_close(m);
		if (!rc)
			c->manifest = m;
	}
	*out = c->manifest;
	pthread_mutex_unlock(&c->manifest_lock);
	return rc;
}

/* How long a failed rank 0 (or node leader) keeps telling its job's ranks why: they
 * start at about the same time, so they connect within seconds. */
#define REFUSE_GRACE_MS 15000u

/* Rank 0 failed before its coordinator served, or a node leader before it joined:
 * the other ranks learn why at once (commit_refuse) instead of after the commit
 * timeout. Keeps this thread's message. */
static void ckpt_refuse_peers(ckpt_ctx *c, int rc)
{
	const struct glue_config *cfg = &c->cfg;
	if (cfg->world <= 1 || (cfg->flags & CKPT_OPEN_READONLY) || !cfg->root || !cfg->job_id ||
	    cfg->nckptd ||
	    rc == CKPT_EAUTH || (cfg->rank != 0 && cfg->rank != cfg->node_first) ||
	    (cfg->rank == 0 && c->coord) || (cfg->rank != 0 && !cfg->tree) || c->part)
		return;
	char msg[1024], why[512];         /* a REJECT reason holds 512 bytes */
	snprintf(msg, sizeof msg, "%s", ckpt_err_msg());
	int transport = cfg->transport == CKPT_TRANSPORT_RDMA ? NET_RDMA : NET_TCP;
	unsigned grace = cfg->timeout_ms < REFUSE_GRACE_MS ? cfg->timeout_ms : REFUSE_GRACE_MS;
	struct commit_refuse_opts ro = {
		.transport = transport, .rdma = &cfg->rdma, .addr = cfg->coord_addr,
		.port = cfg->coord_port, .job_id = cfg->job_id, .world = (uint32_t)cfg->world, .secret = cfg->secret,
		.secret_len = cfg->secret_len, .grace_ms = grace, .code = rc, .why = why,
	};
	if (cfg->rank == 0 && !c->coord) {
		snprintf(why, sizeof why, "rank 0 could not start the coordinator of job '%s': %s",
		         cfg->job_id, msg);
		/* Every other rank connects here, or one leader per other node. */
		uint32_t nodes = cfg->tree ? ((uint32_t)cfg->world + (uint32_t)cfg->node_size - 1) /
		                             (uint32_t)cfg->node_size : (uint32_t)cfg->world;
		ro.expect = nodes - 1;
		ro.who = "coordinator";
		commit_refuse(&ro);
	}
	if (cfg->tree && cfg->node_size > 1 && cfg->rank == cfg->node_first && !c->leader) {
		char local[108];
		commit_leader_addr(local, sizeof local, cfg->job_id, cfg->coord_port,
		                   (uint32_t)cfg->node_first);
		snprintf(why, sizeof why, "the leader of node %d (rank %d) could not start: %s",
		         cfg->node_id, cfg->rank, msg);
		ro.transport = NET_UNIX;
		ro.addr = local;
		ro.port = 0;
		ro.expect = (uint32_t)cfg->node_size - 1;
		ro.who = "node leader";
		commit_refuse(&ro);
	}
	ckpt_err_restore(msg);
}

void glue_remote_auth(const ckpt_ctx *c, struct remote_auth *a)
{
	*a = (struct remote_auth){
		.job_id = c->cfg.job_id, .rank = (uint32_t)c->cfg.rank, .world = (uint32_t)c->cfg.world,
		.secret = c->cfg.secret, .secret_len = c->cfg.secret_len,
		.transport = c->cfg.transport == CKPT_TRANSPORT_RDMA ? NET_RDMA : NET_TCP,
		.rdma = &c->cfg.rdma, .timeout_ms = c->cfg.timeout_ms,
		.direct = c->cfg.rdma_direct,
	};
}

int glue_remote_conn(ckpt_ctx *c, unsigned inst, struct remote_conn **out)
{
	struct remote_auth a;
	glue_remote_auth(c, &a);
	return remote_connect(&c->inst[inst], &a, out);
}

/* Saving through ckptd: the job's coordinator is the first instance's; this rank
 * streams to its own instance (rank mod N, docs/ckptd.md). */
static int glue_remote_start(ckpt_ctx *c)
{
	unsigned n = c->cfg.nckptd;
	c->inst = ckpt_calloc(n, sizeof *c->inst);
	c->fetch = ckpt_calloc(n, sizeof *c->fetch);
	if (!c->inst || !c->fetch)
		return ckpt_err(-ENOMEM, "ckptd instances");
	for (unsigned i = 0; i < n; i++) {
		snprintf(c->inst[i].host, sizeof c->inst[i].host, "%s", c->cfg.ckptd[i].host);
		c->inst[i].port = c->cfg.ckptd[i].port;
	}
	if (c->cfg.flags & CKPT_OPEN_READONLY)
		return 0;
	unsigned mine = (unsigned)c->cfg.rank % n;
	int rc = glue_remote_conn(c, mine, &c->remote);
	struct remote_conn *home = c->remote;
	if (!rc && mine != 0)
		rc = glue_remote_conn(c, 0, &home);
	unsigned port = 0;
	if (!rc)
		rc = remote_coord(home, (uint32_t)c->cfg.world, c->inst, n,
		                  &(struct remote_keep){ c->cfg.keep_last, c->cfg.keep_every,
		                                         c->cfg.keep_seconds },
		                  c->cfg.timeout_ms, &port);
	if (home != c->remote)
		remote_close(home);
	if (rc)
		return rc;
	struct commit_part_opts po = {
		.transport = c->cfg.transport == CKPT_TRANSPORT_RDMA ? NET_RDMA : NET_TCP,
		.rdma = &c->cfg.rdma, .addr = c->inst[0].host, .port = port,
		.job_id = c->cfg.job_id, .rank = (uint32_t)c->cfg.rank, .world = (uint32_t)c->cfg.world,
		.secret = c->cfg.secret, .secret_len = c->cfg.secret_len, .timeout_ms = c->cfg.timeout_ms,
	};
	return commit_part_connect(&po, &c->part);
}

/* A world of one takes part through its own local participant. World > 1: rank 0
 * starts the coordinator (after GC, so no save of this job can
 * be in flight yet), then every rank joins it — in the hierarchical commit through
 * its node's leader, which the node's first rank starts (docs/protocol.md §2.8). */
static int glue_commit_start(ckpt_ctx *c)
{
	if (c->cfg.world == 1) {
		/* A rank alone is its own coordinator: the same road, decided here. */
		struct commit_local_opts lo = { .manifest = c->manifest, .root = c->cfg.root,
		                                .incarnation = c->incarnation, .job_id = c->cfg.job_id };
		return commit_part_open_local(&lo, &c->part);
	}
	int transport;
	if (c->cfg.transport == CKPT_TRANSPORT_RDMA)
		transport = NET_RDMA;
	else
		transport = NET_TCP;
	int rc;
	if (c->cfg.rank == 0) {
		struct commit_coord_opts co = {
			.manifest = c->manifest, .root = c->cfg.root, .incarnation = c->incarnation,
			.job_id = c->cfg.job_id, .world = (uint32_t)c->cfg.world,
			.secret = c->cfg.secret, .secret_len = c->cfg.secret_len, .transport = transport,
			.rdma = &c->cfg.rdma, .addr = c->cfg.coord_addr, .port = c->cfg.coord_port, .timeout_ms = c->cfg.timeout_ms,
		};
		if ((rc = commit_coord_start(&co, &c->coord)))
			return rc;
	}
	struct commit_part_opts po = {
		.transport = transport, .rdma = &c->cfg.rdma, .addr = c->cfg.coord_addr,
		.port = c->coord ? commit_coord_port(c->coord) : c->cfg.coord_port,
		.job_id = c->cfg.job_id, .rank = (uint32_t)c->cfg.rank, .world = (uint32_t)c->cfg.world,
		.secret = c->cfg.secret, .secret_len = c->cfg.secret_len, .timeout_ms = c->cfg.timeout_ms,
	};
	char local[108], via[96];
	if (c->cfg.tree) {
		/* Named after the configured port, which every rank of the node knows. */
		commit_leader_addr(local, sizeof local, c->cfg.job_id, c->cfg.coord_port,
		                   (uint32_t)c->cfg.node_first);
		if (c->cfg.rank == c->cfg.node_first) {
			struct commit_leader_opts lo = {
				.transport = transport, .rdma = po.rdma, .addr = po.addr, .port = po.port,
				.local_addr = local,
				.job_id = c->cfg.job_id, .rank = (uint32_t)c->cfg.rank,
				.world = (uint32_t)c->cfg.world, .node = (uint32_t)c->cfg.node_id,
				.first = (uint32_t)c->cfg.node_first, .nranks = (uint32_t)c->cfg.node_size,
				.secret = c->cfg.secret, .secret_len = c->cfg.secret_len,
				.timeout_ms = c->cfg.timeout_ms,
			};
			if ((rc = commit_leader_start(&lo, &c->leader)))
				return rc;
		}
		snprintf(via, sizeof via, "coordinator (through the leader of node %d, rank %d)",
		         c->cfg.node_id, c->cfg.node_first);
		po.transport = NET_UNIX;
		po.addr = local;
		po.port = 0;
		po.peer_name = via;
	}
	return commit_part_connect(&po, &c->part);
}

void ckpt_close(ckpt_ctx *c)
{
	if (!c)
		return;
	CKPT_LOG_SCOPE(&c->log, CKPT_LOG_NO_STEP);
	if (c->worker_started) {
		pthread_mutex_lock(&c->lock);
		c->stopping = true;
		pthread_cond_broadcast(&c->cond);
		pthread_mutex_unlock(&c->lock);
		pthread_join(c->worker, NULL);
	}
	/* The participant goes before its leader and the coordinator, so that this
	 * rank's own connection does not count as a lost rank. */
	commit_part_close(c->part);
	remote_close(c->remote);
	for (unsigned i = 0; c->fetch && i < c->cfg.nckptd; i++)
		remote_close(c->fetch[i]);
	ckpt_free(c->fetch);
	ckpt_free(c->inst);
	commit_leader_stop(c->leader);
	commit_coord_stop(c->coord);
	io_engine_destroy(c->load_engine);
	io_pool_destroy(c->pool);
	/* After the pool: its memory is pinned through the snapshot object. */
	snapshot_destroy(c->snap);
	save_stage_rec_free(c->stage_rec);
	manifest_close(c->manifest);
	for (size_t i = 0; i < c->nold_manifests; i++)
		manifest_close(c->old_manifests[i]);
	ckpt_free(c->old_manifests);
	/* Last: the root is this coordinator's until everything above is closed. */
	lock_release(c->lock_fd);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->load_lock);
	pthread_mutex_destroy(&c->manifest_lock);
	pthread_mutex_destroy(&c->gc_lock);
	ckpt_free(c->manifest_path);
	config_free(&c->cfg);
	ckpt_free(c);
}

int ckpt_open(const struct ckpt_opts *o, ckpt_ctx **out)
{
	if (!out)
		return ckpt_err(-EINVAL, "ckpt_open: out is NULL");
	*out = NULL;
	ckpt_err_clear();
	ckpt_ctx *c = ckpt_calloc(1, sizeof *c);
	if (!c)
		return ckpt_err(-ENOMEM, "ckpt_open");
	c->lock_fd = -1;
	pthread_mutex_init(&c->lock, NULL);
	ckpt_cond_init(&c->cond);
	pthread_mutex_init(&c->load_lock, NULL);
	pthread_mutex_init(&c->manifest_lock, NULL);
	pthread_mutex_init(&c->gc_lock, NULL);
	/* From here on this context's lines go where its options say, its threads' too. */
	CKPT_LOG_SCOPE(&c->log, CKPT_LOG_NO_STEP);
	int rc = config_log(o, &c->log);
	if (!rc)
		rc = config_resolve(o, &c->cfg);
	if (rc)
		goto fail;
	c->log.job_id = c->cfg.job_id;
	c->log.rank = c->cfg.rank;
	if (glue_remote(c))
		snprintf(c->where, sizeof c->where, "ckptd://%s:%u%s", c->cfg.ckptd[0].host,
		         c->cfg.ckptd[0].port, c->cfg.nckptd > 1 ? ",..." : "");
	else
		snprintf(c->where, sizeof c->where, "%s", c->cfg.root ? c->cfg.root : "?");
	ckpt_fault_set_rank(c->cfg.rank);
	bool create = false;
	if (!glue_remote(c) && (rc = manifest_path_resolve(c)))
		goto fail;
	bool ro = c->cfg.flags & CKPT_OPEN_READONLY;
	if (glue_remote(c)) {
		/* The shards and the manifest are ckptd's: nothing local to prepare. */
		if ((rc = glue_remote_start(c)))
			goto fail;
	} else if ((rc = root_prepare(c, &create))) {
		goto fail;
	}
	if (glue_remote(c)) {
		/* nothing: no manifest here */
	} else if (ro) {
		if ((rc = glue_manifest(c, &c->manifest)))
			goto fail;
	} else if (glue_is_coordinator(c)) {
		unsigned mflags = (create ? MANIFEST_CREATE : 0u) |
		                  (c->cfg.flags & CKPT_OPEN_GROUP_ACCESS ? MANIFEST_GROUP_ACCESS : 0u);
		rc = manifest_open_dir(c->manifest_path, mflags, &c->manifest);
		if (rc == CKPT_ENOMANIFEST)
			rc = root_refuse(c, 0, rc);
		if (!rc)
			rc = manifest_bind(c, c->manifest);
		if (rc)
			goto fail;
		if (!(c->cfg.flags & CKPT_OPEN_RECOVER) && (rc = root_check_records(c)))
			goto fail;
		if (!(c->cfg.flags & CKPT_OPEN_NO_GC)) {
			uint64_t removed = 0;
			rc = gc_open(c, &removed);
			if (rc)
				goto fail;
			if (removed)
				ckpt_log(CKPT_LOG_INFO, "%s: removed %llu uncommitted step(s)",
				         c->cfg.root, (unsigned long long)removed);
		}
	}
	if (!ro && !glue_remote(c) && (rc = glue_commit_start(c)))
		goto fail;
	/* Joined: the root's lock names the coordinator (manifest_bind). */
	if (!ro && !glue_remote(c) && c->cfg.manifest_dir && !glue_is_coordinator(c))
		(void)lock_probe(c->cfg.root, &c->joined_incarnation);
	/* A read-only context only loads: a few buffers are enough. */
	size_t nbufs = c->cfg.pool_bytes / c->cfg.chunk_bytes;
	if (ro && nbufs > 2u * c->cfg.queue_depth)
		nbufs = 2u * c->cfg.queue_depth;
	/* With a CUDA device the pool is pinned (docs/gpu.md, "Design (lib/snapshot)"), so
	 * that device-to-host copies land in it by DMA; otherwise it is lib/io's pre-faulted
	 * memory. */
	if ((rc = snapshot_create(&c->snap)))
		goto fail;
	/* GPUDirect Storage is optional: without it the pinned path serves. */
	if (c->cfg.gds && (rc = snapshot_gds_enable(c->snap))) {
		ckpt_log(CKPT_LOG_WARN, "GPUDirect Storage asked for, not used: %s", ckpt_err_msg());
		rc = 0;
	}
	/* A rank saving through ckptd holds its chunks only until they are on the wire,
	 * and the pool is what its copies can run ahead of the network: in classes of
	 * halving sizes, so that a short chunk does not take a buffer of the chunk
	 * size (io_pool_create_halving). A local save keeps buffers of one size: the
	 * shard writer's queue depth and its compression count them. */
	if (!ro && glue_remote(c))
		rc = io_pool_create_halving(c->cfg.chunk_bytes, (uint64_t)nbufs * c->cfg.chunk_bytes,
		                            snapshot_pool_alloc(c->snap), &c->pool);
	else
		rc = io_pool_create(c->cfg.chunk_bytes, (unsigned)nbufs, snapshot_pool_alloc(c->snap),
		                    &c->pool);
	if (rc) {
		ckpt_err_prefix(rc, "buffer pool of %zu x %zu bytes", nbufs, c->cfg.chunk_bytes);
		goto fail;
	}
	if (!ro) {
		if ((rc = ckpt_thread_create(&c->worker, NULL, worker_main, c))) {
			rc = ckpt_err(-rc, "start the save worker");
			goto fail;
		}
		c->worker_started = true;
	}
	*out = c;
	return 0;
fail:
	if (glue_remote(c))
		ckpt_err_prefix(rc, "open the job's target ckptd://%s:%u%s", c->cfg.ckptd[0].host,
		                c->cfg.ckptd[0].port, c->cfg.nckptd > 1 ? ",..." : "");
	else
		ckpt_err_prefix(rc, "open %s", c->cfg.root ? c->cfg.root : "checkpoint root");
	/* Telling the other ranks takes seconds: the root is free meanwhile, for the
	 * operator's ckpt-inspect rebuild that the message may ask for. Not while a
	 * coordinator of this context runs: it may still write the manifest until
	 * ckpt_close stops it (and then nobody is told: the ranks have their links). */
	if (!c->coord) {
		lock_release(c->lock_fd);
		c->lock_fd = -1;
	}
	ckpt_refuse_peers(c, rc);
	ckpt_close(c);
	return rc;
}
