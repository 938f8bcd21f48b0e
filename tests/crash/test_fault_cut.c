/*
 * test_fault_cut.c — the fault table's actions for the power-cut campaign: skip
 * (a removed sync, from the nth hit on, only where a point guards one) and cut
 * (a shutdown of the file system of CKPT_FAULT_CUT, or a crash that says the cut
 * failed). The cut that succeeds needs root and a loop device: test_powercut.sh.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_internal.h"

static void arm(const char *spec, const char *cut)
{
	setenv("CKPT_FAULT", spec, 1);
	unsetenv("CKPT_FAULT_RANK");
	if (cut)
		setenv("CKPT_FAULT_CUT", cut, 1);
	else
		unsetenv("CKPT_FAULT_CUT");
	ckpt_fault_reload();
}

START_TEST(skip_from_nth_on)
{
	arm("before_fdatasync:2:skip", NULL);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_FDATASYNC), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_FDATASYNC), CKPT_FA_SKIP);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_DIR_FSYNC), 0);
	arm("before_dir_fsync:skip", NULL);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_DIR_FSYNC), CKPT_FA_SKIP);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_DIR_FSYNC), CKPT_FA_SKIP);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_FDATASYNC), 0);
}
END_TEST

START_TEST(skip_only_where_a_sync_is_guarded)
{
	/* A caller that knows nothing of skip must never see it. */
	arm("after_prepare_sent:skip", NULL);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_PREPARE_SENT), 0);
	arm("coord_before_commit_txn:1:skip", NULL);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_COORD_BEFORE_COMMIT_TXN), 0);
}
END_TEST

START_TEST(cut_needs_a_path)
{
	arm("before_fdatasync:cut", NULL);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_FDATASYNC), 0);   /* disarmed: no exit */
}
END_TEST

/* Run the armed point in a child; its exit status and what it wrote to stderr. */
static int fire_in_child(enum ckpt_fault_point p, char *err, size_t cap)
{
	int fds[2];
	ck_assert_int_eq(pipe(fds), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(fds[1], 2);
		ckpt_fault(p);
		_exit(0);
	}
	close(fds[1]);
	size_t n = 0;
	ssize_t r;
	while (n + 1 < cap && (r = read(fds[0], err + n, cap - 1 - n)) > 0)
		n += (size_t)r;
	err[n] = '\0';
	close(fds[0]);
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

START_TEST(cut_that_cannot_shut_down_says_so)
{
	/* Paths whose file system has no shutdown ioctl (or no file system at all):
	 * the cut must not pass for one. Never a path on a real disk: as root the
	 * cut would succeed and take that file system down. */
	const char *paths[] = { "/proc", "/nonexistent/ckpt-fault-cut" };
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(paths); i++) {
		char err[1024];
		arm("after_footer_write:2:cut", paths[i]);
		ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_FOOTER_WRITE), 0);   /* first hit */
		int st = fire_in_child(CKPT_FP_AFTER_FOOTER_WRITE, err, sizeof err);
		ck_assert_int_eq(st, CKPT_FAULT_CRASH_STATUS);
		ck_assert_ptr_nonnull(strstr(err, "fault injected: cut at after_footer_write failed"));
		ck_assert_ptr_nonnull(strstr(err, paths[i]));
		ck_assert_ptr_nonnull(strstr(err, "crashing instead"));
	}
	unsetenv("CKPT_FAULT");
	unsetenv("CKPT_FAULT_CUT");
	ckpt_fault_reload();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fault_cut");
	TCase *tc = tcase_create("fault_cut");
	tcase_add_test(tc, skip_from_nth_on);
	tcase_add_test(tc, skip_only_where_a_sync_is_guarded);
	tcase_add_test(tc, cut_needs_a_path);
	tcase_add_test(tc, cut_that_cannot_shut_down_says_so);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
