/*
 * test_meta.c — a step's user metadata (ckpt_save_set_meta, ckpt_step_meta) and the
 * retention a job applies after each commit (ckpt_opts.keep_last, keep_every,
 * keep_seconds, and their environment variables), through the public API: round
 * trips, every refusal, rank 0's metadata in a job of two, and a save in flight
 * that retention must not touch.
 *
 * Data comes from tu_seed() (printed; CKPT_TEST_SEED reproduces a run).
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "testutil.h"

static char *root;

static void setup(void)
{
	root = tu_tmpdir("meta");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	unsetenv("CKPT_KEEP_LAST");
	unsetenv("CKPT_KEEP_EVERY");
	unsetenv("CKPT_KEEP_SECONDS");
}

static void teardown(void)
{
	tu_rmtree(root);
	free(root);
	root = NULL;
}

static void opts_for(struct ckpt_opts *o, int rank, int world, unsigned flags)
{
	ckpt_opts_init(o, sizeof *o);
	o->root = root;
	o->rank = rank;
	o->world = world;
	o->flags = flags;
	o->chunk_bytes = 8192;
	o->pool_bytes = 16 * 8192;
	o->timeout_ms = 10000;
	o->secret = "meta-test-job-secret";
	o->secret_len = strlen(o->secret);
}

static ckpt_ctx *open_keep(uint64_t last, uint64_t every, uint64_t seconds, unsigned flags)
{
	struct ckpt_opts o;
	opts_for(&o, 0, 1, flags);
	o.keep_last = last;
	o.keep_every = every;
	o.keep_seconds = seconds;
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "open: %s", ckpt_last_error());
	return c;
}

/* The bytes of step's tensor "w" (N floats), from the seed. */
#define N 1000
static void data_of(uint64_t step, float *w)
{
	tu_fill(w, N * sizeof *w, tu_seed(), step);
}

static void add_w(ckpt_save *s, uint64_t step, float *w)
{
	data_of(step, w);
	uint64_t shape[1] = { N };
	struct ckpt_tensor t = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		.policy = CKPT_REPLICATED, .ndim = 1, .global_shape = shape, .data = w };
	ck_assert_msg(ckpt_save_add_tensor(s, &t) == 0, "%s", ckpt_last_error());
}

/* Save step on c with metadata meta (NULL: none); the save's result. */
static int save_meta(ckpt_ctx *c, uint64_t step, const char *meta)
{
	static float w[N];
	ckpt_save *s;
	int rc = ckpt_save_begin(c, step, &s);
	if (rc)
		return rc;
	add_w(s, step, w);
	if (meta)
		ck_assert_msg(ckpt_save_set_meta(s, meta, strlen(meta)) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	rc = ckpt_save_wait(s, -1);
	ckpt_save_free(s);
	return rc;
}

static void check_w(ckpt_ctx *c, uint64_t step)
{
	static float want[N], got[N];
	data_of(step, want);
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, step, &l) == 0, "step %llu: %s", (unsigned long long)step,
	              ckpt_last_error());
	ck_assert_int_eq(ckpt_load_tensor(l, "w", CKPT_F32, 1, NULL, NULL, got, CKPT_MEM_HOST), 0);
	ck_assert(memcmp(got, want, sizeof got) == 0);
	ckpt_load_close(l);
}

/* The committed steps of the root, as a string "1,3,5". */
static void committed(ckpt_ctx *c, char *out, size_t cap)
{
	struct ckpt_step_info st[64];
	int n = ckpt_steps(c, 0, st, 64, sizeof st[0]);
	ck_assert_int_ge(n, 0);
	ck_assert_int_le(n, 64);
	out[0] = '\0';
	for (int i = 0; i < n; i++)
		snprintf(out + strlen(out), cap - strlen(out), "%s%llu", i ? "," : "",
		         (unsigned long long)st[i].step);
}

/* ------------------------------------------------------------------ metadata */

START_TEST(meta_round_trip)
{
	ckpt_ctx *c = open_keep(0, 0, 0, 0);
	uint64_t rng = tu_seed() ^ 0x3E7A;
	char meta[256];
	snprintf(meta, sizeof meta, "{\"loss\": %llu.5, \"tokens\": %llu, \"name\": \"r\\u00e9sum\\u00e9 \xc3\xa9\"}",
	         (unsigned long long)(tu_rand(&rng) % 1000), (unsigned long long)tu_rand(&rng));
	ck_assert_int_eq(save_meta(c, 10, "{\"first\": true}"), 0);
	/* Set twice: the second replaces the first. */
	static float w[N];
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 20, &s), 0);
	add_w(s, 20, w);
	ck_assert_int_eq(ckpt_save_set_meta(s, "{\"replaced\": 1}", 15), 0);
	ck_assert_int_eq(ckpt_save_set_meta(s, meta, strlen(meta)), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_set_meta(s, "{}", 2), CKPT_ESTATE);
	ck_assert(strstr(ckpt_last_error(), "step 20") != NULL);
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	ck_assert_int_eq(ckpt_save_set_meta(s, "{}", 2), CKPT_ESTATE);
	ckpt_save_free(s);
	ck_assert_int_eq(save_meta(c, 30, NULL), 0);

	char buf[512];
	size_t len = 12345;
	ck_assert_int_eq(ckpt_step_meta(c, 20, buf, sizeof buf, &len), 0);
	ck_assert_uint_eq(len, strlen(meta));
	ck_assert_str_eq(buf, meta);                          /* NUL-terminated, byte for byte */
	ck_assert_int_eq(ckpt_step_meta(c, 10, buf, sizeof buf, &len), 0);
	ck_assert_str_eq(buf, "{\"first\": true}");
	/* Without metadata: 0 bytes; the latest is step 30. */
	buf[0] = 'x';
	ck_assert_int_eq(ckpt_step_meta(c, CKPT_LATEST, buf, sizeof buf, &len), 0);
	ck_assert_uint_eq(len, 0);
	ck_assert_int_eq(buf[0], '\0');
	/* The length alone; too small a buffer; exactly the length (no room for NUL). */
	ck_assert_int_eq(ckpt_step_meta(c, 20, NULL, 0, &len), -ENOSPC);
	ck_assert_uint_eq(len, strlen(meta));
	memset(buf, 'y', sizeof buf);
	ck_assert_int_eq(ckpt_step_meta(c, 20, buf, strlen(meta) - 1, &len), -ENOSPC);
	ck_assert_uint_eq(len, strlen(meta));
	ck_assert(strstr(ckpt_last_error(), "step 20") != NULL);
	ck_assert_int_eq(buf[0], 'y');                         /* nothing copied */
	ck_assert_int_eq(ckpt_step_meta(c, 20, buf, strlen(meta), &len), 0);
	ck_assert(memcmp(buf, meta, len) == 0 && buf[len] == 'y');
	ck_assert_int_eq(ckpt_step_meta(c, 25, buf, sizeof buf, &len), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckpt_step_meta(c, 20, NULL, 8, &len), -EINVAL);
	ck_assert_int_eq(ckpt_step_meta(c, 20, buf, sizeof buf, NULL), -EINVAL);
	ckpt_close(c);

	/* A read-only context (the tools) reads it too, and the steps still load. */
	struct ckpt_opts o;
	opts_for(&o, 0, 1, CKPT_OPEN_READONLY);
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	ck_assert_int_eq(ckpt_step_meta(c, 20, buf, sizeof buf, &len), 0);
	ck_assert_str_eq(buf, meta);
	check_w(c, 20);
	ckpt_close(c);
}
END_TEST

START_TEST(meta_refused)
{
	ckpt_ctx *c = open_keep(0, 0, 0, 0);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 5, &s), 0);
	static const struct { const char *text; const char *needle; } bad[] = {
		{ "{\"a\": 1", "line 1" },               /* not JSON: where it stopped */
		{ "{\"a\": 1} x", "not JSON" },          /* trailing garbage */
		{ "[1, 2]", "not an object" },
		{ "42", "not an object" },
		{ "\"text\"", "not an object" },
		{ "null", "not an object" },
		{ "{\"a\": \"\xff\"}", "not JSON" },     /* ill-formed UTF-8 */
		{ "{\"a\": \"\xc0\xaf\"}", "not JSON" }, /* an overlong form */
		{ "", "empty" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		int rc = ckpt_save_set_meta(s, bad[i].text, strlen(bad[i].text));
		ck_assert_msg(rc == -EINVAL, "'%s': %d", bad[i].text, rc);
		ck_assert_msg(strstr(ckpt_last_error(), bad[i].needle) &&
		              strstr(ckpt_last_error(), "step 5"), "'%s': %s", bad[i].text,
		              ckpt_last_error());
	}
	/* A NUL inside: len covers it. */
	ck_assert_int_eq(ckpt_save_set_meta(s, "{\"a\":\0 1}", 9), -EINVAL);
	ck_assert_int_eq(ckpt_save_set_meta(s, NULL, 3), -EINVAL);
	ck_assert_int_eq(ckpt_save_set_meta(NULL, "{}", 2), -EINVAL);
	/* Too long: -E2BIG before any parsing; exactly the limit is taken. */
	char *big = malloc(CKPT_MAX_META + 2);
	memset(big, ' ', CKPT_MAX_META + 1);
	big[0] = '{';
	big[CKPT_MAX_META - 1] = '}';
	ck_assert_int_eq(ckpt_save_set_meta(s, big, CKPT_MAX_META + 1), -E2BIG);
	ck_assert(strstr(ckpt_last_error(), "CKPT_MAX_META") != NULL);
	ck_assert_msg(ckpt_save_set_meta(s, big, CKPT_MAX_META) == 0, "%s", ckpt_last_error());
	static float w[N];
	add_w(s, 5, w);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
	char *got = malloc(CKPT_MAX_META + 1);
	size_t len;
	ck_assert_int_eq(ckpt_step_meta(c, 5, got, CKPT_MAX_META + 1, &len), 0);
	ck_assert_uint_eq(len, CKPT_MAX_META);
	ck_assert(memcmp(got, big, CKPT_MAX_META) == 0);
	free(got);
	free(big);
	ckpt_close(c);
}
END_TEST

/* A TCP port on 127.0.0.1 that nobody listens on now. */
static unsigned free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	socklen_t len = sizeof a;
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* A job of two ranks, each setting its own metadata: the step keeps rank 0's. Rank 1
 * sets it last, so a "last vote wins" would show. Then a step where only rank 1 sets
 * some: the step has none. */
START_TEST(meta_rank0_wins)
{
	unsigned port = free_port();
	pid_t pids[2];
	for (int r = 0; r < 2; r++) {
		pids[r] = fork();
		ck_assert_int_ge(pids[r], 0);
		if (pids[r] == 0) {
			struct ckpt_opts o;
			opts_for(&o, r, 2, 0);
			o.coord_addr = "127.0.0.1";
			o.coord_port = port;
			ckpt_ctx *c;
			if (ckpt_open(&o, &c))
				_exit(10);
			static float w[N];
			char meta[64];
			snprintf(meta, sizeof meta, "{\"rank\": %d}", r);
			for (uint64_t step = 1; step <= 2; step++) {
				ckpt_save *s;
				if (ckpt_save_begin(c, step, &s))
					_exit(11);
				data_of(step, w);
				uint64_t shape[1] = { N };
				struct ckpt_tensor t = { .name = "w", .kind = CKPT_KIND_MODEL,
					.dtype = CKPT_F32, .policy = CKPT_REPLICATED, .ndim = 1,
					.global_shape = shape, .data = w };
				if (ckpt_save_add_tensor(s, &t))
					_exit(12);
				if (r == 1)
					usleep(200000);
				if ((step == 1 || r == 1) && ckpt_save_set_meta(s, meta, strlen(meta)))
					_exit(13);
				if (ckpt_save_submit(s) || ckpt_save_wait(s, -1)) {
					fprintf(stderr, "rank %d step %llu: %s\n", r,
					        (unsigned long long)step, ckpt_last_error());
					_exit(14);
				}
				ckpt_save_free(s);
			}
			ckpt_close(c);
			_exit(0);
		}
	}
	for (int r = 0; r < 2; r++) {
		int status;
		ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: status 0x%x",
		              r, status);
	}
	struct ckpt_opts o;
	opts_for(&o, 0, 1, CKPT_OPEN_READONLY);
	ckpt_ctx *c;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	char buf[64];
	size_t len;
	ck_assert_int_eq(ckpt_step_meta(c, 1, buf, sizeof buf, &len), 0);
	ck_assert_str_eq(buf, "{\"rank\": 0}");
	ck_assert_int_eq(ckpt_step_meta(c, 2, buf, sizeof buf, &len), 0);
	ck_assert_uint_eq(len, 0);
	check_w(c, 2);
	ckpt_close(c);
}
END_TEST

/* ------------------------------------------------------------------ retention */

START_TEST(keep_last_two)
{
	ckpt_ctx *c = open_keep(2, 0, 0, 0);
	struct ckpt_step_info x;
	for (uint64_t step = 1; step <= 5; step++) {
		ck_assert_int_eq(save_meta(c, step, NULL), 0);
		/* Retention runs after the outcome, on the save worker: step's may still
		 * run, the previous step's is done (the worker ran it before this save). */
		for (uint64_t gone = 1; gone + 3 <= step; gone++)
			ck_assert_msg(ckpt_step_info(c, gone, &x, sizeof x) == CKPT_ENOTFOUND,
			              "step %llu left after step %llu", (unsigned long long)gone,
			              (unsigned long long)step);
	}
	ckpt_close(c);                         /* waits for the last retention */
	/* Nothing of the removed steps is left: neither record nor directory. */
	c = open_keep(0, 0, 0, 0);
	struct ckpt_step_info st[16];
	ck_assert_int_eq(ckpt_steps(c, CKPT_STEPS_ALL, st, 16, sizeof st[0]), 2);
	char got[256];
	committed(c, got, sizeof got);
	ck_assert_str_eq(got, "4,5");
	check_w(c, 4);
	check_w(c, 5);
	ckpt_close(c);
}
END_TEST

START_TEST(keep_every_three)
{
	/* With keep_last 1 too: a step stays if any rule keeps it. */
	setenv("CKPT_KEEP_EVERY", "3", 1);
	ckpt_ctx *c = open_keep(1, 0, 0, 0);
	for (uint64_t step = 1; step <= 7; step++)
		ck_assert_int_eq(save_meta(c, step, NULL), 0);
	ckpt_close(c);
	c = open_keep(0, 0, 0, 0);
	char got[256];
	committed(c, got, sizeof got);
	ck_assert_str_eq(got, "3,6,7");
	check_w(c, 3);
	ckpt_close(c);
}
END_TEST

START_TEST(keep_seconds_rule)
{
	/* Saves well within 60 s of each other: all kept. */
	ckpt_ctx *c = open_keep(0, 0, 60, 0);
	for (uint64_t step = 1; step <= 3; step++)
		ck_assert_int_eq(save_meta(c, step, NULL), 0);
	ckpt_close(c);
	c = open_keep(0, 0, 0, 0);
	char got[256];
	committed(c, got, sizeof got);
	ck_assert_str_eq(got, "1,2,3");
	ckpt_close(c);
	/* One second later, with keep_seconds 1 (from the environment): steps 1..3 are
	 * older than that whatever the machine's speed; step 4 is the latest. */
	sleep(2);
	setenv("CKPT_KEEP_SECONDS", "1", 1);
	c = open_keep(0, 0, 0, 0);
	ck_assert_int_eq(save_meta(c, 4, NULL), 0);
	ckpt_close(c);
	unsetenv("CKPT_KEEP_SECONDS");
	c = open_keep(0, 0, 0, 0);
	committed(c, got, sizeof got);
	ck_assert_str_eq(got, "4");
	ckpt_close(c);
}
END_TEST

/* No rule: nothing is removed (the default). */
START_TEST(no_rule_keeps_all)
{
	ckpt_ctx *c = open_keep(0, 0, 0, 0);
	for (uint64_t step = 1; step <= 4; step++)
		ck_assert_int_eq(save_meta(c, step, NULL), 0);
	char got[256];
	committed(c, got, sizeof got);
	ck_assert_str_eq(got, "1,2,3,4");
	ckpt_close(c);
}
END_TEST

/* A save in flight while other steps commit and their retention runs: step 9 is
 * begun (its INFLIGHT record names its attempt) and left unsubmitted while steps 2
 * and 10 commit with keep_last 1; retention removes steps 1 and 2 and must leave
 * step 9 alone, which then commits and loads. */
START_TEST(save_in_flight_survives)
{
	struct ckpt_opts o;
	opts_for(&o, 0, 1, 0);
	o.keep_last = 1;
	o.keep_every = 9;            /* step 9 stays once committed, to be loaded */
	o.max_inflight = 2;
	ckpt_ctx *c;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	ck_assert_int_eq(save_meta(c, 1, NULL), 0);
	/* Step 9 begun (its INFLIGHT record and its attempt exist), not yet submitted. */
	ckpt_save *s9;
	ck_assert_int_eq(ckpt_save_begin(c, 9, &s9), 0);
	static float w9[N];
	add_w(s9, 9, w9);
	/* Steps 2 and 10 commit meanwhile; their retention removes step 1 and 2, and
	 * must leave step 9's attempt alone. */
	ck_assert_int_eq(save_meta(c, 2, NULL), 0);
	ck_assert_int_eq(save_meta(c, 10, NULL), 0);
	/* Step 11's save runs after step 10's retention (one worker, in order). */
	ck_assert_int_eq(save_meta(c, 11, NULL), 0);
	struct ckpt_step_info x;
	ck_assert_int_eq(ckpt_step_info(c, 1, &x, sizeof x), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckpt_step_info(c, 2, &x, sizeof x), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckpt_step_info(c, 9, &x, sizeof x), 0);
	ck_assert(x.has_record && x.state == CKPT_STATE_INFLIGHT);
	ck_assert_int_eq(ckpt_save_submit(s9), 0);
	ck_assert_msg(ckpt_save_wait(s9, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s9);
	check_w(c, 9);
	ckpt_close(c);
	/* Step 9 committed and kept by keep_every; the others' retention left step 11. */
	c = open_keep(0, 0, 0, 0);
	char got[64];
	committed(c, got, sizeof got);
	ck_assert_str_eq(got, "9,11");
	ckpt_close(c);
}
END_TEST

/* A save running (its worker held in its source) while the caller runs gc with
 * keep_last 1: the caller's gc and the job's retention are one at a time, the running
 * save is no candidate, and after it commits its own retention leaves it alone. */
START_TEST(running_save_survives_gc)
{
	ckpt_ctx *c = open_keep(1, 0, 0, 0);
	ck_assert_int_eq(save_meta(c, 1, NULL), 0);
	ck_assert_int_eq(save_meta(c, 2, NULL), 0);
	struct tu_gate g;
	tu_gate_init(&g);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 3, &s), 0);
	uint64_t shape[1] = { 20000 };
	struct ckpt_tensor t = { .name = "big", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8,
		.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape };
	ck_assert_int_eq(ckpt_save_add_tensor_source(s, &t, tu_gate_source, &g), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	tu_gate_wait_entered(&g);
	struct ckpt_gc_opts go;
	ckpt_gc_opts_init(&go, sizeof go);
	go.keep_last = 1;
	struct ckpt_gc_result r = { .size = sizeof r };
	ck_assert_int_eq(ckpt_catalog_gc(c, &go, &r), 0);
	ck_assert_uint_eq(r.steps_removed, 0);        /* step 1 went with step 2's commit */
	tu_gate_release(&g);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
	ckpt_close(c);               /* waits for step 3's retention */
	c = open_keep(0, 0, 0, CKPT_OPEN_READONLY);
	char got[64];
	committed(c, got, sizeof got);
	ck_assert_str_eq(got, "3");
	ckpt_close(c);
	tu_gate_close(&g);
}
END_TEST

START_TEST(keep_env_malformed)
{
	static const char *vars[] = { "CKPT_KEEP_LAST", "CKPT_KEEP_EVERY", "CKPT_KEEP_SECONDS" };
	static const char *bad[] = { "-1", "1x", " 3", "18446744073709551616", "0x10", "+2", "2h" };
	for (size_t v = 0; v < 3; v++) {
		for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
			setenv(vars[v], bad[i], 1);
			struct ckpt_opts o;
			opts_for(&o, 0, 1, 0);
			ckpt_ctx *c = (ckpt_ctx *)1;
			int rc = ckpt_open(&o, &c);
			ck_assert_msg(rc == -EINVAL && c == NULL, "%s='%s': %d", vars[v], bad[i], rc);
			ck_assert_msg(strstr(ckpt_last_error(), vars[v]) != NULL, "%s", ckpt_last_error());
		}
		/* A good value opens; the option given wins over the environment. */
		setenv(vars[v], "18446744073709551615", 1);
		struct ckpt_opts o;
		opts_for(&o, 0, 1, 0);
		ckpt_ctx *c;
		ck_assert_msg(ckpt_open(&o, &c) == 0, "%s", ckpt_last_error());
		ckpt_close(c);
		unsetenv(vars[v]);
	}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("meta");
	TCase *t = tcase_create("meta");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, meta_round_trip);
	tcase_add_test(t, meta_refused);
	tcase_add_test(t, meta_rank0_wins);
	suite_add_tcase(s, t);
	t = tcase_create("retention");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, keep_last_two);
	tcase_add_test(t, keep_every_three);
	tcase_add_test(t, keep_seconds_rule);
	tcase_add_test(t, no_rule_keeps_all);
	tcase_add_test(t, save_in_flight_survives);
	tcase_add_test(t, running_save_survives_gc);
	tcase_add_test(t, keep_env_malformed);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	tu_seed();
	SRunner *sr = srunner_create(suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
