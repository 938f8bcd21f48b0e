/*
 * lock.c — at most one coordinator per checkpoint root (docs/operations.md,
 * "One writer per root").
 *
 * Two coordinators on one root destroy each other's steps: the garbage collection
 * of a new job's coordinator removes the files an old one is about to commit, and
 * both write the same step numbers. So the context that owns a root's manifest (rank
 * 0, not read-only) holds an exclusive flock(2) on <root>/coordinator.lock for its
 * whole life. The kernel drops the lock when its holder dies, however it dies
 * (kill -9 included), so a crashed job never leaves a stale lock behind; the file
 * itself stays, holding the last holder's identity for messages only.
 *
 * The lock file's text names its holder (job, incarnation, pid, host, since when),
 * so that a refused coordinator can say who holds the root, and a reader can tell
 * an in-flight record of the live coordinator from one abandoned by a dead one.
 *
 * A flock belongs to the open file, which fork(2) shares: a child forked while the
 * lock is held (a data-loader worker, say) would keep the root locked after its
 * parent dies. So the held descriptors are listed, and a child closes its copies
 * as it starts (pthread_atfork); O_CLOEXEC does the same across exec.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "glue.h"

#define LOCK_TRIES    20       /* x 50 ms: a coordinator that is closing lets go */
#define LOCK_TEXT_MAX 1024

/* The descriptors of the locks this process holds (a few contexts at most; one
 * beyond the table still locks, only a child forked then keeps it too). */
static struct {
	pthread_mutex_t mu;
	pthread_once_t  once;
	int             fd[64];
	unsigned        n;
} held_locks = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_ONCE_INIT, { 0 }, 0 };

static void held_prepare(void) { pthread_mutex_lock(&held_locks.mu); }
static void held_parent(void)  { pthread_mutex_unlock(&held_locks.mu); }

static void held_child(void)
{
	for (unsigned i = 0; i < held_locks.n; i++)
		close(held_locks.fd[i]);
	held_locks.n = 0;
	pthread_mutex_unlock(&held_locks.mu);
}

static void held_init(void)
{
	if (pthread_atfork(held_prepare, held_parent, held_child))
		ckpt_log(CKPT_LOG_WARN, "coordinator lock: pthread_atfork failed: a child forked "
		         "while the lock is held keeps the root locked until it exits");
}

static void held_add(int fd)
{
	pthread_once(&held_locks.once, held_init);
	pthread_mutex_lock(&held_locks.mu);
	if (held_locks.n < CKPT_ARRAY_SIZE(held_locks.fd))
		held_locks.fd[held_locks.n++] = fd;
	pthread_mutex_unlock(&held_locks.mu);
}

void lock_release(int fd)
{
	if (fd < 0)
		return;
	pthread_mutex_lock(&held_locks.mu);
	for (unsigned i = 0; i < held_locks.n; i++) {
		if (held_locks.fd[i] == fd) {
			held_locks.fd[i] = held_locks.fd[--held_locks.n];
			break;
		}
	}
	close(fd);
	pthread_mutex_unlock(&held_locks.mu);
}

static int lock_path(char *out, size_t cap, const char *root)
{
	int n = snprintf(out, cap, "%s/%s", root, CKPT_LOCK_FILE);
	return n < 0 || (size_t)n >= cap ? ckpt_err(-ENAMETOOLONG, "%s: path too long", root) : 0;
}

/* The holder's description from the lock file's text ("job 'x' (pid 12 on host h,
 * since ...)") and its incarnation (0 if unreadable). */
static void lock_describe(int fd, char *out, size_t cap, uint64_t *incarnation)
{
	char text[LOCK_TEXT_MAX];
	ssize_t n = pread(fd, text, sizeof text - 1, 0);
	text[n > 0 ? n : 0] = '\0';
	char job[300] = "?", host[300] = "?", since[64] = "?";
	long pid = -1;
	uint64_t inc = 0;
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		if (!strncmp(line, "job: ", 5))
			snprintf(job, sizeof job, "%s", line + 5);
		else if (!strncmp(line, "host: ", 6))
			snprintf(host, sizeof host, "%s", line + 6);
		else if (!strncmp(line, "since: ", 7))
			snprintf(since, sizeof since, "%s", line + 7);
		else if (!strncmp(line, "pid: ", 5))
			pid = strtol(line + 5, NULL, 10);
		else if (!strncmp(line, "incarnation: ", 13))
			inc = strtoull(line + 13, NULL, 16);
	}
	/* The text is another process's: keep it printable in our messages. */
	for (char *p = job; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
			*p = '?';
	for (char *p = host; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
			*p = '?';
	snprintf(out, cap, "job '%.200s' (pid %ld on host %.100s, since %s)", job, pid, host, since);
	if (incarnation)
		*incarnation = inc;
}

int lock_take(const struct glue_config *cfg, uint64_t incarnation, int *fd_out)
{
	*fd_out = -1;
	char path[4200];
	int rc = lock_path(path, sizeof path, cfg->root);
	if (rc)
		return rc;
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, cfg->file_mode);
	if (fd < 0)
		return ckpt_err(-errno, "open the coordinator lock %s", path);
	for (int i = 0;; i++) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			break;
		if (errno != EWOULDBLOCK && errno != EINTR) {
			rc = ckpt_err(-errno, "lock %s", path);
			close(fd);
			return rc;
		}
		if (i + 1 >= LOCK_TRIES) {
			char who[768];
			lock_describe(fd, who, sizeof who, NULL);
			close(fd);
			return ckpt_err(-EBUSY, "checkpoint root %s is in use by the coordinator of %s: "
			                "two coordinators on one root would destroy each other's steps; "
			                "stop that job first (the lock goes with its process)",
			                cfg->root, who);
		}
		struct timespec ts = { 0, 50 * 1000000L };
		nanosleep(&ts, NULL);
	}
	char host[256] = "?", since[64];
	gethostname(host, sizeof host - 1);
	host[sizeof host - 1] = '\0';
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &tm);
	char text[LOCK_TEXT_MAX];
	int n = snprintf(text, sizeof text, "libckpt coordinator lock: held while the process "
	                 "below runs\njob: %.256s\nincarnation: %016" PRIx64 "\npid: %ld\nhost: "
	                 "%s\nsince: %s\n", cfg->job_id, incarnation, (long)getpid(), host, since);
	/* For messages only: a failure to write it does not weaken the lock. */
	if (ftruncate(fd, 0) < 0 || pwrite(fd, text, (size_t)n, 0) != n)
		ckpt_log(CKPT_LOG_WARN, "%s: cannot record the holder: %s", path,
		         ckpt_strerror(-errno));
	held_add(fd);
	*fd_out = fd;
	return 0;
}

int lock_probe(const char *root, uint64_t *incarnation)
{
	*incarnation = 0;
	char path[4200];
	if (lock_path(path, sizeof path, root))
		return 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return 0;
	/* A shared lock is granted only when no coordinator holds the exclusive one. */
	int held = 0;
	if (flock(fd, LOCK_SH | LOCK_NB) == 0)
		flock(fd, LOCK_UN);
	else if (errno == EWOULDBLOCK) {
		held = 1;
		char who[768];
		lock_describe(fd, who, sizeof who, incarnation);
	}
	close(fd);
	return held;
}
