/*
 * test_jobs.c — ckptd's jobs file (ckptd/jobs.c): a good file read whole; every kind
 * of bad line refused with a message naming file and line (and never the secret);
 * the permission rules for secret files and inline secrets; lookups by a peer's
 * bytes; reloads that keep the table in use on a bad file, also while other threads
 * look jobs up; allocation failure at every allocation.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptd.h"
#include "testutil.h"

#define SECRET_MARK "TOPSECRET"   /* in every inline secret: never in a message */

static char *dir;

static void setup(void) { dir = tu_tmpdir("ckptd-jobs"); }
static void teardown(void) { tu_rmtree(dir); free(dir); }

/* dir/name holding text, with mode. The path is static storage, valid for the next
 * seven calls. */
static const char *put(const char *name, const char *text, mode_t mode)
{
	static char paths[8][4200];
	static unsigned next;
	char *p = paths[next++ % 8];
	snprintf(p, sizeof paths[0], "%s/%s", dir, name);
	ck_assert_int_eq(tu_write_file(p, text, strlen(text)), 0);
	ck_assert_int_eq(chmod(p, mode), 0);
	return p;
}

static void get_ok(struct ckptd_jobs *j, const char *id, const char *secret, uint64_t quota)
{
	struct ckptd_job job;
	ck_assert_msg(ckptd_jobs_get(j, id, strlen(id), &job) == 0, "%s: %s", id, ckpt_err_msg());
	ck_assert_str_eq(job.id, id);
	ck_assert_uint_eq(job.secret_len, strlen(secret));
	ck_assert_mem_eq(job.secret, secret, job.secret_len);
	ck_assert_uint_eq(job.quota_bytes, quota);
	explicit_bzero(&job, sizeof job);
}

static void collect(void *arg, const struct ckptd_job *job)
{
	char *s = arg;
	strcat(s, job->id);
	strcat(s, ",");
}

START_TEST(good_file)
{
	put("alpha.secret", "alpha-secret-0123456789\n", 0600);
	char abs_path[4300];
	snprintf(abs_path, sizeof abs_path, "%s/beta.secret", dir);
	put("beta.secret", "beta-secret\r\n", 0600);
	char text[8192];
	snprintf(text, sizeof text,
	         "# jobs of this node\n"
	         "\n"
	         "   \t\n"
	         "alpha secret-file=alpha.secret quota=10G   # relative to the jobs file\n"
	         "beta\tsecret-file=%s\tquota=1\r\n"
	         "  gamma.v2_x-Y  secret=" SECRET_MARK "#not-a-comment quota=3KiB\n"
	         "   # an indented comment\n"
	         "delta secret=" SECRET_MARK "-d quota=18014398509481983k\n"
	         "...  secret=" SECRET_MARK "-dots",                   /* no final newline */
	         abs_path);
	const char *path = put("jobs", text, 0600);
	struct ckptd_jobs *j = NULL;
	ck_assert_msg(ckptd_jobs_load(path, &j) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_eq(ckptd_jobs_count(j), 5);
	get_ok(j, "alpha", "alpha-secret-0123456789", 10ull << 30);
	get_ok(j, "beta", "beta-secret", 1);
	get_ok(j, "gamma.v2_x-Y", SECRET_MARK "#not-a-comment", 3 << 10);
	get_ok(j, "delta", SECRET_MARK "-d", 18014398509481983ull << 10);
	get_ok(j, "...", SECRET_MARK "-dots", 0);
	char ids[256] = "";
	ckptd_jobs_each(j, collect, ids);
	ck_assert_str_eq(ids, "...,alpha,beta,delta,gamma.v2_x-Y,");
	ckptd_jobs_free(j);
	ckptd_jobs_free(NULL);

	/* Nothing but comments: a table of no jobs. A file owned by this user, readable
	 * by others, with secret files only, is fine. */
	path = put("jobs", "# none yet\n", 0644);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), 0);
	ck_assert_uint_eq(ckptd_jobs_count(j), 0);
	struct ckptd_job job;
	ck_assert_int_eq(ckptd_jobs_get(j, "alpha", 5, &job), CKPT_ENOTFOUND);
	ckptd_jobs_free(j);
	path = put("jobs", "alpha secret-file=alpha.secret\n", 0644);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), 0);
	ckptd_jobs_free(j);
}
END_TEST

/* One bad line each: the code, the line named, a word of the reason. */
static const struct bad_case {
	const char *text;
	int rc;
	unsigned line;
	const char *why;
} bad_cases[] = {
	{ "a secret-file=s\nb secret-file=s colour=blue\n", CKPT_EFORMAT, 2, "unknown key 'colour'" },
	{ "a quota=1G\n", CKPT_EFORMAT, 1, "no secret" },
	{ "a secret-file=s secret=" SECRET_MARK "\n", CKPT_EFORMAT, 1, "both secret" },
	{ "a secret=" SECRET_MARK " secret=" SECRET_MARK "2\n", CKPT_EFORMAT, 1, "given twice" },
	{ "a secret-file=s quota=1 quota=2\n", CKPT_EFORMAT, 1, "given twice" },
	{ "a secret-file=\n", CKPT_EFORMAT, 1, "without a value" },
	{ "a secret-file=s loose\n", CKPT_EFORMAT, 1, "not key=value" },
	{ "../x secret-file=s\n", CKPT_EFORMAT, 1, "job id '../x'" },
	{ ".. secret-file=s\n", CKPT_EFORMAT, 1, "may not be . or .." },
	{ "\n. secret-file=s\n", CKPT_EFORMAT, 2, "may not be . or .." },
	{ "a/b secret-file=s\n", CKPT_EFORMAT, 1, "may hold only" },
	{ "a:b secret-file=s\n", CKPT_EFORMAT, 1, "may hold only" },
	{ "caf\xc3\xa9 secret-file=s\n", CKPT_EFORMAT, 1, "may hold only" },
	{ "a=b secret-file=s\n", CKPT_EFORMAT, 1, "may hold only" },
	{ "a secret-file=s\n\na secret-file=s\n", CKPT_EFORMAT, 3, "already defined on line 1" },
	{ "b secret-file=s\na secret-file=s\nb secret-file=s\na secret-file=s\n", CKPT_EFORMAT, 3,
	  "job 'b' is already defined on line 1" },
	{ "a secret-file=s quota=10X\n", CKPT_EFORMAT, 1, "quota '10X'" },
	{ "a secret-file=s quota=-1\n", CKPT_EFORMAT, 1, "quota '-1'" },
	{ "a secret-file=s quota=+1\n", CKPT_EFORMAT, 1, "quota '+1'" },
	{ "a secret-file=s quota=1.5G\n", CKPT_EFORMAT, 1, "quota '1.5G'" },
	{ "a secret-file=s quota=G\n", CKPT_EFORMAT, 1, "quota 'G'" },
	{ "a secret-file=s quota=0\n", CKPT_EFORMAT, 1, "at least 1 byte" },
	{ "a secret-file=s quota=16777216T\n", CKPT_EFORMAT, 1, "does not fit in 64 bits" },
	{ "a secret-file=s quota=18446744073709551616\n", CKPT_EFORMAT, 1, "does not fit" },
	{ "a secret-file=s quota=99999999999999999999999G\n", CKPT_EFORMAT, 1, "does not fit" },
	{ "a secret-file=s\nb secret=" SECRET_MARK "\x01x\n", CKPT_EFORMAT, 2, "control character" },
	{ "a secret-file=s\rb secret-file=s\n", CKPT_EFORMAT, 1, "control character 0x0d" },
	{ "a secret-file=missing\n", -ENOENT, 1, "/missing'" },
	{ "a secret-file=empty\n", CKPT_EFORMAT, 1, "the secret must be 1..4096 bytes" },
	{ "a secret-file=open\n", -EPERM, 1, "chmod 600" },
};

START_TEST(bad_lines)
{
	put("s", "secret-in-a-file", 0600);
	put("empty", "\n", 0600);
	put("open", "world-readable", 0644);
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(bad_cases); i++) {
		const struct bad_case *c = &bad_cases[i];
		const char *path = put("jobs", c->text, 0600);
		struct ckptd_jobs *j = (void *)1;
		int rc = ckptd_jobs_load(path, &j);
		const char *msg = ckpt_err_msg();
		ck_assert_msg(rc == c->rc, "case %zu: %d, not %d (%s)", i, rc, c->rc, msg);
		ck_assert_ptr_null(j);
		char where[4300];
		snprintf(where, sizeof where, "%s:%u: ", path, c->line);
		ck_assert_msg(strstr(msg, where), "case %zu: '%s' does not name %s", i, msg, where);
		ck_assert_msg(strstr(msg, c->why), "case %zu: '%s' lacks '%s'", i, msg, c->why);
		ck_assert_msg(!strstr(msg, SECRET_MARK), "case %zu: '%s' shows the secret", i, msg);
	}
}
END_TEST

/* Sizes: an id of 128 characters and a secret of 4096 bytes are the largest; a NUL
 * byte, a line over 16 KiB and more than CKPTD_MAX_JOBS jobs are refused. */
START_TEST(limits)
{
	put("s", "x", 0600);
	char id[CKPTD_MAX_JOB_ID + 2];
	memset(id, 'i', sizeof id);
	id[CKPTD_MAX_JOB_ID] = '\0';
	char *text = malloc(64 << 10);
	char *secret = malloc(CKPTD_MAX_SECRET + 2);
	memset(secret, 'S', CKPTD_MAX_SECRET + 1);
	secret[CKPTD_MAX_SECRET] = '\0';
	snprintf(text, 64 << 10, "%s secret=%s\n", id, secret);
	struct ckptd_jobs *j;
	const char *path = put("jobs", text, 0600);
	ck_assert_msg(ckptd_jobs_load(path, &j) == 0, "%s", ckpt_err_msg());
	get_ok(j, id, secret, 0);
	ckptd_jobs_free(j);

	id[CKPTD_MAX_JOB_ID] = 'i';
	id[CKPTD_MAX_JOB_ID + 1] = '\0';
	snprintf(text, 64 << 10, "%s secret-file=s\n", id);
	path = put("jobs", text, 0600);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "1 to 128 characters"));

	secret[CKPTD_MAX_SECRET] = 'S';
	secret[CKPTD_MAX_SECRET + 1] = '\0';
	snprintf(text, 64 << 10, "a secret=%s\n", secret);
	path = put("jobs", text, 0600);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "at most 4096"));
	ck_assert_ptr_null(strstr(ckpt_err_msg(), "SSSS"));

	/* A NUL byte: written by hand, strlen would stop at it. */
	char path_nul[4300];
	snprintf(path_nul, sizeof path_nul, "%s/jobs-nul", dir);
	ck_assert_int_eq(tu_write_file(path_nul, "a secret-file=s\nb se\0cret-file=s\n", 33), 0);
	ck_assert_int_eq(chmod(path_nul, 0600), 0);
	ck_assert_int_eq(ckptd_jobs_load(path_nul, &j), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), ":2: a NUL byte at column 5"));

	/* A secret-file path past PATH_MAX. */
	strcpy(text, "a secret-file=");
	memset(text + 14, 'p', 5000);
	strcpy(text + 14 + 5000, "\n");
	path = put("jobs", text, 0600);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), ":1: job 'a': secret-file 'ppp"));
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "...': path too long"));

	memset(text, ' ', 20000);
	memcpy(text, "a secret-file=s", 15);
	strcpy(text + 20000, "\n");
	path = put("jobs", text, 0600);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), ":1: line longer than 16384 bytes"));
	free(text);
	free(secret);

	size_t cap = (CKPTD_MAX_JOBS + 1) * 32;
	char *many = malloc(cap), *p = many;
	for (unsigned i = 0; i <= CKPTD_MAX_JOBS; i++)
		p += sprintf(p, "j%u secret-file=s\n", i);
	path = put("jobs", many, 0600);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), CKPT_EFORMAT);
	char where[64];
	snprintf(where, sizeof where, ":%u: more than %u jobs", CKPTD_MAX_JOBS + 1, CKPTD_MAX_JOBS);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), where));
	/* The last line gone: exactly the most. */
	*strrchr(many, 'j') = '\0';
	path = put("jobs", many, 0600);
	ck_assert_msg(ckptd_jobs_load(path, &j) == 0, "%s", ckpt_err_msg());
	ck_assert_uint_eq(ckptd_jobs_count(j), CKPTD_MAX_JOBS);
	ckptd_jobs_free(j);
	free(many);
}
END_TEST

/* Who may read the secrets, and who may write the jobs file. */
START_TEST(permissions)
{
	struct ckptd_jobs *j;
	put("s", "secret-in-a-file", 0640);
	const char *path = put("jobs", "a secret-file=s\n", 0600);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), -EPERM);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "mode 640; chmod 600"));
	put("s", "secret-in-a-file", 0400);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), 0);
	ckptd_jobs_free(j);

	/* An inline secret makes the jobs file a secret file. */
	static const mode_t open_modes[] = { 0640, 0604, 0644 };
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(open_modes); i++) {
		path = put("jobs", "a secret-file=s\nb secret=" SECRET_MARK "\n", open_modes[i]);
		ck_assert_int_eq(ckptd_jobs_load(path, &j), -EPERM);
		ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), ":2: job 'b': secret= in a jobs file"));
		ck_assert_ptr_null(strstr(ckpt_err_msg(), SECRET_MARK));
	}
	/* Whoever may write it may add a job. */
	path = put("jobs", "a secret-file=s\n", 0620);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), -EPERM);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "chmod go-w"));
	path = put("jobs", "a secret-file=s\n", 0602);
	ck_assert_int_eq(ckptd_jobs_load(path, &j), -EPERM);

	char missing[4300];
	snprintf(missing, sizeof missing, "%s/no-such-jobs", dir);
	ck_assert_int_eq(ckptd_jobs_load(missing, &j), -ENOENT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), missing));
	ck_assert_int_eq(ckptd_jobs_load(dir, &j), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "not a regular file"));
}
END_TEST

/* A peer's id is bytes with a length: no NUL, maybe a prefix or an extension of a
 * real id. */
START_TEST(lookup_bytes)
{
	put("s", "secret-in-a-file", 0600);
	const char *path = put("jobs", "alpha secret-file=s\nalpha-2 secret-file=s\n"
	                               "b secret-file=s\n", 0600);
	struct ckptd_jobs *j;
	ck_assert_int_eq(ckptd_jobs_load(path, &j), 0);
	struct ckptd_job job;
	const char peer[] = { 'a', 'l', 'p', 'h', 'a', '-', '2', 'X' };   /* no NUL */
	ck_assert_int_eq(ckptd_jobs_get(j, peer, 5, &job), 0);
	ck_assert_str_eq(job.id, "alpha");
	ck_assert_int_eq(ckptd_jobs_get(j, peer, 7, &job), 0);
	ck_assert_str_eq(job.id, "alpha-2");
	ck_assert_int_eq(ckptd_jobs_get(j, peer, 8, &job), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckptd_jobs_get(j, peer, 4, &job), CKPT_ENOTFOUND);   /* "alph" */
	ck_assert_int_eq(ckptd_jobs_get(j, peer, 6, &job), CKPT_ENOTFOUND);   /* "alpha-" */
	ck_assert_int_eq(ckptd_jobs_get(j, peer, 0, &job), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckptd_jobs_get(j, NULL, 0, &job), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckptd_jobs_get(j, "b", 1, &job), 0);
	ck_assert_int_eq(ckptd_jobs_get(j, "b\0", 2, &job), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckptd_jobs_get(j, "\0b", 2, &job), CKPT_ENOTFOUND);
	ck_assert_int_eq(ckptd_jobs_get(j, "B", 1, &job), CKPT_ENOTFOUND);
	/* The message quotes what the peer sent, escaped. */
	ck_assert_int_eq(ckptd_jobs_get(j, "x\n\xff", 3, &job), CKPT_ENOTFOUND);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "'x\\x0a\\xff'"));
	char big[4096];
	memset(big, 'a', sizeof big);
	ck_assert_int_eq(ckptd_jobs_get(j, big, sizeof big, &job), CKPT_ENOTFOUND);
	explicit_bzero(&job, sizeof job);
	ckptd_jobs_free(j);
}
END_TEST

START_TEST(reload_keeps_or_swaps)
{
	put("s", "secret-one", 0600);
	const char *path = put("jobs", "old secret-file=s quota=1M\n", 0600);
	struct ckptd_jobs *j;
	ck_assert_int_eq(ckptd_jobs_load(path, &j), 0);
	/* A bad edit: refused, the table in use stays. */
	put("jobs", "old secret-file=s quota=1M\nnew secret-file=s quota=lots\n", 0600);
	ck_assert_int_eq(ckptd_jobs_reload(j), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), ":2: job 'new': quota 'lots'"));
	get_ok(j, "old", "secret-one", 1 << 20);
	ck_assert_uint_eq(ckptd_jobs_count(j), 1);
	/* The file gone: likewise. */
	char moved[4300];
	snprintf(moved, sizeof moved, "%s/jobs.moved", dir);
	ck_assert_int_eq(rename(path, moved), 0);
	ck_assert_int_eq(ckptd_jobs_reload(j), -ENOENT);
	get_ok(j, "old", "secret-one", 1 << 20);
	/* A good edit: swapped in whole, the secret file read again. */
	put("s", "secret-two", 0600);
	put("jobs", "new secret-file=s quota=2M\nnewer secret=" SECRET_MARK "\n", 0600);
	ck_assert_int_eq(ckptd_jobs_reload(j), 0);
	struct ckptd_job job;
	ck_assert_int_eq(ckptd_jobs_get(j, "old", 3, &job), CKPT_ENOTFOUND);
	get_ok(j, "new", "secret-two", 2 << 20);
	get_ok(j, "newer", SECRET_MARK, 0);
	ck_assert_uint_eq(ckptd_jobs_count(j), 2);
	ckptd_jobs_free(j);
}
END_TEST

/* Lookups on other threads while the table is swapped: each sees one table or the
 * other, whole (a job's secret always matches its id). */
struct looker { struct ckptd_jobs *j; volatile int *stop; unsigned found; };

static void *look(void *arg)
{
	struct looker *l = arg;
	struct ckptd_job job;
	while (!__atomic_load_n(l->stop, __ATOMIC_ACQUIRE)) {
		for (int k = 0; k < 2; k++) {
			const char *id = k ? "even" : "odd";
			if (ckptd_jobs_get(l->j, id, strlen(id), &job) == 0) {
				ck_assert_uint_eq(job.secret_len, strlen(id) + 7);
				ck_assert_mem_eq(job.secret, id, strlen(id));
				l->found++;
			}
		}
		ck_assert_uint_le(ckptd_jobs_count(l->j), 2);
	}
	explicit_bzero(&job, sizeof job);
	return NULL;
}

static void count_each(void *arg, const struct ckptd_job *job)
{
	CKPT_UNUSED(job);
	++*(unsigned *)arg;
}

START_TEST(reload_under_lookups)
{
	const char *path = put("jobs", "odd secret=odd-secret\n", 0600);
	struct ckptd_jobs *j;
	ck_assert_int_eq(ckptd_jobs_load(path, &j), 0);
	volatile int stop = 0;
	struct looker l[3];
	pthread_t t[3];
	for (int i = 0; i < 3; i++) {
		l[i] = (struct looker){ .j = j, .stop = &stop };
		ck_assert_int_eq(pthread_create(&t[i], NULL, look, &l[i]), 0);
	}
	for (int r = 0; r < 200; r++) {
		put("jobs", r % 2 ? "odd secret=odd-secret\n"
		                  : "even secret=even-secret\nodd secret=odd-secret\n", 0600);
		ck_assert_int_eq(ckptd_jobs_reload(j), 0);
		if (r % 7 == 0) {
			put("jobs", "broken\n", 0600);
			ck_assert_int_eq(ckptd_jobs_reload(j), CKPT_EFORMAT);
		}
		unsigned n = 0;
		ckptd_jobs_each(j, count_each, &n);
		ck_assert_uint_eq(n, r % 2 ? 1 : 2);
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	unsigned found = 0;
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(pthread_join(t[i], NULL), 0);
		found += l[i].found;
	}
	ck_assert_uint_gt(found, 0);
	ckptd_jobs_free(j);
}
END_TEST

/* The Nth allocation of a load and of a reload fails, for every N: -ENOMEM, nothing
 * leaked, and a failed reload keeps the table. */
START_TEST(alloc_failure)
{
	put("s", "secret-in-a-file", 0600);
	const char *path = put("jobs", "a secret-file=s\nb secret=x quota=1K\n", 0600);
	int64_t live = ckpt_fault_alloc_live();
	struct ckptd_jobs *j = NULL;
	unsigned n;
	for (n = 1; n < 100; n++) {
		ckpt_fault_alloc_arm(n);
		int rc = ckptd_jobs_load(path, &j);
		ckpt_fault_alloc_arm(0);
		if (rc == 0)
			break;
		ck_assert_msg(rc == -ENOMEM, "allocation %u: %d (%s)", n, rc, ckpt_err_msg());
		ck_assert_ptr_null(j);
		ck_assert_int_eq(ckpt_fault_alloc_live(), live);
	}
	ck_assert_uint_gt(n, 3);
	ck_assert_ptr_nonnull(j);
	int64_t loaded = ckpt_fault_alloc_live();
	put("jobs", "c secret-file=s\n", 0600);
	for (n = 1; n < 100; n++) {
		ckpt_fault_alloc_arm(n);
		int rc = ckptd_jobs_reload(j);
		ckpt_fault_alloc_arm(0);
		if (rc == 0)
			break;
		ck_assert_int_eq(rc, -ENOMEM);
		ck_assert_int_eq(ckpt_fault_alloc_live(), loaded);
		get_ok(j, "b", "x", 1024);
	}
	ck_assert_uint_gt(n, 3);
	get_ok(j, "c", "secret-in-a-file", 0);
	ckptd_jobs_free(j);
	ck_assert_int_eq(ckpt_fault_alloc_live(), live);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ckptd_jobs");
	TCase *tc = tcase_create("jobs");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, good_file);
	tcase_add_test(tc, bad_lines);
	tcase_add_test(tc, limits);
	tcase_add_test(tc, permissions);
	tcase_add_test(tc, lookup_bytes);
	tcase_add_test(tc, reload_keeps_or_swaps);
	tcase_add_test(tc, reload_under_lookups);
	tcase_add_test(tc, alloc_failure);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
