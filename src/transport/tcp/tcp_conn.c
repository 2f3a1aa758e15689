/*
 * tcp_conn.c - connection set-up of the TCP provider (tcp.c has the
 * overview): socket helpers, the 72-byte hello exchange, the listener with
 * its pending connections, accept, reject and connect.
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "transport/tcp/tcp_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* sockets and the handshake                                                */

void rps__tcp_sockaddr_str(const struct sockaddr *sa, socklen_t salen, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN], serv[8];

	if (getnameinfo(sa, salen, host, sizeof(host), serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(buf, len, "?");
		return;
	}
	if (sa->sa_family == AF_INET6)
		snprintf(buf, len, "[%s]:%s", host, serv);
	else
		snprintf(buf, len, "%s:%s", host, serv);
}

/* Options of a data socket: no Nagle (acks and small ops must leave at
 * once), keepalive so that a peer that vanished without FIN is noticed. */
static void sock_tune(int fd)
{
	int one = 1, idle = 10, intvl = 5, cnt = 3;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

/* Wait for events on a non-blocking socket until deadline (0: forever). */
static int fd_wait(int fd, short events, uint64_t deadline)
{
	struct pollfd pfd = { .fd = fd, .events = events };
	int timeout, ret;

	for (;;) {
		timeout = -1;
		if (deadline) {
			uint64_t now = rps__now_ns();

			if (now >= deadline)
				return -ETIMEDOUT;
			timeout = (int)RPS__MIN((deadline - now + 999999) / 1000000, (uint64_t)INT32_MAX);
		}
		ret = poll(&pfd, 1, timeout);
		if (ret > 0)
			return 0;
		if (ret < 0 && errno != EINTR)
			return -errno;
	}
}

/* Not common/fsutil.h's rps__write_all: the socket is non-blocking, a dead
 * peer must not raise SIGPIPE (MSG_NOSIGNAL), and the wait has a deadline. */
static int fd_write_all(int fd, const void *buf, size_t len, uint64_t deadline)
{
	const uint8_t *p = buf;
	ssize_t n;
	int ret;

	while (len) {
		n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		ret = fd_wait(fd, POLLOUT, deadline);
		if (ret < 0)
			return ret;
	}
	return 0;
}

static int hello_send(int fd, enum hello_type type, const struct ep_sizes *sz,
		      const void *data, size_t len, uint64_t deadline)
{
	struct wire_hello h = {
		.magic = TCP_MAGIC,
		.version = TCP_VERSION,
		.type = (uint8_t)type,
		.data_len = (uint8_t)len,
		.sq_depth = sz ? sz->sq_depth : 1,
		.rq_depth = sz ? sz->rq_depth : 1,
	};
	uint8_t raw[TCP_HELLO_SIZE];

	if (len)
		memcpy(h.data, data, len);
	rps__tcp_hello_put(raw, &h);
	return fd_write_all(fd, raw, sizeof(raw), deadline);
}

static int ep_sizes_resolve(const struct rps__ep_attr *attr, struct ep_sizes *sz, const char *what)
{
	sz->sq_depth = attr && attr->sq_depth ? attr->sq_depth : 128;
	sz->rq_depth = attr && attr->rq_depth ? attr->rq_depth : 128;
	sz->max_inline = attr && attr->max_inline ? attr->max_inline : 64;
	if (sz->sq_depth > TCP_MAX_DEPTH || sz->rq_depth > TCP_MAX_DEPTH)
		return rps__seterr(-EINVAL, "%s: sq_depth %u / rq_depth %u exceed the tcp limit of %u: ask for less",
				   what, sz->sq_depth, sz->rq_depth, TCP_MAX_DEPTH);
	if (sz->max_inline > TCP_MAX_INLINE)
		return rps__seterr(-EINVAL, "%s: max_inline %u exceeds the tcp limit of %u: register the buffer instead",
				   what, sz->max_inline, TCP_MAX_INLINE);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* connections                                                              */

/* The test hook tcp-hello-timeout-ms:MS shortens the 10 s a connection
 * may take to send its hello (rdmapsd(8) ENVIRONMENT); only in a build
 * with the hooks (common/fault.h). */
static uint64_t hello_timeout_ns(void)
{
	long ms;

	if (!rps__fault_arg("tcp-hello-timeout-ms:", &ms) || ms < 1 || ms > 3600000)
		return TCP_HELLO_TIMEOUT_NS;
	return (uint64_t)ms * 1000000ull;
}

int rps__tcp_listen(struct rps__fabric *base, const char *host, uint16_t port, struct rps__listener **out)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	struct sockaddr_storage ss = { 0 };
	socklen_t slen = sizeof(ss);
	struct addrinfo *res, *ai;
	struct tcp_listener *l;
	char portstr[8];
	int fd = -1, ret, gai, one = 1, last_errno = 0;

	if (!host || !*host)
		host = "0.0.0.0";
	snprintf(portstr, sizeof(portstr), "%u", port);
	gai = getaddrinfo(host, portstr, &hints, &res);
	if (gai)
		return rps__seterr(-EADDRNOTAVAIL, "listen on %s:%u: cannot resolve: %s: check the address",
				   host, port, gai_strerror(gai));
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			last_errno = errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
			break;
		last_errno = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return rps__seterr(-last_errno, "listen on %s:%u: %s: %s", host, port, strerror(last_errno),
				   last_errno == EADDRINUSE ? "another process holds the port, pick another (or 0)"
							    : "check that the address is local to this machine");

	l = calloc(1, sizeof(*l));
	if (!l) {
		ret = rps__seterr(-ENOMEM, "listen: out of memory");
		goto err_close_fd;
	}
	if (getsockname(fd, (struct sockaddr *)&ss, &slen)) {
		ret = rps__seterr(-errno, "listen on %s:%u: getsockname: %s", host, port, strerror(errno));
		goto err_free;
	}
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		ret = rps__seterr(-errno, "listen: epoll_create1: %s: raise the open file limit (ulimit -n)",
				  strerror(errno));
		goto err_free;
	}
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev)) {
		ret = rps__seterr(-errno, "listen: epoll_ctl: %s", strerror(errno));
		goto err_close_ep;
	}
	l->base.fab = base;
	l->base.port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						      : ((struct sockaddr_in *)&ss)->sin_port);
	l->fab = fab;
	l->fd = fd;
	l->hello_timeout_ns = hello_timeout_ns();
	l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);	/* (-1: no shedding) */
	*out = &l->base;
	return 0;

err_close_ep:
	close(l->epfd);
err_free:
	free(l);
err_close_fd:
	close(fd);
	return ret;
}

int rps__tcp_listener_fd(struct rps__listener *base)
{
	return rps__container_of(base, struct tcp_listener, base)->epfd;
}

static void pending_unlink(struct tcp_listener *l, struct tcp_pending *p)
{
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, p->fd, NULL);
	if (l->pending == p)
		l->pending = p->next;
	if (p->prev)
		p->prev->next = p->next;
	if (p->next)
		p->next->prev = p->prev;
	if (l->pending_tail == p)
		l->pending_tail = p->prev;
	l->npending--;
}

static void pending_drop(struct tcp_listener *l, struct tcp_pending *p)
{
	pending_unlink(l, p);
	close(p->fd);
	free(p);
}

/* Connections that never finished their hello are dropped, so that a port
 * scanner cannot pin file descriptors forever. */
static void listener_reap_stale(struct tcp_listener *l)
{
	struct tcp_pending *p, *next;
	uint64_t now;

	if (!l->pending)
		return;
	now = rps__now_ns();
	for (p = l->pending; p; p = next) {
		next = p->next;
		if (now - p->since_ns > l->hello_timeout_ns)
			pending_drop(l, p);
	}
}

/* Out of descriptors: take the oldest connection waiting in the backlog
 * with the reserve descriptor and close it (its connector sees the
 * connection closed, and dials again later).  Said once a second.  False
 * if nothing could be shed (no reserve, or nothing waiting). */
static bool listener_shed(struct tcp_listener *l, int why)
{
	uint64_t now = rps__now_ns();
	int fd;

	if (l->reserve_fd < 0)
		return false;
	close(l->reserve_fd);
	fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd >= 0) {
		close(fd);
		l->shed++;
	}
	l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (l->shed > l->shed_said && now - l->shed_said_ns >= 1000000000ull) {
		rps__log(RPS__LOG_WARN, "listener on port %u: %s: %llu connections closed unread so far: raise the "
			 "open file limit (ulimit -n)", l->base.port, strerror(why), (unsigned long long)l->shed);
		l->shed_said = l->shed;
		l->shed_said_ns = now;
	}
	return fd >= 0;
}

/* Take every connection the backlog holds.  False if it could not (out of
 * descriptors or memory, and nothing to shed): the listener stays
 * readable, and the caller must not ask again at once. */
static bool listener_accept_all(struct tcp_listener *l)
{
	struct sockaddr_storage ss = { 0 };
	struct tcp_pending *p;
	struct epoll_event ev = { .events = EPOLLIN };
	socklen_t slen;
	int fd;

	for (;;) {
		slen = sizeof(ss);
		fd = accept4(l->fd, (struct sockaddr *)&ss, &slen, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return true;
			if ((errno == EMFILE || errno == ENFILE) && listener_shed(l, errno))
				continue;
			return false;	/* (ENOBUFS & co: retried at the next turn) */
		}
		/* full: the oldest silent connection goes, not the newcomer,
		 * or a thousand idle sockets would lock every client out */
		if (l->npending >= TCP_MAX_PENDING)
			pending_drop(l, l->pending_tail);
		p = calloc(1, sizeof(*p));
		if (!p) {
			close(fd);
			continue;
		}
		p->fd = fd;
		p->since_ns = rps__now_ns();
		rps__tcp_sockaddr_str((struct sockaddr *)&ss, slen, p->peer, sizeof(p->peer));
		ev.data.ptr = p;
		if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev)) {
			close(fd);
			free(p);
			continue;
		}
		p->next = l->pending;
		if (l->pending)
			l->pending->prev = p;
		else
			l->pending_tail = p;
		l->pending = p;
		l->npending++;
	}
}

/* Read what arrived of p's hello.  1 and *out when it is complete and valid. */
static int pending_progress(struct tcp_listener *l, struct tcp_pending *p, struct rps__conn_req **out)
{
	struct tcp_conn_req *req;
	struct wire_hello h;
	ssize_t n;

	n = recv(p->fd, p->hello + p->got, TCP_HELLO_SIZE - p->got, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	if (n <= 0) {
		pending_drop(l, p);
		return 0;
	}
	p->got += (uint32_t)n;
	if (p->got < TCP_HELLO_SIZE)
		return 0;
	rps__tcp_hello_get(&h, p->hello);
	if (rps__tcp_hello_check(&h, p->peer) || h.type != HELLO_CONNECT) {
		/* tell a real rdmaps peer why, then hang up; the listener goes on */
		hello_send(p->fd, HELLO_BAD_PROTOCOL, NULL, NULL, 0, rps__now_ns() + 1000000);
		pending_drop(l, p);
		return 0;
	}
	req = calloc(1, sizeof(*req));
	if (!req) {
		pending_drop(l, p);
		return 0;
	}
	req->base.fab = &l->fab->base;
	req->base.len = h.data_len;
	memcpy(req->base.data, h.data, h.data_len);
	req->fab = l->fab;
	req->fd = p->fd;
	req->peer_sq_depth = h.sq_depth;
	req->base.peer_sq_depth = h.sq_depth;
	snprintf(req->peer, sizeof(req->peer), "%s", p->peer);
	snprintf(req->base.peer, sizeof(req->base.peer), "%s", p->peer);
	pending_unlink(l, p);
	free(p);
	*out = &req->base;
	return 1;
}

int rps__tcp_listener_get_request(struct rps__listener *base, struct rps__conn_req **out)
{
	struct tcp_listener *l = rps__container_of(base, struct tcp_listener, base);
	struct epoll_event evs[16];
	bool stuck = false;
	int i, n;

	listener_reap_stale(l);
	for (;;) {
		n = epoll_wait(l->epfd, evs, RPS__ARRAY_SIZE(evs), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return rps__seterr(-errno, "listener: epoll_wait: %s", strerror(errno));
		if (n == 0)
			return rps__seterr(-EAGAIN, "listener: no connection request waiting: poll rps__listener_fd()");
		/* level-triggered: events not looked at now are reported again */
		for (i = 0; i < n; i++) {
			if (!evs[i].data.ptr)
				stuck |= !listener_accept_all(l);
			else if (pending_progress(l, evs[i].data.ptr, out))
				return 0;
		}
		/* a backlog we cannot take stays readable: looping on it here
		 * would never return to the caller's loop (its timers, its
		 * stop); it is tried again at the next call */
		if (stuck)
			return rps__seterr(-EMFILE, "listener: cannot accept now (out of descriptors or memory): "
					   "raise the open file limit (ulimit -n)");
	}
}

void rps__tcp_listener_close(struct rps__listener *base)
{
	struct tcp_listener *l = rps__container_of(base, struct tcp_listener, base);

	while (l->pending)
		pending_drop(l, l->pending);
	if (l->reserve_fd >= 0)
		close(l->reserve_fd);
	close(l->epfd);
	close(l->fd);
	free(l);
}

int rps__tcp_accept(struct rps__conn_req *base, struct rps__cq *cq_base, const struct rps__ep_attr *attr,
		    const void *data, size_t len, struct rps__ep **out)
{
	struct tcp_conn_req *req = rps__container_of(base, struct tcp_conn_req, base);
	struct tcp_cq *cq = rps__container_of(cq_base, struct tcp_cq, base);
	struct ep_sizes sz;
	struct tcp_ep *ep = NULL;
	int ret;

	ret = ep_sizes_resolve(attr, &sz, "accept");
	if (ret)
		goto err_refuse;
	ret = rps__tcp_ep_create(req->fab, cq, req->fd, &sz, req->peer_sq_depth, req->peer, &ep);
	if (ret)
		goto err_refuse;
	sock_tune(req->fd);
	ret = hello_send(req->fd, HELLO_ACCEPT, &sz, data, len, rps__now_ns() + TCP_ACCEPT_TIMEOUT_NS);
	if (ret) {
		ret = rps__seterr(ret, "accept from %s: sending the reply failed: %s: the peer gave up, "
				  "it may retry", req->peer, strerror(-ret));
		goto err_free_ep;
	}
	ret = rps__tcp_ep_bind(ep);
	if (ret)
		goto err_free_ep;
	free(req);
	*out = &ep->base;
	return 0;

err_free_ep:
	rps__tcp_ep_free(ep);
	close(req->fd);
	free(req);
	return ret;
err_refuse:
	/* the connector must not wait for a reply that never comes */
	hello_send(req->fd, HELLO_REJECT, NULL, NULL, 0, rps__now_ns() + 1000000);
	close(req->fd);
	free(req);
	return ret;
}

int rps__tcp_reject(struct rps__conn_req *base, const void *data, size_t len)
{
	struct tcp_conn_req *req = rps__container_of(base, struct tcp_conn_req, base);
	int ret;

	ret = hello_send(req->fd, HELLO_REJECT, NULL, data, len, rps__now_ns() + TCP_ACCEPT_TIMEOUT_NS);
	if (ret)
		ret = rps__seterr(ret, "reject %s: sending the reply failed: %s: the peer gave up already",
				  req->peer, strerror(-ret));
	/* FIN after the reply: we read the whole hello, so close() sends no RST */
	shutdown(req->fd, SHUT_WR);
	close(req->fd);
	free(req);
	return ret;
}

/*
 * Connecting, as a dial the caller steps (transport.h): the socket's
 * connect to each address of host in turn, our hello out, the listener's
 * reply in, none of which waits.  rps__tcp_connect() is the same dial with
 * a poll() between the steps.
 */
enum dial_state { DIAL_CONNECT, DIAL_HELLO_OUT, DIAL_HELLO_IN };

struct tcp_dial {
	struct rps__dial base;
	struct tcp_fabric *fab;
	struct tcp_cq *cq;
	struct ep_sizes sz;
	enum dial_state state;
	struct addrinfo *res, *ai;	/* the address tried now */
	int fd;				/* -1: the next address is to be tried */
	int err;			/* why the last address failed */
	uint64_t deadline;
	char host[256];
	uint16_t port;
	char peer[64];
	uint8_t out[TCP_HELLO_SIZE];
	uint32_t sent;
	uint8_t in[TCP_HELLO_SIZE];
	uint32_t got;
};

static void dial_free(struct tcp_dial *d)
{
	if (d->fd >= 0)
		close(d->fd);
	if (d->res)
		freeaddrinfo(d->res);
	free(d);
}

int rps__tcp_dial_start(struct rps__fabric *base, const char *host, uint16_t port, struct rps__cq *cq_base,
			const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
			struct rps__dial **out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
	struct wire_hello h = { .magic = TCP_MAGIC, .version = TCP_VERSION, .type = HELLO_CONNECT };
	struct tcp_dial *d;
	char portstr[8];
	int ret, gai;

	if (!host || !*host)
		host = "127.0.0.1";
	d = calloc(1, sizeof(*d));
	if (!d)
		return rps__seterr(-ENOMEM, "connect to %s:%u: out of memory", host, port);
	d->fd = -1;
	ret = ep_sizes_resolve(attr, &d->sz, "connect");
	if (ret) {
		dial_free(d);
		return ret;
	}
	snprintf(portstr, sizeof(portstr), "%u", port);
	gai = getaddrinfo(host, portstr, &hints, &d->res);
	if (gai) {
		d->res = NULL;
		dial_free(d);
		return rps__seterr(-EHOSTUNREACH, "connect to %s:%u: cannot resolve: %s: check the host name",
				   host, port, gai_strerror(gai));
	}
	d->base.fab = base;
	d->fab = rps__container_of(base, struct tcp_fabric, base);
	d->cq = rps__container_of(cq_base, struct tcp_cq, base);
	d->ai = d->res;
	d->err = ECONNREFUSED;
	d->deadline = rps__now_ns() + (uint64_t)timeout_ms * 1000000 + 1;
	snprintf(d->host, sizeof(d->host), "%s", host);
	d->port = port;
	h.data_len = (uint8_t)len;
	h.sq_depth = d->sz.sq_depth;
	h.rq_depth = d->sz.rq_depth;
	if (len)
		memcpy(h.data, data, len);
	rps__tcp_hello_put(d->out, &h);
	*out = &d->base;
	return 0;
}

int rps__tcp_dial_fd(const struct rps__dial *base, short *events)
{
	const struct tcp_dial *d = rps__container_of(base, const struct tcp_dial, base);

	*events = d->state == DIAL_HELLO_IN ? POLLIN : POLLOUT;
	return d->fd;
}

void rps__tcp_dial_cancel(struct rps__dial *base)
{
	if (base)
		dial_free(rps__container_of(base, struct tcp_dial, base));
}

/* The socket's connect, address after address.  0: connected,
 * -EINPROGRESS, or why none of them connects. */
static int dial_connect(struct tcp_dial *d)
{
	socklen_t elen;
	int err;

	for (;;) {
		if (d->fd >= 0) {
			struct pollfd pfd = { .fd = d->fd, .events = POLLOUT };
			if (poll(&pfd, 1, 0) == 0)
				return rps__now_ns() >= d->deadline ? -ETIMEDOUT : -EINPROGRESS;
			elen = sizeof(err);
			if (getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &err, &elen))
				err = errno;
			if (!err)
				break;
			d->err = err;
			close(d->fd);
			d->fd = -1;
			d->ai = d->ai->ai_next;
		}
		if (!d->ai)
			return -d->err;
		d->fd = socket(d->ai->ai_family, d->ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, d->ai->ai_protocol);
		if (d->fd < 0) {
			d->err = errno;
			d->ai = d->ai->ai_next;
			continue;
		}
		if (connect(d->fd, d->ai->ai_addr, d->ai->ai_addrlen) == 0)
			break;
		if (errno != EINPROGRESS) {
			d->err = errno;
			close(d->fd);
			d->fd = -1;
			d->ai = d->ai->ai_next;
		}
	}
	rps__tcp_sockaddr_str(d->ai->ai_addr, d->ai->ai_addrlen, d->peer, sizeof(d->peer));
	sock_tune(d->fd);
	d->state = DIAL_HELLO_OUT;
	return 0;
}

/* Our hello out, the reply in.  0: the reply is here, -EINPROGRESS, or
 * what broke. */
static int dial_hello(struct tcp_dial *d)
{
	ssize_t n;

	while (d->state == DIAL_HELLO_OUT) {
		n = send(d->fd, d->out + d->sent, TCP_HELLO_SIZE - d->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return -EINPROGRESS;
		if (n < 0)
			return -errno;
		d->sent += (uint32_t)n;
		if (d->sent == TCP_HELLO_SIZE)
			d->state = DIAL_HELLO_IN;
	}
	/* exactly the hello: the bytes after it belong to the engine */
	while (d->got < TCP_HELLO_SIZE) {
		n = recv(d->fd, d->in + d->got, TCP_HELLO_SIZE - d->got, MSG_DONTWAIT);
		if (n == 0)
			return -ECONNRESET;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return -EINPROGRESS;
		if (n < 0)
			return -errno;
		d->got += (uint32_t)n;
	}
	return 0;
}

/* reply holds RPS__PRIVDATA_MAX bytes; reply_len is set to what came. */
static void reply_copy(void *reply, size_t *reply_len, const struct wire_hello *h)
{
	if (reply)
		memcpy(reply, h->data, h->data_len);
	if (reply_len)
		*reply_len = h->data_len;
}

int rps__tcp_dial_step(struct rps__dial *base, void *reply, size_t *reply_len, struct rps__ep **out)
{
	struct tcp_dial *d = rps__container_of(base, struct tcp_dial, base);
	struct wire_hello h;
	struct tcp_ep *ep = NULL;
	int ret;

	if (reply_len)
		*reply_len = 0;
	if (d->state == DIAL_CONNECT) {
		ret = dial_connect(d);
		if (ret == -EINPROGRESS)
			return ret;
		if (ret) {
			ret = rps__seterr(ret, "connect to %s:%u: %s: %s", d->host, d->port, strerror(-ret),
					  ret == -ECONNREFUSED ? "is the server listening there?"
					  : ret == -ETIMEDOUT ? "the host does not answer, check the address and firewall"
					  : "check the address and the network");
			goto out;
		}
	}
	ret = dial_hello(d);
	if (ret == -EINPROGRESS && rps__now_ns() < d->deadline)
		return ret;
	if (ret == -EINPROGRESS)
		ret = -ETIMEDOUT;
	if (ret) {
		ret = rps__seterr(ret, "connect to %s: handshake: %s: %s", d->peer, strerror(-ret),
				  ret == -ETIMEDOUT ? "the server does not accept, is it polling its listener?"
						    : "is that an rdmaps tcp endpoint?");
		goto out;
	}
	rps__tcp_hello_get(&h, d->in);
	ret = rps__tcp_hello_check(&h, d->peer);
	if (ret)
		goto out;
	switch (h.type) {
	case HELLO_ACCEPT:
		break;
	case HELLO_REJECT:
		reply_copy(reply, reply_len, &h);
		ret = rps__seterr(-ECONNREFUSED, "connect to %s: rejected by the server (%u bytes of reason)",
				  d->peer, h.data_len);
		goto out;
	case HELLO_BAD_PROTOCOL:
		ret = rps__seterr(-EPROTO, "connect to %s: the server refused our hello (protocol version %u, "
				  "it speaks %u): run the same rdmaps release on both sides", d->peer,
				  TCP_VERSION, h.version);
		goto out;
	default:
		ret = rps__seterr(-EPROTO, "connect to %s: unexpected handshake reply type %u: "
				  "is that an rdmaps tcp endpoint?", d->peer, h.type);
		goto out;
	}
	ret = rps__tcp_ep_create(d->fab, d->cq, d->fd, &d->sz, h.sq_depth, d->peer, &ep);
	if (ret)
		goto out;
	ret = rps__tcp_ep_bind(ep);
	if (ret) {
		rps__tcp_ep_free(ep);
		goto out;
	}
	d->fd = -1;	/* the endpoint's now */
	reply_copy(reply, reply_len, &h);
	*out = &ep->base;
out:
	dial_free(d);
	return ret;
}

int rps__tcp_connect(struct rps__fabric *base, const char *host, uint16_t port, struct rps__cq *cq_base,
		     const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		     void *reply, size_t *reply_len, struct rps__ep **out)
{
	struct rps__dial *d;
	struct tcp_dial *td;
	short events;
	int ret, fd;

	if (reply_len)
		*reply_len = 0;
	/* for ever: a deadline no one reaches */
	ret = rps__tcp_dial_start(base, host, port, cq_base, attr, data, len,
				  timeout_ms < 0 ? INT32_MAX : timeout_ms, &d);
	if (ret)
		return ret;
	td = rps__container_of(d, struct tcp_dial, base);
	for (;;) {
		ret = rps__tcp_dial_step(d, reply, reply_len, out);
		if (ret != -EINPROGRESS)
			return ret;
		fd = rps__tcp_dial_fd(d, &events);
		ret = fd_wait(fd, events, td->deadline);
		if (ret && ret != -ETIMEDOUT) {
			rps__tcp_dial_cancel(d);
			return rps__seterr(ret, "connect to %s:%u: poll: %s", host, port, strerror(-ret));
		}
	}
}
