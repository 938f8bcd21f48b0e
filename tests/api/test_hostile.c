/*
 * test_hostile.c — what operators and attackers do to a root, through the public
 * API: a deleted, emptied, truncated or replaced manifest; a second coordinator on
 * a live root or held by a forked child; garbage collection while a save is in
 * flight or while the job saves the step again; one step begun twice; file modes; a
 * job without a secret; a failing rank 0 and the ranks it must tell. Each case
 * checks that nothing committed is lost (the steps still load bit-exact once the
 * root is repaired) and that the refusal names the cause.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "testutil.h"

static char *root;

static void setup(void)
{
	root = tu_tmpdir("hostile");
	unsetenv("CKPT_FAULT");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	unsetenv("CKPT_GROUP_ACCESS");
	unsetenv("CKPT_JOB_SECRET");
	unsetenv("CKPT_JOB_SECRET_FILE");
	unsetenv("CKPT_AUTH");
}

static void teardown(void)
{
	tu_rmtree(root);
	free(root);
	root = NULL;
}

static void opts_for(struct ckpt_opts *o, int rank, int world, unsigned flags)
{
	ckpt_opts_init(o, sizeof *o);
	o->root = root;
	o->rank = rank;
	o->world = world;
	o->flags = flags;
	o->chunk_bytes = 8192;
	o->pool_bytes = 16 * 8192;
	o->timeout_ms = 5000;
	o->secret = "hostile-test-job-secret";
	o->secret_len = strlen(o->secret);
}

static ckpt_ctx *open_as(int rank, int world, unsigned flags)
{
	struct ckpt_opts o;
	opts_for(&o, rank, world, flags);
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "open: %s", ckpt_last_error());
	return c;
}

/* ckpt_open as (rank, world, flags) must fail with want, the message holding needle;
 * run in a child process, so that a crash (SIGBUS of a mapped file cut short) is a
 * failure of this test and not of the test program. */
static void expect_open_fails(int rank, int world, unsigned flags, int want, const char *needle)
{
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct ckpt_opts o;
		opts_for(&o, rank, world, flags);
		o.coord_port = 1;          /* never reached: the root checks come first */
		ckpt_ctx *c = (ckpt_ctx *)1;
		int rc = ckpt_open(&o, &c);
		if (rc != want || c != NULL) {
			fprintf(stderr, "rank %d flags 0x%x: open returned %d (want %d): %s\n", rank,
			        flags, rc, want, ckpt_last_error());
			_exit(1);
		}
		if (needle && !strstr(ckpt_last_error(), needle)) {
			fprintf(stderr, "message lacks '%s': %s\n", needle, ckpt_last_error());
			_exit(2);
		}
		_exit(0);
	}
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status), "ckpt_open (rank %d, flags 0x%x) died of signal %d",
	              rank, flags, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	ck_assert_msg(WEXITSTATUS(status) == 0, "ckpt_open (rank %d, flags 0x%x): see above",
	              rank, flags);
}

#define N 3000u

static void data_of(uint64_t step, float *w)
{
	tu_fill(w, sizeof(float) * N, tu_seed(), step);
}

static void save_step(uint64_t step)
{
	static float w[N];
	data_of(step, w);
	ckpt_ctx *c = open_as(0, 1, 0);
	ckpt_save *s;
	ck_assert_msg(ckpt_save_begin(c, step, &s) == 0, "%s", ckpt_last_error());
	uint64_t shape[1] = { N };
	struct ckpt_tensor t = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape, .data = w };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
	ckpt_close(c);
}

/* step is committed and loads bit-exact. */
static void check_step(uint64_t step)
{
	static float w[N], got[N];
	data_of(step, w);
	ckpt_ctx *c = open_as(0, 1, CKPT_OPEN_READONLY);
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, step, &l) == 0, "step %llu: %s",
	              (unsigned long long)step, ckpt_last_error());
	ck_assert_msg(ckpt_load_tensor(l, "w", CKPT_F32, 1, NULL, NULL, got, CKPT_MEM_HOST) == 0,
	              "%s", ckpt_last_error());
	ck_assert(!memcmp(w, got, sizeof w));
	ckpt_load_close(l);
	ckpt_close(c);
}

static int count_step_dirs(void)
{
	int n = 0;
	for (uint64_t s = 1; s <= 9; s++) {
		char p[4200];
		snprintf(p, sizeof p, "%s/step-%020llu", root, (unsigned long long)s);
		struct stat st;
		n += stat(p, &st) == 0;
	}
	return n;
}

/* Entries of the root whose name starts with prefix. */
static int count_entries(const char *prefix)
{
	DIR *d = opendir(root);
	ck_assert_ptr_nonnull(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += !strncmp(e->d_name, prefix, strlen(prefix));
	closedir(d);
	return n;
}

/* Rebuild from the shard files, then every step saved loads again. */
static void rebuild_and_check(uint64_t last)
{
	ckpt_ctx *c = open_as(0, 1, CKPT_OPEN_RECOVER);
	struct ckpt_rebuild_result rr = { .size = sizeof rr };
	ck_assert_msg(ckpt_catalog_rebuild(c, 0, NULL, NULL, &rr) == 0, "%s", ckpt_last_error());
	ck_assert_uint_eq(rr.steps_committed, last);
	ckpt_close(c);
	for (uint64_t s = 1; s <= last; s++)
		check_step(s);
}

static void every_open_refused(const char *needle)
{
	expect_open_fails(0, 1, 0, CKPT_ENOMANIFEST, needle);
	expect_open_fails(0, 1, CKPT_OPEN_NO_GC, CKPT_ENOMANIFEST, needle);
	expect_open_fails(0, 1, CKPT_OPEN_READONLY, CKPT_ENOMANIFEST, NULL);
	expect_open_fails(3, 4, CKPT_OPEN_READONLY, CKPT_ENOMANIFEST, NULL);
	/* A rank of a job learns it at once, not after the commit timeout. */
	expect_open_fails(1, 2, 0, CKPT_ENOMANIFEST, NULL);
}

START_TEST(deleted_manifest_refused)
{
	save_step(1);
	save_step(2);
	char p[4200];
	snprintf(p, sizeof p, "%s/manifest", root);
	tu_rmtree(p);
	every_open_refused("ckpt-inspect");
	ck_assert_int_eq(count_step_dirs(), 2);
	rebuild_and_check(2);
}
END_TEST

START_TEST(emptied_manifest_refused)
{
	save_step(1);
	save_step(2);
	char p[4200];
	snprintf(p, sizeof p, "%s/manifest/data.mdb", root);
	ck_assert_int_eq(truncate(p, 0), 0);
	every_open_refused("empty");
	ck_assert_int_eq(count_step_dirs(), 2);
	/* Never initialised in place by any of those opens. */
	struct stat st;
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_int_eq(st.st_size, 0);
	rebuild_and_check(2);
	/* The damaged manifest was set aside, not deleted. */
	ck_assert_int_eq(count_entries("manifest.damaged-"), 1);
}
END_TEST

START_TEST(truncated_manifest_no_sigbus)
{
	save_step(1);
	/* Enough steps that data.mdb outgrows the cuts below. */
	for (uint64_t s = 2; s <= 6; s++)
		save_step(s);
	char p[4200];
	snprintf(p, sizeof p, "%s/manifest/data.mdb", root);
	static const off_t cuts[] = { 4096, 8192, 12288, 100 };
	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		void *keep;
		size_t len;
		ck_assert_int_eq(tu_read_file(p, &keep, &len), 0);
		ck_assert_msg(len > 12288, "data.mdb of %zu bytes", len);
		ck_assert_int_eq(truncate(p, cuts[i]), 0);
		every_open_refused("cut short");
		ck_assert_int_eq(tu_write_file(p, keep, len), 0);
		free(keep);
	}
	/* Both meta pages name the last page 2^64-1: the page count must not wrap to 0
	 * and pass the size check. */
	void *keep;
	size_t len;
	ck_assert_int_eq(tu_read_file(p, &keep, &len), 0);
	uint8_t *b = malloc(len);
	memcpy(b, keep, len);
	uint32_t psize = (uint32_t)b[40] | (uint32_t)b[41] << 8 | (uint32_t)b[42] << 16 |
	                 (uint32_t)b[43] << 24;
	ck_assert_msg(psize >= 512 && psize <= 65536 && 2 * (size_t)psize <= len, "psize %u", psize);
	memset(b + 136, 0xff, 8);
	memset(b + psize + 136, 0xff, 8);
	ck_assert_int_eq(tu_write_file(p, b, len), 0);
	every_open_refused("cut short");
	ck_assert_int_eq(tu_write_file(p, keep, len), 0);
	free(b);
	free(keep);
	for (uint64_t s = 1; s <= 6; s++)
		check_step(s);
}
END_TEST

START_TEST(replaced_manifest_refused)
{
	save_step(1);
	save_step(2);
	/* Somebody "fixes" a lost manifest with a fresh one from another root. */
	char other[4300], cmd[9000];
	snprintf(other, sizeof other, "%s-other", root);
	struct ckpt_opts o;
	opts_for(&o, 0, 1, 0);
	o.root = other;
	ckpt_ctx *c;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	ckpt_close(c);
	snprintf(cmd, sizeof cmd, "rm -rf '%s/manifest' && mv '%s/manifest' '%s/manifest' && "
	         "rm -rf '%s'", root, other, root, other);
	ck_assert_int_eq(system(cmd), 0);
	expect_open_fails(0, 1, 0, CKPT_ENOMANIFEST, "no record");
	ck_assert_int_eq(count_step_dirs(), 2);
	c = open_as(0, 1, CKPT_OPEN_RECOVER);
	struct ckpt_rebuild_result rr = { .size = sizeof rr };
	ck_assert_msg(ckpt_catalog_rebuild(c, 0, NULL, NULL, &rr) == 0, "%s", ckpt_last_error());
	ckpt_close(c);
	check_step(1);
	check_step(2);
}
END_TEST

START_TEST(garbage_manifest_refused)
{
	save_step(1);
	char p[4200];
	snprintf(p, sizeof p, "%s/manifest/data.mdb", root);
	char junk[32768];
	memset(junk, 0x5a, sizeof junk);
	ck_assert_int_eq(tu_write_file(p, junk, sizeof junk), 0);
	every_open_refused("damaged");
	rebuild_and_check(1);
}
END_TEST

/* A coordinator of the root in a process of its own, open once this returns; gone
 * with kill(SIGKILL). Tests that fork ranks keep their own process free of
 * library threads so: ASan's allocator is not fork-safe while other threads run. */
static pid_t spawn_holder(void)
{
	int pipefd[2];
	ck_assert_int_eq(pipe(pipefd), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(pipefd[0]);
		struct ckpt_opts o;
		opts_for(&o, 0, 1, 0);
		ckpt_ctx *h;
		if (ckpt_open(&o, &h))
			_exit(1);
		ssize_t w = write(pipefd[1], "x", 1);
		(void)w;
		pause();
		_exit(0);
	}
	close(pipefd[1]);
	char b;
	ck_assert_msg(read(pipefd[0], &b, 1) == 1, "the holder could not open the root");
	close(pipefd[0]);
	return pid;
}

static void kill_holder(pid_t pid)
{
	kill(pid, SIGKILL);
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
}

START_TEST(second_coordinator_refused)
{
	save_step(1);
	/* A live coordinator holds the root: another one (a stale copy of the job, or
	 * a new job on the same root) is refused, naming the holder; readers are not. */
	pid_t pid = spawn_holder();
	expect_open_fails(0, 1, 0, -EBUSY, "in use by the coordinator of job 'default'");
	expect_open_fails(0, 1, CKPT_OPEN_NO_GC, -EBUSY, "pid");
	expect_open_fails(0, 1, CKPT_OPEN_RECOVER, -EBUSY, NULL);
	ckpt_ctx *r = open_as(0, 1, CKPT_OPEN_READONLY);
	ckpt_close(r);
	/* A holder killed with SIGKILL leaves no stale lock. */
	kill_holder(pid);
	ckpt_ctx *c = open_as(0, 1, 0);
	ckpt_close(c);
	/* Closed: free again. */
	c = open_as(0, 1, 0);
	ckpt_close(c);
	check_step(1);
}
END_TEST

/* Retention run by the job itself, on its own rank-0 context, while a save is in
 * flight: the save is no candidate (it shows as in flight), completes, and loads. */
START_TEST(gc_spares_the_save_in_flight)
{
	save_step(1);
	save_step(2);
	ckpt_ctx *c = open_as(0, 1, 0);
	struct tu_gate g;
	tu_gate_init(&g);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 3, &s), 0);
	uint64_t shape[1] = { 20000 };
	struct ckpt_tensor t = { .name = "big", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8,
		.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape };
	ck_assert_int_eq(ckpt_save_add_tensor_source(s, &t, tu_gate_source, &g), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	tu_gate_wait_entered(&g);     /* the worker is in the source */

	struct ckpt_step_info st[8];
	int n = ckpt_steps(c, CKPT_STEPS_ALL, st, 8, sizeof(struct ckpt_step_info));
	ck_assert_int_eq(n, 3);
	ck_assert(st[2].step == 3 && st[2].has_record && st[2].state == CKPT_STATE_INFLIGHT);
	struct ckpt_gc_opts o;
	ckpt_gc_opts_init(&o, sizeof o);
	o.keep_last = 1;
	o.flags = CKPT_GC_UNRECORDED;              /* even so */
	struct ckpt_gc_result r = { .size = sizeof r };
	ck_assert_msg(ckpt_catalog_gc(c, &o, &r) == 0, "%s", ckpt_last_error());
	ck_assert_uint_eq(r.steps_removed, 1);       /* step 1 only */
	/* Another process sees it in flight too, from the coordinator's lock. */
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct ckpt_opts ro;
		opts_for(&ro, 0, 1, CKPT_OPEN_READONLY);
		ckpt_ctx *rc;
		struct ckpt_step_info x[8];
		if (ckpt_open(&ro, &rc))
			_exit(1);
		int k = ckpt_steps(rc, CKPT_STEPS_ALL, x, 8, sizeof(struct ckpt_step_info));
		_exit(k == 2 && x[1].step == 3 && x[1].state == CKPT_STATE_INFLIGHT ? 0 : 2);
	}
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	tu_gate_release(&g);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
	ckpt_close(c);
	check_step(2);
	c = open_as(0, 1, CKPT_OPEN_READONLY);
	struct ckpt_step_info steps[4];
	ck_assert_int_eq(ckpt_steps(c, 0, steps, 4, sizeof *steps), 2);
	ck_assert(steps[0].step == 2 && steps[1].step == 3);
	ckpt_close(c);
	/* A save begun, never submitted, and the context closed: presumed aborted,
	 * collected by the next coordinator's GC. */
	c = open_as(0, 1, 0);
	ck_assert_int_eq(ckpt_save_begin(c, 4, &s), 0);
	ckpt_save_free(s);
	n = ckpt_steps(c, CKPT_STEPS_ALL, st, 8, sizeof(struct ckpt_step_info));
	ck_assert(n == 3 && st[2].step == 4 && st[2].state == CKPT_STATE_ABORTED);
	ckpt_close(c);
	tu_gate_close(&g);
}
END_TEST

static void add_w(ckpt_save *s, uint64_t step)
{
	static float w[N];
	data_of(step, w);
	uint64_t shape[1] = { N };
	struct ckpt_tensor t = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape, .data = w };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
}

/* Save step on the open context c (as check_step expects it). */
static void save_on(ckpt_ctx *c, uint64_t step)
{
	ckpt_save *s;
	ck_assert_msg(ckpt_save_begin(c, step, &s) == 0, "%s", ckpt_last_error());
	add_w(s, step);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
}

struct resave { ckpt_ctx *c; uint64_t step; int reports; };

/* gc's report of a step it is about to remove: the job saves that step again
 * first, as a retry after the abort would. */
static void resave_on_report(void *arg, const struct ckpt_gc_item *it)
{
	struct resave *r = arg;
	r->reports++;
	if (it->step == r->step)
		save_on(r->c, r->step);
}

/* Retention that the job runs itself lists an aborted step; before it removes it,
 * the job saves that step again and commits it. gc acts on what it listed only if
 * the record is still the one listed: the new commit stays, with its files. */
START_TEST(gc_spares_a_step_saved_again)
{
	ckpt_ctx *c = open_as(0, 1, 0);
	save_on(c, 1);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 2, &s), 0);
	ckpt_save_free(s);                          /* never submitted: aborted */
	struct ckpt_step_info st[4];
	ck_assert_int_eq(ckpt_steps(c, CKPT_STEPS_ALL, st, 4, sizeof(struct ckpt_step_info)), 2);
	ck_assert(st[1].step == 2 && st[1].state == CKPT_STATE_ABORTED);
	struct resave r = { c, 2, 0 };
	struct ckpt_gc_opts o;
	ckpt_gc_opts_init(&o, sizeof o);
	o.report = resave_on_report;
	o.arg = &r;
	struct ckpt_gc_result res = { .size = sizeof res };
	ck_assert_msg(ckpt_catalog_gc(c, &o, &res) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(r.reports, 1);
	ckpt_close(c);
	check_step(1);
	check_step(2);
	ck_assert_uint_eq(res.steps_removed, 0);
}
END_TEST

/* One attempt at a step at a time in a context: a second begin of a step whose save
 * is not finished would remove the first one's files. */
START_TEST(one_save_of_a_step_at_a_time)
{
	ckpt_ctx *c = open_as(0, 1, 0);
	ckpt_save *s, *s2 = (ckpt_save *)1;
	ck_assert_int_eq(ckpt_save_begin(c, 5, &s), 0);
	ck_assert_int_eq(ckpt_save_begin(c, 5, &s2), -EBUSY);
	ck_assert_ptr_null(s2);
	ck_assert_msg(strstr(ckpt_last_error(), "step 5") && strstr(ckpt_last_error(), root),
	              "%s", ckpt_last_error());
	add_w(s, 5);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	/* Finished (not yet freed): the step is committed, and says so. */
	ck_assert_int_eq(ckpt_save_begin(c, 5, &s2), -EEXIST);
	ckpt_save_free(s);
	/* Another step meanwhile is fine. */
	save_on(c, 6);
	ckpt_close(c);
	check_step(5);
	check_step(6);
}
END_TEST

/* A process forked while its coordinator holds the root (a data-loader worker) does
 * not keep the root once the coordinator closes or dies. */
START_TEST(forked_child_does_not_hold_the_root)
{
	ckpt_ctx *c = open_as(0, 1, 0);
	save_on(c, 1);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		pause();
		_exit(0);
	}
	ckpt_close(c);
	struct ckpt_opts o;
	opts_for(&o, 0, 1, 0);
	c = NULL;
	int rc = ckpt_open(&o, &c);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	ck_assert_msg(rc == 0, "reopen with a forked child alive: %s", ckpt_last_error());
	save_on(c, 2);
	ckpt_close(c);
	check_step(1);
	check_step(2);
}
END_TEST

/* Files and directories are private unless group access is asked for. */
START_TEST(private_modes)
{
	mode_t old = umask(0);
	save_step(1);
	char p[4300];
	struct stat st;
	snprintf(p, sizeof p, "%s/step-%020d", root, 1);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0700);
	ck_assert_int_eq(tu_shard_path(root, 1, 0, p, sizeof p), 0);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0600);
	static const char *const files[] = { "manifest/data.mdb", "manifest/lock.mdb",
	                                     "coordinator.lock" };
	for (size_t i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s/%s", root, files[i]);
		ck_assert_int_eq(stat(p, &st), 0);
		ck_assert_msg((st.st_mode & 0777) == 0600, "%s: %o", files[i], st.st_mode & 0777);
	}
	snprintf(p, sizeof p, "%s/manifest", root);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0700);
	/* A root the library creates is private too; group access when asked. */
	char sub[4300];
	snprintf(sub, sizeof sub, "%s/new/root", root);
	struct ckpt_opts o;
	opts_for(&o, 0, 1, 0);
	o.root = sub;
	ckpt_ctx *c;
	ck_assert_int_eq(ckpt_open(&o, &c), 0);
	ckpt_close(c);
	ck_assert_int_eq(stat(sub, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0700);
	setenv("CKPT_GROUP_ACCESS", "1", 1);
	c = open_as(0, 1, 0);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 2, &s), 0);
	uint8_t x[100] = { 1 };
	ck_assert_int_eq(ckpt_save_add_blob(s, "x", CKPT_KIND_EXTRA, CKPT_REPLICATED, x, sizeof x), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	ckpt_save_free(s);
	ckpt_close(c);
	unsetenv("CKPT_GROUP_ACCESS");
	snprintf(p, sizeof p, "%s/step-%020d", root, 2);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0750);
	ck_assert_int_eq(tu_shard_path(root, 2, 0, p, sizeof p), 0);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0640);
	umask(old);
}
END_TEST

/* ckpt_open of rank of world with no secret in the options: its result. */
static int open_nosecret(int rank, int world, unsigned flags)
{
	struct ckpt_opts o;
	opts_for(&o, rank, world, flags);
	o.secret = NULL;
	o.secret_len = 0;
	o.coord_port = 1;           /* never reached: the checks come first */
	o.timeout_ms = 200;
	ckpt_ctx *c = NULL;
	int rc = ckpt_open(&o, &c);
	ckpt_close(c);
	return rc;
}

/* A job of several ranks never runs unauthenticated by accident: no secret is
 * CKPT_EAUTH at open on every rank, naming what to set; opting out is explicit; a
 * secret file others can read is refused. */
START_TEST(secret_required)
{
	for (int r = 0; r < 3; r++) {
		ck_assert_int_eq(open_nosecret(r, 3, 0), CKPT_EAUTH);
		ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "CKPT_JOB_SECRET"));
	}
	/* One rank, or a reader, has no peers. */
	ck_assert_int_eq(open_nosecret(0, 1, 0), 0);
	ck_assert_int_eq(open_nosecret(1, 3, CKPT_OPEN_READONLY), 0);
	/* The explicit opt-out gets past the check (then fails to reach the coordinator). */
	setenv("CKPT_AUTH", "off", 1);
	ck_assert_int_ne(open_nosecret(1, 3, 0), CKPT_EAUTH);
	setenv("CKPT_AUTH", "maybe", 1);
	ck_assert_int_eq(open_nosecret(1, 3, 0), -EINVAL);
	unsetenv("CKPT_AUTH");
	ck_assert_int_ne(open_nosecret(1, 3, CKPT_OPEN_NO_AUTH), CKPT_EAUTH);
	/* A secret file: only its owner may read it. */
	char f[4300];
	snprintf(f, sizeof f, "%s-secret", root);
	ck_assert_int_eq(tu_write_file(f, "s3cr3t-from-a-file-0123456789\n", 30), 0);
	ck_assert_int_eq(chmod(f, 0644), 0);
	setenv("CKPT_JOB_SECRET_FILE", f, 1);
	ck_assert_int_eq(open_nosecret(1, 3, 0), CKPT_EAUTH);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "chmod 600"));
	ck_assert_int_eq(chmod(f, 0600), 0);
	ck_assert_int_ne(open_nosecret(1, 3, 0), CKPT_EAUTH);
	ck_assert_int_eq(tu_write_file(f, "\n", 1), 0);
	ck_assert_int_eq(open_nosecret(1, 3, 0), CKPT_EAUTH);       /* empty */
	unsetenv("CKPT_JOB_SECRET_FILE");
	unlink(f);
}
END_TEST

/* Rank 0 cannot start the coordinator (another process holds the root): the other
 * rank learns why within seconds, not after its 60 s connect timeout. */
START_TEST(ranks_learn_why_rank0_failed)
{
	save_step(1);
	pid_t holder = spawn_holder();                 /* another job's coordinator */
	unsigned port = tu_free_port();
	pid_t pids[2];
	for (int r = 0; r < 2; r++) {
		pids[r] = fork();
		ck_assert_int_ge(pids[r], 0);
		if (pids[r] == 0) {
			struct ckpt_opts o;
			opts_for(&o, r, 2, 0);
			o.coord_addr = "127.0.0.1";
			o.coord_port = port;
			o.timeout_ms = 60000;
			ckpt_ctx *c;
			struct timespec ts0, ts1;
			clock_gettime(CLOCK_MONOTONIC, &ts0);
			int rc = ckpt_open(&o, &c);
			clock_gettime(CLOCK_MONOTONIC, &ts1);
			double s = (double)(ts1.tv_sec - ts0.tv_sec) + (double)(ts1.tv_nsec - ts0.tv_nsec) / 1e9;
			const char *m = ckpt_last_error();
			fprintf(stderr, "rank %d: %d after %.2f s: %s\n", r, rc, s, m);
			if (r == 0)
				_exit(rc == -EBUSY ? 0 : 1);
			_exit(rc != 0 && s < 20 && strstr(m, "could not start the coordinator") &&
			      strstr(m, "in use by the coordinator") ? 0 : 2);
		}
	}
	for (int r = 0; r < 2; r++) {
		int status;
		ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: status 0x%x",
		              r, status);
	}
	kill_holder(holder);
	check_step(1);
}
END_TEST

/* Rank 0 of a job of two finds the manifest gone and tells rank 1 why for seconds:
 * meanwhile the root is free, so the operator can run the rebuild that the message
 * asks for. */
START_TEST(root_free_while_rank0_refuses)
{
	save_step(1);
	char p[4200];
	snprintf(p, sizeof p, "%s/manifest", root);
	tu_rmtree(p);
	unsigned port = tu_free_port();
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct ckpt_opts o;
		opts_for(&o, 0, 2, 0);
		o.coord_addr = "127.0.0.1";
		o.coord_port = port;
		o.timeout_ms = 8000;                   /* the refusal lasts as long */
		ckpt_ctx *c;
		int rc = ckpt_open(&o, &c);
		_exit(rc == CKPT_ENOMANIFEST ? 0 : 1);
	}
	/* The child has taken the root once its pid is in the lock file. */
	char want[64], lock[4200];
	snprintf(want, sizeof want, "pid: %ld\n", (long)pid);
	snprintf(lock, sizeof lock, "%s/coordinator.lock", root);
	bool taken = false;
	for (int i = 0; i < 1000 && !taken; i++) {
		void *text;
		size_t len;
		if (tu_read_file(lock, &text, &len) == 0) {
			taken = memmem(text, len, want, strlen(want)) != NULL;
			free(text);
		}
		if (!taken)
			usleep(10000);
	}
	ck_assert_msg(taken, "rank 0 never took the root");
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rebuild_and_check(1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 0: status 0x%x", status);
	/* The rebuild ran during the refusal, not after it. */
	ck_assert_int_lt(t1.tv_sec - t0.tv_sec, 6);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("hostile");
	TCase *t = tcase_create("manifest");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, deleted_manifest_refused);
	tcase_add_test(t, emptied_manifest_refused);
	tcase_add_test(t, truncated_manifest_no_sigbus);
	tcase_add_test(t, replaced_manifest_refused);
	tcase_add_test(t, garbage_manifest_refused);
	tcase_add_test(t, second_coordinator_refused);
	tcase_add_test(t, gc_spares_the_save_in_flight);
	tcase_add_test(t, gc_spares_a_step_saved_again);
	tcase_add_test(t, one_save_of_a_step_at_a_time);
	tcase_add_test(t, forked_child_does_not_hold_the_root);
	tcase_add_test(t, private_modes);
	tcase_add_test(t, secret_required);
	tcase_add_test(t, ranks_learn_why_rank0_failed);
	tcase_add_test(t, root_free_while_rank0_refuses);
	tcase_set_timeout(t, 120);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	tu_seed();
	SRunner *r = srunner_create(suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? 1 : 0;
}
