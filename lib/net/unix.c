/*
 * unix.c — the unix-domain stream transport: connections between processes of one
 * machine, used between a node's ranks and their node leader (the hierarchical
 * commit, docs/protocol.md §2.8).
 *
 * The address is a name, not a host: "@name" is a Linux abstract socket (no file,
 * gone with the process that listened, so a crashed leader leaves nothing behind
 * and a restarted one can bind again at once), anything else a filesystem path.
 * The port is not used (net_listener_port says 0). Refused or absent names are
 * retried until the deadline, like tcp's refused connections: the listener may not
 * be up yet. Bytes, waits and teardown are the stream-socket code of tcp.c.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "net_internal.h"

#define UNIX_BACKOFF_MIN_MS 5
#define UNIX_BACKOFF_MAX_MS 100

/* addr -> sockaddr_un; *len the length to pass (abstract names are not NUL-ended). */
static int unix_addr(const char *addr, struct sockaddr_un *sa, socklen_t *len)
{
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	size_t n = addr ? strlen(addr) : 0;
	if (n == 0 || (n == 1 && addr[0] == '@'))
		return ckpt_err(-EINVAL, "unix: empty socket name");
	if (n >= sizeof sa->sun_path)
		return ckpt_err(-ENAMETOOLONG, "unix: socket name '%s' longer than %zu bytes", addr,
		                sizeof sa->sun_path - 1);
	memcpy(sa->sun_path, addr, n);
	if (addr[0] == '@')
		sa->sun_path[0] = '\0';
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (addr[0] == '@' ? 0 : 1));
	return 0;
}

static int unix_listen(struct net_listener *l, const char *addr, unsigned port)
{
	(void)port;
	struct sockaddr_un sa;
	socklen_t len = 0;
	int rc = unix_addr(addr, &sa, &len);
	if (rc)
		return rc;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return ckpt_err(-errno, "unix: socket for %s", addr);
	if (bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, SOMAXCONN) < 0) {
		int err = errno;
		close(fd);
		return ckpt_err(-err, "unix: cannot listen on %s", addr);
	}
	l->port = 0;
	return net_sock_new(&l->priv, fd);
}

static int unix_accept(struct net_listener *l, int timeout_ms, struct net_conn *c)
{
	int lfd = net_sock_fd_of(l->priv);
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			/* The peer has no address of its own; the handshake names its rank. */
			snprintf(c->peer, sizeof c->peer, "local");
			return net_sock_new(&c->priv, fd);
		}
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			return ckpt_err(-errno, "unix: accept");
		if (errno == EINTR)
			continue;
		if (ckpt_deadline_left_ms(deadline) == 0) {
			if (timeout_ms == 0)
				return -EAGAIN;
			return ckpt_err(-ETIMEDOUT, "unix: no connection within %d ms", timeout_ms);
		}
		int r = net_sock_poll(lfd, POLLIN, deadline);
		if (r < 0)
			return ckpt_err(r, "unix: waiting for connections");
	}
}

static int unix_connect(struct net_conn *c, const char *addr, unsigned port, int timeout_ms)
{
	(void)port;
	struct sockaddr_un sa;
	socklen_t len = 0;
	int rc = unix_addr(addr, &sa, &len);
	if (rc)
		return rc;
	uint64_t deadline = ckpt_deadline_ms(timeout_ms);
	int backoff = UNIX_BACKOFF_MIN_MS, err = ECONNREFUSED, attempts = 0;
	for (;;) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return ckpt_err(-errno, "unix: socket for %s", addr);
		attempts++;
		/* A unix connect completes at once or fails (EAGAIN: the backlog is
		 * full, a listener that is busy: try again). */
		if (connect(fd, (struct sockaddr *)&sa, len) == 0) {
			snprintf(c->peer, sizeof c->peer, "%s", addr);
			return net_sock_new(&c->priv, fd);
		}
		err = errno;
		close(fd);
		/* Nobody listens yet (the leader may still be starting). */
		if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN && err != EINTR)
			break;
		int left = ckpt_deadline_left_ms(deadline);
		if (left == 0)
			break;
		ckpt_sleep_ms((unsigned)(left < 0 || left > backoff ? backoff : left));
		backoff = backoff * 2 > UNIX_BACKOFF_MAX_MS ? UNIX_BACKOFF_MAX_MS : backoff * 2;
	}
	if (err == ENOENT || err == EAGAIN)
		err = ECONNREFUSED;
	return ckpt_err(-err, "unix: cannot connect to %s (%d attempt%s in %d ms)", addr, attempts,
	                attempts == 1 ? "" : "s", timeout_ms);
}

const struct net_transport_ops net_unix_ops = {
	.name = "unix",
	.listen = unix_listen,
	.listener_fd = net_sock_listener_fd,
	.accept = unix_accept,
	.listener_close = net_sock_listener_close,
	.connect = unix_connect,
	.send = net_sock_send,
	.recv_some = net_sock_recv_some,
	.wait = net_sock_wait,
	.fd = net_sock_fd,
	.shutdown = net_sock_shutdown,
	.close = net_sock_close,
};
