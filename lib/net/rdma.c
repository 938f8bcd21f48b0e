/*
 * rdma.c — the rdma transport behind struct net_transport_ops: connection
 * set-up with librdmacm (address and route resolution, listen, connect,
 * accept), the verbs resources of a connection (PD, completion channel and CQ,
 * an RC queue pair, registered receive and send slots and the ring the peer
 * WRITEs into), device checks, and teardown. The byte stream over the queue
 * pair is rdma_stream.c; the wire format is docs/protocol-rdma.md.
 *
 * Device, port and GID: rdma_cm picks them from the IP address (the address
 * must belong to an RDMA device's netdev — not lo: rdma_cm cannot loop back
 * there), so there is nothing to guess. CKPT_RDMA_DEVICE names the one device
 * allowed, CKPT_RDMA_GID the GID index the address must be at; both are
 * checked, and a mismatch is an error that says what was found. No device at
 * all is CKPT_ENODEV, never a fallback to tcp.
 *
 * Every wait is poll() on an rdma_cm event channel under the caller's deadline
 * (set-up steps get at least RDMA_SETUP_MIN_MS, since they need a round trip).
 * librdmacm returns -1 and sets errno, create calls return NULL and set errno,
 * post calls return a positive errno: all become our negative codes here.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "rdma_internal.h"

#define RDMA_BACKOFF_MIN_MS 10
#define RDMA_BACKOFF_MAX_MS 250
#define RDMA_BACKLOG        256

struct rdma_listener {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
};

static int errno_code(void) { return errno > 0 ? -errno : -EIO; }

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* ---------------------------------------------------------------- devices */

/* Is there a device at all, and the one CKPT_RDMA_DEVICE names (o->device)? Asked
 * before anything else, so that "no device" says exactly that. */
static int devices_check(const struct net_rdma_opts *o)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)   /* ENOSYS: no RDMA support in the kernel at all */
		return ckpt_err(CKPT_ENODEV, "no RDMA device (ibv_get_device_list found none: %s)",
		                ckpt_strerror(errno_code()));
	const char *want = o->device[0] ? o->device : NULL;
	int rc = 0;
	if (n == 0) {
		rc = ckpt_err(CKPT_ENODEV, "no RDMA device (ibv_get_device_list found none)");
	} else if (want) {
		char seen[256] = "";
		bool found = false;
		for (int i = 0; i < n; i++) {
			const char *name = ibv_get_device_name(list[i]);
			found = found || !strcmp(name, want);
			size_t k = strlen(seen);
			snprintf(seen + k, sizeof seen - k, "%s%s", k ? ", " : "", name);
		}
		if (!found)
			rc = ckpt_err(CKPT_ENODEV, "CKPT_RDMA_DEVICE=%s: no such RDMA device (found: %s)",
			              want, seen);
	}
	ibv_free_device_list(list);
	return rc;
}

static void gid_format(const union ibv_gid *g, char *out, size_t cap)
{
	if (!inet_ntop(AF_INET6, g->raw, out, (socklen_t)cap))
		snprintf(out, cap, "?");
}

/* The device, port and GID rdma_cm chose for id: allowed (o->device), active, and
 * at the GID index CKPT_RDMA_GID names (o->gid_index, if set). */
static int device_check(const struct net_rdma_opts *o, struct rdma_cm_id *id,
                        const char *what, char *dev, size_t cap)
{
	if (!id->verbs)
		return ckpt_err(CKPT_ENODEV, "rdma: %s is not on an RDMA device", what);
	const char *name = ibv_get_device_name(id->verbs->device);
	snprintf(dev, cap, "%s", name);
	const char *want = o->device;
	if (want[0] && strcmp(want, name))
		return ckpt_err(CKPT_ENODEV, "rdma: %s is on RDMA device %s, but CKPT_RDMA_DEVICE=%s",
		                what, name, want);
	struct ibv_port_attr pa;
	int e = ibv_query_port(id->verbs, id->port_num, &pa);
	if (e)
		return ckpt_err(-e, "rdma: ibv_query_port %s/%u", name, id->port_num);
	if (pa.state != IBV_PORT_ACTIVE)
		return ckpt_err(CKPT_ENODEV, "rdma: %s port %u is %s, not active", name, id->port_num,
		                ibv_port_state_str(pa.state));
	if (o->gid_set) {
		/* config.c checked the form; the range is the port's. */
		if (o->gid_index >= (unsigned)pa.gid_tbl_len)
			return ckpt_err(-EINVAL, "CKPT_RDMA_GID=%u: not a GID index of %s port %u (0..%d)",
			                o->gid_index, name, id->port_num, pa.gid_tbl_len - 1);
		int idx = (int)o->gid_index;
		union ibv_gid g;
		if ((e = ibv_query_gid(id->verbs, id->port_num, idx, &g)))
			return ckpt_err(-e, "rdma: ibv_query_gid %s/%u index %d", name, id->port_num, idx);
		const union ibv_gid *used = &id->route.addr.addr.ibaddr.sgid;
		if (memcmp(g.raw, used->raw, sizeof g.raw)) {
			char a[64], b[64];
			gid_format(&g, a, sizeof a);
			gid_format(used, b, sizeof b);
			return ckpt_err(-EINVAL, "CKPT_RDMA_GID=%d: GID %d of %s port %u is %s, but %s "
			                "uses GID %s (rdma_cm takes the GID from the IP address; unset "
			                "CKPT_RDMA_GID or name the index of that GID)", idx, idx, name,
			                id->port_num, a, what, b);
		}
	}
	return 0;
}

/* ---------------------------------------------------------------- addresses */

static int resolve(const char *addr, unsigned port, bool passive, int unresolved,
                   struct addrinfo **out)
{
	*out = NULL;
	if (port > 65535)
		return ckpt_err(-EINVAL, "rdma: port %u out of range", port);
	char serv[8];
	snprintf(serv, sizeof serv, "%u", port);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
	                          .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0) };
	int gai = getaddrinfo(addr, serv, &hints, out);
	if (gai) {
		/* EAI_AGAIN too: an RDMA host is often cut off from DNS (the rdma guest
		 * is), and a name that cannot be resolved now is not an address here. */
		int code = gai == EAI_MEMORY ? -ENOMEM : unresolved;
		return ckpt_err(code, "rdma: cannot resolve '%s' port %u: %s", addr ? addr : "*", port,
		                gai_strerror(gai));
	}
	return 0;
}

static void format_addr(const struct sockaddr *sa, char *out, size_t cap)
{
	char host[NI_MAXHOST], serv[NI_MAXSERV];
	socklen_t len = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
	                                          : sizeof(struct sockaddr_in);
	if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv,
	                NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(out, cap, "?");
		return;
	}
	snprintf(out, cap, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

/* ---------------------------------------------------------------- cm events */

static int ms_for_step(uint64_t deadline)
{
	int left = ckpt_deadline_left_ms(deadline);
	return left < 0 || left > RDMA_SETUP_MIN_MS ? (left < 0 ? RDMA_SETUP_MIN_MS : left)
	                                            : RDMA_SETUP_MIN_MS;
}

/* The next event on ch by deadline: 0 and *ev (the caller acks it), -ETIMEDOUT,
 * or -errno. */
static int cm_next(struct rdma_event_channel *ch, uint64_t deadline, struct rdma_cm_event **ev)
{
	for (;;) {
		if (rdma_get_cm_event(ch, ev) == 0)
			return 0;
		if (errno != EAGAIN && errno != EINTR)
			return errno_code();
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0)
			return -ETIMEDOUT;
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		if (poll(&p, 1, left) < 0 && errno != EINTR)
			return errno_code();
	}
}

/* Wait for `want` on a connection's own channel; anything else is the reason it
 * did not come. Returns 0, or the event's type in *got with its status. */
static int cm_expect(struct rdma_event_channel *ch, uint64_t deadline,
                     enum rdma_cm_event_type want, enum rdma_cm_event_type *got, int *status)
{
	struct rdma_cm_event *ev;
	int rc = cm_next(ch, deadline, &ev);
	if (rc)
		return rc;
	*got = ev->event;
	*status = ev->status;
	rdma_ack_cm_event(ev);
	return *got == want ? 0 : -EPROTO;
}

/* ---------------------------------------------------------------- resources */

static void conn_free(struct rdma_conn *r)
{
	if (!r)
		return;
	if (r->qp)
		rdma_destroy_qp(r->id);
	if (r->ring_mr) ibv_dereg_mr(r->ring_mr);
	if (r->rmr) ibv_dereg_mr(r->rmr);
	if (r->smr) ibv_dereg_mr(r->smr);
	if (r->stage_mr) ibv_dereg_mr(r->stage_mr);
	if (r->cq) ibv_destroy_cq(r->cq);
	if (r->cc) ibv_destroy_comp_channel(r->cc);
	if (r->pd) ibv_dealloc_pd(r->pd);
	if (r->id) rdma_destroy_id(r->id);
	if (r->ch) rdma_destroy_event_channel(r->ch);
	ckpt_free(r->ring);
	ckpt_free(r->rbuf);
	ckpt_free(r->sbuf);
	ckpt_free(r->stage);
	if (r->epfd >= 0) close(r->epfd);
	if (r->evrx >= 0) close(r->evrx);
	if (r->evtx >= 0) close(r->evtx);
	pthread_mutex_destroy(&r->lock);
	ckpt_free(r);
}

static struct rdma_conn *conn_alloc(void)
{
	struct rdma_conn *r = ckpt_calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->epfd = r->evrx = r->evtx = -1;
	pthread_mutex_init(&r->lock, NULL);
	r->credits = RDMA_DATA_SLOTS;
	for (uint32_t i = 0; i < RDMA_SEND_SLOTS; i++)
		r->sfree[r->nsfree++] = i;
	return r;
}

static struct ibv_mr *reg(struct rdma_conn *r, void *p, size_t len, int access, const char *what)
{
	struct ibv_mr *mr = ibv_reg_mr(r->pd, p, len, access);
	if (!mr)
		ckpt_err(errno_code(), "rdma %s: ibv_reg_mr of the %s (%zu bytes)", r->dev, what, len);
	return mr;
}

/* Everything a connection needs on id's device, receives posted: done before
 * connect/accept, so that the peer's first message finds a buffer. */
static int conn_resources(struct rdma_conn *r)
{
	struct ibv_context *vc = r->id->verbs;
	if (!(r->pd = ibv_alloc_pd(vc)))
		return ckpt_err(errno_code(), "rdma %s: ibv_alloc_pd", r->dev);
	if (!(r->cc = ibv_create_comp_channel(vc)))
		return ckpt_err(errno_code(), "rdma %s: ibv_create_comp_channel", r->dev);
	int e = set_nonblock(r->cc->fd);
	if (e)
		return ckpt_err(e, "rdma %s: completion channel O_NONBLOCK", r->dev);
	int cqe = RDMA_MAX_SEND_WR + RDMA_RECV_SLOTS;
	if (!(r->cq = ibv_create_cq(vc, cqe, NULL, r->cc, 0)))
		return ckpt_err(errno_code(), "rdma %s: ibv_create_cq of %d entries", r->dev, cqe);
	if ((e = ibv_req_notify_cq(r->cq, 0)))
		return ckpt_err(-e, "rdma %s: ibv_req_notify_cq", r->dev);
	struct ibv_qp_init_attr qa = {
		.send_cq = r->cq, .recv_cq = r->cq, .qp_type = IBV_QPT_RC,
		/* A WRITE and the SEND that announces it per data message, and the
		 * direct writes (net_rdma_write) beside them. */
		.cap = { .max_send_wr = RDMA_MAX_SEND_WR, .max_recv_wr = RDMA_RECV_SLOTS,
		         .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	if (rdma_create_qp(r->id, r->pd, &qa))
		return ckpt_err(errno_code(), "rdma %s: rdma_create_qp", r->dev);
	r->qp = r->id->qp;

	r->rbuf = ckpt_aligned_alloc(4096, (size_t)RDMA_RECV_SLOTS * RDMA_SLOT_BYTES);
	r->sbuf = ckpt_aligned_alloc(4096, (size_t)RDMA_SEND_SLOTS * RDMA_SLOT_BYTES);
	r->ring = ckpt_aligned_alloc(4096, RDMA_RING_BYTES);
	if (!r->rbuf || !r->sbuf || !r->ring)
		return ckpt_err(-ENOMEM, "rdma %s: connection buffers", r->dev);
	/* Only the ring is remotely writable: a peer can reach nothing else. */
	if (!(r->rmr = reg(r, r->rbuf, (size_t)RDMA_RECV_SLOTS * RDMA_SLOT_BYTES,
	                   IBV_ACCESS_LOCAL_WRITE, "receive slots")) ||
	    !(r->smr = reg(r, r->sbuf, (size_t)RDMA_SEND_SLOTS * RDMA_SLOT_BYTES,
	                   IBV_ACCESS_LOCAL_WRITE, "send slots")) ||
	    !(r->ring_mr = reg(r, r->ring, RDMA_RING_BYTES,
	                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "ring")))
		return errno_code();
	for (uint32_t s = 0; s < RDMA_RECV_SLOTS; s++)
		if (rdma_post_recv_slot(r, s))
			return ckpt_err(r->err, "rdma %s: %s", r->dev, r->why);

	/* One fd for net_conn_fd: completions, cm events (the peer's disconnect),
	 * and evrx for bytes another thread already took off the CQ. */
	r->evrx = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	r->evtx = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	r->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (r->evrx < 0 || r->evtx < 0 || r->epfd < 0)
		return ckpt_err(errno_code(), "rdma %s: eventfd/epoll", r->dev);
	int fds[3] = { r->cc->fd, r->ch->fd, r->evrx };
	for (int i = 0; i < 3; i++) {
		struct epoll_event ev = { .events = EPOLLIN };
		ev.data.fd = fds[i];
		if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fds[i], &ev))
			return ckpt_err(errno_code(), "rdma %s: epoll_ctl", r->dev);
	}
	return 0;
}

static int new_channel(struct rdma_event_channel **out)
{
	*out = rdma_create_event_channel();
	if (!*out) {
		int e = errno_code();
		if (e == -ENOENT || e == -ENODEV)
			return ckpt_err(CKPT_ENODEV, "no RDMA device (rdma_create_event_channel: %s)",
			                ckpt_strerror(e));
		return ckpt_err(e, "rdma_create_event_channel");
	}
	int e = set_nonblock((*out)->fd);
	if (e) {
		rdma_destroy_event_channel(*out);
		*out = NULL;
		return ckpt_err(e, "rdma: event channel O_NONBLOCK");
	}
	return 0;
}

/* ---------------------------------------------------------------- listen, accept */

static int rdma_listen_op(struct net_listener *l, const char *addr, unsigned port)
{
	int rc = port > 65535 ? ckpt_err(-EINVAL, "rdma: port %u out of range", port) : 0;
	if (rc || (rc = devices_check(&l->rdma)))
		return rc;
	struct addrinfo *ai;
	if ((rc = resolve(addr, port, true, -EADDRNOTAVAIL, &ai)))
		return rc;
	struct rdma_listener *rl = ckpt_calloc(1, sizeof *rl);
	if (!rl) {
		freeaddrinfo(ai);
		return ckpt_err(-ENOMEM, "rdma: listener");
	}
	if ((rc = new_channel(&rl->ch)))
		goto fail;
	if (rdma_create_id(rl->ch, &rl->id, NULL, RDMA_PS_TCP)) {
		rc = ckpt_err(errno_code(), "rdma_create_id");
		goto fail;
	}
	rc = -EADDRNOTAVAIL;
	for (struct addrinfo *a = ai; a; a = a->ai_next) {
		if (rdma_bind_addr(rl->id, a->ai_addr) == 0) {
			rc = 0;
			break;
		}
		rc = errno_code();
	}
	if (rc) {
		rc = ckpt_err(rc, "rdma: cannot listen on %s port %u", addr ? addr : "*", port);
		goto fail;
	}
	if (rdma_listen(rl->id, RDMA_BACKLOG)) {
		rc = ckpt_err(errno_code(), "rdma: rdma_listen on %s port %u", addr ? addr : "*", port);
		goto fail;
	}
	freeaddrinfo(ai);
	l->port = ntohs(rdma_get_src_port(rl->id));
	l->priv = rl;
	return 0;
fail:
	freeaddrinfo(ai);
	if (rl->id)
		rdma_destroy_id(rl->id);
	if (rl->ch)
		rdma_destroy_event_channel(rl->ch);
	ckpt_free(rl);
	return rc;
}

static int rdma_listener_fd(const struct net_listener *l)
{
	return ((const struct rdma_listener *)l->priv)->ch->fd;
}

static void rdma_listener_close(struct net_listener *l)
{
	struct rdma_listener *rl = l->priv;
	if (!rl)
		return;
	rdma_destroy_id(rl->id);
	rdma_destroy_event_channel(rl->ch);
	ckpt_free(rl);
	l->priv = NULL;
}

/* A connect request taken off the listener: its own channel, resources,
 * rdma_accept, and the ESTABLISHED that follows one round trip later. */
static int accept_one(struct net_listener *l, struct rdma_cm_id *id, uint64_t deadline,
                      struct net_conn *c)
{
	struct rdma_conn *r = conn_alloc();
	int rc;
	if (!r) {
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		return ckpt_err(-ENOMEM, "rdma: connection state");
	}
	if ((rc = new_channel(&r->ch))) {
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		conn_free(r);
		return rc;
	}
	/* From here on the id's events (ESTABLISHED, DISCONNECTED) come to this
	 * connection's channel, not to the listener's. */
	if (rdma_migrate_id(id, r->ch)) {
		rc = ckpt_err(errno_code(), "rdma: rdma_migrate_id");
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		conn_free(r);
		return rc;
	}
	r->id = id;
	format_addr(rdma_get_peer_addr(id), c->peer, sizeof c->peer);
	snprintf(r->peer, sizeof r->peer, "%s", c->peer);
	char what[NET_PEER_NAME_MAX + 32];
	snprintf(what, sizeof what, "connection from %s", c->peer);
	if ((rc = device_check(&l->rdma, id, what, r->dev, sizeof r->dev)) ||
	    (rc = conn_resources(r))) {
		rdma_reject(id, NULL, 0);
		conn_free(r);
		return rc;
	}
	struct rdma_conn_param cp = { .responder_resources = 0, .initiator_depth = 0,
	                              .rnr_retry_count = 7 };
	if (rdma_accept(id, &cp)) {
		rc = ckpt_err(errno_code(), "rdma: rdma_accept from %s", c->peer);
		conn_free(r);
		return rc;
	}
	enum rdma_cm_event_type got;
	int status;
	uint64_t step = ckpt_deadline_ms(ms_for_step(deadline));
	rc = cm_expect(r->ch, step, RDMA_CM_EVENT_ESTABLISHED, &got, &status);
	if (rc) {
		if (rc == -EPROTO)
			rc = ckpt_err(-ECONNABORTED, "rdma: connection from %s not established: %s "
			              "(status %d)", c->peer, rdma_event_str(got), status);
		else
			rc = ckpt_err(rc, "rdma: connection from %s not established", c->peer);
		conn_free(r);
		return rc;
	}
	c->priv = r;
	if ((rc = rdma_stream_start(c))) {
		conn_free(r);
		c->priv = NULL;
		return rc;
	}
	ckpt_log(CKPT_LOG_DEBUG, "rdma: accepted %s on %s port %u (listener port %u)", c->peer,
	         r->dev, id->port_num, l->port);
	return 0;
}

static int rdma_accept_op(struct net_listener *l, int timeout_ms, struct net_conn *c)
{
	struct rdma_listener *rl = l->priv;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	for (;;) {
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(rl->ch, &ev) == 0) {
			enum rdma_cm_event_type t = ev->event;
			struct rdma_cm_id *id = ev->id;
			/* Ack before migrating: rdma_migrate_id waits for the id's events
			 * to be acked. */
			rdma_ack_cm_event(ev);
			if (t != RDMA_CM_EVENT_CONNECT_REQUEST)
				continue;
			int rc = accept_one(l, id, deadline, c);
			/* That client's trouble (it went away, a device mismatch) is not
			 * the listener's: like tcp, wait for the next one. */
			if (rc == -ECONNABORTED || rc == -ETIMEDOUT) {
				ckpt_log(CKPT_LOG_INFO, "%s", ckpt_last_error());
				continue;
			}
			return rc;
		}
		if (errno != EAGAIN && errno != EINTR)
			return ckpt_err(errno_code(), "rdma: rdma_get_cm_event on port %u", l->port);
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0) {
			if (timeout_ms == 0)
				return -EAGAIN;
			return ckpt_err(-ETIMEDOUT, "rdma: no connection on port %u within %d ms",
			                l->port, timeout_ms);
		}
		struct pollfd p = { .fd = rl->ch->fd, .events = POLLIN };
		if (poll(&p, 1, left) < 0 && errno != EINTR)
			return ckpt_err(errno_code(), "rdma: waiting for connections on port %u", l->port);
	}
}

/* ---------------------------------------------------------------- connect */

/* One attempt on one address: 0 with c->priv set, or a code (-ECONNREFUSED:
 * nobody listens there yet; -ETIMEDOUT; -EHOSTUNREACH). */
static int connect_once(struct net_conn *c, const struct addrinfo *a, uint64_t deadline)
{
	struct rdma_conn *r = conn_alloc();
	if (!r)
		return ckpt_err(-ENOMEM, "rdma: connection state");
	int rc = new_channel(&r->ch);
	if (rc)
		goto fail;
	if (rdma_create_id(r->ch, &r->id, NULL, RDMA_PS_TCP)) {
		rc = ckpt_err(errno_code(), "rdma_create_id");
		goto fail;
	}
	format_addr(a->ai_addr, c->peer, sizeof c->peer);
	snprintf(r->peer, sizeof r->peer, "%s", c->peer);
	enum rdma_cm_event_type got;
	int status;
	if (rdma_resolve_addr(r->id, NULL, a->ai_addr, ms_for_step(deadline))) {
		rc = ckpt_err(errno_code(), "rdma: rdma_resolve_addr %s", c->peer);
		goto fail;
	}
	if ((rc = cm_expect(r->ch, ckpt_deadline_ms(ms_for_step(deadline) + 1000),
	                    RDMA_CM_EVENT_ADDR_RESOLVED, &got, &status))) {
		rc = ckpt_err(rc == -EPROTO ? -EHOSTUNREACH : rc, "rdma: cannot resolve %s to an "
		              "RDMA device: %s (%s)", c->peer, rc == -EPROTO ? rdma_event_str(got) :
		              "no answer", rc == -EPROTO ? ckpt_strerror(status) : "timeout");
		goto fail;
	}
	char what[NET_PEER_NAME_MAX + 32];
	snprintf(what, sizeof what, "the route to %s", c->peer);
	if ((rc = device_check(&c->rdma, r->id, what, r->dev, sizeof r->dev)))
		goto fail;
	if (rdma_resolve_route(r->id, ms_for_step(deadline))) {
		rc = ckpt_err(errno_code(), "rdma: rdma_resolve_route %s", c->peer);
		goto fail;
	}
	if ((rc = cm_expect(r->ch, ckpt_deadline_ms(ms_for_step(deadline) + 1000),
	                    RDMA_CM_EVENT_ROUTE_RESOLVED, &got, &status))) {
		rc = ckpt_err(rc == -EPROTO ? -EHOSTUNREACH : rc, "rdma: no route to %s: %s",
		              c->peer, rc == -EPROTO ? rdma_event_str(got) : "timeout");
		goto fail;
	}
	if ((rc = conn_resources(r)))
		goto fail;
	struct rdma_conn_param cp = { .responder_resources = 0, .initiator_depth = 0,
	                              .retry_count = 7, .rnr_retry_count = 7 };
	if (rdma_connect(r->id, &cp)) {
		rc = ckpt_err(errno_code(), "rdma: rdma_connect %s", c->peer);
		goto fail;
	}
	rc = cm_expect(r->ch, ckpt_deadline_ms(ms_for_step(deadline)), RDMA_CM_EVENT_ESTABLISHED,
	               &got, &status);
	if (rc == -EPROTO) {
		/* REJECTED with the cm's own status: no listener on that port. */
		if (got == RDMA_CM_EVENT_REJECTED)
			rc = ckpt_err(-ECONNREFUSED, "rdma: %s refused the connection (status %d)",
			              c->peer, status);
		else if (got == RDMA_CM_EVENT_UNREACHABLE || got == RDMA_CM_EVENT_CONNECT_ERROR)
			rc = ckpt_err(-ETIMEDOUT, "rdma: %s: %s (status %d)", c->peer,
			              rdma_event_str(got), status);
		else
			rc = ckpt_err(-ECONNRESET, "rdma: %s: %s while connecting", c->peer,
			              rdma_event_str(got));
	} else if (rc) {
		rc = ckpt_err(rc, "rdma: connecting to %s", c->peer);
	}
	if (rc)
		goto fail;
	c->priv = r;
	if ((rc = rdma_stream_start(c))) {
		c->priv = NULL;
		goto fail;
	}
	return 0;
fail:
	conn_free(r);
	return rc;
}

static int rdma_connect_op(struct net_conn *c, const char *addr, unsigned port, int timeout_ms)
{
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	int rc = port > 65535 ? ckpt_err(-EINVAL, "rdma: port %u out of range", port) : 0;
	if (rc || (rc = devices_check(&c->rdma)))
		return rc;
	struct addrinfo *ai;
	if ((rc = resolve(addr, port, false, -EHOSTUNREACH, &ai)))
		return rc;
	int backoff = RDMA_BACKOFF_MIN_MS, last = -ECONNREFUSED, attempts = 0;
	char why[512] = "";
	for (;;) {
		for (struct addrinfo *a = ai; a; a = a->ai_next) {
			attempts++;
			last = connect_once(c, a, deadline);
			if (last == 0) {
				freeaddrinfo(ai);
				return 0;
			}
			snprintf(why, sizeof why, "%s", ckpt_last_error());
		}
		/* Refused (the coordinator is not listening yet) or no answer: try
		 * again until the deadline. A missing device or route will not get
		 * better by waiting. */
		if (last != -ECONNREFUSED && last != -ETIMEDOUT && last != -ECONNRESET)
			break;
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0)
			break;
		ckpt_sleep_ms((unsigned)(left < 0 || left > backoff ? backoff : left));
		backoff = backoff * 2 > RDMA_BACKOFF_MAX_MS ? RDMA_BACKOFF_MAX_MS : backoff * 2;
	}
	freeaddrinfo(ai);
	return ckpt_err(last, "rdma: cannot connect to %s port %u (%d attempt%s in %d ms; last: %s)",
	                addr ? addr : "localhost", port, attempts, attempts == 1 ? "" : "s",
	                timeout_ms, why);
}

/* ---------------------------------------------------------------- the rest */

static int rdma_fd(const struct net_conn *c) { return ((const struct rdma_conn *)c->priv)->epfd; }

static void rdma_close_op(struct net_conn *c)
{
	struct rdma_conn *r = c->priv;
	if (!r)
		return;
	rdma_conn_linger(r);
	if (!r->shut)
		(void)rdma_disconnect(r->id);
	/* After the linger (a direct write's source must stay registered until it is
	 * sent) and before the PD goes, which refuses to go while MRs use it. */
	rdma_mr_release_all(r);
	conn_free(r);
	c->priv = NULL;
}

const struct net_transport_ops net_rdma_ops = {
	.name = "rdma",
	.listen = rdma_listen_op,
	.listener_fd = rdma_listener_fd,
	.accept = rdma_accept_op,
	.listener_close = rdma_listener_close,
	.connect = rdma_connect_op,
	.send = rdma_send,
	.recv_some = rdma_recv_some,
	.wait = rdma_wait,
	.fd = rdma_fd,
	.shutdown = rdma_shutdown,
	.close = rdma_close_op,
	.error_detail = rdma_error_detail,
	.mr_register = rdma_mr_register,
	.mr_deregister = rdma_mr_deregister,
	.write = rdma_write_direct,
	.write_wait = rdma_write_wait,
};
