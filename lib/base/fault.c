/*
 * fault.c — deterministic fault injection (CONTRIBUTING.md, Tests).
 *
 * CKPT_FAULT=<point>[:<nth>][:<action>] with CKPT_FAULT_RANK=<r>. The table below is
 * the one list of fault points; the crash matrix in tests/integration and the
 * power-cut campaign in tests/crash walk it, and tests/ckptd/test_ckptd_crash.sh
 * the points of ckptd (ckptd_*, and the coordinator's, which run inside it for a
 * job saving through it). A fault point costs one load and a branch when no fault
 * is armed.
 *
 * Two actions exist for the power-cut campaign. cut shuts the file system holding
 * CKPT_FAULT_CUT down without flushing its journal, so that a remount shows what
 * a power cut at this point would have left (a crash leaves the page cache, and
 * proves nothing about syncs). skip removes the sync that a point guards, from the
 * nth hit on: a mutation the campaign must catch, never a setting for real use.
 *
 * slow:<ms> is a slow device rather than one event: from the nth hit on, every hit
 * of the point sleeps, on whichever thread hits it (ckptd's connections all pass
 * ckptd_after_chunk, so that a slow disk behind many senders can be played).
 *
 * Allocation failure is the other kind: CKPT_FAULT=alloc:<n>, or
 * ckpt_fault_alloc_arm(n) from a test, fails the nth call of the allocation
 * wrappers (alloc.c). Its counters cost an atomic add per allocation and per free.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"

/* The shutdown ioctl of ext4 (linux/ext4.h is not always installed); XFS's
 * XFS_IOC_GOINGDOWN is the same number with the same flags. NOLOGFLUSH: the
 * journal is not flushed, so what it has not committed is lost, as in a power cut. */
#ifndef EXT4_IOC_SHUTDOWN
#define EXT4_IOC_SHUTDOWN _IOR('X', 125, uint32_t)
#endif
#ifndef EXT4_GOING_FLAGS_NOLOGFLUSH
#define EXT4_GOING_FLAGS_NOLOGFLUSH 0x2
#endif

static const char *const fault_points[CKPT_FP_COUNT_] = {
	[CKPT_FP_AFTER_CHUNK_WRITE]       = "after_chunk_write",
	[CKPT_FP_BEFORE_FDATASYNC]        = "before_fdatasync",
	[CKPT_FP_AFTER_FDATASYNC]         = "after_fdatasync",
	[CKPT_FP_AFTER_PREPARE_SENT]      = "after_prepare_sent",
	[CKPT_FP_COORD_BEFORE_COMMIT_TXN] = "coord_before_commit_txn",
	[CKPT_FP_COORD_AFTER_COMMIT_TXN]  = "coord_after_commit_txn",
	[CKPT_FP_BEFORE_DECISION_SEND]    = "before_decision_send",
	[CKPT_FP_AFTER_FOOTER_WRITE]      = "after_footer_write",
	[CKPT_FP_MSG_SEND]                = "msg_send",
	[CKPT_FP_LEADER_BEFORE_FORWARD]   = "leader_before_forward",
	[CKPT_FP_LEADER_BEFORE_DECISION_RELAY] = "leader_before_decision_relay",
	[CKPT_FP_BEFORE_DIR_FSYNC]        = "before_dir_fsync",
	[CKPT_FP_CKPTD_AFTER_CHUNK]       = "ckptd_after_chunk",
	[CKPT_FP_CKPTD_BEFORE_DURABLE]    = "ckptd_before_durable",
	[CKPT_FP_CKPTD_AFTER_DURABLE]     = "ckptd_after_durable",
	[CKPT_FP_AFTER_STEP_DIR]          = "after_step_dir",
	[CKPT_FP_GC_AFTER_RETIRE]         = "gc_after_retire",
	[CKPT_FP_GC_AFTER_FILES_REMOVED]  = "gc_after_files_removed",
};

/* The points that guard a sync, where skip means something (see writer.c). */
static bool fault_point_skippable(int p)
{
	return p == CKPT_FP_BEFORE_FDATASYNC || p == CKPT_FP_BEFORE_DIR_FSYNC;
}

/* The armed fault (at most one per process), and the hit counter of its point. */
static struct {
	pthread_mutex_t lock;
	atomic_bool     loaded;   /* read without the lock on the fast path */
	/* -1: none. Read without the lock (ckpt_fault); a parse sets it to -1 first and
	 * to the point last (release), so a thread that finds its point finds the rest
	 * of the table as that parse left it, even while a test reloads it. */
	atomic_int      point;
	unsigned long   nth;
	int             action;
	unsigned        delay_ms;
	int             only_rank; /* -1: any */
	char            cut_path[4096];  /* cut: a path on the file system to shut down */
	atomic_int      my_rank;
	atomic_ulong    hits;
	/* Allocation failure: every thread of the process counts here. */
	_Atomic uint64_t alloc_at;    /* 0: off */
	_Atomic uint64_t alloc_count;
	_Atomic int64_t  alloc_live;
} fault = { .lock = PTHREAD_MUTEX_INITIALIZER, .point = -1, .only_rank = -1, .my_rank = -1 };

const char *ckpt_fault_point_name(enum ckpt_fault_point p)
{
	return (unsigned)p < CKPT_FP_COUNT_ ? fault_points[p] : "?";
}

static void fault_parse(void)
{
	atomic_store(&fault.point, -1);
	int point = -1;
	fault.nth = 1;
	fault.action = CKPT_FA_CRASH;
	fault.delay_ms = 0;
	atomic_store(&fault.hits, 0);
	const char *r = ckpt_env("CKPT_FAULT_RANK");
	fault.only_rank = r ? atoi(r) : -1;
	atomic_store(&fault.alloc_at, 0);
	const char *cut = ckpt_env("CKPT_FAULT_CUT");
	snprintf(fault.cut_path, sizeof fault.cut_path, "%s", cut ? cut : "");
	const char *e = ckpt_env("CKPT_FAULT");
	if (!e)
		return;
	char spec[256];
	snprintf(spec, sizeof spec, "%s", e);
	char *save = NULL;
	char *name = strtok_r(spec, ":", &save);
	if (name && !strcmp(name, "alloc")) {
		char *tok = strtok_r(NULL, ":", &save);
		uint64_t n = tok ? strtoull(tok, NULL, 10) : 0;
		if (!n) {
			ckpt_log(CKPT_LOG_ERROR, "CKPT_FAULT: '%s' needs alloc:<n>, n >= 1 (ignored)", e);
			return;
		}
		atomic_store(&fault.alloc_count, 0);
		atomic_store(&fault.alloc_at, n);
		return;
	}
	for (int i = 0; name && i < CKPT_FP_COUNT_; i++)
		if (!strcmp(name, fault_points[i]))
			point = i;
	if (point < 0) {
		ckpt_log(CKPT_LOG_ERROR, "CKPT_FAULT: unknown fault point '%s' (ignored)", e);
		return;
	}
	char *tok = strtok_r(NULL, ":", &save);
	if (tok && tok[0] >= '0' && tok[0] <= '9') {
		fault.nth = strtoul(tok, NULL, 10);
		if (fault.nth == 0)
			fault.nth = 1;
		tok = strtok_r(NULL, ":", &save);
	}
	if (!tok || !strcmp(tok, "crash")) fault.action = CKPT_FA_CRASH;
	else if (!strcmp(tok, "eio")) fault.action = CKPT_FA_EIO;
	else if (!strcmp(tok, "enospc")) fault.action = CKPT_FA_ENOSPC;
	else if (!strcmp(tok, "drop")) fault.action = CKPT_FA_DROP;
	else if (!strcmp(tok, "cut")) fault.action = CKPT_FA_CUT;
	else if (!strcmp(tok, "skip")) fault.action = CKPT_FA_SKIP;
	else if (!strcmp(tok, "delay") || !strcmp(tok, "slow")) {
		fault.action = !strcmp(tok, "delay") ? CKPT_FA_DELAY : CKPT_FA_SLOW;
		tok = strtok_r(NULL, ":", &save);
		fault.delay_ms = tok ? (unsigned)strtoul(tok, NULL, 10) : 1000;
	} else {
		ckpt_log(CKPT_LOG_ERROR, "CKPT_FAULT: unknown action '%s' (ignored)", tok);
		return;
	}
	if (fault.action == CKPT_FA_CUT && !fault.cut_path[0]) {
		ckpt_log(CKPT_LOG_ERROR, "CKPT_FAULT: action cut needs CKPT_FAULT_CUT, a path on "
		         "the file system to shut down (ignored)");
		return;
	}
	if (fault.action == CKPT_FA_SKIP && !fault_point_skippable(point)) {
		ckpt_log(CKPT_LOG_ERROR, "CKPT_FAULT: skip applies to before_fdatasync and "
		         "before_dir_fsync only, not to %s (ignored)", fault_points[point]);
		return;
	}
	atomic_store_explicit(&fault.point, point, memory_order_release);
}

static void fault_load(void)
{
	pthread_mutex_lock(&fault.lock);
	if (!atomic_load(&fault.loaded)) {
		fault_parse();
		atomic_store(&fault.loaded, true);
	}
	pthread_mutex_unlock(&fault.lock);
}

void ckpt_fault_reload(void)
{
	pthread_mutex_lock(&fault.lock);
	fault_parse();
	atomic_store(&fault.loaded, true);
	pthread_mutex_unlock(&fault.lock);
}

/* One line on stderr, as the crash action writes it (write(2): nothing buffered is
 * lost by _exit). n is snprintf's result for a buffer of cap bytes. */
static void fault_say(const char *line, size_t cap, int n)
{
	size_t len = n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
	ssize_t w = write(2, line, len);
	(void)w;
}

/* The power cut: shut the file system down without flushing its journal, then die
 * as the machine would. After the ioctl every I/O on that file system fails with
 * EIO, so nothing this or another process does next can reach the disk. A shutdown
 * that fails (not root, not ext4 or XFS) degrades to a crash, and says so: the
 * status tells a test that no cut happened. */
static _Noreturn void fault_cut(const char *name)
{
	char line[4096 + 256];
	int err = 0;
	int fd = open(fault.cut_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = errno;
	} else {
		uint32_t flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
		if (ioctl(fd, EXT4_IOC_SHUTDOWN, &flags) < 0)
			err = errno;
		close(fd);
	}
	if (err) {
		fault_say(line, sizeof line,
		          snprintf(line, sizeof line, "libckpt[%d]: fault injected: cut at %s failed: "
		                   "shutdown of the file system of %s: %s; crashing instead\n",
		                   (int)getpid(), name, fault.cut_path, strerror(err)));
		_exit(CKPT_FAULT_CRASH_STATUS);
	}
	fault_say(line, sizeof line,
	          snprintf(line, sizeof line, "libckpt[%d]: fault injected: cut at %s (file system "
	                   "of %s shut down)\n", (int)getpid(), name, fault.cut_path));
	_exit(CKPT_FAULT_CUT_STATUS);
}

void ckpt_fault_set_rank(int rank)
{
	atomic_store(&fault.my_rank, rank);
}

int ckpt_fault(enum ckpt_fault_point p)
{
	if (!atomic_load_explicit(&fault.loaded, memory_order_acquire))
		fault_load();
	if (atomic_load_explicit(&fault.point, memory_order_acquire) != (int)p)
		return 0;
	if (fault.only_rank >= 0 && fault.only_rank != atomic_load(&fault.my_rank))
		return 0;
	unsigned long hit = atomic_fetch_add(&fault.hits, 1) + 1;
	/* skip and slow hold from the nth hit on: a removed sync stays removed, a slow
	 * device stays slow. */
	bool from_nth = fault.action == CKPT_FA_SKIP || fault.action == CKPT_FA_SLOW;
	if (from_nth ? hit < fault.nth : hit != fault.nth)
		return 0;
	const char *name = fault_points[p];
	switch (fault.action) {
	case CKPT_FA_CUT:
		fault_cut(name);
	case CKPT_FA_SKIP:
		if (hit == fault.nth)
			ckpt_log(CKPT_LOG_WARN, "fault injected: skip at %s (the sync it guards is "
			         "removed from now on)", name);
		return CKPT_FA_SKIP;
	case CKPT_FA_CRASH: {
		char line[128];
		fault_say(line, sizeof line, snprintf(line, sizeof line, "libckpt[%d]: fault "
		                                      "injected: crash at %s\n", (int)getpid(), name));
		_exit(CKPT_FAULT_CRASH_STATUS);
	}
	case CKPT_FA_EIO:
		return ckpt_err(-EIO, "fault injected at %s", name);
	case CKPT_FA_ENOSPC:
		return ckpt_err(-ENOSPC, "fault injected at %s", name);
	case CKPT_FA_DROP:
		ckpt_log(CKPT_LOG_WARN, "fault injected: drop at %s", name);
		return CKPT_FA_DROP;
	case CKPT_FA_DELAY:
	case CKPT_FA_SLOW: {
		if (fault.action == CKPT_FA_DELAY)
			ckpt_log(CKPT_LOG_WARN, "fault injected: delay %u ms at %s", fault.delay_ms, name);
		else if (hit == fault.nth)
			ckpt_log(CKPT_LOG_WARN, "fault injected: slow, %u ms at every %s from now on",
			         fault.delay_ms, name);
		ckpt_sleep_ms(fault.delay_ms);
		return 0;
	}
	default:
		return 0;
	}
}

void ckpt_fault_alloc_arm(uint64_t n)
{
	/* Parse CKPT_FAULT first, so that a later lazy parse cannot undo this arm. */
	if (!atomic_load_explicit(&fault.loaded, memory_order_acquire))
		fault_load();
	atomic_store(&fault.alloc_at, 0);
	atomic_store(&fault.alloc_count, 0);
	atomic_store(&fault.alloc_at, n);
}

uint64_t ckpt_fault_alloc_count(void)
{
	return atomic_load(&fault.alloc_count);
}

bool ckpt_fault_alloc_fail(void)
{
	if (!atomic_load_explicit(&fault.loaded, memory_order_acquire))
		fault_load();
	uint64_t n = atomic_fetch_add_explicit(&fault.alloc_count, 1, memory_order_relaxed) + 1;
	uint64_t at = atomic_load_explicit(&fault.alloc_at, memory_order_relaxed);
	if (!at || n != at)
		return false;
	if (fault.only_rank >= 0 && fault.only_rank != atomic_load(&fault.my_rank))
		return false;
	ckpt_log(CKPT_LOG_INFO, "fault injected: allocation %llu fails", (unsigned long long)n);
	return true;
}

void ckpt_fault_alloc_note(int64_t blocks)
{
	atomic_fetch_add_explicit(&fault.alloc_live, blocks, memory_order_relaxed);
}

int64_t ckpt_fault_alloc_live(void)
{
	return atomic_load(&fault.alloc_live);
}
