/*
 * jobs.c — ckptd's jobs file: which job ids may use this ckptd, their secrets and
 * quotas (the format: ckptd.h).
 *
 * The file is read whole and every line checked before the table is used: a table
 * is all of the file or nothing. A reload builds the new table beside the one in
 * use and swaps it in under the lock only once it read whole, so that a bad edit
 * never takes a job away from a running ckptd. Secrets are wiped wherever they
 * were held: the table, the file's bytes, a secret file's.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptd.h"

#define JOBS_MAX_FILE (4u << 20)
#define JOBS_MAX_LINE 16384u

/* One reading of the file. job[] is in the file's order (line[i] is job i's line);
 * order[] lists them by id, for lookups. Never changed once built: readers share it
 * under the lock, and it is freed only once swapped out. */
struct jobs_table {
	unsigned n;
	struct ckptd_job *job;
	unsigned *line;
	unsigned *order;
};

struct ckptd_jobs {
	pthread_rwlock_t lock;          /* guards t: lookups read it, reload swaps it */
	char *path;                     /* owned; read again by reload */
	struct jobs_table *t;
};

/* Where the parser is, for messages. */
struct parse {
	const char *path;
	unsigned line;
	const struct stat *st;          /* the jobs file's, for inline secrets */
	size_t dir_len;                 /* path[0..dir_len): its directory, with the '/' */
};

static int bad(const struct parse *p, int code, const char *fmt, ...) CKPT_PRINTF(3, 4);
static int bad(const struct parse *p, int code, const char *fmt, ...)
{
	char why[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	return ckpt_err(code, "%s:%u: %s", p->path, p->line, why);
}

static void table_free(struct jobs_table *t)
{
	if (!t)
		return;
	if (t->job) {
		explicit_bzero(t->job, (size_t)t->n * sizeof *t->job);
		ckpt_free(t->job);
	}
	ckpt_free(t->line);
	ckpt_free(t->order);
	ckpt_free(t);
}

/* ------------------------------------------------------------------ one line */

static bool id_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '-';
}

/* Why id breaks the rules of a job id, or NULL. */
static const char *id_problem(const char *id, size_t len)
{
	if (len == 0 || len > CKPTD_MAX_JOB_ID)
		return "must be 1 to 128 characters";
	for (size_t i = 0; i < len; i++)
		if (!id_char((unsigned char)id[i]))
			return "may hold only A-Z a-z 0-9 . _ -";
	if ((len == 1 && id[0] == '.') || (len == 2 && id[0] == '.' && id[1] == '.'))
		return "may not be . or .. (it names a directory)";
	return NULL;
}

/* A size as ckpt_parse_size reads it: digits, then an optional K/M/G/T with an
 * optional i and B. With the spelling checked here, a value it refuses is one that
 * does not fit in 64 bits. */
static bool size_spelling_ok(const char *s)
{
	if (!(*s >= '0' && *s <= '9'))
		return false;
	while (*s >= '0' && *s <= '9')
		s++;
	if (*s && strchr("kKmMgGtT", *s)) {
		s++;
		if (*s == 'i' || *s == 'I')
			s++;
		if (*s == 'b' || *s == 'B')
			s++;
	}
	return *s == '\0';
}

/* The fields of one line, pointing into the line (NUL-terminated in place). */
struct fields {
	const char *id;
	const char *secret_file, *secret, *quota;
};

/* Split line (len bytes, no line end) into its fields. 0, or CKPT_EFORMAT. A line
 * without a job leaves f->id NULL. */
static int split_line(const struct parse *p, char *s, size_t len, struct fields *f)
{
	memset(f, 0, sizeof *f);
	if (len > JOBS_MAX_LINE)
		return bad(p, CKPT_EFORMAT, "line longer than %u bytes", JOBS_MAX_LINE);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '\0')
			return bad(p, CKPT_EFORMAT, "a NUL byte at column %zu", i + 1);
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return bad(p, CKPT_EFORMAT, "control character 0x%02x at column %zu", c, i + 1);
	}
	s[len] = '\0';
	char *save = NULL;
	for (char *tok = strtok_r(s, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
		if (tok[0] == '#')
			break;                              /* a comment, to the end of the line */
		if (!f->id) {
			f->id = tok;
			const char *why = id_problem(tok, strlen(tok));
			if (why) {
				char q[CKPT_NAME_QUOTE_CAP];
				return bad(p, CKPT_EFORMAT, "job id '%s': %s", ckpt_name_quote(tok, strlen(tok),
				           q, sizeof q), why);
			}
			continue;
		}
		char *eq = strchr(tok, '=');
		char q[CKPT_NAME_QUOTE_CAP];
		if (!eq)
			return bad(p, CKPT_EFORMAT, "job '%s': '%s' is not key=value", f->id,
			           ckpt_name_quote(tok, strlen(tok), q, sizeof q));
		*eq = '\0';
		const char **slot = !strcmp(tok, "secret-file") ? &f->secret_file :
		                    !strcmp(tok, "secret") ? &f->secret :
		                    !strcmp(tok, "quota") ? &f->quota : NULL;
		/* Never quote what follows '=': it may be a secret. */
		if (!slot)
			return bad(p, CKPT_EFORMAT, "job '%s': unknown key '%s' (the keys: secret-file, "
			           "secret, quota)", f->id, ckpt_name_quote(tok, strlen(tok), q, sizeof q));
		if (*slot)
			return bad(p, CKPT_EFORMAT, "job '%s': %s given twice", f->id, tok);
		if (!eq[1])
			return bad(p, CKPT_EFORMAT, "job '%s': %s= without a value", f->id, tok);
		*slot = eq + 1;
	}
	return 0;
}

/* The job secret in secret-file=value (value taken from the jobs file's directory
 * when relative). */
static int read_secret_file(const struct parse *p, const char *value, struct ckptd_job *job)
{
	char path[PATH_MAX];
	int n = value[0] == '/' ? snprintf(path, sizeof path, "%s", value)
	                        : snprintf(path, sizeof path, "%.*s%s", (int)p->dir_len, p->path,
	                                   value);
	/* Paths are named whole: the line holds no control character, and a cut path
	 * helps nobody find the file. */
	if (n < 0 || (size_t)n >= sizeof path)
		return bad(p, CKPT_EFORMAT, "job '%s': secret-file '%.64s...': path too long", job->id,
		           value);
	unsigned mode = 0;
	int rc = ckpt_secret_file_read(path, job->secret, sizeof job->secret, &job->secret_len,
	                               &mode);
	if (rc == -EPERM)
		return bad(p, -EPERM, "job '%s': secret-file '%s': must be a regular file of this "
		           "user that only this user may read (mode %03o; chmod 600)", job->id, path,
		           mode & 0777);
	if (rc == -EMSGSIZE)
		return bad(p, CKPT_EFORMAT, "job '%s': secret-file '%s': the secret must be 1..%u "
		           "bytes", job->id, path, CKPTD_MAX_SECRET);
	if (rc)
		return bad(p, rc, "job '%s': secret-file '%s'", job->id, path);
	return 0;
}

/* Parse one line into *job. 1 when the line holds a job, 0 when not (blank or a
 * comment), or an error. */
static int parse_line(const struct parse *p, char *s, size_t len, struct ckptd_job *job)
{
	struct fields f;
	int rc = split_line(p, s, len, &f);
	if (rc || !f.id)
		return rc;
	memset(job, 0, sizeof *job);
	memcpy(job->id, f.id, strlen(f.id));        /* checked: at most CKPTD_MAX_JOB_ID */
	if (f.secret && f.secret_file)
		return bad(p, CKPT_EFORMAT, "job '%s': both secret and secret-file: give one",
		           job->id);
	if (!f.secret && !f.secret_file)
		return bad(p, CKPT_EFORMAT, "job '%s': no secret: give secret-file=PATH or "
		           "secret=TEXT", job->id);
	if (f.quota) {
		char q[CKPT_NAME_QUOTE_CAP];
		ckpt_name_quote(f.quota, strlen(f.quota), q, sizeof q);
		if (!size_spelling_ok(f.quota))
			return bad(p, CKPT_EFORMAT, "job '%s': quota '%s': expected bytes, with an "
			           "optional K, M, G or T (powers of 1024)", job->id, q);
		if (ckpt_parse_size(f.quota, &job->quota_bytes))
			return bad(p, CKPT_EFORMAT, "job '%s': quota '%s' does not fit in 64 bits",
			           job->id, q);
		if (!job->quota_bytes)
			return bad(p, CKPT_EFORMAT, "job '%s': quota 0: a quota is at least 1 byte "
			           "(leave quota out for none)", job->id);
	}
	if (f.secret) {
		/* A secret in the file makes the file a secret file. */
		if (!ckpt_secret_stat_ok(p->st))
			return bad(p, -EPERM, "job '%s': secret= in a jobs file that is not a regular "
			           "file of this user that only this user may read (mode %03o): chmod "
			           "600 it, or use secret-file=", job->id,
			           (unsigned)(p->st->st_mode & 0777));
		size_t n = strlen(f.secret);
		if (n > CKPTD_MAX_SECRET)
			return bad(p, CKPT_EFORMAT, "job '%s': secret= holds %zu bytes, at most %u",
			           job->id, n, CKPTD_MAX_SECRET);
		memcpy(job->secret, f.secret, n);
		job->secret_len = n;
		return 1;
	}
	rc = read_secret_file(p, f.secret_file, job);
	return rc ? rc : 1;
}

/* ------------------------------------------------------------------ the file */

/* The file's bytes (*len of them, NUL-terminated) and its stat. */
static int read_whole(const char *path, struct stat *st, char **out, size_t *len)
{
	*out = NULL;
	/* O_NONBLOCK: a FIFO in the file's place is refused below, not waited on. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return ckpt_err(-errno, "jobs file %s", path);
	int rc = 0;
	char *buf = NULL;
	size_t got = 0;
	if (fstat(fd, st) < 0) {
		rc = ckpt_err(-errno, "jobs file %s", path);
		goto out;
	}
	if (!S_ISREG(st->st_mode)) {
		rc = ckpt_err(CKPT_EFORMAT, "jobs file %s: not a regular file", path);
		goto out;
	}
	/* Whoever may write the file may add a job with a secret of their own. */
	if ((st->st_mode & 022) || (st->st_uid != 0 && st->st_uid != geteuid())) {
		rc = ckpt_err(-EPERM, "jobs file %s: others than its owner may write it, or its "
		              "owner is neither this user nor root (mode %03o, owner %u): chmod "
		              "go-w, chown", path, (unsigned)(st->st_mode & 0777),
		              (unsigned)st->st_uid);
		goto out;
	}
	if (st->st_size > (off_t)JOBS_MAX_FILE) {
		rc = ckpt_err(CKPT_EFORMAT, "jobs file %s: %lld bytes, more than the %u a jobs file "
		              "may hold", path, (long long)st->st_size, JOBS_MAX_FILE);
		goto out;
	}
	/* One byte more than the size: reading it means the file grew meanwhile. */
	size_t cap = (size_t)st->st_size + 1;
	if (!(buf = ckpt_malloc(cap + 1))) {
		rc = ckpt_err(-ENOMEM, "jobs file %s: %zu bytes", path, cap);
		goto out;
	}
	while (got < cap) {
		ssize_t r = read(fd, buf + got, cap - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = ckpt_err(-errno, "jobs file %s", path);
			goto out;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	if (got != (size_t)st->st_size)
		rc = ckpt_err(-EAGAIN, "jobs file %s changed while it was read: try again", path);
out:
	close(fd);
	if (rc && buf) {
		explicit_bzero(buf, got);
		ckpt_free(buf);
		buf = NULL;
	}
	if (buf)
		buf[got] = '\0';
	*out = buf;
	*len = got;
	return rc;
}

/* The next line of buf[*off..len): its start and length, without the line end. */
static bool next_line(char *buf, size_t len, size_t *off, char **s, size_t *n)
{
	if (*off >= len)
		return false;
	*s = buf + *off;
	char *nl = memchr(*s, '\n', len - *off);
	*n = nl ? (size_t)(nl - *s) : len - *off;
	*off += *n + (nl != NULL);
	if (*n && (*s)[*n - 1] == '\r')
		(*n)--;                                  /* a file written with CR LF */
	return true;
}

static bool line_has_job(const char *s, size_t n)
{
	size_t i = 0;
	while (i < n && (s[i] == ' ' || s[i] == '\t'))
		i++;
	return i < n && s[i] != '#';
}

static int cmp_order(const void *a, const void *b, void *arg)
{
	const struct jobs_table *t = arg;
	unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
	int c = strcmp(t->job[x].id, t->job[y].id);
	return c ? c : (x > y) - (x < y);
}

static int parse_buf(const struct parse *p0, char *buf, size_t len, struct jobs_table *t)
{
	struct parse p = *p0;
	char *s;
	size_t n, off = 0;
	unsigned count = 0;
	/* The table is sized once, from a first count: growing it would leave copies of
	 * secrets behind in memory given back. */
	for (p.line = 1; next_line(buf, len, &off, &s, &n); p.line++)
		if (line_has_job(s, n) && ++count > CKPTD_MAX_JOBS)
			return bad(&p, CKPT_EFORMAT, "more than %u jobs", CKPTD_MAX_JOBS);
	size_t slots = count ? count : 1;
	if (!(t->job = ckpt_calloc(slots, sizeof *t->job)) ||
	    !(t->line = ckpt_calloc(slots, sizeof *t->line)) ||
	    !(t->order = ckpt_calloc(slots, sizeof *t->order)))
		return ckpt_err(-ENOMEM, "jobs file %s: a table of %u jobs", p.path, count);
	off = 0;
	int rc = 0;
	struct ckptd_job job;
	for (p.line = 1; !rc && next_line(buf, len, &off, &s, &n); p.line++) {
		if ((rc = parse_line(&p, s, n, &job)) <= 0)
			continue;
		rc = 0;
		/* As lib/config.c warns a rank: a short secret is the operator's choice. */
		if (job.secret_len < CKPTD_MIN_SECRET)
			ckpt_log(CKPT_LOG_WARN, "%s:%u: job '%s': the secret is %zu bytes; use at least "
			         "%u random bytes", p.path, p.line, job.id, job.secret_len,
			         CKPTD_MIN_SECRET);
		if (t->n == count) {                     /* the two passes disagree */
			rc = bad(&p, -EIO, "more jobs than counted");
			break;
		}
		memcpy(&t->job[t->n], &job, sizeof job);
		t->line[t->n] = p.line;
		t->order[t->n] = t->n;
		t->n++;
	}
	explicit_bzero(&job, sizeof job);
	if (rc)
		return rc;
	qsort_r(t->order, t->n, sizeof *t->order, cmp_order, t);
	/* A second line for an id: the first such line in the file is named. Equal ids
	 * sort by line, so order[i] is the later line of the pair. */
	bool found = false;
	unsigned dup = 0, first = 0;
	for (unsigned i = 1; i < t->n; i++) {
		const unsigned a = t->order[i - 1], b = t->order[i];
		if (!strcmp(t->job[a].id, t->job[b].id) && (!found || t->line[b] < t->line[dup])) {
			found = true;
			dup = b;
			first = a;
		}
	}
	if (found) {
		p.line = t->line[dup];
		return bad(&p, CKPT_EFORMAT, "job '%s' is already defined on line %u",
		           t->job[dup].id, t->line[first]);
	}
	return 0;
}

static int table_read(const char *path, struct jobs_table **out)
{
	*out = NULL;
	struct stat st;
	char *buf;
	size_t len;
	int rc = read_whole(path, &st, &buf, &len);
	if (rc)
		return rc;
	struct jobs_table *t = ckpt_calloc(1, sizeof *t);
	if (!t) {
		rc = ckpt_err(-ENOMEM, "jobs file %s", path);
	} else {
		const char *slash = strrchr(path, '/');
		struct parse p = { .path = path, .st = &st,
		                   .dir_len = slash ? (size_t)(slash - path) + 1 : 0 };
		rc = parse_buf(&p, buf, len, t);
	}
	explicit_bzero(buf, len);                  /* inline secrets */
	ckpt_free(buf);
	if (rc) {
		table_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

/* ------------------------------------------------------------------ the handle */

int ckptd_jobs_load(const char *path, struct ckptd_jobs **out)
{
	*out = NULL;
	struct ckptd_jobs *j = ckpt_calloc(1, sizeof *j);
	if (!j || !(j->path = ckpt_strdup(path))) {
		ckpt_free(j);
		return ckpt_err(-ENOMEM, "jobs file %s", path);
	}
	int rc = table_read(path, &j->t);
	if (rc) {
		ckpt_free(j->path);
		ckpt_free(j);
		return rc;
	}
	/* Writers first: a reload waits for the lookups in progress, not for a stream of
	 * new ones. */
	pthread_rwlockattr_t a;
	pthread_rwlockattr_init(&a);
	pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	rc = pthread_rwlock_init(&j->lock, &a);
	pthread_rwlockattr_destroy(&a);
	if (rc) {
		table_free(j->t);
		ckpt_free(j->path);
		ckpt_free(j);
		return ckpt_err(-rc, "jobs file %s: lock", path);
	}
	*out = j;
	return 0;
}

int ckptd_jobs_reload(struct ckptd_jobs *j)
{
	struct jobs_table *t;
	int rc = table_read(j->path, &t);
	if (rc)
		return rc;
	pthread_rwlock_wrlock(&j->lock);
	struct jobs_table *old = j->t;
	j->t = t;
	pthread_rwlock_unlock(&j->lock);
	table_free(old);
	return 0;
}

int ckptd_jobs_get(struct ckptd_jobs *j, const char *id, size_t id_len, struct ckptd_job *out)
{
	int rc = CKPT_ENOTFOUND;
	pthread_rwlock_rdlock(&j->lock);
	const struct jobs_table *t = j->t;
	/* Bytewise, shorter first on a common prefix: strcmp's order on ids, which hold
	 * no NUL; a peer's id with a NUL in it matches none. */
	size_t lo = 0, hi = id_len && id_len <= CKPTD_MAX_JOB_ID ? t->n : 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct ckptd_job *job = &t->job[t->order[mid]];
		size_t n = strlen(job->id);
		int c = memcmp(id, job->id, id_len < n ? id_len : n);
		if (!c)
			c = (id_len > n) - (id_len < n);
		if (!c) {
			*out = *job;
			rc = 0;
			break;
		}
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	pthread_rwlock_unlock(&j->lock);
	if (rc) {
		char q[CKPT_NAME_QUOTE_CAP];
		return ckpt_err(rc, "job '%s' is not in %s", ckpt_name_quote(id, id_len, q, sizeof q),
		                j->path);
	}
	return 0;
}

unsigned ckptd_jobs_count(struct ckptd_jobs *j)
{
	pthread_rwlock_rdlock(&j->lock);
	unsigned n = j->t->n;
	pthread_rwlock_unlock(&j->lock);
	return n;
}

void ckptd_jobs_each(struct ckptd_jobs *j, void (*fn)(void *arg, const struct ckptd_job *job),
                     void *arg)
{
	pthread_rwlock_rdlock(&j->lock);
	for (unsigned i = 0; i < j->t->n; i++)
		fn(arg, &j->t->job[j->t->order[i]]);
	pthread_rwlock_unlock(&j->lock);
}

void ckptd_jobs_free(struct ckptd_jobs *j)
{
	if (!j)
		return;
	table_free(j->t);
	pthread_rwlock_destroy(&j->lock);
	ckpt_free(j->path);
	ckpt_free(j);
}
