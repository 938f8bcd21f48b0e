/*
 * main.c — ckptd: options, the jobs file, signals, systemd readiness, metrics, and
 * the server (docs/ckptd.md).
 *
 * Signals are taken by one thread with sigwait (every other thread blocks them):
 * SIGHUP reloads the jobs file (a bad file keeps the table in use, logged);
 * SIGTERM and SIGINT stop: no new connection or request is taken, a shard stream
 * in flight is given --grace to finish, then aborted (its rank's save fails; the
 * committed steps are untouched).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "remote/remote.h"
#include "server.h"

#define DEFAULT_PORT     29700u
#define DEFAULT_POOL     (1ull << 30)
#define DEFAULT_BUF      (16ull << 20)

struct cfg {
	char    *listen, *data, *metrics, *jobs, *transport;
	uint64_t pool, buf;
	unsigned max_conns, timeout_ms, grace_ms, idle_ms, queue_depth;
	unsigned handshake_ms, max_handshakes;
	uint64_t max_index;
	int      log_level;
};

static void usage(FILE *f)
{
	fprintf(f,
"usage: ckptd --listen ADDR:PORT --data DIR --jobs FILE [options]\n"
"\n"
"The snapshot service of storage nodes: ranks of the jobs in FILE save their shards\n"
"through it, it makes them durable under DIR, hosts the manifest and the commit\n"
"coordinator of the jobs whose target names it first, and serves their restores.\n"
"\n"
"  --listen ADDR:PORT   where ranks connect (default 0.0.0.0:%u)\n"
"  --data DIR           where the jobs' checkpoints are kept (DIR/jobs/<job id>)\n"
"  --jobs FILE          the jobs served: id, secret, quota (reloaded on SIGHUP)\n"
"  --metrics ADDR:PORT  Prometheus text metrics on http://ADDR:PORT/metrics\n"
"  --pool BYTES         memory for chunks in flight, all jobs together (default 1G)\n"
"  --chunk-max BYTES    largest chunk taken: one pool buffer (default 16M)\n"
"  --max-conns N        connections served at once (default 1024)\n"
"  --handshake-ms MS    a new connection proves its job within MS (default 10000)\n"
"  --max-handshakes N   connections from one address in their handshake at once;\n"
"                       more are closed and connect again (default 16)\n"
"  --timeout-ms MS      stalled streams and commits (default 120000)\n"
"  --grace-ms MS        at SIGTERM, how long streams in flight may finish (default 30000)\n"
"  --idle-ms MS         a connection without a stream closes after MS (default 600000)\n"
"  --max-index BYTES    the index one shard stream may build (default 64M)\n"
"  --transport tcp|rdma the ranks' transport (default tcp)\n"
"  --config FILE        options as 'key = value' lines (keys as above, without --)\n"
"  --log LEVEL          error, warn, info or debug (default info)\n"
"  --help, --version\n", DEFAULT_PORT);
}

static int set(struct cfg *c, const char *key, const char *val, const char *where)
{
	uint64_t v;
	char *end;
	if (!strcmp(key, "listen")) { free(c->listen); c->listen = strdup(val); }
	else if (!strcmp(key, "data")) { free(c->data); c->data = strdup(val); }
	else if (!strcmp(key, "metrics")) { free(c->metrics); c->metrics = strdup(val); }
	else if (!strcmp(key, "jobs")) { free(c->jobs); c->jobs = strdup(val); }
	else if (!strcmp(key, "transport")) { free(c->transport); c->transport = strdup(val); }
	else if (!strcmp(key, "pool") || !strcmp(key, "chunk-max") || !strcmp(key, "max-index")) {
		if (ckpt_parse_size(val, &v) || v == 0) {
			fprintf(stderr, "ckptd: %s%s: '%s' is not a size\n", where, key, val);
			return -1;
		}
		*(!strcmp(key, "pool") ? &c->pool : !strcmp(key, "chunk-max") ? &c->buf
		  : &c->max_index) = v;
	} else if (!strcmp(key, "max-conns") || !strcmp(key, "timeout-ms") ||
	           !strcmp(key, "grace-ms") || !strcmp(key, "idle-ms") ||
	           !strcmp(key, "handshake-ms") || !strcmp(key, "max-handshakes")) {
		errno = 0;
		unsigned long n = strtoul(val, &end, 10);
		if (errno || *end || end == val || n == 0 || n > 1000000000ul) {
			fprintf(stderr, "ckptd: %s%s: '%s' is not a positive number\n", where, key, val);
			return -1;
		}
		*(!strcmp(key, "max-conns") ? &c->max_conns : !strcmp(key, "timeout-ms")
		  ? &c->timeout_ms : !strcmp(key, "idle-ms") ? &c->idle_ms
		  : !strcmp(key, "handshake-ms") ? &c->handshake_ms
		  : !strcmp(key, "max-handshakes") ? &c->max_handshakes : &c->grace_ms) =
			(unsigned)n;
	} else if (!strcmp(key, "log")) {
		static const char *lv[] = { "error", "warn", "info", "debug" };
		c->log_level = -1;
		for (int i = 0; i < 4; i++)
			if (!strcmp(val, lv[i]))
				c->log_level = i;
		if (c->log_level < 0) {
			fprintf(stderr, "ckptd: %slog: '%s': expected error, warn, info or debug\n",
			        where, val);
			return -1;
		}
	} else {
		fprintf(stderr, "ckptd: %sunknown option '%s'\n", where, key);
		return -1;
	}
	return 0;
}

static int read_config(struct cfg *c, const char *path)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		fprintf(stderr, "ckptd: config %s: %s\n", path, strerror(errno));
		return -1;
	}
	char line[4096], where[4200];
	int rc = 0;
	for (unsigned no = 1; !rc && fgets(line, sizeof line, f); no++) {
		snprintf(where, sizeof where, "%s:%u: ", path, no);
		char *p = line + strspn(line, " \t");
		p[strcspn(p, "\r\n#")] = '\0';
		if (!*p)
			continue;
		char *eq = strchr(p, '=');
		if (!eq) {
			fprintf(stderr, "ckptd: %sexpected 'key = value'\n", where);
			rc = -1;
			break;
		}
		char *k = p, *v = eq + 1;
		for (char *e = eq; e > k && (e[-1] == ' ' || e[-1] == '\t'); e--)
			e[-1] = '\0';
		*eq = '\0';
		v += strspn(v, " \t");
		for (size_t n = strlen(v); n && (v[n - 1] == ' ' || v[n - 1] == '\t'); n--)
			v[n - 1] = '\0';
		rc = set(c, k, v, where);
	}
	fclose(f);
	return rc;
}

/* "<UTC time> ckptd[pid] job <id> rank <r> <level>: <message>", one write per line. */
static void log_line(void *arg, int level, const struct ckpt_log_ctx *where, const char *msg)
{
	CKPT_UNUSED(arg);
	static const char *names[] = { "error", "warn", "info", "debug" };
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char when[32], who[320] = "", line[8192];
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
	if (where && where->job_id && where->rank >= 0)
		snprintf(who, sizeof who, " job %s rank %d", where->job_id, where->rank);
	else if (where && where->job_id)
		snprintf(who, sizeof who, " job %s", where->job_id);
	int n = snprintf(line, sizeof line, "%s.%03ldZ ckptd[%d]%s %s: %s\n", when,
	                 ts.tv_nsec / 1000000, (int)getpid(), who,
	                 level >= 0 && level < 4 ? names[level] : "?", msg);
	if (n > (int)sizeof line - 1)
		n = (int)sizeof line - 1;
	ssize_t w = write(2, line, (size_t)n);
	CKPT_UNUSED(w);
}

struct sigctx {
	struct ckptd_server *srv;
	struct ckptd_jobs   *jobs;
	unsigned             grace_ms;
	sigset_t             set;
};

static void *signal_main(void *arg)
{
	struct sigctx *x = arg;
	for (;;) {
		int sig;
		if (sigwait(&x->set, &sig))
			continue;
		if (sig == SIGHUP) {
			ckptd_notify_reloading();
			int rc = ckptd_jobs_reload(x->jobs);
			if (rc)
				ckpt_log(CKPT_LOG_ERROR, "SIGHUP: the jobs file was not reloaded, the jobs "
				         "in use stay: %s", ckpt_err_msg());
			else
				ckpt_log(CKPT_LOG_INFO, "SIGHUP: %u jobs", ckptd_jobs_count(x->jobs));
			ckptd_notify_ready(rc ? "jobs file not reloaded (see the log)" : "serving");
			continue;
		}
		ckpt_log(CKPT_LOG_INFO, "%s: stopping (streams in flight get %u ms)", strsignal(sig),
		         x->grace_ms);
		ckptd_notify_stopping();
		ckptd_server_stop(x->srv, x->grace_ms);
		return NULL;
	}
}

/* Writes in flight per shard stream: as many as the pool has buffers, so that the pool
 * and not each stream's ring is what stops ckptd reading when the disks fall behind
 * (docs/ckptd.md, Backpressure), however few streams there are. A ring of 8 per stream
 * left most of the pool unused with few ranks per instance (4 streams: 36 of 64
 * buffers), and their snapshot point waited for the disk. At most 64: one ring each. */
static unsigned stream_depth(uint64_t pool, uint64_t buf)
{
	uint64_t n = pool / buf;
	return n < 8 ? 8 : n > 1024 ? 1024 : (unsigned)n;
}

static int split_addr(const char *a, char *host, size_t cap, unsigned *port)
{
	const char *colon = strrchr(a, ':');
	const char *h = a;
	size_t n = colon ? (size_t)(colon - a) : 0;
	if (n >= 2 && a[0] == '[' && a[n - 1] == ']') {
		h++;
		n -= 2;
	}
	char *end;
	unsigned long p = colon ? strtoul(colon + 1, &end, 10) : 0;
	if (!colon || !n || n >= cap || *end || end == colon + 1 || p > 65535)
		return -1;
	memcpy(host, h, n);
	host[n] = '\0';
	*port = (unsigned)p;
	return 0;
}

int main(int argc, char **argv)
{
	struct cfg c = { .pool = DEFAULT_POOL, .buf = DEFAULT_BUF, .max_conns = 1024,
	                 .timeout_ms = 120000, .grace_ms = 30000, .log_level = CKPT_LOG_INFO };
	static const struct option lo[] = {
		{ "listen", 1, 0, 0 }, { "data", 1, 0, 0 }, { "metrics", 1, 0, 0 },
		{ "jobs", 1, 0, 0 }, { "pool", 1, 0, 0 }, { "chunk-max", 1, 0, 0 },
		{ "max-conns", 1, 0, 0 }, { "timeout-ms", 1, 0, 0 }, { "grace-ms", 1, 0, 0 },
		{ "idle-ms", 1, 0, 0 }, { "max-index", 1, 0, 0 }, { "handshake-ms", 1, 0, 0 },
		{ "max-handshakes", 1, 0, 0 },
		{ "transport", 1, 0, 0 }, { "log", 1, 0, 0 }, { "config", 1, 0, 'c' },
		{ "help", 0, 0, 'h' }, { "version", 0, 0, 'V' }, { 0, 0, 0, 0 },
	};
	/* The config file first, so that the command line overrides it. */
	for (int i = 1; i < argc; i++) {
		const char *f = !strcmp(argv[i], "--config") && i + 1 < argc ? argv[i + 1]
		              : !strncmp(argv[i], "--config=", 9) ? argv[i] + 9 : NULL;
		if (f && read_config(&c, f))
			return 2;
	}
	int ch, idx;
	while ((ch = getopt_long(argc, argv, "", lo, &idx)) != -1) {
		if (ch == 'h') {
			usage(stdout);
			return 0;
		}
		if (ch == 'V') {
			printf("ckptd %s\n", ckpt_version());
			return 0;
		}
		if (ch == 'c')
			continue;
		if (ch != 0 || set(&c, lo[idx].name, optarg, "--")) {
			if (ch != 0)
				usage(stderr);
			return 2;
		}
	}
	if (optind < argc || !c.data || !c.jobs) {
		fprintf(stderr, "ckptd: %s\n", optind < argc ? "unexpected arguments"
		        : "--data and --jobs are required (ckptd --help)");
		return 2;
	}
	/* This thread's lines and those of the threads it starts: the level asked for. */
	static struct ckpt_log_sink sink;
	sink = (struct ckpt_log_sink){ .fn = log_line, .level = c.log_level,
	                               .rank = CKPT_LOG_NO_RANK };
	ckpt_log_enter(&sink, CKPT_LOG_NO_STEP);
	ckpt_log_set(log_line, NULL);
	char host[REMOTE_MAX_HOST + 1];
	unsigned port = DEFAULT_PORT;
	snprintf(host, sizeof host, "0.0.0.0");
	if (c.listen && split_addr(c.listen, host, sizeof host, &port)) {
		fprintf(stderr, "ckptd: --listen '%s': expected ADDR:PORT\n", c.listen);
		return 2;
	}
	/* Checked before the pool is mapped and faulted in: a typo costs no wait. */
	char mhost[REMOTE_MAX_HOST + 1];
	unsigned mport;
	if (c.metrics && split_addr(c.metrics, mhost, sizeof mhost, &mport)) {
		fprintf(stderr, "ckptd: --metrics '%s': expected ADDR:PORT\n", c.metrics);
		return 2;
	}
	int transport = NET_TCP;
	if (c.transport && !strcmp(c.transport, "rdma"))
		transport = NET_RDMA;
	else if (c.transport && strcmp(c.transport, "tcp")) {
		fprintf(stderr, "ckptd: --transport '%s': expected tcp or rdma\n", c.transport);
		return 2;
	}
	if (c.buf % CKPT_ALIGN || c.buf > IO_MAX_CHUNK_BYTES) {
		fprintf(stderr, "ckptd: --chunk-max %llu: a multiple of %u, at most %llu\n",
		        (unsigned long long)c.buf, CKPT_ALIGN, (unsigned long long)IO_MAX_CHUNK_BYTES);
		return 2;
	}

	/* Every thread from here on blocks the signals the signal thread takes. */
	struct sigctx sx = { .grace_ms = c.grace_ms };
	sigemptyset(&sx.set);
	sigaddset(&sx.set, SIGHUP);
	sigaddset(&sx.set, SIGTERM);
	sigaddset(&sx.set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sx.set, NULL);
	signal(SIGPIPE, SIG_IGN);

	static struct ckptd_counters counters;
	struct ckptd_jobs *jobs = NULL;
	struct ckptd_server *srv = NULL;
	struct ckptd_http *http = NULL;
	int rc = ckptd_jobs_load(c.jobs, &jobs);
	if (!rc) {
		struct ckptd_server_opts so = {
			.listen_host = host, .listen_port = port, .data = c.data,
			.pool_bytes = (size_t)c.pool, .buf_bytes = (size_t)c.buf,
			.max_conns = c.max_conns, .timeout_ms = c.timeout_ms,
			.handshake_ms = c.handshake_ms, .max_handshakes = c.max_handshakes,
			.queue_depth = stream_depth(c.pool, c.buf),
			.idle_ms = c.idle_ms, .max_index = (size_t)c.max_index,
			.transport = transport, .jobs = jobs, .counters = &counters,
			.log_fn = log_line, .log_level = c.log_level,
		};
		rc = ckptd_server_start(&so, &srv);
	}
	struct ckptd_metrics_source src = { .counters = &counters, .gauges = ckptd_server_gauges,
	                                    .jobs = ckptd_server_jobs, .arg = srv };
	if (!rc && c.metrics)
		rc = ckptd_http_start(c.metrics, &src, &http);
	pthread_t st;
	sx.srv = srv;
	sx.jobs = jobs;
	/* In this thread's log sink, so that its lines (a reload, a stop) are logged at
	 * the level asked for. */
	if (!rc && (rc = -ckpt_thread_create(&st, NULL, signal_main, &sx)))
		ckpt_err(rc, "signal thread");
	if (rc) {
		fprintf(stderr, "ckptd: %s\n", ckpt_err_msg());
		ckptd_http_stop(http);
		ckptd_server_free(srv);
		ckptd_jobs_free(jobs);
		return 1;
	}
	ckpt_log(CKPT_LOG_INFO, "ckptd %s: listening on %s:%u (%s), data %s, %u jobs, pool %llu "
	         "bytes%s%s", ckpt_version(), host, ckptd_server_port(srv),
	         transport == NET_RDMA ? "rdma" : "tcp", c.data, ckptd_jobs_count(jobs),
	         (unsigned long long)c.pool, http ? ", metrics on " : "", http ? c.metrics : "");
	/* It needs no privilege: the unit runs it as its own user (ckptd.service.in). */
	if (geteuid() == 0)
		ckpt_log(CKPT_LOG_WARN, "running as root, which ckptd does not need: run it as a "
		         "user of its own (ckptd/ckptd.service.in, ckptd/ckptd.sysusers)");
	/* Tests and scripts read the port from here when they asked for port 0. */
	printf("ckptd: listening on port %u", ckptd_server_port(srv));
	if (http)
		printf(", metrics on port %u", ckptd_http_port(http));
	printf("\n");
	fflush(stdout);
	ckptd_notify_ready("serving");
	rc = ckptd_server_run(srv);
	pthread_join(st, NULL);
	ckptd_http_stop(http);
	ckptd_server_free(srv);
	ckptd_jobs_free(jobs);
	ckpt_log(CKPT_LOG_INFO, "ckptd: stopped");
	free(c.listen); free(c.data); free(c.metrics); free(c.jobs); free(c.transport);
	return rc ? 1 : 0;
}
