/*
 * ckpt_cut.c — ckpt-cut: a power cut of the file system holding a path, for the
 * power-cut campaign (test_powercut.sh).
 *
 *     ckpt-cut [--after-us N] [--after-create DIR [--within-us T]] PATH
 *
 * Sleeps N microseconds (default 0), then shuts the file system that holds PATH
 * down with EXT4_IOC_SHUTDOWN and EXT4_GOING_FLAGS_NOLOGFLUSH: its journal is not
 * flushed, every later I/O on it fails with EIO, and an unmount and mount (journal
 * replay) shows what a power cut at that moment would have left. The same as the
 * fault table's cut action (lib/base/fault.c), from outside the job: at a random
 * moment, or right after a save reported success.
 *
 * --after-create DIR counts the N microseconds from the first entry created in
 * DIR instead of from the start: the campaign aims at a save's writes, syncs and
 * commit, which begin when the save creates its step directory in the root, and
 * are a small part of a short job. ckpt-cut prints "watching" on stdout once the
 * watch is set, so that the caller starts the job only then. When nothing is
 * created within T microseconds (default 10 s), the delay counts from then.
 *
 * Exit status: 0 cut, 1 the shutdown (or the watch) failed (the message says
 * why), 2 usage, 3 cut, but nothing was created in DIR in time.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

/* linux/ext4.h is not always installed. */
#ifndef EXT4_IOC_SHUTDOWN
#define EXT4_IOC_SHUTDOWN _IOR('X', 125, uint32_t)
#endif
#ifndef EXT4_GOING_FLAGS_NOLOGFLUSH
#define EXT4_GOING_FLAGS_NOLOGFLUSH 0x2
#endif

static int usage(void)
{
	fprintf(stderr, "usage: ckpt-cut [--after-us N] [--after-create DIR [--within-us T]] PATH\n");
	return 2;
}

static int parse_us(const char *s, unsigned long long *out)
{
	char *end;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end || !*s || s[0] == '-' ? -1 : 0;
}

/* Wait for the first entry created in the watched directory, at most within_us.
 * 0: one was; 3: none in time; 1: the wait failed. */
static int wait_create(int ifd, unsigned long long within_us)
{
	struct pollfd p = { .fd = ifd, .events = POLLIN };
	long long left_ms = (long long)(within_us / 1000u);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = poll(&p, 1, left_ms > INT32_MAX ? INT32_MAX : (int)left_ms);
		if (n > 0)
			return 0;
		if (n == 0)
			return 3;
		if (errno != EINTR) {
			fprintf(stderr, "ckpt-cut: poll: %s\n", strerror(errno));
			return 1;
		}
		struct timespec t;
		clock_gettime(CLOCK_MONOTONIC, &t);
		long long spent = (t.tv_sec - t0.tv_sec) * 1000LL + (t.tv_nsec - t0.tv_nsec) / 1000000;
		left_ms = (long long)(within_us / 1000u) - spent;
		if (left_ms <= 0)
			return 3;
	}
}

int main(int argc, char **argv)
{
	unsigned long long after_us = 0, within_us = 10000000ull;
	const char *watch = NULL;
	int i = 1;
	for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
		if (!strcmp(argv[i], "--after-us") && !parse_us(argv[i + 1], &after_us))
			continue;
		if (!strcmp(argv[i], "--within-us") && !parse_us(argv[i + 1], &within_us))
			continue;
		if (!strcmp(argv[i], "--after-create")) {
			watch = argv[i + 1];
			continue;
		}
		return usage();
	}
	if (i + 1 != argc)
		return usage();
	const char *path = argv[i];
	/* Opened before the wait: the cut itself is then one system call. */
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "ckpt-cut: open %s: %s\n", path, strerror(errno));
		return 1;
	}
	int status = 0;
	if (watch) {
		int ifd = inotify_init1(IN_CLOEXEC);
		if (ifd < 0 || inotify_add_watch(ifd, watch, IN_CREATE) < 0) {
			fprintf(stderr, "ckpt-cut: watch %s: %s\n", watch, strerror(errno));
			return 1;
		}
		printf("watching\n");
		fflush(stdout);
		if ((status = wait_create(ifd, within_us)) == 1)
			return 1;
		close(ifd);
	}
	struct timespec ts = { (time_t)(after_us / 1000000u), (long)(after_us % 1000000u) * 1000L };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
	uint32_t flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
	if (ioctl(fd, EXT4_IOC_SHUTDOWN, &flags) < 0) {
		fprintf(stderr, "ckpt-cut: shutdown of the file system of %s: %s\n", path,
		        strerror(errno));
		close(fd);
		return 1;
	}
	close(fd);
	return status;
}
