/*
 * ckpt.h — the public API of libckpt, a distributed checkpoint storage engine.
 *
 * This header, with ckpt/catalog.h (the catalog for tools: chunk placement,
 * verify, garbage collection, rebuild) and ckpt/cuda.h (CUDA streams and events),
 * is the whole promise to users: nothing outside them is stable.
 *
 * Return values and errors
 *   - Functions return 0 (or a count) on success and a negative code on failure:
 *     either a negated errno (-ENOENT, -ENOSPC, ...) or a CKPT_E* code from the
 *     reserved band below. ckpt_strerror() names every code.
 *   - Each declaration lists the errors it returns. Two hold everywhere and are not
 *     repeated: -EINVAL for a NULL handle or a NULL pointer argument that the call
 *     needs, and -ENOMEM for a failed allocation in any call that allocates.
 *   - A human-readable message naming the object at fault (step, rank, tensor,
 *     file, offset) is kept per thread: ckpt_last_error() after any failing call.
 *     A save's failure is carried to the thread that waits for it.
 *
 * Handles
 *   - Handles are opaque. Every create/open has a matching free/close; freeing
 *     NULL is a no-op; on a failed create the out-pointer is set to NULL and
 *     nothing needs to be freed.
 *
 * Structs and growth (fields are only ever appended to a public struct)
 *   - Input option structs carry their size first and are initialised by their
 *     *_opts_init(&o, sizeof o) function; the library reads only the fields that
 *     lie within the size the caller was compiled with, defaults for the rest.
 *   - A single result struct (ckpt_save_stats, ckpt_gds_stats and those of
 *     ckpt/catalog.h) carries its size first too: the caller sets it to sizeof, and
 *     the library writes only that many bytes.
 *   - Information structs that callers keep in arrays (struct ckpt_step_info,
 *     struct ckpt_tensor_info, struct ckpt_chunk_info) carry no size field: the
 *     function that fills them takes elem_size, sizeof the element as the caller
 *     was compiled with. Element i is written at byte i * elem_size, and only its
 *     first elem_size bytes (a newer library never writes past an older caller's
 *     struct; an older library leaves a newer caller's extra fields zero).
 *     elem_size below the size the struct had when its function came (its fields
 *     before the first one appended since: ckpt_chunk_info's before hash_blocks)
 *     is -EINVAL.
 *
 * Threads
 *   - ckpt_ctx: thread-safe; one per process is the intended use.
 *   - ckpt_save: one thread at a time (any thread), from begin to free.
 *   - ckpt_load: reads (ckpt_load_tensor/_blob/_info) may run from many threads
 *     at once; ckpt_load_close only when no read is running.
 *   - Functions without a handle (ckpt_strerror, the *_name functions,
 *     ckpt_name_check, ckpt_opts_init, ckpt_log_set): any thread.
 *
 * Caveats
 *   - Do not fork() a process that has an open ckpt_ctx and use it in the child:
 *     the manifest (LMDB) and io_uring do not survive fork.
 *   - The checkpoint root must not be shared between machines for writing
 *     manifests; see docs/operations.md.
 */
#ifndef CKPT_CKPT_H
#define CKPT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CKPT_BUILDING_LIBRARY)
#define CKPT_API __attribute__((visibility("default")))
#else
#define CKPT_API
#endif

/* ------------------------------------------------------------------ version
 * The version of the headers compiled against; ckpt_version() is the version of
 * the library running, which may be a later release of the same major version
 * (CONTRIBUTING.md, "ABI and versions"). The build refuses these numbers unless
 * they are the project's version. */

#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 2
#define CKPT_VERSION_PATCH 0
/* One number that compares in order: MAJOR * 10000 + MINOR * 100 + PATCH. */
#define CKPT_VERSION_NUMBER \
	(CKPT_VERSION_MAJOR * 10000 + CKPT_VERSION_MINOR * 100 + CKPT_VERSION_PATCH)

/* The library's version, "MAJOR.MINOR.PATCH" ("0.2.0"). A static string: never
 * NULL, never to be freed. Any thread, at any time. */
CKPT_API const char *ckpt_version(void);

/* ------------------------------------------------------------------ errors */

/* Reserved band: [-1999, -1000]. Never collides with -errno. */
enum ckpt_error {
	CKPT_ECORRUPT   = -1001, /* stored bytes fail their hash or structure check */
	CKPT_EFORMAT    = -1002, /* not a libckpt file/manifest, or malformed metadata */
	CKPT_EVERSION   = -1003, /* written by a newer, incompatible format version */
	CKPT_ENOTFOUND  = -1004, /* no such step, tensor or blob */
	CKPT_EABORTED   = -1005, /* the save was aborted; the step is not visible */
	CKPT_EINDOUBT   = -1006, /* the coordinator was lost after voting: the manifest decides */
	CKPT_ENAME      = -1007, /* invalid tensor or blob name */
	CKPT_ESHAPE     = -1008, /* bad shape, slice outside the shape, or size overflow */
	CKPT_EDTYPE     = -1009, /* dtype differs from the stored one */
	CKPT_ENOTROOT   = -1010, /* the directory is not a checkpoint root */
	CKPT_ERANKBOUND = -1011, /* rank-bound item asked for by another world size/rank */
	CKPT_EAUTH      = -1012, /* peer failed authentication (secret, job id) */
	CKPT_EPROTO     = -1013, /* malformed or unexpected protocol message */
	CKPT_EPEER      = -1014, /* peer rejected us or the job (wrong world, dup rank) */
	CKPT_ESTATE     = -1015, /* call not valid in the handle's current state */
	CKPT_EINVALID   = -1016, /* validation of a gathered index failed (gaps, overlaps, mismatch) */
	CKPT_ENODEV     = -1017, /* requested transport/device/feature not available */
	CKPT_ENOMANIFEST = -1018, /* the root's manifest is missing or unusable while the root
	                           * holds checkpoint data (run ckpt-inspect rebuild), kept
	                           * apart on another host, or another root's */
};

/* A static, never-NULL description of any code returned by this library. */
CKPT_API const char *ckpt_strerror(int err);

/* ------------------------------------------------------------------ types */

enum ckpt_dtype {
	CKPT_F64 = 1, CKPT_F32, CKPT_F16, CKPT_BF16, CKPT_F8_E4M3, CKPT_F8_E5M2,
	CKPT_I64, CKPT_I32, CKPT_I16, CKPT_I8, CKPT_U8, CKPT_BOOL,
	CKPT_DTYPE_MAX_ = CKPT_BOOL
};
/* Bytes per element, or 0 for an unknown dtype. */
CKPT_API size_t ckpt_dtype_size(int dtype);
/* Short name ("f32", "bf16", "f8_e4m3", ...), or "?" for an unknown dtype. */
CKPT_API const char *ckpt_dtype_name(int dtype);

enum ckpt_kind {
	CKPT_KIND_MODEL = 1, CKPT_KIND_OPTIMIZER, CKPT_KIND_RNG, CKPT_KIND_SCHEDULER,
	CKPT_KIND_EXTRA, CKPT_KIND_MAX_ = CKPT_KIND_EXTRA
};
/* "model", "optimizer", "rng", "scheduler", "extra", or "?" for an unknown kind. */
CKPT_API const char *ckpt_kind_name(int kind);

enum ckpt_policy {
	CKPT_SHARDED = 1,    /* each rank holds a box; the boxes tile the global shape exactly */
	CKPT_REPLICATED,     /* every rank holds the same whole value (checked by hash) */
	CKPT_RANK_BOUND,     /* each rank its own value; loads only for the same rank and world */
	CKPT_POLICY_MAX_ = CKPT_RANK_BOUND
};
/* "sharded", "replicated", "rank-bound", or "?" for an unknown policy. */
CKPT_API const char *ckpt_policy_name(int policy);

enum ckpt_mem { CKPT_MEM_AUTO = 0, CKPT_MEM_HOST, CKPT_MEM_DEVICE };

#define CKPT_MAX_NDIM   16
#define CKPT_MAX_NAME   4096     /* bytes, without the terminating NUL */
#define CKPT_MAX_META   65536    /* bytes of a step's metadata (ckpt_save_set_meta) */
#define CKPT_LATEST     UINT64_MAX


/* ------------------------------------------------------------------ logging
 *
 * Every line the library logs has a level and a place: the job, rank and step it is
 * about. By default a line goes to stderr, one write(2) per line:
 *
 *   2027-01-31T12:34:56.789Z libckpt[<pid>] rank <r> <level>: <message>
 *
 * (the time in UTC, ISO 8601 with milliseconds; rank "-" outside a context), when
 * its level is at most the threshold: ckpt_opts.log_level for the lines of a
 * context, else CKPT_LOG (error, warn, info, debug or a number), else
 * CKPT_LOG_WARN. A callback replaces stderr: ckpt_opts.log_fn for the lines of one
 * context (its calls and the threads it runs), ckpt_log_set for every other line.
 * Lines a peer can provoke at will (rejected connections) are rate limited: past a
 * burst, they are counted and the count is logged as one line "<what>: N similar
 * messages suppressed" when the interval ends; the callback sees those lines too.
 */
enum ckpt_log_level { CKPT_LOG_ERROR = 0, CKPT_LOG_WARN, CKPT_LOG_INFO, CKPT_LOG_DEBUG };

#define CKPT_LOG_NO_RANK (-1)           /* ckpt_log_ctx.rank outside a context */
#define CKPT_LOG_NO_STEP UINT64_MAX     /* ckpt_log_ctx.step of a line about no step */

/* Where a line comes from. Valid only during the callback. Fields are appended only. */
struct ckpt_log_ctx {
	const char *job_id;     /* the context's job id; NULL outside a context */
	int         rank;       /* the context's rank; CKPT_LOG_NO_RANK outside one */
	uint64_t    step;       /* the step of the save or load the line is about (a
	                         * save's calls and the save worker's lines for it);
	                         * CKPT_LOG_NO_STEP for the rest (open, close, the
	                         * coordinator's connections, the catalog) */
};
/* A log callback: msg is one line without its newline, valid during the call. It is
 * called from whichever thread logs (callers' threads and the library's own), possibly
 * from several at once, sometimes with library locks held: it must be thread-safe,
 * return soon, and call no libckpt function. */
typedef void (*ckpt_log_fn)(void *arg, int level, const struct ckpt_log_ctx *where,
                            const char *msg);
/* Send every line that comes from no context with a callback of its own to fn (NULL:
 * back to stderr). Process-wide; any thread; lines already being written may still
 * reach the previous callback, so keep its arg valid until the library is quiet. */
CKPT_API void ckpt_log_set(ckpt_log_fn fn, void *arg);

/* ------------------------------------------------------------------ context */

typedef struct ckpt_ctx  ckpt_ctx;
typedef struct ckpt_save ckpt_save;
typedef struct ckpt_load ckpt_load;

enum ckpt_transport { CKPT_TRANSPORT_AUTO = 0, CKPT_TRANSPORT_TCP, CKPT_TRANSPORT_RDMA };

/* GPUDirect Storage (cuFile) uses, a bit set (ckpt_gds_stats below says more). */
enum ckpt_gds {
	CKPT_GDS_LOAD = 1u << 0,      /* loads of raw chunks into device memory */
	CKPT_GDS_SAVE = 1u << 1,      /* saves write device tensors with cuFile: synchronous */
	CKPT_GDS_OFF  = 1u << 7,      /* neither, whatever CKPT_GDS says */
};

enum ckpt_open_flags {
	CKPT_OPEN_READONLY = 1u << 0, /* tools: no saves, manifest opened read-only, no coordinator */
	CKPT_OPEN_NO_GC    = 1u << 1, /* the coordinator skips garbage collection at open */
	CKPT_OPEN_RECOVER  = 1u << 2, /* for ckpt_catalog_rebuild (ckpt/catalog.h): open a
	                               * root whose manifest is missing or damaged (see
	                               * ckpt_open); implies NO_GC */
	CKPT_OPEN_GROUP_ACCESS = 1u << 3, /* create files 0640 and directories 0750, so that
	                               * the group can read checkpoints (default: 0600 and
	                               * 0700, or CKPT_GROUP_ACCESS=1) */
	CKPT_OPEN_NO_AUTH  = 1u << 4, /* let a job of several ranks run without a secret
	                               * (logged); or CKPT_AUTH=off. See ckpt_open */
};

struct ckpt_opts {
	size_t      size;          /* first; set by ckpt_opts_init(&o, sizeof o) */
	const char *root;          /* checkpoint root directory; NULL: CKPT_ROOT */
	unsigned    flags;         /* enum ckpt_open_flags */
	int         rank, world;   /* -1: RANK/WORLD_SIZE, then SLURM_PROCID/SLURM_NTASKS, then 0/1 */
	const char *coord_addr;    /* NULL: CKPT_COORD_ADDR, then MASTER_ADDR, then 127.0.0.1 */
	unsigned    coord_port;    /* 0: CKPT_COORD_PORT, then MASTER_PORT+1, then 29600 */
	int         transport;     /* enum ckpt_transport; AUTO: CKPT_TRANSPORT, then tcp */
	const char *job_id;        /* NULL: CKPT_JOB_ID, then "default" */
	const void *secret;        /* NULL: CKPT_JOB_SECRET, then the contents of the file
	                            * CKPT_JOB_SECRET_FILE (mode 0600); required when world
	                            * > 1 (see ckpt_open) */
	size_t      secret_len;
	size_t      pool_bytes;    /* bound on staging memory; 0: CKPT_POOL_BYTES, then 256 MiB */
	size_t      chunk_bytes;   /* chunk size, multiple of 4096; 0: CKPT_CHUNK_BYTES, then 16 MiB */
	int         zstd_level;    /* 0: store raw (default); -1: CKPT_COMPRESS; 1..22: the
	                            * level of the codec compress_codec names */
	unsigned    max_inflight;  /* saves in flight at once; 0: 2 */
	unsigned    timeout_ms;    /* commit timeout; 0: CKPT_TIMEOUT_MS, then 120000 */
	unsigned    queue_depth;   /* io_uring writes in flight; 0: 8 */
	unsigned    gds;           /* enum ckpt_gds bits; 0: CKPT_GDS ("load", "save", "load,save",
	                            * "0"), then off. Falls back to the pinned path when cuFile is
	                            * unavailable (ckpt/cuda.h) */
	ckpt_log_fn log_fn;        /* this context's lines go to log_fn(log_arg, ...) instead of
	                            * stderr (see "logging" above); NULL: stderr, or the
	                            * callback of ckpt_log_set. log_arg must stay valid until
	                            * ckpt_close returns */
	void       *log_arg;
	int         log_level;     /* enum ckpt_log_level: this context's threshold; -1 (the
	                            * default): CKPT_LOG, then CKPT_LOG_WARN */
	/* Retention by the job itself: after every commit, the coordinator (rank 0)
	 * removes the committed steps that no rule keeps, as ckpt_catalog_gc with these
	 * rules (ckpt/catalog.h); the latest committed step and saves in flight are never
	 * removed. 0: no such rule (the default: CKPT_KEEP_LAST, CKPT_KEEP_EVERY,
	 * CKPT_KEEP_SECONDS, then none); with none, nothing is removed. See ckpt_open. */
	uint64_t    keep_last;     /* keep the newest N committed steps */
	uint64_t    keep_every;    /* keep the committed steps that are multiples of K */
	uint64_t    keep_seconds;  /* keep the steps committed within the last S seconds */
	/* Where the manifest lives, apart from the shard files: on the coordinator's
	 * (rank 0's) local disk while the shards go to a shared file system, where an
	 * LMDB manifest must never be (docs/operations.md, "Multi-node deployments").
	 * An absolute path; its parent is created when missing. The manifest records the
	 * root it belongs to: another root is refused it. Ranks other than rank 0 need
	 * it only to load. NULL: CKPT_MANIFEST_DIR, then <root>/manifest. */
	const char *manifest_dir;
	/* Save to and load from ckptd, the snapshot service of storage nodes, instead of
	 * the root: "ckptd://HOST:PORT[,HOST:PORT...]" (docs/ckptd.md). NULL:
	 * CKPT_TARGET, then the root. With a target, root is not used. */
	const char *target;
	/* What a save compresses with when zstd_level > 0 (enum ckpt_codec in
	 * ckpt/catalog.h): CKPT_CODEC_ZSTD (0 means it too: the default), or
	 * CKPT_CODEC_BYTEGROUP: the bytes of bf16, f16, f32 and f64 elements split into
	 * planes, the planes that pay compressed with zstd (at level 1 entropy-coded
	 * unless they repeat; docs/format.md §5) (other dtypes: zstd). With
	 * zstd_level -1, CKPT_COMPRESS chooses both: none, zstd[:LEVEL] or
	 * bytegroup[:LEVEL] (docs/operations.md). */
	int         compress_codec;
	/* Threads that compress one rank's chunks while its writes go on (the pool bounds
	 * the chunks they hold), hashing the device chunks they compress; in an
	 * incremental save or one through ckptd, as many threads hash device chunks
	 * after their copy (docs/perf.md §9). 0: CKPT_COMPRESS_THREADS, then half of the
	 * rank's CPUs (those it is pinned to, else the host's divided among the node's
	 * ranks), at most 4, at least 1. At most 64. */
	unsigned    compress_threads;
	/* Incremental saves (docs/format.md §3b): a chunk whose bytes equal the same
	 * chunk of the previous committed step (same tensor, box and chunk, known by its
	 * XXH3-128) is not written again; the new step references it, and loads, verify
	 * and gc follow. 1: on; 0: off; -1 (ckpt_opts_init's): CKPT_INCREMENTAL (0 or 1),
	 * then off. Saves through ckptd are never incremental. One save may turn it off
	 * or on (ckpt_save_set_incremental). */
	int         incremental;
	/* The device staging pool (docs/gpu.md, "Device staging pool"): bytes of spare
	 * memory on the device of the save's tensors, taken once (cudaMalloc) at the first
	 * save with device tensors and held until ckpt_close. A save copies the caller's
	 * tensors into it on the device, so its snapshot point (and event) comes after
	 * device-to-device copies; the device-to-host copies, hashing and writes then run
	 * from it in the background. The last part of the state that fits goes there;
	 * the rest takes the pinned path as without it. 0: CKPT_DEVICE_POOL_BYTES, then
	 * none (off). Ignored without a device, for GPUDirect Storage saves, and for saves
	 * of host memory only. */
	size_t      device_pool_bytes;
	/* append only */
};

/* Fill *o with defaults. size must be sizeof *o as the caller knows it. */
CKPT_API void ckpt_opts_init(struct ckpt_opts *o, size_t size);

/*
 * GPUDirect Storage (cuFile), optional: ckpt_opts.gds or CKPT_GDS asks for it; at
 * ckpt_open libckpt loads libcufile and opens its driver, and when anything is
 * missing it logs why (WARN) and keeps the pinned path. Then:
 *   - CKPT_GDS_LOAD: loads into device memory read raw chunks with cuFile straight
 *     into device memory. Every chunk is still verified before any of its bytes
 *     reach the caller: it is also copied device-to-host into the pool and hashed
 *     there (at copy-engine speed), then copied device-to-device into place.
 *     Compressed chunks and host destinations take the pinned path.
 *   - CKPT_GDS_SAVE: saves are synchronous for device tensors: their chunks are
 *     written from device memory with cuFile (hashed from the pool copy the save
 *     makes anyway), so the snapshot point — ckpt_save_wait_snapshot and the
 *     snapshot event — comes only when the last of them is written. Use it where the
 *     caller waits for the save anyway (ckpt_save_wait right after submit).
 * cuFile may still refuse a file (cuFileHandleRegister: a file system or volume it
 * cannot classify): libckpt then logs it (WARN), counts it in files_refused and
 * reads or writes that file through the pinned path. Without a kernel driver for
 * GPUDirect (nvidia-fs) cuFile runs in its compatibility mode through its own host
 * buffers: correct, but no faster than the pinned path. cuFile itself is set up
 * with its own cufile.json and CUFILE_* environment (docs/gpu.md).
 */
struct ckpt_gds_stats {
	size_t   size;              /* first; caller sets sizeof */
	int      active;            /* 1: cuFile is in use in this context */
	uint64_t chunks_read, bytes_read;        /* by cuFile, since open */
	uint64_t chunks_written, bytes_written;
	uint64_t files_refused;     /* files cuFile would not register: the pinned path served */
};
/* Fill *st (st->size set by the caller). Errors: -EINVAL (st->size smaller than this
 * struct). Any thread. */
CKPT_API int ckpt_gds_stats(const ckpt_ctx *c, struct ckpt_gds_stats *st);

/*
 * Open a checkpoint root. Creates the root (mode 0700) and its manifest when the
 * directory is missing or empty (unless CKPT_OPEN_READONLY). The coordinator role
 * (rank 0, not read-only) holds the root for the context's life: a second one on the
 * same root, in any process, is refused (-EBUSY naming the holder), and it runs
 * garbage collection of the attempts the manifest names as aborted at open. A root
 * whose manifest is missing, emptied or damaged while it holds step directories is
 * refused by every rank with CKPT_ENOMANIFEST — nothing in it is changed — and
 * CKPT_OPEN_RECOVER opens it for ckpt_catalog_rebuild (a damaged manifest is moved
 * aside to manifest.damaged-<time>, beside it, first). The manifest is <root>/manifest,
 * or the directory manifest_dir names (kept apart; rank 0 of a saving job alone needs
 * it at open). A job of several ranks needs a job secret
 * (CKPT_EAUTH otherwise) unless CKPT_OPEN_NO_AUTH or CKPT_AUTH=off says to run
 * without one; with several ranks every rank connects to the coordinator before
 * ckpt_open returns.
 * Errors:
 *   -EINVAL            bad options: size not set, no root, unknown flag bits, rank
 *                      outside the world, a manifest directory that is not an
 *                      absolute path, chunk or pool size, zstd level, queue
 *                      depth, gds bits, job id too long, log_level above
 *                      CKPT_LOG_DEBUG, or a malformed environment variable
 *   -ENOENT            CKPT_OPEN_READONLY and the root (or its manifest) is missing
 *   -EACCES, -EROFS    the root cannot be read, or created or written where needed
 *   -ENAMETOOLONG      the root path
 *   -EBUSY             another coordinator holds the root (the message names it)
 *   CKPT_ENOTROOT      a non-empty directory, or not a directory, without a manifest
 *   CKPT_ENOMANIFEST   step directories but no usable manifest (see above); with a
 *                      manifest directory apart (manifest_dir): one that holds the
 *                      manifest of another root (the message names both), or one
 *                      that is not on this host where the context needs it (a
 *                      read-only context, or rank 0 of a root that holds steps)
 *   -EEXIST            a manifest directory apart, and the root has a manifest of
 *                      its own (<root>/manifest)
 *   CKPT_EVERSION      the manifest is of a newer format
 *   CKPT_EFORMAT, CKPT_ECORRUPT  the manifest is not one, or is damaged
 *   CKPT_EAUTH         no secret for a job of several ranks, a bad secret file, or a
 *                      peer that failed the handshake
 *   CKPT_EPEER, CKPT_EPROTO  the coordinator refused this rank (wrong world,
 *                      duplicate rank, its own open failed: the message says why) or
 *                      spoke garbage
 *   CKPT_ENODEV        the transport asked for (rdma) is not available
 *   -ETIMEDOUT, -ECONNREFUSED, -EADDRINUSE and other -errno of the network: the
 *                      coordinator was not reachable within timeout_ms, or could not
 *                      listen
 * On failure *out is NULL; the message names the root.
 */
CKPT_API int  ckpt_open(const struct ckpt_opts *o, ckpt_ctx **out);
/*
 * Retention (ckpt_opts.keep_last, keep_every, keep_seconds): when a rule is set, the
 * save worker of the coordinator's context applies it after each commit, once the
 * save's outcome is published (ckpt_save_wait returns without waiting for it; the
 * next save of the context starts after it). A step is kept by any rule that keeps
 * it; the latest committed step always. It removes, as ckpt_catalog_gc does, the
 * aborted attempts too. A failure is logged (WARN) and fails no save.
 */
/* Waits for every save in flight to finish, and for the retention they started,
 * then frees. NULL: no-op. */
CKPT_API void ckpt_close(ckpt_ctx *c);
/* The calling thread's last error message from any libckpt call ("" if none): the
 * message is per thread, not per handle. The pointer is valid until this thread's
 * next libckpt call. Any thread. */
CKPT_API const char *ckpt_last_error(void);

/* The context's rank and world size, as resolved at open; -EINVAL if c is NULL. */
CKPT_API int ckpt_rank(const ckpt_ctx *c);
CKPT_API int ckpt_world(const ckpt_ctx *c);

/* ------------------------------------------------------------------ save */

struct ckpt_tensor {
	const char     *name;          /* '/'-separated; see ckpt_name_check() */
	int             kind;          /* enum ckpt_kind */
	int             dtype;         /* enum ckpt_dtype */
	int             policy;        /* enum ckpt_policy */
	unsigned        ndim;          /* 0 (scalar) .. CKPT_MAX_NDIM */
	const uint64_t *global_shape;  /* ndim entries */
	const uint64_t *offset;        /* this rank's box; NULL: all zeros */
	const uint64_t *extent;        /* NULL: the global shape */
	const void     *data;          /* contiguous row-major box; read until the snapshot point */
	int             mem;           /* enum ckpt_mem */
};

/*
 * Begin a save of step on this rank; with max_inflight saves in flight it first waits
 * for one to finish. A step has at most one attempt at a time in a context.
 * Errors:
 *   CKPT_ESTATE   the context was opened CKPT_OPEN_READONLY
 *   -EINVAL       step is CKPT_LATEST (reserved)
 *   -EBUSY        a save of the same step, begun in this context, is live and not yet
 *                 finished (not submitted, or submitted and not done); once it has
 *                 finished, even before ckpt_save_free, the step may be begun again
 *   -EEXIST       the step is already committed
 *   the manifest's errors (-EIO, -ENOSPC, CKPT_ECORRUPT) when the attempt is recorded,
 *   and with several ranks the coordinator's answer: CKPT_EABORTED, CKPT_EPEER,
 *   CKPT_EPROTO, -ETIMEDOUT, -ECONNRESET (the message names the rank)
 * On failure *out is NULL.
 */
CKPT_API int ckpt_save_begin(ckpt_ctx *c, uint64_t step, ckpt_save **out);
/* Add this rank's box of a tensor. The data must stay unchanged until the snapshot
 * point (ckpt_save_wait_snapshot).
 * Errors:
 *   CKPT_ENAME   t->name breaks a rule of ckpt_name_check (the message quotes it,
 *                bytes that are not UTF-8 as \xNN)
 *   -EINVAL      t or t->name NULL, unknown kind, dtype or policy, data NULL for a box
 *                of more than zero bytes
 *   CKPT_ESHAPE  ndim above CKPT_MAX_NDIM, global_shape NULL, a box outside the
 *                global shape, a replicated tensor not saved whole, a size that
 *                overflows 64 bits
 *   -EEXIST      the name was already added to this save
 *   CKPT_ESTATE  the save was submitted */
CKPT_API int ckpt_save_add_tensor(ckpt_save *s, const struct ckpt_tensor *t);
/* A tensor's bytes pulled on demand: fill dst with the len bytes of this rank's box
 * (row-major) that start at byte off; return 0, or a negative code that fails the
 * save with it. Called by the save worker's thread, in increasing off, between
 * ckpt_save_submit and the snapshot point, never after it; off and len follow the
 * chunk size. */
typedef int (*ckpt_source_fn)(void *arg, uint64_t off, void *dst, size_t len);
/* ckpt_save_add_tensor whose bytes come from fn (t->data is ignored): a tensor
 * streamed from another checkpoint, a file or a socket, with host memory bounded by
 * the pool whatever its size. t->mem must be CKPT_MEM_AUTO or CKPT_MEM_HOST. fn and
 * arg must stay valid until the snapshot point. Errors: as ckpt_save_add_tensor;
 * -EINVAL also for fn NULL or t->mem CKPT_MEM_DEVICE. */
CKPT_API int ckpt_save_add_tensor_source(ckpt_save *s, const struct ckpt_tensor *t,
                                         ckpt_source_fn fn, void *arg);
/* Add opaque bytes (RNG state, scheduler, dataloader position). policy is
 * CKPT_REPLICATED or CKPT_RANK_BOUND. Errors: CKPT_ENAME, -EINVAL (name NULL, unknown
 * kind, another policy, data NULL with len > 0), -EEXIST, CKPT_ESTATE, as
 * ckpt_save_add_tensor. */
CKPT_API int ckpt_save_add_blob(ckpt_save *s, const char *name, int kind, int policy,
                                const void *data, size_t len);
/* Attach metadata to the step: the text of one JSON object (loss, tokens seen, ...),
 * len bytes, no NUL needed. It is stored with the step's record when the step commits
 * and read back by ckpt_step_meta without opening the step's shards. Calling it again
 * replaces it. Every rank may call it; the committed step keeps rank 0's (the other
 * ranks' is not sent). The text is copied: json may be freed on return.
 * Errors:
 *   -EINVAL       not a JSON object: not JSON (the message says where the parser
 *                 stopped: line, column, byte), ill-formed UTF-8, a NUL byte, empty,
 *                 or JSON of another type; json NULL with len > 0
 *   -E2BIG        len above CKPT_MAX_META
 *   CKPT_ESTATE   the save was submitted */
CKPT_API int ckpt_save_set_meta(ckpt_save *s, const char *json, size_t len);
/* Whether this save may reference chunks of the previous committed step instead of
 * writing them again (on: 1, off: 0); the default is the context's
 * (ckpt_opts.incremental). Off writes every byte: a step whose files depend on no
 * other step's. Errors: -EINVAL (on not 0 or 1), CKPT_ESTATE (the save was
 * submitted). */
CKPT_API int ckpt_save_set_incremental(ckpt_save *s, int on);
/* Queue the save. Returns at once. 0: ckpt_save_wait reports the outcome exactly
 * once; negative: nothing was queued and the handle may only be freed.
 * Errors: CKPT_ESTATE (already submitted), and for a save of device tensors the CUDA
 * error of recording its ordering event, converted (ckpt/cuda.h). */
CKPT_API int ckpt_save_submit(ckpt_save *s);
/* Block until every byte of the caller's data has been copied out (the snapshot
 * point): the caller may modify its tensors after 0. timeout_ms < 0: forever.
 * Errors: CKPT_ESTATE (not submitted), -ETIMEDOUT (the save goes on), or the save's
 * own failure when it failed before its snapshot point (as ckpt_save_wait). */
CKPT_API int ckpt_save_wait_snapshot(ckpt_save *s, int timeout_ms);
/* Block until the step is durable and committed (0) or failed; may be called again
 * and reports the same outcome. timeout_ms < 0: forever.
 * Errors: CKPT_ESTATE (not submitted), -ETIMEDOUT (the save goes on), and the save's
 * outcome: CKPT_EABORTED (nothing visible; the message says which rank failed and
 * why), CKPT_EINDOUBT (this rank voted and lost the coordinator: the manifest
 * decides), CKPT_EINVALID (the gathered index failed validation: gaps, overlaps,
 * replicas that differ), or a local failure that also aborts the step on every rank
 * (-ENOSPC, -EIO, -EDQUOT, the code a ckpt_source_fn returned, ...), with the cause
 * in ckpt_last_error(). */
CKPT_API int ckpt_save_wait(ckpt_save *s, int timeout_ms);
/* Frees the handle. A submitted save still in flight is waited for first; a save
 * begun and never submitted is aborted (on every rank). NULL: no-op. */
CKPT_API void ckpt_save_free(ckpt_save *s);

struct ckpt_save_stats {
	size_t   size;             /* first; caller sets sizeof */
	uint64_t logical_bytes;    /* bytes added by this rank */
	uint64_t stored_bytes;     /* bytes written for them (after compression) */
	double   snapshot_seconds; /* submit -> snapshot point */
	double   durable_seconds;  /* submit -> shard durable on this rank */
	double   commit_seconds;   /* submit -> committed */
	/* Where the bytes went (0 until the shard is durable): */
	uint64_t referenced_bytes; /* not written: references to the previous committed
	                            * step's chunks (incremental saves) */
	uint64_t device_staged_bytes;    /* copied into the device staging pool */
	uint64_t device_unchanged_bytes; /* found unchanged in the device staging pool:
	                                  * neither copied to the host nor written */
};
/* Fill *st (st->size set by the caller; the fields of what has not happened yet are
 * 0). Errors: -EINVAL (st->size smaller than its size field). */
CKPT_API int ckpt_save_stats(const ckpt_save *s, struct ckpt_save_stats *st);

/* ------------------------------------------------------------------ load */

/* Open a committed step (or CKPT_LATEST). A rank other than the coordinator reads the
 * manifest itself: with a manifest directory kept apart (ckpt_opts.manifest_dir) that
 * is on rank 0's local disk, only ranks on rank 0's node can load (docs/operations.md,
 * "Multi-node deployments").
 * Errors: CKPT_ENOTFOUND (no such committed step, or none at all), CKPT_ENOTROOT (no
 * manifest), CKPT_ENOMANIFEST (the manifest directory kept apart is not on this host,
 * naming it and the host; or it holds another root's manifest),
 * CKPT_ECORRUPT / CKPT_EFORMAT / CKPT_EVERSION (a manifest record),
 * -EIO. On failure *out is NULL. */
CKPT_API int  ckpt_load_open(ckpt_ctx *c, uint64_t step, ckpt_load **out);
/* NULL: no-op. */
CKPT_API void ckpt_load_close(ckpt_load *l);
/* The opened step; CKPT_LATEST if l is NULL. */
CKPT_API uint64_t ckpt_load_step(const ckpt_load *l);

/*
 * Read the box [offset, offset+extent) of tensor name into dst (contiguous,
 * row-major, host memory unless mem says device), whatever sharding it was saved
 * with. offset NULL: zeros; extent NULL: the global shape. A batch of one of
 * ckpt_load_tensors.
 * Errors: CKPT_ENOTFOUND, CKPT_EDTYPE, CKPT_ESHAPE (ndim or box outside the shape),
 * CKPT_ERANKBOUND, CKPT_ECORRUPT (a chunk fails its hash or a shard file its
 * structure check: the message names tensor, chunk, file, offset), CKPT_EFORMAT /
 * CKPT_EVERSION (a shard file), -ENOENT (a shard file is missing), -EIO, and CUDA
 * errors converted for device destinations.
 */
CKPT_API int ckpt_load_tensor(ckpt_load *l, const char *name, int dtype, unsigned ndim,
                              const uint64_t *offset, const uint64_t *extent,
                              void *dst, int mem);

/* Read a blob (replicated, or this rank's rank-bound one). *len gets its size.
 * Errors: -ENOSPC (cap too small; *len still set), CKPT_ENOTFOUND, CKPT_EDTYPE (name
 * is a tensor), CKPT_ERANKBOUND, -EINVAL (dst NULL with cap > 0), and the read
 * errors of ckpt_load_tensor. */
CKPT_API int ckpt_load_blob(ckpt_load *l, const char *name, void *dst, size_t cap,
                            size_t *len);

/* ------------------------------------------------------------------ steps */

enum ckpt_step_state { CKPT_STATE_COMMITTED = 1, CKPT_STATE_ABORTED, CKPT_STATE_INFLIGHT };
enum ckpt_trust { CKPT_TRUST_COMMITTED = 1, CKPT_TRUST_VERIFIED };

/* One step of a root. Filled by ckpt_steps and ckpt_step_info (elem_size rule above). */
struct ckpt_step_info {
	uint64_t step;
	int      state;            /* enum ckpt_step_state; an in-flight record whose
	                              coordinator is gone reads CKPT_STATE_ABORTED (presumed
	                              abort); a directory without a record reads
	                              CKPT_STATE_INFLIGHT */
	int      trust;            /* enum ckpt_trust; 0 without a record */
	uint32_t world;            /* 0 without a record, as the sizes and time below */
	uint32_t ntensors;         /* distinct tensors and blobs */
	uint64_t logical_bytes;
	uint64_t stored_bytes;
	uint64_t commit_time_ns;   /* CLOCK_REALTIME */
	int      has_record;       /* 1: the manifest holds a record of this step */
	int      has_dir;          /* 1: the step directory exists in the root */
	uint32_t nfiles;           /* regular files in the step directory */
	uint64_t dir_bytes;        /* their sizes summed (what removing them frees) */
	/* append only */
};

enum ckpt_steps_flags {
	CKPT_STEPS_ALL = 1u << 0,  /* also aborted and in-flight records, and step directories
	                              without one (an in-flight save, or a crashed one's orphan) */
};

/*
 * The steps of the root in ascending order: the committed ones, and with
 * CKPT_STEPS_ALL every record and every step directory. Fills up to cap elements of
 * elem_size bytes (out may be NULL when cap is 0) and returns how many exist.
 * Errors: -EINVAL (unknown flags, elem_size too small), CKPT_ENOTROOT (no manifest),
 * -EACCES and other -errno of reading the root, CKPT_ECORRUPT / CKPT_EFORMAT (a
 * damaged record: the message names it), -EOVERFLOW (more than INT_MAX steps).
 */
CKPT_API int ckpt_steps(ckpt_ctx *c, unsigned flags, struct ckpt_step_info *out, size_t cap,
                        size_t elem_size);
/* One step, whatever its state (CKPT_LATEST: the latest committed one): its record,
 * its directory, or both. Errors: CKPT_ENOTFOUND (neither exists; or no committed
 * step for CKPT_LATEST), -EINVAL (elem_size too small), and those of ckpt_steps. */
CKPT_API int ckpt_step_info(ckpt_ctx *c, uint64_t step, struct ckpt_step_info *out,
                            size_t elem_size);

/* The metadata of a step (CKPT_LATEST: the latest committed one), as
 * ckpt_save_set_meta gave it, from the manifest alone (read-only contexts too):
 * *len gets its length in bytes and, when it fits in cap, the text is copied to dst,
 * followed by a NUL when cap > *len. A step saved without metadata gives 0 with
 * *len = 0 (and dst[0] = NUL when cap > 0). Ask with cap 0 for the length.
 * Errors: -ENOSPC (cap below *len: nothing copied, *len set), CKPT_ENOTFOUND (no
 * record of the step; or no committed step for CKPT_LATEST), -EINVAL (dst NULL with
 * cap > 0), CKPT_ENOTROOT (no manifest), CKPT_ECORRUPT / CKPT_EFORMAT / CKPT_EVERSION
 * (the record). Any thread. */
CKPT_API int ckpt_step_meta(ckpt_ctx *c, uint64_t step, char *dst, size_t cap, size_t *len);

/* ------------------------------------------------------------------ contents of a step */

/* One tensor or blob of an opened step (elem_size rule above). */
struct ckpt_tensor_info {
	const char     *name;          /* valid until ckpt_load_close */
	int             kind, dtype, policy;
	unsigned        ndim;
	uint64_t        global_shape[CKPT_MAX_NDIM];
	uint32_t        nshards;       /* pieces over all ranks */
	uint32_t        nchunks;
	uint64_t        logical_bytes; /* summed over pieces */
	uint64_t        stored_bytes;
	/* append only */
};
/* Number of distinct tensors and blobs in the opened step. */
CKPT_API int ckpt_load_count(const ckpt_load *l);
/* Entry i in [0, count), sorted by name, into *out of elem_size bytes.
 * Errors: CKPT_ENOTFOUND (i out of range), -EINVAL (elem_size too small). */
CKPT_API int ckpt_load_info(const ckpt_load *l, unsigned i, struct ckpt_tensor_info *out,
                            size_t elem_size);
/* 1 if entry i (as ckpt_load_info) is a blob (ckpt_save_add_blob), 0 if a tensor.
 * Errors: CKPT_ENOTFOUND (i out of range). */
CKPT_API int ckpt_load_is_blob(const ckpt_load *l, unsigned i);

/* Validate a name: non-empty, <= CKPT_MAX_NAME bytes, well-formed UTF-8 (RFC 3629:
 * no overlong forms, no surrogates U+D800..U+DFFF, nothing above U+10FFFF, no
 * truncated sequence), no NUL or other control byte (< 0x20), no empty, "." or ".."
 * component, no leading '/'. 0 or CKPT_ENAME (name NULL included). The save
 * functions apply it to every name. A step saved before names had to be UTF-8 may
 * hold names that break only that rule: it still loads, and its items load by those
 * names. */
CKPT_API int ckpt_name_check(const char *name, size_t len);

/* ------------------------------------------------------------------ batch load, rank map
 * Threads: as ckpt_load_tensor. */

/*
 * One request of ckpt_load_tensors: the box [offset, offset+extent) of tensor name,
 * exactly as ckpt_load_tensor's arguments. A blob may be asked for as CKPT_U8 of
 * ndim 1. saved_rank chooses which saved copy a rank-bound item comes from:
 *   -1  the default rule: only when this job has the saved world size, this rank's own;
 *  >=0  the item saved by that rank, whatever this job's world size and rank (the
 *       caller's explicit decision that mapping old ranks to new ones is safe).
 * saved_rank is ignored for sharded and replicated items. flags must be 0.
 * The layout of this struct is fixed for this version of the ABI.
 */
struct ckpt_load_req {
	const char     *name;
	int             dtype;        /* enum ckpt_dtype */
	unsigned        ndim;
	const uint64_t *offset;       /* NULL: zeros */
	const uint64_t *extent;       /* NULL: the global shape */
	void           *dst;          /* contiguous row-major box */
	int             mem;          /* enum ckpt_mem */
	int             saved_rank;   /* -1 or a saved rank, see above */
	unsigned        flags;        /* 0 */
};

/*
 * Load n requests with ONE batch of chunk reads over all of them (many reads in
 * flight over every shard file), so the disk stays busy however small each request
 * is. ckpt_load_tensor is a batch of one.
 * results (n entries, may be NULL) gets 0 or each request's own error: a request that
 * fails its checks (CKPT_ENOTFOUND, CKPT_EDTYPE, CKPT_ESHAPE, CKPT_ERANKBOUND, -EINVAL)
 * is left out of the batch and the others still load; when the batch read fails
 * (CKPT_ECORRUPT, -EIO), every request whose bytes were not all delivered gets that
 * error, and its dst holds partial data.
 * Returns 0 when every request succeeded, else the error of the first failed request
 * in the order given (ckpt_last_error names it: step, tensor, chunk, file, offset).
 * The requests' dst boxes must not overlap each other.
 */
CKPT_API int ckpt_load_tensors(ckpt_load *l, const struct ckpt_load_req *reqs, size_t n,
                               int *results);

/* ckpt_load_blob for the blob saved by saved_rank (>= 0), whatever this job's world
 * size and rank: the explicit rank map for rank-bound state. For a replicated blob,
 * that rank's copy. Errors: as ckpt_load_blob; CKPT_ENOTFOUND when saved_rank holds
 * no such blob (or is not a rank of the saved world); -EINVAL (saved_rank < 0). */
CKPT_API int ckpt_load_blob_rank(ckpt_load *l, const char *name, int saved_rank, void *dst,
                                 size_t cap, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_CKPT_H */
