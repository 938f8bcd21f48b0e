/*
 * log.c — the log sink: one line per event, to a callback or to stderr, filtered by
 * level, and rate limiters for lines that a peer can provoke at will
 * (ckpt_internal.h).
 *
 * Where a line goes and what it carries (job, rank, step) is the calling thread's
 * log scope: API calls enter their context's sink, and the library's threads start
 * in the sink of the thread that created them (ckpt_thread_create), so a line needs
 * no context argument. Outside any scope, lines go to the process-wide callback of
 * ckpt_log_set, else stderr. The level from CKPT_LOG is read once; it and the
 * process-wide callback are the log's global state (with the fault table, the only
 * global state the library keeps). A limiter is its owner's object, not global.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"

static int log_level = -1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t log_fn_lock = PTHREAD_MUTEX_INITIALIZER;
static ckpt_log_fn log_fn;
static void *log_fn_arg;

static __thread struct ckpt_log_scope log_scope = { NULL, CKPT_LOG_NO_STEP };

static void log_init(void)
{
	const char *e = ckpt_env("CKPT_LOG");
	log_level = CKPT_LOG_WARN;
	if (!e)
		return;
	if (!strcmp(e, "error")) log_level = CKPT_LOG_ERROR;
	else if (!strcmp(e, "warn")) log_level = CKPT_LOG_WARN;
	else if (!strcmp(e, "info")) log_level = CKPT_LOG_INFO;
	else if (!strcmp(e, "debug")) log_level = CKPT_LOG_DEBUG;
	else log_level = atoi(e);
}

static bool log_enabled(int level)
{
	const struct ckpt_log_sink *k = log_scope.sink;
	if (k && k->level >= 0)
		return level <= k->level;
	pthread_once(&log_once, log_init);
	return level <= log_level;
}

void ckpt_log_set(ckpt_log_fn fn, void *arg)
{
	pthread_mutex_lock(&log_fn_lock);
	log_fn = fn;
	log_fn_arg = arg;
	pthread_mutex_unlock(&log_fn_lock);
}

struct ckpt_log_scope ckpt_log_enter(const struct ckpt_log_sink *sink, uint64_t step)
{
	struct ckpt_log_scope prev = log_scope;
	if (sink)
		log_scope.sink = sink;
	log_scope.step = step;
	return prev;
}

void ckpt_log_leave(struct ckpt_log_scope *prev)
{
	log_scope = *prev;
}

struct thread_start {
	void *(*fn)(void *);
	void *arg;
	const struct ckpt_log_sink *sink;
};

static void *thread_main(void *p)
{
	struct thread_start ts = *(struct thread_start *)p;
	ckpt_free(p);
	log_scope.sink = ts.sink;
	log_scope.step = CKPT_LOG_NO_STEP;
	return ts.fn(ts.arg);
}

int ckpt_thread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
                       void *arg)
{
	struct thread_start *ts = ckpt_malloc(sizeof *ts);
	if (!ts)
		return ENOMEM;
	ts->fn = fn;
	ts->arg = arg;
	ts->sink = log_scope.sink;
	int rc = pthread_create(t, attr, thread_main, ts);
	if (rc)
		ckpt_free(ts);
	return rc;
}

static const char *level_name(int level)
{
	static const char *names[] = { "error", "warn", "info", "debug" };
	return names[level < 0 ? 0 : level > 3 ? 3 : level];
}

static void log_v(int level, const char *fmt, va_list ap)
{
	const struct ckpt_log_sink *k = log_scope.sink;
	ckpt_log_fn fn = k ? k->fn : NULL;
	void *arg = k ? k->arg : NULL;
	if (!fn) {
		pthread_mutex_lock(&log_fn_lock);
		fn = log_fn;
		arg = log_fn_arg;
		pthread_mutex_unlock(&log_fn_lock);
	}
	char line[1200];
	if (fn) {
		struct ckpt_log_ctx where = {
			.job_id = k ? k->job_id : NULL,
			.rank = k ? k->rank : CKPT_LOG_NO_RANK,
			.step = k ? log_scope.step : CKPT_LOG_NO_STEP,
		};
		vsnprintf(line, sizeof line, fmt, ap);
		fn(arg, level, &where, line);
		return;
	}
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	char when[32], rank[16] = "-";
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
	if (k && k->rank >= 0)
		snprintf(rank, sizeof rank, "%d", k->rank);
	int n = snprintf(line, sizeof line, "%s.%03ldZ libckpt[%d] rank %s %s: ", when,
	                 ts.tv_nsec / 1000000L, (int)getpid(), rank, level_name(level));
	if (n < 0)
		n = 0;
	vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	/* One write per line so that lines of concurrent ranks do not interleave. */
	size_t len = strlen(line);
	if (len + 1 < sizeof line) {
		line[len++] = '\n';
		line[len] = '\0';
	}
	ssize_t w = write(2, line, len);
	(void)w;
}

void ckpt_log(int level, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	va_list ap;
	va_start(ap, fmt);
	log_v(level, fmt, ap);
	va_end(ap);
}

/* ------------------------------------------------------------------ rate limits */

void ckpt_ratelimit_init(struct ckpt_ratelimit *rl, const char *what, int level,
                         unsigned interval_ms, unsigned burst)
{
	memset(rl, 0, sizeof *rl);
	pthread_mutex_init(&rl->lock, NULL);
	rl->what = what;
	rl->level = level;
	rl->interval_ns = (uint64_t)interval_ms * 1000000u;
	rl->burst = burst;
}

/* Under rl->lock: has the current interval ended by now? */
static bool rl_ended(const struct ckpt_ratelimit *rl, uint64_t now_ns)
{
	return rl->begin_ns == 0 || now_ns - rl->begin_ns >= rl->interval_ns;
}

bool ckpt_ratelimit_take(struct ckpt_ratelimit *rl, uint64_t now_ns, uint64_t *missed)
{
	pthread_mutex_lock(&rl->lock);
	*missed = 0;
	if (rl_ended(rl, now_ns)) {
		/* A new interval starts with this line: the last one's count is said now. */
		*missed = rl->missed;
		rl->missed = 0;
		rl->printed = 0;
		rl->begin_ns = now_ns;
	}
	bool ok = rl->printed < rl->burst;
	if (ok)
		rl->printed++;
	else
		rl->missed++;
	pthread_mutex_unlock(&rl->lock);
	return ok;
}

int ckpt_ratelimit_expire(struct ckpt_ratelimit *rl, uint64_t now_ns, uint64_t *missed)
{
	pthread_mutex_lock(&rl->lock);
	*missed = 0;
	int ms = -1;
	if (rl->missed && rl_ended(rl, now_ns)) {
		*missed = rl->missed;
		rl->missed = 0;
		rl->printed = 0;
		rl->begin_ns = 0;        /* the next line starts an interval of its own */
	} else if (rl->missed) {
		uint64_t left = rl->begin_ns + rl->interval_ns - now_ns;
		uint64_t m = (left + 999999u) / 1000000u;    /* rounded up: never early */
		ms = m > INT32_MAX ? INT32_MAX : (int)m;
	}
	pthread_mutex_unlock(&rl->lock);
	return ms;
}

static void rl_say_missed(const struct ckpt_ratelimit *rl, uint64_t missed)
{
	if (missed)
		ckpt_log(rl->level, "%s: %llu similar message%s suppressed", rl->what,
		         (unsigned long long)missed, missed == 1 ? "" : "s");
}

bool ckpt_log_limited(struct ckpt_ratelimit *rl, const char *fmt, ...)
{
	/* A line below the level is not written, so it is not counted either: the
	 * count says how many lines the log would have held. */
	if (!log_enabled(rl->level))
		return false;
	uint64_t missed;
	bool ok = ckpt_ratelimit_take(rl, ckpt_now_ns(), &missed);
	rl_say_missed(rl, missed);
	if (ok) {
		va_list ap;
		va_start(ap, fmt);
		log_v(rl->level, fmt, ap);
		va_end(ap);
	}
	return ok;
}

int ckpt_ratelimit_flush(struct ckpt_ratelimit *rl)
{
	uint64_t missed;
	int ms = ckpt_ratelimit_expire(rl, ckpt_now_ns(), &missed);
	rl_say_missed(rl, missed);
	return ms;
}

void ckpt_ratelimit_destroy(struct ckpt_ratelimit *rl)
{
	if (!rl)
		return;
	rl_say_missed(rl, rl->missed);
	pthread_mutex_destroy(&rl->lock);
}
