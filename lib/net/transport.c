/*
 * transport.c — the transport-independent half of net.h's connection API:
 * picking a transport's ops table, creating and freeing listeners and
 * connections, and their names, fds and limits. The transport itself (tcp.c)
 * only fills in priv, peer and port.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net_internal.h"

int net_transport_ops_get(int transport, const struct net_transport_ops **out)
{
	*out = NULL;
	switch (transport) {
	case NET_TCP:
		*out = &net_tcp_ops;
		return 0;
	case NET_UNIX:
		*out = &net_unix_ops;
		return 0;
	case NET_RDMA:
#ifdef CKPT_HAVE_RDMA
		*out = &net_rdma_ops;
		return 0;
#else
		/* Asked for by name: say so, never fall back to tcp. */
		return ckpt_err(CKPT_ENODEV, "rdma transport is not available in this build "
		                "(built without libibverbs/librdmacm)");
#endif
	default:
		return ckpt_err(CKPT_ENODEV, "unknown transport %d", transport);
	}
}

int net_listen(int transport, const struct net_rdma_opts *rdma, const char *addr,
               unsigned port, struct net_listener **out)
{
	*out = NULL;
	const struct net_transport_ops *ops;
	int rc = net_transport_ops_get(transport, &ops);
	if (rc)
		return rc;
	struct net_listener *l = ckpt_calloc(1, sizeof *l);
	if (!l)
		return ckpt_err(-ENOMEM, "%s: listener", ops->name);
	l->ops = ops;
	if (rdma)
		l->rdma = *rdma;
	rc = ops->listen(l, addr, port);
	if (rc) {
		ckpt_free(l);
		return rc;
	}
	*out = l;
	return 0;
}

unsigned net_listener_port(const struct net_listener *l) { return l->port; }
int net_listener_fd(const struct net_listener *l) { return l->ops->listener_fd(l); }

void net_listener_close(struct net_listener *l)
{
	if (!l)
		return;
	l->ops->listener_close(l);
	ckpt_free(l);
}

static struct net_conn *conn_new(const struct net_transport_ops *ops,
                                 const struct net_rdma_opts *rdma)
{
	struct net_conn *c = ckpt_calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->ops = ops;
	if (rdma)
		c->rdma = *rdma;
	c->max_msg = NET_DEFAULT_MAX_MSG;
	atomic_init(&c->broken, 0);
	return c;
}

static void conn_name_init(struct net_conn *c)
{
	snprintf(c->name, sizeof c->name, "%s %s", c->ops->name, c->peer);
}

int net_accept(struct net_listener *l, int timeout_ms, struct net_conn **out)
{
	*out = NULL;
	struct net_conn *c = conn_new(l->ops, &l->rdma);
	if (!c)
		return ckpt_err(-ENOMEM, "%s: accept", l->ops->name);
	int rc = l->ops->accept(l, timeout_ms, c);
	if (rc) {
		ckpt_free(c);
		return rc;
	}
	conn_name_init(c);
	*out = c;
	return 0;
}

int net_connect(int transport, const struct net_rdma_opts *rdma, const char *addr,
                unsigned port, int timeout_ms, struct net_conn **out)
{
	*out = NULL;
	const struct net_transport_ops *ops;
	int rc = net_transport_ops_get(transport, &ops);
	if (rc)
		return rc;
	struct net_conn *c = conn_new(ops, rdma);
	if (!c)
		return ckpt_err(-ENOMEM, "%s: connect", ops->name);
	rc = ops->connect(c, addr, port, timeout_ms);
	if (rc) {
		ckpt_free(c);
		return rc;
	}
	conn_name_init(c);
	*out = c;
	return 0;
}

void net_close(struct net_conn *c)
{
	if (!c)
		return;
	c->ops->close(c);
	if (!c->rx.borrowed)
		ckpt_free(c->rx.payload);
	ckpt_free(c);
}

bool net_conn_broken(const struct net_conn *c) { return atomic_load(&c->broken) != 0; }

const char *net_conn_name(const struct net_conn *c) { return c ? c->name : "(no connection)"; }
int net_conn_fd(const struct net_conn *c) { return c->ops->fd(c); }

void net_conn_set_max_msg(struct net_conn *c, size_t max)
{
	/* The length field is 32 bits: a larger limit cannot be reached anyway. */
	c->max_msg = max > UINT32_MAX ? UINT32_MAX : max;
}

void net_conn_name_suffix(struct net_conn *c, const char *suffix)
{
	size_t n = strlen(c->name);
	snprintf(c->name + n, sizeof c->name - n, " %s", suffix);
}

void net_conn_shutdown(struct net_conn *c)
{
	if (c)
		net_conn_break(c, -ECONNABORTED);
}

int net_conn_break(struct net_conn *c, int code)
{
	int expected = 0;
	/* Keep the first cause: a later -EPIPE says less than the EPROTO before it. */
	if (atomic_compare_exchange_strong(&c->broken, &expected, code))
		c->ops->shutdown(c);
	return code;
}

/* ---------------------------------------------------------------- RDMA WRITE */

bool net_conn_can_write(const struct net_conn *c) { return c && c->ops->write != NULL; }

int net_mr_register(struct net_conn *c, void *addr, size_t len, int access,
                    struct net_mr **out)
{
	*out = NULL;
	if (!c->ops->mr_register)
		return ckpt_err(-EOPNOTSUPP, "%s: the %s transport has no RDMA WRITE", c->name,
		                c->ops->name);
	if (!len || (access != NET_MR_LOCAL && access != NET_MR_REMOTE_WRITE))
		return ckpt_err(-EINVAL, "%s: registration of %zu bytes (access %d)", c->name, len,
		                access);
	return c->ops->mr_register(c, addr, len, access, out);
}

uint32_t net_mr_rkey(const struct net_mr *mr) { return mr->rkey; }

void net_mr_deregister(struct net_mr *mr)
{
	if (mr)
		mr->c->ops->mr_deregister(mr);
}

int net_rdma_write(struct net_conn *c, const struct net_mr *mr, const void *local, size_t len,
                   uint64_t remote_addr, uint32_t rkey, uint64_t *ticket, int timeout_ms)
{
	*ticket = 0;
	if (!c->ops->write)
		return ckpt_err(-EOPNOTSUPP, "%s: the %s transport has no RDMA WRITE", c->name,
		                c->ops->name);
	const uint8_t *p = local;
	if (mr->c != c || len == 0 || len > UINT32_MAX || p < mr->addr ||
	    (size_t)(p - mr->addr) > mr->len || len > mr->len - (size_t)(p - mr->addr))
		return ckpt_err(-EINVAL, "%s: RDMA WRITE of %zu bytes from outside its registration",
		                c->name, len);
	int rc = atomic_load(&c->broken);
	if (rc)
		return ckpt_err(rc, "%s: connection already failed", c->name);
	rc = c->ops->write(c, mr, local, len, remote_addr, rkey, ticket, timeout_ms);
	if (rc && rc != -EAGAIN && rc != -ETIMEDOUT) {
		const char *why = c->ops->error_detail ? c->ops->error_detail(c) : NULL;
		net_conn_break(c, rc);
		return ckpt_err(rc, "%s: RDMA WRITE of %zu bytes%s%s", c->name, len,
		                why ? ": " : "", why ? why : "");
	}
	if (rc == -ETIMEDOUT)
		return ckpt_err(rc, "%s: no room for an RDMA WRITE within %d ms", c->name, timeout_ms);
	return rc;
}

int net_rdma_write_wait(struct net_conn *c, uint64_t ticket, int timeout_ms)
{
	if (!c->ops->write_wait)
		return ckpt_err(-EOPNOTSUPP, "%s: the %s transport has no RDMA WRITE", c->name,
		                c->ops->name);
	int rc = c->ops->write_wait(c, ticket, timeout_ms);
	if (rc && rc != -EAGAIN && rc != -ETIMEDOUT) {
		const char *why = c->ops->error_detail ? c->ops->error_detail(c) : NULL;
		net_conn_break(c, rc);
		return ckpt_err(rc, "%s: RDMA WRITE #%llu%s%s", c->name, (unsigned long long)ticket,
		                why ? ": " : "", why ? why : "");
	}
	if (rc == -ETIMEDOUT)
		return ckpt_err(rc, "%s: RDMA WRITE #%llu not complete within %d ms", c->name,
		                (unsigned long long)ticket, timeout_ms);
	return rc;
}
