/*
 * ranks.c — the reshard job: the parent reads the plan, refuses what cannot
 * succeed, forks the N rank processes (rank r of N, coordinator on a loopback port
 * under a job id and secret of the run's own), gathers their progress and reports;
 * each rank process opens the source read-only, adds its new box of every item as a
 * streamed source (readahead.c) and saves it, rank 0 coordinating the commit.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plan.h"
#include "readahead.h"
#include "toolutil.h"

static int rank_run(const struct reshard_args *a, const struct plan *p, unsigned r, int fd,
                    struct report *rep)
{
	ckpt_ctx *src = NULL, *dst = NULL;
	ckpt_load *l = NULL;
	ckpt_save *s = NULL;
	struct rank_item *ri = calloc(p->n + 1, sizeof *ri);
	size_t nri = 0;
	int rc = ri ? 0 : -ENOMEM;
	const char *stage = "plan";
	/* This rank's share, and its memory. */
	for (size_t i = 0; !rc && i < p->n; i++) {
		struct rank_item *x = &ri[nri];
		x->it = &p->items[i];
		if (!plan_new_box(a, p, x->it, r, x->off, x->ext, &x->saved_rank))
			continue;
		uint64_t len = x->it->blob ? 0 : ckpt_dtype_size(x->it->ti.dtype);
		for (unsigned d = 0; !x->it->blob && d < x->it->ti.ndim; d++)
			len *= x->ext[d];
		x->len = (size_t)len;
		nri++;
		rep->bytes_total += len;
	}
	stage = "open the source";
	if (!rc)
		/* A reader of the source: rank-bound items are named by their saved rank. */
		rc = reshard_open_ctx(a->root, a->manifest_dir, 0, 1, CKPT_OPEN_READONLY, a, &src);
	if (!rc)
		rc = ckpt_load_open(src, p->src_step, &l);
	/* Blobs: their size is known only by asking. */
	for (size_t i = 0; !rc && i < nri; i++) {
		struct rank_item *x = &ri[i];
		if (!x->it->blob)
			continue;
		stage = "read a blob";
		size_t len = 0;
		int q = x->saved_rank >= 0 ?
			ckpt_load_blob_rank(l, x->it->name, x->saved_rank, NULL, 0, &len) :
			ckpt_load_blob(l, x->it->name, NULL, 0, &len);
		if (q && q != -ENOSPC) {
			rc = q;
			break;
		}
		x->len = len;
		rep->bytes_total += len;
	}
	/* Blobs are small: read them now. Tensors are pulled chunk by chunk while the
	 * new shard is written (tensor_fill, fed by the read-ahead), so memory stays
	 * bounded by the two pools, the ring and one chunk of scratch, whatever this
	 * rank's share. */
	for (size_t i = 0; !rc && i < nri; i++) {
		struct rank_item *x = &ri[i];
		if (!x->it->blob)
			continue;
		stage = "read a blob";
		if (!(x->data = malloc(x->len ? x->len : 1))) {
			rc = -ENOMEM;
			break;
		}
		size_t got = 0;
		rc = x->saved_rank >= 0 ?
			ckpt_load_blob_rank(l, x->it->name, x->saved_rank, x->data, x->len, &got) :
			ckpt_load_blob(l, x->it->name, x->data, x->len, &got);
		rep->bytes_done += x->len;
	}
	stage = "open the output";
	if (!rc)
		rc = reshard_open_ctx(a->out, a->out_manifest_dir, (int)r, (int)a->world,
		                      CKPT_OPEN_NO_GC, a, &dst);
	stage = "save";
	if (!rc)
		rc = ckpt_save_begin(dst, a->have_out_step ? a->out_step : p->src_step, &s);
	struct fill_shared shared = { .l = l, .rep = rep, .fd = fd, .items = ri, .nitems = nri,
	                              .window = PF_WINDOW };
	if (a->pool && a->pool / 2 < PF_WINDOW)
		shared.window = a->pool / 2 > PF_WINDOW_MIN ? a->pool / 2 : PF_WINDOW_MIN;
	struct fill_state *fs = calloc(nri + 1, sizeof *fs);
	if (!fs && !rc)
		rc = -ENOMEM;
	stage = "start the read-ahead";
	if (!rc)
		rc = prefetch_start(&shared);
	stage = "save";
	for (size_t i = 0; !rc && i < nri; i++) {
		const struct rank_item *x = &ri[i];
		const struct ckpt_tensor_info *t = &x->it->ti;
		if (x->it->blob) {
			rc = ckpt_save_add_blob(s, t->name, t->kind, t->policy, x->data, x->len);
			continue;
		}
		fs[i] = (struct fill_state){ .sh = &shared, .idx = i };
		struct ckpt_tensor ct = {
			.name = t->name, .kind = t->kind, .dtype = t->dtype, .policy = t->policy,
			.ndim = t->ndim, .global_shape = t->global_shape, .offset = x->off,
			.extent = x->ext, .mem = CKPT_MEM_HOST,
		};
		rc = ckpt_save_add_tensor_source(s, &ct, tensor_fill, &fs[i]);
	}
	if (!rc)
		rc = ckpt_save_submit(s);
	if (!rc)
		rc = ckpt_save_wait(s, -1);
	prefetch_stop(&shared);
	if (rc)
		snprintf(rep->msg, sizeof rep->msg, "rank %u: %s: %s", r, stage,
		         shared.err[0] ? shared.err : ckpt_last_error());
	ckpt_save_free(s);
	free(shared.scratch);
	free(fs);
	ckpt_load_close(l);
	ckpt_close(src);
	ckpt_close(dst);
	for (size_t i = 0; ri && i < nri; i++)
		free(ri[i].data);
	free(ri);
	return rc;
}

/* A free TCP port for the coordinator of the N rank processes. */
static unsigned free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	unsigned port = 0;
	if (s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	    getsockname(s, (struct sockaddr *)&sa, &len) == 0)
		port = ntohs(sa.sin_port);
	if (s >= 0)
		close(s);
	return port;
}


int reshard_run(struct reshard_args *a)
{
	ckpt_ctx *c = NULL;
	ckpt_load *l = NULL;
	struct plan p;
	memset(&p, 0, sizeof p);
	int x = reshard_open_source(a, &c);
	if (x)
		return x;
	int rc = ckpt_load_open(c, a->latest ? CKPT_LATEST : a->step, &l);
	struct ckpt_step_info si;
	if (!rc)
		rc = ckpt_step_info(c, ckpt_load_step(l), &si, sizeof si);
	if (!rc)
		rc = plan_build(l, &p, si.world);
	char msg[1024];
	snprintf(msg, sizeof msg, "%s", rc == -ENOMEM ? "out of memory for the plan" :
	         ckpt_last_error());
	/* No context may be open across fork (the manifest and io_uring do not survive it). */
	ckpt_load_close(l);
	ckpt_close(c);
	if (rc) {
		plan_free(&p);
		return tool_fail(reshard_exit_for(rc), rc, "%s", msg);
	}
	x = plan_preflight(a, &p);
	if (x) {
		plan_free(&p);
		return x;
	}
	if (!a->chunk && p.max_chunk)
		a->chunk = (p.max_chunk + 4095) / 4096 * 4096;
	if (!a->port)
		a->port = free_port();
	/* A job id of this run's own: should another job take the port between
	 * free_port and the coordinator's bind, ranks that reach it are refused as
	 * another job (a specific error) instead of joining it. */
	if (!getenv("CKPT_JOB_ID"))
		snprintf(a->job, sizeof a->job, "ckpt-reshard-%ld-%u", (long)getpid(), a->port);
	/* The job is this run's own: its ranks share a fresh secret, so that nothing
	 * else that reaches the port can join it (the job id alone is guessable). */
	if (tool_job_secret()) {
		plan_free(&p);
		return RX_FAIL;
	}
	int fds[2];
	if (pipe(fds) < 0) {
		rc = -errno;
		plan_free(&p);
		return tool_fail(RX_FAIL, rc, "pipe: %s", strerror(-rc));
	}
	double t0 = tool_now();
	pid_t *pids = calloc(a->world, sizeof *pids);
	struct report *last = calloc(a->world, sizeof *last);
	if (!pids || !last) {
		free(pids);
		free(last);
		close(fds[0]);
		close(fds[1]);
		plan_free(&p);
		return tool_fail(RX_FAIL, -ENOMEM, "out of memory for %u rank processes", a->world);
	}
	unsigned started = 0;
	for (unsigned r = 0; r < a->world; r++, started++) {
		fflush(NULL);
		pids[r] = fork();
		if (pids[r] < 0) {
			fprintf(stderr, "ckpt-reshard: fork: %s\n", strerror(errno));
			break;
		}
		if (pids[r] == 0) {
			close(fds[0]);
			struct report rep;
			memset(&rep, 0, sizeof rep);
			rep.rank = (int)r;
			rep.rc = rank_run(a, &p, r, fds[1], &rep);
			rep.done = 1;
			send_report(fds[1], &rep);
			_exit(rep.rc ? 1 : 0);
		}
	}
	close(fds[1]);
	struct tool_progress pr;
	tool_progress_start(&pr, "reshard", a->quiet || a->json);
	struct report rep;
	while (read(fds[0], &rep, sizeof rep) == (ssize_t)sizeof rep) {
		if (rep.rank < 0 || (unsigned)rep.rank >= a->world)
			continue;
		last[rep.rank] = rep;
		uint64_t done = 0, total = 0;
		for (unsigned r = 0; r < a->world; r++) {
			done += last[r].bytes_done;
			total += last[r].bytes_total;
		}
		tool_progress_update(&pr, done, total);
	}
	tool_progress_end(&pr);
	close(fds[0]);
	int worst = 0;
	for (unsigned r = 0; r < started; r++) {
		int st;
		waitpid(pids[r], &st, 0);
		if (!last[r].done) {
			last[r].rc = -ECHILD;
			snprintf(last[r].msg, sizeof last[r].msg, "rank %u died without a report", r);
		}
		if (last[r].rc && (!worst || last[r].rc == CKPT_ENODEV))
			worst = last[r].rc;
	}
	if (started < a->world && !worst)
		worst = -EAGAIN;
	double dt = tool_now() - t0;
	uint64_t bytes = 0;
	for (unsigned r = 0; r < a->world; r++)
		bytes += last[r].bytes_done;
	uint64_t s2 = a->have_out_step ? a->out_step : p.src_step;
	char b[32];
	x = worst == CKPT_ENODEV ? RX_NODEV : worst == -EEXIST ? RX_EXISTS :
	    worst == CKPT_ENOTROOT ? RX_NOTROOT : worst ? RX_FAIL : RX_OK;
	/* The first failing rank's message stands for the run in the JSON error. */
	msg[0] = '\0';
	for (unsigned r = 0; r < a->world && worst && !msg[0]; r++)
		if (last[r].rc)
			snprintf(msg, sizeof msg, "%s", last[r].msg);
	if (worst && !msg[0])
		snprintf(msg, sizeof msg, "only %u of %u rank processes started", started, a->world);
	if (a->json) {
		printf("{\"op\":\"reshard\",\"ok\":%s,\"from_step\":%" PRIu64 ",\"to_step\":%" PRIu64
		       ",\"source_world\":%u,\"world\":%u,\"out\":", worst ? "false" : "true",
		       p.src_step, s2, p.src_world, a->world);
		tool_json_str(stdout, a->out);
		printf(",\"items\":%zu,\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"ranks\":[", p.n, bytes, dt);
		for (unsigned r = 0; r < a->world; r++) {
			printf("%s{\"rank\":%u,\"ok\":%s,\"bytes\":%" PRIu64, r ? "," : "", r,
			       last[r].rc ? "false" : "true", last[r].bytes_done);
			if (last[r].rc) {
				printf(",\"error\":");
				tool_json_str(stdout, last[r].msg);
			}
			printf("}");
		}
		printf("]");
		if (worst)
			tool_json_fail_fields(stdout, msg, worst, x);
		printf("}\n");
	} else if (!worst) {
		printf("resharded step %" PRIu64 " (world %u) into %s step %" PRIu64 " (world %u): %zu "
		       "items, %s in %.3f s\n", p.src_step, p.src_world, a->out, s2, a->world, p.n,
		       tool_bytes(bytes, b), dt);
	}
	for (unsigned r = 0; r < a->world && worst; r++) {
		if (last[r].rc)
			fprintf(stderr, "ckpt-reshard: %s\n", last[r].msg);
	}
	if (worst == CKPT_ENODEV)
		fprintf(stderr, "ckpt-reshard: saving with %u ranks needs the distributed commit, which "
		        "this build does not have yet\n", a->world);
	free(pids);
	free(last);
	plan_free(&p);
	return x;
}
