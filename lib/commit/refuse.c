/*
 * refuse.c — telling a job's ranks that their coordinator (or their node's leader)
 * could not start, so that they fail within seconds with its reason instead of
 * retrying a connection until the commit timeout.
 *
 * Rank 0 decides alone whether the coordinator can start (the root's lock, its
 * manifest, its port); every other rank only learns it by connecting. So when rank
 * 0's open fails before the coordinator serves, it listens on the coordinator's
 * address for a while and answers each rank's handshake — after the rank proved the
 * job's secret, so that the reason is told to the job's own ranks only — with a
 * REJECT carrying the cause. A node leader that cannot join the coordinator does the
 * same for its node's ranks. It ends when every rank it expects has been told, or
 * when no rank has come for a while after the last one, or at the deadline.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commit/commit_internal.h"

#define REFUSE_QUIET_MS 1500   /* no new rank for this long after the last one: done */

struct refuser {
	pthread_mutex_t lock;
	bool     *told;           /* [world] */
	uint32_t  ntold;
	uint64_t  last_ns;        /* the last refusal */
	int       code;
	char      why[COMMIT_MAX_REASON];
};

/* Called by the acceptor after the peer proved the secret: refuse, with the cause. */
static int refuse_admit(void *arg, uint32_t rank, const char **why)
{
	struct refuser *r = arg;
	if (!r->told[rank]) {
		r->told[rank] = true;
		r->ntold++;
	}
	r->last_ns = ckpt_now_ns();
	*why = r->why;
	return r->code;
}

void commit_refuse(const struct commit_refuse_opts *o)
{
	struct net_listener *lis = NULL;
	struct commit_acceptor *acc = NULL;
	struct refuser r;
	memset(&r, 0, sizeof r);
	int wake[2] = { -1, -1 };
	/* The cause, as the rank will read it: a code of ours or a negated errno. */
	r.code = o->code < 0 && o->code > -2000 ? o->code : CKPT_EPEER;
	snprintf(r.why, sizeof r.why, "%s", o->why);
	pthread_mutex_init(&r.lock, NULL);
	r.told = ckpt_calloc(o->world, sizeof *r.told);
	if (!r.told || pipe2(wake, O_NONBLOCK | O_CLOEXEC) < 0)
		goto out;
	if (net_listen(o->transport, o->rdma, o->addr, o->port, &lis)) {
		/* Another process has the address (a port in use is often the cause): it
		 * cannot be told through it. */
		ckpt_log(CKPT_LOG_INFO, "%s: cannot tell the ranks why: %s", o->who, ckpt_err_msg());
		goto out;
	}
	struct commit_acceptor_opts ao = {
		.lis = lis, .job_id = o->job_id, .world = o->world, .secret = o->secret,
		.secret_len = o->secret_len, .lock = &r.lock, .admit = refuse_admit, .arg = &r,
		.wake_fd = wake[1], .who = o->who,
	};
	if (commit_acceptor_create(&ao, &acc))
		goto out;
	ckpt_log(CKPT_LOG_WARN, "%s: telling the %u rank(s) that connect within %u ms: %s",
	         o->who, o->expect, o->grace_ms, r.why);
	uint64_t deadline = ckpt_deadline_ms(o->grace_ms);
	for (;;) {
		uint64_t now = ckpt_now_ns();
		pthread_mutex_lock(&r.lock);
		uint32_t told = r.ntold;
		uint64_t last = r.last_ns;
		pthread_mutex_unlock(&r.lock);
		if (told >= o->expect || ckpt_deadline_passed(deadline) ||
		    (told && now - last > (uint64_t)REFUSE_QUIET_MS * 1000000ull))
			break;
		struct pollfd pf[2] = { { .fd = net_listener_fd(lis), .events = POLLIN },
		                        { .fd = wake[0], .events = POLLIN } };
		/* A tick at most, so that the quiet period above is noticed. */
		int left = ckpt_deadline_left_ms(deadline);
		if (poll(pf, 2, left < 0 || left > 100 ? 100 : left) > 0) {
			if (pf[0].revents)
				commit_acceptor_accept(acc);
			if (pf[1].revents) {
				char b[64];
				while (read(wake[0], b, sizeof b) > 0)
					;
			}
		}
		/* An admitted connection is never taken: the admit callback refuses all. */
	}
out:
	commit_acceptor_free(acc);     /* breaks handshakes still running, waits for them */
	net_listener_close(lis);
	if (wake[0] >= 0) {
		close(wake[0]);
		close(wake[1]);
	}
	ckpt_free(r.told);
	pthread_mutex_destroy(&r.lock);
}
