/*
 * metrics.c — ckptd's counters as Prometheus text (exposition format 0.0.4), and the
 * HTTP endpoint that serves them (libmicrohttpd, on its own thread).
 *
 * The endpoint is for a scraper on the node or the management network: it answers
 * GET (and HEAD) /metrics and nothing else, holds a bounded number of connections
 * with an idle timeout, and listens on a socket bound here, so that a bind failure
 * comes back as its errno rather than as libmicrohttpd's NULL.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "ckptd.h"

/* ------------------------------------------------------------------ rendering */

static void put_str(struct ckpt_buf *b, const char *s) { ckpt_buf_put(b, s, strlen(s)); }

static void put_u64(struct ckpt_buf *b, uint64_t v)
{
	char t[24];
	int n = snprintf(t, sizeof t, "%" PRIu64, v);
	ckpt_buf_put(b, t, (size_t)n);
}

static void put_i64(struct ckpt_buf *b, int64_t v)
{
	char t[24];
	int n = snprintf(t, sizeof t, "%" PRId64, v);
	ckpt_buf_put(b, t, (size_t)n);
}

void ckptd_metrics_label_value(struct ckpt_buf *b, const char *v)
{
	/* The format's three escapes; every other byte (UTF-8 included) stands as is. */
	for (const char *p = v; *p; p++) {
		switch (*p) {
		case '\\': put_str(b, "\\\\"); break;
		case '"':  put_str(b, "\\\""); break;
		case '\n': put_str(b, "\\n"); break;
		default:   ckpt_buf_put(b, p, 1); break;
		}
	}
}

/* "# HELP" and "# TYPE": help holds no backslash or newline (it would need escapes). */
static void family(struct ckpt_buf *b, const char *name, const char *type, const char *help)
{
	put_str(b, "# HELP ");
	put_str(b, name);
	put_str(b, " ");
	put_str(b, help);
	put_str(b, "\n# TYPE ");
	put_str(b, name);
	put_str(b, " ");
	put_str(b, type);
	put_str(b, "\n");
}

static void sample_name(struct ckpt_buf *b, const char *name, const char *job)
{
	put_str(b, name);
	if (job) {
		put_str(b, "{job=\"");
		ckptd_metrics_label_value(b, job);
		put_str(b, "\"}");
	}
	put_str(b, " ");
}

static void counter(struct ckpt_buf *b, const char *name, const char *help,
                    _Atomic uint64_t *v)
{
	family(b, name, "counter", help);
	sample_name(b, name, NULL);
	put_u64(b, v ? atomic_load_explicit(v, memory_order_relaxed) : 0);
	put_str(b, "\n");
}

static void gauge_i64(struct ckpt_buf *b, const char *name, const char *help,
                      _Atomic int64_t *v)
{
	family(b, name, "gauge", help);
	sample_name(b, name, NULL);
	put_i64(b, v ? atomic_load_explicit(v, memory_order_relaxed) : 0);
	put_str(b, "\n");
}

static void gauge_u64(struct ckpt_buf *b, const char *name, const char *help, uint64_t v)
{
	family(b, name, "gauge", help);
	sample_name(b, name, NULL);
	put_u64(b, v);
	put_str(b, "\n");
}

/* The per-job families. The format wants each family's samples in one group, and
 * the source walks its jobs once: each family gathers its samples in a buffer of
 * its own, and the buffers follow one another at the end. */
enum { JF_USED, JF_QUOTA, JF_RECEIVED, JF_COMMITTED, JF_ABORTED, JF_COUNT_ };
static const struct { const char *name, *type, *help; } job_families[JF_COUNT_] = {
	[JF_USED]      = { "ckptd_job_used_bytes", "gauge",
	                   "Bytes the job holds on this ckptd." },
	[JF_QUOTA]     = { "ckptd_job_quota_bytes", "gauge",
	                   "Bytes the job may hold on this ckptd (jobs with a quota only)." },
	[JF_RECEIVED]  = { "ckptd_job_bytes_received_total", "counter",
	                   "Chunk bytes received from the job's ranks." },
	[JF_COMMITTED] = { "ckptd_job_saves_committed_total", "counter",
	                   "Steps of the job committed by this ckptd." },
	[JF_ABORTED]   = { "ckptd_job_saves_aborted_total", "counter",
	                   "Steps of the job aborted by this ckptd." },
};

struct job_samples { struct ckpt_buf b[JF_COUNT_]; };

static void job_sample(struct job_samples *js, int f, const char *job, uint64_t v)
{
	struct ckpt_buf *b = &js->b[f];
	if (!b->len)
		family(b, job_families[f].name, job_families[f].type, job_families[f].help);
	sample_name(b, job_families[f].name, job);
	put_u64(b, v);
	put_str(b, "\n");
}

static void emit_job(void *arg, const struct ckptd_job_usage *u)
{
	struct job_samples *js = arg;
	job_sample(js, JF_USED, u->job, u->used_bytes);
	if (u->quota_bytes)
		job_sample(js, JF_QUOTA, u->job, u->quota_bytes);
	job_sample(js, JF_RECEIVED, u->job, u->bytes_received);
	job_sample(js, JF_COMMITTED, u->job, u->saves_committed);
	job_sample(js, JF_ABORTED, u->job, u->saves_aborted);
}

void ckptd_metrics_render(const struct ckptd_metrics_source *src, struct ckpt_buf *b)
{
	struct ckptd_counters *c = src->counters;
	counter(b, "ckptd_bytes_received_total", "Chunk bytes received from ranks.",
	        c ? &c->bytes_received : NULL);
	counter(b, "ckptd_bytes_received_rdma_write_total", "Of the chunk bytes received, those "
	        "the ranks RDMA-wrote into pool buffers granted to them (the direct path).",
	        c ? &c->bytes_received_rdma : NULL);
	counter(b, "ckptd_bytes_written_total", "Shard bytes made durable.",
	        c ? &c->bytes_written : NULL);
	counter(b, "ckptd_bytes_read_total", "Bytes served to restores.",
	        c ? &c->bytes_read : NULL);
	counter(b, "ckptd_shards_written_total", "Shard files made durable.",
	        c ? &c->shards_written : NULL);
	counter(b, "ckptd_saves_committed_total", "Steps committed by this ckptd's coordinators.",
	        c ? &c->saves_committed : NULL);
	counter(b, "ckptd_saves_aborted_total", "Steps aborted by this ckptd's coordinators.",
	        c ? &c->saves_aborted : NULL);
	counter(b, "ckptd_connections_total", "Connections accepted since start.",
	        c ? &c->connections : NULL);
	counter(b, "ckptd_rejected_total", "Handshakes or requests refused.",
	        c ? &c->rejected : NULL);
	counter(b, "ckptd_quota_refusals_total", "Writes refused for a job's quota.",
	        c ? &c->quota_refusals : NULL);
	gauge_i64(b, "ckptd_queue_depth", "Chunks received and not yet written.",
	          c ? &c->queue_depth : NULL);
	gauge_i64(b, "ckptd_active_connections", "Connections open now.",
	          c ? &c->active_connections : NULL);

	struct ckptd_gauges g = { 0 };
	if (src->gauges)
		src->gauges(src->arg, &g);
	gauge_u64(b, "ckptd_pool_bytes", "Bytes of the buffer pool.", g.pool_bytes);
	gauge_u64(b, "ckptd_pool_used_bytes", "Bytes of the buffer pool in use.",
	          g.pool_used_bytes);
	gauge_u64(b, "ckptd_jobs", "Jobs in the jobs file.", g.jobs);

	struct job_samples js;
	for (int f = 0; f < JF_COUNT_; f++)
		ckpt_buf_init(&js.b[f]);
	if (src->jobs)
		src->jobs(src->arg, emit_job, &js);
	for (int f = 0; f < JF_COUNT_; f++) {
		if (!js.b[f].ok)
			b->ok = false;
		ckpt_buf_put(b, js.b[f].p, js.b[f].len);
		ckpt_buf_free(&js.b[f]);
	}
}

/* ------------------------------------------------------------------ the endpoint */

/* Made and freed by the caller's thread; between start and stop, libmicrohttpd's
 * thread reads src and logs through log_rl (thread-safe), and nothing else writes. */
struct ckptd_http {
	struct MHD_Daemon *daemon;
	struct ckptd_metrics_source src;
	unsigned port;
	struct ckpt_ratelimit log_rl;   /* libmicrohttpd's lines, which a client can provoke */
};

static void on_mhd_log(void *arg, const char *fmt, va_list ap)
{
	struct ckptd_http *h = arg;
	char line[512];
	vsnprintf(line, sizeof line, fmt, ap);
	size_t n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = '\0';
	ckpt_log_limited(&h->log_rl, "metrics endpoint: %s", line);
}

static enum MHD_Result reply_static(struct MHD_Connection *c, unsigned status,
                                    const char *body, bool allow)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body,
	                                                         MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
	                                             "text/plain; charset=utf-8");
	if (ok == MHD_YES && allow)
		ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	if (ok == MHD_YES)
		ok = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ok;
}

/* Every request is answered on the first call, with its headers: none of them has
 * a body worth reading (libmicrohttpd discards the rest and closes the connection). */
static enum MHD_Result on_request(void *arg, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req)
{
	CKPT_UNUSED(version);
	CKPT_UNUSED(upload_data);
	CKPT_UNUSED(upload_data_size);
	CKPT_UNUSED(req);
	struct ckptd_http *h = arg;
	if (strcmp(url, "/metrics"))
		return reply_static(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n",
		                    false);
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return reply_static(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: GET\n", true);
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ckptd_metrics_render(&h->src, &b);
	if (!b.ok) {
		ckpt_buf_free(&b);
		return reply_static(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", false);
	}
	/* The response takes the buffer; libmicrohttpd frees it with ckpt_free. */
	struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(b.len, b.p,
	                                                                           ckpt_free);
	if (!r) {
		ckpt_buf_free(&b);
		return MHD_NO;
	}
	enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
	                                             "text/plain; version=0.0.4; charset=utf-8");
	if (ok == MHD_YES)
		ok = MHD_queue_response(c, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ok;
}

/* "HOST:PORT" or "[V6]:PORT" into host and port (digits, at most 65535). */
static int split_addr(const char *addr, char *host, size_t cap, char *port, size_t pcap)
{
	const char *colon = strrchr(addr, ':');
	if (!colon)
		return -EINVAL;
	const char *h = addr;
	size_t hlen = (size_t)(colon - addr);
	if (hlen && addr[0] == '[') {
		if (hlen < 2 || addr[hlen - 1] != ']')
			return -EINVAL;
		h++;
		hlen -= 2;
	} else if (memchr(addr, ':', hlen) || memchr(addr, '[', hlen) || memchr(addr, ']', hlen)) {
		return -EINVAL;                      /* a v6 address without its brackets */
	}
	const char *p = colon + 1;
	size_t plen = strlen(p);
	if (!hlen || hlen >= cap || !plen || plen > 5 || plen >= pcap ||
	    strspn(p, "0123456789") != plen || atoi(p) > 65535)
		return -EINVAL;
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	memcpy(port, p, plen + 1);
	return 0;
}

/* A listening socket on addr (the first of its addresses that binds), and its port. */
static int listen_on(const char *addr, int *out, unsigned *port_out)
{
	char host[256], port[6];
	if (split_addr(addr, host, sizeof host, port, sizeof port))
		return ckpt_err(-EINVAL, "metrics address '%s': expected HOST:PORT or [IPV6]:PORT",
		                addr);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
	                          .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *res;
	int g = getaddrinfo(host, port, &hints, &res);
	if (g)
		return ckpt_err(g == EAI_MEMORY ? -ENOMEM : -EINVAL, "metrics address '%s': %s", addr,
		                g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
	int rc = -EADDRNOTAVAIL, fd = -1;
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
		            ai->ai_protocol);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		/* A restarted ckptd binds again while the last one's connections linger. */
		int on = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) {
			rc = 0;
			break;
		}
		rc = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (rc)
		return ckpt_err(rc, "metrics address '%s'", addr);
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
		rc = ckpt_err(-errno, "metrics address '%s': getsockname", addr);
		close(fd);
		return rc;
	}
	*port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
	                                     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	*out = fd;
	return 0;
}

int ckptd_http_start(const char *addr, const struct ckptd_metrics_source *src,
                     struct ckptd_http **out)
{
	*out = NULL;
	struct ckptd_http *h = ckpt_calloc(1, sizeof *h);
	if (!h)
		return ckpt_err(-ENOMEM, "metrics endpoint");
	h->src = *src;
	int fd, rc = listen_on(addr, &fd, &h->port);
	if (rc) {
		ckpt_free(h);
		return rc;
	}
	ckpt_ratelimit_init(&h->log_rl, "metrics endpoint", CKPT_LOG_WARN, 5000, 5);
	/* poll, not select: no FD_SETSIZE bound on descriptors. The connection limit
	 * holds the rest in the listen backlog; the timeout closes idle ones. */
	h->daemon = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG, 0, NULL, NULL,
		on_request, h,
		MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h,
		MHD_OPTION_LISTEN_SOCKET, fd,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)CKPTD_HTTP_MAX_CONNECTIONS,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CKPTD_HTTP_IDLE_TIMEOUT_S,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(32u << 10),
		MHD_OPTION_END);
	if (!h->daemon) {
		/* libmicrohttpd closes the socket on most of its failure paths but not all: a
		 * descriptor left open on a failed start is the lesser harm than closing one
		 * that another thread may have opened meanwhile. */
		ckpt_ratelimit_destroy(&h->log_rl);
		ckpt_free(h);
		return ckpt_err(-EIO, "metrics endpoint on %s: libmicrohttpd did not start", addr);
	}
	*out = h;
	return 0;
}

unsigned ckptd_http_port(const struct ckptd_http *h)
{
	return h->port;
}

void ckptd_http_stop(struct ckptd_http *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->daemon);             /* joins its thread, closes the socket */
	ckpt_ratelimit_destroy(&h->log_rl);
	ckpt_free(h);
}
