/*
 * bench_rdma.c — lib/net and lib/commit over one transport, for the rdma-vs-tcp
 * table of docs/perf-rdma.md (bench-rdma.sh runs it for both in the same guest).
 *
 *   bench_rdma tcp|rdma ADDR DIR [--rtt N] [--bytes SIZE] [W...]   (default W: 4 16)
 *
 * Prints one markdown row: the round trip of a 64-byte control message (median
 * and 99th percentile of N ping-pongs over one connection), the commit latency at
 * each W (a coordinator and W participants, threads of this process with their
 * own connections; median over 10 steps of: last PREPARE sent -> last rank has
 * the decision, which includes the durable LMDB commit in DIR), and the
 * throughput of one SIZE-byte message (default 256 MiB; send start -> the
 * receiver has all of it).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit.h"
#include "io/io.h"
#include "manifest/manifest.h"
#include "net/net.h"
#include "synth.h"

#define TMO      120000
#define STEPS    10
#define NTENSORS 32
#define ROWS     (1u << 16)

static int transport;
static const char *addr;

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- pairs */

struct conn_job {
	unsigned port;
	struct net_conn *c;
	int rc;
};

static void *connect_thread(void *p)
{
	struct conn_job *j = p;
	j->rc = net_connect(transport, NULL, addr, j->port, TMO, &j->c);
	return NULL;
}

static int pair_open(struct net_listener **l, struct net_conn **srv, struct net_conn **cli)
{
	int rc = net_listen(transport, NULL, addr, 0, l);
	if (rc)
		return rc;
	struct conn_job j = { .port = net_listener_port(*l) };
	pthread_t th;
	pthread_create(&th, NULL, connect_thread, &j);
	rc = net_accept(*l, TMO, srv);
	pthread_join(th, NULL);
	*cli = j.c;
	return rc ? rc : j.rc;
}

/* ---------------------------------------------------------------- round trip */

struct echo_job {
	struct net_conn *c;
	int n;
};

static void *echo_thread(void *p)
{
	struct echo_job *e = p;
	for (int i = 0; i < e->n; i++) {
		struct net_msg m;
		if (net_recv(e->c, &m, TMO) || net_send(e->c, m.type, m.payload, m.len, TMO))
			return NULL;
		net_msg_free(&m);
	}
	return NULL;
}

static int bench_rtt(int n, double *median_us, double *p99_us)
{
	struct net_listener *l;
	struct net_conn *s = NULL, *c = NULL;
	int rc = pair_open(&l, &s, &c);
	if (rc)
		return rc;
	struct echo_job e = { .c = s, .n = n };
	pthread_t th;
	pthread_create(&th, NULL, echo_thread, &e);
	uint64_t *t = calloc((size_t)n, sizeof *t);
	uint8_t msg[64] = { 1 };
	for (int i = 0; i < n && !rc; i++) {
		uint64_t t0 = ckpt_now_ns();
		struct net_msg m;
		rc = net_send(c, NET_MSG_USER_FIRST, msg, sizeof msg, TMO);
		if (!rc)
			rc = net_recv(c, &m, TMO);
		if (!rc)
			net_msg_free(&m);
		t[i] = ckpt_now_ns() - t0;
	}
	pthread_join(th, NULL);
	qsort(t, (size_t)n, sizeof *t, cmp_u64);
	*median_us = (double)t[n / 2] / 1e3;
	*p99_us = (double)t[(size_t)n * 99 / 100] / 1e3;
	free(t);
	net_close(c);
	net_close(s);
	net_listener_close(l);
	return rc;
}

/* ---------------------------------------------------------------- throughput */

struct big_job {
	struct net_conn *c;
	const void *p;
	size_t len;
	int rc;
};

static void *big_send_thread(void *p)
{
	struct big_job *b = p;
	b->rc = net_send(b->c, NET_MSG_USER_FIRST, b->p, b->len, TMO);
	return NULL;
}

static int bench_bulk(size_t bytes, double *mib_s)
{
	struct net_listener *l;
	struct net_conn *s = NULL, *c = NULL;
	int rc = pair_open(&l, &s, &c);
	if (rc)
		return rc;
	net_conn_set_max_msg(s, bytes);
	uint8_t *buf = malloc(bytes);
	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < bytes; i += 4096)
		buf[i] = (uint8_t)i;   /* touched: page faults are not part of the figure */
	struct big_job b = { .c = c, .p = buf, .len = bytes };
	uint64_t t0 = ckpt_now_ns();
	pthread_t th;
	pthread_create(&th, NULL, big_send_thread, &b);
	struct net_msg m;
	rc = net_recv(s, &m, TMO);
	uint64_t t1 = ckpt_now_ns();
	pthread_join(th, NULL);
	if (!rc && m.len != bytes)
		rc = -EIO;
	net_msg_free(&m);
	*mib_s = (double)bytes / 1048576.0 / ((double)(t1 - t0) / 1e9);
	free(buf);
	net_close(c);
	net_close(s);
	net_listener_close(l);
	return rc ? rc : b.rc;
}

/* ---------------------------------------------------------------- commit */


struct rank_arg {
	struct commit_part *p;
	uint32_t rank, world;
	uint64_t step;
	pthread_barrier_t *bar;
	uint64_t sent_ns, decided_ns;
	int rc;
};

static void *rank_main(void *p)
{
	struct rank_arg *a = p;
	void *ix = NULL;
	size_t len = 0;
	uint64_t save_id = 0;
	a->rc = commit_part_begin(a->p, a->step, &save_id);
	if (!a->rc)
		a->rc = synth_rows_encode(a->step, a->rank, a->world, save_id, NTENSORS, ROWS, 64, &ix, &len);
	pthread_barrier_wait(a->bar);   /* every rank ready: vote together */
	if (!a->rc) {
		struct commit_vote v = { .rank = a->rank, .step = a->step, .save_id = save_id, .index = ix,
		                         .index_len = len, .file_size = 1 };
		a->rc = commit_part_prepare(a->p, &v);
		a->sent_ns = ckpt_now_ns();
		if (!a->rc)
			a->rc = commit_part_wait(a->p, a->step, TMO);
		a->decided_ns = ckpt_now_ns();
	}
	free(ix);
	return NULL;
}

static int bench_commit_w(const char *dir, uint32_t w, double *median_us)
{
	char root[4096];
	snprintf(root, sizeof root, "%s/bench-rdma-%u-%d", dir, w, transport);
	char cmd[4200];
	snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", root, root);
	if (system(cmd))
		return -EIO;
	struct manifest *m;
	int rc = manifest_open(root, MANIFEST_CREATE, &m);
	if (rc)
		return rc;
	struct commit_coord *co;
	struct commit_coord_opts o = { .manifest = m, .job_id = "bench", .world = w,
	                               .transport = transport, .addr = addr, .timeout_ms = TMO };
	if ((rc = commit_coord_start(&o, &co))) {
		manifest_close(m);
		return rc;
	}
	struct commit_part **parts = calloc(w, sizeof *parts);
	struct rank_arg *args = calloc(w, sizeof *args);
	pthread_t *th = calloc(w, sizeof *th);
	for (uint32_t r = 0; r < w && !rc; r++) {
		struct commit_part_opts po = { .transport = transport, .addr = addr,
		                               .port = commit_coord_port(co), .job_id = "bench",
		                               .rank = r, .world = w, .timeout_ms = TMO };
		rc = commit_part_connect(&po, &parts[r]);
	}
	uint64_t e2e[STEPS];
	for (int s = 0; s < STEPS && !rc; s++) {
		pthread_barrier_t bar;
		pthread_barrier_init(&bar, NULL, w);
		for (uint32_t r = 0; r < w; r++) {
			args[r] = (struct rank_arg){ .p = parts[r], .rank = r, .world = w,
			                             .step = (uint64_t)s + 1, .bar = &bar };
			pthread_create(&th[r], NULL, rank_main, &args[r]);
		}
		uint64_t last_sent = 0, last_dec = 0;
		for (uint32_t r = 0; r < w; r++) {
			pthread_join(th[r], NULL);
			if (args[r].rc && !rc)
				rc = args[r].rc;
			if (args[r].sent_ns > last_sent) last_sent = args[r].sent_ns;
			if (args[r].decided_ns > last_dec) last_dec = args[r].decided_ns;
		}
		pthread_barrier_destroy(&bar);
		e2e[s] = last_dec - last_sent;
	}
	if (!rc) {
		qsort(e2e, STEPS, sizeof *e2e, cmp_u64);
		*median_us = (double)e2e[STEPS / 2] / 1e3;
	}
	for (uint32_t r = 0; r < w; r++)
		commit_part_close(parts[r]);
	commit_coord_stop(co);
	manifest_close(m);
	free(parts);
	free(args);
	free(th);
	snprintf(cmd, sizeof cmd, "rm -rf %s", root);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", root);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 4 || (strcmp(argv[1], "tcp") && strcmp(argv[1], "rdma"))) {
		fprintf(stderr, "usage: bench_rdma tcp|rdma ADDR DIR [--rtt N] [--bytes SIZE] [W...]\n");
		return 2;
	}
	transport = strcmp(argv[1], "rdma") ? NET_TCP : NET_RDMA;
	addr = argv[2];
	const char *dir = argv[3];
	int rtt_n = 1000;
	uint64_t bytes = 256u << 20;
	uint32_t ws[8];
	int nw = 0;
	for (int i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--rtt") && i + 1 < argc)
			rtt_n = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
			ckpt_parse_size(argv[++i], &bytes);
		else if (nw < 8)
			ws[nw++] = (uint32_t)strtoul(argv[i], NULL, 10);
	}
	if (!nw) {
		ws[0] = 4;
		ws[1] = 16;
		nw = 2;
	}
	if (rtt_n < 10)
		rtt_n = 10;
	double med, p99, mib_s, c_us[8];
	int rc = bench_rtt(rtt_n, &med, &p99);
	for (int i = 0; i < nw && !rc; i++)
		rc = bench_commit_w(dir, ws[i], &c_us[i]);
	if (!rc)
		rc = bench_bulk((size_t)bytes, &mib_s);
	if (rc) {
		fprintf(stderr, "bench_rdma %s: %s\n", argv[1], ckpt_last_error());
		return 1;
	}
	printf("| %s | %.0f | %.0f |", argv[1], med, p99);
	for (int i = 0; i < nw; i++)
		printf(" %.0f |", c_us[i]);
	printf(" %.1f |\n", mib_s);
	return 0;
}
