/*
 * toolutil.h — small helpers shared by ckpt-synth, ckpt-inspect and ckpt-reshard (a
 * static library linked into each; public API only): JSON string output,
 * human-readable sizes and times, number parsing, and the progress display (a bar
 * on a terminal, plain lines otherwise, so that logs stay readable).
 */
#ifndef CKPT_TOOLUTIL_H
#define CKPT_TOOLUTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Write s as a JSON string literal (quotes included). */
void tool_json_str(FILE *f, const char *s);
/* "12.5 MiB" into buf (at least 32 bytes); returns buf. */
const char *tool_bytes(uint64_t n, char *buf);
/* "2024-05-01T12:00:00Z" into buf (at least 32 bytes); "-" for 0. */
const char *tool_time(uint64_t ns, char *buf);
/* Decimal u64 with nothing after it. 0 or -1. */
int tool_parse_u64(const char *s, uint64_t *out);
/* Size with an optional K/M/G/T suffix (binary). 0 or -1. */
int tool_parse_size(const char *s, uint64_t *out);
/* Seconds since an arbitrary point (CLOCK_MONOTONIC). */
double tool_now(void);

struct tool_progress {
	const char *label;
	bool        tty;          /* stderr is a terminal: redraw one line */
	bool        quiet;
	int         last;         /* last percentage (tty) or quarter (lines) shown */
	double      t0;
};
void tool_progress_start(struct tool_progress *p, const char *label, bool quiet);
void tool_progress_update(struct tool_progress *p, uint64_t done, uint64_t total);
void tool_progress_end(struct tool_progress *p);

#endif
