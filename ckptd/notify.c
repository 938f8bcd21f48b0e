/*
 * notify.c — ckptd's side of systemd's notification protocol (sd_notify(3)):
 * readiness, reloads, stopping and a status line, through libsystemd, which does
 * nothing when the service was not started with NOTIFY_SOCKET.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <systemd/sd-daemon.h>

#include "ckptd.h"

/* Notifications go to systemd alone: a failure changes nothing for the service. */
static void notify(const char *state)
{
	int rc = sd_notify(0, state);
	if (rc < 0)
		ckpt_log(CKPT_LOG_WARN, "sd_notify: %s", ckpt_strerror(rc));
}

/* One status line: a newline would end the assignment and start another. */
static void one_line(char *s)
{
	for (; *s; s++)
		if (*s == '\n' || *s == '\r')
			*s = ' ';
}

void ckptd_notify_ready(const char *status)
{
	char msg[1024];
	if (!status) {
		notify("READY=1");
		return;
	}
	snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s", status);
	one_line(msg + strlen("READY=1\n"));
	notify(msg);
}

void ckptd_notify_status(const char *fmt, ...)
{
	char msg[1024] = "STATUS=";
	size_t pre = strlen(msg);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg + pre, sizeof msg - pre, fmt, ap);
	va_end(ap);
	one_line(msg + pre);
	notify(msg);
}

void ckptd_notify_reloading(void)
{
	char msg[64];
	snprintf(msg, sizeof msg, "RELOADING=1\nMONOTONIC_USEC=%llu",
	         (unsigned long long)(ckpt_now_ns() / 1000));
	notify(msg);
}

void ckptd_notify_stopping(void)
{
	notify("STOPPING=1");
}
