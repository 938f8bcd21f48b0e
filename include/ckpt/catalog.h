/*
 * ckpt/catalog.h — libckpt's catalog for tools and operators: where each chunk of a
 * step lies (files, offsets, chunk indexes, codecs), verification of a step,
 * garbage collection with retention, and the rebuild of a lost manifest.
 *
 * ckpt.h is what a training job needs; this header is the rest of the public API, kept
 * apart because it exposes the storage layout (docs/format.md), as zstd keeps its
 * advanced API apart. It is as stable as ckpt.h, and follows its conventions (return
 * values, the two errors not repeated, option, result and element sizes).
 *
 * Contexts: tools open the root with rank 0, world 1 and CKPT_OPEN_NO_GC: marking a
 * verified step, garbage collection and rebuild write the manifest and need that
 * (non-READONLY) context; chunk listing and verifying also work on a
 * CKPT_OPEN_READONLY one.
 * Threads: any thread; ckpt_load_chunks as ckpt_load_info; one gc or rebuild at a time
 * per context.
 */
#ifndef CKPT_CATALOG_H
#define CKPT_CATALOG_H

#include "ckpt/ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ chunk placement */

/* How a chunk is stored (docs/format.md §5): raw; one zstd frame; bytegroup, the bytes
 * of floating-point elements split into planes, each zstd-compressed where that pays.
 * CKPT_CODEC_ZSTD and CKPT_CODEC_BYTEGROUP also name what a save compresses with
 * (ckpt_opts.compress_codec). */
enum ckpt_codec { CKPT_CODEC_RAW = 0, CKPT_CODEC_ZSTD = 1, CKPT_CODEC_BYTEGROUP = 2 };
/* "raw", "zstd", "bytegroup", or "?". */
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
	uint8_t     hash[16];         /* XXH3-128 (canonical, big-endian), as hash_blocks says */
	uint64_t    box_offset[CKPT_MAX_NDIM];   /* the saved box (piece) holding the chunk */
	uint64_t    box_extent[CKPT_MAX_NDIM];
	/* What hash is taken over (docs/format.md §5). 0: the raw bytes. Else the hashes of
	 * the raw bytes' blocks of hash_blocks bytes, one after another: a chunk longer than
	 * one block in a file of format 5. Two chunks' hashes compare only when their
	 * hash_blocks are equal. */
	uint32_t    hash_blocks;
	/* append only */
};
/* Chunks of entry i (as ckpt_load_info) in (rank, raw_offset) order: fills up to cap
 * elements of elem_size bytes (the rule of ckpt.h; out may be NULL when cap is 0) and
 * returns how many exist. Errors: CKPT_ENOTFOUND (i out of range), -EINVAL (elem_size
 * too small), -EOVERFLOW (more than INT_MAX chunks). */
CKPT_API int ckpt_load_chunks(const ckpt_load *l, unsigned i, struct ckpt_chunk_info *out,
                              size_t cap, size_t elem_size);

/* ------------------------------------------------------------------ verify */

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
/* Fill *o with defaults. size must be sizeof *o as the caller knows it. */
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
 * each of its blocks against the shard's block table (docs/format.md, "Block table"). On
 * success, and unless CKPT_VERIFY_NO_MARK or the context is read-only, the step's
 * trust becomes CKPT_TRUST_VERIFIED (*res->marked = 1). o may be NULL (defaults); res
 * may be NULL.
 * Errors: -EINVAL (o->size or res->size not a size of these structs), CKPT_ENOTFOUND
 * (no such committed step), CKPT_ECORRUPT (a footer differs from its record, or a
 * chunk or block fails its hash: the message and res name step, tensor, chunk, file
 * and offset), CKPT_EFORMAT / CKPT_EVERSION (a shard file), -ENOENT (a shard file is
 * missing), -EIO, -ECANCELED (progress returned non-zero), and the manifest's errors
 * when the trust level is recorded.
 */
CKPT_API int ckpt_catalog_verify(ckpt_ctx *c, uint64_t step, const struct ckpt_verify_opts *o,
                                 struct ckpt_verify_result *res);

/* ------------------------------------------------------------------ garbage collection */

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
/* "orphan", "aborted", "retention", or "?". */
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
	uint64_t keep_seconds;        /* keep committed steps committed within the last S
	                                 seconds (their record's commit time); 0: no rule */
	/* append only */
};
/* Fill *o with defaults. size must be sizeof *o as the caller knows it. */
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
 * abort), and committed steps kept by no rule (when keep_last, keep_every or
 * keep_seconds is set, a committed step stays if any rule keeps it). Never removed: the latest
 * committed step; a save in flight (an in-flight record of the coordinator that
 * holds the root now — the calling context itself when a job runs gc); a step whose
 * record is damaged; and a step directory the manifest has no record of — the sign
 * of a lost or damaged manifest, whose files `rebuild` may recover — unless
 * CKPT_GC_UNRECORDED asks for it (result: steps_unrecorded counts those left). A
 * committed step is made invisible first (its record turned aborted, still naming
 * its files), then its files go, then its record: a crash in between leaves an
 * aborted record that the next gc finishes, never a visible step without data.
 * Needs a context that owns the manifest (rank 0, not READONLY).
 * Errors: -EINVAL (unknown flags, o->size or res->size not a size of these
 * structs), CKPT_ESTATE (not the context that owns the manifest), -EROFS / -EACCES
 * (the root cannot be written: nothing removed), CKPT_ECORRUPT / CKPT_EFORMAT (a
 * damaged record: named; nothing removed), -errno of listing the root or of a
 * removal (the message names the file), and the manifest's errors (-EIO, -ENOSPC).
 */
CKPT_API int ckpt_catalog_gc(ckpt_ctx *c, const struct ckpt_gc_opts *o,
                             struct ckpt_gc_result *res);

/* ------------------------------------------------------------------ rebuild */

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
 * Errors: -EINVAL (unknown flags, res->size smaller than its size field),
 * CKPT_ESTATE (not the context that owns the manifest), -EEXIST (records without
 * CKPT_REBUILD_MERGE), -errno of listing the root, and the manifest's errors (-EIO,
 * -ENOSPC, CKPT_ECORRUPT). A step it cannot prove is an outcome, not an error.
 */
CKPT_API int ckpt_catalog_rebuild(ckpt_ctx *c, unsigned flags, ckpt_rebuild_report_fn report,
                                  void *arg, struct ckpt_rebuild_result *res);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_CATALOG_H */
