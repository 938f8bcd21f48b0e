/*
 * server.h — ckptd's server (server.c): the listener's connections, each in a
 * thread of its own, and the per-job state (namespace, usage, coordinator).
 */
#ifndef CKPTD_SERVER_H
#define CKPTD_SERVER_H

#include "ckptd.h"

struct ckptd_server_opts {
	const char *listen_host;
	unsigned    listen_port;         /* 0: ephemeral (tests) */
	const char *data;                /* --data: jobs/<id>/ under it */
	size_t      pool_bytes;          /* --pool */
	size_t      buf_bytes;           /* one pool buffer: the largest chunk taken */
	unsigned    max_conns;           /* connections served at once */
	unsigned    timeout_ms;          /* idle streams, commits */
	unsigned    handshake_ms;        /* a new connection proves its job within this;
	                                    0: 10 s */
	unsigned    max_handshakes;      /* connections from one address in their
	                                    handshake at once; more are closed as they
	                                    come (the client tries again); 0: 16 */
	unsigned    queue_depth;         /* io_uring writes in flight per stream */
	unsigned    idle_ms;             /* a connection without a stream closes after this
	                                    (the rank connects again); 0: 10 minutes */
	size_t      max_index;           /* a shard's index (its tensors and chunks) held
	                                    while it streams, bytes; 0: 64 MiB */
	int         transport;           /* enum net_transport */
	struct ckptd_jobs *jobs;         /* borrowed */
	struct ckptd_counters *counters; /* borrowed */
	ckpt_log_fn log_fn;              /* every line of a connection or a job goes here, */
	int         log_level;           /* with the job and rank, up to this level */
};
struct ckptd_server;
/* Take the data directory (a lock file in it: one ckptd per directory), set up the
 * pool and listen. Errors name what failed. */
int  ckptd_server_start(const struct ckptd_server_opts *o, struct ckptd_server **out);
unsigned ckptd_server_port(const struct ckptd_server *s);
/* Accept and serve until ckptd_server_stop (from another thread or a signal
 * handler's wake): returns 0 after a stop. */
int  ckptd_server_run(struct ckptd_server *s);
/* Ask run to return: connections stop reading new requests; a shard stream in
 * flight finishes when its rank finishes it within grace_ms, else it is aborted
 * (its file removed; the rank's save fails, the committed steps are untouched). */
void ckptd_server_stop(struct ckptd_server *s, unsigned grace_ms);
/* After run returned: wait for the connections, stop the coordinators, free. */
void ckptd_server_free(struct ckptd_server *s);
/* For the metrics endpoint. */
void ckptd_server_gauges(void *arg, struct ckptd_gauges *out);
void ckptd_server_jobs(void *arg, void (*emit)(void *emit_arg, const struct ckptd_job_usage *u),
                       void *emit_arg);

#endif /* CKPTD_SERVER_H */
