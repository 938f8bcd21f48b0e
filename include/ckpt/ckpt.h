/*
 * ckpt.h — the public API of libckpt, a distributed checkpoint storage engine.
 *
 * This header is the whole promise to users: nothing outside it is stable.
 *
 * Conventions
 *   - Functions return 0 (or a count) on success and a negative code on failure:
 *     either a negated errno (-ENOENT, -ENOSPC, ...) or a CKPT_E* code from the
 *     reserved band below. ckpt_strerror() names every code.
 *   - A human-readable message naming the object at fault (step, rank, tensor,
 *     file, offset) is kept per thread: ckpt_last_error() after any failing call.
 *   - Handles are opaque. Every create/open has a matching free/close; freeing
 *     NULL is a no-op; on a failed create the out-pointer is set to NULL and
 *     nothing needs to be freed.
 *   - Option structs carry their size first and are initialised by their
 *     *_opts_init(&o, sizeof o) function; fields are only ever appended.
 *
 * Threads
 *   - ckpt_ctx: thread-safe; one per process is the intended use.
 *   - ckpt_save: one thread at a time (any thread), from begin to free.
 *   - ckpt_load: reads (ckpt_load_tensor/_blob/_info) may run from many threads
 *     at once; ckpt_load_close only when no read is running.
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

#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 1
#define CKPT_VERSION_PATCH 0

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
CKPT_API const char *ckpt_kind_name(int kind);

enum ckpt_policy {
	CKPT_SHARDED = 1,    /* each rank holds a box; the boxes tile the global shape exactly */
	CKPT_REPLICATED,     /* every rank holds the same whole value (checked by hash) */
	CKPT_RANK_BOUND,     /* each rank its own value; loads only for the same rank and world */
	CKPT_POLICY_MAX_ = CKPT_RANK_BOUND
};
CKPT_API const char *ckpt_policy_name(int policy);

enum ckpt_mem { CKPT_MEM_AUTO = 0, CKPT_MEM_HOST, CKPT_MEM_DEVICE };

#define CKPT_MAX_NDIM   16
#define CKPT_MAX_NAME   4096     /* bytes, without the terminating NUL */
#define CKPT_LATEST     UINT64_MAX

/* ------------------------------------------------------------------ context */

typedef struct ckpt_ctx  ckpt_ctx;
typedef struct ckpt_save ckpt_save;
typedef struct ckpt_load ckpt_load;

enum ckpt_transport { CKPT_TRANSPORT_AUTO = 0, CKPT_TRANSPORT_TCP, CKPT_TRANSPORT_RDMA };

enum ckpt_open_flags {
	CKPT_OPEN_READONLY = 1u << 0, /* tools: no saves, manifest opened read-only, no coordinator */
	CKPT_OPEN_NO_GC    = 1u << 1, /* the coordinator skips garbage collection at open */
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
	const void *secret;        /* NULL: CKPT_JOB_SECRET (may be unset: no secret) */
	size_t      secret_len;
	size_t      pool_bytes;    /* bound on staging memory; 0: CKPT_POOL_BYTES, then 256 MiB */
	size_t      chunk_bytes;   /* chunk size, multiple of 4096; 0: CKPT_CHUNK_BYTES, then 16 MiB */
	int         zstd_level;    /* 0: store raw (default); -1: CKPT_COMPRESS; 1..22 */
	unsigned    max_inflight;  /* saves in flight at once; 0: 2 */
	unsigned    timeout_ms;    /* commit timeout; 0: CKPT_TIMEOUT_MS, then 120000 */
	unsigned    queue_depth;   /* io_uring writes in flight; 0: 8 */
	/* append only */
};

/* Fill *o with defaults. size must be sizeof *o as the caller knows it. */
CKPT_API void ckpt_opts_init(struct ckpt_opts *o, size_t size);

/*
 * Open a checkpoint root. Creates the root and its manifest when the directory is
 * missing or empty (unless CKPT_OPEN_READONLY). The coordinator role (rank 0 in the
 * embedded default) runs garbage collection of uncommitted steps at open.
 * Errors: -ENOENT (readonly and missing), -EACCES, CKPT_ENOTROOT (a non-empty
 * directory without a manifest), CKPT_EVERSION, CKPT_EFORMAT, -EINVAL (bad options).
 * On failure *out is NULL; the message names the root.
 */
CKPT_API int  ckpt_open(const struct ckpt_opts *o, ckpt_ctx **out);
/* Waits for every save in flight to finish, then frees. NULL: no-op. */
CKPT_API void ckpt_close(ckpt_ctx *c);
/* This thread's last error message from any libckpt call ("" if none). The pointer is
 * valid until this thread's next libckpt call. c may be NULL. */
CKPT_API const char *ckpt_last_error(const ckpt_ctx *c);

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
 * Begin a save of step on this rank. Errors: -EEXIST (step already committed),
 * -EBUSY (max_inflight saves already in flight... after waiting for none), CKPT_ESTATE
 * (readonly context).
 */
CKPT_API int ckpt_save_begin(ckpt_ctx *c, uint64_t step, ckpt_save **out);
/* Add this rank's box of a tensor. The data must stay unchanged until the snapshot
 * point (ckpt_save_wait_snapshot). Errors: CKPT_ENAME, CKPT_ESHAPE, -EINVAL (kind,
 * dtype, policy), -EEXIST (name already added to this save), CKPT_ESTATE (submitted). */
CKPT_API int ckpt_save_add_tensor(ckpt_save *s, const struct ckpt_tensor *t);
/* Add opaque bytes (RNG state, scheduler, dataloader position). policy is
 * CKPT_REPLICATED or CKPT_RANK_BOUND. Same errors as ckpt_save_add_tensor. */
CKPT_API int ckpt_save_add_blob(ckpt_save *s, const char *name, int kind, int policy,
                                const void *data, size_t len);
/* Queue the save. Returns at once. 0: ckpt_save_wait reports the outcome exactly
 * once; negative: nothing was queued and the handle may only be freed. */
CKPT_API int ckpt_save_submit(ckpt_save *s);
/* Block until every byte of the caller's data has been copied out (the snapshot
 * point): the caller may modify its tensors after 0. timeout_ms < 0: forever.
 * Errors: -ETIMEDOUT, or the save's own failure. */
CKPT_API int ckpt_save_wait_snapshot(ckpt_save *s, int timeout_ms);
/* Block until the step is durable and committed (0) or failed: CKPT_EABORTED,
 * CKPT_EINDOUBT, -ENOSPC, -EIO, ... with the cause in ckpt_last_error(). */
CKPT_API int ckpt_save_wait(ckpt_save *s, int timeout_ms);
/* Frees the handle. A submitted save still in flight is waited for first. */
CKPT_API void ckpt_save_free(ckpt_save *s);

struct ckpt_save_stats {
	size_t   size;             /* first; caller sets sizeof */
	uint64_t logical_bytes;    /* bytes added by this rank */
	uint64_t stored_bytes;     /* bytes written for them (after compression) */
	double   snapshot_seconds; /* submit -> snapshot point */
	double   durable_seconds;  /* submit -> shard durable on this rank */
	double   commit_seconds;   /* submit -> committed */
};
CKPT_API int ckpt_save_stats(const ckpt_save *s, struct ckpt_save_stats *st);

/* ------------------------------------------------------------------ load */

/* Open a committed step (or CKPT_LATEST). Errors: CKPT_ENOTFOUND (no such committed
 * step, or none at all), CKPT_ECORRUPT/CKPT_EFORMAT (manifest records). */
CKPT_API int  ckpt_load_open(ckpt_ctx *c, uint64_t step, ckpt_load **out);
CKPT_API void ckpt_load_close(ckpt_load *l);
CKPT_API uint64_t ckpt_load_step(const ckpt_load *l);

/*
 * Read the box [offset, offset+extent) of tensor name into dst (contiguous,
 * row-major, host memory unless mem says device), whatever sharding it was saved
 * with. offset NULL: zeros; extent NULL: the global shape.
 * Errors: CKPT_ENOTFOUND, CKPT_EDTYPE, CKPT_ESHAPE (ndim or box outside the shape),
 * CKPT_ECORRUPT (a chunk fails its hash: the message names tensor, chunk, file, offset),
 * CKPT_ERANKBOUND, -EIO.
 */
CKPT_API int ckpt_load_tensor(ckpt_load *l, const char *name, int dtype, unsigned ndim,
                              const uint64_t *offset, const uint64_t *extent,
                              void *dst, int mem);

/* Read a blob (replicated, or this rank's rank-bound one). *len gets its size.
 * Errors: -ENOSPC (cap too small; *len still set), CKPT_ENOTFOUND, CKPT_ERANKBOUND. */
CKPT_API int ckpt_load_blob(ckpt_load *l, const char *name, void *dst, size_t cap,
                            size_t *len);

/* ------------------------------------------------------------------ catalog */

enum ckpt_step_state { CKPT_STATE_COMMITTED = 1, CKPT_STATE_ABORTED, CKPT_STATE_INFLIGHT };
enum ckpt_trust { CKPT_TRUST_COMMITTED = 1, CKPT_TRUST_VERIFIED };

struct ckpt_step_info {
	uint64_t step;
	int      state;            /* enum ckpt_step_state */
	int      trust;            /* enum ckpt_trust */
	uint32_t world;
	uint32_t ntensors;         /* distinct tensors and blobs */
	uint64_t logical_bytes;
	uint64_t stored_bytes;
	uint64_t commit_time_ns;   /* CLOCK_REALTIME */
};

/* Committed steps in ascending order: fills up to cap, returns how many exist. */
CKPT_API int ckpt_steps(ckpt_ctx *c, uint64_t *steps, size_t cap);
CKPT_API int ckpt_step_info(ckpt_ctx *c, uint64_t step, struct ckpt_step_info *out);

struct ckpt_tensor_info {
	const char     *name;          /* valid until ckpt_load_close */
	int             kind, dtype, policy;
	unsigned        ndim;
	uint64_t        global_shape[CKPT_MAX_NDIM];
	uint32_t        nshards;       /* pieces over all ranks */
	uint32_t        nchunks;
	uint64_t        logical_bytes; /* summed over pieces */
	uint64_t        stored_bytes;
};
/* Number of distinct tensors and blobs in the opened step. */
CKPT_API int ckpt_load_count(const ckpt_load *l);
/* i in [0, count): sorted by name. */
CKPT_API int ckpt_load_info(const ckpt_load *l, unsigned i, struct ckpt_tensor_info *out);

/* Validate a name: non-empty, <= CKPT_MAX_NAME bytes, no NUL, no empty, "." or ".."
 * component, no leading '/'. 0 or CKPT_ENAME. */
CKPT_API int ckpt_name_check(const char *name, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_CKPT_H */
