/*
 * gds.c — GPUDirect Storage (cuFile) for loads into device memory and for
 * synchronous saves of device memory (docs/gpu.md "GPUDirect Storage").
 *
 * Optional and never the only path: snapshot_gds_enable loads libcufile at run time
 * (dlopen: a libckpt built here runs where cuFile is not installed, and CI compiles
 * this file without cufile.h), opens its driver, and from then on loads of raw
 * chunks into device memory and synchronous device saves may use it. Anything
 * missing — the library, the driver, a file system it refuses — leaves the pinned
 * path in charge.
 *
 * Verification is not given up. cuFile moves bytes between the file and device
 * memory, where the host cannot hash them, and libckpt hashes with XXH3 on the host
 * (no device implementation of it exists in our dependencies). So every chunk GDS
 * reads is also copied device-to-host into a pool buffer and hashed there before any
 * of its bytes reach the caller; every chunk GDS writes was hashed from the same
 * pool copy the save pipeline makes anyway. The device-to-host copy runs at copy-
 * engine speed (tens of GB/s, far above any disk), so the disk stays the bound.
 *
 * cuFile's C ABI is declared here from NVIDIA's public cuFile API reference (the
 * few types and functions we call); tests/gpu/test_gds_abi.c checks the layouts
 * against cufile.h wherever that header is installed.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "snapshot/gds_abi.h"
#include "snapshot/snapshot_internal.h"

#define GDS_WORKERS 4u          /* cuFile reads in flight (each is synchronous) */

struct snap_gds {
	void *lib;
	gds_status_t (*driver_open)(void);
	gds_status_t (*driver_close)(void);
	gds_status_t (*handle_register)(gds_handle_t *fh, gds_descr_t *d);
	void         (*handle_deregister)(gds_handle_t fh);
	ssize_t      (*read)(gds_handle_t fh, void *buf, size_t n, off_t off, off_t buf_off);
	ssize_t      (*write)(gds_handle_t fh, const void *buf, size_t n, off_t off,
	                      off_t buf_off);
	pthread_mutex_t lock;        /* the counters */
	uint64_t chunks_read, bytes_read, chunks_written, bytes_written, files_refused;
};

static void gds_unload(struct snap_gds *g)
{
	if (g->lib)
		dlclose(g->lib);
	pthread_mutex_destroy(&g->lock);
	ckpt_free(g);
}

static void *sym(struct snap_gds *g, const char *a, const char *b)
{
	void *p = dlsym(g->lib, a);
	return p || !b ? p : dlsym(g->lib, b);
}

int snapshot_gds_enable(struct snapshot *sn)
{
	if (!sn->device)
		return ckpt_err(CKPT_ENODEV, "GPUDirect Storage: no CUDA device in this context");
	if (sn->gds)
		return 0;
	struct snap_gds *g = ckpt_calloc(1, sizeof *g);
	if (!g)
		return ckpt_err(-ENOMEM, "GPUDirect Storage state");
	pthread_mutex_init(&g->lock, NULL);
	const char *names[] = { "libcufile.so.0", "libcufile.so" };
	for (size_t i = 0; i < 2 && !g->lib; i++)
		g->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!g->lib) {
		int rc = ckpt_err(-ENOENT, "GPUDirect Storage: libcufile not found (%s)", dlerror());
		gds_unload(g);
		return rc;
	}
	/* cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 in newer releases. */
	*(void **)&g->driver_open = sym(g, "cuFileDriverOpen", NULL);
	*(void **)&g->driver_close = sym(g, "cuFileDriverClose_v2", "cuFileDriverClose");
	*(void **)&g->handle_register = sym(g, "cuFileHandleRegister", NULL);
	*(void **)&g->handle_deregister = sym(g, "cuFileHandleDeregister", NULL);
	*(void **)&g->read = sym(g, "cuFileRead", NULL);
	*(void **)&g->write = sym(g, "cuFileWrite", NULL);
	if (!g->driver_open || !g->driver_close || !g->handle_register || !g->handle_deregister ||
	    !g->read || !g->write) {
		int rc = ckpt_err(-ENOENT, "GPUDirect Storage: libcufile lacks a cuFile function");
		gds_unload(g);
		return rc;
	}
	gds_status_t st = g->driver_open();
	if (st.err != GDS_SUCCESS) {
		int rc = ckpt_err(-EIO, "GPUDirect Storage: cuFileDriverOpen failed (cuFile error "
		                  "%d, CUDA driver error %d)", st.err, st.cu_err);
		gds_unload(g);
		return rc;
	}
	sn->gds = g;
	return 0;
}

void snap_gds_destroy(struct snapshot *sn)
{
	if (!sn->gds)
		return;
	sn->gds->driver_close();
	gds_unload(sn->gds);
	sn->gds = NULL;
}

bool snapshot_gds_on(const struct snapshot *sn)
{
	return sn && sn->gds;
}

void snapshot_gds_counters(struct snapshot *sn, uint64_t out[5])
{
	memset(out, 0, 5 * sizeof *out);
	struct snap_gds *g = sn ? sn->gds : NULL;
	if (!g)
		return;
	pthread_mutex_lock(&g->lock);
	out[0] = g->chunks_read;
	out[1] = g->bytes_read;
	out[2] = g->chunks_written;
	out[3] = g->bytes_written;
	out[4] = g->files_refused;
	pthread_mutex_unlock(&g->lock);
}

static void count(struct snap_gds *g, bool wr, uint64_t bytes)
{
	pthread_mutex_lock(&g->lock);
	if (wr) {
		g->chunks_written++;
		g->bytes_written += bytes;
	} else {
		g->chunks_read++;
		g->bytes_read += bytes;
	}
	pthread_mutex_unlock(&g->lock);
}

/* ------------------------------------------------------------------ files */

struct gds_file {
	int fd;
	gds_handle_t fh;
};

/* cuFile gets a descriptor of its own (O_DIRECT, and readable: it refuses the
 * writer's write-only one); writes through it reach the same file, which the
 * writer's fdatasync makes durable like its own. */
static int gds_file_open(struct snap_gds *g, const char *path, bool wr, struct gds_file *f)
{
	f->fh = NULL;
	int mode = wr ? O_RDWR : O_RDONLY;
	f->fd = open(path, mode | O_DIRECT | O_CLOEXEC);
	if (f->fd < 0)
		f->fd = open(path, mode | O_CLOEXEC);
	if (f->fd < 0)
		return ckpt_err(-errno, "GPUDirect Storage: open %s: %s", path, strerror(errno));
	gds_descr_t d;
	memset(&d, 0, sizeof d);
	d.type = GDS_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = f->fd;
	gds_status_t st = g->handle_register(&f->fh, &d);
	if (st.err != GDS_SUCCESS) {
		close(f->fd);
		f->fd = -1;
		pthread_mutex_lock(&g->lock);
		g->files_refused++;
		pthread_mutex_unlock(&g->lock);
		return ckpt_err(-EOPNOTSUPP, "GPUDirect Storage: cuFileHandleRegister %s failed "
		                "(cuFile error %d)", path, st.err);
	}
	return 0;
}

static void gds_file_close(struct snap_gds *g, struct gds_file *f)
{
	if (f->fh)
		g->handle_deregister(f->fh);
	if (f->fd >= 0)
		close(f->fd);
	f->fh = NULL;
	f->fd = -1;
}

/* ------------------------------------------------------------------ load */

/* One chunk read, verified, waiting for the main thread's callback. */
struct gds_item {
	size_t   req;
	unsigned buf;                /* pool buffer holding the verified host copy */
	size_t   len;
};

struct gds_batch {
	struct snapshot *sn;
	struct io_pool *pool;
	const struct io_read_req *reqs;
	size_t n;
	/* files: one per distinct reader, opened on first use */
	struct io_shard_reader **readers;
	struct gds_file *files;
	size_t nfiles;

	pthread_mutex_t lock;
	pthread_cond_t  cond;
	size_t next;                 /* next request to read */
	bool   stop;                 /* an error, or the callback failed */
	int    rc;                   /* first error (a worker's) */
	char   msg[1024];            /* its message: messages are per thread */
	struct gds_item done[GDS_WORKERS];
	bool   ready[GDS_WORKERS];   /* done[w] holds a chunk for the main thread */
	size_t staged_max;           /* device staging bytes per worker */
};

struct gds_worker {
	struct gds_batch *b;
	unsigned id;
	pthread_t th;
	uint8_t *stage;              /* device memory */
	cudaStream_t stream;
	int rc;
};

static void batch_fail(struct gds_batch *b, int rc)
{
	pthread_mutex_lock(&b->lock);
	if (!b->rc) {
		b->rc = rc;
		snprintf(b->msg, sizeof b->msg, "%s", ckpt_err_msg());
	}
	b->stop = true;
	pthread_cond_broadcast(&b->cond);
	pthread_mutex_unlock(&b->lock);
}

/* The registration of r's file (opened before the workers start). */
static struct gds_file *batch_file(struct gds_batch *b, const struct io_shard_reader *r)
{
	for (size_t i = 0; i < b->nfiles; i++)
		if (b->readers[i] == r)
			return &b->files[i];
	return NULL;
}

static int read_one(struct gds_worker *w, size_t i, struct gds_item *it)
{
	struct gds_batch *b = w->b;
	struct snap_gds *g = b->sn->gds;
	const struct io_read_req *q = &b->reqs[i];
	const struct io_shard_index *ix = io_shard_reader_index(q->reader);
	const char *path = io_shard_reader_path(q->reader);
	const struct io_chunk_entry *c = &ix->chunks[q->chunk];
	const char *tname = ix->tensors[c->tensor].name;
	unsigned long long off = (unsigned long long)c->file_offset;
	struct gds_file *f = batch_file(b, q->reader);
	if (!f)
		return ckpt_err(-EINVAL, "GPUDirect Storage: %s was not opened", path);
	size_t len = (size_t)c->raw_len;
	size_t alen = (len + CKPT_ALIGN - 1) & ~(size_t)(CKPT_ALIGN - 1);
	ssize_t got = g->read(f->fh, w->stage, alen, (off_t)c->file_offset, 0);
	if (got < 0)
		return ckpt_err(-EIO, "tensor '%s' chunk %u (file %s, offset %llu): cuFileRead "
		                "failed (%zd)", tname, q->chunk, path, off, got);
	if ((size_t)got < len)
		return ckpt_err(CKPT_ECORRUPT, "tensor '%s' chunk %u (file %s, offset %llu): short "
		                "read, %zd of %zu bytes", tname, q->chunk, path, off, got, len);
	int buf = io_pool_get(b->pool, -1);
	if (buf < 0)
		return ckpt_err(buf, "GPUDirect Storage: pool buffer for chunk %u", q->chunk);
	uint8_t *host = io_pool_addr(b->pool, (unsigned)buf);
	cudaError_t e = cudart.MemcpyAsync(host, w->stage, len, cudaMemcpyDeviceToHost, w->stream);
	if (e == cudaSuccess)
		e = cudart.StreamSynchronize(w->stream);
	if (e != cudaSuccess) {
		io_pool_put(b->pool, (unsigned)buf);
		return snap_cuda_err(e, "tensor '%s' chunk %u: copy for verification", tname,
		                     q->chunk);
	}
	uint8_t h[CKPT_HASH_BYTES];
	io_index_chunk_hash(ix, host, len, h);
	if (memcmp(h, c->hash, CKPT_HASH_BYTES)) {
		io_pool_put(b->pool, (unsigned)buf);
		return ckpt_err(CKPT_ECORRUPT, "tensor '%s' chunk %u (file %s, offset %llu): hash "
		                "mismatch", tname, q->chunk, path, off);
	}
	count(g, false, len);
	it->req = i;
	it->buf = (unsigned)buf;
	it->len = len;
	return 0;
}

static void *worker_main(void *arg)
{
	struct gds_worker *w = arg;
	struct gds_batch *b = w->b;
	int dev = b->sn->home;
	cudaError_t e = cudart.SetDevice(dev);
	if (e != cudaSuccess) {
		batch_fail(b, snap_cuda_err(e, "GPUDirect Storage: select device %d", dev));
		return NULL;
	}
	for (;;) {
		pthread_mutex_lock(&b->lock);
		/* One chunk at a time per worker: wait until the main thread took the last. */
		while (b->ready[w->id] && !b->stop)
			pthread_cond_wait(&b->cond, &b->lock);
		if (b->stop || b->next >= b->n) {
			pthread_mutex_unlock(&b->lock);
			return NULL;
		}
		size_t i = b->next++;
		pthread_mutex_unlock(&b->lock);
		struct gds_item it;
		int rc = read_one(w, i, &it);
		if (rc) {
			batch_fail(b, rc);
			return NULL;
		}
		pthread_mutex_lock(&b->lock);
		b->done[w->id] = it;
		b->ready[w->id] = true;
		pthread_cond_broadcast(&b->cond);
		pthread_mutex_unlock(&b->lock);
	}
}

int snapshot_gds_read_batch(struct snapshot *sn, struct io_pool *pool,
                            const struct io_read_req *reqs, size_t n, io_chunk_cb cb)
{
	if (!sn || !sn->gds)
		return ckpt_err(-ENOTSUP, "GPUDirect Storage is not enabled");
	if (!n)
		return 0;
	struct gds_batch b = { .sn = sn, .pool = pool, .reqs = reqs, .n = n };
	for (size_t i = 0; i < n; i++) {
		const struct io_shard_index *ix = io_shard_reader_index(reqs[i].reader);
		const struct io_chunk_entry *c = &ix->chunks[reqs[i].chunk];
		if (c->codec != IO_CODEC_RAW || c->stored_len != c->raw_len)
			return ckpt_err(-ENOTSUP, "GPUDirect Storage: chunk %u of %s is compressed",
			                reqs[i].chunk, io_shard_reader_path(reqs[i].reader));
		size_t a = ((size_t)c->raw_len + CKPT_ALIGN - 1) & ~(size_t)(CKPT_ALIGN - 1);
		if (a > b.staged_max)
			b.staged_max = a;
	}
	if (b.staged_max > io_pool_buf_bytes(pool))
		return ckpt_err(-EINVAL, "GPUDirect Storage: a chunk of %zu bytes exceeds the pool's "
		                "buffers (%zu)", b.staged_max, io_pool_buf_bytes(pool));
	b.readers = ckpt_calloc(n, sizeof *b.readers);
	b.files = ckpt_calloc(n, sizeof *b.files);
	unsigned nw = n < GDS_WORKERS ? (unsigned)n : GDS_WORKERS;
	struct gds_worker w[GDS_WORKERS];
	memset(w, 0, sizeof w);
	int rc = 0;
	if (!b.readers || !b.files) {
		ckpt_free(b.readers);
		ckpt_free(b.files);
		return ckpt_err(-ENOMEM, "GPUDirect Storage batch of %zu chunks", n);
	}
	/* Every file first: one that cuFile refuses sends the whole batch back to the
	 * pinned path (-EOPNOTSUPP) before anything was read. */
	for (size_t i = 0; i < n && !rc; i++) {
		if (batch_file(&b, reqs[i].reader))
			continue;
		b.readers[b.nfiles] = reqs[i].reader;
		rc = gds_file_open(sn->gds, io_shard_reader_path(reqs[i].reader), false,
		                   &b.files[b.nfiles]);
		if (!rc)
			b.nfiles++;
	}
	if (rc) {
		for (size_t i = 0; i < b.nfiles; i++)
			gds_file_close(sn->gds, &b.files[i]);
		ckpt_free(b.readers);
		ckpt_free(b.files);
		return rc;
	}
	pthread_mutex_init(&b.lock, NULL);
	ckpt_cond_init(&b.cond);
	unsigned started = 0;
	for (unsigned k = 0; k < nw && !rc; k++) {
		w[k].b = &b;
		w[k].id = k;
		cudaError_t e = cudart.Malloc((void **)&w[k].stage, b.staged_max);
		if (e == cudaSuccess)
			e = cudart.StreamCreateWithFlags(&w[k].stream, cudaStreamNonBlocking);
		if (e != cudaSuccess) {
			rc = snap_cuda_err(e, "GPUDirect Storage: staging buffer of %zu bytes",
			                   b.staged_max);
			break;
		}
		if ((rc = -ckpt_thread_create(&w[k].th, NULL, worker_main, &w[k])))
			rc = ckpt_err(rc, "GPUDirect Storage: start a reader thread");
		else
			started++;
	}
	if (rc)
		batch_fail(&b, rc);
	/* The callbacks run here, one at a time, in completion order (like io_read_batch). */
	size_t delivered = 0;
	while (delivered < n) {
		pthread_mutex_lock(&b.lock);
		unsigned k = 0;
		for (;;) {
			for (k = 0; k < started && !b.ready[k]; k++)
				;
			if (k < started || b.stop)
				break;
			pthread_cond_wait(&b.cond, &b.lock);
		}
		if (k == started) {            /* stopped, nothing left to hand out */
			pthread_mutex_unlock(&b.lock);
			break;
		}
		struct gds_item it = b.done[k];
		if (b.stop) {                  /* after a failure: give it back unread */
			b.ready[k] = false;
			pthread_cond_broadcast(&b.cond);
			pthread_mutex_unlock(&b.lock);
			io_pool_put(pool, it.buf);
			continue;
		}
		pthread_mutex_unlock(&b.lock);
		uint8_t *host = io_pool_addr(pool, it.buf);
		sn->mirror_host = host;
		sn->mirror_dev = w[k].stage;
		sn->mirror_len = it.len;
		int crc = cb(reqs[it.req].arg, &reqs[it.req], 0, host, it.len);
		sn->mirror_len = 0;
		sn->mirror_host = sn->mirror_dev = NULL;
		io_pool_put(pool, it.buf);
		pthread_mutex_lock(&b.lock);
		b.ready[k] = false;
		if (crc && !b.rc) {
			b.rc = crc;
			snprintf(b.msg, sizeof b.msg, "%s", ckpt_err_msg());
		}
		if (crc)
			b.stop = true;
		pthread_cond_broadcast(&b.cond);
		pthread_mutex_unlock(&b.lock);
		delivered++;
	}
	pthread_mutex_lock(&b.lock);
	b.stop = true;
	pthread_cond_broadcast(&b.cond);
	pthread_mutex_unlock(&b.lock);
	for (unsigned k = 0; k < started; k++)
		pthread_join(w[k].th, NULL);
	/* A worker that stopped with a verified chunk still holds its pool buffer. */
	for (unsigned k = 0; k < started; k++)
		if (b.ready[k])
			io_pool_put(pool, b.done[k].buf);
	for (unsigned k = 0; k < nw; k++) {
		if (w[k].stream)
			cudart.StreamDestroy(w[k].stream);
		if (w[k].stage)
			cudart.Free(w[k].stage);
	}
	for (size_t i = 0; i < b.nfiles; i++)
		gds_file_close(sn->gds, &b.files[i]);
	ckpt_free(b.readers);
	ckpt_free(b.files);
	pthread_cond_destroy(&b.cond);
	pthread_mutex_destroy(&b.lock);
	rc = b.rc;
	if (rc)
		ckpt_err_restore(b.msg);
	return rc;
}

/* ------------------------------------------------------------------ save */

/* A shard file open for cuFile writes: GDS_WORKERS threads take queued writes, so
 * that several are in flight (each cuFileWrite is synchronous). */
#define GDS_WQ 16u

struct gds_wjob {
	const void *src;
	size_t n;
	uint64_t off;
};

struct gds_wfile {
	struct snapshot *sn;
	struct gds_file f;
	char *path;
	pthread_t th[GDS_WORKERS];
	unsigned nth;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct gds_wjob q[GDS_WQ];
	unsigned head, count, busy;
	bool stop;
	int rc;                      /* first failure */
	char msg[1024];
};

static int wfile_one(struct gds_wfile *wf, const struct gds_wjob *j)
{
	struct snap_gds *g = wf->sn->gds;
	ssize_t put = g->write(wf->f.fh, j->src, j->n, (off_t)j->off, 0);
	if (put < 0 || (size_t)put != j->n)
		return ckpt_err(put < 0 ? -EIO : -ENOSPC, "%s: cuFileWrite of %zu bytes at offset "
		                "%llu wrote %zd", wf->path, j->n, (unsigned long long)j->off, put);
	count(g, true, j->n);
	return 0;
}

static void *wfile_main(void *arg)
{
	struct gds_wfile *wf = arg;
	cudaError_t e = cudart.SetDevice(wf->sn->home);
	pthread_mutex_lock(&wf->lock);
	if (e != cudaSuccess && !wf->rc) {
		wf->rc = snap_cuda_err(e, "GPUDirect Storage: select device %d", wf->sn->home);
		snprintf(wf->msg, sizeof wf->msg, "%s", ckpt_err_msg());
	}
	for (;;) {
		while (!wf->count && !wf->stop)
			pthread_cond_wait(&wf->cond, &wf->lock);
		if (!wf->count)
			break;
		struct gds_wjob j = wf->q[wf->head];
		wf->head = (wf->head + 1) % GDS_WQ;
		wf->count--;
		wf->busy++;
		bool skip = wf->rc != 0;     /* after a failure the rest is not written */
		pthread_cond_broadcast(&wf->cond);
		pthread_mutex_unlock(&wf->lock);
		int rc = skip ? 0 : wfile_one(wf, &j);
		pthread_mutex_lock(&wf->lock);
		wf->busy--;
		if (rc && !wf->rc) {
			wf->rc = rc;
			snprintf(wf->msg, sizeof wf->msg, "%s", ckpt_err_msg());
		}
		pthread_cond_broadcast(&wf->cond);
	}
	pthread_mutex_unlock(&wf->lock);
	return NULL;
}

int snapshot_gds_file_open(struct snapshot *sn, const char *path, void **out)
{
	*out = NULL;
	if (!sn || !sn->gds)
		return ckpt_err(-ENOTSUP, "GPUDirect Storage is not enabled");
	struct gds_wfile *wf = ckpt_calloc(1, sizeof *wf);
	if (!wf || !(wf->path = ckpt_strdup(path))) {
		ckpt_free(wf);
		return ckpt_err(-ENOMEM, "GPUDirect Storage file %s", path);
	}
	wf->sn = sn;
	int rc = gds_file_open(sn->gds, path, true, &wf->f);
	if (rc) {
		ckpt_free(wf->path);
		ckpt_free(wf);
		return rc;
	}
	pthread_mutex_init(&wf->lock, NULL);
	ckpt_cond_init(&wf->cond);
	for (unsigned k = 0; k < GDS_WORKERS; k++) {
		if ((rc = ckpt_thread_create(&wf->th[k], NULL, wfile_main, wf))) {
			rc = ckpt_err(-rc, "GPUDirect Storage: start a writer thread");
			break;
		}
		wf->nth++;
	}
	if (rc) {
		snapshot_gds_file_close(sn, wf);
		return rc;
	}
	*out = wf;
	return 0;
}

int snapshot_gds_write(void *file, const void *src, size_t n, uint64_t off)
{
	struct gds_wfile *wf = file;
	pthread_mutex_lock(&wf->lock);
	while (wf->count == GDS_WQ && !wf->rc)
		pthread_cond_wait(&wf->cond, &wf->lock);
	int rc = wf->rc;
	if (rc) {
		ckpt_err_restore(wf->msg);
	} else {
		wf->q[(wf->head + wf->count) % GDS_WQ] = (struct gds_wjob){ src, n, off };
		wf->count++;
		pthread_cond_broadcast(&wf->cond);
	}
	pthread_mutex_unlock(&wf->lock);
	return rc;
}

int snapshot_gds_file_close(struct snapshot *sn, void *file)
{
	struct gds_wfile *wf = file;
	if (!wf)
		return 0;
	pthread_mutex_lock(&wf->lock);
	wf->stop = true;                 /* the workers finish the queue, then leave */
	pthread_cond_broadcast(&wf->cond);
	pthread_mutex_unlock(&wf->lock);
	for (unsigned k = 0; k < wf->nth; k++)
		pthread_join(wf->th[k], NULL);
	int rc = wf->rc;
	if (rc)
		ckpt_err_restore(wf->msg);
	gds_file_close(sn->gds, &wf->f);
	pthread_cond_destroy(&wf->cond);
	pthread_mutex_destroy(&wf->lock);
	ckpt_free(wf->path);
	ckpt_free(wf);
	return rc;
}
