/*
 * io.h — lib/io's interface to the rest of libckpt: the buffer pool, the io_uring
 * engine, the shard file (writer and reader) and the shard index codec.
 *
 * The shard index is the self-describing table of one rank's shard file (its
 * footer, docs/format.md §3). The same bytes travel in PREPARE and are stored in
 * the manifest, so one bounds-checked decoder serves file, network and manifest.
 *
 * Threads: io_pool is thread-safe. An io_engine, and every writer and reader
 * opened on it, belongs to one thread at a time.
 */
#ifndef CKPT_IO_H
#define CKPT_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"

#define IO_FORMAT_VERSION    5u   /* 3: the save id (header, index); 4: bytegroup, references;
                                  * 5: chunk hashes over block hashes */
#define IO_HEADER_BYTES      4096u            /* first block of every shard file */
#define IO_TRAILER_BYTES     64u              /* last bytes of every shard file */
#define IO_MAX_CHUNK_BYTES   (1ull << 30)     /* largest raw chunk a reader accepts */
#define IO_MAX_FOOTER_BYTES  (1ull << 30)
/* Block size of the block hashes the library writes (docs/format.md §3a). Readers
 * take the size from the index, never from here. */
#define IO_BLOCK_BYTES       (256u << 10)
#define IO_MIN_BLOCK_BYTES   4096u

enum io_codec { IO_CODEC_RAW = 0, IO_CODEC_ZSTD = 1, IO_CODEC_BYTEGROUP = 2 };
/* The format version that introduced the bytegroup codec (docs/format.md §7): an
 * index with a bytegroup chunk is of this version at least, and so is the trailer of
 * its file. */
#define IO_BYTEGROUP_VERSION 4u
/* The format version whose chunk hashes are trees (docs/format.md §5): a chunk
 * longer than one block is hashed over its block hashes, so that each byte is
 * hashed once. Every file of this version has a save id and block hashes. */
#define IO_TREE_VERSION      5u
enum io_tensor_flags { IO_TENSOR_BLOB = 1u << 0 };

/* ------------------------------------------------------------------ shard index */

struct io_tensor_entry {
	const char *name;          /* NUL-terminated, valid (ckpt_name_check); owned by the index */
	uint16_t    name_len;
	uint8_t     kind, dtype, policy, flags, ndim;
	uint64_t    global_shape[CKPT_MAX_NDIM];
	uint64_t    offset[CKPT_MAX_NDIM];     /* this shard's box */
	uint64_t    extent[CKPT_MAX_NDIM];
	uint64_t    raw_bytes;                 /* elems(extent) * dtype size; blob: its length */
	uint32_t    first_chunk, nchunks;      /* chunks [first, first+n) cover raw_bytes in order */
};

struct io_chunk_entry {
	uint32_t tensor;           /* index into tensors */
	uint8_t  codec;            /* enum io_codec */
	uint64_t raw_offset;       /* byte offset inside the tensor's box (row-major) */
	uint64_t raw_len;
	uint64_t file_offset;      /* multiple of CKPT_ALIGN */
	uint64_t stored_len;       /* bytes on disk, before padding to CKPT_ALIGN */
	uint8_t  hash[CKPT_HASH_BYTES];  /* XXH3-128 of the raw bytes, canonical form */
};

/* A shard file that chunks of another shard reference (format 4): the one that
 * physically holds their bytes, never one that references them in turn. Its path is
 * ckpt_path_shard(root, step, rank, save_id); save_id 0 names a file of format 1
 * or 2 (no save id in its name). */
struct io_ref_file {
	uint64_t step;
	uint64_t save_id;
	uint32_t rank;
};

struct io_shard_index {
	uint64_t step;
	uint32_t rank, world;
	uint64_t data_end;         /* end of chunks and block table (footer starts here) */
	uint32_t ntensors, nchunks;
	struct io_tensor_entry *tensors;
	struct io_chunk_entry  *chunks;
	/* Block hashes (format version 2; all zero in a version-1 index, which is what
	 * block_bytes 0 encodes). A raw chunk longer than block_bytes has
	 * io_nblocks(raw_len, block_bytes) block hashes in the table at blocks_offset. */
	uint32_t block_bytes;      /* power of two, >= IO_MIN_BLOCK_BYTES; 0: version 1 */
	uint64_t blocks_offset;    /* the block table: 0 and 0 when no chunk has blocks */
	uint64_t blocks_len;
	uint8_t  blocks_hash[CKPT_HASH_BYTES];   /* XXH3-128 of the table's blocks_len bytes */
	uint64_t save_id;          /* the attempt that wrote the shard (version 3); 0 before */
	/* Chunk hashes are trees (version 5, docs/format.md §5): a chunk longer than
	 * block_bytes is hashed over its block hashes. false: over its bytes. */
	bool     tree;
	/* References (version 4, docs/format.md §3b): chunks whose bytes lie in another
	 * shard file, an earlier step's, named in files. chunk_file is NULL when nfiles
	 * is 0, else one entry per chunk: 0 for this file, f + 1 for files[f]. A
	 * referenced chunk's file_offset, stored_len and codec are those of its bytes in
	 * that file; its hash and block hashes are the same bytes'. */
	uint32_t nfiles;
	struct io_ref_file *files;
	uint32_t *chunk_file;
};

/* The file holding chunk k's bytes: 0 for the shard itself, f + 1 for ix->files[f]. */
static inline uint32_t io_chunk_file(const struct io_shard_index *ix, uint32_t k)
{
	return ix->chunk_file ? ix->chunk_file[k] : 0;
}

/* Block hashes of a chunk of len raw bytes: one per block_bytes block (the last may
 * be short) when len > block_bytes; 0 otherwise (a chunk of one block, or no block
 * size, is checked by its own hash). */
static inline uint64_t io_nblocks(uint64_t len, uint32_t block_bytes)
{
	return block_bytes && len > block_bytes ? (len - 1) / block_bytes + 1 : 0;
}
/* The block hashes chunk c has in its shard: compressed chunks have none. */
static inline uint64_t io_chunk_nblocks(const struct io_shard_index *ix,
                                        const struct io_chunk_entry *c)
{
	return c->codec == IO_CODEC_RAW ? io_nblocks(c->raw_len, ix->block_bytes) : 0;
}

/* Encode into a freshly malloc'd buffer (caller frees). -ENOMEM. */
int  io_index_encode(const struct io_shard_index *ix, void **out, size_t *len);
/* Decode untrusted bytes. Every count, length and offset is checked: chunk runs
 * contiguous and covering raw_bytes, file ranges inside [IO_HEADER_BYTES, data_end),
 * boxes inside shapes, sizes without overflow, names valid, enums known.
 * Errors: CKPT_EFORMAT (malformed; the message says which field), CKPT_EVERSION. */
int  io_index_decode(const void *buf, size_t len, struct io_shard_index **out);
void io_index_free(struct io_shard_index *ix);
/* Index of the tensor named name, or -1. Linear; callers build their own maps. */
int  io_index_find(const struct io_shard_index *ix, const char *name);
/* Whether some chunk of ix has the bytegroup codec (the index is then of version 4). */
bool io_index_has_bytegroup(const struct io_shard_index *ix);
/* Block hashes the chunk list of a decoded index implies (sum of io_chunk_nblocks). */
uint64_t io_index_nblocks(const struct io_shard_index *ix);

/* The block table (docs/format.md §3a): nblocks hashes, in chunk order and block
 * order within a chunk. Encode into a malloc'd buffer of exactly
 * 32 + 16 * nblocks bytes (caller frees). -ENOMEM, -EINVAL. */
int  io_blocks_encode(uint32_t block_bytes, const uint8_t *hashes, uint64_t nblocks,
                      void **out, size_t *len);
/* Decode untrusted table bytes against the (decoded, trusted) index they belong to:
 * magic, version, block size equal to the index's, block count equal to what its
 * chunk list implies, exact length, reserved bytes zero. *hashes points into buf
 * (io_index_nblocks(ix) entries of CKPT_HASH_BYTES). CKPT_EFORMAT, CKPT_EVERSION. */
int  io_blocks_decode(const struct io_shard_index *ix, const void *buf, size_t len,
                      const uint8_t **hashes);

/* ------------------------------------------------------------------ codec */

void io_hash128(const void *p, size_t n, uint8_t out[CKPT_HASH_BYTES]);
/* memcpy(dst, src, n) and the XXH3-128 of the bytes in one pass: each block is
 * hashed while it is still in cache. Same hash as io_hash128. */
void io_copy_hash128(void *dst, const void *src, size_t n, uint8_t out[CKPT_HASH_BYTES]);
/*
 * A chunk's hash (docs/format.md §5) and its block hashes, in the same pass as
 * memcpy(dst, src, n) when dst is given (dst NULL: src is hashed where it lies).
 * The block hashes are io_hash128 of each block_bytes block, io_nblocks(n,
 * block_bytes) of them, into blocks when given. The chunk's hash: with tree, and
 * more than one block, io_hash128 of its block hashes one after another (a file of
 * version 5); else io_hash128 of the n bytes. A tree of one block is its bytes'
 * hash. Never fails: the tree's hashes need no memory.
 */
void io_copy_hash128_blocks(void *dst, const void *src, size_t n, uint32_t block_bytes,
                            bool tree, uint8_t out[CKPT_HASH_BYTES], uint8_t *blocks);
/* The hash of a chunk of nb > 1 blocks hashed as a tree, from its block hashes
 * (what io_copy_hash128_blocks gives with tree): for a caller that hashed the
 * blocks one by one itself. */
void io_tree_hash(const uint8_t *blocks, uint64_t nb, uint8_t out[CKPT_HASH_BYTES]);
/* The chunk hash alone, of bytes where they lie. */
void io_chunk_hash(const void *p, size_t n, uint32_t block_bytes, bool tree,
                   uint8_t out[CKPT_HASH_BYTES]);
/* The chunk hash of n raw bytes as chunks of ix have it (its version's kind). */
static inline void io_index_chunk_hash(const struct io_shard_index *ix, const void *p, size_t n,
                                       uint8_t out[CKPT_HASH_BYTES])
{
	io_chunk_hash(p, n, ix->block_bytes, ix->tree, out);
}

/* The hashes of one chunk's raw bytes, computed by whoever copied them (one pass). */
struct io_hashes {
	uint8_t        chunk[CKPT_HASH_BYTES];   /* the chunk's hash, of the kind tree says */
	uint32_t       block_bytes;              /* size blocks were hashed with; 0: none */
	const uint8_t *blocks;                   /* io_nblocks(len, block_bytes) hashes */
	bool           tree;                     /* chunk is over the blocks (version 5) */
};
/* Hex of a hash into out (33 bytes). */
void io_hash_hex(const uint8_t h[CKPT_HASH_BYTES], char out[2 * CKPT_HASH_BYTES + 1]);
/* zstd one-shot. compress returns the compressed size, or 0 if it would not fit in
 * cap (the caller stores raw). decompress returns -CKPT_ECORRUPT-style codes on a bad
 * frame or a size other than raw_len. */
size_t io_codec_compress(void *dst, size_t cap, const void *src, size_t n, int level);
int    io_codec_decompress(void *dst, size_t raw_len, const void *src, size_t n);
/* Byte grouping (docs/format.md §5): the element width whose bytes are split into
 * planes for dtype (2 for bf16 and f16, 4 for f32, 8 for f64), or 0 for dtypes that
 * are not (they use plain zstd). compress returns the stored size (header and
 * planes), or 0 when it would not fit in cap (store raw); a plane is zstd-compressed
 * at level only where that saves at least a sixteenth of it. decompress checks every
 * length of the stored bytes before use and returns CKPT_ECORRUPT on any mismatch. */
unsigned io_bytegroup_width(int dtype);
size_t io_bytegroup_compress(void *dst, size_t cap, const void *src, size_t n, unsigned width,
                             int level);
int    io_bytegroup_decompress(void *dst, size_t raw_len, const void *src, size_t n,
                               unsigned width);
/* A chunk of a tensor of dtype with the codec a save asked for (IO_CODEC_ZSTD or
 * IO_CODEC_BYTEGROUP; bytegroup is zstd for dtypes without planes): the stored size
 * and in *used the codec of the stored bytes, or 0 when raw is stored. decode: the
 * inverse for a chunk of codec (not raw); CKPT_ECORRUPT as the codecs', or for a codec
 * the dtype cannot have. Any thread (each keeps its own contexts). */
size_t io_chunk_encode(uint8_t codec, int level, int dtype, void *dst, size_t cap,
                       const void *src, size_t n, uint8_t *used);
int    io_chunk_decode(uint8_t codec, int dtype, void *dst, size_t raw_len, const void *src,
                       size_t n);

/* ------------------------------------------------------------------ pool */

/* Memory provider for the pool (lib/snapshot supplies a CUDA pinned one). */
struct io_pool_alloc {
	void *(*alloc)(size_t bytes, void *arg);    /* CKPT_ALIGN-aligned; NULL on failure */
	void  (*free)(void *p, size_t bytes, void *arg);
	void  *arg;
};

/* bytes (a multiple of CKPT_ALIGN) of anonymous memory for I/O buffers: aligned to
 * a huge page when at least one, advised as huge pages, pre-faulted. NULL on failure.
 * Free with io_unmap_buffers(m, bytes). */
void    *io_map_buffers(size_t bytes);
void     io_unmap_buffers(void *m, size_t bytes);

struct io_pool;
/* nbufs buffers of buf_bytes (multiple of CKPT_ALIGN). NULL alloc: io_map_buffers.
 * Errors: -EINVAL, -ENOMEM. */
int      io_pool_create(size_t buf_bytes, unsigned nbufs, const struct io_pool_alloc *alloc,
                        struct io_pool **out);
/* The same, and nsmall buffers of small_bytes (a multiple of CKPT_ALIGN, smaller
 * than buf_bytes) after them, for takers that know their size (io_pool_get_fit).
 * nsmall 0: io_pool_create. */
int      io_pool_create_classes(size_t buf_bytes, unsigned nbufs, size_t small_bytes,
                                unsigned nsmall, const struct io_pool_alloc *alloc,
                                struct io_pool **out);
/* One class of buffers: count buffers of bytes each. */
struct io_pool_class {
	size_t   bytes;
	unsigned count;
};
#define IO_POOL_MAX_CLASSES 12
/* ncls classes (1 to IO_POOL_MAX_CLASSES) in one mapping, cls[0] the largest (the
 * class io_pool_get, io_pool_buf_bytes, io_pool_nbufs and io_pool_nfree speak of),
 * each next one's buffers strictly smaller; every class non-empty, its size a
 * multiple of CKPT_ALIGN; at most INT_MAX buffers in all. Indices: cls[0]'s first,
 * then cls[1]'s, and so on. Errors: -EINVAL, -ENOMEM. */
int      io_pool_create_sized(const struct io_pool_class *cls, unsigned ncls,
                              const struct io_pool_alloc *alloc, struct io_pool **out);
/* About pool_bytes for chunks of at most buf_bytes (a multiple of CKPT_ALIGN):
 * buffers of buf_bytes, and classes of a half, a quarter, ... of it (down to
 * IO_POOL_HALVING_MIN) that share a quarter of the bytes, the same number of
 * buffers each, for takers that know their size (io_pool_get_fit). At most
 * IO_POOL_MAX_SLOTS buffers in all. A pool of fewer than IO_POOL_HALVING_MIN_BIG
 * large buffers keeps them all large: pool_bytes / buf_bytes buffers, as
 * io_pool_create. Errors: -EINVAL, -ENOMEM. */
#define IO_POOL_HALVING_SHARE   4
#define IO_POOL_HALVING_MIN     (64u << 10)
#define IO_POOL_HALVING_MIN_BIG 8
#define IO_POOL_MAX_SLOTS       16384   /* io_uring registers at most this many */
int      io_pool_create_halving(size_t buf_bytes, uint64_t pool_bytes,
                                const struct io_pool_alloc *alloc, struct io_pool **out);
void     io_pool_destroy(struct io_pool *p);      /* every buffer must be back */
/* Take a free buffer; blocks up to timeout_ms (<0: forever). Index >= 0, or -ETIMEDOUT. */
int      io_pool_get(struct io_pool *p, int timeout_ms);
/* A buffer that holds n bytes padded to CKPT_ALIGN (n at most io_pool_buf_bytes):
 * one of the smallest class that holds it when one is free, else one of the next
 * larger class that has one free; blocks up to timeout_ms while none of those
 * classes has one. Index >= 0, or -ETIMEDOUT. */
int      io_pool_get_fit(struct io_pool *p, size_t n, int timeout_ms);
void     io_pool_put(struct io_pool *p, unsigned idx);
void    *io_pool_addr(const struct io_pool *p, unsigned idx);
size_t   io_pool_len(const struct io_pool *p, unsigned idx);   /* 0: no such buffer */
/* The large class: its buffer size, count and free count. */
size_t   io_pool_buf_bytes(const struct io_pool *p);
unsigned io_pool_nbufs(const struct io_pool *p);
unsigned io_pool_nfree(struct io_pool *p);
/* Every class: indices [0, nslots), bytes of the buffers out, bytes in all. */
unsigned io_pool_nslots(const struct io_pool *p);
unsigned io_pool_nclasses(const struct io_pool *p);
/* Class c's size and count, and (nfree not NULL) how many of it are free now.
 * -EINVAL for no such class. */
int      io_pool_class_info(struct io_pool *p, unsigned c, struct io_pool_class *out,
                            unsigned *nfree);
uint64_t io_pool_bytes_out(struct io_pool *p);
uint64_t io_pool_bytes(const struct io_pool *p);
/* Every buffer at once, where every one is free now: the pool's one mapping, of
 * io_pool_bytes, in *base, for a taker that carves it as it likes (a direct save's
 * tail: lib/save.c). -EBUSY where a buffer is out (nothing is taken then).
 * io_pool_put_all gives them back, every one of them out. */
int      io_pool_take_all(struct io_pool *p, uint8_t **base);
void     io_pool_put_all(struct io_pool *p);

/* ------------------------------------------------------------------ engine */

struct io_engine;
/* An io_uring of depth entries. The pool's buffers are registered as fixed buffers
 * when the kernel allows (else plain reads/writes, logged once at INFO).
 * Errors: -ENOMEM, -ENOSYS (no io_uring), other -errno from setup. */
int  io_engine_create(struct io_pool *pool, unsigned depth, struct io_engine **out);
void io_engine_destroy(struct io_engine *e);
struct io_pool *io_engine_pool(const struct io_engine *e);
/* From now on every request is handed to the kernel's workers (IOSQE_ASYNC), at
 * most `workers` of them for this ring: queueing returns at once, where an O_DIRECT
 * write the file system takes without waiting would otherwise be issued by the
 * queueing thread, which then waits while the device's queue is full. For a thread
 * that must go back to its socket (ckptd's). Without the kernel's cap (before 5.15)
 * the ring's workers are as many as the kernel allows. Returns 0, or -errno of the
 * cap (requests are handed over anyway). */
int  io_engine_offload(struct io_engine *e, unsigned workers);
/* Requests queued and not yet completed (0: the engine may go to another thread). */
unsigned io_engine_inflight(const struct io_engine *e);

/* ------------------------------------------------------------------ shard writer */

struct io_tensor_desc {
	const char     *name;
	uint8_t         kind, dtype, policy, flags, ndim;
	const uint64_t *global_shape, *offset, *extent;   /* ndim entries each */
	uint64_t        raw_bytes;                        /* checked against the shape */
};

struct io_shard_result {
	struct io_shard_index *index;      /* caller frees: io_index_free */
	void    *footer;                   /* encoded index, caller frees: ckpt_free() */
	size_t   footer_len;
	uint8_t  footer_hash[CKPT_HASH_BYTES];
	uint64_t file_size;
	uint64_t logical_bytes, stored_bytes;   /* stored: bytes written to this file */
	uint64_t ref_chunks, ref_bytes;         /* chunks (raw bytes) appended as references */
};

struct io_shard_writer;
/* What a shard file is, for io_shard_writer_open. */
struct io_writer_opts {
	uint64_t step;
	uint32_t rank, world;
	uint64_t save_id;          /* the attempt writing it (format 3); 0: format 1 or 2 */
	uint64_t size_hint;        /* bytes to size the file to up front; 0: none */
	int      zstd_level;       /* 0 stores raw */
	uint8_t  codec;            /* with zstd_level > 0: IO_CODEC_ZSTD (0 too) or
	                            * IO_CODEC_BYTEGROUP (which needs a save id: format 4) */
	unsigned compress_threads; /* workers compressing chunks; 0: append compresses */
	uint32_t block_bytes;      /* block hashes' block size, or 0 (see below) */
	unsigned mode;             /* of the new file; 0: 0600 */
	bool     preallocate;      /* size_hint's blocks allocated up front (below) */
	bool     tree;             /* chunk hashes over block hashes: format 5 (needs a save
	                            * id); io_append's hashes must then be trees too */
};
/*
 * Create path (O_DIRECT where the file system allows). The file must not exist
 * (O_EXCL: a writer never truncates another's file: -EEXIST). It is sized to
 * size_hint bytes up front (ftruncate: extending O_DIRECT writes are slow); with
 * preallocate, its blocks are allocated too (fallocate), so that O_DIRECT writes
 * within them allocate nothing and run side by side (ext4 and XFS take such a
 * write under the inode's shared lock, and without waiting), falling back to
 * ftruncate where the file system cannot or has no room (the writes then say so).
 * block_bytes: the block size of the block hashes (a power of two in
 * [IO_MIN_BLOCK_BYTES, IO_MAX_CHUNK_BYTES], normally IO_BLOCK_BYTES); 0 writes a
 * version-1 file without block hashes. The version written is the lowest that holds
 * what the options ask for: 5 with tree hashes, 3 with a save id (which needs block
 * hashes), 2 with block hashes, 1 without; 4 when a chunk needs it. Errors: -EINVAL,
 * -EEXIST, -errno naming the path.
 */
int io_shard_writer_open(struct io_engine *e, const char *path, const struct io_writer_opts *o,
                         struct io_shard_writer **out);
/* Declare the next tensor; returns its index (>= 0). Errors: CKPT_ENAME, CKPT_ESHAPE,
 * -EINVAL, -EEXIST (same name twice in this shard). */
int io_shard_writer_add_tensor(struct io_shard_writer *w, const struct io_tensor_desc *t);
/* An external writer of a chunk's bytes (GPUDirect Storage): write(arg, fd, path,
 * off, n) writes the chunk's whole 4 KiB blocks [off, off+n) from its own copy of
 * them. Its error fails the writer. */
struct io_ext_write {
	int  (*write)(void *arg, int fd, const char *path, uint64_t off, size_t n);
	void  *arg;
};
/* The optional parts of an append; a NULL struct asks for none of them. */
struct io_append {
	/* The hashes of the raw bytes, already computed by the caller (the snapshot
	 * stage hashes while it copies: one pass over the data instead of two). NULL:
	 * computed here; block hashes of another block size than the writer's are
	 * computed here too. */
	const struct io_hashes    *hashes;
	/* Another path writes the chunk's bytes: buf holds them (hashes computed from
	 * it: hashes, chunk and blocks, is then required), ext writes the whole 4 KiB
	 * blocks, and the partial last block goes out from buf. Never compressed.
	 * NULL: the writer writes buf. */
	const struct io_ext_write *ext;
	/* The bytes in buf are already encoded by whoever made them (a rank saving
	 * through ckptd compresses before it sends): codec IO_CODEC_ZSTD or
	 * IO_CODEC_BYTEGROUP (a tensor of a dtype with planes, a writer with a save id)
	 * with stored_len (<= len) bytes encoding the len raw bytes; hashes (of the raw
	 * bytes) is then required and nothing is hashed or compressed here. The reader
	 * checks the encoding. IO_CODEC_RAW: buf holds the raw bytes (stored_len unused). */
	uint8_t codec;
	size_t  stored_len;
};
/* Append the next chunk of tensor t: len raw bytes in pool buffer buf, with the
 * optional parts in opt (NULL: none). Ownership of buf passes to the writer in every
 * case (success or failure); it returns to the pool when its write completes.
 * Hashes, hands the chunk to the compression workers when enabled (or compresses
 * it here without workers; kept only when smaller), queues the writes of the
 * chunks that are ready, in append order; blocks only while the engine's queue is
 * full, while the workers' ring is full, or while the pool is empty and this
 * writer's ring or writes hold buffers (so that it never returns with the pool
 * empty because of work nobody collected). Chunks of a tensor are appended in order; a tensor's chunks are
 * consecutive. Errors: -EINVAL (a chunk out of that order, or larger than its
 * tensor's rest or a pool buffer; opt->ext without its write or opt->hashes),
 * -ENOMEM, -EIO, -ENOSPC, ... */
/* Whether io_shard_writer_append would queue its write now rather than wait for the
 * disk: finished writes are reaped (without waiting) first. true also when the
 * writer has failed, so that the next append reports it. */
bool io_shard_writer_ready(struct io_shard_writer *w);
/* Chunks appended whose bytes are not yet written: in the compression ring, or in a
 * write still in flight. Completions count as they are reaped, inside this writer's
 * calls (io_shard_writer_ready reaps without waiting). The appending thread's. */
unsigned io_shard_writer_pending(const struct io_shard_writer *w);
int io_shard_writer_append(struct io_shard_writer *w, uint32_t t, unsigned buf, size_t len,
                           const struct io_append *opt);
/* A chunk already stored in an earlier step's shard file (format 4): where its
 * bytes are there, and their hashes (chunk and, for a raw chunk of several blocks,
 * blocks of the writer's block size: they go into this file's block table). */
struct io_chunk_ref {
	struct io_ref_file      file;      /* the file that physically holds the bytes */
	uint8_t                 codec;     /* as stored there */
	uint64_t                file_offset, stored_len;
	const struct io_hashes *hashes;
};
/* Append the next chunk of tensor t, len raw bytes, as a reference to ref's bytes:
 * nothing is written for it, the index records ref's place (docs/format.md §3b).
 * The caller vouches that the bytes there are these (same XXH3-128); every reader
 * checks it. Same order rules as io_shard_writer_append. The writer must have a
 * save id, and ref->file an earlier step. Errors: -EINVAL, -ENOMEM. */
int io_shard_writer_append_ref(struct io_shard_writer *w, uint32_t t, size_t len,
                               const struct io_chunk_ref *ref);
/* Durability point of the shard: waits for every write, writes footer and trailer,
 * truncates to the final size, fdatasync()s the file (its directory entry was made
 * durable by io_shard_writer_open). Only after 0 may the shard be voted for. The writer is freed in every case; on failure
 * the file is removed and *res is zeroed. */
int io_shard_writer_finish(struct io_shard_writer *w, struct io_shard_result *res);
/* Waits for writes in flight, closes, unlinks the file, frees. NULL: no-op. */
void io_shard_writer_abort(struct io_shard_writer *w);

/* ------------------------------------------------------------------ shard reader */

struct io_shard_reader;
/* Open a shard file. index NULL: read and verify trailer and footer from the file
 * (CKPT_EFORMAT, CKPT_ECORRUPT, CKPT_EVERSION naming the path). index given (from the
 * manifest): the reader borrows it (it must outlive the reader) and checks only that
 * the file is large enough to hold the data it describes. */
int  io_shard_reader_open(struct io_engine *e, const char *path,
                          const struct io_shard_index *index, struct io_shard_reader **out);
/* A shard whose bytes are fetched rather than read from a local file (a shard held
 * by ckptd): fetch(arg, buf, len, off) fills buf with bytes [off, off+len) of the
 * file, whole, or returns a negative code with a message. name names the shard in
 * messages; file_size is the file's (from the manifest). Everything else (the
 * trailer, footer and block table checks; every chunk and block hash; decompression)
 * is the same as for a file: the bytes are verified here, where they are used.
 * Reads through io_read_batch are made one at a time, in the calling thread. */
typedef int (*io_fetch_fn)(void *arg, void *buf, size_t len, uint64_t off);
int  io_shard_reader_open_fetch(struct io_engine *e, const char *name, uint64_t file_size,
                                const struct io_shard_index *index, io_fetch_fn fetch,
                                void *arg, struct io_shard_reader **out);
const struct io_shard_index *io_shard_reader_index(const struct io_shard_reader *r);
const char *io_shard_reader_path(const struct io_shard_reader *r);
/* The XXH3-128 of the footer as read from the file at open (which checked it against
 * the trailer): the manifest's record of the shard names its footer by this hash.
 * -ENODATA for a reader opened with a borrowed index. */
int  io_shard_reader_footer_hash(const struct io_shard_reader *r, uint8_t out[CKPT_HASH_BYTES]);
/* Is path the shard a vote describes? Its size is file_size, and its trailer (checked
 * as a reader checks it) names the footer at [footer_off, +footer_len) with hash
 * footer_hash. Reads 64 bytes: the coordinator holds each vote to the file the rank
 * made durable. 0, CKPT_ECORRUPT (missing, other size, another footer), CKPT_EFORMAT,
 * -errno; the message names the file. */
int  io_shard_trailer_check(const char *path, uint64_t file_size, uint64_t footer_off,
                            uint64_t footer_len, const uint8_t footer_hash[CKPT_HASH_BYTES]);
/* Take the index the reader decoded from the file; the reader keeps using it, so it
 * must outlive the reader. NULL for a reader opened with a borrowed index. */
struct io_shard_index *io_shard_reader_take_index(struct io_shard_reader *r);
/* Read the block table, check it against the index's blocks_hash and decode it;
 * once per reader (later calls return the first answer). Batches call it when they
 * first need it. 0 also when the shard has no block table. Errors: CKPT_ECORRUPT
 * (hash mismatch, short file), CKPT_EFORMAT, -EIO, -ENOMEM; messages name the file
 * and the table's offset. */
int  io_shard_reader_load_blocks(struct io_shard_reader *r);
/* Chunk k's block hashes in the shard's own table (io_chunk_nblocks of them), loaded
 * by io_shard_reader_load_blocks if not yet: *out points into the reader (valid
 * until it is closed), NULL for a chunk without blocks. Errors: those of
 * io_shard_reader_load_blocks; -EINVAL for k out of range. */
int  io_shard_reader_chunk_blocks(struct io_shard_reader *r, uint32_t k, const uint8_t **out);
/* What batches read through this reader since it was opened. */
struct io_read_stats {
	uint64_t reads;            /* chunk reads issued (whole or partial) */
	uint64_t partial_reads;    /* of which read only a run of blocks */
	uint64_t bytes;            /* bytes read for chunks (4 KiB-rounded lengths) */
	uint64_t blocks_checked;   /* block hashes compared */
	uint64_t table_bytes;      /* bytes read for the block table */
};
void io_shard_reader_stats(const struct io_shard_reader *r, struct io_read_stats *out);
void io_shard_reader_close(struct io_shard_reader *r);

enum io_read_flags {
	/* Also check every block hash of the chunk against the block table (after the
	 * chunk's own hash): what a verify of the whole file does. */
	IO_READ_CHECK_BLOCKS = 1u << 0,
};

/* One chunk to read, and where its raw bytes go. */
struct io_read_req {
	struct io_shard_reader *reader;
	uint32_t chunk;
	void    *arg;                 /* passed back to the callback */
	/* The raw bytes of the chunk wanted: [lo, hi) (hi 0: all of them). When the
	 * chunk has block hashes and the range needs fewer than all its blocks, only
	 * the run of blocks covering it is read (one I/O) and each block is checked
	 * against the block table. */
	uint64_t lo, hi;
	unsigned flags;               /* enum io_read_flags */
};
/* Called once per request, in completion order, with verified raw bytes (valid only
 * during the call): raw holds the chunk's raw bytes [off, off + len), the whole chunk
 * or a run of whole blocks that covers [lo, hi). A non-zero return stops the batch
 * and is returned. */
typedef int (*io_chunk_cb)(void *arg, const struct io_read_req *req, uint64_t off,
                           const void *raw, size_t len);
/* Read the chunks with up to the engine's depth in flight (over any number of files),
 * verify each hash after decompression (or each block hash read), and hand each to
 * cb. Errors: CKPT_ECORRUPT (names tensor, chunk, block when it is one, file and
 * offset), -EINVAL (a bad request), -EIO, or cb's return. Buffers always return to
 * the pool. */
int io_read_batch(struct io_engine *e, const struct io_read_req *reqs, size_t n,
                  io_chunk_cb cb);

#endif /* CKPT_IO_H */
