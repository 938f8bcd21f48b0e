/*
 * ckptd_fixture.c — an in-process ckptd, honest ranks and hostile peers for
 * test_ckptd_hostile.c (ckptd_fixture.h says what each part does).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "ckpt/ckpt.h"
#include "ckptd_fixture.h"
#include "testutil.h"

char *top;
char data_dir[4200];
struct ckptd_counters counters;
struct ckptd_server *srv;
pthread_t runner;
unsigned port;
char b_rel[128];
int fixture_transport = NET_TCP;
const char *fixture_host = "127.0.0.1";
static struct ckptd_jobs *jobs;
static char *b_snapshot;        /* B's step files: names and hashes */

/* ------------------------------------------------------------------ the log */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char *log_text;
static size_t log_len;

static void log_collect(void *arg, int level, const struct ckpt_log_ctx *where, const char *msg)
{
	(void)arg, (void)level, (void)where;
	size_t n = strlen(msg);
	pthread_mutex_lock(&log_lock);
	if (log_len + n + 2 < (8u << 20)) {
		char *p = realloc(log_text, log_len + n + 2);
		if (p) {
			log_text = p;
			memcpy(p + log_len, msg, n);
			p[log_len + n] = '\n';
			p[log_len + n + 1] = '\0';
			log_len += n + 1;
		}
	}
	pthread_mutex_unlock(&log_lock);
	if (getenv("CKPT_TEST_VERBOSE"))
		fprintf(stderr, "log: %s\n", msg);
}

bool log_has(const char *needle)
{
	pthread_mutex_lock(&log_lock);
	bool found = log_text && strstr(log_text, needle);
	pthread_mutex_unlock(&log_lock);
	return found;
}

/* ------------------------------------------------------------------ honest ranks */

static void honest_data(const char *job, uint64_t step, float *w)
{
	tu_fill(w, sizeof(float) * HN, tu_seed() ^ (uint64_t)job[3], step);
}

ckpt_ctx *honest_open(const char *job, const char *secret, unsigned flags)
{
	return honest_open_sized(job, secret, flags, 64u << 10, 1u << 20);
}

ckpt_ctx *honest_open_sized(const char *job, const char *secret, unsigned flags,
                            size_t chunk_bytes, size_t pool_bytes)
{
	static char target[128];
	snprintf(target, sizeof target, "ckptd://%s:%u", fixture_host, port);
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.target = target;
	o.rank = 0;
	o.world = 1;
	o.flags = flags;
	o.job_id = job;
	o.secret = secret;
	o.secret_len = strlen(secret);
	o.chunk_bytes = chunk_bytes;
	o.pool_bytes = pool_bytes;
	o.timeout_ms = 20000;
	if (fixture_transport == NET_RDMA)
		o.transport = CKPT_TRANSPORT_RDMA;
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "job %s: open: %s", job, ckpt_last_error());
	return c;
}

void honest_save(const char *job, const char *secret, uint64_t step)
{
	ckpt_ctx *c = honest_open(job, secret, 0);
	honest_save_with(c, job, step);
	ckpt_close(c);
}

void honest_save_with(ckpt_ctx *c, const char *job, uint64_t step)
{
	static float w[HN];
	honest_data(job, step, w);
	ckpt_save *s;
	ck_assert_msg(ckpt_save_begin(c, step, &s) == 0, "job %s: %s", job, ckpt_last_error());
	uint64_t shape[1] = { HN };
	struct ckpt_tensor t = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
	                         .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape, .data = w };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "job %s step %llu: save: %s", job,
	              (unsigned long long)step, ckpt_last_error());
	ckpt_save_free(s);
}

void honest_load(const char *job, const char *secret, uint64_t step)
{
	static float w[HN], got[HN];
	honest_data(job, step, w);
	ckpt_ctx *c = honest_open(job, secret, CKPT_OPEN_READONLY);
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, step, &l) == 0, "job %s step %llu: %s", job,
	              (unsigned long long)step, ckpt_last_error());
	memset(got, 0, sizeof got);
	ck_assert_msg(ckpt_load_tensor(l, "w", CKPT_F32, 1, NULL, NULL, got, CKPT_MEM_HOST) == 0,
	              "job %s step %llu: %s", job, (unsigned long long)step, ckpt_last_error());
	ck_assert_msg(memcmp(w, got, sizeof w) == 0, "job %s step %llu: loaded bytes differ", job,
	              (unsigned long long)step);
	ckpt_load_close(l);
	ckpt_close(c);
}

/* ------------------------------------------------------------------ what must hold */

/* Every connection gone (also those ckptd closes itself), then every buffer free. */
void wait_idle(void)
{
	for (int i = 0; i < WAIT_MS / 10 && atomic_load(&counters.active_connections); i++)
		usleep(10000);
	ck_assert_msg(atomic_load(&counters.active_connections) == 0, "%lld connections still open",
	              (long long)atomic_load(&counters.active_connections));
	struct ckptd_gauges g;
	ckptd_server_gauges(srv, &g);
	ck_assert_uint_eq(g.pool_bytes, (uint64_t)NBUFS * BUF_BYTES);
	ck_assert_msg(g.pool_used_bytes == 0, "%llu bytes of the pool held with no connection",
	              (unsigned long long)g.pool_used_bytes);
}

/* Paths ckptd may have made: its lock, and anything under a job's own directory. */
static void walk_check(const char *dir, const char *rel)
{
	DIR *d = opendir(dir);
	ck_assert_msg(d != NULL, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char p[4400], r[4400];
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		snprintf(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
		static const char *const known[] = { "jobs", "a.secret", "b.secret", "q.secret",
		                                     "data", "data/jobs", "data/ckptd.lock" };
		bool ok = false;
		for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
			ok |= !strcmp(r, known[i]);
		static const char *const job_dirs[] = { "data/jobs/joba", "data/jobs/jobb",
		                                        "data/jobs/jobq" };
		bool inside = false;
		for (size_t i = 0; i < 3; i++) {
			size_t n = strlen(job_dirs[i]);
			inside |= !strncmp(r, job_dirs[i], n) && (r[n] == '\0' || r[n] == '/');
		}
		ck_assert_msg(ok || inside, "ckptd made %s, outside every job's directory", r);
		struct stat st;
		if (!inside && lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
			walk_check(p, r);
	}
	closedir(d);
}

/* Names and content hashes of B's step files, one line each. */
static char *snapshot_b(void)
{
	char dir[4400];
	snprintf(dir, sizeof dir, "%s/jobs/jobb/step-00000000000000000001", data_dir);
	size_t cap = 4096, len = 0;
	char *out = calloc(1, cap);
	DIR *d = opendir(dir);
	ck_assert_msg(d != NULL, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char p[4700];
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		void *buf;
		size_t n;
		ck_assert_int_eq(tu_read_file(p, &buf, &n), 0);
		uint8_t h[CKPT_HASH_BYTES];
		io_hash128(buf, n, h);
		free(buf);
		ck_assert(len + 512 < cap);
		len += (size_t)snprintf(out + len, cap - len, "%s %zu %02x%02x%02x%02x%02x%02x%02x%02x\n",
		                        e->d_name, n, h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
	}
	closedir(d);
	return out;
}

/* What every attack must leave behind. */
void after_attack(void)
{
	static uint64_t step = 100;
	wait_idle();
	walk_check(top, "");
	char *now = snapshot_b();
	ck_assert_msg(!strcmp(now, b_snapshot), "job B's files changed:\nbefore:\n%s\nafter:\n%s",
	              b_snapshot, now);
	free(now);
	honest_load("jobb", SECRET_B, 1);
	honest_save("joba", SECRET_A, step);
	honest_load("joba", SECRET_A, step);
	step++;
	wait_idle();
}

/* ------------------------------------------------------------------ the server */

static void *run_main(void *arg)
{
	ckptd_server_run(arg);
	return NULL;
}

static void put_file(const char *name, const char *text)
{
	char p[4400];
	snprintf(p, sizeof p, "%s/%s", top, name);
	ck_assert_int_eq(tu_write_file(p, text, strlen(text)), 0);
	ck_assert_int_eq(chmod(p, 0600), 0);
}

void hostile_setup(void)
{
	top = tu_tmpdir("ckptd-hostile");
	ckpt_log_set(log_collect, NULL);
	put_file("a.secret", SECRET_A);
	put_file("b.secret", SECRET_B);
	put_file("q.secret", SECRET_Q);
	put_file("jobs", "joba secret-file=a.secret\n"
	                 "jobb secret-file=b.secret\n"
	                 "jobq secret-file=q.secret quota=1M\n");
	snprintf(data_dir, sizeof data_dir, "%s/data", top);
	ck_assert_int_eq(mkdir(data_dir, 0700), 0);
	char p[4400];
	snprintf(p, sizeof p, "%s/jobs", top);
	ck_assert_msg(ckptd_jobs_load(p, &jobs) == 0, "%s", ckpt_err_msg());
	memset(&counters, 0, sizeof counters);
	struct ckptd_server_opts so = {
		.listen_host = fixture_host, .listen_port = 0, .data = data_dir,
		.pool_bytes = (size_t)NBUFS * BUF_BYTES, .buf_bytes = BUF_BYTES, .max_conns = 64,
		.timeout_ms = TIMEOUT_MS, .handshake_ms = TIMEOUT_MS, .queue_depth = 4,
		.transport = fixture_transport, .jobs = jobs,
		.counters = &counters, .log_fn = log_collect, .log_level = CKPT_LOG_INFO,
		.idle_ms = IDLE_MS, .max_index = MAX_INDEX,
	};
	ck_assert_msg(ckptd_server_start(&so, &srv) == 0, "%s", ckpt_err_msg());
	port = ckptd_server_port(srv);
	ck_assert_int_eq(pthread_create(&runner, NULL, run_main, srv), 0);

	/* Job B's checkpoint, which no attack may touch. */
	honest_save("jobb", SECRET_B, 1);
	snprintf(p, sizeof p, "%s/jobs/jobb/step-00000000000000000001", data_dir);
	DIR *d = opendir(p);
	ck_assert(d != NULL);
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			snprintf(b_rel, sizeof b_rel, "step-00000000000000000001/%s", e->d_name);
	closedir(d);
	ck_assert_msg(b_rel[0], "job B has no shard file");
	b_snapshot = snapshot_b();
}

void hostile_teardown(void)
{
	if (srv) {                 /* a test may have stopped it itself */
		ckptd_server_stop(srv, 0);
		pthread_join(runner, NULL);
		ckptd_server_free(srv);
		srv = NULL;
	}
	ckptd_jobs_free(jobs);
	ckpt_log_set(NULL, NULL);
	pthread_mutex_lock(&log_lock);
	free(log_text);
	log_text = NULL;
	log_len = 0;
	pthread_mutex_unlock(&log_lock);
	free(b_snapshot);
	tu_rmtree(top);
	free(top);
}

/* ------------------------------------------------------------------ raw peers */

int raw_connect(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s",
	              strerror(errno));
	return fd;
}

void raw_write(int fd, const void *p, size_t n)
{
	/* The peer may close while we write: that is its answer, not our failure. */
	(void)!send(fd, p, n, MSG_NOSIGNAL);
}

void raw_header(uint8_t h[NET_HEADER_BYTES], uint16_t version, uint16_t type, uint32_t len)
{
	memcpy(h, "CKNM", 4);
	ckpt_put_le16(h + 4, version);
	ckpt_put_le16(h + 6, type);
	ckpt_put_le16(h + 8, 0);
	ckpt_put_le16(h + 10, 0);
	ckpt_put_le32(h + 12, len);
}

/* The server closes fd within WAIT_MS (whatever it says first is read and dropped). */
void raw_expect_closed(int fd, const char *what)
{
	uint8_t b[4096];
	for (int waited = 0;; waited += 100) {
		ck_assert_msg(waited < WAIT_MS, "%s: ckptd did not close the connection", what);
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t n = recv(fd, b, sizeof b, 0);
		if (n <= 0)
			break;
	}
	close(fd);
}

/* A connection of job as rank 0 of world, through the handshake. */
struct net_conn *conn_as(const char *job, const char *secret, uint32_t world)
{
	struct net_conn *c;
	ck_assert_msg(net_connect(fixture_transport, NULL, fixture_host, port, WAIT_MS, &c) == 0,
	              "%s", ckpt_err_msg());
	struct net_auth a = { .job_id = job, .rank = 0, .world = world, .secret = secret,
	                      .secret_len = strlen(secret) };
	ck_assert_msg(net_handshake_client(c, &a, WAIT_MS) == 0, "handshake as %s: %s", job,
	              ckpt_err_msg());
	net_conn_set_max_msg(c, REMOTE_MAX_READ);
	return c;
}

struct net_conn *conn_a(void) { return conn_as("joba", SECRET_A, 1); }

/* The handshake of job with secret fails with code, the message holding needle. */
void expect_refused(const char *job, const char *secret, int code, const char *needle)
{
	struct net_conn *c;
	ck_assert_int_eq(net_connect(fixture_transport, NULL, fixture_host, port, WAIT_MS, &c), 0);
	struct net_auth a = { .job_id = job, .rank = 0, .world = 1, .secret = secret,
	                      .secret_len = strlen(secret) };
	int rc = net_handshake_client(c, &a, WAIT_MS);
	ck_assert_msg(rc == code && strstr(ckpt_err_msg(), needle), "job '%s': handshake returned "
	              "%d (want %d): %s (want '%s')", job, rc, code, ckpt_err_msg(), needle);
	net_close(c);
}

void send_msg(struct net_conn *c, uint16_t type, const void *p, size_t n)
{
	ck_assert_msg(net_send(c, type, p, n, WAIT_MS) == 0, "send of type %u: %s", type,
	              ckpt_err_msg());
}

void send_buf(struct net_conn *c, uint16_t type, struct ckpt_buf *b)
{
	ck_assert(b->ok);
	send_msg(c, type, b->p, b->len);
	ckpt_buf_free(b);
}

/* ckptd closes c (its log names why: log_needle) without answering anything but,
 * at most, an ERROR. */
void expect_closed(struct net_conn *c, const char *log_needle)
{
	struct net_msg m;
	int rc;
	while ((rc = net_recv(c, &m, WAIT_MS)) == 0) {
		ck_assert_msg(m.type == REMOTE_MSG_ERROR, "answer of type %u where a close was due",
		              m.type);
		net_msg_free(&m);
	}
	ck_assert_msg(rc != -ETIMEDOUT, "ckptd did not close the connection (%s)",
	              log_needle ? log_needle : "");
	net_close(c);
	for (int i = 0; log_needle && i < 100 && !log_has(log_needle); i++)
		usleep(10000);
	ck_assert_msg(!log_needle || log_has(log_needle), "ckptd's log does not say '%s'",
	              log_needle);
}

/* ckptd answers ERROR{code, message holding needle}, then closes c. */
void expect_error(struct net_conn *c, int code, const char *needle)
{
	struct net_msg m;
	int rc = net_recv(c, &m, WAIT_MS);
	ck_assert_msg(rc == 0, "no ERROR (want %d, '%s'): %s", code, needle, ckpt_err_msg());
	ck_assert_msg(m.type == REMOTE_MSG_ERROR, "type %u where ERROR (%d, '%s') was due", m.type,
	              code, needle);
	rc = remote_error_take(m.payload, m.len, "ckptd");
	net_msg_free(&m);
	ck_assert_msg(rc == code && strstr(ckpt_err_msg(), needle),
	              "ERROR %d (want %d): '%s' (want '%s')", rc, code, ckpt_err_msg(), needle);
	expect_closed(c, NULL);
}

void expect_answer(struct net_conn *c, uint16_t type, struct net_msg *m)
{
	int rc = net_recv(c, m, WAIT_MS);
	ck_assert_msg(rc == 0, "no answer of type %u: %s", type, ckpt_err_msg());
	if (m->type == REMOTE_MSG_ERROR) {
		rc = remote_error_take(m->payload, m->len, "ckptd");
		ck_abort_msg("ERROR %d where type %u was due: %s", rc, type, ckpt_err_msg());
	}
	ck_assert_uint_eq(m->type, type);
}

/* ------------------------------------------------------------------ messages */

void send_open(struct net_conn *c, uint64_t step, uint64_t save_id, uint32_t block_bytes,
               uint64_t size_hint)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_encode(&b, &(struct remote_open){ .step = step, .save_id = save_id,
	                   .block_bytes = block_bytes, .size_hint = size_hint,
	                   .chunk_bytes = 64u << 10 });
	send_buf(c, REMOTE_MSG_OPEN, &b);
}

void tensor_msg(struct ckpt_buf *b, const char *name, uint64_t bytes)
{
	uint64_t shape[1] = { bytes }, off[1] = { 0 };
	struct io_tensor_desc t = { .name = name, .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8,
	                            .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape,
	                            .offset = off, .extent = shape, .raw_bytes = bytes };
	ckpt_buf_init(b);
	remote_tensor_encode(b, &t);
}

/* OPEN (answered OPEN_OK with the pool's buffer size), then TENSOR "w" of bytes. */
void start_stream(struct net_conn *c, uint64_t step, uint64_t bytes)
{
	start_stream_of(c, step, STREAM_SID, bytes);
}

void send_one_chunk_shard(struct net_conn *c, uint64_t step, uint64_t save_id, uint64_t bytes,
                          uint8_t fill)
{
	start_stream_of(c, step, save_id, bytes);
	send_chunk(c, 0, bytes);
	send_data(c, (size_t)bytes, fill);
}

uint32_t open_with_flags(struct net_conn *c, uint64_t step, uint32_t flags)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	remote_open_encode(&b, &(struct remote_open){ .step = step, .save_id = STREAM_SID,
	                   .block_bytes = 1u << 20, .chunk_bytes = 64u << 10, .flags = flags });
	send_buf(c, REMOTE_MSG_OPEN, &b);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_OPEN_OK, &m);
	uint64_t max;
	uint32_t got;
	ck_assert_int_eq(remote_open_ok_decode(m.payload, m.len, &max, &got), 0);
	ck_assert_uint_eq(max, BUF_BYTES);
	net_msg_free(&m);
	return got;
}

void finish_small_shard(struct net_conn *c, uint8_t fill)
{
	struct ckpt_buf b;
	tensor_msg(&b, "w", 8192);
	send_buf(c, REMOTE_MSG_TENSOR, &b);
	send_chunk(c, 0, 8192);
	send_data(c, 8192, fill);
	send_msg(c, REMOTE_MSG_FINISH, NULL, 0);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_DURABLE, &m);
	net_msg_free(&m);
	net_close(c);
}

void start_stream_of(struct net_conn *c, uint64_t step, uint64_t save_id, uint64_t bytes)
{
	send_open(c, step, save_id, 1u << 20, 0);
	struct net_msg m;
	expect_answer(c, REMOTE_MSG_OPEN_OK, &m);
	ck_assert_uint_eq(m.len, 8);
	ck_assert_uint_eq(ckpt_get_le64(m.payload), BUF_BYTES);
	net_msg_free(&m);
	struct ckpt_buf b;
	tensor_msg(&b, "w", bytes);
	send_buf(c, REMOTE_MSG_TENSOR, &b);
}

void chunk_msg(struct ckpt_buf *b, uint32_t tensor, uint64_t len)
{
	static uint8_t blocks[64 * CKPT_HASH_BYTES];
	struct remote_chunk ch = { .tensor = tensor, .codec = IO_CODEC_RAW, .raw_len = len,
	                           .stored_len = len, .block_bytes = 1u << 20,
	                           .nblocks = (uint32_t)io_nblocks(len, 1u << 20), .blocks = blocks };
	memset(ch.hash, 0x5a, sizeof ch.hash);
	ckpt_buf_init(b);
	remote_chunk_encode(b, &ch, false);
}

void send_chunk(struct net_conn *c, uint32_t tensor, uint64_t len)
{
	struct ckpt_buf b;
	chunk_msg(&b, tensor, len);
	send_buf(c, REMOTE_MSG_CHUNK, &b);
}

void send_data(struct net_conn *c, size_t len, uint8_t fill)
{
	void *p = malloc(len ? len : 1);
	memset(p, fill, len);
	send_msg(c, REMOTE_MSG_DATA, p, len);
	free(p);
}

/* The 16 bytes of a frame header on c's socket: what follows is up to the caller. */
void send_header(struct net_conn *c, uint16_t type, uint32_t len)
{
	uint8_t h[NET_HEADER_BYTES];
	raw_header(h, NET_PROTO_VERSION, type, len);
	raw_write(net_conn_fd(c), h, sizeof h);
}

void read_msg(struct ckpt_buf *b, const char *path, uint64_t off, uint64_t len)
{
	ckpt_buf_init(b);
	remote_read_encode(b, path, off, len);
}

/* A READ of path by job A is answered ERROR{code, needle}. */
void expect_read_error(const char *path, uint64_t off, uint64_t len, int code,
                       const char *needle)
{
	struct net_conn *c = conn_a();
	struct ckpt_buf b;
	read_msg(&b, path, off, len);
	send_buf(c, REMOTE_MSG_READ, &b);
	expect_error(c, code, needle);
}

/* A CHECK by job A is answered ERROR{code, needle}. By hand: remote_check_encode
 * would not send a path longer than REMOTE_MAX_PATH. */
void expect_check_error(const char *path, uint64_t size, int code, const char *needle)
{
	struct net_conn *c = conn_a();
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ckpt_buf_u16(&b, (uint16_t)strlen(path));
	ckpt_buf_put(&b, path, strlen(path));
	ckpt_buf_u64(&b, size);
	ckpt_buf_u64(&b, 4096);
	ckpt_buf_u64(&b, 100);
	uint8_t hash[CKPT_HASH_BYTES] = { 0 };
	ckpt_buf_put(&b, hash, sizeof hash);
	send_buf(c, REMOTE_MSG_CHECK, &b);
	expect_error(c, code, needle);
}

