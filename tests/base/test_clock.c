/*
 * test_clock.c — the deadline helper behind every timed wait (lib/base/clock.c):
 * deadlines expire, CKPT_FOREVER never does, the time left rounds up and saturates,
 * and a condition variable from ckpt_cond_init times out on the monotonic clock
 * (one made for CLOCK_REALTIME would take a monotonic deadline as long past and
 * return at once, which the timing checks below catch).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "ckpt_internal.h"
#include "testutil.h"

#define MS 1000000ull

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

START_TEST(forever)
{
	ck_assert_uint_eq(ckpt_deadline_ms(-1), CKPT_FOREVER);
	ck_assert_uint_eq(ckpt_deadline_ms(INT64_MIN), CKPT_FOREVER);
	ck_assert_int_eq(ckpt_deadline_left_ms(CKPT_FOREVER), -1);
	ck_assert(!ckpt_deadline_passed(CKPT_FOREVER));
	/* A sum past the clock's range saturates rather than wrapping into the past. */
	ck_assert_uint_eq(ckpt_deadline_after(UINT64_MAX - 5, 10), CKPT_FOREVER);
	ck_assert_uint_eq(ckpt_deadline_ms(INT64_MAX), CKPT_FOREVER);
}
END_TEST

START_TEST(expiry)
{
	/* A zero timeout has passed already: a poll with it does not block. */
	uint64_t now = ckpt_deadline_ms(0);
	ck_assert(ckpt_deadline_passed(now));
	ck_assert_int_eq(ckpt_deadline_left_ms(now), 0);
	ck_assert_int_eq(ckpt_deadline_left_ms(1), 0);          /* long past */

	uint64_t seed = tu_seed();
	unsigned ms = 20 + (unsigned)(tu_rand(&seed) % 60);
	uint64_t t0 = ckpt_now_ns();
	uint64_t d = ckpt_deadline_ms(ms);
	ck_assert_uint_ge(d, t0 + ms * MS);
	ck_assert_uint_le(d, ckpt_now_ns() + ms * MS);
	ck_assert(!ckpt_deadline_passed(d));
	int left = ckpt_deadline_left_ms(d);
	ck_assert_int_gt(left, 0);
	ck_assert_int_le(left, (int)ms);
	sleep_ms(ms + 5);
	ck_assert(ckpt_deadline_passed(d));
	ck_assert_int_eq(ckpt_deadline_left_ms(d), 0);
}
END_TEST

START_TEST(time_left)
{
	/* Rounded up: a remainder under a millisecond is one, not zero (a poll with
	 * zero would spin until the deadline). */
	uint64_t now = ckpt_now_ns();
	uint64_t d = ckpt_deadline_after(now, 10000 * MS + 1);
	int left = ckpt_deadline_left_ms(d);
	ck_assert_int_le(left, 10001);
	ck_assert_int_gt(left, 9000);
	/* Saturates at what poll() takes. */
	ck_assert_int_eq(ckpt_deadline_left_ms(ckpt_deadline_after(now, (uint64_t)INT32_MAX * 4 * MS)),
	                 INT32_MAX);
	ck_assert_uint_eq(ckpt_deadline_after(now, 0), now);
}
END_TEST

struct waker {
	pthread_mutex_t lock;
	pthread_cond_t  cond;
	bool            flag;
};

static void *wake_later(void *arg)
{
	struct waker *w = arg;
	sleep_ms(30);
	pthread_mutex_lock(&w->lock);
	w->flag = true;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

START_TEST(cond_times_out_on_monotonic)
{
	struct waker w = { .flag = false };
	pthread_mutex_init(&w.lock, NULL);
	ck_assert_int_eq(ckpt_cond_init(&w.cond), 0);

	uint64_t seed = tu_seed() ^ 0x5bd1e995u;
	unsigned ms = 40 + (unsigned)(tu_rand(&seed) % 40);
	uint64_t t0 = ckpt_now_ns();
	uint64_t d = ckpt_deadline_ms(ms);
	int rc = 0;
	pthread_mutex_lock(&w.lock);
	while (!w.flag && rc != ETIMEDOUT)
		rc = ckpt_cond_wait_until(&w.cond, &w.lock, d);
	pthread_mutex_unlock(&w.lock);
	uint64_t took = ckpt_now_ns() - t0;
	ck_assert_int_eq(rc, ETIMEDOUT);
	ck_assert_msg(took >= ms * MS, "timed out after %llu us, before the %u ms deadline",
	              (unsigned long long)(took / 1000), ms);
	ck_assert_msg(took < (ms + 5000) * MS, "timed out %llu ms late",
	              (unsigned long long)(took / MS - ms));

	/* A deadline already passed returns at once. */
	pthread_mutex_lock(&w.lock);
	ck_assert_int_eq(ckpt_cond_wait_until(&w.cond, &w.lock, ckpt_deadline_ms(0)), ETIMEDOUT);
	pthread_mutex_unlock(&w.lock);

	/* Without a deadline, a wait ends when signalled, and only then. */
	pthread_t t;
	t0 = ckpt_now_ns();            /* before the waker starts its 30 ms, whatever the load */
	ck_assert_int_eq(pthread_create(&t, NULL, wake_later, &w), 0);
	pthread_mutex_lock(&w.lock);
	while (!w.flag)
		ck_assert_int_eq(ckpt_cond_wait_until(&w.cond, &w.lock, CKPT_FOREVER), 0);
	pthread_mutex_unlock(&w.lock);
	ck_assert_uint_ge(ckpt_now_ns() - t0, 25 * MS);
	pthread_join(t, NULL);

	/* A signal before a far deadline ends the wait early with 0. */
	w.flag = false;
	ck_assert_int_eq(pthread_create(&t, NULL, wake_later, &w), 0);
	d = ckpt_deadline_ms(60000);
	rc = 0;
	pthread_mutex_lock(&w.lock);
	while (!w.flag && rc != ETIMEDOUT)
		rc = ckpt_cond_wait_until(&w.cond, &w.lock, d);
	pthread_mutex_unlock(&w.lock);
	ck_assert_int_eq(rc, 0);
	ck_assert(w.flag);
	pthread_join(t, NULL);

	pthread_cond_destroy(&w.cond);
	pthread_mutex_destroy(&w.lock);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("clock");
	TCase *tc = tcase_create("deadline");
	tcase_add_test(tc, forever);
	tcase_add_test(tc, expiry);
	tcase_add_test(tc, time_left);
	tcase_add_test(tc, cond_times_out_on_monotonic);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
