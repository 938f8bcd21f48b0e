/*
 * leader.c — a node leader of the hierarchical commit (docs/protocol.md
 * §2.8): one process per node (local rank 0) stands between the node's ranks and
 * the coordinator, so that the coordinator exchanges messages with one connection
 * per node instead of one per rank.
 *
 * Upward, the leader forwards each of its ranks' BEGIN, PREPARE and ABORT as soon
 * as it arrives, tagged with the rank (RELAYED): votes are forwarded, not
 * aggregated, so the coordinator still decodes and checks every vote as it comes
 * (gather.c) and alone decides. Downward, a DECISION arrives once for the node and
 * goes to every connected rank of it; a reply for one rank (TO_RANK) goes to that
 * rank. The node's ranks speak the ordinary participant protocol to the leader
 * (participant.c is unchanged), over a unix socket whose name every rank derives
 * from the job (commit_leader_addr): no service to discover.
 *
 * Checks: a rank joins only from a process of our user or root (the socket is
 * abstract, so any local user could reach it), only with the job's secret (the
 * same handshake as the coordinator's) and only if it belongs to this node; its
 * messages must decode and a vote must be its own, else its connection is closed,
 * which the coordinator hears as RANK_GONE: the same outcome as a rank dropped by
 * the coordinator itself. The coordinator checks the leader in turn (coordinator.c).
 *
 * Failures (presumed abort holds): a rank that leaves is reported upward at once
 * (RANK_GONE), so its steps abort if it had not voted. A leader that loses the
 * coordinator closes every rank's connection: those that voted report
 * CKPT_EINDOUBT, the others CKPT_EABORTED, exactly as if they had lost the
 * coordinator; later ranks are refused. A leader that dies is seen by the
 * coordinator as the loss of all its ranks, and by its ranks as the loss of the
 * coordinator.
 *
 * Threads: one loop thread owns the upstream connection and the ranks'
 * connections; handshakes run on threads of accept.c. local[] is written by the
 * loop under lock and read by handshake threads under lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "commit/commit_internal.h"

#define SEND_TIMEOUT_MS 5000

struct commit_leader {
	char                *job_id;
	void                *secret;
	size_t               secret_len;
	uint32_t             rank, world, node, first, n;
	char                 name[96];          /* "node leader of node 3 (ranks 24..31)" */
	struct net_conn     *up;                /* to the coordinator; loop thread only */
	struct net_listener *lis;
	struct commit_acceptor *acc;
	pthread_t            thread;
	bool                 thread_started;
	int                  wake[2];

	pthread_mutex_t      lock;
	struct net_conn    **local;             /* [n]: rank first+i's connection */
	struct pollfd       *pf;                /* [n + 3], the loop's; allocated by start, */
	uint32_t            *who;               /* so that a loop that cannot run never listens */
	bool                 up_lost;           /* no coordinator: refuse ranks */
	bool                 stop;
};

void commit_leader_addr(char *out, size_t cap, const char *job_id, unsigned port,
                        uint32_t first)
{
	/* The job id may be long and hold any byte: its hash keeps the name short and
	 * printable; the coordinator's port tells two jobs of one id apart, the node's
	 * first rank the nodes of one job run on one machine (tests). */
	snprintf(out, cap, "@libckpt-%016llx-%u-%u",
	         (unsigned long long)XXH3_64bits(job_id, strlen(job_id)), port, first);
}

/* ------------------------------------------------------------------ handshakes */

/* Under l->lock (accept.c): only this node's ranks, once each, while the
 * coordinator is there to relay to. */
static int leader_admit(void *arg, uint32_t rank, const char **why)
{
	struct commit_leader *l = arg;
	if (rank < l->first || rank - l->first >= l->n) {
		*why = "that rank does not belong to this node leader's node";
		return CKPT_EPEER;
	}
	if (l->local[rank - l->first]) {
		*why = "that rank is already connected";
		return CKPT_EPEER;
	}
	if (l->up_lost) {
		*why = "the node leader has lost the coordinator";
		return CKPT_EPEER;
	}
	return 0;
}

/* ------------------------------------------------------------------ the node's ranks */

static void up_lose(struct commit_leader *l, const char *why);

static void local_set(struct commit_leader *l, uint32_t i, struct net_conn *conn)
{
	pthread_mutex_lock(&l->lock);
	l->local[i] = conn;
	pthread_mutex_unlock(&l->lock);
}

/* Rank first+i's connection ended: close it and tell the coordinator, whose steps
 * that rank had not voted for abort now rather than at their timeout. */
static void local_drop(struct commit_leader *l, uint32_t i, const char *why)
{
	uint32_t rank = l->first + i;
	ckpt_log(CKPT_LOG_INFO, "%s: closing %s: %s", l->name, net_conn_name(l->local[i]), why);
	net_close(l->local[i]);
	local_set(l, i, NULL);
	if (!l->up)
		return;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	int rc = commit_gone_encode(rank, why, &b);
	if (!rc)
		rc = net_send(l->up, COMMIT_MSG_RANK_GONE, b.p, b.len, SEND_TIMEOUT_MS);
	ckpt_buf_free(&b);
	if (rc)
		up_lose(l, ckpt_err_msg());
}

/* The coordinator is gone (or misbehaved): every rank of the node loses it too. */
static void up_lose(struct commit_leader *l, const char *why)
{
	if (!l->up)
		return;
	ckpt_log(CKPT_LOG_WARN, "%s: lost the coordinator (%s): closing the connections of the "
	         "node's ranks", l->name, why);
	net_close(l->up);
	l->up = NULL;
	pthread_mutex_lock(&l->lock);
	l->up_lost = true;
	pthread_mutex_unlock(&l->lock);
	for (uint32_t i = 0; i < l->n; i++) {
		if (l->local[i]) {
			net_close(l->local[i]);
			local_set(l, i, NULL);
		}
	}
}

/* Check one message of rank first+i before it goes up: a rank's malformed or
 * forged message costs that rank its connection, never the node's link. 0 or a
 * reason in *why. */
static int local_check(struct commit_leader *l, uint32_t i, const struct net_msg *m,
                       char *why, size_t cap)
{
	uint64_t step;
	struct commit_vote v;
	struct commit_status_msg st;
	switch (m->type) {
	case COMMIT_MSG_BEGIN:
		if (commit_step_decode(m->payload, m->len, &step))
			break;
		return 0;
	case COMMIT_MSG_PREPARE:
		if (commit_prepare_decode(m->payload, m->len, &v))
			break;
		if (v.rank != l->first + i) {
			snprintf(why, cap, "rank %u sent a vote for rank %u", l->first + i, v.rank);
			return -1;
		}
		return 0;
	case COMMIT_MSG_ABORT:
		if (commit_status_decode(m->payload, m->len, &st))
			break;
		return 0;
	default:
		snprintf(why, cap, "unexpected message type %u", m->type);
		return -1;
	}
	snprintf(why, cap, "%s", ckpt_err_msg());
	return -1;
}

static void local_read(struct commit_leader *l, uint32_t i)
{
	while (l->local[i] && l->up) {
		struct net_msg m;
		int rc = net_recv(l->local[i], &m, 0);
		if (rc == -EAGAIN)
			return;
		if (rc) {
			local_drop(l, i, rc == -ECONNRESET ? "peer closed the connection" : ckpt_err_msg());
			return;
		}
		char why[192];
		if (local_check(l, i, &m, why, sizeof why)) {
			net_msg_free(&m);
			local_drop(l, i, why);
			return;
		}
		/* Forwarded at once, not gathered: the coordinator checks each vote as it
		 * comes, so the last one costs there what it costs without a leader. */
		int f = ckpt_fault(CKPT_FP_LEADER_BEFORE_FORWARD);
		if (f == CKPT_FA_DROP) {
			net_msg_free(&m);
			continue;
		}
		struct ckpt_buf b;
		ckpt_buf_init(&b);
		rc = f < 0 ? f : commit_relay_encode(l->first + i, m.type, m.payload, m.len, &b);
		net_msg_free(&m);
		if (!rc)
			rc = net_send(l->up, COMMIT_MSG_RELAYED, b.p, b.len, SEND_TIMEOUT_MS);
		ckpt_buf_free(&b);
		if (rc)
			up_lose(l, ckpt_err_msg());
	}
}

/* ------------------------------------------------------------------ the coordinator */

static void deliver(struct commit_leader *l, uint32_t i, uint16_t type, const void *p, size_t n)
{
	if (l->local[i] && net_send(l->local[i], type, p, n, SEND_TIMEOUT_MS))
		local_drop(l, i, ckpt_err_msg());
}

static void up_read(struct commit_leader *l)
{
	while (l->up) {
		struct net_msg m;
		int rc = net_recv(l->up, &m, 0);
		if (rc == -EAGAIN)
			return;
		if (rc) {
			up_lose(l, rc == -ECONNRESET ? "the coordinator closed the connection"
			                             : ckpt_err_msg());
			return;
		}
		char why[160] = "";
		struct commit_status_msg st;
		uint32_t rank;
		uint16_t type;
		const uint8_t *inner;
		size_t n;
		if (m.type == COMMIT_MSG_DECISION) {
			/* Once for the node: every rank of it hears it, as every rank hears a
			 * flat coordinator's decision (a rank keeps those of its own steps). */
			if (commit_status_decode(m.payload, m.len, &st))
				snprintf(why, sizeof why, "%s", ckpt_err_msg());
			else if (ckpt_fault(CKPT_FP_LEADER_BEFORE_DECISION_RELAY) != CKPT_FA_DROP)
				for (uint32_t i = 0; i < l->n; i++)
					deliver(l, i, COMMIT_MSG_DECISION, m.payload, m.len);
		} else if (m.type == COMMIT_MSG_TO_RANK) {
			if (commit_relay_decode(m.payload, m.len, &rank, &type, &inner, &n) ||
			    commit_status_decode(inner, n, &st))
				snprintf(why, sizeof why, "%s", ckpt_err_msg());
			else if (rank < l->first || rank - l->first >= l->n)
				snprintf(why, sizeof why, "a reply for rank %u, not of this node", rank);
			else if (type != COMMIT_MSG_BEGIN_REPLY && type != COMMIT_MSG_DECISION)
				snprintf(why, sizeof why, "a reply of type %u for rank %u", type, rank);
			else
				deliver(l, rank - l->first, type, inner, n);
		} else {
			snprintf(why, sizeof why, "unexpected message type %u from the coordinator", m.type);
		}
		net_msg_free(&m);
		if (why[0])
			up_lose(l, why);
	}
}

/* ------------------------------------------------------------------ the loop */

static void *leader_main(void *arg)
{
	struct commit_leader *l = arg;
	struct pollfd *pf = l->pf;
	uint32_t *who = l->who;
	for (;;) {
		pthread_mutex_lock(&l->lock);
		bool stop = l->stop;
		uint32_t rank;
		struct net_conn *conn;
		while ((conn = commit_acceptor_take_locked(l->acc, &rank))) {
			if (l->up_lost)
				net_close(conn);     /* admitted just before the loss */
			else
				l->local[rank - l->first] = conn;
		}
		pthread_mutex_unlock(&l->lock);
		if (stop)
			break;
		/* The listener is left out while the acceptor has no room or pauses
		 * (accept.c): polled, it would stay readable and the loop would spin. */
		int timeout = -1;
		bool listening = commit_acceptor_listening(l->acc, &timeout);
		nfds_t n = 0;
		pf[n++] = (struct pollfd){ .fd = l->wake[0], .events = POLLIN };
		pf[n++] = (struct pollfd){ .fd = listening ? net_listener_fd(l->lis) : -1,
		                           .events = POLLIN };
		if (l->up) {
			who[n] = UINT32_MAX;
			pf[n++] = (struct pollfd){ .fd = net_conn_fd(l->up), .events = POLLIN };
		}
		for (uint32_t i = 0; i < l->n; i++) {
			if (l->local[i]) {
				who[n] = i;
				pf[n++] = (struct pollfd){ .fd = net_conn_fd(l->local[i]), .events = POLLIN };
			}
		}
		if (poll(pf, n, timeout) < 0 && errno != EINTR)
			ckpt_log(CKPT_LOG_ERROR, "%s: poll: %s", l->name, ckpt_strerror(-errno));
		if (pf[0].revents) {
			char buf[64];
			while (read(l->wake[0], buf, sizeof buf) > 0)
				;
		}
		if (pf[1].revents)
			commit_acceptor_accept(l->acc);
		for (nfds_t k = 2; k < n; k++) {
			if (!pf[k].revents)
				continue;
			if (who[k] == UINT32_MAX)
				up_read(l);
			else
				local_read(l, who[k]);
		}
	}
	return NULL;
}

/* Join the coordinator as this rank, announce the node's ranks, and wait for the
 * coordinator's answer (it refuses a set that overlaps another link's). */
static int leader_join(struct commit_leader *l, const struct commit_leader_opts *o)
{
	int rc = net_connect(o->transport, o->rdma, o->addr, o->port, (int)o->timeout_ms, &l->up);
	if (rc)
		return ckpt_err_prefix(rc, "%s: connect to the coordinator %s:%u", l->name, o->addr,
		                       o->port);
	struct net_auth a = { .job_id = o->job_id, .rank = o->rank, .world = o->world,
	                      .secret = o->secret, .secret_len = o->secret_len };
	if ((rc = net_handshake_client(l->up, &a, (int)o->timeout_ms)))
		return ckpt_err_prefix(rc, "%s: join job '%s' at the coordinator %s:%u", l->name,
		                       o->job_id, o->addr, o->port);
	uint32_t *ranks = ckpt_malloc(l->n * sizeof *ranks);
	if (!ranks)
		return ckpt_err(-ENOMEM, "%s", l->name);
	for (uint32_t i = 0; i < l->n; i++)
		ranks[i] = l->first + i;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	rc = commit_hello_encode(l->node, ranks, l->n, &b);
	ckpt_free(ranks);
	if (!rc)
		rc = net_send(l->up, COMMIT_MSG_RELAY_HELLO, b.p, b.len, (int)o->timeout_ms);
	ckpt_buf_free(&b);
	if (rc)
		return ckpt_err_prefix(rc, "%s: announce the node's ranks", l->name);
	struct net_msg m;
	if ((rc = net_recv(l->up, &m, (int)o->timeout_ms)))
		return ckpt_err_prefix(rc, "%s: no answer from the coordinator to the node's "
		                       "announcement", l->name);
	struct commit_status_msg st;
	if (m.type != COMMIT_MSG_RELAY_WELCOME || commit_status_decode(m.payload, m.len, &st))
		rc = ckpt_err(CKPT_EPROTO, "%s: the coordinator answered the node's announcement with "
		              "a message of type %u", l->name, m.type);
	else if (st.code)
		rc = ckpt_err(st.code, "%s: refused by the coordinator: %s", l->name, st.reason);
	net_msg_free(&m);
	return rc;
}

int commit_leader_start(const struct commit_leader_opts *o, struct commit_leader **out)
{
	*out = NULL;
	if (!o || !o->job_id || !o->addr || !o->local_addr || o->nranks == 0 ||
	    o->nranks > COMMIT_MAX_NODE_RANKS || o->first >= o->world ||
	    o->nranks > o->world - o->first || o->rank < o->first ||
	    o->rank - o->first >= o->nranks || (o->secret_len && !o->secret))
		return ckpt_err(-EINVAL, "node leader: needs a job id, the coordinator's and its own "
		                "address, and a node of 1..%u ranks inside the world that holds its "
		                "own rank", COMMIT_MAX_NODE_RANKS);
	struct commit_leader *l = ckpt_calloc(1, sizeof *l);
	if (!l)
		return ckpt_err(-ENOMEM, "node leader");
	l->wake[0] = l->wake[1] = -1;
	pthread_mutex_init(&l->lock, NULL);
	l->rank = o->rank;
	l->world = o->world;
	l->node = o->node;
	l->first = o->first;
	l->n = o->nranks;
	snprintf(l->name, sizeof l->name, "node leader of node %u (ranks %u..%u)", o->node, o->first,
	         o->first + o->nranks - 1);
	l->job_id = ckpt_strdup(o->job_id);
	l->local = ckpt_calloc(o->nranks, sizeof *l->local);
	l->pf = ckpt_calloc((size_t)o->nranks + 3, sizeof *l->pf);
	l->who = ckpt_calloc((size_t)o->nranks + 3, sizeof *l->who);
	if (o->secret_len) {
		l->secret = ckpt_malloc(o->secret_len);
		if (l->secret)
			memcpy(l->secret, o->secret, o->secret_len);
		l->secret_len = o->secret_len;
	}
	int rc;
	if (!l->job_id || !l->local || !l->pf || !l->who || (o->secret_len && !l->secret)) {
		rc = ckpt_err(-ENOMEM, "%s", l->name);
		goto fail;
	}
	if (pipe2(l->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
		rc = ckpt_err(-errno, "%s: wake pipe", l->name);
		goto fail;
	}
	/* Listen before joining: a second leader for this node on this machine fails
	 * here (the name is taken), before it could claim the node's ranks. */
	if ((rc = net_listen(NET_UNIX, NULL, o->local_addr, 0, &l->lis))) {
		ckpt_err_prefix(rc, "%s: listen on %s%s", l->name, o->local_addr,
		                rc == -EADDRINUSE ? " (another leader of this node runs here)" : "");
		goto fail;
	}
	if ((rc = leader_join(l, o)))
		goto fail;
	struct commit_acceptor_opts ao = {
		.lis = l->lis, .job_id = l->job_id, .world = l->world, .secret = l->secret,
		.secret_len = l->secret_len, .lock = &l->lock, .admit = leader_admit, .arg = l,
		.wake_fd = l->wake[1], .who = l->name,
		/* An abstract socket has no file permissions: any local user may connect. */
		.same_user = true,
	};
	if ((rc = commit_acceptor_create(&ao, &l->acc)))
		goto fail;
	if ((rc = ckpt_thread_create(&l->thread, NULL, leader_main, l))) {
		rc = ckpt_err(-rc, "%s: thread", l->name);
		goto fail;
	}
	l->thread_started = true;
	ckpt_log(CKPT_LOG_INFO, "%s: relaying to the coordinator %s:%u, local address %s", l->name,
	         o->addr, o->port, o->local_addr);
	*out = l;
	return 0;
fail:
	commit_leader_stop(l);
	return rc;
}

void commit_leader_stop(struct commit_leader *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->lock);
	l->stop = true;
	pthread_mutex_unlock(&l->lock);
	if (l->thread_started) {
		char b = 1;
		ssize_t n = write(l->wake[1], &b, 1);
		(void)n;
		pthread_join(l->thread, NULL);
	}
	commit_acceptor_free(l->acc);
	for (uint32_t i = 0; l->local && i < l->n; i++)
		net_close(l->local[i]);
	net_close(l->up);
	net_listener_close(l->lis);
	if (l->wake[0] >= 0) {
		close(l->wake[0]);
		close(l->wake[1]);
	}
	if (l->secret) {
		explicit_bzero(l->secret, l->secret_len);
		ckpt_free(l->secret);
	}
	ckpt_free(l->job_id);
	ckpt_free(l->local);
	ckpt_free(l->pf);
	ckpt_free(l->who);
	pthread_mutex_destroy(&l->lock);
	ckpt_free(l);
}
