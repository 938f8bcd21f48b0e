/*
 * test_metrics.c — ckptd's metrics (ckptd/metrics.c): the exposition checked line by
 * line and against the rules of the text format 0.0.4; label escaping; the HTTP
 * endpoint spoken to over a raw socket (status, Content-Type, body, 404, 405, HEAD),
 * its addresses, and its connection limit.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ckptd.h"
#include "testutil.h"

/* ------------------------------------------------------------------ a source */

struct fake {
	struct ckptd_counters c;
	_Atomic unsigned gauge_calls, jobs_calls;   /* the endpoint's thread counts */
	const char *odd_id;                         /* a third job, when set */
};

static void fake_gauges(void *arg, struct ckptd_gauges *g)
{
	struct fake *f = arg;
	f->gauge_calls++;
	g->pool_bytes = 1ull << 30;
	g->pool_used_bytes = 12345;
	g->jobs = 2;
}

static void fake_jobs(void *arg, void (*emit)(void *, const struct ckptd_job_usage *),
                      void *emit_arg)
{
	struct fake *f = arg;
	f->jobs_calls++;
	struct ckptd_job_usage a = { .job = "alpha", .used_bytes = 5000, .quota_bytes = 1ull << 40,
	                             .bytes_received = 77, .saves_committed = 3,
	                             .saves_aborted = 1 };
	struct ckptd_job_usage b = { .job = "beta.v2_x-Y", .used_bytes = 0, .quota_bytes = 0,
	                             .bytes_received = UINT64_MAX, .saves_committed = 0,
	                             .saves_aborted = 9 };
	emit(emit_arg, &a);
	emit(emit_arg, &b);
	if (f->odd_id) {
		struct ckptd_job_usage c = { .job = f->odd_id, .used_bytes = 1 };
		emit(emit_arg, &c);
	}
}

static void fake_init(struct fake *f, struct ckptd_metrics_source *src)
{
	memset(f, 0, sizeof *f);
	atomic_store(&f->c.bytes_received, 123);
	atomic_store(&f->c.bytes_received_rdma, 100);
	atomic_store(&f->c.bytes_written, 456);
	atomic_store(&f->c.bytes_read, 789);
	atomic_store(&f->c.shards_written, 10);
	atomic_store(&f->c.saves_committed, 11);
	atomic_store(&f->c.saves_aborted, 12);
	atomic_store(&f->c.connections, 13);
	atomic_store(&f->c.rejected, 14);
	atomic_store(&f->c.quota_refusals, 15);
	atomic_store(&f->c.queue_depth, -3);     /* a gauge may go below zero on a bug: shown */
	atomic_store(&f->c.active_connections, 4);
	*src = (struct ckptd_metrics_source){ .counters = &f->c, .gauges = fake_gauges,
	                                      .jobs = fake_jobs, .arg = f };
}

static char *render(const struct ckptd_metrics_source *src)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ckptd_metrics_render(src, &b);
	ck_assert(b.ok);
	char *s = malloc(b.len + 1);
	memcpy(s, b.p, b.len);
	s[b.len] = '\0';
	ckpt_buf_free(&b);
	return s;
}

/* ------------------------------------------------------------------ the format's rules */

/* Every line is a HELP, a TYPE or a sample; names are metric names; a family's HELP
 * and TYPE come once, before its samples, and its samples are one group; a counter's
 * name ends in _total; values are integers; the text ends with a newline. Returns
 * the number of samples. */
static unsigned check_format(const char *text)
{
	regex_t help, type, sample;
	ck_assert_int_eq(regcomp(&help, "^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) [^\\\\]+$",
	                         REG_EXTENDED), 0);
	ck_assert_int_eq(regcomp(&type, "^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)$",
	                         REG_EXTENDED), 0);
	ck_assert_int_eq(regcomp(&sample, "^([a-zA-Z_:][a-zA-Z0-9_:]*)"
	                         "(\\{job=\"([^\"\\\\]|\\\\[\"\\\\n])*\"\\})? -?[0-9]+$",
	                         REG_EXTENDED), 0);
	ck_assert(text[0] && text[strlen(text) - 1] == '\n');
	char families[64][64];
	unsigned nfam = 0, samples = 0;
	char cur[64] = "", cur_type[16] = "";
	bool cur_help = false;
	char *copy = strdup(text), *save = NULL;
	for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		regmatch_t m[3];
		char name[64];
		if (!regexec(&help, line, 2, m, 0)) {
			snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
			for (unsigned i = 0; i < nfam; i++)
				ck_assert_msg(strcmp(families[i], name), "family %s twice", name);
			ck_assert_uint_lt(nfam, 64);
			strcpy(families[nfam++], name);
			strcpy(cur, name);
			cur_type[0] = '\0';
			cur_help = true;
		} else if (!regexec(&type, line, 3, m, 0)) {
			snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
			ck_assert_msg(cur_help && !strcmp(name, cur) && !cur_type[0], "TYPE out of place: %s",
			              line);
			snprintf(cur_type, sizeof cur_type, "%.*s", (int)(m[2].rm_eo - m[2].rm_so),
			         line + m[2].rm_so);
			size_t n = strlen(name);
			if (!strcmp(cur_type, "counter"))
				ck_assert_msg(n > 6 && !strcmp(name + n - 6, "_total"), "counter %s", name);
		} else if (!regexec(&sample, line, 2, m, 0)) {
			snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
			ck_assert_msg(cur_type[0] && !strcmp(name, cur), "sample outside its family: %s",
			              line);
			samples++;
		} else {
			ck_abort_msg("not a line of the text format: '%s'", line);
		}
	}
	free(copy);
	regfree(&help);
	regfree(&type);
	regfree(&sample);
	return samples;
}

static void has_line(const char *text, const char *line)
{
	char *l = malloc(strlen(line) + 3);
	sprintf(l, "\n%s\n", line);
	ck_assert_msg(strstr(text, l) || !strncmp(text, l + 1, strlen(l + 1)),
	              "missing line '%s' in:\n%s", line, text);
	free(l);
}

static void lacks(const char *text, const char *what)
{
	ck_assert_msg(!strstr(text, what), "'%s' should not be in:\n%s", what, text);
}

/* ------------------------------------------------------------------ rendering */

START_TEST(render_all)
{
	struct fake f;
	struct ckptd_metrics_source src;
	fake_init(&f, &src);
	char *t = render(&src);
	/* 15 process-wide; per job: used, received, committed, aborted, and one quota. */
	ck_assert_uint_eq(check_format(t), 15 + 2 * 4 + 1);
	static const char *const lines[] = {
		"# HELP ckptd_bytes_received_total Chunk bytes received from ranks.",
		"# TYPE ckptd_bytes_received_total counter",
		"ckptd_bytes_received_total 123",
		"# TYPE ckptd_bytes_received_rdma_write_total counter",
		"ckptd_bytes_received_rdma_write_total 100",
		"# TYPE ckptd_bytes_written_total counter",
		"ckptd_bytes_written_total 456",
		"ckptd_bytes_read_total 789",
		"ckptd_shards_written_total 10",
		"ckptd_saves_committed_total 11",
		"ckptd_saves_aborted_total 12",
		"ckptd_connections_total 13",
		"ckptd_rejected_total 14",
		"# TYPE ckptd_quota_refusals_total counter",
		"ckptd_quota_refusals_total 15",
		"# TYPE ckptd_queue_depth gauge",
		"ckptd_queue_depth -3",
		"# TYPE ckptd_active_connections gauge",
		"ckptd_active_connections 4",
		"# TYPE ckptd_pool_bytes gauge",
		"ckptd_pool_bytes 1073741824",
		"ckptd_pool_used_bytes 12345",
		"# TYPE ckptd_jobs gauge",
		"ckptd_jobs 2",
		"# TYPE ckptd_job_used_bytes gauge",
		"ckptd_job_used_bytes{job=\"alpha\"} 5000",
		"ckptd_job_used_bytes{job=\"beta.v2_x-Y\"} 0",
		"# TYPE ckptd_job_quota_bytes gauge",
		"ckptd_job_quota_bytes{job=\"alpha\"} 1099511627776",
		"# TYPE ckptd_job_bytes_received_total counter",
		"ckptd_job_bytes_received_total{job=\"alpha\"} 77",
		"ckptd_job_bytes_received_total{job=\"beta.v2_x-Y\"} 18446744073709551615",
		"# TYPE ckptd_job_saves_committed_total counter",
		"ckptd_job_saves_committed_total{job=\"alpha\"} 3",
		"ckptd_job_saves_committed_total{job=\"beta.v2_x-Y\"} 0",
		"# TYPE ckptd_job_saves_aborted_total counter",
		"ckptd_job_saves_aborted_total{job=\"alpha\"} 1",
		"ckptd_job_saves_aborted_total{job=\"beta.v2_x-Y\"} 9",
	};
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(lines); i++)
		has_line(t, lines[i]);
	lacks(t, "ckptd_job_quota_bytes{job=\"beta");       /* no quota: no sample */
	ck_assert_uint_eq(f.gauge_calls, 1);
	ck_assert_uint_eq(f.jobs_calls, 1);                 /* one walk over the jobs */
	free(t);

	/* The counters are read at render time. */
	atomic_fetch_add(&f.c.bytes_received, 1000);
	t = render(&src);
	has_line(t, "ckptd_bytes_received_total 1123");
	free(t);

	/* A source without gauges or jobs: zeros, and no per-job families at all. */
	src.gauges = NULL;
	src.jobs = NULL;
	t = render(&src);
	check_format(t);
	has_line(t, "ckptd_pool_bytes 0");
	has_line(t, "ckptd_jobs 0");
	lacks(t, "ckptd_job_");
	free(t);
	src.counters = NULL;
	t = render(&src);
	check_format(t);
	has_line(t, "ckptd_bytes_received_total 0");
	has_line(t, "ckptd_queue_depth 0");
	free(t);
}
END_TEST

/* Job ids cannot hold them, but the escaping is the format's, whatever the bytes. */
START_TEST(label_escaping)
{
	static const struct { const char *in, *out; } cases[] = {
		{ "plain", "plain" },
		{ "", "" },
		{ "a\"b", "a\\\"b" },
		{ "a\\b", "a\\\\b" },
		{ "a\nb", "a\\nb" },
		{ "\\\"\n", "\\\\\\\"\\n" },
		{ "tab\there", "tab\there" },
		{ "caf\xc3\xa9", "caf\xc3\xa9" },
	};
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(cases); i++) {
		struct ckpt_buf b;
		ckpt_buf_init(&b);
		ckptd_metrics_label_value(&b, cases[i].in);
		ck_assert(b.ok);
		ck_assert_uint_eq(b.len, strlen(cases[i].out));
		ck_assert_msg(!b.len || !memcmp(b.p, cases[i].out, b.len), "case %zu", i);
		ckpt_buf_free(&b);
	}
	/* And a rendered label with them still reads as the format's. */
	struct fake f;
	struct ckptd_metrics_source src;
	fake_init(&f, &src);
	f.odd_id = "a\"b\\c\nd";
	char *t = render(&src);
	ck_assert_uint_eq(check_format(t), 15 + 3 * 4 + 1);
	has_line(t, "ckptd_job_used_bytes{job=\"a\\\"b\\\\c\\nd\"} 1");
	free(t);
}
END_TEST

START_TEST(render_alloc_failure)
{
	struct fake f;
	struct ckptd_metrics_source src;
	fake_init(&f, &src);
	int64_t live = ckpt_fault_alloc_live();
	unsigned n;
	for (n = 1; n < 100; n++) {
		struct ckpt_buf b;
		ckpt_buf_init(&b);
		ckpt_fault_alloc_arm(n);
		ckptd_metrics_render(&src, &b);
		ckpt_fault_alloc_arm(0);
		bool ok = b.ok;
		ckpt_buf_free(&b);
		ck_assert_int_eq(ckpt_fault_alloc_live(), live);
		if (ok)
			break;
	}
	ck_assert_uint_gt(n, 1);
	ck_assert_uint_lt(n, 100);
}
END_TEST

/* ------------------------------------------------------------------ HTTP */

static int connect_to(unsigned port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
	return fd;
}

static void send_all(int fd, const char *s)
{
	size_t n = strlen(s);
	ck_assert_int_eq(send(fd, s, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* What fd says until it closes, waiting at most timeout_ms for each read; NULL if
 * it says nothing in that time. */
static char *read_reply(int fd, int timeout_ms)
{
	size_t cap = 1 << 16, len = 0;
	char *s = malloc(cap + 1);
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r = poll(&p, 1, timeout_ms);
		ck_assert_int_ge(r, 0);
		if (r == 0) {
			if (len)
				break;
			free(s);
			return NULL;
		}
		ssize_t n = recv(fd, s + len, cap - len, 0);
		if (n <= 0)
			break;
		len += (size_t)n;
		ck_assert_uint_lt(len, cap);
	}
	s[len] = '\0';
	return s;
}

/* One request on a fresh connection; the whole reply. */
static char *request(unsigned port, const char *req)
{
	int fd = connect_to(port);
	send_all(fd, req);
	char *r = read_reply(fd, 10000);
	close(fd);
	ck_assert_ptr_nonnull(r);
	return r;
}

static const char *body_of(const char *reply)
{
	const char *b = strstr(reply, "\r\n\r\n");
	ck_assert_ptr_nonnull(b);
	return b + 4;
}

START_TEST(http_serves)
{
	struct fake f;
	struct ckptd_metrics_source src;
	fake_init(&f, &src);
	struct ckptd_http *h = (void *)1;
	ck_assert_msg(ckptd_http_start("127.0.0.1:0", &src, &h) == 0, "%s", ckpt_err_msg());
	unsigned port = ckptd_http_port(h);
	ck_assert_uint_gt(port, 0);

	char *r = request(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.1 200 ", 13), "%s", r);
	ck_assert_ptr_nonnull(strcasestr(r, "\r\nContent-Type: text/plain; version=0.0.4; "
	                                    "charset=utf-8\r\n"));
	const char *body = body_of(r);
	ck_assert_uint_eq(check_format(body), 15 + 2 * 4 + 1);
	has_line(body, "ckptd_bytes_received_total 123");
	has_line(body, "ckptd_job_used_bytes{job=\"alpha\"} 5000");
	free(r);

	/* Counters move between scrapes; HTTP/1.0 too. */
	atomic_fetch_add(&f.c.rejected, 1);
	r = request(port, "GET /metrics HTTP/1.0\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.0 200 ", 13) || !strncmp(r, "HTTP/1.1 200 ", 13), "%s", r);
	has_line(body_of(r), "ckptd_rejected_total 15");
	free(r);

	/* HEAD: the headers alone. */
	r = request(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.1 200 ", 13), "%s", r);
	ck_assert_str_eq(body_of(r), "");
	free(r);

	/* Another path: 404, whatever the method; another method: 405, with Allow. */
	static const char *const others[] = { "/", "/metrics/", "/metricsx", "/other",
	                                      "/metrics/../metrics2" };
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(others); i++) {
		char req[256];
		snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		         others[i]);
		r = request(port, req);
		ck_assert_msg(!strncmp(r, "HTTP/1.1 404 ", 13), "%s: %s", others[i], r);
		lacks(r, "ckptd_");
		free(r);
	}
	static const char *const methods[] = {
		"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
		"PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
		"DELETE /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
	};
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(methods); i++) {
		r = request(port, methods[i]);
		ck_assert_msg(!strncmp(r, "HTTP/1.1 405 ", 13), "%s", r);
		ck_assert_ptr_nonnull(strcasestr(r, "\r\nAllow: GET, HEAD\r\n"));
		lacks(r, "ckptd_");
		free(r);
	}
	r = request(port, "POST /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.1 404 ", 13), "%s", r);
	free(r);
	/* Not HTTP: an error, never a crash, and the endpoint serves on. */
	r = request(port, "\x16\x03\x01 garbage\r\n\r\n");
	lacks(r, "ckptd_");
	free(r);
	r = request(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.1 200 ", 13), "%s", r);
	free(r);
	ck_assert_uint_ge(f.gauge_calls, 3);
	ckptd_http_stop(h);
	ckptd_http_stop(NULL);

	/* Stopped: nobody listens there any more. */
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), -1);
	ck_assert_int_eq(errno, ECONNREFUSED);
	close(fd);
}
END_TEST

START_TEST(http_addresses)
{
	struct fake f;
	struct ckptd_metrics_source src;
	fake_init(&f, &src);
	static const char *const bad[] = {
		"127.0.0.1", "127.0.0.1:", ":9464", "127.0.0.1:65536", "127.0.0.1:-1",
		"127.0.0.1:+80", "127.0.0.1:80x", "127.0.0.1:123456", "::1:0", "[::1]", "[::1:0",
		"::1]:0", "[]:0", "", "no-such-host.invalid:0",
	};
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(bad); i++) {
		struct ckptd_http *h = (void *)1;
		ck_assert_msg(ckptd_http_start(bad[i], &src, &h) == -EINVAL, "'%s': %s", bad[i],
		              ckpt_err_msg());
		ck_assert_ptr_null(h);
		ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), bad[i]));
	}
	/* A name, resolved. */
	struct ckptd_http *h, *h2 = (void *)1;
	ck_assert_msg(ckptd_http_start("localhost:0", &src, &h) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_gt(ckptd_http_port(h), 0);
	ckptd_http_stop(h);
	/* A port in use. */
	ck_assert_int_eq(ckptd_http_start("127.0.0.1:0", &src, &h), 0);
	char addr[64];
	snprintf(addr, sizeof addr, "127.0.0.1:%u", ckptd_http_port(h));
	ck_assert_int_eq(ckptd_http_start(addr, &src, &h2), -EADDRINUSE);
	ck_assert_ptr_null(h2);
	ckptd_http_stop(h);
	/* IPv6, where the machine has it. */
	int rc = ckptd_http_start("[::1]:0", &src, &h);
	if (rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT) {
		fprintf(stderr, "http_addresses: no IPv6 loopback here (%s): [::1] not tried\n",
		        ckpt_err_msg());
		return;
	}
	ck_assert_msg(rc == 0, "%s", ckpt_err_msg());
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6,
	                           .sin6_port = htons((uint16_t)ckptd_http_port(h)),
	                           .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a6, sizeof a6), 0);
	send_all(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	char *r = read_reply(fd, 10000);
	close(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_msg(!strncmp(r, "HTTP/1.1 200 ", 13), "%s", r);
	free(r);
	ckptd_http_stop(h);
}
END_TEST

/* Idle connections cannot take the endpoint: past CKPTD_HTTP_MAX_CONNECTIONS, a
 * request waits (in the listen backlog) until a connection closes, then is served. */
START_TEST(http_connection_limit)
{
	struct fake f;
	struct ckptd_metrics_source src;
	fake_init(&f, &src);
	struct ckptd_http *h;
	ck_assert_int_eq(ckptd_http_start("127.0.0.1:0", &src, &h), 0);
	unsigned port = ckptd_http_port(h);
	/* The endpoint accepts connections in the order they came (the listen backlog is
	 * a queue): the one after these is past the limit, whether or not the endpoint
	 * has taken all of these in yet. */
	int idle[CKPTD_HTTP_MAX_CONNECTIONS];
	for (unsigned i = 0; i < CKPTD_HTTP_MAX_CONNECTIONS; i++)
		idle[i] = connect_to(port);
	int extra = connect_to(port);
	send_all(extra, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	/* Not served while the limit holds (a wait that can only let a broken limit pass
	 * unseen, never fail a working one). */
	char *r = read_reply(extra, 300);
	ck_assert_msg(r == NULL, "served past the limit: %s", r ? r : "");
	close(idle[0]);
	r = read_reply(extra, 10000);
	ck_assert_msg(r && !strncmp(r, "HTTP/1.1 200 ", 13), "not served once a slot freed");
	free(r);
	close(extra);
	for (unsigned i = 1; i < CKPTD_HTTP_MAX_CONNECTIONS; i++)
		close(idle[i]);
	ckptd_http_stop(h);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ckptd_metrics");
	TCase *tc = tcase_create("metrics");
	tcase_add_test(tc, render_all);
	tcase_add_test(tc, label_escaping);
	tcase_add_test(tc, render_alloc_failure);
	tcase_add_test(tc, http_serves);
	tcase_add_test(tc, http_addresses);
	tcase_add_test(tc, http_connection_limit);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
