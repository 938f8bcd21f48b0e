/*
 * test_log.c — the log sink's rate limiters (lib/base/log.c): bursts, the count of
 * held-back lines and when it is written, new intervals, the level filter, and one
 * limiter shared by threads (also run under TSan, label tsan).
 *
 * The decisions are checked on a clock the test drives (ckpt_ratelimit_take and
 * _expire); the lines themselves are read back from stderr, redirected to a file,
 * with intervals of an hour (nothing can end one during the test) or, for the one
 * check on the real clock, as an invariant that holds however long each step took.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "testutil.h"

#define MS     1000000ull          /* ns */
#define T0     (1000ull * MS)      /* any start: the clock is the test's */
#define HOUR   3600000u            /* ms: an interval no test outlasts */

/* ---------------------------------------------------------------- stderr capture */

struct capture {
	FILE *f;
	int saved;
};

static void capture_begin(struct capture *c)
{
	fflush(stderr);
	c->f = tmpfile();
	ck_assert_ptr_nonnull(c->f);
	c->saved = dup(2);
	ck_assert_int_ge(c->saved, 0);
	ck_assert_int_ge(dup2(fileno(c->f), 2), 0);
}

/* Restores stderr; returns what was written (malloc'd, NUL-ended). */
static char *capture_end(struct capture *c)
{
	ck_assert_int_ge(dup2(c->saved, 2), 0);
	close(c->saved);
	off_t n = lseek(fileno(c->f), 0, SEEK_END);
	ck_assert_int_ge(n, 0);
	char *s = calloc(1, (size_t)n + 1);
	ck_assert_int_eq(pread(fileno(c->f), s, (size_t)n, 0), n);
	fclose(c->f);
	return s;
}

/* ---------------------------------------------------------------- decisions */

START_TEST(burst_then_held_back)
{
	struct ckpt_ratelimit rl;
	ckpt_ratelimit_init(&rl, "t", CKPT_LOG_WARN, 1000, 3);
	uint64_t missed = 99;
	/* Nothing held back yet: nothing to come back for. */
	ck_assert_int_eq(ckpt_ratelimit_expire(&rl, T0, &missed), -1);
	ck_assert_uint_eq(missed, 0);
	for (int i = 0; i < 3; i++) {
		ck_assert(ckpt_ratelimit_take(&rl, T0 + (uint64_t)i * MS, &missed));
		ck_assert_uint_eq(missed, 0);
	}
	for (int i = 0; i < 5; i++) {
		ck_assert(!ckpt_ratelimit_take(&rl, T0 + 10 * MS, &missed));
		ck_assert_uint_eq(missed, 0);
	}
	/* Mid-interval: the count waits for the interval's end, 500 ms from now. */
	ck_assert_int_eq(ckpt_ratelimit_expire(&rl, T0 + 500 * MS, &missed), 500);
	ck_assert_uint_eq(missed, 0);
	ck_assert_int_eq(ckpt_ratelimit_expire(&rl, T0 + 999 * MS + 1, &missed), 1);  /* rounded up */
	ck_assert(!ckpt_ratelimit_take(&rl, T0 + 999 * MS, &missed));
	ck_assert_uint_eq(missed, 0);
	ckpt_ratelimit_destroy(&rl);
}
END_TEST

START_TEST(new_interval_says_how_many)
{
	struct ckpt_ratelimit rl;
	ckpt_ratelimit_init(&rl, "t", CKPT_LOG_WARN, 1000, 2);
	uint64_t missed;
	ck_assert(ckpt_ratelimit_take(&rl, T0, &missed));
	ck_assert(ckpt_ratelimit_take(&rl, T0, &missed));
	for (int i = 0; i < 7; i++)
		ck_assert(!ckpt_ratelimit_take(&rl, T0 + 100 * MS, &missed));
	/* The interval ends exactly 1000 ms after its first line: the next line is
	 * written, after the count of the 7 held back. */
	ck_assert(ckpt_ratelimit_take(&rl, T0 + 1000 * MS, &missed));
	ck_assert_uint_eq(missed, 7);
	/* The new interval began at that line: one more fits, then none. */
	ck_assert(ckpt_ratelimit_take(&rl, T0 + 1500 * MS, &missed));
	ck_assert_uint_eq(missed, 0);
	ck_assert(!ckpt_ratelimit_take(&rl, T0 + 1999 * MS, &missed));
	ck_assert(!ckpt_ratelimit_take(&rl, T0 + 1999 * MS, &missed));
	/* No line comes after it: expire says the count once the interval is over... */
	ck_assert_int_eq(ckpt_ratelimit_expire(&rl, T0 + 1999 * MS, &missed), 1);
	ck_assert_uint_eq(missed, 0);
	ck_assert_int_eq(ckpt_ratelimit_expire(&rl, T0 + 2000 * MS, &missed), -1);
	ck_assert_uint_eq(missed, 2);
	/* ... and only once; the next line starts an interval of its own, with the
	 * whole burst. */
	ck_assert_int_eq(ckpt_ratelimit_expire(&rl, T0 + 2001 * MS, &missed), -1);
	ck_assert_uint_eq(missed, 0);
	ck_assert(ckpt_ratelimit_take(&rl, T0 + 2500 * MS, &missed));
	ck_assert_uint_eq(missed, 0);
	ck_assert(ckpt_ratelimit_take(&rl, T0 + 3400 * MS, &missed));
	ck_assert(!ckpt_ratelimit_take(&rl, T0 + 3499 * MS, &missed));
	ck_assert(ckpt_ratelimit_take(&rl, T0 + 3500 * MS, &missed));
	ck_assert_uint_eq(missed, 1);
	/* An interval that held nothing back has nothing to say. */
	ck_assert(ckpt_ratelimit_take(&rl, T0 + 9000 * MS, &missed));
	ck_assert_uint_eq(missed, 0);
	ckpt_ratelimit_destroy(&rl);
}
END_TEST

/* ---------------------------------------------------------------- the lines */

START_TEST(lines_written_and_counted)
{
	struct capture c;
	capture_begin(&c);
	struct ckpt_ratelimit rl;
	ckpt_ratelimit_init(&rl, "acceptor: rejected connections", CKPT_LOG_WARN, HOUR, 4);
	unsigned written = 0;
	for (int i = 0; i < 10; i++)
		written += ckpt_log_limited(&rl, "acceptor: rejected peer %d", i);
	/* Inside the interval: the count is not due yet. */
	ck_assert_int_gt(ckpt_ratelimit_flush(&rl), 0);
	ckpt_ratelimit_destroy(&rl);       /* the count of lines still held back */
	char *log = capture_end(&c);
	ck_assert_uint_eq(written, 4);
	ck_assert_uint_eq(tu_count_lines(log, "acceptor: rejected peer"), 4);
	for (int i = 0; i < 4; i++) {
		char want[64];
		snprintf(want, sizeof want, "warn: acceptor: rejected peer %d\n", i);
		ck_assert_msg(strstr(log, want), "'%s' missing from:\n%s", want, log);
	}
	ck_assert_msg(strstr(log, "warn: acceptor: rejected connections: 6 similar messages "
	                     "suppressed\n"), "no count in:\n%s", log);
	ck_assert_uint_eq(tu_count_lines(log, "libckpt["), 5);
	free(log);
}
END_TEST

START_TEST(below_the_level_not_counted)
{
	if (getenv("CKPT_LOG")) {
		printf("below_the_level_not_counted: CKPT_LOG is set; check skipped\n");
		return;
	}
	struct capture c;
	capture_begin(&c);
	struct ckpt_ratelimit rl;
	ckpt_ratelimit_init(&rl, "debug limiter", CKPT_LOG_DEBUG, HOUR, 1);
	for (int i = 0; i < 5; i++)
		ck_assert(!ckpt_log_limited(&rl, "debug line %d", i));
	ck_assert_int_eq(ckpt_ratelimit_flush(&rl), -1);
	ckpt_ratelimit_destroy(&rl);
	char *log = capture_end(&c);
	ck_assert_msg(log[0] == '\0', "written below the level:\n%s", log);
	free(log);
}
END_TEST

struct hammer {
	struct ckpt_ratelimit *rl;
	unsigned written;
};

static void *hammer_main(void *p)
{
	struct hammer *h = p;
	for (int i = 0; i < 1000; i++)
		h->written += ckpt_log_limited(h->rl, "shared limiter line %d", i);
	return NULL;
}

START_TEST(threads_share_a_limiter)
{
	struct capture c;
	capture_begin(&c);
	struct ckpt_ratelimit rl;
	ckpt_ratelimit_init(&rl, "shared", CKPT_LOG_WARN, HOUR, 10);
	struct hammer h[8];
	pthread_t t[8];
	for (int i = 0; i < 8; i++) {
		h[i] = (struct hammer){ .rl = &rl };
		ck_assert_int_eq(pthread_create(&t[i], NULL, hammer_main, &h[i]), 0);
	}
	unsigned written = 0;
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		written += h[i].written;
	}
	ckpt_ratelimit_destroy(&rl);
	char *log = capture_end(&c);
	ck_assert_uint_eq(written, 10);
	ck_assert_uint_eq(tu_count_lines(log, "shared limiter line"), 10);
	ck_assert_uint_eq(tu_sum_suppressed(log, "shared"), 7990);
	free(log);
}
END_TEST

START_TEST(real_clock_every_line_accounted)
{
	/* On the real clock, how many lines pass depends on how long each call took;
	 * what must hold whatever the timing: every line is either written or counted
	 * in exactly one summary, and once the interval has passed, flush has said
	 * everything and has nothing more to come back for. */
	struct capture c;
	capture_begin(&c);
	struct ckpt_ratelimit rl;
	ckpt_ratelimit_init(&rl, "clocked", CKPT_LOG_WARN, 20, 2);
	unsigned written = 0;
	for (int i = 0; i < 50; i++)
		written += ckpt_log_limited(&rl, "clocked line %d", i);
	struct timespec ts = { 0, 60 * 1000000L };
	nanosleep(&ts, NULL);
	int again = ckpt_ratelimit_flush(&rl);
	int after = ckpt_ratelimit_flush(&rl);
	ckpt_ratelimit_destroy(&rl);
	char *log = capture_end(&c);
	ck_assert_int_eq(again, -1);
	ck_assert_int_eq(after, -1);
	ck_assert_uint_ge(written, 2);
	ck_assert_uint_eq(tu_count_lines(log, "clocked line"), written);
	ck_assert_uint_eq(written + tu_sum_suppressed(log, "clocked"), 50);
	free(log);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("ratelimit");
	tcase_add_test(tc, burst_then_held_back);
	tcase_add_test(tc, new_interval_says_how_many);
	tcase_add_test(tc, lines_written_and_counted);
	tcase_add_test(tc, below_the_level_not_counted);
	tcase_add_test(tc, threads_share_a_limiter);
	tcase_add_test(tc, real_clock_every_line_accounted);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
