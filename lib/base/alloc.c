/*
 * alloc.c — libckpt's allocation wrappers: libc's allocator behind one hook, so
 * that the allocation-failure loop (tests/api/test_alloc_fail.c) can fail the Nth
 * allocation of a save, a load or a commit and check that each failure path ends
 * in a clean error and leaks nothing. The hook and its counters live with the
 * fault table (fault.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

/* A block returned to the caller counts as live until ckpt_free. */
static void *alloc_done(void *p)
{
	if (p)
		ckpt_fault_alloc_note(1);
	return p;
}

void *ckpt_malloc(size_t n)
{
	if (ckpt_fault_alloc_fail()) {
		errno = ENOMEM;
		return NULL;
	}
	return alloc_done(malloc(n));
}

void *ckpt_calloc(size_t count, size_t n)
{
	if (ckpt_fault_alloc_fail()) {
		errno = ENOMEM;
		return NULL;
	}
	return alloc_done(calloc(count, n));
}

/* A failure leaves p allocated and unchanged, as realloc's does. */
void *ckpt_realloc(void *p, size_t n)
{
	if (ckpt_fault_alloc_fail()) {
		errno = ENOMEM;
		return NULL;
	}
	void *q = realloc(p, n);
	if (!p)
		return alloc_done(q);
	if (!q && !n)
		ckpt_fault_alloc_note(-1);   /* glibc's realloc(p, 0) frees p */
	return q;
}

void *ckpt_aligned_alloc(size_t align, size_t n)
{
	if (ckpt_fault_alloc_fail()) {
		errno = ENOMEM;
		return NULL;
	}
	return alloc_done(aligned_alloc(align, n));
}

/* posix_memalign's contract: the error is returned, errno is left alone. */
int ckpt_posix_memalign(void **out, size_t align, size_t n)
{
	if (ckpt_fault_alloc_fail())
		return ENOMEM;
	int rc = posix_memalign(out, align, n);
	if (!rc)
		alloc_done(*out);
	return rc;
}

char *ckpt_strdup(const char *s)
{
	if (ckpt_fault_alloc_fail()) {
		errno = ENOMEM;
		return NULL;
	}
	return alloc_done(strdup(s));
}

void ckpt_free(void *p)
{
	if (p)
		ckpt_fault_alloc_note(-1);
	free(p);
}
