/*
 * clock.c — the clocks and the one deadline helper behind every timed wait.
 *
 * Deadlines are absolute CLOCK_MONOTONIC nanoseconds, so that a wait survives a
 * wall clock stepped by NTP or by hand: a timeout of 30 s lasts 30 s. POSIX
 * condition variables time out on CLOCK_REALTIME unless told otherwise, which is
 * why every one of ours is made by ckpt_cond_init and waited on through
 * ckpt_cond_wait_until, the one place that turns a deadline into a timespec.
 */
#include <errno.h>
#include <time.h>

#include "ckpt_internal.h"

#define NS_PER_SEC 1000000000ull
#define NS_PER_MS  1000000ull

uint64_t ckpt_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t ckpt_wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t ckpt_deadline_after(uint64_t from, uint64_t ns)
{
	uint64_t at;
	return ckpt_add_u64(from, ns, &at) ? at : CKPT_FOREVER;
}

uint64_t ckpt_deadline_ms(int64_t timeout_ms)
{
	if (timeout_ms < 0)
		return CKPT_FOREVER;
	uint64_t ns;
	if (!ckpt_mul_u64((uint64_t)timeout_ms, NS_PER_MS, &ns))
		ns = CKPT_FOREVER;
	return ckpt_deadline_after(ckpt_now_ns(), ns);
}

int ckpt_deadline_left_ms(uint64_t deadline)
{
	if (deadline == CKPT_FOREVER)
		return -1;
	uint64_t now = ckpt_now_ns();
	if (now >= deadline)
		return 0;
	uint64_t ms = (deadline - now + NS_PER_MS - 1) / NS_PER_MS;
	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

void ckpt_sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

bool ckpt_deadline_passed(uint64_t deadline)
{
	return deadline != CKPT_FOREVER && ckpt_now_ns() >= deadline;
}

int ckpt_cond_init(pthread_cond_t *cond)
{
	pthread_condattr_t ca;
	int rc = pthread_condattr_init(&ca);
	if (rc)
		return -rc;
	rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (!rc)
		rc = pthread_cond_init(cond, &ca);
	pthread_condattr_destroy(&ca);
	return -rc;
}

int ckpt_cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *lock, uint64_t deadline)
{
	if (deadline == CKPT_FOREVER)
		return pthread_cond_wait(cond, lock);
	if (ckpt_deadline_passed(deadline))
		return ETIMEDOUT;
	/* time_t holds any deadline short of CKPT_FOREVER: 2^64 ns is 584 years. */
	struct timespec ts = { .tv_sec = (time_t)(deadline / NS_PER_SEC),
	                       .tv_nsec = (long)(deadline % NS_PER_SEC) };
	return pthread_cond_timedwait(cond, lock, &ts);
}
