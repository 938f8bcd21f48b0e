/*
 * tcp.c — the tcp transport: plain sockets behind struct net_transport_ops.
 *
 * IPv4 and IPv6, numeric addresses or names (getaddrinfo). Every socket is
 * non-blocking and close-on-exec; waiting is poll() under the caller's deadline,
 * so no call can block past its timeout. Connections get TCP_NODELAY (control
 * messages are small and latency-bound: PREPARE, COMMIT) and SO_KEEPALIVE (a
 * peer whose machine vanished is eventually noticed even on an idle connection).
 * getaddrinfo's EAI_* and errno are converted to our codes here.
 *
 * The byte transfer, waiting and teardown of a connected stream socket are not
 * tcp's own: they are exported here as net_sock_* (net_internal.h) and serve the
 * unix transport (unix.c) too.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net_internal.h"

#define TCP_BACKOFF_MIN_MS 10
#define TCP_BACKOFF_MAX_MS 250

int net_sock_fd_of(void *priv) { return ((const struct net_sock *)priv)->fd; }

/* getaddrinfo's codes are not errno values: convert them here. `unresolved` is
 * the caller's code for "no such address" (listen and connect differ, net.h). */
static int tcp_gai_err(int gai, int sys_errno, int unresolved, const char *addr,
                       unsigned port)
{
	int code;
	switch (gai) {
	case EAI_NONAME:
	case EAI_NODATA:
	case EAI_ADDRFAMILY:
	case EAI_FAIL:
		code = unresolved;
		break;
	case EAI_AGAIN:  code = -EAGAIN; break;
	case EAI_MEMORY: code = -ENOMEM; break;
	case EAI_SYSTEM: code = sys_errno > 0 ? -sys_errno : -EIO; break;
	default:         code = -EINVAL; break;
	}
	return ckpt_err(code, "tcp: cannot resolve '%s' port %u: %s", addr ? addr : "*", port,
	                gai_strerror(gai));
}

static int tcp_resolve(const char *addr, unsigned port, bool passive, int unresolved,
                       struct addrinfo **out)
{
	*out = NULL;
	if (port > 65535)
		return ckpt_err(-EINVAL, "tcp: port %u out of range", port);
	char serv[8];
	snprintf(serv, sizeof serv, "%u", port);
	struct addrinfo hints = {
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_protocol = IPPROTO_TCP,
		/* No AI_ADDRCONFIG: it hides 127.0.0.1 / ::1 on a machine whose only
		 * interface is loopback, which is exactly where single-node jobs run. */
		.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0),
	};
	/* An address literal ("10.0.0.1", "::1") is never looked up in DNS: a malformed
	 * one ("256.1.2.3") fails at once as a bad address, and a machine without a
	 * resolver (the GPU hosts) does not wait for one. */
	if (addr && addr[strspn(addr, "0123456789.")] == '\0')
		hints.ai_flags |= AI_NUMERICHOST;
	else if (addr && strchr(addr, ':'))
		hints.ai_flags |= AI_NUMERICHOST;
	int gai = getaddrinfo(addr, serv, &hints, out);
	if (gai)
		return tcp_gai_err(gai, errno, unresolved, addr, port);
	return 0;
}

/* "127.0.0.1:4242" or "[::1]:4242". */
static void tcp_format_addr(const struct sockaddr *sa, socklen_t len, char *out, size_t cap)
{
	char host[NI_MAXHOST], serv[NI_MAXSERV];
	if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv,
	                NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(out, cap, "?");
		return;
	}
	if (sa->sa_family == AF_INET6)
		snprintf(out, cap, "[%s]:%s", host, serv);
	else
		snprintf(out, cap, "%s:%s", host, serv);
}

static void tcp_conn_options(int fd)
{
	int one = 1;
	/* Best effort: a socket without these still works, only slower to notice a
	 * dead peer or slower on small messages; not worth failing a connection. */
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one))
		ckpt_log(CKPT_LOG_DEBUG, "tcp: TCP_NODELAY: %s", ckpt_strerror(-errno));
	if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one))
		ckpt_log(CKPT_LOG_DEBUG, "tcp: SO_KEEPALIVE: %s", ckpt_strerror(-errno));
}

int net_sock_new(void **priv, int fd)
{
	struct net_sock *s = ckpt_malloc(sizeof *s);
	if (!s) {
		close(fd);
		return ckpt_err(-ENOMEM, "tcp: socket state");
	}
	s->fd = fd;
	*priv = s;
	return 0;
}

/* poll one fd, retrying EINTR within the same deadline. > 0 ready, 0 timeout, -errno. */
int net_sock_poll(int fd, short events, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int r = poll(&p, 1, ckpt_deadline_left_ms(deadline));
		if (r >= 0)
			return r;
		if (errno != EINTR)
			return -errno;
	}
}

/* ---------------------------------------------------------------- listen, accept */

static int tcp_listen(struct net_listener *l, const char *addr, unsigned port)
{
	struct addrinfo *ai;
	int rc = tcp_resolve(addr, port, true, -EADDRNOTAVAIL, &ai);
	if (rc)
		return rc;
	int fd = -1, err = EADDRNOTAVAIL;
	for (struct addrinfo *a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		            a->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		int one = 1;
		/* A restarted coordinator must be able to bind its port again while old
		 * connections sit in TIME_WAIT. (It does not allow two live listeners.) */
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
		    bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
			break;
		err = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return ckpt_err(-err, "tcp: cannot listen on %s port %u", addr ? addr : "*", port);

	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &len)) {
		err = errno;
		close(fd);
		return ckpt_err(-err, "tcp: getsockname of listener on %s", addr ? addr : "*");
	}
	l->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
	                                   : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	return net_sock_new(&l->priv, fd);
}

int net_sock_listener_fd(const struct net_listener *l) { return net_sock_fd_of(l->priv); }

void net_sock_listener_close(struct net_listener *l)
{
	if (!l->priv)
		return;
	close(net_sock_fd_of(l->priv));
	ckpt_free(l->priv);
	l->priv = NULL;
}

static int tcp_accept(struct net_listener *l, int timeout_ms, struct net_conn *c)
{
	int lfd = net_sock_fd_of(l->priv);
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof ss;
		int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			tcp_conn_options(fd);
			tcp_format_addr((struct sockaddr *)&ss, len, c->peer, sizeof c->peer);
			return net_sock_new(&c->priv, fd);
		}
		switch (errno) {
		case EAGAIN:
		case EINTR:
		/* accept(2): errors of the connection being accepted, not of the
		 * listener; that client is gone, wait for the next. */
		case ECONNABORTED: case EPROTO: case ENETDOWN: case ENOPROTOOPT:
		case EHOSTDOWN: case ENONET: case EHOSTUNREACH: case ENETUNREACH:
			break;
		default:
			return ckpt_err(-errno, "tcp: accept on port %u", l->port);
		}
		if (errno == EINTR)
			continue;
		if (ckpt_deadline_left_ms(deadline) == 0) {
			if (timeout_ms == 0)
				return -EAGAIN;
			return ckpt_err(-ETIMEDOUT, "tcp: no connection on port %u within %d ms",
			                l->port, timeout_ms);
		}
		int r = net_sock_poll(lfd, POLLIN, deadline);
		if (r < 0)
			return ckpt_err(r, "tcp: waiting for connections on port %u", l->port);
	}
}

/* ---------------------------------------------------------------- connect */

/* One attempt on one address: 0 and *fd_out, or -errno (-ETIMEDOUT when the
 * deadline passed while the handshake was in flight). */
static int tcp_connect_once(const struct addrinfo *a, uint64_t deadline, int *fd_out)
{
	int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
	                a->ai_protocol);
	if (fd < 0)
		return -errno;
	int err = 0;
	if (connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
		err = errno;
		if (err == EINPROGRESS || err == EINTR) {
			int r = net_sock_poll(fd, POLLOUT, deadline);
			if (r == 0) {
				err = ETIMEDOUT;
			} else if (r < 0) {
				err = -r;
			} else {
				socklen_t len = sizeof err;
				if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len))
					err = errno;
			}
		}
	}
	if (err) {
		close(fd);
		return -err;
	}
	*fd_out = fd;
	return 0;
}

static int tcp_connect(struct net_conn *c, const char *addr, unsigned port, int timeout_ms)
{
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	struct addrinfo *ai;
	int rc = tcp_resolve(addr, port, false, -EHOSTUNREACH, &ai);
	if (rc)
		return rc;
	int backoff = TCP_BACKOFF_MIN_MS, last = -ECONNREFUSED, attempts = 0;
	for (;;) {
		for (struct addrinfo *a = ai; a; a = a->ai_next) {
			int fd = -1;
			attempts++;
			last = tcp_connect_once(a, deadline, &fd);
			if (last == 0) {
				tcp_conn_options(fd);
				tcp_format_addr(a->ai_addr, a->ai_addrlen, c->peer, sizeof c->peer);
				freeaddrinfo(ai);
				return net_sock_new(&c->priv, fd);
			}
		}
		/* Refused (nobody listens yet: the coordinator may still be starting),
		 * reset, or a SYN that timed out: try again until the deadline. Anything
		 * else (no route, bad address) will not get better by waiting. */
		if (last != -ECONNREFUSED && last != -ECONNRESET && last != -ETIMEDOUT &&
		    last != -EAGAIN && last != -EINTR)
			break;
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0)
			break;
		ckpt_sleep_ms((unsigned)(left < 0 || left > backoff ? backoff : left));
		backoff = backoff * 2 > TCP_BACKOFF_MAX_MS ? TCP_BACKOFF_MAX_MS : backoff * 2;
	}
	freeaddrinfo(ai);
	if (last == -ENETUNREACH)
		last = -EHOSTUNREACH;   /* one code for "no route" in net.h */
	return ckpt_err(last, "tcp: cannot connect to %s port %u (%d attempt%s in %d ms)",
	                addr ? addr : "localhost", port, attempts, attempts == 1 ? "" : "s",
	                timeout_ms);
}

/* ---------------------------------------------------------------- bytes */

ssize_t net_sock_send(struct net_conn *c, const struct iovec *iov, int iovcnt)
{
	struct msghdr mh = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
	/* MSG_NOSIGNAL: a vanished peer is -EPIPE for the caller, never SIGPIPE for
	 * the training process. */
	ssize_t n = sendmsg(net_sock_fd_of(c->priv), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	return n >= 0 ? n : -(ssize_t)errno;
}

ssize_t net_sock_recv_some(struct net_conn *c, void *buf, size_t len)
{
	ssize_t n = recv(net_sock_fd_of(c->priv), buf, len, MSG_DONTWAIT);
	return n >= 0 ? n : -(ssize_t)errno;
}

int net_sock_wait(struct net_conn *c, short events, int timeout_ms)
{
	struct pollfd p = { .fd = net_sock_fd_of(c->priv), .events = events };
	int r = poll(&p, 1, timeout_ms);
	return r >= 0 ? r : -errno;
}

int net_sock_fd(const struct net_conn *c) { return net_sock_fd_of(c->priv); }

void net_sock_shutdown(struct net_conn *c)
{
	/* ENOTCONN when the peer already went: nothing left to end. */
	(void)shutdown(net_sock_fd_of(c->priv), SHUT_RDWR);
}

void net_sock_close(struct net_conn *c)
{
	if (!c->priv)
		return;
	close(net_sock_fd_of(c->priv));
	ckpt_free(c->priv);
	c->priv = NULL;
}

const struct net_transport_ops net_tcp_ops = {
	.name = "tcp",
	.listen = tcp_listen,
	.listener_fd = net_sock_listener_fd,
	.accept = tcp_accept,
	.listener_close = net_sock_listener_close,
	.connect = tcp_connect,
	.send = net_sock_send,
	.recv_some = net_sock_recv_some,
	.wait = net_sock_wait,
	.fd = net_sock_fd,
	.shutdown = net_sock_shutdown,
	.close = net_sock_close,
};
