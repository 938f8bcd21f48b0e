/*
 * gpu.c — glue for the public CUDA entry points of include/ckpt/cuda.h. They are
 * compiled into every build, so that libckpt.so exports the same symbols with or
 * without CUDA: a cudaEvent_t is a struct CUevent_st pointer and a cudaStream_t a
 * struct CUstream_st pointer, which C can name without the CUDA headers.
 */
#include <errno.h>

#include "glue.h"
#include "snapshot/snapshot.h"

#ifdef CKPT_HAVE_CUDA
#include "ckpt/cuda.h"
#else
struct CUevent_st;
struct CUstream_st;
CKPT_API int ckpt_cuda_available(const ckpt_ctx *c);
CKPT_API int ckpt_save_snapshot_event(ckpt_save *s, struct CUevent_st **ev);
CKPT_API int ckpt_save_set_stream(ckpt_save *s, struct CUstream_st *stream);
#endif

int ckpt_cuda_available(const ckpt_ctx *c)
{
	if (!c)
		return ckpt_err(-EINVAL, "ckpt_cuda_available: context is NULL");
	return snapshot_has_device(c->snap) ? 1 : 0;
}

int ckpt_save_set_stream(ckpt_save *s, struct CUstream_st *stream)
{
	if (!s)
		return ckpt_err(-EINVAL, "ckpt_save_set_stream: save handle is NULL");
	/* s->state is the worker's once queued: read under the lock. */
	pthread_mutex_lock(&s->ctx->lock);
	bool open = s->state == SAVE_OPEN;
	pthread_mutex_unlock(&s->ctx->lock);
	if (!open)
		return ckpt_err(CKPT_ESTATE, "save of step %llu was already submitted: its stream "
		                "is set before ckpt_save_submit", (unsigned long long)s->step);
	/* Only kept: the event is recorded on it at submit (lib/save.c), when the save
	 * has device tensors; without CUDA there are none, and nothing is recorded. */
	s->order_stream = stream;
	return 0;
}

int ckpt_save_snapshot_event(ckpt_save *s, struct CUevent_st **ev)
{
	if (!s || !ev)
		return ckpt_err(-EINVAL, "ckpt_save_snapshot_event: NULL argument");
	*ev = NULL;
	ckpt_ctx *c = s->ctx;
	int rc = 0;
	/* s->state is the worker's once queued: read under the lock. */
	pthread_mutex_lock(&c->lock);
	if (s->state == SAVE_OPEN)
		rc = ckpt_err(CKPT_ESTATE, "save of step %llu was not submitted",
		              (unsigned long long)s->step);
	else if (!snapshot_has_device(c->snap))
		rc = ckpt_err(CKPT_ENODEV, "save of step %llu: no snapshot event without a CUDA "
		              "device (libckpt built without CUDA, or no device found at open)",
		              (unsigned long long)s->step);
	if (rc) {
		pthread_mutex_unlock(&c->lock);
		return rc;
	}
	/* Until the worker has issued the last copy: at once when the state fits in
	 * the pool, else as long as the part that does not fit takes (cuda.h). */
	while (!s->snapshot_issued && s->state != SAVE_DONE)
		pthread_cond_wait(&c->cond, &c->lock);
	if (s->snapshot_issued && s->snapshot_event) {
		*ev = s->snapshot_event;
	} else if (s->state == SAVE_DONE && s->rc) {
		rc = s->rc;
		ckpt_err_restore(s->msg);
	} else {
		rc = ckpt_err(CKPT_ESTATE, "save of step %llu ended without a snapshot event",
		              (unsigned long long)s->step);
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int ckpt_gds_stats(const ckpt_ctx *c, struct ckpt_gds_stats *st)
{
	if (!c || !st || st->size < sizeof *st)
		return ckpt_err(-EINVAL, "ckpt_gds_stats: NULL argument or size %zu < %zu",
		                st ? st->size : 0, sizeof *st);
	uint64_t v[5];
	snapshot_gds_counters(c->snap, v);
	st->active = snapshot_gds_on(c->snap) ? 1 : 0;
	st->chunks_read = v[0];
	st->bytes_read = v[1];
	st->chunks_written = v[2];
	st->bytes_written = v[3];
	st->files_refused = v[4];
	return 0;
}
