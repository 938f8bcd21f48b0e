/*
 * toolutil.c — the helpers of toolutil.h: output formatting and the progress
 * display shared by the tools.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "toolutil.h"

void tool_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"':  fputs("\\\"", f); break;
		case '\\': fputs("\\\\", f); break;
		case '\n': fputs("\\n", f); break;
		case '\t': fputs("\\t", f); break;
		case '\r': fputs("\\r", f); break;
		default:
			if (*p < 0x20)
				fprintf(f, "\\u%04x", *p);
			else
				fputc(*p, f);
		}
	}
	fputc('"', f);
}

const char *tool_bytes(uint64_t n, char *buf)
{
	static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)n;
	unsigned u = 0;
	while (v >= 1024.0 && u + 1 < sizeof units / sizeof *units) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, 32, "%llu B", (unsigned long long)n);
	else
		snprintf(buf, 32, "%.1f %s", v, units[u]);
	return buf;
}

const char *tool_time(uint64_t ns, char *buf)
{
	if (!ns) {
		snprintf(buf, 32, "-");
		return buf;
	}
	time_t t = (time_t)(ns / 1000000000ull);
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(buf, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
	return buf;
}

int tool_parse_u64(const char *s, uint64_t *out)
{
	if (!s || !*s || *s == '-' || *s == '+')
		return -1;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

int tool_parse_size(const char *s, uint64_t *out)
{
	if (!s || !*s || *s == '-')
		return -1;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	unsigned shift = 0;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	}
	if (*end == 'i') end++;
	if (*end == 'B' || *end == 'b') end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

double tool_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void tool_progress_start(struct tool_progress *p, const char *label, bool quiet)
{
	p->label = label;
	p->tty = isatty(STDERR_FILENO);
	p->quiet = quiet;
	p->last = -1;
	p->t0 = tool_now();
}

void tool_progress_update(struct tool_progress *p, uint64_t done, uint64_t total)
{
	if (p->quiet)
		return;
	int pct = total ? (int)((double)done * 100.0 / (double)total) : 100;
	if (pct > 100)
		pct = 100;
	char a[32], b[32];
	if (p->tty) {
		if (pct == p->last)
			return;
		p->last = pct;
		char bar[41];
		int fill = pct * 40 / 100;
		for (int i = 0; i < 40; i++)
			bar[i] = i < fill ? '#' : '.';
		bar[40] = '\0';
		double dt = tool_now() - p->t0;
		fprintf(stderr, "\r%s [%s] %3d%% %s / %s  %.0f MiB/s ", p->label, bar, pct,
		        tool_bytes(done, a), tool_bytes(total, b),
		        dt > 0 ? (double)done / 1048576.0 / dt : 0.0);
		fflush(stderr);
		return;
	}
	/* Not a terminal: one line per quarter, so logs show progress without noise. */
	int q = pct / 25;
	if (q == p->last)
		return;
	p->last = q;
	fprintf(stderr, "%s: %d%% (%s of %s)\n", p->label, q * 25, tool_bytes(done, a),
	        tool_bytes(total, b));
}

void tool_progress_end(struct tool_progress *p)
{
	if (!p->quiet && p->tty && p->last >= 0)
		fputc('\n', stderr);
}
