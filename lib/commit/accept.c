/*
 * accept.c — admitting peers for the coordinator and the node leader: accept on a
 * listener, run each connection's handshake (lib/net's HMAC challenge-response) on
 * a short-lived thread of its own, and keep the admitted connection, by rank,
 * until the owner's poll loop takes it.
 *
 * Why threads: net_handshake_server blocks until the handshake ends or times out,
 * and a client that connects and says nothing must cost a thread for that long,
 * never the owner's loop (docs/protocol.md §2.7).
 *
 * Floods: anyone who can reach the listener can open connections faster than
 * handshakes end, and each one holds a descriptor and a thread. So handshakes are
 * bounded (HANDSHAKE_MAX at once). A connection accepted at the bound breaks the
 * handshake whose peer has said nothing for longest, once silent peers are seen to
 * be a flood (victim_locked), or failing that the oldest that has stalled
 * (HANDSHAKE_STALE_MS): an honest rank sends its HELLO as soon as it is connected
 * and is done in milliseconds, so the ones broken are the flood's. When none
 * qualifies (many honest ranks joining at once, some accepted before their HELLO
 * came), none is broken: the acceptor stops taking connections, which wait in the
 * kernel's backlog, until one ends or qualifies. A peer that sends nothing at all is dropped
 * after FIRST_MSG_TIMEOUT_MS even without pressure. accept failing for want
 * of descriptors or memory pauses the listener (ACCEPT_PAUSE_MS) rather than
 * spinning on it, and every line a peer can provoke goes through a rate limiter.
 *
 * Locking: every field below marked "under lock" is guarded by the owner's mutex,
 * so that "is this rank already connected?" is one decision across the owner's
 * own connections and the acceptor's handshakes and waiting connections. A
 * handshake thread's last touch of the acceptor is the decrement of handshakes
 * under the lock: commit_acceptor_free waits for it to reach 0. The fields not
 * under lock belong to the owner's loop thread (and create/free), except the rate
 * limiters, which lock themselves.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "commit/commit_internal.h"

#define HANDSHAKE_TIMEOUT_MS 10000
/* The peer's first bytes (its HELLO) must come within this long of the accept. An
 * honest rank sends them right after its connect returns; a peer that is silent
 * for seconds is not a rank, and its thread is better spent elsewhere. */
#define FIRST_MSG_TIMEOUT_MS 3000
/* Handshakes running at once. Honest ranks connect once per job and each handshake
 * takes milliseconds (four small messages, two HMACs), so even 4096 ranks joining
 * at once pass through 64 slots in 64 rounds of a few milliseconds (the rest wait
 * in the kernel's backlog, not failing); while a flood is held to 64 threads and
 * 128 descriptors (HANDSHAKE_CONNS_MAX), a small part of the default limit of 1024
 * that the training process needs for itself. */
#define HANDSHAKE_MAX 64u
/* A peer silent this long since its accept is not a rank that is joining: a rank's
 * HELLO follows its connect within microseconds, and within a few hundred
 * milliseconds even with 512 rank threads on two busy cores (test_flood's herd:
 * 316 ms at most). Seeing one means a flood (below). */
#define SILENT_GRACE_MS 1000
/* After a silent peer was seen (SILENT_GRACE_MS), silent handshakes of any age may
 * be broken for this long: waiting SILENT_GRACE_MS before each would cap the rate
 * at which a flood's connections are taken off the backlog (64 a second), so the
 * flood would fill the backlog, and the ranks' connections would wait behind it. */
#define FLOOD_MS 10000
/* A handshake whose peer has spoken but is still not done after this long may be
 * broken for a new connection: an honest one would have finished long before. */
#define HANDSHAKE_STALE_MS 3000
/* Connections held by handshake threads, counting those broken and not yet closed
 * by their thread: the bound on the acceptor's descriptors. */
#define HANDSHAKE_CONNS_MAX (2u * HANDSHAKE_MAX)
/* Connections accepted per call, so that the owner's loop serves its links between
 * batches however fast connections come. */
#define ACCEPT_BATCH HANDSHAKE_MAX
/* After accept failed (out of descriptors or memory), the listener is left alone
 * this long: the connection stays in the backlog and the listener stays readable,
 * so retrying at once would spin. */
#define ACCEPT_PAUSE_MS 100
/* The rate limit of each kind of line a peer can provoke: printk's defaults. */
#define LOG_INTERVAL_MS 5000
#define LOG_BURST       10

struct pending {
	struct commit_acceptor *a;
	struct net_conn        *conn;
	uint64_t                since_ns;   /* accepted at */
	/* under lock */
	bool                    spoke;      /* the peer's first bytes came */
	const char             *broken;     /* NULL, or why it was broken for a new connection */
	bool                    reserved;   /* holds reserved[rank] */
	uint32_t                rank;
	struct pending         *next;       /* a->pending, oldest first, while it runs */
};

struct commit_acceptor {
	struct commit_acceptor_opts o;
	pthread_cond_t    cond;
	uid_t             uid;              /* same_user: ours */
	uint64_t          paused_until_ns;  /* owner's loop: listener left alone until */
	uint64_t          flood_until_ns;   /* under lock: silent handshakes breakable until */
	char              what[4][160];     /* the limiters' names */
	struct ckpt_ratelimit log_rejected; /* failed handshakes */
	struct ckpt_ratelimit log_broken;   /* handshakes broken to make room */
	struct ckpt_ratelimit log_accept;   /* accept or thread start failed */
	struct ckpt_ratelimit log_peer;     /* local peers of another user refused */
	/* under lock */
	struct net_conn **arrived;          /* [world]: admitted, not yet taken */
	bool             *reserved;         /* [world]: a handshake holds this rank */
	uint32_t          narrived;
	unsigned          handshakes;       /* handshake threads not yet finished */
	unsigned          running;          /* those not broken (bound: HANDSHAKE_MAX) */
	unsigned          conns;            /* connections they hold (HANDSHAKE_CONNS_MAX) */
	bool              want_room;        /* the owner's loop waits for one to end */
	struct pending   *pending;          /* their connections, oldest first */
	bool              stop;
};

static int admit(void *arg, uint32_t rank, const char **why)
{
	struct pending *h = arg;
	struct commit_acceptor *a = h->a;
	pthread_mutex_lock(a->o.lock);
	int rc = 0;
	if (a->arrived[rank] || a->reserved[rank]) {
		*why = "that rank is already connected";
		rc = CKPT_EPEER;
	} else if ((rc = a->o.admit(a->o.arg, rank, why)) == 0) {
		a->reserved[rank] = true;
		h->reserved = true;
		h->rank = rank;
	}
	pthread_mutex_unlock(a->o.lock);
	return rc;
}

static void wake(const struct commit_acceptor *a)
{
	char b = 1;
	ssize_t n = write(a->o.wake_fd, &b, 1);
	(void)n;                      /* a full pipe already means "look" */
}

static uint64_t ms_to_ns(unsigned ms) { return (uint64_t)ms * 1000000u; }


/* poll's timeout *t (< 0: none) lowered to ms (< 0: no change). */
static void lower(int *t, int ms)
{
	if (ms >= 0 && (*t < 0 || ms < *t))
		*t = ms;
}

/* ------------------------------------------------------------------ room */

/* Under lock: has h's peer sent anything yet? A HELLO already waiting counts,
 * though its thread has not looked yet (it may not have run). */
static bool spoke_locked(struct pending *h)
{
	if (!h->spoke) {
		struct pollfd pf = { .fd = net_conn_fd(h->conn), .events = POLLIN };
		h->spoke = poll(&pf, 1, 0) > 0;
	}
	return h->spoke;
}

/* Under lock: the handshake to break for a new connection, or NULL when every
 * handshake in flight is young and progressing. The oldest silent one, if it has
 * been silent for SILENT_GRACE_MS or a flood was seen within FLOOD_MS; else the
 * oldest stalled one, but never one whose peer proved the secret (it holds a rank
 * and is only waiting to send WELCOME). *why says which.
 *
 * Why the grace: when many ranks join at once on a busy machine, some are accepted
 * before their HELLO comes, and breaking those for the next rank's connection would
 * fail the ranks' own save. Only a peer silent for longer than any rank would be
 * shows a flood, and then the silent ones are the flood's. */
static struct pending *victim_locked(struct commit_acceptor *a, uint64_t now,
                                     const char **why)
{
	for (struct pending *h = a->pending; h; h = h->next) {
		if (h->broken || spoke_locked(h))
			continue;
		/* The oldest silent one (the list is oldest first). */
		if (now - h->since_ns >= ms_to_ns(SILENT_GRACE_MS))
			a->flood_until_ns = now + ms_to_ns(FLOOD_MS);
		if (now < a->flood_until_ns) {
			*why = "silent";
			return h;
		}
		break;
	}
	for (struct pending *h = a->pending; h; h = h->next) {
		if (!h->broken && !h->reserved && now - h->since_ns >= ms_to_ns(HANDSHAKE_STALE_MS)) {
			*why = "stalled";
			return h;
		}
	}
	return NULL;
}

/* Under lock: break h now (its thread sees the error at once, logs and closes). */
static void break_locked(struct commit_acceptor *a, struct pending *h, const char *why)
{
	h->broken = why;
	a->running--;
	net_conn_shutdown(h->conn);
}

/* Under lock: may one more connection be taken now (breaking a victim if need be)? */
static bool room_locked(struct commit_acceptor *a, uint64_t now)
{
	const char *why;
	return a->conns < HANDSHAKE_CONNS_MAX &&
	       (a->running < HANDSHAKE_MAX || victim_locked(a, now, &why));
}

/* ------------------------------------------------------------------ a handshake */

/* Wait for the peer's first bytes, until FIRST_MSG_TIMEOUT_MS after the accept.
 * Breaking the connection ends the wait at once (a shut-down socket polls
 * readable). */
static int first_bytes(const struct pending *h)
{
	uint64_t deadline = ckpt_deadline_after(h->since_ns, ms_to_ns(FIRST_MSG_TIMEOUT_MS));
	struct pollfd pf = { .fd = net_conn_fd(h->conn), .events = POLLIN };
	for (;;) {
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0)
			return ckpt_err(-ETIMEDOUT, "%s: nothing received within %d ms of connecting",
			                net_conn_name(h->conn), FIRST_MSG_TIMEOUT_MS);
		int r = poll(&pf, 1, left);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return ckpt_err(-errno, "%s: waiting for the first message",
			                net_conn_name(h->conn));
	}
}

static void *handshake_main(void *p)
{
	struct pending *h = p;
	struct commit_acceptor *a = h->a;
	struct net_auth auth = { .job_id = a->o.job_id, .world = a->o.world,
	                         .secret = a->o.secret, .secret_len = a->o.secret_len };
	uint32_t rank = 0;
	int rc = first_bytes(h);
	if (!rc) {
		pthread_mutex_lock(a->o.lock);
		h->spoke = true;
		pthread_mutex_unlock(a->o.lock);
		uint64_t deadline = ckpt_deadline_after(h->since_ns, ms_to_ns(HANDSHAKE_TIMEOUT_MS));
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0)
			left = 1;   /* the handshake still gets its one look */
		rc = net_handshake_server(h->conn, &auth, admit, h, &rank, left);
	}
	bool handed = false;
	pthread_mutex_lock(a->o.lock);
	/* Off the pending list before its connection can be closed or handed on: free
	 * and the accept loop break the connections on that list, under the same lock. */
	for (struct pending **pp = &a->pending; *pp; pp = &(*pp)->next) {
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	}
	if (h->reserved)
		a->reserved[h->rank] = false;
	const char *broken = h->broken;
	bool stop = a->stop;
	if (!rc && !stop && !broken) {
		a->arrived[rank] = h->conn;
		a->narrived++;
		h->conn = NULL;
		handed = true;
	}
	if (!broken)
		a->running--;
	a->conns--;
	bool room = a->want_room;
	a->want_room = false;
	pthread_mutex_unlock(a->o.lock);
	/* Nothing to say about handshakes that free broke: the owner is stopping. */
	if (broken && !stop)
		ckpt_log_limited(&a->log_broken, "%s: dropped %s (%s for %.1f s) to make room for a "
		                 "new connection (at most %u handshakes at once)", a->o.who,
		                 net_conn_name(h->conn), broken,
		                 (double)(ckpt_now_ns() - h->since_ns) / 1e9, HANDSHAKE_MAX);
	else if (rc && !stop)
		ckpt_log_limited(&a->log_rejected, "%s: rejected %s: %s", a->o.who,
		                 net_conn_name(h->conn), ckpt_err_msg());
	net_close(h->conn);
	/* Before the count drops: once commit_acceptor_free has seen it reach 0,
	 * nothing a handshake allocated may still be held. */
	ckpt_free(h);
	if (handed || room)
		wake(a);
	pthread_mutex_lock(a->o.lock);
	a->handshakes--;
	pthread_cond_broadcast(&a->cond);
	pthread_mutex_unlock(a->o.lock);
	return NULL;
}

/* ------------------------------------------------------------------ the owner's loop */

/* Leave the listener alone for ACCEPT_PAUSE_MS: accept cannot succeed now, and the
 * listener stays readable, so polling it would spin. A handshake that holds a
 * descriptor to no purpose gives it back. */
static void accept_pause(struct commit_acceptor *a, const char *what)
{
	uint64_t now = ckpt_now_ns();
	a->paused_until_ns = now + ms_to_ns(ACCEPT_PAUSE_MS);
	pthread_mutex_lock(a->o.lock);
	const char *why = NULL;
	struct pending *v = victim_locked(a, now, &why);
	if (v)
		break_locked(a, v, why);
	pthread_mutex_unlock(a->o.lock);
	ckpt_log_limited(&a->log_accept, "%s: %s: %s; not accepting connections for %d ms%s",
	                 a->o.who, what, ckpt_err_msg(), ACCEPT_PAUSE_MS,
	                 v ? " (a silent or stalled handshake is broken to give back its "
	                     "descriptor)" : "");
}

/* Unix listeners (same_user): refuse a process of another user before it costs a
 * handshake. An abstract socket has no file permissions, so any local user can
 * connect; SO_PEERCRED gives the uid the peer had when it connected. */
static bool peer_refused(struct commit_acceptor *a, struct net_conn *conn)
{
	struct ucred cr;
	socklen_t len = sizeof cr;
	if (getsockopt(net_conn_fd(conn), SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
		ckpt_log_limited(&a->log_peer, "%s: refused a local connection whose user is "
		                 "unknown (SO_PEERCRED: %s)", a->o.who, ckpt_strerror(-errno));
		return true;
	}
	if (cr.uid == a->uid || cr.uid == 0)
		return false;
	char ours[32] = "";
	if (a->uid != 0)
		snprintf(ours, sizeof ours, "uid %u and ", (unsigned)a->uid);
	ckpt_log_limited(&a->log_peer, "%s: refused a local connection of uid %u (pid %d): only "
	                 "%sroot may join", a->o.who, (unsigned)cr.uid, (int)cr.pid, ours);
	return true;
}

/* Run conn's handshake on a thread of its own, breaking a victim if the bound is
 * reached. */
static void handshake_start(struct commit_acceptor *a, struct net_conn *conn)
{
	struct pending *h = ckpt_calloc(1, sizeof *h);
	if (!h) {
		net_close(conn);
		ckpt_err(-ENOMEM, "a handshake's state");
		accept_pause(a, "cannot start a handshake");
		return;
	}
	uint64_t now = ckpt_now_ns();
	*h = (struct pending){ .a = a, .conn = conn, .since_ns = now };
	pthread_mutex_lock(a->o.lock);
	if (a->running >= HANDSHAKE_MAX) {
		const char *why = NULL;
		struct pending *v = victim_locked(a, now, &why);
		/* None: the one found by room_locked spoke or ended since; the bound is
		 * exceeded by this one at most (conns stays bounded). */
		if (v)
			break_locked(a, v, why);
	}
	struct pending **pp = &a->pending;
	while (*pp)
		pp = &(*pp)->next;
	*pp = h;
	a->running++;
	a->conns++;
	a->handshakes++;
	pthread_mutex_unlock(a->o.lock);
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int rc = ckpt_thread_create(&t, &attr, handshake_main, h);
	pthread_attr_destroy(&attr);
	if (!rc)
		return;
	pthread_mutex_lock(a->o.lock);
	for (pp = &a->pending; *pp; pp = &(*pp)->next) {
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	}
	if (!h->broken)
		a->running--;
	a->conns--;
	a->handshakes--;
	pthread_mutex_unlock(a->o.lock);
	net_close(conn);
	ckpt_free(h);
	ckpt_err(-rc, "a handshake thread");
	accept_pause(a, "cannot start a handshake");
}

int commit_acceptor_create(const struct commit_acceptor_opts *o, struct commit_acceptor **out)
{
	*out = NULL;
	struct commit_acceptor *a = ckpt_calloc(1, sizeof *a);
	if (!a)
		return ckpt_err(-ENOMEM, "%s: acceptor", o->who);
	a->o = *o;
	a->arrived = ckpt_calloc(o->world, sizeof *a->arrived);
	a->reserved = ckpt_calloc(o->world, sizeof *a->reserved);
	if (!a->arrived || !a->reserved) {
		ckpt_free(a->arrived);
		ckpt_free(a->reserved);
		ckpt_free(a);
		return ckpt_err(-ENOMEM, "%s: acceptor", o->who);
	}
	a->uid = geteuid();
	snprintf(a->what[0], sizeof a->what[0], "%s: rejected connections", o->who);
	snprintf(a->what[1], sizeof a->what[1], "%s: connections dropped to make room", o->who);
	snprintf(a->what[2], sizeof a->what[2], "%s: accept failures", o->who);
	snprintf(a->what[3], sizeof a->what[3], "%s: refused local connections", o->who);
	ckpt_ratelimit_init(&a->log_rejected, a->what[0], CKPT_LOG_WARN, LOG_INTERVAL_MS, LOG_BURST);
	ckpt_ratelimit_init(&a->log_broken, a->what[1], CKPT_LOG_WARN, LOG_INTERVAL_MS, LOG_BURST);
	ckpt_ratelimit_init(&a->log_accept, a->what[2], CKPT_LOG_ERROR, LOG_INTERVAL_MS, LOG_BURST);
	ckpt_ratelimit_init(&a->log_peer, a->what[3], CKPT_LOG_WARN, LOG_INTERVAL_MS, LOG_BURST);
	ckpt_cond_init(&a->cond);
	*out = a;
	return 0;
}

bool commit_acceptor_listening(struct commit_acceptor *a, int *timeout_ms)
{
	/* The counts of held-back lines come when their interval ends, not at the
	 * next flood. */
	lower(timeout_ms, ckpt_ratelimit_flush(&a->log_rejected));
	lower(timeout_ms, ckpt_ratelimit_flush(&a->log_broken));
	lower(timeout_ms, ckpt_ratelimit_flush(&a->log_accept));
	lower(timeout_ms, ckpt_ratelimit_flush(&a->log_peer));
	uint64_t now = ckpt_now_ns();
	if (now < a->paused_until_ns) {
		lower(timeout_ms, ckpt_deadline_left_ms(a->paused_until_ns));
		return false;
	}
	pthread_mutex_lock(a->o.lock);
	bool fds = a->conns < HANDSHAKE_CONNS_MAX;
	bool room = room_locked(a, now);
	if (!room) {
		/* A handshake that ends (or closes its descriptor) wakes the loop; one that
		 * becomes breakable (silent past the grace, or stalled) does not, so come
		 * back when the first would, unless descriptors are what is missing. */
		a->want_room = true;
		for (struct pending *h = a->pending; fds && h; h = h->next) {
			if (h->broken || h->reserved)
				continue;
			uint64_t at = ckpt_deadline_after(h->since_ns,
			                                  ms_to_ns(h->spoke ? HANDSHAKE_STALE_MS
			                                                    : SILENT_GRACE_MS));
			lower(timeout_ms, ckpt_deadline_left_ms(at));
		}
	}
	pthread_mutex_unlock(a->o.lock);
	return room;
}

void commit_acceptor_accept(struct commit_acceptor *a)
{
	for (unsigned n = 0; n < ACCEPT_BATCH; n++) {
		pthread_mutex_lock(a->o.lock);
		bool room = room_locked(a, ckpt_now_ns());
		pthread_mutex_unlock(a->o.lock);
		if (!room)
			return;
		struct net_conn *conn;
		int rc = net_accept(a->o.lis, 0, &conn);
		if (rc == -EAGAIN)
			return;
		if (rc) {
			/* EMFILE, ENFILE, ENOMEM, ENOBUFS: this process or the machine is out of
			 * descriptors or memory; anything else is the listener's trouble. The
			 * same answer serves both: pause, do not spin and do not give up. */
			accept_pause(a, "cannot accept a connection");
			return;
		}
		if (a->o.same_user && peer_refused(a, conn)) {
			net_close(conn);
			continue;
		}
		handshake_start(a, conn);
	}
}

bool commit_acceptor_holds_locked(const struct commit_acceptor *a, uint32_t rank)
{
	return rank < a->o.world && (a->arrived[rank] || a->reserved[rank]);
}

struct net_conn *commit_acceptor_take_locked(struct commit_acceptor *a, uint32_t *rank)
{
	if (!a->narrived)
		return NULL;
	for (uint32_t r = 0; r < a->o.world; r++) {
		if (a->arrived[r]) {
			struct net_conn *c = a->arrived[r];
			a->arrived[r] = NULL;
			a->narrived--;
			*rank = r;
			return c;
		}
	}
	return NULL;
}

void commit_acceptor_free(struct commit_acceptor *a)
{
	if (!a)
		return;
	/* Handshakes still running wait on silent peers: break their connections so
	 * that they end now, not at their timeout; they see stop and close. */
	pthread_mutex_lock(a->o.lock);
	a->stop = true;
	for (struct pending *h = a->pending; h; h = h->next)
		net_conn_shutdown(h->conn);
	while (a->handshakes)
		pthread_cond_wait(&a->cond, a->o.lock);
	pthread_mutex_unlock(a->o.lock);
	for (uint32_t r = 0; r < a->o.world; r++)
		net_close(a->arrived[r]);
	/* Lines still held back are counted now, or never. */
	ckpt_ratelimit_destroy(&a->log_rejected);
	ckpt_ratelimit_destroy(&a->log_broken);
	ckpt_ratelimit_destroy(&a->log_accept);
	ckpt_ratelimit_destroy(&a->log_peer);
	pthread_cond_destroy(&a->cond);
	ckpt_free(a->arrived);
	ckpt_free(a->reserved);
	ckpt_free(a);
}
