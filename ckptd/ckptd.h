/*
 * ckptd.h — the parts of ckptd, the snapshot service of storage nodes
 * (docs/ckptd.md). ckptd is built on libckpt's own modules (lib/io, lib/manifest,
 * lib/net, lib/commit): it is not a second implementation of the format or the
 * protocol, only a server around them.
 *
 *   main.c     options, signals (SIGHUP: reload the jobs; SIGTERM/SIGINT: stop),
 *              systemd readiness, the listener
 *   server.c   connections: the handshake against the jobs table, the shard stream
 *              into io_uring writes, restores, the per-job coordinator
 *   jobs.c     the jobs file: which job ids may use this ckptd, their secrets, quotas
 *   metrics.c  counters, and the Prometheus text endpoint (libmicrohttpd)
 *   notify.c   sd_notify (libsystemd): READY, STATUS, STOPPING
 */
#ifndef CKPTD_H
#define CKPTD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"
#include "net/net.h"

#define CKPTD_MAX_SECRET 4096u
#define CKPTD_MIN_SECRET 16u     /* shorter ones are warned about, as a rank does */
#define CKPTD_MAX_JOB_ID 128u           /* characters of a job id */
#define CKPTD_MAX_JOBS   4096u          /* jobs of one jobs file */

/* ------------------------------------------------------------------ jobs (jobs.c)
 * The jobs file: one job per line, "JOB_ID key=value ...", fields separated by
 * spaces or tabs; a field that starts with '#' starts a comment that runs to the end
 * of the line (so a line whose first field does is a comment); blank lines are
 * ignored. Keys: secret-file=PATH (a file holding the job's secret, as
 * CKPT_JOB_SECRET_FILE: a regular file of ckptd's user that nobody else may read or
 * write, its trailing newline dropped; a relative PATH is taken from the jobs file's
 * directory), secret=TEXT (the secret inline, without spaces or tabs; then the jobs
 * file itself must be such a file), quota=SIZE (bytes the job may hold on this
 * ckptd, at least 1, with K/M/G/T suffixes (powers of 1024); absent: no quota).
 * Exactly one of secret-file and secret, each key at most once. A job id is 1 to
 * CKPTD_MAX_JOB_ID characters of [A-Za-z0-9._-], not "." or "..": it names the job's
 * directory under --data. Ids are unique. Whoever may write the jobs file may add a
 * job, so the file must be writable by its owner alone, and its owner ckptd's user
 * or root. Control characters, lines over 16 KiB, files over 4 MiB and more than
 * CKPTD_MAX_JOBS jobs are refused. Every problem is refused with a message naming
 * file and line (ckpt_err_msg).
 * Threads: every function may be called from any thread, except that free is
 * called once no other call is running. */
struct ckptd_job {
	char     id[CKPTD_MAX_JOB_ID + 1];  /* NUL-terminated */
	uint8_t  secret[CKPTD_MAX_SECRET];
	size_t   secret_len;
	uint64_t quota_bytes;           /* 0: none */
};
struct ckptd_jobs;
/* Read path into a new table; *out is NULL on failure. The errors: those of open
 * and read for the jobs file or a secret file (-ENOENT, -EACCES, ...), CKPT_EFORMAT
 * (a bad line: file:line and why; or not a regular file, or too large), -EPERM (a
 * secret that others may read, or a jobs file that others may write), -EAGAIN (the
 * file changed while it was read), -ENOMEM. */
int  ckptd_jobs_load(const char *path, struct ckptd_jobs **out);
/* Read the same file again and swap the table in only if it reads whole; on an error
 * the table in use is kept and the error returned (logged by the caller): those of
 * ckptd_jobs_load. Lookups running meanwhile see the old table or the new one. */
int  ckptd_jobs_reload(struct ckptd_jobs *j);
/* Copy job id (id_len bytes, not NUL-terminated: a peer's bytes) into *out: 0, or
 * CKPT_ENOTFOUND. Thread-safe against reload. The copy holds the secret: the caller
 * wipes it (explicit_bzero) when done. */
int  ckptd_jobs_get(struct ckptd_jobs *j, const char *id, size_t id_len, struct ckptd_job *out);
unsigned ckptd_jobs_count(struct ckptd_jobs *j);
/* The ids of the jobs, for metrics: calls fn once per job, in the order of their ids
 * (bytewise), under the table's lock: fn must not call reload (it would wait for
 * itself). job is valid during the call only. */
void ckptd_jobs_each(struct ckptd_jobs *j, void (*fn)(void *arg, const struct ckptd_job *job),
                     void *arg);
void ckptd_jobs_free(struct ckptd_jobs *j);      /* NULL: no-op; wipes the secrets */

/* ------------------------------------------------------------------ metrics (metrics.c)
 * Process-wide counters, updated with relaxed atomics from any thread, and per-job
 * usage. Rendered as Prometheus text exposition format 0.0.4 by an HTTP server
 * (libmicrohttpd, its own thread) on GET /metrics; another method is 405, anything
 * else 404. */
struct ckptd_counters {
	_Atomic uint64_t bytes_received;     /* chunk bytes received from ranks */
	_Atomic uint64_t bytes_received_rdma;/* of them, RDMA-written into granted buffers */
	_Atomic uint64_t bytes_written;      /* shard bytes made durable */
	_Atomic uint64_t bytes_read;         /* bytes served to restores */
	_Atomic uint64_t shards_written;     /* shard files made durable */
	_Atomic uint64_t saves_committed;    /* steps committed by this ckptd's coordinators */
	_Atomic uint64_t saves_aborted;
	_Atomic uint64_t connections;        /* accepted since start */
	_Atomic uint64_t rejected;           /* handshakes or requests refused */
	_Atomic uint64_t quota_refusals;
	_Atomic int64_t  queue_depth;        /* chunks received and not yet written */
	_Atomic int64_t  active_connections;
};
/* Gauges read at render time. */
struct ckptd_gauges {
	uint64_t pool_bytes, pool_used_bytes;
	unsigned jobs;
};
/* Per-job figures at render time: fn is called once per job (labels job="<id>"). */
struct ckptd_job_usage {
	const char *job;                     /* the id; valid during the call */
	uint64_t used_bytes, quota_bytes;    /* quota 0: none */
	uint64_t bytes_received;
	uint64_t saves_committed, saves_aborted;
};
struct ckptd_metrics_source {
	struct ckptd_counters *counters;
	void (*gauges)(void *arg, struct ckptd_gauges *out);
	/* Calls emit(emit_arg, &u) once per job. */
	void (*jobs)(void *arg, void (*emit)(void *emit_arg, const struct ckptd_job_usage *u),
	             void *emit_arg);
	void *arg;
};
/* The whole exposition into b (ckpt_buf): # HELP / # TYPE lines, ckptd_* names; the
 * per-job families (ckptd_job_*, label job="<id>") only where src->jobs emits jobs,
 * ckptd_job_quota_bytes only for jobs with a quota. NULL counters, gauges or jobs
 * read as zero or none. On allocation failure b->ok is false. Calls src->gauges and
 * src->jobs on the calling thread. */
void ckptd_metrics_render(const struct ckptd_metrics_source *src, struct ckpt_buf *b);
/* v as a label value of the text format (between its quotes): backslash, double
 * quote and newline escaped, every other byte as it is. */
void ckptd_metrics_label_value(struct ckpt_buf *b, const char *v);

/* The endpoint's bounds: connections it serves at once (more wait in the listen
 * backlog), and the seconds after which an idle one is closed. */
#define CKPTD_HTTP_MAX_CONNECTIONS 16u
#define CKPTD_HTTP_IDLE_TIMEOUT_S  10u
struct ckptd_http;
/* Serve src on addr ("HOST:PORT" or "[IPV6]:PORT", HOST a name or a numeric address;
 * port 0: ephemeral, see ckptd_http_port): GET or HEAD /metrics is answered 200 with
 * the exposition (Content-Type text/plain; version=0.0.4; charset=utf-8), another
 * method on it 405, any other path 404. src is copied; what it points to (counters,
 * arg) must outlive the endpoint, and its gauges and jobs functions are called on
 * the endpoint's own thread, one request at a time. *out is NULL on failure.
 * Errors: -EINVAL (not HOST:PORT, or a host that does not resolve), -EADDRINUSE,
 * another errno of socket, bind or listen (-EACCES, -EADDRNOTAVAIL, ...), -ENOMEM,
 * -EIO (libmicrohttpd failed to start). */
int  ckptd_http_start(const char *addr, const struct ckptd_metrics_source *src,
                      struct ckptd_http **out);
unsigned ckptd_http_port(const struct ckptd_http *h);   /* the port bound */
/* Stop serving: waits for the endpoint's thread, closes its connections and socket.
 * NULL: no-op. */
void ckptd_http_stop(struct ckptd_http *h);

/* ------------------------------------------------------------------ notify (notify.c)
 * systemd's notification protocol through libsystemd (sd_notify), for a unit of
 * Type=notify; no-ops when NOTIFY_SOCKET is not set. A failure to notify is logged
 * and otherwise ignored: the service runs on. Any thread. */
/* READY=1 with a STATUS line (status may be NULL): after start-up, and again once a
 * reload is done. */
void ckptd_notify_ready(const char *status);
/* STATUS=<printf>; a newline in it becomes a space (one status line, no other
 * assignment smuggled in). */
void ckptd_notify_status(const char *fmt, ...) CKPT_PRINTF(1, 2);
/* RELOADING=1 (with MONOTONIC_USEC, which newer systemd wants with it): at SIGHUP,
 * before re-reading the jobs; ckptd_notify_ready when done. */
void ckptd_notify_reloading(void);
/* STOPPING=1: at SIGTERM/SIGINT, before in-flight saves are finished. */
void ckptd_notify_stopping(void);

#endif /* CKPTD_H */
