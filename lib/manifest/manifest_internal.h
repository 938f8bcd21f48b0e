/*
 * manifest_internal.h — private to lib/manifest (and its tests): the handle's
 * layout and the record codec (docs/format.md §8).
 *
 * The codec is split from the LMDB code so that it can be fed untrusted bytes
 * directly (unit tests, fuzz targets) without an environment. Decoders never
 * trust a length: every field is read through ckpt_cursor and checked against
 * the bytes that contain it.
 */
#ifndef CKPT_MANIFEST_INTERNAL_H
#define CKPT_MANIFEST_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>

#include "manifest/manifest.h"

/* Record versions: the first u16 of every value. A decoder accepts versions
 * 1..current and refuses newer ones with CKPT_EVERSION. */
#define MANIFEST_STEP_REC_VERSION  4u  /* 2: save id, incarnation, checksum; 3: user
                                          metadata (written only by a record that
                                          has some: the others stay version 2);
                                          4: referenced files (only a record that
                                          has some) */
#define MANIFEST_REF_BYTES         24u /* step, save id, rank, reserved */
#define MANIFEST_SHARD_REC_VERSION 3u  /* 2: footer offset and length; index optional;
                                          3: checksum */

#define MANIFEST_STEP_REC_FIXED   64u      /* bytes before job_id (see the layout) */
#define MANIFEST_SHARD_REC_FIXED  56u      /* bytes before path */
#define MANIFEST_CHECK_BYTES      8u       /* a record's trailing XXH3-64 */
#define MANIFEST_MAX_NOTE         1024u    /* abort reason kept in an ABORTED record */
#define MANIFEST_MAX_INDEX        (1ull << 30) /* = IO_MAX_FOOTER_BYTES; not included: no io dependency */

#define MANIFEST_STEP_KEY_BYTES   8u       /* BE u64 step (also a shard table's key) */
#define MANIFEST_SHARD_KEY_BYTES  12u      /* BE u64 step || BE u32 rank */

/*
 * The handle. env and the dbi numbers are fixed after manifest_open and read
 * without locks. resize_lock: every transaction (read or write) is begun and
 * ended under its read side; growing the map (mdb_env_set_mapsize, which LMDB
 * allows only while this process has no transaction active) takes the write side.
 */
struct manifest {
	MDB_env         *env;
	MDB_dbi          dbi_meta, dbi_steps, dbi_shards;
	bool             rdonly;
	bool             nolock;           /* opened with MDB_NOLOCK (read-only media) */
	uint32_t         format;           /* meta/format (1..3); a write raises it to 3 */
	pthread_rwlock_t resize_lock;
	pthread_mutex_t  attempts_lock;    /* manifest_attempts_lock */
	char             dir[];            /* the manifest directory, for messages */
};

/* manifest_open_dir with the initial map size chosen (0: the default, 64 GiB on a
 * 64-bit build). For tests of map growth; the map still grows on MDB_MAP_FULL. */
int manifest_open_map(const char *dir, unsigned flags, size_t map_bytes, struct manifest **out);

/* ------------------------------------------------------------------ transactions
 * (manifest_env.c) */

/* Record an LMDB failure (rc: an MDB_* code or positive errno) with the manifest and
 * what was being done; returns the converted ckpt code. */
int manifest_fail(const struct manifest *m, int rc, const char *fmt, ...) CKPT_PRINTF(3, 4);
/* Begin a transaction (flags: 0 or MDB_RDONLY). On success the read side of
 * resize_lock is held until manifest_txn_abort/_commit. Returns an MDB code. */
int  manifest_txn_begin(struct manifest *m, unsigned flags, MDB_txn **txn);
void manifest_txn_abort(struct manifest *m, MDB_txn *txn);
int  manifest_txn_commit(struct manifest *m, MDB_txn *txn);   /* MDB code; frees txn */

/* The body of a write transaction: 0 or a ckpt code (message recorded). It must
 * be repeatable from scratch: manifest_write may run it twice. */
typedef int (*manifest_write_fn)(struct manifest *m, MDB_txn *txn, void *arg);
/* Run fn in one write transaction and commit it durably; on a full map, grow the
 * map and run the whole transaction once more (then -ENOSPC). CKPT_ESTATE on a
 * read-only handle; `what` names the operation in messages. */
int manifest_write(struct manifest *m, manifest_write_fn fn, void *arg, const char *what);

/* ------------------------------------------------------------------ codec
 * (manifest_record.c) */

/* Keys. */
void manifest_step_key(uint8_t out[MANIFEST_STEP_KEY_BYTES], uint64_t step);
void manifest_shard_key(uint8_t out[MANIFEST_SHARD_KEY_BYTES], uint64_t step, uint32_t rank);

/* A step record: state etc. from *rec, and note (may be NULL) stored after job_id.
 * Returns the encoded size; encodes into out when out is non-NULL (out must hold
 * that many bytes). Fields must already be valid (manifest_step_check). */
size_t manifest_step_encode(const struct manifest_step *rec, const char *note, uint8_t *out);
/* 0, or -EINVAL naming the field (job_id too long, bad state or trust). */
int manifest_step_check(const struct manifest_step *rec);
/* Reference i of a decoded record's refs_raw_ (bounds checked by the decoder). */
void manifest_ref_at(const uint8_t *raw, uint32_t i, struct manifest_ref *out);
/* Decode a step record found under key step. 0, CKPT_EFORMAT, CKPT_EVERSION or
 * CKPT_ECORRUPT (its checksum does not match: the message names step). note/note_cap optional: the abort reason, truncated.
 * out->meta points INTO p (valid as long as p is), out->meta_len its length. */
int manifest_step_decode(const void *p, size_t n, uint64_t step, struct manifest_step *out,
                         char *note, size_t note_cap);

/* A shard record. Size first (0 on overflow), then encode into out (its checksum
 * covers the key, (step, s->rank)). */
size_t manifest_shard_rec_size(const struct manifest_shard *s);
void manifest_shard_encode(uint64_t step, const struct manifest_shard *s, uint8_t *out);
/* Validate a shard to be stored: 0 or -EINVAL naming step and rank. */
int manifest_shard_check(uint64_t step, const struct manifest_shard *s);
/* Decode a shard record found under (step, rank). On success out->path and
 * out->index point INTO p (not copied, and the path is NOT NUL-terminated: its
 * length goes to *path_len; out->owned_ is NULL). CKPT_EFORMAT or CKPT_EVERSION,
 * naming step and rank. */
int manifest_shard_decode(const void *p, size_t n, uint64_t step, uint32_t rank,
                          struct manifest_shard *out, size_t *path_len);
/* ------------------------------------------------------------------ shard tables
 * (format >= 2): every rank's footer place of one step in ONE value, under the
 * step's 8-byte key in the shards database; the path of rank r is the canonical one
 * (ckpt_path_shard_rel with the table's save id), so it is not stored. A commit
 * writes a table when every shard is canonical (manifest_shard_tabular); otherwise
 * per-rank records. docs/format.md §8.4a. */
#define MANIFEST_TABLE_VERSION    2u       /* 2: save id, checksums */
#define MANIFEST_TABLE_HEADER     24u      /* version, reserved, count, save id, checksum */
#define MANIFEST_TABLE_ENTRY      56u
#define MANIFEST_TABLE_HEADER_V1  8u
#define MANIFEST_TABLE_ENTRY_V1   48u
#define MANIFEST_MAX_TABLE_RANKS  (1u << 24)

/* The canonical shard of (step, rank) in attempt save_id: no index copy, a footer,
 * and the path ckpt_path_shard_rel gives. prefix: "step-<20 digits>/" of step (26
 * bytes, from manifest_table_prefix), made once per step by the caller. */
#define MANIFEST_TABLE_PREFIX 26u
void manifest_table_prefix(char out[MANIFEST_TABLE_PREFIX + 1], uint64_t step);
bool manifest_shard_tabular(const char *prefix, uint64_t save_id, const struct manifest_shard *s);
/* Bytes of a table of count entries (count <= MANIFEST_MAX_TABLE_RANKS). */
size_t manifest_table_size(uint32_t count);
/* Write the header, then each shard at its rank's place (rank < count); the
 * checksums cover the step's key. */
void manifest_table_header(uint8_t *out, uint64_t step, uint32_t count, uint64_t save_id);
void manifest_table_put(uint8_t *out, uint64_t step, const struct manifest_shard *s);
/* Rank's entry of the table found under step: its footer place in out (path and
 * index NULL: the caller sets the canonical path, from *save_id: 0 for a version-1
 * table). The header and that entry are checked, the table's length against its
 * count. CKPT_ENOTFOUND (rank >= count), CKPT_ECORRUPT (a checksum), CKPT_EFORMAT or
 * CKPT_EVERSION, naming step and rank. */
int manifest_table_entry(const void *p, size_t n, uint64_t step, uint32_t rank,
                         struct manifest_shard *out, uint64_t *save_id);

/* A path as stored: non-empty, <= MANIFEST_MAX_PATH, relative, no "", "." or ".."
 * component, no control bytes. */
bool manifest_path_ok(const char *path, size_t len);

#endif /* CKPT_MANIFEST_INTERNAL_H */
