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
	return c->cfg.rank == 0 && !(c->cfg.flags & CKPT_OPEN_READONLY);
}

int ckpt_rank(const ckpt_ctx *c) { return c ? c->cfg.rank : -1; }
int ckpt_world(const ckpt_ctx *c) { return c ? c->cfg.world : -1; }

/* mkdir -p, one component at a time (the root's parents may not exist yet). */
static int mkdir_p(const char *path)
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
		if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
			return ckpt_err(-errno, "create directory %s", tmp);
		tmp[i] = c;
	}
	return 0;
}

/* Is the root a directory we may make a checkpoint root of? An existing non-empty
 * directory without a manifest is somebody else's data: refuse it. */
static int root_prepare(const struct glue_config *cfg)
{
	struct stat st;
	bool ro = cfg->flags & CKPT_OPEN_READONLY;
	if (stat(cfg->root, &st) < 0) {
		if (errno != ENOENT || ro)
			return ckpt_err(-errno, "checkpoint root %s", cfg->root);
		return mkdir_p(cfg->root);
	}
	if (!S_ISDIR(st.st_mode))
		return ckpt_err(CKPT_ENOTROOT, "checkpoint root %s is not a directory", cfg->root);
	if (!ro && access(cfg->root, W_OK | X_OK) < 0)
		return ckpt_err(-errno, "checkpoint root %s is not writable", cfg->root);
	if (ro || cfg->rank != 0)
		return 0;
	char mpath[4200];
	snprintf(mpath, sizeof mpath, "%s/%s", cfg->root, CKPT_MANIFEST_DIR);
	if (access(mpath, F_OK) == 0)
		return 0;
	DIR *d = opendir(cfg->root);
	if (!d)
		return ckpt_err(-errno, "checkpoint root %s", cfg->root);
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d))) {
		uint64_t step;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		/* Step directories without a manifest: a crashed first save; GC takes them. */
		if (ckpt_path_parse_step_dir(e->d_name, &step))
			continue;
		rc = ckpt_err(CKPT_ENOTROOT, "%s is not empty and has no manifest: not a checkpoint root"
		              " (found '%s')", cfg->root, e->d_name);
		break;
	}
	closedir(d);
	return rc;
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
		save_run(c, s);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	io_engine_destroy(c->save_engine);
	c->save_engine = NULL;
	return NULL;
}

int glue_manifest(ckpt_ctx *c, struct manifest **out)
{
	int rc = 0;
	pthread_mutex_lock(&c->manifest_lock);
	if (!c->manifest) {
		rc = manifest_open(c->cfg.root, MANIFEST_RDONLY, &c->manifest);
		if (rc == -ENOENT)
			rc = ckpt_err(CKPT_ENOTROOT, "%s has no manifest: not a checkpoint root "
			              "(or nothing was ever committed there)", c->cfg.root);
	}
	*out = c->manifest;
	pthread_mutex_unlock(&c->manifest_lock);
	return rc;
}

/* World > 1: rank 0 starts the coordinator (after GC, so no save of this job can
 * be in flight yet), then every rank joins it — in the hierarchical commit through
 * its node's leader, which the node's first rank starts (docs/protocol.md §2.8). */
static int glue_commit_start(ckpt_ctx *c)
{
	int transport;
	if (c->cfg.transport == CKPT_TRANSPORT_RDMA)
		transport = NET_RDMA;
	else
		transport = NET_TCP;
	int rc;
	if (c->cfg.rank == 0) {
		struct commit_coord_opts co = {
			.manifest = c->manifest, .job_id = c->cfg.job_id, .world = (uint32_t)c->cfg.world,
			.secret = c->cfg.secret, .secret_len = c->cfg.secret_len, .transport = transport,
			.addr = c->cfg.coord_addr, .port = c->cfg.coord_port, .timeout_ms = c->cfg.timeout_ms,
		};
		if ((rc = commit_coord_start(&co, &c->coord)))
			return rc;
	}
	struct commit_part_opts po = {
		.transport = transport, .addr = c->cfg.coord_addr,
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
				.transport = transport, .addr = po.addr, .port = po.port, .local_addr = local,
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
	commit_leader_stop(c->leader);
	commit_coord_stop(c->coord);
	io_engine_destroy(c->load_engine);
	io_pool_destroy(c->pool);
	/* After the pool: its memory is pinned through the snapshot object. */
	snapshot_destroy(c->snap);
	manifest_close(c->manifest);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->load_lock);
	pthread_mutex_destroy(&c->manifest_lock);
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
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	pthread_mutex_init(&c->load_lock, NULL);
	pthread_mutex_init(&c->manifest_lock, NULL);
	int rc = config_resolve(o, &c->cfg);
	if (rc)
		goto fail;
	ckpt_fault_set_rank(c->cfg.rank);
	if ((rc = root_prepare(&c->cfg)))
		goto fail;
	bool ro = c->cfg.flags & CKPT_OPEN_READONLY;
	if (ro) {
		if ((rc = glue_manifest(c, &c->manifest)))
			goto fail;
	} else if (glue_is_coordinator(c)) {
		rc = manifest_open(c->cfg.root, MANIFEST_CREATE, &c->manifest);
		if (rc)
			goto fail;
		if (!(c->cfg.flags & CKPT_OPEN_NO_GC)) {
			uint64_t removed = 0;
			rc = gc_orphans(c, &removed);
			if (rc)
				goto fail;
			if (removed)
				ckpt_log(CKPT_LOG_INFO, "%s: removed %llu uncommitted step(s)",
				         c->cfg.root, (unsigned long long)removed);
		}
	}
	if (!ro && c->cfg.world > 1 && (rc = glue_commit_start(c)))
		goto fail;
	/* A read-only context only loads: a few buffers are enough. */
	size_t nbufs = c->cfg.pool_bytes / c->cfg.chunk_bytes;
	if (ro && nbufs > 2u * c->cfg.queue_depth)
		nbufs = 2u * c->cfg.queue_depth;
	/* With a CUDA device the pool is pinned (DESIGN §8), so that device-to-host
	 * copies land in it by DMA; otherwise it is lib/io's pre-faulted memory. */
	if ((rc = snapshot_create(&c->snap)))
		goto fail;
	/* GPUDirect Storage is optional: without it the pinned path serves. */
	if (c->cfg.gds && (rc = snapshot_gds_enable(c->snap))) {
		ckpt_log(CKPT_LOG_WARN, "GPUDirect Storage asked for, not used: %s", ckpt_err_msg());
		rc = 0;
	}
	if ((rc = io_pool_create(c->cfg.chunk_bytes, (unsigned)nbufs, snapshot_pool_alloc(c->snap),
	                         &c->pool))) {
		ckpt_err_prefix(rc, "buffer pool of %zu x %zu bytes", nbufs, c->cfg.chunk_bytes);
		goto fail;
	}
	if (!ro) {
		if ((rc = pthread_create(&c->worker, NULL, worker_main, c))) {
			rc = ckpt_err(-rc, "start the save worker");
			goto fail;
		}
		c->worker_started = true;
	}
	*out = c;
	return 0;
fail:
	ckpt_err_prefix(rc, "open %s", c->cfg.root ? c->cfg.root : "checkpoint root");
	ckpt_close(c);
	return rc;
}
