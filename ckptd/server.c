/*
 * server.c — ckptd's connections and jobs (server.h, docs/ckptd.md).
 *
 * One thread per connection, at most max_conns at once (more wait in the
 * listener's backlog). A connection is one rank of one job, authenticated against
 * the jobs table; it may stream shards (OPEN .. FINISH), read shard bytes, copy the
 * manifest, and ask for the job's coordinator. Everything it touches is under
 * <data>/jobs/<job id>/, which is a checkpoint root of the normal layout.
 *
 * Memory: chunks are received straight into the fixed pool's buffers, and a buffer
 * is taken before the chunk is read off the socket: when the disks fall behind,
 * the pool empties, connections stop reading, and TCP slows the ranks down. A
 * waiting connection reaps its own finished writes while it waits, so buffers
 * always come back. Control messages are bounded (REMOTE_MAX_CONTROL); a failed
 * stream gets one ERROR and the connection is closed, so nothing is buffered to
 * be discarded.
 *
 * Over rdma a stream may ask for the direct path (REMOTE_OPEN_DIRECT): then pool
 * buffers are taken first, as for DATA, and granted to the rank (GRANT), which
 * RDMA-writes a chunk into one and names it in its CHUNK; no copy is made on this
 * side. Each grant is a registration of that one buffer, revoked (deregistered)
 * when the CHUNK naming it arrives or the stream ends, before the buffer is used or
 * goes back to the pool: a rank can write only into buffers granted to it and not
 * yet used, never into another stream's, whatever it sends.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commit/commit.h"
#include "io/io.h"
#include "manifest/manifest.h"
#include "remote/remote.h"
#include "server.h"

#define SRV_POLL_MS 200          /* how often an idle connection looks at the stop flag */
#define SRV_LOCK_FILE "ckptd.lock"
#define SRV_IDLE_ENGINES 64      /* engines kept for the next connections (engine_put) */
/* A connection's writes are issued by the kernel's io_uring workers, not by the
 * thread that reads its socket (io_engine_offload): issued there, a write waited
 * whenever the disk's queue was full, and the rank's stream with it. A few workers
 * issue a stream's writes (an O_DIRECT write is only issued by one, not waited
 * for); without a cap a ring had up to 4 per CPU, 512 threads for 8 streams on
 * 16 CPUs. */
#define SRV_IO_WORKERS 4

/* Attempts remembered as removed, per job: a rank hears of its attempt's end within
 * a round trip of the decision, long before this many more end. */
#define SRV_GONE 64

struct djob {
	struct djob     *next;
	char             id[129];
	char             root[4200];
	pthread_mutex_t  lock;           /* below */
	pthread_cond_t   stream_gone;    /* a stream left streams */
	struct dconn    *streams;        /* the connections with a shard stream open */
	struct manifest *manifest;       /* opened by the first COORD or MANIFEST */
	struct commit_coord *coord;
	uint32_t         coord_world;
	unsigned         ninst;
	char             holders[REMOTE_MAX_INSTANCES][REMOTE_MAX_HOST + 8];
	struct remote_instance inst[REMOTE_MAX_INSTANCES];
	struct ckptd_job auth;           /* id and secret, for asking other instances */
	struct remote_keep keep;         /* the job's retention rules (its COORD's) */
	bool             gc_done;        /* this process collected the job's dead attempts */
	uint64_t         incarnation;    /* its coordinator's */
	uint64_t         reserved;       /* size hints of the streams in flight */
	/* Attempts whose files this instance removed (given up, or retired), the newest
	 * SRV_GONE: a stream of one is refused at OPEN and at FINISH (job_gone). */
	struct { uint64_t step, save_id; } gone[SRV_GONE];
	unsigned         ngone;          /* how many were ever added */
	_Atomic uint64_t bytes_received, committed, aborted;
	struct ckptd_counters *counters;
	int              transport;      /* the instances' (ckptd's own, enum net_transport) */
	struct ckptd_server *srv;
	struct ckpt_log_sink sink;       /* the job's lines (its coordinator's thread too) */
};

struct ckptd_server {
	struct ckptd_server_opts o;
	char                *data;
	int                  lock_fd;
	struct io_pool      *pool;
	struct net_listener *lis;
	int                  wake[2];
	atomic_bool          stop;
	uint64_t             stop_deadline;
	pthread_mutex_t      lock;       /* jobs, nconns, idle engines */
	pthread_cond_t       cond;
	struct djob         *jobs;
	unsigned             nconns;
	/* Connections in their handshake, by the peer's address (under lock): no one
	 * address may hold more than max_handshakes of the max_conns threads before it
	 * has proved a job's secret. */
	struct pending { char addr[INET6_ADDRSTRLEN]; unsigned n; } *pending;
	unsigned             npending;
	uint64_t             refused_logged;   /* ns of the last line about a refusal */
	/* Engines of connections that ended, for the next ones (engine_get): each has
	 * the whole pool registered, which takes milliseconds per GiB of pool, and a
	 * new connection must not spend that before its first chunk. At most
	 * SRV_IDLE_ENGINES (each holds its registration's kernel memory). */
	struct io_engine   **idle_engines;
	unsigned             nidle_engines;
	/* the janitor: one thread removing what the jobs' coordinators gave up */
	pthread_t            janitor;
	bool                 janitor_started;
	struct chore        *chores;     /* under lock */
};

/* Work for the janitor, after a coordinator's decision or its start. */
enum chore_kind { CHORE_ABORTED, CHORE_COMMITTED, CHORE_GC };
struct chore {
	struct chore   *next;
	struct djob    *job;
	enum chore_kind kind;
	uint64_t        step;
};

struct dconn {
	struct ckptd_server *s;
	struct net_conn     *net;
	struct net_hello     hello;
	struct djob         *job;
	struct io_engine    *engine;
	/* the shard stream */
	struct io_shard_writer *w;
	char                 path[4400], dir[4300];
	uint64_t             step, save_id, reserve, used_at_open, quota;
	uint64_t             written;
	struct net_msg       chunk_msg;  /* the CHUNK whose DATA comes next */
	struct remote_chunk  chunk;
	bool                 want_data;
	bool                 after;      /* hashes after the bytes (REMOTE_OPEN_AFTER) */
	bool                 want_hashes;/* after: the chunk's bytes are in data_buf */
	int                  data_buf;   /* the pool buffer DATA is read into (after: and
	                                  * held in until HASHES), or -1 */
	/* the direct path: pool buffers granted to the stream, each registered for the
	 * rank's RDMA WRITE alone, until its CHUNK comes or the stream ends */
	bool                 direct;
	bool                 tree;           /* the stream's hashes are trees (format 5) */
	struct dgrant { uint32_t id; unsigned buf; struct net_mr *mr; } grants[REMOTE_MAX_GRANTS];
	unsigned             ngrants, grant_target;
	uint32_t             grant_seq;  /* the connection's last grant id: never reused */
	uint64_t             starved_since; /* a direct stream with no grant out: since (ns) */
	int64_t              queued;     /* this stream's share of queue_depth */
	size_t               index_bytes;/* what the stream's index holds, about */
	bool                 sent_error; /* an ERROR went out: the connection ends */
	/* where the stream's time went (logged with DURABLE): since open, waiting for a
	 * pool buffer, inside the writer's appends (its ring and writes) */
	uint64_t             t_open, ns_buf, ns_append, nchunks;
	struct ckptd_job     auth;       /* during the handshake: the job's secret */
	char                 addr[INET6_ADDRSTRLEN]; /* the peer's, counted in pending
	                                    during the handshake; "" where none is known */
	struct ckpt_log_sink sink;       /* this connection's lines: job and rank */
	struct dconn        *next_stream;/* in job->streams, while listed */
	bool                 listed;
};

/* ------------------------------------------------------------------ jobs */

static int job_find(struct ckptd_server *s, const char *id, struct djob **out)
{
	pthread_mutex_lock(&s->lock);
	struct djob *j = s->jobs;
	while (j && strcmp(j->id, id))
		j = j->next;
	if (!j && (j = ckpt_calloc(1, sizeof *j))) {
		snprintf(j->id, sizeof j->id, "%s", id);
		snprintf(j->root, sizeof j->root, "%s/jobs/%s", s->data, id);
		pthread_mutex_init(&j->lock, NULL);
		ckpt_cond_init(&j->stream_gone);
		j->counters = s->o.counters;
		j->transport = s->o.transport;
		j->srv = s;
		j->sink = (struct ckpt_log_sink){ .fn = s->o.log_fn, .level = s->o.log_level,
		                                  .job_id = j->id, .rank = CKPT_LOG_NO_RANK };
		j->next = s->jobs;
		s->jobs = j;
	}
	pthread_mutex_unlock(&s->lock);
	*out = j;
	return j ? 0 : ckpt_err(-ENOMEM, "job '%s'", id);
}

/* The job's directory (0700), created on first use. */
static int job_dir(struct djob *j)
{
	if (mkdir(j->root, 0700) < 0 && errno != EEXIST)
		return ckpt_err(-errno, "job '%s': create %s", j->id, j->root);
	return 0;
}

/* Bytes of files under dir (the job's usage: what its quota counts), but for the
 * nskip files whose paths skip names (built from the job's root as these are). */
static uint64_t du(const char *dir, int depth, const char *const *skip, unsigned nskip)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	uint64_t sum = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char p[4400];
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		struct stat st;
		if (lstat(p, &st) < 0)
			continue;
		if (S_ISDIR(st.st_mode) && depth < 3)
			sum += du(p, depth + 1, skip, nskip);
		if (!S_ISREG(st.st_mode))
			continue;
		unsigned k = 0;
		while (k < nskip && strcmp(skip[k], p))
			k++;
		if (k == nskip)
			sum += (uint64_t)st.st_blocks * 512u > (uint64_t)st.st_size
				? (uint64_t)st.st_size : (uint64_t)st.st_blocks * 512u;
	}
	closedir(d);
	return sum;
}

/* What job j holds here for its quota, under j->lock: its files, less those of its
 * streams in flight, which the streams' reservations (their size hints) count
 * instead. Counted twice, a stream's file (allocated whole at open: the writer
 * preallocates it) and its reservation refused saves that fit the quota. By path:
 * a listed stream creates its file outside the lock, so the file may appear while
 * the walk runs (a list of the files there before the walk missed it). */
static uint64_t job_held(struct djob *j)
{
	unsigned n = 0;
	for (struct dconn *d = j->streams; d; d = d->next_stream)
		n++;
	const char **skip = n ? ckpt_calloc(n, sizeof *skip) : NULL;
	unsigned nskip = 0;
	for (struct dconn *d = j->streams; skip && d; d = d->next_stream)
		skip[nskip++] = d->path;
	/* Without memory for the list: every file counts (stricter, never looser). */
	uint64_t held = du(j->root, 0, skip, nskip);
	ckpt_free(skip);
	return held;
}

/* The files of attempt save_id of step go: from now on a stream of that attempt
 * is refused. Called before the removal, so that whatever the order of a rank's
 * OPEN and the removal, its file does not stay: a file created before it is removed
 * by it, and a stream that checks after it is refused (on_open, on_finish). */
static void job_gone_add(struct djob *j, uint64_t step, uint64_t save_id)
{
	pthread_mutex_lock(&j->lock);
	unsigned i = j->ngone++ % SRV_GONE;
	j->gone[i].step = step;
	j->gone[i].save_id = save_id;
	pthread_mutex_unlock(&j->lock);
}

/* CKPT_EABORTED where d's attempt is one whose files were removed here. */
static int job_gone(struct dconn *d)
{
	struct djob *j = d->job;
	bool gone = false;
	pthread_mutex_lock(&j->lock);
	unsigned n = j->ngone < SRV_GONE ? j->ngone : SRV_GONE;
	for (unsigned i = 0; i < n && !gone; i++)
		gone = j->gone[i].step == d->step && j->gone[i].save_id == d->save_id;
	pthread_mutex_unlock(&j->lock);
	if (!gone)
		return 0;
	return ckpt_err(CKPT_EABORTED, "job '%s': step %llu: attempt %016llx was given up, and "
	                "its files removed, before the shard of rank %u was durable", j->id,
	                (unsigned long long)d->step, (unsigned long long)d->save_id,
	                d->hello.rank);
}

/* Attempt save_id of step is given up here: it is marked gone, then its files go,
 * and the step's directory with them where it is left empty. */
static int job_remove_attempt(struct djob *j, uint64_t step, uint64_t save_id,
                              uint32_t *removed)
{
	bool empty = false;
	job_gone_add(j, step, save_id);
	int rc = ckpt_step_remove_attempt(j->root, step, save_id, removed, &empty);
	if (!rc && empty) {
		char dir[4300];
		if (!ckpt_path_step_dir(dir, sizeof dir, j->root, step) && rmdir(dir) == 0)
			ckpt_fsync_dir(j->root);
	}
	return rc;
}

static const char *job_holder(void *arg, uint32_t rank)
{
	struct djob *j = arg;
	unsigned i = rank % j->ninst;
	return i == 0 ? NULL : j->holders[i];
}

/* The coordinator holds a vote for a shard on another instance to the file there. */
static int job_remote_check(void *arg, const char *holder, const char *rel, uint64_t file_size,
                            uint64_t footer_off, uint64_t footer_len, const uint8_t *hash)
{
	struct djob *j = arg;
	unsigned i = 1;
	while (i < j->ninst && strcmp(j->holders[i], holder))
		i++;
	if (i == j->ninst)
		return ckpt_err(CKPT_EINVALID, "shard held by %s, which is not one of the job's "
		                "instances", holder);
	struct remote_auth a = { .job_id = j->id, .rank = 0, .world = j->coord_world,
	                         .secret = j->auth.secret, .secret_len = j->auth.secret_len,
	                         .transport = j->transport, .timeout_ms = 10000 };
	struct remote_conn *c;
	int rc = remote_connect(&j->inst[i], &a, &c);
	if (!rc) {
		struct remote_check k = { .file_size = file_size, .footer_off = footer_off,
		                          .footer_len = footer_len };
		snprintf(k.path, sizeof k.path, "%s", rel);
		memcpy(k.hash, hash, CKPT_HASH_BYTES);
		rc = remote_check(c, &k);
		remote_close(c);
	}
	return rc;
}

static void chore_add(struct djob *j, enum chore_kind kind, uint64_t step)
{
	struct chore *c = ckpt_calloc(1, sizeof *c);
	if (!c) {
		ckpt_log(CKPT_LOG_WARN, "job %s: step %llu: no memory to queue its clean-up (the "
		         "next start collects it)", j->id, (unsigned long long)step);
		return;
	}
	*c = (struct chore){ .job = j, .kind = kind, .step = step };
	struct ckptd_server *s = j->srv;
	pthread_mutex_lock(&s->lock);
	struct chore **pp = &s->chores;
	while (*pp)
		pp = &(*pp)->next;
	*pp = c;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

static void job_decided(void *arg, uint64_t step, int code)
{
	struct djob *j = arg;
	chore_add(j, code ? CHORE_ABORTED : CHORE_COMMITTED, step);
	ckpt_log(code ? CKPT_LOG_WARN : CKPT_LOG_INFO, "job %s: step %llu %s", j->id,
	         (unsigned long long)step, code ? "aborted" : "committed");
	atomic_fetch_add(code ? &j->aborted : &j->committed, 1);
	atomic_fetch_add_explicit(code ? &j->counters->saves_aborted : &j->counters->saves_committed,
	                          1, memory_order_relaxed);
}

static int job_manifest(struct djob *j, bool create)
{
	if (j->manifest)
		return 0;
	int rc = job_dir(j);
	if (!rc)
		rc = manifest_open(j->root, create ? MANIFEST_CREATE : 0, &j->manifest);
	if (rc == -ENOENT)
		return ckpt_err(CKPT_ENOTFOUND, "job '%s' has no manifest on this ckptd (nothing "
		                "committed here: is this the first instance of the job's target?)",
		                j->id);
	return rc;
}

/* ------------------------------------------------------------------ requests */

static int send_ok(struct dconn *d, uint16_t type, const void *p, size_t n)
{
	return net_send(d->net, type, p, n, (int)d->s->o.timeout_ms);
}

static int on_coord(struct dconn *d, const struct net_msg *m)
{
	struct remote_instance *in = ckpt_calloc(REMOTE_MAX_INSTANCES, sizeof *in);
	if (!in)
		return ckpt_err(-ENOMEM, "COORD");
	uint32_t world, timeout;
	unsigned n;
	struct remote_keep keep;
	int rc = remote_coord_decode(m->payload, m->len, &world, in, REMOTE_MAX_INSTANCES, &n,
	                             &keep, &timeout);
	if (!rc && world != d->hello.world)
		rc = ckpt_err(CKPT_EPROTO, "COORD for %u ranks from a rank of a world of %u", world,
		              d->hello.world);
	struct djob *j = d->job;
	pthread_mutex_lock(&j->lock);
	bool same = !rc && j->coord && j->coord_world == world && j->ninst == n &&
	            !memcmp(j->inst, in, n * sizeof *in);
	if (!rc)
		j->keep = keep;
	if (!rc && !same) {
		/* A job that comes back with another world or other instances gets a new
		 * coordinator; steps in flight under the old one are aborted by it. */
		commit_coord_stop(j->coord);
		j->coord = NULL;
		if (!(rc = job_manifest(j, true))) {
			j->ninst = n;
			memcpy(j->inst, in, n * sizeof *in);
			for (unsigned i = 0; i < n; i++)
				snprintf(j->holders[i], sizeof j->holders[i], "%s:%u", in[i].host, in[i].port);
			j->coord_world = world;
			/* The job's ranks wait for a decision twice their own timeout: a step
			 * whose votes will not all come (its other ranks are gone) must abort
			 * within it, not after ckptd's longer one, or they report it in doubt. */
			if (!timeout || timeout > d->s->o.timeout_ms)
				timeout = d->s->o.timeout_ms;
			if (!(rc = ckptd_jobs_get(d->s->o.jobs, j->id, strlen(j->id), &j->auth))) {
				j->incarnation = ckpt_random_id();
				struct commit_coord_opts co = {
					.manifest = j->manifest, .root = j->root, .incarnation = j->incarnation,
					.job_id = j->id, .world = world, .secret = j->auth.secret,
					.secret_len = j->auth.secret_len, .transport = d->s->o.transport,
					.addr = d->s->o.listen_host, .port = 0, .timeout_ms = timeout,
					.shard_holder = n > 1 ? job_holder : NULL,
					.remote_check = n > 1 ? job_remote_check : NULL,
					.holder_arg = j, .on_decision = job_decided,
				};
				/* Its thread logs as the job, not as this connection. */
				CKPT_LOG_SCOPE(&j->sink, CKPT_LOG_NO_STEP);
				rc = commit_coord_start(&co, &j->coord);
			}
			/* What the job left unfinished before this process knew it (a crash, a
			 * restart): collected once, now that its instances are known. */
			if (!rc && !j->gc_done) {
				j->gc_done = true;
				chore_add(j, CHORE_GC, 0);
			}
		}
	}
	uint8_t port[2];
	if (!rc)
		ckpt_put_le16(port, (uint16_t)commit_coord_port(j->coord));
	pthread_mutex_unlock(&j->lock);
	ckpt_free(in);
	if (rc)
		return rc;
	ckpt_log(CKPT_LOG_INFO, "job %s rank %u: coordinator on port %u", j->id, d->hello.rank,
	         ckpt_get_le16(port));
	return send_ok(d, REMOTE_MSG_COORD_OK, port, sizeof port);
}

static int engine_get(struct dconn *d)
{
	if (d->engine)
		return 0;
	struct ckptd_server *s = d->s;
	pthread_mutex_lock(&s->lock);
	if (s->nidle_engines)
		d->engine = s->idle_engines[--s->nidle_engines];
	pthread_mutex_unlock(&s->lock);
	if (d->engine)
		return 0;
	int rc = io_engine_create(s->pool, s->o.queue_depth, &d->engine);
	if (!rc && (rc = io_engine_offload(d->engine, SRV_IO_WORKERS)))
		ckpt_log(CKPT_LOG_DEBUG, "io_uring workers not capped at %u a connection: %s",
		         SRV_IO_WORKERS, ckpt_strerror(rc));
	return d->engine ? 0 : rc;
}

/* A connection's engine at its end: kept for the next connection when it is idle
 * (its writer finished or aborted, every request reaped) and there is room. */
static void engine_put(struct ckptd_server *s, struct io_engine *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&s->lock);
	bool keep = io_engine_inflight(e) == 0 && s->idle_engines &&
	            s->nidle_engines < SRV_IDLE_ENGINES;
	if (keep)
		s->idle_engines[s->nidle_engines++] = e;
	pthread_mutex_unlock(&s->lock);
	if (!keep)
		io_engine_destroy(e);
}

/* Every grant back to the pool, each revoked first: once deregistered, the rank's
 * late or forged WRITE fails on its own connection and cannot touch the buffer's
 * next owner. */
static void grants_release(struct dconn *d)
{
	for (unsigned i = 0; i < d->ngrants; i++) {
		net_mr_deregister(d->grants[i].mr);
		io_pool_put(d->s->pool, d->grants[i].buf);
	}
	d->ngrants = 0;
	d->starved_since = 0;
}

/* Grant the stream pool buffers up to its share, as many as are free now (never
 * waiting: a full pool is the disks' backpressure, and the rank waits for a GRANT
 * as it would wait for ckptd to read its DATA), and tell the rank in one GRANT. */
static int grants_top_up(struct dconn *d)
{
	if (!d->direct || !d->w || d->sent_error || d->ngrants >= d->grant_target)
		return 0;
	struct io_pool *pool = d->s->pool;
	size_t len = io_pool_buf_bytes(pool);
	struct remote_grant g[REMOTE_MAX_GRANTS];
	unsigned n = 0;
	int rc = 0;
	while (d->ngrants < d->grant_target) {
		int b = io_pool_get(pool, 0);
		if (b < 0)
			break;
		struct net_mr *mr;
		uint8_t *addr = io_pool_addr(pool, (unsigned)b);
		if ((rc = net_mr_register(d->net, addr, len, NET_MR_REMOTE_WRITE, &mr))) {
			io_pool_put(pool, (unsigned)b);
			break;
		}
		if (++d->grant_seq == 0)
			d->grant_seq = 1;
		d->grants[d->ngrants++] = (struct dgrant){ .id = d->grant_seq, .buf = (unsigned)b,
		                                           .mr = mr };
		g[n++] = (struct remote_grant){ .id = d->grant_seq, .addr = (uintptr_t)addr,
		                                .rkey = net_mr_rkey(mr), .len = (uint32_t)len };
	}
	if (n) {
		struct ckpt_buf b;
		ckpt_buf_init(&b);
		remote_grant_encode(&b, g, n);
		int sr = b.ok ? send_ok(d, REMOTE_MSG_GRANT, b.p, b.len) : ckpt_err(-ENOMEM, "GRANT");
		ckpt_buf_free(&b);
		if (!rc)
			rc = sr;
	}
	if (d->ngrants)
		d->starved_since = 0;
	else if (!d->starved_since)
		d->starved_since = ckpt_now_ns();
	return rc;
}

/* The stream's chunks received and not yet written, into the queue_depth gauge:
 * after every call of its writer that may take a chunk or reap a write. */
static void queue_refresh(struct dconn *d)
{
	int64_t now = d->w ? (int64_t)io_shard_writer_pending(d->w) : 0;
	atomic_fetch_add_explicit(&d->s->o.counters->queue_depth, now - d->queued,
	                          memory_order_relaxed);
	d->queued = now;
}

static void stream_end(struct dconn *d, bool abort)
{
	grants_release(d);
	d->direct = false;
	if (abort && d->w) {
		io_shard_writer_abort(d->w);
		ckpt_log(CKPT_LOG_WARN, "job %s rank %u: shard of step %llu aborted", d->job->id,
		         d->hello.rank, (unsigned long long)d->step);
	}
	d->w = NULL;
	if (d->want_data)
		net_msg_free(&d->chunk_msg);
	d->want_data = false;
	/* A chunk whose bytes came and whose HASHES did not: never written. */
	if (d->want_hashes) {
		io_pool_put(d->s->pool, (unsigned)d->data_buf);
		d->data_buf = -1;
	}
	d->want_hashes = false;
	d->after = false;
	pthread_mutex_lock(&d->job->lock);
	d->job->reserved -= d->reserve;
	if (d->listed) {
		struct dconn **p = &d->job->streams;
		while (*p != d)
			p = &(*p)->next_stream;
		*p = d->next_stream;
		d->listed = false;
		pthread_cond_broadcast(&d->job->stream_gone);
	}
	pthread_mutex_unlock(&d->job->lock);
	d->reserve = 0;
	atomic_fetch_sub_explicit(&d->s->o.counters->queue_depth, d->queued, memory_order_relaxed);
	d->queued = 0;
}

/* List d's stream (d->path) in its job's, once no other connection has a stream of
 * that file: a rank that sends its attempt's shard again on a new connection (its
 * last one broken, or closed by ckptd over a bad frame, which the rank sees at once)
 * waits until the old connection has removed the file of its broken stream (after
 * that file's writes and directory fsync, which take long on a busy disk), rather
 * than find it there. Up to four times the timeout: a connection that never lets
 * go is -EBUSY. */
static int stream_list(struct dconn *d)
{
	struct djob *j = d->job;
	uint64_t deadline = ckpt_deadline_ms(4 * (int64_t)d->s->o.timeout_ms);
	int rc = 0;
	bool late = false;
	pthread_mutex_lock(&j->lock);
	for (;;) {
		struct dconn *o = j->streams;
		while (o && strcmp(o->path, d->path))
			o = o->next_stream;
		if (!o)
			break;
		if (late) {
			rc = ckpt_err(-EBUSY, "job '%s': the shard of rank %u for step %llu is still "
			              "being written by another connection", j->id, d->hello.rank,
			              (unsigned long long)d->step);
			break;
		}
		late = ckpt_cond_wait_until(&j->stream_gone, &j->lock, deadline) == ETIMEDOUT;
	}
	if (!rc) {
		d->next_stream = j->streams;
		j->streams = d;
		d->listed = true;
	}
	pthread_mutex_unlock(&j->lock);
	return rc;
}

/* d's step directory, made where it is not there, its entry durable in the root. */
static int stream_dir_make(struct dconn *d)
{
	if (mkdir(d->dir, 0700) == 0)
		return ckpt_fsync_dir(d->job->root);
	return errno == EEXIST ? 0 : ckpt_err(-errno, "create %s", d->dir);
}

static int on_open(struct dconn *d, const struct net_msg *m)
{
	struct remote_open o;
	int rc = remote_open_decode(m->payload, m->len, &o);
	if (rc)
		return rc;
	if (d->w)
		return ckpt_err(CKPT_EPROTO, "OPEN inside a shard stream");
	/* A granted chunk's CHUNK comes after its bytes already, with its hashes. */
	if ((o.flags & REMOTE_OPEN_DIRECT) && (o.flags & REMOTE_OPEN_AFTER))
		return ckpt_err(CKPT_EPROTO, "OPEN asks for the direct path and for hashes after "
		                "the bytes: a stream has one or the other");
	struct djob *j = d->job;
	struct ckptd_job auth;
	if ((rc = ckptd_jobs_get(d->s->o.jobs, j->id, strlen(j->id), &auth)))
		return ckpt_err(CKPT_EAUTH, "job '%s' is no longer in the jobs file", j->id);
	explicit_bzero(auth.secret, sizeof auth.secret);
	if ((rc = job_dir(j)) || (rc = engine_get(d)))
		return rc;
	/* The quota counts what the job holds here and what its streams in flight say
	 * they will add (job_held). Only a quota needs it: the walk over the job's files
	 * is not free on a disk busy with the other streams, and the rank waits for
	 * OPEN_OK. Under the lock: a stream listed, unlisted or released meanwhile
	 * would be counted twice or not at all. */
	pthread_mutex_lock(&j->lock);
	uint64_t held = auth.quota_bytes ? job_held(j) : 0, used;
	if (!ckpt_add_u64(held, j->reserved, &used))
		used = UINT64_MAX;
	/* Compared without a sum: a hint near 2^64 must not wrap around the quota. */
	if (auth.quota_bytes && (o.size_hint > auth.quota_bytes ||
	                         used > auth.quota_bytes - o.size_hint)) {
		pthread_mutex_unlock(&j->lock);
		atomic_fetch_add_explicit(&d->s->o.counters->quota_refusals, 1, memory_order_relaxed);
		return ckpt_err(-EDQUOT, "job '%s': quota of %llu bytes exceeded: it holds %llu, and "
		                "the shard of rank %u for step %llu needs about %llu more", j->id,
		                (unsigned long long)auth.quota_bytes, (unsigned long long)used,
		                d->hello.rank, (unsigned long long)o.step,
		                (unsigned long long)o.size_hint);
	}
	j->reserved += o.size_hint;
	pthread_mutex_unlock(&j->lock);
	d->reserve = o.size_hint;
	d->used_at_open = used;
	d->quota = auth.quota_bytes;
	d->written = 0;
	d->index_bytes = 0;
	d->step = o.step;
	d->save_id = o.save_id;
	if ((rc = ckpt_path_step_dir(d->dir, sizeof d->dir, j->root, o.step)) ||
	    (rc = ckpt_path_shard(d->path, sizeof d->path, j->root, o.step, d->hello.rank,
	                          o.save_id)))
		goto fail;
	if ((rc = stream_list(d)))
		goto fail;
	/* A stream of an attempt given up here makes no directory. */
	if ((rc = job_gone(d)) || (rc = stream_dir_make(d)))
		goto fail;
	/* Tests: a removal of the step's attempts while the file is not made yet. */
	if ((rc = ckpt_fault(CKPT_FP_AFTER_STEP_DIR)) > 0)
		rc = 0;
	if (rc)
		goto fail;
	/* An earlier attempt of this rank at this step cannot commit any more: its
	 * coordinator began a new one. Its file goes (its own, never another rank's). */
	DIR *dd = opendir(d->dir);
	struct dirent *e;
	while (dd && (e = readdir(dd))) {
		uint32_t r;
		uint64_t sid;
		if (ckpt_path_parse_shard(e->d_name, &r, &sid) && r == d->hello.rank && sid != o.save_id)
			unlinkat(dirfd(dd), e->d_name, 0);
	}
	if (dd)
		closedir(dd);
	struct io_writer_opts wo = {
		.step = o.step, .rank = d->hello.rank, .world = d->hello.world, .save_id = o.save_id,
		.size_hint = o.size_hint, .block_bytes = o.block_bytes, .mode = 0600,
		.preallocate = true, .tree = (o.flags & REMOTE_OPEN_TREE) != 0,
	};
	d->t_open = ckpt_now_ns();
	d->ns_buf = d->ns_append = d->nchunks = 0;
	rc = io_shard_writer_open(d->engine, d->path, &wo, &d->w);
	/* The directory went before the file was in it: the removal of an attempt of
	 * this step (REMOVE, the janitor, which an OPEN does not wait for) found it
	 * empty. This attempt's own: it was given up, and the rank hears so. Another's:
	 * the directory is made again, and once the file is in it no removal takes it. */
	for (int i = 0; rc == -ENOENT && i < 3; i++)
		if (!(rc = job_gone(d)) && !(rc = stream_dir_make(d)))
			rc = io_shard_writer_open(d->engine, d->path, &wo, &d->w);
	if (rc)
		goto fail;
	/* After the file is there: a removal that began before it missed it. */
	if ((rc = job_gone(d))) {
		stream_end(d, true);
		return rc;
	}
	/* The direct path where the rank asks and the transport can: a share of the
	 * pool, so that one stream cannot take every buffer as grants it has not used. */
	d->direct = (o.flags & REMOTE_OPEN_DIRECT) && net_conn_can_write(d->net);
	d->tree = (o.flags & REMOTE_OPEN_TREE) != 0;
	d->after = (o.flags & REMOTE_OPEN_AFTER) != 0;
	unsigned nbufs = io_pool_nbufs(d->s->pool);
	d->grant_target = nbufs / 2 < REMOTE_MAX_GRANTS ? (nbufs / 2 ? nbufs / 2 : 1)
	                                                : REMOTE_MAX_GRANTS;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_ok_encode(&b, io_pool_buf_bytes(d->s->pool),
	                      (d->direct ? REMOTE_OPEN_DIRECT : 0) |
	                      (o.flags & (REMOTE_OPEN_TREE | REMOTE_OPEN_AFTER)));
	rc = b.ok ? send_ok(d, REMOTE_MSG_OPEN_OK, b.p, b.len) : ckpt_err(-ENOMEM, "OPEN_OK");
	ckpt_buf_free(&b);
	if (!rc)
		rc = grants_top_up(d);
	return rc;
fail:
	stream_end(d, false);
	return rc;
}

static int index_grow(struct dconn *d, size_t n, const char *what)
{
	d->index_bytes += n;
	if (d->index_bytes <= d->s->o.max_index)
		return 0;
	return ckpt_err(-EMSGSIZE, "the shard of rank %u for step %llu: its index (%s) grows past "
	                "the %zu bytes a stream may hold (--max-index)", d->hello.rank,
	                (unsigned long long)d->step, what, d->s->o.max_index);
}

/* Why a message of the stream's cannot come now (NULL: it can): the last chunk's
 * DATA, or after it its HASHES, are owed first. */
static const char *stream_owed(const struct dconn *d)
{
	if (!d->w)
		return "outside a shard stream";
	if (d->want_data)
		return "before the last chunk's DATA";
	if (d->want_hashes)
		return "before the last chunk's HASHES";
	return NULL;
}

static int on_tensor(struct dconn *d, const struct net_msg *m)
{
	struct remote_tensor t;
	int rc = remote_tensor_decode(m->payload, m->len, &t);
	if (rc)
		return rc;
	const char *owed = stream_owed(d);
	if (owed)
		return ckpt_err(CKPT_EPROTO, "TENSOR %s", owed);
	/* Checked here too, so that the message quotes the peer's bytes escaped. */
	const char *why = ckpt_name_problem(t.name, strlen(t.name), true);
	if (why) {
		char q[CKPT_NAME_QUOTE_CAP];
		return ckpt_err(CKPT_ENAME, "invalid tensor name '%s': %s",
		                ckpt_name_quote(t.name, strlen(t.name), q, sizeof q), why);
	}
	/* The index a stream builds is held in memory until FINISH: bounded, so that a
	 * peer cannot grow it without end with tensors or tiny chunks. */
	if ((rc = index_grow(d, sizeof(struct io_tensor_entry) + strlen(t.name) + 1, "tensors")))
		return rc;
	struct io_tensor_desc desc = {
		.name = t.name, .kind = t.kind, .dtype = t.dtype, .policy = t.policy,
		.flags = t.flags, .ndim = t.ndim, .global_shape = t.global_shape,
		.offset = t.offset, .extent = t.extent, .raw_bytes = t.raw_bytes,
	};
	rc = io_shard_writer_add_tensor(d->w, &desc);
	return rc < 0 ? rc : 0;
}

static int data_unexpected(const struct dconn *d, size_t len)
{
	if (d->want_hashes)
		return ckpt_err(CKPT_EPROTO, "DATA of %zu bytes before the last chunk's HASHES", len);
	if (!d->want_data)
		return ckpt_err(CKPT_EPROTO, "DATA of %zu bytes where none was announced", len);
	return ckpt_err(CKPT_EPROTO, "DATA of %zu bytes where the CHUNK said %llu", len,
	                (unsigned long long)d->chunk.stored_len);
}

/* DATA goes into a pool buffer, taken before the bytes are read off the socket
 * (on_chunk saw that it fits one). Any other message is allocated by lib/net: the
 * connection's limit is a pool buffer, for DATA, so control messages are held to
 * their own bound here, before anything is allocated. */
static int data_into(void *arg, uint16_t type, size_t len, void **dst)
{
	struct dconn *d = arg;
	if (type != REMOTE_MSG_DATA) {
		if (len > REMOTE_MAX_CONTROL)
			return ckpt_err(CKPT_EPROTO, "%s message (type %u) of %zu bytes: control "
			                "messages are at most %u", remote_msg_name(type), type, len,
			                REMOTE_MAX_CONTROL);
		return 0;
	}
	if (!d->want_data || len != d->chunk.stored_len)
		return data_unexpected(d, len);
	uint64_t deadline = ckpt_deadline_ms(d->s->o.timeout_ms), t0 = ckpt_now_ns();
	int b;
	/* A small chunk takes a small buffer: one the size of the largest chunk would
	 * hold a stream of small tensors to a fraction of the pool. */
	while ((b = io_pool_get_fit(d->s->pool, len, 10)) < 0) {
		/* Our own finished writes give buffers back; others' connections do theirs. */
		io_shard_writer_ready(d->w);
		queue_refresh(d);
		if (ckpt_deadline_passed(deadline))
			return ckpt_err(-ETIMEDOUT, "no pool buffer free for %u ms (the disks are "
			                "stalled)", d->s->o.timeout_ms);
	}
	d->ns_buf += ckpt_now_ns() - t0;
	d->data_buf = b;
	*dst = io_pool_addr(d->s->pool, (unsigned)b);
	return 0;
}

/* The chunk d->chunk describes is in pool buffer b: to the writer (which owns b from
 * here on), within the job's quota. */
static int chunk_append(struct dconn *d, unsigned b, bool rdma)
{
	struct djob *j = d->job;
	uint64_t n = d->chunk.stored_len;
	atomic_fetch_add_explicit(&d->s->o.counters->bytes_received, n, memory_order_relaxed);
	if (rdma)
		atomic_fetch_add_explicit(&d->s->o.counters->bytes_received_rdma, n,
		                          memory_order_relaxed);
	atomic_fetch_add(&j->bytes_received, n);
	struct io_hashes h = { .block_bytes = d->chunk.block_bytes, .blocks = d->chunk.blocks,
	                       .tree = d->tree };
	memcpy(h.chunk, d->chunk.hash, CKPT_HASH_BYTES);
	int rc = 0;
	d->written += ckpt_align_up(d->chunk.stored_len, CKPT_ALIGN);
	if (d->quota && d->used_at_open + d->written > d->quota) {
		io_pool_put(d->s->pool, b);
		atomic_fetch_add_explicit(&d->s->o.counters->quota_refusals, 1, memory_order_relaxed);
		rc = ckpt_err(-EDQUOT, "job '%s': quota of %llu bytes exceeded while rank %u wrote "
		              "step %llu", j->id, (unsigned long long)d->quota, d->hello.rank,
		              (unsigned long long)d->step);
	} else {
		uint64_t t0 = ckpt_now_ns();
		rc = io_shard_writer_append(d->w, d->chunk.tensor, b, (size_t)d->chunk.raw_len,
		                            &(struct io_append){ .hashes = &h, .codec = d->chunk.codec,
		                                                 .stored_len = d->chunk.stored_len });
		d->ns_append += ckpt_now_ns() - t0;
		d->nchunks++;
		queue_refresh(d);
		/* The chunk is its writer's now (tests: a crash mid-stream, a slow disk). */
		if (!rc && (rc = ckpt_fault(CKPT_FP_CKPTD_AFTER_CHUNK)) > 0)
			rc = 0;
	}
	return rc;
}

/* A CHUNK naming a grant: its bytes are in the granted buffer already (the rank's
 * WRITE came before the CHUNK on the same queue pair). The grant must be one of
 * this stream's, not yet used; it is revoked before the buffer goes to the writer,
 * so nothing changes the bytes once the writer has them. (A WRITE that the NIC
 * took after the CHUNK and before this thread read it changes only the rank's own
 * bytes, which then fail their hash where they are loaded.) */
static int chunk_granted(struct dconn *d)
{
	uint32_t id = d->chunk.grant;
	if (!d->direct)
		return ckpt_err(CKPT_EPROTO, "CHUNK names grant %u, but this stream has no grants "
		                "(%s)", id, d->w ? "it did not ask for the direct path" :
		                "outside a shard stream");
	unsigned i = 0;
	while (i < d->ngrants && d->grants[i].id != id)
		i++;
	if (i == d->ngrants)
		return ckpt_err(CKPT_EPROTO, "CHUNK names grant %u, which is not outstanding on this "
		                "stream (never granted, or used already)", id);
	struct dgrant g = d->grants[i];
	d->grants[i] = d->grants[--d->ngrants];
	net_mr_deregister(g.mr);
	return chunk_append(d, g.buf, true);
}

static int on_chunk(struct dconn *d, struct net_msg *m)
{
	const char *owed = stream_owed(d);
	if (owed)
		return ckpt_err(CKPT_EPROTO, "CHUNK %s", owed);
	int rc = remote_chunk_decode(m->payload, m->len, d->after, &d->chunk);
	if (!rc)
		rc = index_grow(d, sizeof(struct io_chunk_entry) +
		                   (size_t)d->chunk.nblocks * CKPT_HASH_BYTES, "chunks");
	if (rc)
		return rc;
	size_t max = io_pool_buf_bytes(d->s->pool);
	if (d->chunk.stored_len > max)
		return ckpt_err(CKPT_EPROTO, "CHUNK of %llu bytes: a pool buffer holds %zu (the "
		                "chunks are larger than this ckptd takes)",
		                (unsigned long long)d->chunk.stored_len, max);
	if (d->chunk.grant)
		return chunk_granted(d);   /* the block hashes point into m, freed after */
	d->chunk_msg = *m;            /* the block hashes point into it */
	m->payload = NULL;
	d->want_data = true;
	return 0;
}

static int on_data(struct dconn *d, struct net_msg *m)
{
	/* An empty DATA asks data_into for no place, so it arrives here unchecked. */
	if (!d->want_data || d->data_buf < 0)
		return data_unexpected(d, m->len);
	m->payload = NULL;
	d->want_data = false;
	if (d->after) {   /* held in data_buf until its HASHES come */
		net_msg_free(&d->chunk_msg);
		d->want_hashes = true;
		return 0;
	}
	unsigned b = (unsigned)d->data_buf;
	d->data_buf = -1;
	int rc = chunk_append(d, b, false);   /* the block hashes point into the CHUNK */
	net_msg_free(&d->chunk_msg);
	d->chunk.blocks = NULL;
	return rc;
}

/* The hashes of the chunk whose bytes came last (a stream with REMOTE_OPEN_AFTER):
 * now it goes to the writer. */
static int on_hashes(struct dconn *d, const struct net_msg *m)
{
	if (!d->want_hashes)
		return ckpt_err(CKPT_EPROTO, "HASHES %s", !d->w ? "outside a shard stream" :
		                !d->after ? "on a stream that sends hashes in its CHUNKs" :
		                d->want_data ? "before the chunk's DATA" :
		                "where no chunk's bytes came before them");
	int rc = remote_hashes_decode(m->payload, m->len, d->chunk.nblocks, d->chunk.hash,
	                              &d->chunk.blocks);
	if (rc)
		return rc;
	unsigned b = (unsigned)d->data_buf;
	d->data_buf = -1;
	d->want_hashes = false;
	rc = chunk_append(d, b, false);   /* the writer copies the block hashes */
	d->chunk.blocks = NULL;
	return rc;
}

static int on_finish(struct dconn *d)
{
	const char *owed = stream_owed(d);
	if (owed)
		return ckpt_err(CKPT_EPROTO, "FINISH %s", owed);
	struct io_shard_result res;
	uint64_t t_fin = ckpt_now_ns();
	int rc = io_shard_writer_finish(d->w, &res);
	uint64_t t_end = ckpt_now_ns();
	d->w = NULL;
	stream_end(d, false);
	/* The attempt was given up while the shard streamed: its removal may have come
	 * before the file was created; the file goes now (its own name: no other
	 * attempt's), and the rank hears why, whatever else went wrong at the end (the
	 * decision is what it waits for then, and names the cause). */
	int gone = job_gone(d);
	if (gone) {
		rc = gone;
		if (unlink(d->path) == 0)
			ckpt_fsync_dir(d->dir);
	}
	/* Durable here, the rank not told yet (tests). */
	if (!rc && (rc = ckpt_fault(CKPT_FP_CKPTD_BEFORE_DURABLE)) > 0)
		rc = 0;
	if (rc) {
		io_index_free(res.index);
		ckpt_free(res.footer);
		return rc;
	}
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ckpt_buf_u64(&b, res.file_size);
	ckpt_buf_u64(&b, res.logical_bytes);
	ckpt_buf_u64(&b, res.stored_bytes);
	ckpt_buf_put(&b, res.footer_hash, CKPT_HASH_BYTES);
	ckpt_buf_put(&b, res.footer, res.footer_len);
	atomic_fetch_add_explicit(&d->s->o.counters->bytes_written, res.file_size,
	                          memory_order_relaxed);
	atomic_fetch_add_explicit(&d->s->o.counters->shards_written, 1, memory_order_relaxed);
	ckpt_log(CKPT_LOG_INFO, "job %s rank %u: step %llu durable, %llu bytes; the stream of "
	         "%llu chunk(s) %.3f s: waiting for pool buffers %.3f s, in the writer's "
	         "appends %.3f s, the rest receiving or waiting for the rank; finish %.3f s", d->job->id, d->hello.rank,
	         (unsigned long long)res.index->step, (unsigned long long)res.file_size,
	         (unsigned long long)d->nchunks, (double)(t_fin - d->t_open) / 1e9,
	         (double)d->ns_buf / 1e9, (double)d->ns_append / 1e9,
	         (double)(t_end - t_fin) / 1e9);
	io_index_free(res.index);
	ckpt_free(res.footer);
	rc = b.ok ? send_ok(d, REMOTE_MSG_DURABLE, b.p, b.len) : ckpt_err(-ENOMEM, "DURABLE");
	ckpt_buf_free(&b);
	if (!rc && (rc = ckpt_fault(CKPT_FP_CKPTD_AFTER_DURABLE)) > 0)
		rc = 0;
	return rc;
}

/* A shard path of the job's as a record names it: "step-<20 digits>/<shard file>". */
static int rel_check(const char *rel, const char *what)
{
	const char *slash = strchr(rel, '/');
	uint64_t step;
	uint32_t rank;
	uint64_t sid;
	char dir[64];
	size_t n = slash ? (size_t)(slash - rel) : 0;
	if (!slash || n >= sizeof dir)
		return ckpt_err(CKPT_EPROTO, "%s of '%.80s': not a shard path", what, rel);
	memcpy(dir, rel, n);
	dir[n] = '\0';
	if (!ckpt_path_parse_step_dir(dir, &step) || !ckpt_path_parse_shard(slash + 1, &rank, &sid))
		return ckpt_err(CKPT_EPROTO, "%s of '%.80s': not a shard path", what, rel);
	return 0;
}

static int on_read(struct dconn *d, const struct net_msg *m)
{
	char rel[REMOTE_MAX_PATH + 1], path[4400 + REMOTE_MAX_PATH];
	uint64_t off, len;
	int rc = remote_read_decode(m->payload, m->len, rel, sizeof rel, &off, &len);
	if (!rc)
		rc = rel_check(rel, "READ");
	if (rc)
		return rc;
	size_t max = io_pool_buf_bytes(d->s->pool);
	if (len > max || len > REMOTE_MAX_READ)
		return ckpt_err(-EINVAL, "READ of %llu bytes of %s (at most %zu)",
		                (unsigned long long)len, rel,
		                max < REMOTE_MAX_READ ? max : (size_t)REMOTE_MAX_READ);
	if (off > (uint64_t)INT64_MAX - len)
		return ckpt_err(-EINVAL, "READ of %llu bytes of %s at %llu: past the largest file "
		                "offset", (unsigned long long)len, rel, (unsigned long long)off);
	snprintf(path, sizeof path, "%s/%s", d->job->root, rel);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return ckpt_err(errno == ENOENT ? CKPT_ENOTFOUND : -errno, "job '%s': %s",
		                d->job->id, rel);
	int b = io_pool_get(d->s->pool, (int)d->s->o.timeout_ms);
	if (b < 0) {
		close(fd);
		return ckpt_err(-ETIMEDOUT, "READ: no pool buffer free");
	}
	uint8_t *p = io_pool_addr(d->s->pool, (unsigned)b);
	size_t done = 0;
	while (!rc && done < len) {
		ssize_t k = pread(fd, p + done, (size_t)len - done, (off_t)(off + done));
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			rc = ckpt_err(k < 0 ? -errno : CKPT_ECORRUPT, "job '%s': %s at %llu: %s",
			              d->job->id, rel, (unsigned long long)(off + done),
			              k < 0 ? strerror(errno) : "end of file (truncated?)");
		else
			done += (size_t)k;
	}
	close(fd);
	if (!rc) {
		atomic_fetch_add_explicit(&d->s->o.counters->bytes_read, len, memory_order_relaxed);
		rc = send_ok(d, REMOTE_MSG_DATA, p, (size_t)len);
	}
	io_pool_put(d->s->pool, (unsigned)b);
	return rc;
}

static int on_manifest(struct dconn *d)
{
	struct djob *j = d->job;
	pthread_mutex_lock(&j->lock);
	int rc = job_manifest(j, false);
	int fd = rc ? -1 : memfd_create("ckptd-manifest", MFD_CLOEXEC);
	if (!rc && fd < 0)
		rc = ckpt_err(-errno, "memfd");
	if (!rc)
		rc = manifest_copy_fd(j->manifest, fd);
	pthread_mutex_unlock(&j->lock);
	off_t size = rc ? 0 : lseek(fd, 0, SEEK_END);
	if (!rc && (size <= 0 || (uint64_t)size > REMOTE_MAX_MANIFEST))
		rc = ckpt_err(-EFBIG, "job '%s': manifest copy of %lld bytes", j->id, (long long)size);
	void *p = rc ? MAP_FAILED : mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (!rc && p == MAP_FAILED)
		rc = ckpt_err(-errno, "map the manifest copy");
	if (!rc)
		rc = send_ok(d, REMOTE_MSG_MANIFEST_OK, p, (size_t)size);
	if (p != MAP_FAILED)
		munmap(p, (size_t)size);
	if (fd >= 0)
		close(fd);
	return rc;
}

static int on_check(struct dconn *d, const struct net_msg *m)
{
	struct remote_check k;
	int rc = remote_check_decode(m->payload, m->len, &k);
	if (!rc)
		rc = rel_check(k.path, "CHECK");
	if (rc)
		return rc;
	char path[4400 + REMOTE_MAX_PATH];
	snprintf(path, sizeof path, "%s/%s", d->job->root, k.path);
	if ((rc = io_shard_trailer_check(path, k.file_size, k.footer_off, k.footer_len, k.hash)))
		return rc;
	return send_ok(d, REMOTE_MSG_CHECK_OK, NULL, 0);
}

static int on_remove(struct dconn *d, const struct net_msg *m)
{
	uint64_t step, save_id;
	int rc = remote_remove_decode(m->payload, m->len, &step, &save_id);
	uint32_t removed = 0;
	if (!rc)
		rc = job_remove_attempt(d->job, step, save_id, &removed);
	if (rc)
		return rc;
	if (removed)
		ckpt_log(CKPT_LOG_INFO, "step %llu: %u shard file(s) of attempt %016llx removed",
		         (unsigned long long)step, removed, (unsigned long long)save_id);
	return send_ok(d, REMOTE_MSG_REMOVE_OK, NULL, 0);
}

static int dispatch(struct dconn *d, struct net_msg *m)
{
	if (m->len && (m->type == REMOTE_MSG_FINISH || m->type == REMOTE_MSG_ABORT ||
	               m->type == REMOTE_MSG_MANIFEST))
		return ckpt_err(CKPT_EPROTO, "%s message of %zu bytes: it has none",
		                remote_msg_name(m->type), m->len);
	switch (m->type) {
	case REMOTE_MSG_COORD:    return on_coord(d, m);
	case REMOTE_MSG_OPEN:     return on_open(d, m);
	case REMOTE_MSG_TENSOR:   return on_tensor(d, m);
	case REMOTE_MSG_CHUNK:    return on_chunk(d, m);
	case REMOTE_MSG_DATA:     return on_data(d, m);
	case REMOTE_MSG_HASHES:   return on_hashes(d, m);
	case REMOTE_MSG_FINISH:   return on_finish(d);
	case REMOTE_MSG_ABORT:    stream_end(d, true); return 0;
	case REMOTE_MSG_READ:     return on_read(d, m);
	case REMOTE_MSG_MANIFEST: return on_manifest(d);
	case REMOTE_MSG_CHECK:    return on_check(d, m);
	case REMOTE_MSG_REMOVE:   return on_remove(d, m);
	default:
		return ckpt_err(CKPT_EPROTO, "unexpected message type %u", m->type);
	}
}

/* ------------------------------------------------------------------ connections */

static int find_job(void *arg, const char *job, size_t len, uint32_t world, struct net_auth *a,
                    char *why)
{
	struct dconn *d = arg;
	struct ckptd_job *found = &d->auth;
	int rc = ckptd_jobs_get(d->s->o.jobs, job, len, found);
	if (rc) {
		snprintf(why, NET_JOB_WHY_MAX, "not registered with this ckptd");
		return CKPT_EPEER;
	}
	a->job_id = found->id;
	a->world = world;
	a->secret = found->secret;
	a->secret_len = found->secret_len;
	return 0;
}

/* This thread's error to the peer: where the job's files lie on this node is the
 * node's business, so the data directory is named "<data>" (the log has it whole). */
static void send_error(struct dconn *d, int rc)
{
	char msg[1200];
	const char *m = ckpt_err_msg(), *data = d->s->data;
	size_t dl = strlen(data), o = 0;
	while (*m && o + 8 < sizeof msg) {
		if (dl && !strncmp(m, data, dl)) {
			o += (size_t)snprintf(msg + o, sizeof msg - o, "<data>");
			m += dl;
		} else {
			msg[o++] = *m++;
		}
	}
	msg[o < sizeof msg ? o : sizeof msg - 1] = '\0';
	/* Every ERROR ends the connection, and a stream with it: its file goes before the
	 * rank hears of it, so that a rank trying again at once (the same attempt, the
	 * same file name) does not find the old file still there. */
	if (d->w)
		stream_end(d, true);
	remote_send_error(d->net, rc, msg, 1000);
	d->sent_error = true;
}

/* ------------------------------------------------------------------ handshakes
 * A connection holds one of the max_conns threads from its accept, before it has
 * proved anything: a peer that opens connections and sends nothing would hold them
 * all, and the jobs' ranks would wait in the backlog. So a handshake has its own
 * deadline (handshake_ms, far shorter than the streams' timeout: a rank's takes
 * milliseconds), and one address may have at most max_handshakes connections in
 * theirs at once: one more is closed as it comes, and the client connects again
 * (remote_connect). Over rdma the peer's address is not known here: no bound. */

/* The peer's numeric address into addr ("" where none). */
static void peer_addr(struct net_conn *c, char addr[INET6_ADDRSTRLEN])
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	addr[0] = '\0';
	int fd = net_conn_fd(c);
	if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &len) < 0 ||
	    (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) ||
	    getnameinfo((struct sockaddr *)&ss, len, addr, INET6_ADDRSTRLEN, NULL, 0,
	                NI_NUMERICHOST))
		addr[0] = '\0';
}

/* Count a new connection from addr in its handshake: false (nothing counted) where
 * addr has max_handshakes already. Under s->lock. */
static bool pending_take(struct ckptd_server *s, const char *addr)
{
	if (!addr[0])
		return true;
	unsigned i = 0;
	while (i < s->npending && strcmp(s->pending[i].addr, addr))
		i++;
	if (i < s->npending && s->pending[i].n >= s->o.max_handshakes)
		return false;
	if (i == s->npending) {
		if (s->npending == s->o.max_conns)
			return false;       /* not reached: one entry per connection at most */
		snprintf(s->pending[i].addr, sizeof s->pending[i].addr, "%s", addr);
		s->pending[i].n = 0;
		s->npending++;
	}
	s->pending[i].n++;
	return true;
}

/* A handshake from addr is over, either way; addr is cleared. */
static void pending_drop(struct ckptd_server *s, char *addr)
{
	if (!addr[0])
		return;
	pthread_mutex_lock(&s->lock);
	for (unsigned i = 0; i < s->npending; i++) {
		if (strcmp(s->pending[i].addr, addr))
			continue;
		if (--s->pending[i].n == 0)
			s->pending[i] = s->pending[--s->npending];
		break;
	}
	pthread_mutex_unlock(&s->lock);
	addr[0] = '\0';
}

static void *conn_main(void *arg)
{
	struct dconn *d = arg;
	struct ckptd_server *s = d->s;
	struct ckptd_counters *k = s->o.counters;
	atomic_fetch_add_explicit(&k->active_connections, 1, memory_order_relaxed);
	int rc = net_handshake_server_find(d->net, find_job, d, NULL, NULL, &d->hello,
	                                   (int)s->o.handshake_ms);
	explicit_bzero(&d->auth, sizeof d->auth);
	pending_drop(s, d->addr);
	if (!rc)
		rc = job_find(s, d->hello.job_id, &d->job);
	if (rc) {
		atomic_fetch_add_explicit(&k->rejected, 1, memory_order_relaxed);
		ckpt_log(CKPT_LOG_WARN, "%s: refused: %s", net_conn_name(d->net), ckpt_err_msg());
	}
	if (!rc) {
		d->sink = (struct ckpt_log_sink){ .fn = s->o.log_fn, .level = s->o.log_level,
		                                  .job_id = d->job->id, .rank = (int)d->hello.rank };
		ckpt_log_enter(&d->sink, CKPT_LOG_NO_STEP);
	}
	size_t buf = io_pool_buf_bytes(s->pool);
	net_conn_set_max_msg(d->net, buf > REMOTE_MAX_CONTROL ? buf : REMOTE_MAX_CONTROL);
	uint64_t idle_since = ckpt_now_ns();
	while (!rc) {
		if (atomic_load(&s->stop) && (!d->w || ckpt_deadline_passed(s->stop_deadline)))
			break;
		/* A direct stream's grants, topped up before each wait. With none out and
		 * the pool empty the rank cannot send: look again soon (its own finished
		 * writes give buffers back only here), and give up after the timeout, as
		 * data_into does. */
		int poll_ms = SRV_POLL_MS;
		if (d->direct && d->w) {
			if ((rc = grants_top_up(d))) {
				ckpt_log(CKPT_LOG_WARN, "job %s rank %u: %s", d->job->id, d->hello.rank,
				         ckpt_err_msg());
				send_error(d, rc);
				break;
			}
			if (!d->ngrants) {
				io_shard_writer_ready(d->w);
				queue_refresh(d);
				poll_ms = 10;
				idle_since = ckpt_now_ns();   /* the rank waits for us, not we for it */
				if (ckpt_now_ns() - d->starved_since >
				    (uint64_t)s->o.timeout_ms * 1000000u) {
					rc = ckpt_err(-ETIMEDOUT, "no pool buffer free to grant for %u ms (the "
					              "disks are stalled)", s->o.timeout_ms);
					ckpt_log(CKPT_LOG_WARN, "job %s rank %u: %s", d->job->id,
					         d->hello.rank, ckpt_err_msg());
					send_error(d, rc);
					break;
				}
			}
		}
		struct net_msg m;
		rc = net_recv_into(d->net, &m, data_into, d, poll_ms);
		if (rc == -ETIMEDOUT) {
			/* A stream that stalls longer than the timeout is given up. One that
			 * waits for its rank gives its finished writes' buffers back to the pool
			 * (they return only inside its own calls). */
			rc = 0;
			if (d->w) {
				io_shard_writer_ready(d->w);
				queue_refresh(d);
			}
			if (!d->w && ckpt_now_ns() - idle_since > (uint64_t)s->o.idle_ms * 1000000u) {
				/* An idle connection holds a thread: the rank connects again when it
				 * next needs one. */
				ckpt_log(CKPT_LOG_INFO, "closed: idle for %u ms (--idle-ms)", s->o.idle_ms);
				break;
			}
			if (d->w && ckpt_now_ns() - idle_since > (uint64_t)s->o.timeout_ms * 1000000u) {
				rc = ckpt_err(-ETIMEDOUT, "shard stream idle for %u ms", s->o.timeout_ms);
				ckpt_log(CKPT_LOG_WARN, "job %s rank %u: %s", d->job->id, d->hello.rank,
				         ckpt_err_msg());
				send_error(d, rc);
			}
			if (!rc)
				continue;
		}
		if (rc)
			break;
		idle_since = ckpt_now_ns();
		rc = dispatch(d, &m);
		if (!m.borrowed)
			net_msg_free(&m);
		if (rc) {
			atomic_fetch_add_explicit(&k->rejected, 1, memory_order_relaxed);
			ckpt_log(CKPT_LOG_WARN, "job %s rank %u: %s", d->job->id, d->hello.rank,
			         ckpt_err_msg());
			send_error(d, rc);
		}
	}
	/* A DATA cut short (the peer gone, an idle stream, a stop) gives its buffer back. */
	if (d->data_buf >= 0)
		io_pool_put(s->pool, (unsigned)d->data_buf);
	d->data_buf = -1;
	if (d->job && (rc != -ECONNRESET || d->w))
		ckpt_log(d->w ? CKPT_LOG_WARN : CKPT_LOG_DEBUG, "job %s rank %u: connection ends%s",
		         d->job->id, d->hello.rank, d->w ? " inside a shard stream" : "");
	if (d->job)
		stream_end(d, true);
	/* After an ERROR the peer may still be sending (a stream's chunks): closing with
	 * its bytes unread would reset the connection and lose the ERROR before the peer
	 * read it. Over tcp: end our side, and read what comes until the peer closes (a
	 * few seconds at most, into a small scratch buffer). */
	if (d->sent_error && s->o.transport == NET_TCP) {
		int fd = net_conn_fd(d->net);
		shutdown(fd, SHUT_WR);
		uint64_t deadline = ckpt_deadline_ms(2000);
		char scratch[16384];
		while (!ckpt_deadline_passed(deadline)) {
			struct pollfd pf = { .fd = fd, .events = POLLIN };
			if (poll(&pf, 1, 100) < 0 && errno != EINTR)
				break;
			ssize_t n = pf.revents ? recv(fd, scratch, sizeof scratch, MSG_DONTWAIT) : -1;
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR && pf.revents))
				break;
		}
	}
	engine_put(s, d->engine);
	net_close(d->net);
	atomic_fetch_sub_explicit(&k->active_connections, 1, memory_order_relaxed);
	pthread_mutex_lock(&s->lock);
	s->nconns--;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	ckpt_free(d);
	return NULL;
}

/* ------------------------------------------------------------------ the janitor
 * The coordinator gives an attempt up, or retention removes a committed step: the
 * files go, here and on the job's other instances (REMOVE), in the order that never
 * leaves a visible step without its files (lib/retention.c's order). Best effort: an
 * instance that cannot be reached keeps the files of an attempt that did not commit
 * until a later attempt of the same step and rank replaces them. */

/* Remove attempt save_id of step everywhere the job's shards are. */
static void janitor_remove(struct djob *j, uint64_t step, uint64_t save_id)
{
	uint32_t removed;
	if (job_remove_attempt(j, step, save_id, &removed))
		ckpt_log(CKPT_LOG_WARN, "step %llu: %s", (unsigned long long)step, ckpt_err_msg());
	pthread_mutex_lock(&j->lock);
	unsigned n = j->ninst;
	uint32_t world = j->coord_world;
	struct remote_instance *in = ckpt_malloc((n ? n : 1) * sizeof *in);
	if (in)
		memcpy(in, j->inst, n * sizeof *in);
	struct ckptd_job auth = j->auth;
	pthread_mutex_unlock(&j->lock);
	for (unsigned i = 1; in && i < n; i++) {
		struct remote_auth a = { .job_id = j->id, .rank = 0, .world = world ? world : 1,
		                         .secret = auth.secret, .secret_len = auth.secret_len,
		                         .transport = j->transport, .timeout_ms = 10000 };
		struct remote_conn *c;
		int rc = remote_connect(&in[i], &a, &c);
		if (!rc)
			rc = remote_remove(c, step, save_id);
		remote_close(c);
		if (rc)
			ckpt_log(CKPT_LOG_WARN, "step %llu: the files of attempt %016llx on %s:%u stay: %s",
			         (unsigned long long)step, (unsigned long long)save_id, in[i].host,
			         in[i].port, ckpt_err_msg());
	}
	explicit_bzero(&auth, sizeof auth);
	ckpt_free(in);
}

/* Committed steps the job's rules no longer keep: invisible first (still naming
 * their files), then the files, then the record. */
static void janitor_retain(struct djob *j)
{
	struct remote_keep k = j->keep;
	if (!k.last && !k.every && !k.seconds)
		return;
	int n = manifest_steps_list(j->manifest, false, NULL, 0);
	uint64_t *steps = n > 0 ? ckpt_malloc((size_t)n * sizeof *steps) : NULL;
	int got = steps ? manifest_steps_list(j->manifest, false, steps, (size_t)n) : 0;
	if (got > n)
		got = n;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	for (int i = 0; i < got; i++) {
		struct manifest_step rec;
		if (manifest_step_get(j->manifest, steps[i], &rec) || rec.state != CKPT_STATE_COMMITTED)
			continue;
		struct commit_keep ck = { k.last, k.every, k.seconds };
		if (commit_keep_step(&ck, steps[i], steps[got - 1], (uint64_t)(got - 1 - i),
		                     rec.commit_time_ns, now))
			continue;
		manifest_attempts_lock(j->manifest);
		int rc = manifest_step_retire(j->manifest, steps[i], "removed by retention");
		manifest_attempts_unlock(j->manifest);
		if (rc) {
			ckpt_log(CKPT_LOG_WARN, "retention: step %llu kept: %s",
			         (unsigned long long)steps[i], ckpt_err_msg());
			continue;
		}
		janitor_remove(j, steps[i], rec.save_id);
		manifest_step_delete(j->manifest, steps[i]);
		ckpt_log(CKPT_LOG_INFO, "retention: step %llu removed", (unsigned long long)steps[i]);
	}
	ckpt_free(steps);
}

/* Attempts that cannot commit any more: ABORTED ones, and INFLIGHT ones of an
 * earlier coordinator (this process's coordinator has begun nothing yet when this
 * is queued: it runs before the job's first BEGIN is answered... or races it, which
 * the record's save id settles: an attempt begun since is not the one listed). */
static void janitor_gc(struct djob *j, uint64_t incarnation)
{
	int n = manifest_steps_list(j->manifest, true, NULL, 0);
	uint64_t *steps = n > 0 ? ckpt_malloc((size_t)n * sizeof *steps) : NULL;
	int got = steps ? manifest_steps_list(j->manifest, true, steps, (size_t)n) : 0;
	for (int i = 0; i < got && i < n; i++) {
		struct manifest_step rec;
		if (manifest_step_get(j->manifest, steps[i], &rec) ||
		    rec.state == CKPT_STATE_COMMITTED ||
		    (rec.state == CKPT_STATE_INFLIGHT && rec.incarnation == incarnation))
			continue;
		manifest_attempts_lock(j->manifest);
		struct manifest_step cur;
		bool same = !manifest_step_get(j->manifest, steps[i], &cur) &&
		            cur.save_id == rec.save_id && cur.state == rec.state;
		if (same && rec.state == CKPT_STATE_INFLIGHT)
			commit_decide(j->manifest, &rec, &(struct commit_decision){ .abort = true,
			              .why = "presumed aborted: the coordinator that began it is gone" });
		manifest_attempts_unlock(j->manifest);
		if (same && rec.save_id)
			janitor_remove(j, steps[i], rec.save_id);
	}
	ckpt_free(steps);
}

static void *janitor_main(void *arg)
{
	struct ckptd_server *s = arg;
	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (!s->chores && !atomic_load(&s->stop))
			pthread_cond_wait(&s->cond, &s->lock);
		struct chore *c = s->chores;
		if (!c)
			break;
		s->chores = c->next;
		pthread_mutex_unlock(&s->lock);
		struct djob *j = c->job;
		CKPT_LOG_SCOPE(&j->sink, c->step);
		struct manifest_step rec;
		switch (c->kind) {
		case CHORE_ABORTED:
			if (!manifest_step_get(j->manifest, c->step, &rec) &&
			    rec.state == CKPT_STATE_ABORTED && rec.save_id)
				janitor_remove(j, c->step, rec.save_id);
			break;
		case CHORE_COMMITTED:
			janitor_retain(j);
			break;
		case CHORE_GC:
			janitor_gc(j, j->incarnation);
			break;
		}
		ckpt_free(c);
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ------------------------------------------------------------------ the server */

/* The pool: buffers of the chunk size, and classes of a half, a quarter, ... of it
 * for the chunks that are shorter (io_pool_create_halving says why). */
static int pool_create(const struct ckptd_server_opts *o, struct io_pool **out)
{
	int rc = io_pool_create_halving(o->buf_bytes, o->pool_bytes, NULL, out);
	if (rc)
		return ckpt_err_prefix(rc, "--pool %zu with --chunk-max %zu", o->pool_bytes,
		                       o->buf_bytes);
	struct io_pool_class big, small, least;
	unsigned n = io_pool_nclasses(*out);
	if (n > 1 && !io_pool_class_info(*out, 0, &big, NULL) &&
	    !io_pool_class_info(*out, 1, &small, NULL) &&
	    !io_pool_class_info(*out, n - 1, &least, NULL))
		ckpt_log(CKPT_LOG_INFO, "pool: %u buffers of %zu KiB, and %u each of %zu down to %zu "
		         "KiB for shorter chunks", big.count, big.bytes >> 10, small.count,
		         small.bytes >> 10, least.bytes >> 10);
	return 0;
}

int ckptd_server_start(const struct ckptd_server_opts *o, struct ckptd_server **out)
{
	*out = NULL;
	struct ckptd_server *s = ckpt_calloc(1, sizeof *s);
	if (!s)
		return ckpt_err(-ENOMEM, "server");
	s->o = *o;
	if (!s->o.idle_ms)
		s->o.idle_ms = 600000;
	if (!s->o.max_index)
		s->o.max_index = 64u << 20;
	if (!s->o.handshake_ms)
		s->o.handshake_ms = 10000;
	if (!s->o.max_handshakes)
		s->o.max_handshakes = 16;
	s->lock_fd = -1;
	s->wake[0] = s->wake[1] = -1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	int rc = 0;
	char p[4200];
	if (!(s->data = realpath(o->data, NULL)))
		rc = ckpt_err(-errno, "data directory %s", o->data);
	struct stat st;
	if (!rc && (stat(s->data, &st) < 0 || !S_ISDIR(st.st_mode)))
		rc = ckpt_err(-ENOTDIR, "data directory %s: not a directory", s->data);
	if (!rc && (st.st_mode & 077))
		ckpt_log(CKPT_LOG_WARN, "data directory %s is open to group or others (mode %04o): "
		         "make it 0700", s->data, (unsigned)(st.st_mode & 07777));
	if (!rc) {
		snprintf(p, sizeof p, "%s/%s", s->data, SRV_LOCK_FILE);
		s->lock_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (s->lock_fd < 0)
			rc = ckpt_err(-errno, "lock file %s", p);
		else if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0)
			rc = ckpt_err(-EBUSY, "%s: another ckptd serves this data directory", s->data);
	}
	if (!rc) {
		snprintf(p, sizeof p, "%s/jobs", s->data);
		if (mkdir(p, 0700) < 0 && errno != EEXIST)
			rc = ckpt_err(-errno, "create %s", p);
	}
	unsigned nbufs = (unsigned)(o->pool_bytes / o->buf_bytes);
	if (!rc && nbufs < 2)
		rc = ckpt_err(-EINVAL, "pool of %zu bytes holds fewer than two buffers of %zu",
		              o->pool_bytes, o->buf_bytes);
	if (!rc)
		rc = pool_create(o, &s->pool);
	/* Without room for idle engines each connection makes its own (engine_put). */
	if (!rc)
		s->idle_engines = ckpt_calloc(SRV_IDLE_ENGINES, sizeof *s->idle_engines);
	if (!rc && !(s->pending = ckpt_calloc(s->o.max_conns, sizeof *s->pending)))
		rc = ckpt_err(-ENOMEM, "table of %u connections", s->o.max_conns);
	if (!rc && pipe2(s->wake, O_NONBLOCK | O_CLOEXEC) < 0)
		rc = ckpt_err(-errno, "wake pipe");
	if (!rc && (rc = net_listen(o->transport, NULL, o->listen_host, o->listen_port, &s->lis)))
		ckpt_err_prefix(rc, "listen on %s:%u", o->listen_host, o->listen_port);
	if (!rc) {
		if ((rc = ckpt_thread_create(&s->janitor, NULL, janitor_main, s)))
			rc = ckpt_err(-rc, "janitor thread");
		else
			s->janitor_started = true;
	}
	if (rc) {
		ckptd_server_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

unsigned ckptd_server_port(const struct ckptd_server *s) { return net_listener_port(s->lis); }

int ckptd_server_run(struct ckptd_server *s)
{
	while (!atomic_load(&s->stop)) {
		struct pollfd pf[2] = { { .fd = net_listener_fd(s->lis), .events = POLLIN },
		                        { .fd = s->wake[0], .events = POLLIN } };
		if (poll(pf, 2, 1000) < 0 && errno != EINTR)
			return ckpt_err(-errno, "poll");
		if (!(pf[0].revents & POLLIN))
			continue;
		pthread_mutex_lock(&s->lock);
		while (s->nconns >= s->o.max_conns && !atomic_load(&s->stop))
			pthread_cond_wait(&s->cond, &s->lock);
		pthread_mutex_unlock(&s->lock);
		struct net_conn *c;
		if (net_accept(s->lis, 0, &c))
			continue;
		atomic_fetch_add_explicit(&s->o.counters->connections, 1, memory_order_relaxed);
		char addr[INET6_ADDRSTRLEN];
		peer_addr(c, addr);
		pthread_mutex_lock(&s->lock);
		bool room = pending_take(s, addr);
		uint64_t now = ckpt_now_ns(), last = s->refused_logged;
		if (!room && now - last >= 1000000000u)
			s->refused_logged = now;
		pthread_mutex_unlock(&s->lock);
		if (!room) {
			atomic_fetch_add_explicit(&s->o.counters->rejected, 1, memory_order_relaxed);
			if (now - last >= 1000000000u)   /* a line a second at most */
				ckpt_log(CKPT_LOG_WARN, "%s: closed: %u connections from %s are in their "
				         "handshake already (--max-handshakes)", net_conn_name(c),
				         s->o.max_handshakes, addr);
			net_close(c);
			continue;
		}
		struct dconn *d = ckpt_calloc(1, sizeof *d);
		pthread_t t;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (d) {
			d->s = s;
			d->net = c;
			d->data_buf = -1;
			memcpy(d->addr, addr, sizeof d->addr);
			pthread_mutex_lock(&s->lock);
			s->nconns++;
			pthread_mutex_unlock(&s->lock);
		}
		if (!d || ckpt_thread_create(&t, &at, conn_main, d)) {
			ckpt_log(CKPT_LOG_WARN, "%s: no thread for it", net_conn_name(c));
			net_close(c);
			pending_drop(s, addr);
			if (d) {
				pthread_mutex_lock(&s->lock);
				s->nconns--;
				pthread_mutex_unlock(&s->lock);
			}
			ckpt_free(d);
		}
		pthread_attr_destroy(&at);
	}
	return 0;
}

void ckptd_server_stop(struct ckptd_server *s, unsigned grace_ms)
{
	s->stop_deadline = ckpt_deadline_ms(grace_ms);
	atomic_store(&s->stop, true);
	if (s->wake[1] >= 0) {
		char b = 1;
		ssize_t n = write(s->wake[1], &b, 1);
		CKPT_UNUSED(n);
	}
	pthread_mutex_lock(&s->lock);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

void ckptd_server_free(struct ckptd_server *s)
{
	if (!s)
		return;
	net_listener_close(s->lis);
	pthread_mutex_lock(&s->lock);
	while (s->nconns)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	/* The coordinators first (they queue chores), then the janitor, which finishes
	 * what is queued. */
	for (struct djob *j = s->jobs; j; j = j->next) {
		commit_coord_stop(j->coord);
		j->coord = NULL;
	}
	if (s->janitor_started) {
		atomic_store(&s->stop, true);
		pthread_mutex_lock(&s->lock);
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
		pthread_join(s->janitor, NULL);
	}
	/* Chores queued after the janitor stopped: the next start's collection does them. */
	for (struct chore *c = s->chores, *next; c; c = next) {
		next = c->next;
		ckpt_free(c);
	}
	for (struct djob *j = s->jobs, *next; j; j = next) {
		next = j->next;
		manifest_close(j->manifest);
		explicit_bzero(&j->auth, sizeof j->auth);
		pthread_mutex_destroy(&j->lock);
		pthread_cond_destroy(&j->stream_gone);
		ckpt_free(j);
	}
	for (unsigned i = 0; i < s->nidle_engines; i++)
		io_engine_destroy(s->idle_engines[i]);
	ckpt_free(s->idle_engines);
	ckpt_free(s->pending);
	io_pool_destroy(s->pool);
	if (s->wake[0] >= 0) {
		close(s->wake[0]);
		close(s->wake[1]);
	}
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	free(s->data);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	ckpt_free(s);
}

void ckptd_server_gauges(void *arg, struct ckptd_gauges *out)
{
	struct ckptd_server *s = arg;
	out->pool_bytes = io_pool_bytes(s->pool);
	out->pool_used_bytes = io_pool_bytes_out(s->pool);
	out->jobs = ckptd_jobs_count(s->o.jobs);
}

void ckptd_server_jobs(void *arg, void (*emit)(void *emit_arg, const struct ckptd_job_usage *u),
                       void *emit_arg)
{
	struct ckptd_server *s = arg;
	pthread_mutex_lock(&s->lock);
	for (struct djob *j = s->jobs; j; j = j->next) {
		struct ckptd_job auth;
		uint64_t quota = 0;
		if (!ckptd_jobs_get(s->o.jobs, j->id, strlen(j->id), &auth)) {
			quota = auth.quota_bytes;
			explicit_bzero(auth.secret, sizeof auth.secret);
		}
		struct ckptd_job_usage u = {
			.job = j->id, .used_bytes = du(j->root, 0, NULL, 0), .quota_bytes = quota,
			.bytes_received = atomic_load(&j->bytes_received),
			.saves_committed = atomic_load(&j->committed),
			.saves_aborted = atomic_load(&j->aborted),
		};
		emit(emit_arg, &u);
	}
	pthread_mutex_unlock(&s->lock);
}
