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
 * Locking: every field below marked "under lock" is guarded by the owner's mutex,
 * so that "is this rank already connected?" is one decision across the owner's
 * own connections and the acceptor's handshakes and waiting connections. A
 * handshake thread's last touch of the acceptor is the decrement of handshakes
 * under the lock: commit_acceptor_free waits for it to reach 0.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commit/commit_internal.h"

#define HANDSHAKE_TIMEOUT_MS 10000

struct pending {
	struct commit_acceptor *a;
	struct net_conn        *conn;
	bool                    reserved;   /* holds reserved[rank] */
	uint32_t                rank;
	struct pending         *next;       /* a->pending, under lock, while it runs */
};

struct commit_acceptor {
	struct commit_acceptor_opts o;
	pthread_cond_t    cond;
	/* under lock */
	struct net_conn **arrived;          /* [world]: admitted, not yet taken */
	bool             *reserved;         /* [world]: a handshake holds this rank */
	uint32_t          narrived;
	unsigned          handshakes;       /* running handshake threads */
	struct pending   *pending;          /* their connections, for free to break */
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

static void *handshake_main(void *p)
{
	struct pending *h = p;
	struct commit_acceptor *a = h->a;
	struct net_auth auth = { .job_id = a->o.job_id, .world = a->o.world,
	                         .secret = a->o.secret, .secret_len = a->o.secret_len };
	uint32_t rank = 0;
	int rc = net_handshake_server(h->conn, &auth, admit, h, &rank, HANDSHAKE_TIMEOUT_MS);
	if (rc)
		ckpt_log(CKPT_LOG_WARN, "%s: rejected %s: %s", a->o.who, net_conn_name(h->conn),
		         ckpt_err_msg());
	bool handed = false;
	pthread_mutex_lock(a->o.lock);
	/* Off the pending list before its connection can be closed or handed on: free
	 * breaks the connections on that list, under the same lock. */
	for (struct pending **pp = &a->pending; *pp; pp = &(*pp)->next) {
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	}
	if (h->reserved)
		a->reserved[h->rank] = false;
	if (!rc && !a->stop) {
		a->arrived[rank] = h->conn;
		a->narrived++;
		h->conn = NULL;
		handed = true;
	}
	pthread_mutex_unlock(a->o.lock);
	net_close(h->conn);
	/* Before the count drops: once commit_acceptor_free has seen it reach 0,
	 * nothing a handshake allocated may still be held. */
	ckpt_free(h);
	if (handed)
		wake(a);
	pthread_mutex_lock(a->o.lock);
	a->handshakes--;
	pthread_cond_broadcast(&a->cond);
	pthread_mutex_unlock(a->o.lock);
	return NULL;
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
	pthread_cond_init(&a->cond, NULL);
	*out = a;
	return 0;
}

void commit_acceptor_accept(struct commit_acceptor *a)
{
	for (;;) {
		struct net_conn *conn;
		if (net_accept(a->o.lis, 0, &conn))
			return;
		struct pending *h = ckpt_calloc(1, sizeof *h);
		pthread_t t;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (h) {
			h->a = a;
			h->conn = conn;
		}
		pthread_mutex_lock(a->o.lock);
		a->handshakes++;
		if (h) {
			h->next = a->pending;
			a->pending = h;
		}
		pthread_mutex_unlock(a->o.lock);
		if (!h || pthread_create(&t, &attr, handshake_main, h)) {
			ckpt_log(CKPT_LOG_ERROR, "%s: cannot start a handshake thread", a->o.who);
			pthread_mutex_lock(a->o.lock);
			for (struct pending **pp = &a->pending; h && *pp; pp = &(*pp)->next) {
				if (*pp == h) {
					*pp = h->next;
					break;
				}
			}
			a->handshakes--;
			pthread_mutex_unlock(a->o.lock);
			net_close(conn);
			ckpt_free(h);
		}
		pthread_attr_destroy(&attr);
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
	pthread_cond_destroy(&a->cond);
	ckpt_free(a->arrived);
	ckpt_free(a->reserved);
	ckpt_free(a);
}
