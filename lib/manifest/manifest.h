/*
 * manifest.h — lib/manifest's interface: the LMDB manifest of a checkpoint root.
 *
 * The manifest is the single source of truth for visibility (docs/format.md §8.6): a step
 * exists for readers if and only if its COMMITTED step record is here, and that
 * record is written together with every rank's shard record in ONE durable write
 * transaction (manifest_commit). A shard record names where the rank's shard index
 * (its file's footer) is and its hash, and may carry a copy of it as opaque bytes;
 * a format-2 manifest stores a step of canonical shards as one table value
 * (docs/format.md §8.4a). A step being saved has an INFLIGHT record from before its
 * first file is written (manifest_begin). Every record carries its own checksum.
 * This module depends on nothing of ours but the base tier.
 *
 * Threads: a struct manifest may be used from any number of threads; LMDB
 * serialises writers. One process opens a given manifest once (an LMDB rule).
 */
#ifndef CKPT_MANIFEST_H
#define CKPT_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"

#define MANIFEST_FORMAT_VERSION 4u   /* 2: shard tables (docs/format.md §8.4a); 3: save ids,
                                        in-flight records, checksummed records; 4: step
                                        records that list the files they reference */
#define MANIFEST_MAX_JOB_ID     256u
#define MANIFEST_MAX_PATH       1024u
#define MANIFEST_MAX_META       65536u   /* = CKPT_MAX_META: a step's user metadata */

enum manifest_open_flags {
	MANIFEST_RDONLY = 1u << 0,   /* no writes; fails with -ENOENT if absent */
	MANIFEST_CREATE = 1u << 1,   /* create the environment if absent */
	MANIFEST_GROUP_ACCESS = 1u << 2,  /* create files 0640 and directories 0750 (else
	                                     0600, 0700) */
};

struct manifest;

/*
 * Where a manifest lives: a directory of its own, <root>/manifest by default
 * (ckpt_path_manifest_dir), or a directory kept apart from the root — on the
 * coordinator's local disk when the shard files go to a shared file system (docs/
 * operations.md, "Multi-node deployments"). Its creations and damaged copies go
 * beside it, in its parent: <dir>.new-*, <dir>.damaged-* (docs/format.md §8.1).
 */

/*
 * Open the manifest in dir; with MANIFEST_CREATE, create it first when dir is absent
 * (atomically: a complete environment or none; dir's parent must exist). An existing
 * manifest is never initialised or changed by opening it. Errors: -ENOENT (absent
 * and not MANIFEST_CREATE, or dir's parent absent), CKPT_ENOTROOT (dir's parent is
 * not a directory), CKPT_ENOMANIFEST (dir exists but holds no usable environment: no
 * data.mdb, a damaged one — manifest_check_file — or not a libckpt manifest),
 * CKPT_EVERSION (written by a newer format), -EINVAL (dir empty or "/"), -EACCES,
 * -ENOMEM. Messages name dir.
 */
int  manifest_open_dir(const char *dir, unsigned flags, struct manifest **out);
/* manifest_open_dir on <root>/manifest, the manifest of root in the default layout. */
int  manifest_open(const char *root, unsigned flags, struct manifest **out);
/* Check <dir>/data.mdb without mapping it (LMDB would SIGBUS on a file cut short,
 * and would initialise an empty one): 0 when it looks usable, -ENOENT when there is
 * no directory dir or no data.mdb in it, CKPT_ENOMANIFEST naming what is wrong
 * (empty, cut short, not LMDB's). Reads only; any process may call it. */
int  manifest_check_file(const char *dir);
/* Move dir aside to <dir>.damaged-<UTC time> (never over an earlier one) and sync
 * its parent; moved_to gets the new path. For recovery only: the caller must be the
 * manifest's only writer. */
int  manifest_set_aside(const char *dir, char *moved_to, size_t cap);
/* Remove what creations of dir that stopped left beside it (<dir>.new-*:
 * manifest_open_dir creates the environment there, then renames it into place);
 * nothing reads them. Only for the manifest's one writer (the holder of its root's
 * coordinator lock), under which creations run. */
void manifest_creation_leftovers_remove(const char *dir);
/*
 * The checkpoint root a manifest kept apart belongs to (meta/root, docs/format.md
 * §8.2): root is the root's absolute path without symbolic links (realpath). 0 when
 * the manifest's root record names root; when it has none (a new manifest, or one
 * moved out of its root), a writable handle records root in one durable transaction
 * and a read-only one accepts it. CKPT_ENOMANIFEST, naming both roots, when it names
 * another: the manifest of one root holds records of that root's step directories,
 * which another root would take for its own (and its GC would act on). A manifest
 * in its root's own directory needs no record: the caller does not call this.
 */
int  manifest_root_bind(struct manifest *m, const char *root);
/* The incarnation of the coordinator that opened a manifest kept apart last
 * (meta/coordinator): _set records it (one durable transaction; CKPT_ESTATE when
 * read-only), _get reads it (CKPT_ENOTFOUND: none recorded). A rank compares it with
 * the live coordinator's (its lock file) to tell the manifest the coordinator writes
 * from a stale copy at the same path on another node. */
int  manifest_coordinator_set(struct manifest *m, uint64_t incarnation);
int  manifest_coordinator_get(struct manifest *m, uint64_t *incarnation);
void manifest_close(struct manifest *m);            /* NULL: no-op */

#define MANIFEST_MAX_REFS        (1u << 20)   /* files one step's shards reference */

/* A shard file of another step that a committed step's shards reference (an
 * incremental save, docs/format.md §3b, §8.3): it must stay while the step does. */
struct manifest_ref {
	uint64_t step;
	uint64_t save_id;          /* the attempt whose file it is (0: a file without one) */
	uint32_t rank;
};

/* One checkpoint (step) record. */
struct manifest_step {
	uint64_t step;
	uint32_t state;            /* enum ckpt_step_state */
	uint32_t trust;            /* enum ckpt_trust */
	uint32_t world;
	uint32_t ntensors;
	uint64_t logical_bytes, stored_bytes;
	uint64_t commit_time_ns;
	uint64_t save_id;          /* the attempt: its shard files carry it (0: older records) */
	uint64_t incarnation;      /* the coordinator that began it (0: older records) */
	char     job_id[MANIFEST_MAX_JOB_ID + 1];
	/* The user's metadata of a committed step (ckpt_save_set_meta: a JSON object,
	 * without a NUL), stored in its record; meta_len 0: none. Written from these by
	 * manifest_commit. Read back with manifest_step_meta: the readers that fill a
	 * struct manifest_step set meta_len and leave meta NULL. */
	const char *meta;
	uint32_t    meta_len;
	/* The files of other steps that its shards reference (a COMMITTED record only),
	 * written from these by manifest_commit; readers that fill a struct
	 * manifest_step set nrefs and leave refs NULL: manifest_step_refs reads them. */
	const struct manifest_ref *refs;
	uint32_t    nrefs;
	const uint8_t *refs_raw_;  /* private to lib/manifest */
};

/* One rank's shard record. In results, path and index point into memory owned by
 * the caller's struct (freed by manifest_shard_free). */
struct manifest_shard {
	uint32_t    rank;
	const char *path;          /* relative to the root */
	uint64_t    file_size;
	uint8_t     footer_hash[CKPT_HASH_BYTES];  /* XXH3-128 of the file's footer */
	uint64_t    footer_offset, footer_len;     /* where the footer (the shard index) is */
	const void *index;         /* optional copy of the encoded index (opaque here); NULL/0:
	                            * readers take it from the file's footer, checked by hash */
	size_t      index_len;
	void       *owned_;        /* private */
};
void manifest_shard_free(struct manifest_shard *s);

/*
 * The commit: ONE write transaction that stores every shard record and the step
 * record with state COMMITTED, committed durably (LMDB's synced commit) before
 * this returns 0. Errors: -EEXIST (step already committed; nothing changed),
 * -EINVAL (nshards != rec->world, ranks not 0..world-1), -ENOSPC (map full),
 * -EIO. The fault points coord_before_commit_txn / coord_after_commit_txn are
 * the caller's (lib/commit), not this function's.
 */
int manifest_commit(struct manifest *m, const struct manifest_step *rec,
                    const struct manifest_shard *shards, uint32_t nshards);

/* Record that an attempt at a step has begun: ONE durable transaction that puts an
 * INFLIGHT record (rec: step, world, save_id, incarnation, job_id; the time is set
 * here) in place of an ABORTED or INFLIGHT one, before any file of the attempt is
 * written. So every step directory that a save creates has a record that says whose
 * files are in it, and GC removes only files that a record positively names as an
 * attempt that cannot commit (docs/format.md §8.6). -EEXIST: the step is committed (nothing
 * changed). */
int manifest_begin(struct manifest *m, const struct manifest_step *rec);
/* Record an aborted attempt (rec: step, world, save_id, incarnation, job_id); the
 * reason is kept for ckpt-inspect list --all. Never replaces a committed record
 * (-EEXIST), nor the record of another attempt (-ESTALE; a save id of 0 names
 * every attempt). */
int manifest_record_abort(struct manifest *m, const struct manifest_step *rec, const char *why);

/* Step record of step (any state). CKPT_ENOTFOUND. */
int manifest_step_get(struct manifest *m, uint64_t step, struct manifest_step *out);
/* The metadata stored in step's record (any state): *len gets its length, and when
 * it is at most cap the bytes are copied to dst (no NUL added). 0, -ENOSPC (cap too
 * small: nothing copied, *len set), CKPT_ENOTFOUND (no record), or a damaged
 * record's error. A record without metadata gives 0 with *len = 0. */
int manifest_step_meta(struct manifest *m, uint64_t step, void *dst, size_t cap, size_t *len);
/* The files step's record references, copied into *refs (ckpt_malloc'd; NULL when
 * none): 0, CKPT_ENOTFOUND, or a damaged record's error. */
int manifest_step_refs(struct manifest *m, uint64_t step, struct manifest_ref **refs,
                       uint32_t *nrefs);
/* Every reference of every COMMITTED record: refs[i] is referenced by by[i] (both
 * ckpt_malloc'd, n entries). Records that do not decode are skipped, and
 * *damaged_max gets the highest such step (0 and *any_damaged false when none):
 * a reference points to an earlier step only, so GC spares every step below it. */
int manifest_refs_all(struct manifest *m, struct manifest_ref **refs, uint64_t **by,
                      size_t *n, bool *any_damaged, uint64_t *damaged_max);
/* Latest COMMITTED step. CKPT_ENOTFOUND if none. Every record is read and checked on
 * the way: a damaged one (CKPT_ECORRUPT, naming its key) fails the call rather than
 * let an older step pass for the latest. */
int manifest_step_latest(struct manifest *m, uint64_t *step);
/* Records in the steps database, whatever their state, readable or not. */
int manifest_steps_count(struct manifest *m);
/* Keys of the steps database whose records do not decode (damaged: CKPT_ECORRUPT,
 * or unreadable by this build): fills up to cap, returns how many there are. */
int manifest_steps_damaged(struct manifest *m, uint64_t *steps, size_t cap);
/* COMMITTED steps ascending (all states if all): fills up to cap, returns the count. */
int manifest_steps_list(struct manifest *m, bool all, uint64_t *steps, size_t cap);
/* Shard record of (step, rank), copied out. CKPT_ENOTFOUND, CKPT_EFORMAT. */
int manifest_shard_get(struct manifest *m, uint64_t step, uint32_t rank,
                       struct manifest_shard *out);
/* Mark a committed step's trust level (ckpt-inspect verify). CKPT_ENOTFOUND. */
int manifest_set_trust(struct manifest *m, uint64_t step, uint32_t trust);
/* Retire a committed step (retention): ONE transaction turns its record into an
 * ABORTED one that still names its attempt (note: why) and removes its shard
 * records. Then the caller removes the files, then the record
 * (manifest_step_delete): a crash in between leaves an ABORTED record that GC
 * finishes, never a visible step whose files are gone, nor files nobody names.
 * CKPT_ENOTFOUND (not committed). */
int manifest_step_retire(struct manifest *m, uint64_t step, const char *why);
/* Remove a step's records (any state, a damaged one included: repair). */
int manifest_step_delete(struct manifest *m, uint64_t step);
/* Serialise, within this process, the start of an attempt (commit_attempt_begin:
 * the old attempt's files, then the new record) with garbage collection's removal
 * of one (its files, then its record). GC reads the record again under this lock
 * and acts only if it is still the one it chose: otherwise a retry of the step
 * that began, or even committed, since GC listed the root could lose its record
 * or its files. Other processes need no part in it: only the holder of the root's
 * coordinator lock begins attempts or collects them. */
void manifest_attempts_lock(struct manifest *m);
void manifest_attempts_unlock(struct manifest *m);

/* Write a consistent, compacted copy of the manifest's LMDB file to fd (LMDB's own
 * copy: a read transaction's view, which writers do not block). For serving a job's
 * manifest to its readers (ckptd). */
int manifest_copy_fd(struct manifest *m, int fd);

/* Keep at least `slack` bytes of written zeros in data.mdb past LMDB's last page
 * (refilled to 2 x slack), so that commits do not extend the file: a commit that
 * extends it also syncs the file's size. Writes and syncs only when less than
 * slack is left; call it off the commit's path. CKPT_ESTATE when read-only. */
int manifest_reserve(struct manifest *m, uint64_t slack);
/* Where LMDB's used pages end in data.mdb, and the file's size (bytes). */
int manifest_file_space(struct manifest *m, uint64_t *used, uint64_t *size);

#endif /* CKPT_MANIFEST_H */
