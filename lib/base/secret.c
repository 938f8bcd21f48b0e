/*
 * secret.c — secrets kept in files, under ssh's rule for private keys: a file that
 * another user may read or write holds no secret, so it is refused rather than used.
 * One rule for every reader (the job secret of lib/config.c, the jobs file of ckptd),
 * each of which words its own messages.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

bool ckpt_secret_stat_ok(const struct stat *st)
{
	return S_ISREG(st->st_mode) && !(st->st_mode & 077) && st->st_uid == geteuid();
}

/* Read up to n bytes, through short reads; the count read, or -errno. */
static ssize_t read_full(int fd, void *p, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)p + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

static bool is_eol(uint8_t c) { return c == '\n' || c == '\r'; }

int ckpt_secret_file_read(const char *path, void *out, size_t max, size_t *len,
                          unsigned *mode)
{
	/* O_NONBLOCK: a FIFO put where the file should be is refused below, not waited
	 * on (it has no effect on a regular file). */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out;
	}
	*mode = (unsigned)(st.st_mode & 07777);
	if (!ckpt_secret_stat_ok(&st)) {
		rc = -EPERM;
		goto out;
	}
	/* The secret, then at most a CR LF that is not part of it: a third byte past max
	 * means the file holds more than a secret of max bytes. */
	uint8_t tail[3];
	ssize_t n = read_full(fd, out, max), t = 0;
	if (n >= 0 && (size_t)n == max)
		t = read_full(fd, tail, sizeof tail);
	if (n < 0 || t < 0) {
		rc = n < 0 ? (int)n : (int)t;
		goto out;
	}
	for (ssize_t i = 0; i < t; i++)
		if (t == (ssize_t)sizeof tail || !is_eol(tail[i]))
			rc = -EMSGSIZE;
	while (n > 0 && is_eol(((uint8_t *)out)[n - 1]))
		n--;
	if (n == 0)
		rc = -EMSGSIZE;
	*len = (size_t)n;
	explicit_bzero(tail, sizeof tail);
out:
	close(fd);
	return rc;
}
