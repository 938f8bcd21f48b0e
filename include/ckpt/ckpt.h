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

/* ------------------------------------------------------------------ version
 * The version of the headers compiled against; ckpt_version() is the version of
 * the library running, which may be a later release of the same major version
 * (CONTRIBUTING.md, "ABI and versions"). The build refuses these numbers unless
 * they are the project's version. */

#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 1
#define CKPT_VERSION_PATCH 0
/* One number that compares in order: MAJOR * 10000 + MINOR * 100 + PATCH. */
#define CKPT_VERSION_NUMBER \
	(CKPT_VERSION_MAJOR * 10000 + CKPT_VERSION_MINOR * 100 + CKPT_VERSION_PATCH)

/* The library's version, "MAJOR.MINOR.PATCH" ("0.1.0"). A static string: never
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
	                           * holds checkpoint data: run ckpt-inspect rebuild */
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

/* GPUDirect Storage (cuFile) uses, a bit set (ckpt_gds_stats below says more). */
enum ckpt_gds {
	CKPT_GDS_LOAD = 1u << 0,      /* loads of raw chunks into device memory */
	CKPT_GDS_SAVE = 1u << 1,      /* saves write device tensors with cuFile: synchronous */
	CKPT_GDS_OFF  = 1u << 7,      /* neither, whatever CKPT_GDS says */
};

enum ckpt_open_flags {
	CKPT_OPEN_READONLY = 1u << 0, /* tools: no saves, manifest opened read-only, no coordinator */
	CKPT_OPEN_NO_GC    = 1u << 1, /* the coordinator skips garbage collection at open */
	CKPT_OPEN_RECOVER  = 1u << 2, /* for ckpt_catalog_rebuild: open a root whose manifest is
	                               * missing or damaged (see ckpt_open); implies NO_GC */
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
	int         zstd_level;    /* 0: store raw (default); -1: CKPT_COMPRESS; 1..22 */
	unsigned    max_inflight;  /* saves in flight at once; 0: 2 */
	unsigned    timeout_ms;    /* commit timeout; 0: CKPT_TIMEOUT_MS, then 120000 */
	unsigned    queue_depth;   /* io_uring writes in flight; 0: 8 */
	unsigned    gds;           /* enum ckpt_gds bits; 0: CKPT_GDS ("load", "save", "load,save",
	                            * "0"), then off. Falls back to the pinned path when cuFile is
	                            * unavailable (ckpt/cuda.h) */
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
/* Errors: -EINVAL (NULL, or size too small). Any thread. */
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
 * aside to manifest.damaged-<time> first). A job of several ranks needs a job secret
 * (CKPT_EAUTH otherwise) unless CKPT_OPEN_NO_AUTH or CKPT_AUTH=off says to run
 * without one. Errors: -ENOENT (readonly and missing), -EACCES, -EBUSY,
 * CKPT_ENOTROOT (a non-empty directory that is not a checkpoint root),
 * CKPT_ENOMANIFEST, CKPT_EAUTH, CKPT_EVERSION, CKPT_EFORMAT, -EINVAL (bad options).
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
 * Begin a save of step on this rank; with max_inflight saves in flight it first waits
 * for one to finish. Errors: -EEXIST (step already committed), -EBUSY (a save of the
 * same step, begun in this context, has not finished: one attempt at a time),
 * CKPT_ESTATE (read-only context), and the coordinator's or the manifest's errors.
 */
CKPT_API int ckpt_save_begin(ckpt_ctx *c, uint64_t step, ckpt_save **out);
/* Add this rank's box of a tensor. The data must stay unchanged until the snapshot
 * point (ckpt_save_wait_snapshot). Errors: CKPT_ENAME (t->name breaks a rule of
 * ckpt_name_check; the message quotes it, bytes that are not UTF-8 as \xNN),
 * CKPT_ESHAPE, -EINVAL (kind, dtype, policy), -EEXIST (name already added to this
 * save), CKPT_ESTATE (submitted). */
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
 * -EINVAL (fn NULL, or device memory). */
CKPT_API int ckpt_save_add_tensor_source(ckpt_save *s, const struct ckpt_tensor *t,
                                         ckpt_source_fn fn, void *arg);
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

/* Validate a name: non-empty, <= CKPT_MAX_NAME bytes, well-formed UTF-8 (RFC 3629:
 * no overlong forms, no surrogates U+D800..U+DFFF, nothing above U+10FFFF, no
 * truncated sequence), no NUL or other control byte (< 0x20), no empty, "." or ".."
 * component, no leading '/'. 0 or CKPT_ENAME. The save functions apply it to every
 * name. A step saved before names had to be UTF-8 may hold names that break only
 * that rule: it still loads, and its items load by those names. */
CKPT_API int ckpt_name_check(const char *name, size_t len);

/* ------------------------------------------------------------------ batch load, rank map
 * (issue 4). Threads: as ckpt_load_tensor. */

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
 * no such blob (or is not a rank of the saved world). */
CKPT_API int ckpt_load_blob_rank(ckpt_load *l, const char *name, int saved_rank, void *dst,
                                 size_t cap, size_t *len);

/* 1 if entry i (as ckpt_load_info) is a blob (ckpt_save_add_blob), 0 if a tensor;
 * CKPT_ENOTFOUND for i out of range, -EINVAL. */
CKPT_API int ckpt_load_is_blob(const ckpt_load *l, unsigned i);

/* ------------------------------------------------------------------ catalog for tools
 * (issue 4; ckpt-inspect, ckpt-reshard). Tools open the root with rank 0, world 1 and
 * CKPT_OPEN_NO_GC: marking a verified step, garbage collection and rebuild write the
 * manifest and need that (non-READONLY) context; listing and verifying also work on a
 * CKPT_OPEN_READONLY one. Threads: any thread; one catalog call at a time per context
 * for gc and rebuild. */

enum ckpt_catalog_flags {
	CKPT_CATALOG_ALL = 1u << 0,   /* also aborted records and step directories without one */
};

struct ckpt_catalog_step {
	struct ckpt_step_info info;   /* a directory without a record: state CKPT_STATE_INFLIGHT,
	                                 trust 0, world and sizes 0 */
	int      has_record;          /* 1: the manifest holds a record of this step */
	int      has_dir;             /* 1: the step directory exists in the root */
	uint32_t nfiles;              /* regular files in the step directory */
	uint64_t dir_bytes;           /* their sizes summed (what removing them frees) */
};

/*
 * Steps of the root in ascending order: committed ones, and with CKPT_CATALOG_ALL every
 * record (aborted, in flight) and every step directory on disk with no record (an
 * in-flight save, or the orphan of a crashed one). Fills up to cap, returns how many
 * exist. Errors: CKPT_ENOTROOT, -EACCES, CKPT_EFORMAT (a damaged record: names it).
 */
CKPT_API int ckpt_catalog_steps(ckpt_ctx *c, unsigned flags, struct ckpt_catalog_step *out,
                                size_t cap);

enum ckpt_codec { CKPT_CODEC_RAW = 0, CKPT_CODEC_ZSTD = 1 };
/* "raw", "zstd", or "?". */
CKPT_API const char *ckpt_codec_name(int codec);

/* Placement of one stored chunk. */
struct ckpt_chunk_info {
	uint32_t    rank;             /* the saving rank, whose shard file holds it */
	uint32_t    chunk;            /* index in that shard file's chunk table */
	const char *file;             /* shard file relative to the root; valid until close */
	uint64_t    file_offset;      /* where its stored bytes start */
	uint64_t    stored_len;       /* bytes on disk (compressed or raw) */
	uint64_t    raw_offset;       /* byte offset inside the saved box (row-major) */
	uint64_t    raw_len;          /* bytes after decompression */
	int         codec;            /* enum ckpt_codec */
	uint8_t     hash[16];         /* XXH3-128 of the raw bytes (canonical, big-endian) */
	uint64_t    box_offset[CKPT_MAX_NDIM];   /* the saved box (piece) holding the chunk */
	uint64_t    box_extent[CKPT_MAX_NDIM];
};
/* Chunks of entry i (as ckpt_load_info) in (rank, raw_offset) order: fills up to cap,
 * returns how many exist. Errors: CKPT_ENOTFOUND (i out of range), -EINVAL. */
CKPT_API int ckpt_load_chunks(const ckpt_load *l, unsigned i, struct ckpt_chunk_info *out,
                              size_t cap);

/* Progress of a long catalog operation: called from the calling thread, after each
 * chunk. A non-zero return cancels the operation, which then returns -ECANCELED. */
typedef int (*ckpt_progress_fn)(void *arg, uint64_t done_bytes, uint64_t total_bytes);

enum ckpt_verify_flags {
	CKPT_VERIFY_NO_MARK = 1u << 0,  /* do not record the verified trust level */
};
struct ckpt_verify_opts {
	size_t           size;        /* first; set by ckpt_verify_opts_init(&o, sizeof o) */
	unsigned         flags;       /* enum ckpt_verify_flags */
	ckpt_progress_fn progress;    /* NULL: none */
	void            *arg;
	/* append only */
};
CKPT_API void ckpt_verify_opts_init(struct ckpt_verify_opts *o, size_t size);

struct ckpt_verify_result {
	size_t   size;                /* first; the caller sets sizeof */
	uint64_t step;
	uint64_t chunks, raw_bytes, stored_bytes;
	double   seconds;
	int      marked;              /* 1: trust is now CKPT_TRUST_VERIFIED in the manifest */
	/* When the verify failed on a chunk (CKPT_ECORRUPT, -EIO): that chunk. */
	int      bad;                 /* 1: the fields below name the bad chunk */
	uint32_t bad_rank, bad_chunk;
	uint64_t bad_offset;          /* file offset of the chunk */
	char     bad_tensor[CKPT_MAX_NAME + 1];
	char     bad_file[4096];      /* relative to the root */
	/* append only */
};

/*
 * Verify a committed step (or CKPT_LATEST): each shard file's footer must be the one
 * committed (same hash as its manifest record), and every chunk of every rank is read
 * (one batch, many reads in flight), decompressed and checked against its hash, and
 * each of its blocks against the shard's block table (docs/format.md §3a). On
 * success, and unless CKPT_VERIFY_NO_MARK or the context is read-only, the step's
 * trust becomes CKPT_TRUST_VERIFIED (*res->marked = 1). o may be NULL (defaults); res
 * may be NULL. Errors: CKPT_ENOTFOUND, CKPT_ECORRUPT (the message and res name step,
 * tensor, chunk, file and offset), -EIO, -ECANCELED.
 */
CKPT_API int ckpt_catalog_verify(ckpt_ctx *c, uint64_t step, const struct ckpt_verify_opts *o,
                                 struct ckpt_verify_result *res);

enum ckpt_gc_flags {
	CKPT_GC_DRY_RUN    = 1u << 0, /* report what would go; remove nothing */
	CKPT_GC_UNRECORDED = 1u << 1, /* also remove step directories the manifest has no
	                                 record of (see ckpt_catalog_gc) */
};
enum ckpt_gc_reason {
	CKPT_GC_ORPHAN = 1,           /* a step directory with no record (CKPT_GC_UNRECORDED) */
	CKPT_GC_ABORTED,              /* an aborted attempt (or one whose coordinator is gone),
	                                 and its files */
	CKPT_GC_RETENTION,            /* a committed step outside the retention rule */
};
CKPT_API const char *ckpt_gc_reason_name(int reason);

/* One step that gc removes (or, in a dry run, would remove). */
struct ckpt_gc_item {
	uint64_t step;
	int      reason;              /* enum ckpt_gc_reason */
	uint64_t bytes;               /* bytes of its files */
	uint32_t nfiles;
};
typedef void (*ckpt_gc_report_fn)(void *arg, const struct ckpt_gc_item *item);

struct ckpt_gc_opts {
	size_t   size;                /* first; set by ckpt_gc_opts_init(&o, sizeof o) */
	unsigned flags;               /* enum ckpt_gc_flags */
	uint64_t keep_last;           /* keep the newest N committed steps; 0: no such rule */
	uint64_t keep_every;          /* keep committed steps that are multiples of K; 0: no rule */
	uint64_t min_age_s;           /* spare directories without a record modified more
	                                 recently than this (a save may be writing them); 0 */
	ckpt_gc_report_fn report;     /* called for each step, before it is removed (one
	                                 that the job saves again meanwhile is spared, and
	                                 not counted); NULL */
	void    *arg;
	/* append only */
};
CKPT_API void ckpt_gc_opts_init(struct ckpt_gc_opts *o, size_t size);

struct ckpt_gc_result {
	size_t   size;                /* first; the caller sets sizeof */
	uint64_t steps_removed;       /* (dry run: that would be removed) */
	uint64_t bytes_freed;
	uint64_t steps_kept;          /* committed steps left */
	uint64_t steps_unrecorded;    /* step directories without a record, left alone */
	/* append only */
};

/*
 * Garbage collection with retention. Removes what the manifest names as removable:
 * the files of aborted attempts (and of attempts whose coordinator is gone: presumed
 * abort), and committed steps kept by neither rule (when keep_last or keep_every is
 * set, a committed step stays if either rule keeps it). Never removed: the latest
 * committed step; a save in flight (an in-flight record of the coordinator that
 * holds the root now — the calling context itself when a job runs gc); a step whose
 * record is damaged; and a step directory the manifest has no record of — the sign
 * of a lost or damaged manifest, whose files `rebuild` may recover — unless
 * CKPT_GC_UNRECORDED asks for it (result: steps_unrecorded counts those left). A
 * committed step is made invisible first (its record turned aborted, still naming
 * its files), then its files go, then its record: a crash in between leaves an
 * aborted record that the next gc finishes, never a visible step without data.
 * Needs a context that owns the manifest (rank 0, not READONLY).
 * Errors: CKPT_ESTATE (read-only context), -EROFS / -EACCES (the root cannot be
 * written: nothing removed), CKPT_ECORRUPT (a damaged record: named; nothing
 * removed), -errno of a removal (message names the file).
 */
CKPT_API int ckpt_catalog_gc(ckpt_ctx *c, const struct ckpt_gc_opts *o,
                             struct ckpt_gc_result *res);

enum ckpt_rebuild_flags {
	CKPT_REBUILD_MERGE = 1u << 0, /* the manifest already holds records: add to it */
};
enum ckpt_rebuild_outcome {
	CKPT_REBUILD_COMMITTED = 1,   /* every rank's shard decodes and the set validates */
	CKPT_REBUILD_PRESENT,         /* the manifest already had a record; left as it was */
	CKPT_REBUILD_UNPROVEN,        /* recorded as aborted: why says what is missing */
	CKPT_REBUILD_DAMAGED,         /* (merge) a damaged record, removed; its step, if it
	                                 has a directory, is then rebuilt like any other */
};
typedef void (*ckpt_rebuild_report_fn)(void *arg, uint64_t step, int outcome, uint32_t world,
                                       const char *why);
struct ckpt_rebuild_result {
	size_t   size;                /* first; the caller sets sizeof */
	uint64_t steps_seen, steps_committed, steps_present, steps_unproven;
	uint64_t steps_damaged;       /* damaged records removed (merge) */
	/* append only */
};

/*
 * Recreate a lost manifest from the self-describing shard files (docs/format.md): for
 * each step directory without a record, the shard files are grouped by the attempt
 * their names carry, and every file's trailer, footer hash and index are checked; the
 * step is recorded COMMITTED only when exactly one attempt proves complete — ranks
 * 0..world-1 all decode, agree on step, world and attempt, and the set passes the
 * commit validation (tiling, replicas identical by hash). Anything it cannot prove
 * (two complete attempts included) is recorded as aborted with the reason (so gc
 * removes its files) and reported. Without CKPT_REBUILD_MERGE the manifest must hold
 * no record (-EEXIST otherwise): open the root with CKPT_OPEN_RECOVER, which starts a
 * new manifest when it is missing or sets a damaged one aside. With
 * CKPT_REBUILD_MERGE, records already there stand, damaged records are removed
 * first (CKPT_REBUILD_DAMAGED), and directories without a record are rebuilt.
 * Needs a context that owns the manifest. report may be NULL; res may be NULL.
 */
CKPT_API int ckpt_catalog_rebuild(ckpt_ctx *c, unsigned flags, ckpt_rebuild_report_fn report,
                                  void *arg, struct ckpt_rebuild_result *res);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_CKPT_H */
