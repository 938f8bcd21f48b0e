/*
 * glue.h — private to the glue (lib/ctx.c, save.c, load.c, ...): the context, save and load handles, and the
 * resolved configuration. The glue wires io, manifest, commit and snapshot into
 * the public API; no module folder includes this header.
 */
#ifndef CKPT_GLUE_H
#define CKPT_GLUE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckpt_internal.h"
#include "commit/commit.h"
#include "io/io.h"
#include "manifest/manifest.h"
#include "net/net.h"
#include "remote/remote.h"

struct snapshot;   /* lib/snapshot/snapshot.h */

/* Options after defaults and the environment were applied (lib/config.c). */
struct glue_config {
	char    *root;
	unsigned flags;            /* enum ckpt_open_flags, CKPT_GROUP_ACCESS applied */
	unsigned file_mode, dir_mode;   /* of what this context creates: 0600/0700, or 0640/0750 */
	int      rank, world;
	char    *coord_addr;
	unsigned coord_port;
	int      transport;
	struct net_rdma_opts rdma;  /* CKPT_RDMA_DEVICE, CKPT_RDMA_GID (transport rdma) */
	bool     rdma_direct;       /* CKPT_RDMA_DIRECT: RDMA WRITE into ckptd's buffers */
	char    *job_id;
	uint8_t *secret;
	size_t   secret_len;
	size_t   pool_bytes, chunk_bytes;
	int      zstd_level;
	uint8_t  compress_codec;   /* enum io_codec: IO_CODEC_ZSTD or IO_CODEC_BYTEGROUP */
	unsigned compress_threads; /* of each shard writer (>= 1) */
	unsigned max_inflight, timeout_ms, queue_depth;
	unsigned gds;              /* enum ckpt_gds bits asked for (0: none) */
	bool     incremental;      /* saves reference unchanged chunks (ckpt_opts.incremental) */
	size_t   device_pool_bytes; /* the device staging pool (0: none) */
	/* This rank's node: ranks node_first .. node_first+node_size-1 (1: unknown). */
	int      node_id, node_first, node_size;
	bool     tree;                /* the hierarchical commit: relay through the node leader */
	/* Retention applied by the coordinator after each commit (0: no such rule). */
	uint64_t keep_last, keep_every, keep_seconds;
	char    *manifest_dir;        /* CKPT_MANIFEST_DIR; NULL: <root>/manifest */
	/* CKPT_TARGET's ckptd instances, in its order (0: the root is the target). */
	unsigned nckptd;
	struct glue_ckptd { char host[256]; unsigned port; } *ckptd;
};
#define GLUE_MAX_CKPTD 256u
int  config_resolve(const struct ckpt_opts *o, struct glue_config *cfg);
/* The log settings of o (callback, level) into *sink, the rest of it blank; before
 * config_resolve, so that its own lines reach the callback. -EINVAL: a bad level. */
int  config_log(const struct ckpt_opts *o, struct ckpt_log_sink *sink);
void config_free(struct glue_config *cfg);

/* Free what the save worker kept of the device staging pool (ckpt_close). NULL: no-op. */
struct save_stage_rec;
void save_stage_rec_free(struct save_stage_rec *r);

/* One item added to a save: a tensor box or a blob. Owned by its save. */
struct save_item {
	char       *name;
	uint8_t     kind, dtype, policy, flags, ndim;
	uint64_t    global_shape[CKPT_MAX_NDIM], offset[CKPT_MAX_NDIM], extent[CKPT_MAX_NDIM];
	uint64_t    raw_bytes;
	const void *data;
	int         mem;
	ckpt_source_fn source;        /* non-NULL: bytes pulled from it, not from data */
	void       *source_arg;
};

enum save_state { SAVE_OPEN = 0, SAVE_QUEUED, SAVE_RUNNING, SAVE_DONE };

/* Written by the caller's thread until submit, then by the worker; the fields
 * under "shared" are read by waiters under ctx->lock. */
struct ckpt_save {
	ckpt_ctx         *ctx;
	uint64_t          step;
	uint64_t          save_id;        /* this attempt's: its file's name and index carry it */
	struct save_item *items;
	size_t            nitems, cap;
	uint64_t         *name_hashes;    /* open-addressing set of item names */
	size_t            hash_cap;
	uint64_t          logical_bytes;
	char             *meta;           /* ckpt_save_set_meta's JSON text (no NUL), or NULL */
	size_t            meta_len;
	bool              incremental;    /* may reference the previous step's chunks */
	void             *order_stream;   /* cudaStream_t whose work the copies follow
	                                     (ckpt_save_set_stream); NULL: the default */
	void             *fence;          /* cudaEvent_t recorded on it at submit, or NULL
	                                     (no device tensors); destroyed by ckpt_save_free */
	struct ckpt_save *next;           /* worker queue */
	struct ckpt_save *live_next;      /* ctx->live, under ctx->lock */
	/* shared, under ctx->lock */
	enum save_state   state;
	bool              snapshot_done;
	bool              snapshot_issued; /* every snapshot copy issued; event set */
	void             *snapshot_event;  /* cudaEvent_t after the last copy, or NULL;
	                                      destroyed by ckpt_save_free */
	int               rc;             /* outcome once state == SAVE_DONE */
	char              msg[1024];      /* ckpt_last_error of the outcome */
	uint64_t          t_submit, t_snapshot, t_durable, t_commit;
	uint64_t          stored_bytes;
	uint64_t          ref_bytes, staged_bytes, unchanged_bytes;   /* ckpt_save_stats */
};

struct ckpt_ctx {
	struct glue_config cfg;
	/* what messages call the checkpoints: the root, or the ckptd target
	 * ("ckptd://HOST:PORT[,...]", whose root option is not used) */
	char               where[320];
	struct ckpt_log_sink log;         /* where this context's lines go (ckpt_log_enter) */
	struct manifest   *manifest;      /* RW on the coordinator; opened RDONLY lazily elsewhere */
	char              *manifest_path; /* its directory: cfg.manifest_dir, or <root>/manifest */
	pthread_mutex_t    manifest_lock; /* lazy open */
	struct io_pool    *pool;
	struct snapshot   *snap;          /* device detection, pinned allocator, CUDA streams */
	pthread_mutex_t    load_lock;     /* serialises use of load_engine */
	struct io_engine  *load_engine;

	/* save worker */
	pthread_t          worker;
	bool               worker_started;
	pthread_mutex_t    lock;
	pthread_cond_t     cond;
	struct ckpt_save  *queue_head, *queue_tail;
	unsigned           inflight;      /* begun and not yet done */
	struct ckpt_save  *live;          /* the saves begun and not yet freed */
	bool               stopping;
	struct io_engine  *save_engine;   /* owned by the worker thread */
	/* what the device staging pool holds, chunk by chunk (lib/save.c; the worker's) */
	struct save_stage_rec *stage_rec;
	/* Saves write format 4's hashes, of whole chunks, as builds before format 5 did
	 * (docs/format.md §5). Never set by the library: tests set it to make the steps
	 * an upgrade finds. Read by the save worker. */
	bool               hash_whole;

	/* the coordinator role (rank 0, not read-only): the root's lock (lib/lock.c) and
	 * this context's incarnation, a random id that the steps it begins carry */
	int                lock_fd;       /* -1: not held */
	uint64_t           incarnation;
	/* another rank of a manifest kept apart: the incarnation of the coordinator that
	 * held the root when this rank joined it (0: none seen), which a manifest copy on
	 * this rank's node must name even once that coordinator is gone (manifest_bind) */
	uint64_t           joined_incarnation;

	/* one gc at a time (ckpt/catalog.h): the caller's ckpt_catalog_gc and the
	 * retention the save worker runs after a commit */
	pthread_mutex_t    gc_lock;

	/* a ckptd target (cfg.nckptd > 0): the connection the save worker streams this
	 * rank's shards on (to its instance: rank mod the number of instances), made
	 * again by the next save when a ckptd restart broke it; the instances as lib/remote
	 * names them */
	struct remote_conn     *remote;
	struct remote_instance *inst;
	/* and the connections loads fetch bytes on, one per instance, opened on first
	 * use (under load_lock) */
	struct remote_conn    **fetch;
	/* the manifest copies loads read (glue_manifest takes a fresh one each time:
	 * the previous ones stay open until ckpt_close, for whoever still reads them) */
	struct manifest       **old_manifests;
	size_t                  nold_manifests;

	/* distributed commit (world > 1) */
	struct commit_coord *coord;       /* rank 0 of the embedded default */
	struct commit_part  *part;        /* every rank */
	struct commit_leader *leader;     /* a node's first rank, in the hierarchical commit */
};

/* A committed step opened for reading (lib/load.c). Immutable after open, except
 * readers[], which are opened lazily under ctx->load_lock. */
struct load_piece {
	uint32_t rank;
	uint32_t tensor;             /* index in that rank's shard index */
};

struct load_entry {
	const struct io_tensor_entry *meta;   /* the first piece's record */
	struct load_piece *pieces;
	uint32_t npieces;
	uint64_t stored_bytes;
	uint32_t nchunks;
};

struct ckpt_load {
	ckpt_ctx                *ctx;
	struct manifest_step     rec;
	struct manifest_shard   *shards;     /* [world] */
	struct io_shard_index  **ix;         /* [world] */
	struct io_shard_reader **readers;    /* [world], opened on first use */
	struct load_fetch       *fetch;      /* [world] through ckptd: where each shard is */
	struct load_entry       *entries;    /* sorted by name */
	uint32_t                 nentries;
	struct load_piece       *piece_store;
	/* The files of other steps the shards reference, relative to the root: rank r's
	 * file f (its index's files[f]) is ref_rel[ref_first[r] + f]. */
	char                   **ref_rel;
	size_t                  *ref_first;     /* [world] */
	size_t                   nref_rel;
};
/* The file holding rank's chunk k of an opened step, relative to the root: its
 * shard file, or the file of another step that the chunk references. */
const char *load_chunk_file(const ckpt_load *l, uint32_t rank, uint32_t k);

bool glue_is_coordinator(const ckpt_ctx *c);
/* Saving through ckptd (lib/ctx.c): the rank's instance, the auth it presents, and
 * (re)connecting the save connection. */
static inline bool glue_remote(const ckpt_ctx *c) { return c->cfg.nckptd > 0; }
void glue_remote_auth(const ckpt_ctx *c, struct remote_auth *a);
int  glue_remote_conn(ckpt_ctx *c, unsigned inst, struct remote_conn **out);
/* The element-size rule of ckpt.h for output structs: -EINVAL (naming fn) when
 * elem_size is below min, the struct's size in the header's first version of it. */
int  glue_elem_size_check(const char *fn, size_t elem_size, size_t min);
/* Write element i of an array of elem_size-byte elements from v (have bytes): only
 * its first elem_size bytes, zeros past have. */
void glue_elem_put(void *out, size_t i, size_t elem_size, const void *v, size_t have);
/* At most one coordinator per root (lib/lock.c). lock_take: an exclusive flock on
 * <root>/coordinator.lock, held through *fd until it is closed; -EBUSY naming the
 * holder when another process holds it. lock_probe: 1 if a coordinator holds the
 * root now (*incarnation: its incarnation, from the lock file), else 0.
 * lock_release: let go (closes fd; -1: nothing). A child forked while the lock is
 * held does not hold it. */
int  lock_take(const struct glue_config *cfg, uint64_t incarnation, int *fd);
int  lock_probe(const char *root, uint64_t *incarnation);
void lock_release(int fd);
/* The manifest, opening it read-only on first use where this process is not the
 * coordinator. A manifest kept apart from the root (cfg.manifest_dir) that is not
 * on this host is CKPT_ENOMANIFEST naming its directory and the host; one of
 * another root is CKPT_ENOMANIFEST naming both roots (manifest_root_bind). */
int  glue_manifest(ckpt_ctx *c, struct manifest **out);
/* For messages that give a ckpt-inspect command: two arguments for "%s%s", the
 * option that names the context's manifest directory when it is kept apart
 * (" --manifest-dir DIR"), or two empty strings. */
#define GLUE_MANIFEST_OPT(c) ((c)->cfg.manifest_dir ? " --manifest-dir " : ""), \
                             ((c)->cfg.manifest_dir ? (c)->cfg.manifest_dir : "")
/* Run the save worker's job for one save (lib/save.c). */
void save_run(ckpt_ctx *c, struct ckpt_save *s);
/* What a root holds (lib/catalog.c): the manifest's records merged with the step
 * directories on disk, in step order. */
struct catalog_entry {
	uint64_t step;
	bool     has_record, has_dir;
	bool     live;                 /* an INFLIGHT record of the coordinator holding the
	                                  root now: a save in flight */
	struct manifest_step rec;      /* when has_record */
	uint32_t nfiles;
	uint64_t dir_bytes;
};
/* all: every record and directory; else committed steps only. *out malloc'd. */
int  catalog_list(ckpt_ctx *c, bool all, struct catalog_entry **out, size_t *count);
/* The coordinator's GC at open (lib/gc.c): the files of attempts the manifest names
 * ABORTED or abandoned INFLIGHT; never a directory without a record. */
int  gc_open(ckpt_ctx *c, uint64_t *removed);
/* The job's retention after step committed (lib/retention.c): when cfg keeps by
 * any rule, gc as ckpt_catalog_gc with those rules; a failure is logged (WARN),
 * never returned. Called by the save worker once the save's outcome is published. */
void retention_after_commit(ckpt_ctx *c, uint64_t step);
/* The shard files that committed steps reference (incremental saves; their records
 * list them, docs/format.md §8.6a): GC never removes one of them. A damaged record
 * may reference any step below it: those are spared whole. */
struct gc_refs {
	struct manifest_ref *refs;
	uint64_t *by;                  /* by[i]: the committed step that references refs[i] */
	size_t    n;
	bool      damaged;
	uint64_t  damaged_max;
};
int  gc_refs_load(struct manifest *m, struct gc_refs *out);
void gc_refs_free(struct gc_refs *r);
/* Remove the files of attempt save_id of step (0: every shard file, for a record
 * that names no attempt), but those refs keeps (refs NULL: none), and the directory
 * if nothing else is left in it. *kept (may be NULL): the files kept because a
 * committed step references them (each logged with the step that keeps it). */
int  gc_attempt_remove(const char *root, uint64_t step, uint64_t save_id,
                       const struct gc_refs *refs, uint32_t *kept);
/* Remove a step directory and everything in it (the operator's explicit choice for
 * a directory without a record), then fsync the root. */
int  gc_unrecorded_remove(const char *root, uint64_t step, const struct gc_refs *refs,
                          uint32_t *kept);

/* The context's load engine, with ctx->load_lock held (created on first use); every
 * reader opened on it and every io_read_batch on it happen between these two calls
 * (lib/load.c). */
int  load_engine_acquire(ckpt_ctx *c, struct io_engine **out);
void load_engine_release(ckpt_ctx *c);
/* Rank's shard reader of an opened step, opened on first use on the load engine;
 * call with the engine acquired. */
int  load_shard_reader(ckpt_load *l, uint32_t rank, struct io_shard_reader **out);
/* Open rank r's shard file on its own footer and hold that footer to the committed
 * record (hash and place): CKPT_ECORRUPT, naming the file, if it differs. */
int  load_footer_open(const ckpt_load *l, uint32_t r, struct io_shard_reader **out);
/* Through ckptd: where rank r's shard is fetched from (its record's holder). */
struct load_fetch { ckpt_ctx *ctx; unsigned inst; const char *rel; };
/* Open a reader of rank r's shard (index NULL: from its footer), local or fetched. */
int  load_reader_open(const ckpt_load *l, uint32_t r, struct io_engine *e,
                      const struct io_shard_index *index, struct io_shard_reader **out);
/* Regular files and their bytes in a step directory (lib/gc.c). 0 or -errno. */
int  gc_step_dir_usage(const char *root, uint64_t step, uint32_t *nfiles, uint64_t *bytes);


#endif /* CKPT_GLUE_H */
