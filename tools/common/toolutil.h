/*
 * toolutil.h — what ckpt-synth, ckpt-inspect and ckpt-reshard share (a static library
 * linked into each; public API only): strict parsing of option values, the JSON
 * output rules (strings that stay valid JSON whatever bytes they hold, and the one
 * error object a failure prints under --json), human-readable sizes and times, and
 * the progress display (a bar on a terminal, plain lines otherwise, so that logs
 * stay readable).
 *
 * Threads: the failure state (tool_init .. tool_fail) belongs to the tool's main
 * thread; rank processes forked by a tool report to it and never print JSON.
 */
#ifndef CKPT_TOOLUTIL_H
#define CKPT_TOOLUTIL_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------------ parsing
 * Every parser takes the whole string or nothing: no sign, no space, nothing after
 * the number, in range. 0, or -1 (out untouched). */

/* Decimal digits only. */
int tool_parse_u64(const char *s, uint64_t *out);
/* Decimal digits, lo <= value <= hi. */
int tool_parse_u64_range(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* Decimal digits, or 0x and hex digits: a seed or another bit pattern. */
int tool_parse_u64_hex(const char *s, uint64_t *out);
/* A byte count: decimal digits with an optional binary suffix K, M, G or T (either
 * case), optionally followed by "i" and/or "B" ("64M", "64MiB", "4096", "4096B");
 * -1 when the result does not fit in 64 bits. */
int tool_parse_size(const char *s, uint64_t *out);
/* The value of size option opt ("--chunk"): tool_parse_size, min <= value <= max, a
 * multiple of unit (0: any). On failure the usage error names opt and v (tool_usage).
 * 0 or -1. */
int tool_parse_size_opt(const char *opt, const char *v, uint64_t min, uint64_t max,
                        uint64_t unit, uint64_t *out);
/* Compression: "none" (0), "zstd" (level 3), "zstd:L", "bytegroup" (level 1) or
 * "bytegroup:L", with 1 <= L <= 22; *codec is the enum ckpt_codec to save with. */
int tool_parse_compress(const char *s, int *level, int *codec);

/* The largest chunk the library accepts (docs/format.md §5: a chunk is at most 2^30
 * bytes) and the unit every chunk size is a multiple of. */
#define TOOL_MAX_CHUNK  (1ull << 30)
#define TOOL_CHUNK_UNIT 4096u

/* ------------------------------------------------------------------ failures
 * One rule for the three tools: a failure prints "PROG: MESSAGE" on stderr and exits
 * with the documented status; under --json stdout then holds exactly one JSON object,
 * {"op", "ok": false, "error": MESSAGE, "code", "exit"}: code is the library's error
 * code (a negative errno or CKPT_E* value; -EINVAL for usage errors), exit the exit
 * status. Commands whose JSON document reports partial results (a verify of several
 * steps, gc, rebuild, a reshard's ranks) carry the same fields in that document. */

#define TOOL_EXIT_USAGE 2

/* prog names the tool in messages; op is the JSON "op" (NULL: null until known). */
void tool_init(const char *prog, const char *op);
void tool_set_op(const char *op);
void tool_set_json(bool on);
bool tool_json(void);
/* The command has started its own JSON document on stdout: from now on a failure
 * goes into that document (tool_json_fail_fields), and tool_fail prints none. */
void tool_json_claim(void);
/* Report a failure as above; returns exit. */
int  tool_fail(int exit, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same when the caller has already said it on stderr in its own words: the JSON
 * object only. */
int  tool_fail_json(int exit, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A usage error: tool_fail(TOOL_EXIT_USAGE, -EINVAL, ...). */
int  tool_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The failure fields of a document the command has claimed:
 * ,"error":MESSAGE,"code":CODE,"exit":EXIT */
void tool_json_fail_fields(FILE *f, const char *msg, int code, int exit);

/*
 * Whether the command line holds the option whose getopt value is val (--json, so
 * that a usage error anywhere, even before --json, is reported as JSON; or another
 * option that decides what the command is), found by a silent pass of getopt_long
 * over a copy of argv[first..argc) (getopt permutes what it reads). Abbreviations
 * and option arguments are read exactly as the real pass reads them when that pass
 * is getopt_long(argc - first + 1, argv + first - 1, ":", opts, ..); this leaves
 * optind 0, so that it starts afresh.
 */
bool tool_scan_has(int argc, char **argv, int first, const struct option *opts, int val);
/* The usage error for getopt_long's '?' or ':' (the option string starts with ':'):
 * names the option (unknown, ambiguous, needing a value, taking none). argv is the
 * array the pass was given. Returns TOOL_EXIT_USAGE. */
int  tool_getopt_error(int ch, char **argv, const struct option *opts);

/* ------------------------------------------------------------------ version */

/* --version among the arguments (before a "--"): print "PROG VERSION" on stdout, the
 * library's version (ckpt_version()), and exit 0; otherwise return. Called after
 * tool_init, before anything else reads the arguments. */
void tool_version(int argc, char **argv);

/* ------------------------------------------------------------------ output */

/* Write s as a JSON string literal (quotes included) that is valid JSON whatever
 * bytes s holds: '"', '\\' and control bytes escaped; well-formed UTF-8 copied; each
 * byte that is not part of a well-formed UTF-8 sequence (possible in names saved by
 * older versions, paths, messages that quote them) written as \ufffd, U+FFFD. */
void tool_json_str(FILE *f, const char *s);
/* Whether s is well-formed UTF-8 (RFC 3629). */
bool tool_utf8_ok(const char *s);
/* s for a human message: well-formed UTF-8 as it is, every other byte and control
 * bytes as \xNN; cut with "..." to fit cap (>= 8) bytes. Returns buf. */
const char *tool_quote(const char *s, char *buf, size_t cap);
/* "12.5 MiB" into buf (at least 32 bytes); returns buf. */
const char *tool_bytes(uint64_t n, char *buf);
/* "2024-05-01T12:00:00Z" into buf (at least 32 bytes); "-" for 0. */
const char *tool_time(uint64_t ns, char *buf);
/* Seconds since an arbitrary point (CLOCK_MONOTONIC). */
double tool_now(void);
/* For a job the tool forks itself: unless the user gave the job a secret
 * (CKPT_JOB_SECRET or CKPT_JOB_SECRET_FILE), a fresh random one (64 hex digits) is
 * put in CKPT_JOB_SECRET, which the forked ranks inherit and no other process knows.
 * 0, or a negative errno when no random bytes could be had. */
int tool_job_secret(void);

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
