/*
 * test_notify.c — ckptd's sd_notify messages (ckptd/notify.c), received on a socket
 * of the test's own standing in for systemd's: their exact text, one status line
 * whatever the caller passes, and nothing at all without NOTIFY_SOCKET.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ckptd.h"

/* A datagram socket on an abstract address, named in NOTIFY_SOCKET. */
static int notify_socket(void)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "ckptd-test-notify-%d", getpid());
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a,
	                      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)), 0);
	char env[128];
	snprintf(env, sizeof env, "@%s", a.sun_path + 1);
	setenv("NOTIFY_SOCKET", env, 1);
	return fd;
}

/* The next message, or NULL when none is waiting. */
static char *next(int fd, char *buf, size_t cap)
{
	ssize_t n = recv(fd, buf, cap - 1, MSG_DONTWAIT);
	if (n < 0) {
		ck_assert_int_eq(errno, EAGAIN);
		return NULL;
	}
	buf[n] = '\0';
	return buf;
}

START_TEST(messages)
{
	int fd = notify_socket();
	char m[2048];
	ckptd_notify_ready("serving 3 jobs");
	ck_assert_str_eq(next(fd, m, sizeof m), "READY=1\nSTATUS=serving 3 jobs");
	ckptd_notify_ready(NULL);
	ck_assert_str_eq(next(fd, m, sizeof m), "READY=1");
	/* A newline would start another assignment (here: a forged MAINPID). */
	ckptd_notify_ready("reloaded\nMAINPID=1");
	ck_assert_str_eq(next(fd, m, sizeof m), "READY=1\nSTATUS=reloaded MAINPID=1");
	ckptd_notify_status("%u saves in flight,\r\n%s", 2u, "STOPPING=1");
	ck_assert_str_eq(next(fd, m, sizeof m), "STATUS=2 saves in flight,  STOPPING=1");
	uint64_t before = ckpt_now_ns() / 1000;
	ckptd_notify_reloading();
	uint64_t after = ckpt_now_ns() / 1000;
	unsigned long long usec;
	int used = 0;
	ck_assert_int_eq(sscanf(next(fd, m, sizeof m), "RELOADING=1\nMONOTONIC_USEC=%llu%n", &usec,
	                        &used), 1);
	ck_assert_uint_eq((size_t)used, strlen(m));
	ck_assert(usec >= before && usec <= after);
	ckptd_notify_stopping();
	ck_assert_str_eq(next(fd, m, sizeof m), "STOPPING=1");
	/* A long status is cut, not split. */
	char big[3000];
	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	ckptd_notify_status("%s", big);
	ck_assert_ptr_nonnull(next(fd, m, sizeof m));
	ck_assert(!strncmp(m, "STATUS=xxx", 10) && !strchr(m, '\n'));
	ck_assert_ptr_null(next(fd, m, sizeof m));

	/* Without NOTIFY_SOCKET: nothing sent. */
	unsetenv("NOTIFY_SOCKET");
	ckptd_notify_ready("x");
	ckptd_notify_status("x");
	ckptd_notify_reloading();
	ckptd_notify_stopping();
	ck_assert_ptr_null(next(fd, m, sizeof m));
	close(fd);

	/* A socket gone: logged, and the caller carries on. */
	setenv("NOTIFY_SOCKET", "@ckptd-test-notify-nobody-listens", 1);
	ckptd_notify_ready("x");
	unsetenv("NOTIFY_SOCKET");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ckptd_notify");
	TCase *tc = tcase_create("notify");
	tcase_add_test(tc, messages);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
