/*
 * ckpt_internal.h — the shared-internal tier: what every module of libckpt may use.
 *
 * The base layer below io, manifest, net, snapshot and commit: error messages,
 * logging, fault injection, overflow-checked arithmetic, environment access and
 * clocks. It depends on nothing else of ours. Implemented in lib/base/.
 */
#ifndef CKPT_INTERNAL_H
#define CKPT_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"

#define CKPT_ALIGN      4096u   /* O_DIRECT alignment of offsets, lengths and buffers */
#define CKPT_HASH_BYTES 16u     /* XXH3-128 */

#define CKPT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define CKPT_UNUSED(x) ((void)(x))
#define CKPT_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* ------------------------------------------------------------------ errors
 * Every failing internal function that knows the object at fault records a
 * message in this thread's buffer and returns the code, in one statement:
 *     return ckpt_err(CKPT_ECORRUPT, "chunk %u of '%s': hash mismatch", i, name);
 * A caller that adds context prefixes the existing message: ckpt_err_prefix(). */
int  ckpt_err(int code, const char *fmt, ...) CKPT_PRINTF(2, 3);
int  ckpt_err_prefix(int code, const char *fmt, ...) CKPT_PRINTF(2, 3);
const char *ckpt_err_msg(void);          /* this thread's message */
void ckpt_err_clear(void);
/* Copy a message into this thread's buffer (carrying a worker's error to the waiter). */
void ckpt_err_restore(const char *msg);

/* ------------------------------------------------------------------ log
 * Levels are the public enum ckpt_log_level. A line goes to the callback of the
 * calling thread's log scope, else to that of ckpt_log_set, else to stderr as
 * "<UTC time> libckpt[pid] rank <r> <level>: <msg>" (the format ckpt.h documents),
 * when level is at most the scope's threshold (else CKPT_LOG's, default WARN). */
void ckpt_log(int level, const char *fmt, ...) CKPT_PRINTF(2, 3);

/* A context's log settings: where its lines go and what they carry. Set at open,
 * read-only afterwards; outlives every thread that has it in scope. */
struct ckpt_log_sink {
	ckpt_log_fn fn;             /* NULL: ckpt_log_set's, else stderr */
	void       *arg;
	int         level;          /* -1: CKPT_LOG's */
	const char *job_id;
	int         rank;
};
/* The calling thread's log scope: the sink and the step its lines are about. */
struct ckpt_log_scope {
	const struct ckpt_log_sink *sink;    /* NULL: outside a context */
	uint64_t step;                       /* CKPT_LOG_NO_STEP: none */
};
/* Enter a scope (sink may be NULL: keep the current one) and return the one it
 * replaces, for ckpt_log_leave. CKPT_LOG_SCOPE does both for a C block. */
struct ckpt_log_scope ckpt_log_enter(const struct ckpt_log_sink *sink, uint64_t step);
void ckpt_log_leave(struct ckpt_log_scope *prev);
#define CKPT_LOG_SCOPE(sink, step) \
	struct ckpt_log_scope ckpt_log_prev_ __attribute__((cleanup(ckpt_log_leave))) = \
		ckpt_log_enter((sink), (step))
/* pthread_create whose thread starts in the creator's log sink (step: none), so that
 * a context's threads log as the context. Returns 0 or a positive errno, as
 * pthread_create. */
int ckpt_thread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
                       void *arg);

/* Rate-limited lines, in the spirit of the kernel's printk_ratelimit: a limiter lets
 * at most burst lines through per interval (which starts at the first line after the
 * previous one ended), counts the rest, and says how many it held back in one line,
 * "<what>: N similar messages suppressed", once that interval has ended: before the
 * next line it lets through, or at ckpt_ratelimit_flush / _destroy. For lines a peer
 * can provoke at will (rejected connections), so that a flood of them costs the log
 * a bounded number of lines. Time is CLOCK_MONOTONIC. The fields are the limiter's
 * own: use the functions. Thread-safe, except init and destroy. */
struct ckpt_ratelimit {
	pthread_mutex_t lock;
	const char *what;           /* borrowed: outlives the limiter */
	int         level;
	uint64_t    interval_ns;
	unsigned    burst;
	uint64_t    begin_ns;       /* the current interval's start; 0: none yet */
	unsigned    printed;        /* lines let through in it */
	uint64_t    missed;         /* lines held back in it */
};
void ckpt_ratelimit_init(struct ckpt_ratelimit *rl, const char *what, int level,
                         unsigned interval_ms, unsigned burst);
/* Writes the count of lines still held back, if any. */
void ckpt_ratelimit_destroy(struct ckpt_ratelimit *rl);
/* ckpt_log at rl's level, or only counted (see above). true if the line was written. */
bool ckpt_log_limited(struct ckpt_ratelimit *rl, const char *fmt, ...) CKPT_PRINTF(2, 3);
/* Writes the count now if rl's interval has ended with lines held back. Returns the
 * milliseconds until the current interval ends while it holds lines back (call again
 * then, so that the count comes when the interval ends, not at the next line), else -1. */
int  ckpt_ratelimit_flush(struct ckpt_ratelimit *rl);
/* The decisions alone, at a given time (tests drive the clock with them). take: may a
 * line be written at now_ns? expire: end the interval if it ended by now_ns. Both
 * give in *missed the lines held back in an interval that ended (0: nothing to say;
 * the caller writes the count) and return as described above. */
bool ckpt_ratelimit_take(struct ckpt_ratelimit *rl, uint64_t now_ns, uint64_t *missed);
int  ckpt_ratelimit_expire(struct ckpt_ratelimit *rl, uint64_t now_ns, uint64_t *missed);

/* ------------------------------------------------------------------ fault injection
 * CKPT_FAULT=<point>[:<nth>][:<action>], CKPT_FAULT_RANK=<r> (default: any rank).
 * Points are listed once, in lib/base/fault.c. Actions: crash (_exit(86) at that
 * point), eio, enospc, delay:<ms>, slow:<ms>, drop, cut, skip. nth counts hits of the
 * point in this process from 1 (default 1); the fault fires on the nth hit only,
 * except skip and slow. slow is a slow device: from the nth hit on, every hit of
 * the point (on any thread) sleeps <ms> before it returns 0.
 * cut is a power cut: the file system holding the path in CKPT_FAULT_CUT is shut
 * down without flushing its journal (EXT4_IOC_SHUTDOWN, NOLOGFLUSH), then
 * _exit(87); what survives a remount is what a power cut would have left.
 * skip is a test knob that makes the library unsafe on purpose, so that the
 * power-cut campaign can show it catches the mutation: from the nth hit on, every
 * hit returns CKPT_FA_SKIP and the caller skips its sync. Only points that guard a
 * sync accept it (before_fdatasync: the shard writer's fdatasync; before_dir_fsync:
 * its fsync of the step directory); elsewhere it is refused when parsed. */
enum ckpt_fault_point {
	CKPT_FP_AFTER_CHUNK_WRITE = 0,
	CKPT_FP_BEFORE_FDATASYNC,
	CKPT_FP_AFTER_FDATASYNC,
	CKPT_FP_AFTER_PREPARE_SENT,
	CKPT_FP_COORD_BEFORE_COMMIT_TXN,
	CKPT_FP_COORD_AFTER_COMMIT_TXN,
	CKPT_FP_BEFORE_DECISION_SEND,
	CKPT_FP_AFTER_FOOTER_WRITE,
	CKPT_FP_MSG_SEND,
	CKPT_FP_LEADER_BEFORE_FORWARD,          /* a node leader, before relaying a rank's message up */
	CKPT_FP_LEADER_BEFORE_DECISION_RELAY,   /* a node leader, before handing a decision down */
	CKPT_FP_BEFORE_DIR_FSYNC,               /* the shard writer, before fsyncing the step directory */
	CKPT_FP_CKPTD_AFTER_CHUNK,              /* ckptd, after a received chunk is queued for its disk */
	CKPT_FP_CKPTD_BEFORE_DURABLE,           /* ckptd, after a shard's fdatasync, before DURABLE */
	CKPT_FP_CKPTD_AFTER_DURABLE,            /* ckptd, after DURABLE is sent */
	CKPT_FP_AFTER_STEP_DIR,                 /* a shard's step directory is there, its
	                                           file not yet (a rank's save, ckptd's stream) */
	CKPT_FP_GC_AFTER_RETIRE,                /* gc, after a committed step was retired,
	                                           before its files are removed */
	CKPT_FP_GC_AFTER_FILES_REMOVED,         /* gc, after a step's files were removed (but
	                                           those committed steps reference), before
	                                           its record is */
	CKPT_FP_COUNT_
};
enum ckpt_fault_action { CKPT_FA_NONE = 0, CKPT_FA_CRASH, CKPT_FA_EIO, CKPT_FA_ENOSPC,
                         CKPT_FA_DELAY, CKPT_FA_DROP, CKPT_FA_CUT, CKPT_FA_SKIP,
                         CKPT_FA_SLOW };
#define CKPT_FAULT_CRASH_STATUS 86
#define CKPT_FAULT_CUT_STATUS   87
/* Call at a fault point. Returns 0 (no fault, or a delay that has been served),
 * -EIO, -ENOSPC, CKPT_FA_DROP (positive: the caller drops the message), or
 * CKPT_FA_SKIP (positive: the caller skips its sync). A crash or a cut never
 * returns. The message names the point. */
int ckpt_fault(enum ckpt_fault_point p);
const char *ckpt_fault_point_name(enum ckpt_fault_point p);
/* Tell the fault table which rank this process is (for CKPT_FAULT_RANK). */
void ckpt_fault_set_rank(int rank);
/* Re-read CKPT_FAULT (tests). */
void ckpt_fault_reload(void);
/* Allocation failure (the SQLite way): every call of the allocation wrappers below
 * is counted, process-wide and on every thread; once armed with n > 0, the nth
 * counted call after arming fails (returns NULL, once), and the later ones succeed.
 * arm(0) disarms. The count restarts at 0 on every arm. CKPT_FAULT=alloc:<n> arms
 * from the process's first allocation (with CKPT_FAULT_RANK: only in that rank's
 * process, once ckpt_open has told the table the rank). */
void     ckpt_fault_alloc_arm(uint64_t n);
uint64_t ckpt_fault_alloc_count(void);   /* calls counted since the last arm */
/* Blocks the wrappers returned and ckpt_free has not freed yet, process-wide: equal
 * before and after a piece of work that must not leak (a test's leak check). */
int64_t  ckpt_fault_alloc_live(void);
/* The wrappers' hooks: true when this allocation must fail; blocks gained or lost. */
bool     ckpt_fault_alloc_fail(void);
void     ckpt_fault_alloc_note(int64_t blocks);

/* ------------------------------------------------------------------ allocation
 * Every allocation of libckpt goes through these, and the memory they return is
 * freed with ckpt_free, so that fault injection can fail the Nth (above). They are
 * libc's (same heap, same semantics, NULL and errno ENOMEM on failure; the aligned
 * forms as aligned_alloc and posix_memalign), so memory may cross to and from code
 * that uses free(). What a third-party library allocates for us (LMDB, zstd,
 * OpenSSL, liburing, CUDA) is its own and is released by its own calls. */
void *ckpt_malloc(size_t n);
void *ckpt_calloc(size_t count, size_t n);
void *ckpt_realloc(void *p, size_t n);
void *ckpt_aligned_alloc(size_t align, size_t n);
int   ckpt_posix_memalign(void **out, size_t align, size_t n);
char *ckpt_strdup(const char *s);
void  ckpt_free(void *p);

/* ------------------------------------------------------------------ arithmetic
 * Overflow-checked helpers: return false on overflow (and leave *out unspecified). */
static inline bool ckpt_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{ return !__builtin_add_overflow(a, b, out); }
static inline bool ckpt_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{ return !__builtin_mul_overflow(a, b, out); }
static inline uint64_t ckpt_align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
static inline uint64_t ckpt_align_down(uint64_t v, uint64_t a) { return v / a * a; }
/* Is [off, off+len) inside [0, total)? Overflow-safe. */
static inline bool ckpt_range_ok(uint64_t off, uint64_t len, uint64_t total)
{ return off <= total && len <= total - off; }

/* Elements of a shape (1 for ndim 0). false on overflow. */
bool ckpt_shape_elems(unsigned ndim, const uint64_t *shape, uint64_t *out);

/* ------------------------------------------------------------------ little-endian
 * On-disk and on-wire integers are little-endian; manifest keys big-endian. */
static inline void ckpt_put_le16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void ckpt_put_le32(uint8_t *p, uint32_t v)
{ for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void ckpt_put_le64(uint8_t *p, uint64_t v)
{ for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t ckpt_get_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t ckpt_get_le32(const uint8_t *p)
{ uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static inline uint64_t ckpt_get_le64(const uint8_t *p)
{ uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static inline void ckpt_put_be64(uint8_t *p, uint64_t v)
{ for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i)); }
static inline uint64_t ckpt_get_be64(const uint8_t *p)
{ uint64_t v = 0; for (int i = 0; i < 8; i++) v = v << 8 | p[i]; return v; }
static inline void ckpt_put_be32(uint8_t *p, uint32_t v)
{ for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i)); }
static inline uint32_t ckpt_get_be32(const uint8_t *p)
{ uint32_t v = 0; for (int i = 0; i < 4; i++) v = v << 8 | p[i]; return v; }

/* Bounded cursor for decoding untrusted bytes: every get checks the remaining
 * length first; after the first failure ok is false and every get returns 0. */
struct ckpt_cursor { const uint8_t *p; size_t left; bool ok; };
static inline void ckpt_cursor_init(struct ckpt_cursor *c, const void *p, size_t n)
{ c->p = (const uint8_t *)p; c->left = n; c->ok = true; }
static inline const uint8_t *ckpt_cursor_take(struct ckpt_cursor *c, size_t n)
{
	if (!c->ok || n > c->left) { c->ok = false; return NULL; }
	const uint8_t *r = c->p; c->p += n; c->left -= n; return r;
}
static inline uint8_t ckpt_cursor_u8(struct ckpt_cursor *c)
{ const uint8_t *p = ckpt_cursor_take(c, 1); return p ? p[0] : 0; }
static inline uint16_t ckpt_cursor_u16(struct ckpt_cursor *c)
{ const uint8_t *p = ckpt_cursor_take(c, 2); return p ? ckpt_get_le16(p) : 0; }
static inline uint32_t ckpt_cursor_u32(struct ckpt_cursor *c)
{ const uint8_t *p = ckpt_cursor_take(c, 4); return p ? ckpt_get_le32(p) : 0; }
static inline uint64_t ckpt_cursor_u64(struct ckpt_cursor *c)
{ const uint8_t *p = ckpt_cursor_take(c, 8); return p ? ckpt_get_le64(p) : 0; }

/* Growable output buffer for encoding. On allocation failure ok becomes false. */
struct ckpt_buf { uint8_t *p; size_t len, cap; bool ok; };
void ckpt_buf_init(struct ckpt_buf *b);
void ckpt_buf_free(struct ckpt_buf *b);
void ckpt_buf_put(struct ckpt_buf *b, const void *p, size_t n);
void ckpt_buf_u8(struct ckpt_buf *b, uint8_t v);
void ckpt_buf_u16(struct ckpt_buf *b, uint16_t v);
void ckpt_buf_u32(struct ckpt_buf *b, uint32_t v);
void ckpt_buf_u64(struct ckpt_buf *b, uint64_t v);

/* ------------------------------------------------------------------ names (util.c)
 * Why name (len bytes) breaks the rules of ckpt_name_check, in a few words, or NULL
 * when it keeps them. utf8 false checks every rule but well-formed UTF-8: the rules a
 * name read back from a shard must keep, since shards written before UTF-8 was
 * required may hold other bytes and must stay loadable. */
const char *ckpt_name_problem(const char *name, size_t len, bool utf8);
/* name as a message may quote it: well-formed UTF-8 as it is, every other byte (and
 * control bytes) as \xNN, cut after CKPT_NAME_QUOTE_BYTES bytes with "...". out holds
 * cap bytes (CKPT_NAME_QUOTE_CAP is always enough); returns out. */
#define CKPT_NAME_QUOTE_BYTES 64u
#define CKPT_NAME_QUOTE_CAP   (4u * CKPT_NAME_QUOTE_BYTES + 8u)
const char *ckpt_name_quote(const char *name, size_t len, char *out, size_t cap);

/* ------------------------------------------------------------------ environment
 * The only place that reads the environment (CONTRIBUTING.md, "Style"). */
const char *ckpt_env(const char *name);                     /* NULL if unset or empty */
/* Parse a size with optional K/M/G/T suffix (binary). -EINVAL if malformed. */
int ckpt_parse_size(const char *s, uint64_t *out);

/* ------------------------------------------------------------------ secrets (secret.c)
 * A secret kept in a file follows ssh's rule for private keys: the file is a regular
 * file of this process's effective user that nobody else may read or write (mode
 * 0600 or stricter); any other file is refused, since its secret is not one. These
 * set no error message: each caller names the file in its own terms. */
struct stat;
/* Whether st describes such a file. */
bool ckpt_secret_stat_ok(const struct stat *st);
/* Read the secret in path into out: the file's bytes, a trailing run of CR and LF
 * dropped, 1 to max of them. Returns 0 and *len; -errno of open, fstat or read;
 * -EPERM when the file breaks the rule above; -EMSGSIZE when it holds no secret or
 * more than max bytes. *mode: the file's permission bits (for a message), set once
 * it could be opened. out may hold secret bytes after a failure too: the caller
 * wipes it (explicit_bzero) in every case. */
int ckpt_secret_file_read(const char *path, void *out, size_t max, size_t *len,
                          unsigned *mode);

/* ------------------------------------------------------------------ clocks
 * Time is monotonic: every timed wait of the library (poll, condition variables)
 * runs to a deadline on CLOCK_MONOTONIC, so that a wall clock set back or forward
 * (NTP, an operator) neither stretches nor cuts a timeout. Implemented in clock.c. */
uint64_t ckpt_now_ns(void);        /* CLOCK_MONOTONIC */
uint64_t ckpt_wall_ns(void);       /* CLOCK_REALTIME: timestamps for people, never waits */

/* A deadline is an absolute ckpt_now_ns() value; CKPT_FOREVER never passes. */
#define CKPT_FOREVER UINT64_MAX
/* The deadline timeout_ms from now; a negative timeout is CKPT_FOREVER. */
uint64_t ckpt_deadline_ms(int64_t timeout_ms);
/* The deadline `ns` nanoseconds after `from` (saturating at CKPT_FOREVER). */
uint64_t ckpt_deadline_after(uint64_t from, uint64_t ns);
/* Milliseconds left until the deadline, for poll(): -1 for CKPT_FOREVER, 0 once it
 * has passed, else rounded up (a sub-millisecond remainder waits rather than spins)
 * and capped at INT32_MAX. */
int ckpt_deadline_left_ms(uint64_t deadline);
bool ckpt_deadline_passed(uint64_t deadline);
/* Sleep ms milliseconds, the whole of them: a signal's interruption sleeps on. */
void ckpt_sleep_ms(unsigned ms);

/* A condition variable whose timed waits run on CLOCK_MONOTONIC. Every condition
 * variable of the library is made with it, waited on with the call below. */
int ckpt_cond_init(pthread_cond_t *cond);
/* pthread_cond_wait until the deadline: 0 when woken (the caller checks its
 * predicate again), ETIMEDOUT once the deadline has passed. CKPT_FOREVER waits
 * without a timeout. The cond must come from ckpt_cond_init. */
int ckpt_cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *lock, uint64_t deadline);
/* A random, non-zero 64-bit id (getrandom): incarnations and save ids. */
uint64_t ckpt_random_id(void);

/* ------------------------------------------------------------------ paths */
/* Layout of a checkpoint root (docs/format.md §1). Return -ENAMETOOLONG on overflow. */
#define CKPT_MANIFEST_NAME      "manifest"           /* the manifest in its root (the default) */
/* Beside a manifest directory D, in D's parent: D.new-* is a manifest being created,
 * D.damaged-* a damaged one set aside. In a root: manifest.new-*, manifest.damaged-*. */
#define MANIFEST_NEW_SUFFIX     ".new-"
#define MANIFEST_DAMAGED_SUFFIX ".damaged-"
#define MANIFEST_NEW_PREFIX     CKPT_MANIFEST_NAME MANIFEST_NEW_SUFFIX
#define MANIFEST_DAMAGED_PREFIX CKPT_MANIFEST_NAME MANIFEST_DAMAGED_SUFFIX
#define CKPT_LOCK_FILE          "coordinator.lock"   /* held by the root's one coordinator */
/* The manifest directory of root when none is set apart from it: <root>/manifest. */
int ckpt_path_manifest_dir(char *out, size_t cap, const char *root);
int ckpt_path_step_dir(char *out, size_t cap, const char *root, uint64_t step);
/* Shard files: save_id names the attempt that wrote it (0: a format-1/2 file, named
 * without one). _name is the file's name in its step directory; _rel the path
 * relative to the root, as recorded in the manifest; _parse the inverse of _name. */
int ckpt_path_shard(char *out, size_t cap, const char *root, uint64_t step, uint32_t rank,
                    uint64_t save_id);
int ckpt_path_shard_rel(char *out, size_t cap, uint64_t step, uint32_t rank, uint64_t save_id);
int ckpt_path_shard_name(char *out, size_t cap, uint32_t rank, uint64_t save_id);
bool ckpt_path_parse_shard(const char *name, uint32_t *rank, uint64_t *save_id);
/* Remove the shard files of attempt save_id from step's directory, and sync it;
 * nothing else in it is touched. save_id 0 (a record of an older build, or
 * rebuild's verdict on the directory, names no attempt): every shard file. *removed: how
 * many; *empty: nothing else is left in the directory (or it does not exist). */
int ckpt_step_remove_attempt(const char *root, uint64_t step, uint64_t save_id,
                             uint32_t *removed, bool *empty);
/* The same, sparing the files for which keep(arg, rank, save id) is true (files
 * that committed steps reference: docs/format.md §8.6a); they count as left. */
typedef bool (*ckpt_keep_fn)(void *arg, uint32_t rank, uint64_t save_id);
int ckpt_step_remove_attempt_keep(const char *root, uint64_t step, uint64_t save_id,
                                  ckpt_keep_fn keep, void *arg, uint32_t *removed,
                                  bool *empty);
/* Parse "step-NNNNNNNNNNNNNNNNNNNN" -> step; false if not that form. */
bool ckpt_path_parse_step_dir(const char *name, uint64_t *step);
/* fsync a directory by path. */
int ckpt_fsync_dir(const char *path);

#endif /* CKPT_INTERNAL_H */
