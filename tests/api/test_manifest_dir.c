/*
 * test_manifest_dir.c — a manifest kept apart from its root (ckpt_opts.manifest_dir,
 * CKPT_MANIFEST_DIR), through the public API: saves by one rank and by three rank
 * processes leave no <root>/manifest and load bit-exact through the option and
 * through the variable; a rank whose manifest directory is not on its host (rank 0's
 * local disk, seen from another node) saves its part and is refused loads with the
 * directory named, and so is one that finds a stale copy of it; a relative directory, a second root on a used manifest directory
 * and a root with a manifest of its own are refused, naming what is wrong; a lost
 * manifest is rebuilt into a new directory and a damaged one is set aside beside
 * its directory; creation leftovers beside it are removed.
 *
 * The tools over the same layout: tests/cli/test_manifest_dir.sh.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "testutil.h"

static char *base;                     /* the test's directory */
static char root[PATH_MAX];            /* base/global/root: the shard files */
static char mdir[PATH_MAX];            /* base/local/sub/manifest: kept apart */

static void setup(void)
{
	base = tu_tmpdir("mdir");
	snprintf(root, sizeof root, "%s/global/root", base);
	snprintf(mdir, sizeof mdir, "%s/local/sub/manifest", base);
	unsetenv("CKPT_FAULT");
	unsetenv("CKPT_MANIFEST_DIR");
	unsetenv("CKPT_TARGET");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
}

static void teardown(void)
{
	tu_rmtree(base);
	free(base);
	base = NULL;
}

static bool exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

static bool root_has_own_manifest(const char *r)
{
	char p[PATH_MAX + 16];
	snprintf(p, sizeof p, "%s/manifest", r);
	return exists(p);
}

static void opts_for(struct ckpt_opts *o, const char *r, const char *md, int rank, int world,
                     unsigned flags)
{
	ckpt_opts_init(o, sizeof *o);
	o->root = r;
	o->manifest_dir = md;
	o->rank = rank;
	o->world = world;
	o->flags = flags;
	o->chunk_bytes = 8192;
	o->pool_bytes = 16 * 8192;
	o->timeout_ms = 20000;
	o->secret = "manifest-dir-test-job-secret";
	o->secret_len = strlen(o->secret);
}

/* ------------------------------------------------------------------ data */

#define N 6000u                        /* elements of "w", split over the ranks */

static void data_of(uint64_t step, float *w)
{
	tu_fill(w, sizeof(float) * N, tu_seed(), step);
}

/* Rank r of world's rows of "w". */
static void rows_of(int r, int world, uint64_t *off, uint64_t *ext)
{
	*off = (uint64_t)r * N / (uint64_t)world;
	*ext = (uint64_t)(r + 1) * N / (uint64_t)world - *off;
}

/* This rank's part of step: its rows of "w" and a replicated blob. 0, or the code
 * (the message is the library's). */
static int save_part(ckpt_ctx *c, uint64_t step)
{
	static float w[N];
	data_of(step, w);
	int rank = ckpt_rank(c), world = ckpt_world(c);
	uint64_t shape[1] = { N }, off[1], ext[1];
	rows_of(rank, world, off, ext);
	ckpt_save *s;
	int rc = ckpt_save_begin(c, step, &s);
	if (rc)
		return rc;
	struct ckpt_tensor t = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape, .offset = off,
		.extent = ext, .data = w + off[0] };
	if (!(rc = ckpt_save_add_tensor(s, &t)) &&
	    !(rc = ckpt_save_add_blob(s, "sched", CKPT_KIND_SCHEDULER, CKPT_REPLICATED, "abc", 3)) &&
	    !(rc = ckpt_save_submit(s)))
		rc = ckpt_save_wait(s, -1);
	ckpt_save_free(s);
	return rc;
}

/* Load the whole of step (CKPT_LATEST: the latest) and compare it bit for bit. 0,
 * -1 (different bytes), or the library's code. */
static int load_check(ckpt_ctx *c, uint64_t step, uint64_t want_step)
{
	static float want[N], got[N];
	ckpt_load *l;
	int rc = ckpt_load_open(c, step, &l);
	if (rc)
		return rc;
	data_of(want_step, want);
	memset(got, 0, sizeof got);
	char blob[8] = "";
	size_t len = 0;
	if (ckpt_load_step(l) != want_step)
		rc = -1;
	if (!rc)
		rc = ckpt_load_tensor(l, "w", CKPT_F32, 1, (uint64_t[]){ 0 }, (uint64_t[]){ N },
		                      got, CKPT_MEM_HOST);
	if (!rc)
		rc = ckpt_load_blob(l, "sched", blob, sizeof blob, &len);
	if (!rc && (memcmp(got, want, sizeof got) || len != 3 || memcmp(blob, "abc", 3)))
		rc = -1;
	ckpt_load_close(l);
	return rc;
}

/* Open (r, md) as rank 0 of 1 with flags: the context, or NULL with the test failed. */
static ckpt_ctx *open_one(const char *r, const char *md, unsigned flags)
{
	struct ckpt_opts o;
	opts_for(&o, r, md, 0, 1, flags);
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "open %s (manifest %s): %s", r, md ? md : "default",
	              ckpt_last_error());
	return c;
}

static void save_one(const char *r, const char *md, uint64_t step)
{
	ckpt_ctx *c = open_one(r, md, 0);
	ck_assert_msg(save_part(c, step) == 0, "save step %llu: %s", (unsigned long long)step,
	              ckpt_last_error());
	ckpt_close(c);
}

static void check_one(const char *r, const char *md, uint64_t step)
{
	ckpt_ctx *c = open_one(r, md, CKPT_OPEN_READONLY);
	int rc = load_check(c, step, step);
	ck_assert_msg(rc == 0, "step %llu of %s loads %s: %d %s", (unsigned long long)step, r,
	              rc == -1 ? "other bytes" : "with an error", rc, ckpt_last_error());
	ckpt_close(c);
}

/* ckpt_open of (r, md) as rank 0 of 1 with flags must fail with want, the message
 * holding each of the needles (NULL-terminated). */
static void expect_refused(const char *r, const char *md, unsigned flags, int want, ...)
{
	struct ckpt_opts o;
	opts_for(&o, r, md, 0, 1, flags);
	ckpt_ctx *c = (ckpt_ctx *)1;
	int rc = ckpt_open(&o, &c);
	ck_assert_msg(rc == want, "open %s (manifest %s, flags 0x%x): %d, want %d: %s", r,
	              md ? md : "default", flags, rc, want, ckpt_last_error());
	ck_assert_ptr_null(c);
	va_list ap;
	va_start(ap, want);
	for (const char *n; (n = va_arg(ap, const char *));)
		ck_assert_msg(strstr(ckpt_last_error(), n), "the message lacks '%s': %s", n,
		              ckpt_last_error());
	va_end(ap);
}

/* ------------------------------------------------------------------ one rank */

START_TEST(saves_apart_loads_bit_exact)
{
	save_one(root, mdir, 1);
	save_one(root, mdir, 2);
	char data[PATH_MAX + 16];
	snprintf(data, sizeof data, "%s/data.mdb", mdir);
	ck_assert_msg(exists(data), "no %s", data);
	ck_assert_msg(!root_has_own_manifest(root), "%s/manifest exists", root);
	check_one(root, mdir, 1);
	check_one(root, mdir, 2);
	/* The variable, as a launcher sets it. */
	setenv("CKPT_MANIFEST_DIR", mdir, 1);
	check_one(root, NULL, 2);
	save_one(root, NULL, 3);
	unsetenv("CKPT_MANIFEST_DIR");
	check_one(root, mdir, 3);
	ck_assert(!root_has_own_manifest(root));
	/* Without it the root's steps have no manifest: refused, pointing at the option. */
	expect_refused(root, NULL, CKPT_OPEN_READONLY, CKPT_ENOMANIFEST, "3 step directories",
	               "CKPT_MANIFEST_DIR", NULL);
	expect_refused(root, NULL, 0, CKPT_ENOMANIFEST, "CKPT_MANIFEST_DIR", NULL);
	ck_assert(!root_has_own_manifest(root));
	check_one(root, mdir, 1);
}
END_TEST

START_TEST(relative_directory_refused)
{
	expect_refused(root, "local/manifest", 0, -EINVAL, "local/manifest", "absolute", NULL);
	setenv("CKPT_MANIFEST_DIR", "manifest", 1);
	expect_refused(root, NULL, 0, -EINVAL, "absolute", NULL);
	expect_refused(root, NULL, CKPT_OPEN_READONLY, -EINVAL, "absolute", NULL);
	unsetenv("CKPT_MANIFEST_DIR");
	ck_assert_msg(!exists(root), "a refused open created %s", root);
}
END_TEST

/* Two roots on one manifest directory would take each other's steps for their own:
 * the second is refused, by its coordinator and by its readers, naming both. */
START_TEST(second_root_refused)
{
	char other[PATH_MAX + 16];
	snprintf(other, sizeof other, "%s/global/other", base);
	save_one(root, mdir, 1);
	expect_refused(other, mdir, 0, CKPT_ENOMANIFEST, root, other, mdir, NULL);
	expect_refused(other, mdir, CKPT_OPEN_NO_GC, CKPT_ENOMANIFEST, root, other, NULL);
	/* A reader of a root that holds steps, with the wrong manifest: refused too. */
	char other_mdir[PATH_MAX + 16];
	snprintf(other_mdir, sizeof other_mdir, "%s/local/other", base);
	save_one(other, other_mdir, 7);
	expect_refused(other, mdir, CKPT_OPEN_READONLY, CKPT_ENOMANIFEST, root, other, NULL);
	/* The same root through another path to it (a symbolic link) is the same root. */
	char link[PATH_MAX + 16];
	snprintf(link, sizeof link, "%s/link", base);
	ck_assert_int_eq(symlink(root, link), 0);
	check_one(link, mdir, 1);
	save_one(link, mdir, 2);
	check_one(root, mdir, 2);
	check_one(other, other_mdir, 7);
}
END_TEST

/* One root has one manifest: a manifest directory apart for a root that has its
 * own is refused (its steps would look lost to the other), unless it is that one. */
START_TEST(root_with_its_own_manifest)
{
	save_one(root, NULL, 1);
	expect_refused(root, mdir, 0, -EEXIST, root, mdir, NULL);
	expect_refused(root, mdir, CKPT_OPEN_READONLY, -EEXIST, NULL);
	ck_assert_msg(!exists(mdir), "a refused open created %s", mdir);
	char own[PATH_MAX + 16];
	snprintf(own, sizeof own, "%s/manifest", root);
	save_one(root, own, 2);
	check_one(root, own, 1);
	check_one(root, NULL, 2);
	/* Moved out of its root, it is bound to the root that opens it first. */
	char cmd[3 * PATH_MAX];
	snprintf(cmd, sizeof cmd, "mkdir -p '%s/local/sub' && mv '%s' '%s'", base, own, mdir);
	ck_assert_int_eq(system(cmd), 0);
	check_one(root, mdir, 2);
	save_one(root, mdir, 3);
	char other[PATH_MAX + 16];
	snprintf(other, sizeof other, "%s/global/other", base);
	expect_refused(other, mdir, 0, CKPT_ENOMANIFEST, root, other, NULL);
	check_one(root, mdir, 1);
}
END_TEST

/* ------------------------------------------------------------------ recovery */

/* A lost manifest apart: every open is refused, naming the directory; a rebuild
 * recreates it (in a new directory, its parent created) from the shard files. */
START_TEST(rebuild_into_manifest_dir)
{
	save_one(root, mdir, 1);
	save_one(root, mdir, 2);
	tu_rmtree(mdir);
	expect_refused(root, mdir, 0, CKPT_ENOMANIFEST, mdir, "does not exist on host",
	               "rebuild --manifest-dir", NULL);
	expect_refused(root, mdir, CKPT_OPEN_READONLY, CKPT_ENOMANIFEST, mdir, NULL);
	ck_assert_msg(!exists(mdir), "a refused open created %s", mdir);
	char fresh[PATH_MAX + 16];
	snprintf(fresh, sizeof fresh, "%s/new/place/manifest", base);
	ckpt_ctx *c = open_one(root, fresh, CKPT_OPEN_RECOVER);
	struct ckpt_rebuild_result r = { .size = sizeof r };
	ck_assert_msg(ckpt_catalog_rebuild(c, 0, NULL, NULL, &r) == 0, "%s", ckpt_last_error());
	ck_assert_uint_eq(r.steps_committed, 2);
	ckpt_close(c);
	ck_assert(!root_has_own_manifest(root));
	check_one(root, fresh, 1);
	check_one(root, fresh, 2);
	save_one(root, fresh, 3);
	check_one(root, fresh, 3);
}
END_TEST

/* A damaged manifest apart is set aside beside its directory (never in the root),
 * and the rebuild writes the new one where the old one was. */
START_TEST(damaged_manifest_set_aside)
{
	save_one(root, mdir, 1);
	char data[PATH_MAX + 16];
	snprintf(data, sizeof data, "%s/data.mdb", mdir);
	ck_assert_int_eq(truncate(data, 8192), 0);
	expect_refused(root, mdir, 0, CKPT_ENOMANIFEST, "cut short", "rebuild --manifest-dir",
	               NULL);
	ckpt_ctx *c = open_one(root, mdir, CKPT_OPEN_RECOVER);
	struct ckpt_rebuild_result r = { .size = sizeof r };
	ck_assert_msg(ckpt_catalog_rebuild(c, 0, NULL, NULL, &r) == 0, "%s", ckpt_last_error());
	ck_assert_uint_eq(r.steps_committed, 1);
	ckpt_close(c);
	check_one(root, mdir, 1);
	char parent[PATH_MAX + 16];
	snprintf(parent, sizeof parent, "%s/local/sub", base);
	DIR *d = opendir(parent);
	ck_assert_ptr_nonnull(d);
	int damaged = 0;
	for (struct dirent *e; (e = readdir(d));)
		damaged += !strncmp(e->d_name, "manifest.damaged-", 17);
	closedir(d);
	ck_assert_int_eq(damaged, 1);
	ck_assert(!root_has_own_manifest(root));
	d = opendir(root);
	ck_assert_ptr_nonnull(d);
	for (struct dirent *e; (e = readdir(d));)
		ck_assert_msg(strncmp(e->d_name, "manifest", 8), "%s in the root", e->d_name);
	closedir(d);
}
END_TEST

/* What a creation that stopped left beside the manifest directory goes at the next
 * coordinator's open; another manifest directory's leftovers stay. */
START_TEST(creation_leftovers_removed)
{
	save_one(root, mdir, 1);
	char left[PATH_MAX + 32], others[PATH_MAX + 32], f[PATH_MAX + 64];
	snprintf(left, sizeof left, "%s.new-123-0000abcd", mdir);
	snprintf(others, sizeof others, "%s/local/sub/manifest2.new-1-00000001", base);
	ck_assert_int_eq(mkdir(left, 0700), 0);
	ck_assert_int_eq(mkdir(others, 0700), 0);
	snprintf(f, sizeof f, "%s/data.mdb", left);
	ck_assert_int_eq(tu_write_file(f, "x", 1), 0);
	save_one(root, mdir, 2);
	ck_assert_msg(!exists(left), "%s is still there", left);
	ck_assert_msg(exists(others), "%s was removed", others);
	check_one(root, mdir, 1);
}
END_TEST

/* ------------------------------------------------------------------ several ranks */

/* Run fn(rank, world, arg) in world forked processes; each one's exit status must
 * be 0. This process keeps no library state (ASan's allocator is not fork-safe while
 * other threads run). */
static void run_ranks(int world, int (*fn)(int rank, int world, void *arg), void *arg)
{
	pid_t pids[8];
	ck_assert_int_le(world, 8);
	for (int r = 0; r < world; r++) {
		pids[r] = fork();
		ck_assert_int_ge(pids[r], 0);
		if (pids[r] == 0)
			_exit(fn(r, world, arg));
	}
	for (int r = 0; r < world; r++) {
		int status;
		ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		              "rank %d: status 0x%x (its stderr says why)", r, status);
	}
}

struct job {
	unsigned    port;
	const char *mdir_of[8];
	uint64_t    step;
	const char *refusal[3];   /* what rank 1's refused load must say (rank_refused) */
	const char *closed;       /* rank 0 makes this file once closed; rank 1 loads after */
};

static int open_rank(const struct job *j, int rank, int world, ckpt_ctx **c)
{
	struct ckpt_opts o;
	opts_for(&o, root, j->mdir_of[rank], rank, world, 0);
	o.coord_addr = "127.0.0.1";
	o.coord_port = j->port;
	int rc = ckpt_open(&o, c);
	if (rc)
		fprintf(stderr, "rank %d: open: %s\n", rank, ckpt_last_error());
	return rc;
}

/* Every rank saves its part of j->step, then loads the whole step and compares. */
static int rank_save_load(int rank, int world, void *arg)
{
	const struct job *j = arg;
	ckpt_ctx *c;
	if (open_rank(j, rank, world, &c))
		return 1;
	int rc = save_part(c, j->step);
	if (rc)
		fprintf(stderr, "rank %d: save: %s\n", rank, ckpt_last_error());
	else if ((rc = load_check(c, CKPT_LATEST, j->step)))
		fprintf(stderr, "rank %d: load: %d %s\n", rank, rc, ckpt_last_error());
	ckpt_close(c);
	return rc ? 2 : 0;
}

START_TEST(three_ranks)
{
	struct job j = { .port = tu_free_port(), .mdir_of = { mdir, mdir, mdir }, .step = 5 };
	run_ranks(3, rank_save_load, &j);
	ck_assert(!root_has_own_manifest(root));
	check_one(root, mdir, 5);
	/* A later job of two ranks on the same root and manifest. */
	struct job k = { .port = tu_free_port(), .mdir_of = { mdir, mdir }, .step = 6 };
	run_ranks(2, rank_save_load, &k);
	check_one(root, mdir, 5);
	check_one(root, mdir, 6);
	ck_assert(!root_has_own_manifest(root));
}
END_TEST

/*
 * The local-disk layout seen from another node: rank 1 runs where rank 0's manifest
 * directory does not exist (here: the same path name cannot be absent for one
 * process of this host and present for another, so rank 1 is given a directory that
 * exists nowhere, which is what it sees on its own node). It opens a root that holds
 * steps and saves its part — saves need no manifest on the ranks — and its load is
 * refused, naming the directory and its host, not "not a checkpoint root"; rank 0
 * loads.
 */
static int rank_refused(int rank, int world, void *arg)
{
	const struct job *j = arg;
	ckpt_ctx *c;
	if (open_rank(j, rank, world, &c))
		return 1;
	int rc = save_part(c, j->step);
	if (rc) {
		fprintf(stderr, "rank %d: save: %s\n", rank, ckpt_last_error());
		ckpt_close(c);
		return 2;
	}
	if (rank == 1 && j->closed) {
		/* Rank 0, the coordinator, is gone when this rank loads. */
		int waited = 0;
		while (!exists(j->closed) && waited++ < 3000)
			usleep(10000);
		if (!exists(j->closed)) {
			fprintf(stderr, "rank 1: rank 0 did not close within 30 s\n");
			ckpt_close(c);
			return 5;
		}
	}
	rc = load_check(c, CKPT_LATEST, j->step);
	const char *m = ckpt_last_error();
	int bad = 0;
	if (rank == 0 && rc)
		bad = 3;
	if (rank == 1 && (rc != CKPT_ENOMANIFEST || !strstr(m, j->mdir_of[1])))
		bad = 4;
	for (int k = 0; rank == 1 && k < 3; k++)
		if (j->refusal[k] && !strstr(m, j->refusal[k]))
			bad = 4;
	if (bad)
		fprintf(stderr, "rank %d: load returned %d: %s\n", rank, rc, m);
	ckpt_close(c);
	if (rank == 0 && j->closed && tu_write_file(j->closed, "x", 1))
		bad = 6;
	return bad;
}

START_TEST(rank_without_the_manifest)
{
	char nowhere[PATH_MAX + 16];
	snprintf(nowhere, sizeof nowhere, "%s/node1-local/manifest", base);
	/* A root that holds a step already: a rank that checked the manifest itself would
	 * refuse it for having none. */
	save_one(root, mdir, 8);
	struct job j = { .port = tu_free_port(), .mdir_of = { mdir, nowhere }, .step = 9,
	                 .refusal = { "does not exist on host", "rank 1", "Multi-node deployments" } };
	run_ranks(2, rank_refused, &j);
	ck_assert_msg(!exists(nowhere), "rank 1 created %s", nowhere);
	ck_assert(!root_has_own_manifest(root));
	check_one(root, mdir, 8);
	check_one(root, mdir, 9);
}
END_TEST

/*
 * A copy of the manifest directory at the same path on another node — left there
 * when rank 0 moved, or restored from a backup — is stale: a rank that loaded from it
 * would resume from older steps than rank 0. Here rank 1 is given a copy taken before
 * the job's save; its load is refused (the copy is not the coordinator's), rank 0's
 * loads the new step.
 */
START_TEST(rank_with_a_stale_copy)
{
	save_one(root, mdir, 8);
	char copy[PATH_MAX + 16], cmd[3 * PATH_MAX];
	snprintf(copy, sizeof copy, "%s/node1-local/manifest", base);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s/node1-local' && cp -a '%s' '%s'", base, mdir, copy);
	ck_assert_int_eq(system(cmd), 0);
	struct job j = { .port = tu_free_port(), .mdir_of = { mdir, copy }, .step = 9,
	                 .refusal = { "stale copy", "not the one the root's coordinator" } };
	run_ranks(2, rank_refused, &j);
	check_one(root, mdir, 9);
	/* Read-only contexts (the tools) are not a running job's ranks: a copy reads as
	 * what it is, here the state before step 9. */
	ckpt_ctx *c = open_one(root, copy, CKPT_OPEN_READONLY);
	ck_assert_int_eq(load_check(c, CKPT_LATEST, 8), 0);
	ckpt_close(c);
}
END_TEST

/* The same, with rank 0 closed (its coordinator gone, the root's lock free) before
 * rank 1 loads: the coordinator rank 1 joined still decides which copy is stale. */
START_TEST(stale_copy_after_the_coordinator_closed)
{
	save_one(root, mdir, 8);
	char copy[PATH_MAX + 16], closed[PATH_MAX + 16], cmd[3 * PATH_MAX];
	snprintf(copy, sizeof copy, "%s/node1-local/manifest", base);
	snprintf(closed, sizeof closed, "%s/rank0-closed", base);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s/node1-local' && cp -a '%s' '%s'", base, mdir, copy);
	ck_assert_int_eq(system(cmd), 0);
	struct job j = { .port = tu_free_port(), .mdir_of = { mdir, copy }, .step = 9,
	                 .refusal = { "stale copy", "not the one the root's coordinator" },
	                 .closed = closed };
	run_ranks(2, rank_refused, &j);
	check_one(root, mdir, 9);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("manifest_dir");
	TCase *t = tcase_create("manifest_dir");
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 120);
	tcase_add_test(t, saves_apart_loads_bit_exact);
	tcase_add_test(t, relative_directory_refused);
	tcase_add_test(t, second_root_refused);
	tcase_add_test(t, root_with_its_own_manifest);
	tcase_add_test(t, rebuild_into_manifest_dir);
	tcase_add_test(t, damaged_manifest_set_aside);
	tcase_add_test(t, creation_leftovers_removed);
	tcase_add_test(t, three_ranks);
	tcase_add_test(t, rank_without_the_manifest);
	tcase_add_test(t, rank_with_a_stale_copy);
	tcase_add_test(t, stale_copy_after_the_coordinator_closed);
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
