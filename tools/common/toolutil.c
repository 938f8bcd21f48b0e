/*
 * toolutil.c — the helpers of toolutil.h: strict option parsing, the failure rule
 * (one message on stderr, one JSON object under --json), JSON strings that stay
 * valid whatever bytes they hold, and the output formatting and progress display
 * shared by the three tools.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "toolutil.h"

/* ------------------------------------------------------------------ parsing */

/* Digits of base 10 or 16 from s to its end, without overflow. */
static int parse_digits(const char *s, unsigned base, uint64_t *out)
{
	uint64_t v = 0;
	if (!*s)
		return -1;
	for (; *s; s++) {
		unsigned d;
		if (*s >= '0' && *s <= '9')
			d = (unsigned)(*s - '0');
		else if (base == 16 && *s >= 'a' && *s <= 'f')
			d = (unsigned)(*s - 'a' + 10);
		else if (base == 16 && *s >= 'A' && *s <= 'F')
			d = (unsigned)(*s - 'A' + 10);
		else
			return -1;
		if (v > (UINT64_MAX - d) / base)
			return -1;
		v = v * base + d;
	}
	*out = v;
	return 0;
}

int tool_parse_u64(const char *s, uint64_t *out)
{
	return s ? parse_digits(s, 10, out) : -1;
}

int tool_parse_u64_range(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	uint64_t v;
	if (tool_parse_u64(s, &v) || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int tool_parse_u64_hex(const char *s, uint64_t *out)
{
	if (s && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
		return parse_digits(s + 2, 16, out);
	return tool_parse_u64(s, out);
}

int tool_parse_size(const char *s, uint64_t *out)
{
	if (!s)
		return -1;
	size_t n = strspn(s, "0123456789");
	if (!n || n > 20)
		return -1;
	char digits[24];
	memcpy(digits, s, n);
	digits[n] = '\0';
	uint64_t v;
	if (parse_digits(digits, 10, &v))
		return -1;
	const char *p = s + n;
	unsigned shift = 0;
	switch (*p) {
	case 'k': case 'K': shift = 10; break;
	case 'm': case 'M': shift = 20; break;
	case 'g': case 'G': shift = 30; break;
	case 't': case 'T': shift = 40; break;
	}
	if (shift) {
		p++;
		if (*p == 'i')
			p++;
	}
	if (*p == 'B' || *p == 'b')
		p++;
	if (*p || (shift && v > (UINT64_MAX >> shift)))
		return -1;
	*out = v << shift;
	return 0;
}

int tool_parse_size_opt(const char *opt, const char *v, uint64_t min, uint64_t max,
                        uint64_t unit, uint64_t *out)
{
	uint64_t n;
	if (!tool_parse_size(v, &n) && n >= min && n <= max && !(unit && n % unit)) {
		*out = n;
		return 0;
	}
	char lim[128], mult[48] = "";
	if (max == UINT64_MAX)
		snprintf(lim, sizeof lim, "%llu bytes or more", (unsigned long long)min);
	else
		snprintf(lim, sizeof lim, "%llu to %llu bytes", (unsigned long long)min,
		         (unsigned long long)max);
	if (unit)
		snprintf(mult, sizeof mult, ", a multiple of %llu", (unsigned long long)unit);
	tool_usage("%s '%s' is not a size of %s%s (digits with an optional K, M, G or T suffix)",
	           opt, v, lim, mult);
	return -1;
}

int tool_parse_compress(const char *s, int *level, int *codec)
{
	uint64_t v;
	if (!s)
		return -1;
	*codec = CKPT_CODEC_ZSTD;
	if (!strcmp(s, "none"))
		*level = 0;
	else if (!strcmp(s, "zstd"))
		*level = 3;
	else if (!strncmp(s, "zstd:", 5) && !tool_parse_u64_range(s + 5, 1, 22, &v))
		*level = (int)v;
	else if (!strcmp(s, "bytegroup"))
		*level = 1, *codec = CKPT_CODEC_BYTEGROUP;
	else if (!strncmp(s, "bytegroup:", 10) && !tool_parse_u64_range(s + 10, 1, 22, &v))
		*level = (int)v, *codec = CKPT_CODEC_BYTEGROUP;
	else
		return -1;
	return 0;
}

/* ------------------------------------------------------------------ failures */

static struct {
	const char *prog, *op;
	bool        json;
	bool        claimed;      /* the command's own document is on stdout */
	bool        printed;      /* the error object is on stdout */
} T = { "ckpt-tool", NULL, false, false, false };

void tool_init(const char *prog, const char *op)
{
	T.prog = prog;
	T.op = op;
}

void tool_version(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--version")) {
			printf("%s %s\n", T.prog, ckpt_version());
			exit(fflush(stdout) ? 1 : 0);
		}
}

void tool_set_op(const char *op) { T.op = op; }
void tool_set_json(bool on) { T.json = on; }
bool tool_json(void) { return T.json; }
void tool_json_claim(void) { T.claimed = true; }

void tool_json_fail_fields(FILE *f, const char *msg, int code, int exit)
{
	fputs(",\"error\":", f);
	tool_json_str(f, msg);
	fprintf(f, ",\"code\":%d,\"exit\":%d", code, exit);
}

static int report(int exit, int code, bool to_stderr, const char *fmt, va_list ap)
{
	char msg[4096];
	vsnprintf(msg, sizeof msg, fmt, ap);
	if (to_stderr)
		fprintf(stderr, "%s: %s\n", T.prog, msg);
	if (T.json && !T.claimed && !T.printed) {
		/* Whatever the command had buffered is dropped: one object, this one. */
		fputs("{\"op\":", stdout);
		if (T.op)
			tool_json_str(stdout, T.op);
		else
			fputs("null", stdout);
		fputs(",\"ok\":false", stdout);
		tool_json_fail_fields(stdout, msg, code, exit);
		fputs("}\n", stdout);
		fflush(stdout);
		T.printed = true;
	}
	return exit;
}

int tool_fail(int exit, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	report(exit, code, true, fmt, ap);
	va_end(ap);
	return exit;
}

int tool_fail_json(int exit, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	report(exit, code, false, fmt, ap);
	va_end(ap);
	return exit;
}

int tool_usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	report(TOOL_EXIT_USAGE, -EINVAL, true, fmt, ap);
	va_end(ap);
	return TOOL_EXIT_USAGE;
}

bool tool_scan_has(int argc, char **argv, int first, const struct option *opts, int val)
{
	if (argc <= first)
		return false;
	/* getopt_long permutes the array it reads (options first), which would change
	 * what the real pass reads (an option missing its value at the end would take a
	 * positional argument as one): this pass reads a copy. */
	int n = argc - first + 1;
	char **copy = calloc((size_t)n + 1, sizeof *copy);
	if (!copy)
		return false;
	memcpy(copy, argv + first - 1, (size_t)n * sizeof *copy);
	int saved = opterr;
	bool found = false;
	opterr = 0;
	optind = 0;
	int ch;
	while ((ch = getopt_long(n, copy, ":", opts, NULL)) != -1)
		found |= ch == val;
	opterr = saved;
	optind = 0;
	free(copy);
	return found;
}

int tool_getopt_error(int ch, char **argv, const struct option *opts)
{
	const char *arg = optind > 0 ? argv[optind - 1] : "?";
	char shortopt[3] = { '-', (char)optopt, '\0' };
	if (arg[0] != '-' || (optopt && arg[1] != '-'))
		arg = shortopt;
	if (ch == ':')
		return tool_usage("option '%s' needs a value", arg);
	const char *eq = strchr(arg, '=');
	size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
	unsigned matches = 0;
	for (const struct option *o = opts; n > 2 && o->name; o++)
		matches += !strncmp(o->name, arg + 2, n - 2);
	if (matches > 1)
		return tool_usage("option '%s' is ambiguous", arg);
	if (matches == 1 && eq)
		return tool_usage("option '%.*s' takes no value", (int)n, arg);
	return tool_usage("unknown option '%s'", arg);
}

/* ------------------------------------------------------------------ output */

/* Length of the well-formed UTF-8 sequence at p (1 to 4), or 0: RFC 3629 (Unicode
 * Table 3-7), the same rule as ckpt_name_check. */
static size_t utf8_seq(const unsigned char *p)
{
	unsigned char b = p[0];
	if (b < 0x80)
		return 1;
	size_t n;
	unsigned char lo = 0x80, hi = 0xBF;
	if (b >= 0xC2 && b <= 0xDF)      n = 2;
	else if (b == 0xE0)              { n = 3; lo = 0xA0; }
	else if (b == 0xED)              { n = 3; hi = 0x9F; }
	else if (b >= 0xE1 && b <= 0xEF) n = 3;
	else if (b == 0xF0)              { n = 4; lo = 0x90; }
	else if (b == 0xF4)              { n = 4; hi = 0x8F; }
	else if (b >= 0xF1 && b <= 0xF3) n = 4;
	else
		return 0;
	/* The string ends with a NUL, which is no continuation byte: no read past it. */
	if (p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (p[i] < 0x80 || p[i] > 0xBF)
			return 0;
	return n;
}

bool tool_utf8_ok(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		size_t n = utf8_seq(p);
		if (!n)
			return false;
		p += n;
	}
	return true;
}

void tool_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p;) {
		size_t n = utf8_seq(p);
		if (!n) {
			fputs("\\ufffd", f);
			p++;
			continue;
		}
		if (n > 1) {
			fwrite(p, 1, n, f);
			p += n;
			continue;
		}
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
		p++;
	}
	fputc('"', f);
}

const char *tool_quote(const char *s, char *buf, size_t cap)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;
	if (cap < 8) {
		if (cap)
			buf[0] = '\0';
		return buf;
	}
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p;) {
		size_t n = utf8_seq(p);
		if (o + 8 > cap) {            /* room for one more escape, "..." and the NUL */
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if (n && *p >= 0x20 && *p != 0x7f) {
			memcpy(buf + o, p, n);
			o += n;
			p += n;
		} else {
			buf[o++] = '\\';
			buf[o++] = 'x';
			buf[o++] = hex[*p >> 4];
			buf[o++] = hex[*p & 15];
			p++;
		}
	}
	buf[o] = '\0';
	return buf;
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

int tool_job_secret(void)
{
	if (getenv("CKPT_JOB_SECRET") || getenv("CKPT_JOB_SECRET_FILE"))
		return 0;
	uint8_t r[32];
	size_t got = 0;
	while (got < sizeof r) {
		ssize_t n = getrandom(r + got, sizeof r - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		got += (size_t)n;
	}
	char hex[2 * sizeof r + 1];
	for (size_t i = 0; i < sizeof r; i++)
		snprintf(hex + 2 * i, 3, "%02x", r[i]);
	explicit_bzero(r, sizeof r);
	int rc = setenv("CKPT_JOB_SECRET", hex, 1) ? -errno : 0;
	explicit_bzero(hex, sizeof hex);
	return rc;
}
