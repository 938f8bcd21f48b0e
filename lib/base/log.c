/*
 * log.c — the log sink: one line per event to stderr, filtered by CKPT_LOG.
 *
 * The level is read once (the sink is one of the two pieces of global state the
 * style allows, with the fault table).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_internal.h"

static int log_level = -1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

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

void ckpt_log(int level, const char *fmt, ...)
{
	static const char *names[] = { "error", "warn", "info", "debug" };
	pthread_once(&log_once, log_init);
	if (level > log_level)
		return;
	char line[1200];
	va_list ap;
	va_start(ap, fmt);
	int n = snprintf(line, sizeof line, "libckpt[%d] %s: ", (int)getpid(),
	                 names[level < 0 ? 0 : level > 3 ? 3 : level]);
	if (n < 0)
		n = 0;
	vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	va_end(ap);
	/* One write per line so that lines of concurrent ranks do not interleave. */
	size_t len = strlen(line);
	if (len + 1 < sizeof line) {
		line[len++] = '\n';
		line[len] = '\0';
	}
	ssize_t w = write(2, line, len);
	(void)w;
}
