/*
 * baseline_sock.c - the socket baseline over tcp: plain TCP sockets
 * (TCP_NODELAY), a responder that serves request/response and one-way
 * stream commands, and the initiator's timed runs.
 */
#include "config.h"
#include "psperf_int.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- baseline: plain sockets ------------------------------------------------------------------- */

int psperf_io_all(int fd, void *buf, size_t len, bool wr)
{
	char *p = buf;

	while (len) {
		ssize_t n = wr ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n == 0 ? -ECONNRESET : -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void sock_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int psperf_sock_listen(const char *host, uint16_t port, uint16_t *bound)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE };
	struct addrinfo *res;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char svc[8];
	int fd, one = 1;

	snprintf(svc, sizeof(svc), "%u", port);
	if (getaddrinfo(host, svc, &hints, &res))
		return -EADDRNOTAVAIL;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 4) ||
	    getsockname(fd, (struct sockaddr *)&ss, &len)) {
		int e = -errno;
		if (fd >= 0)
			close(fd);
		freeaddrinfo(res);
		return e;
	}
	freeaddrinfo(res);
	*bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						 : ((struct sockaddr_in *)&ss)->sin_port);
	return fd;
}

int psperf_sock_connect(const char *host, uint16_t port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	char svc[8];
	int fd;

	snprintf(svc, sizeof(svc), "%u", port);
	if (getaddrinfo(host, svc, &hints, &res))
		return -EHOSTUNREACH;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen)) {
		int e = -errno;
		close(fd);
		freeaddrinfo(res);
		return e;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return -errno;
	sock_nodelay(fd);
	return fd;
}

/* Responder: serve one connection's commands until QUIT or EOF. */
static void sock_serve(int fd)
{
	struct sock_cmd c;
	char *buf = NULL;
	size_t cap = 0;
	uint64_t i;

	sock_nodelay(fd);
	while (psperf_io_all(fd, &c, sizeof(c), false) == 0 && c.magic == SOCK_MAGIC && c.op != SOCKOP_QUIT) {
		size_t need = RPS__MAX(RPS__MAX(c.a, c.b), (uint64_t)8);
		if (c.a > 4ull * MAX_BYTES || c.b > 4ull * MAX_BYTES)
			break;
		if (need > cap) {
			free(buf);
			buf = psperf_xalloc_aligned(need);
			cap = need;
		}
		if (c.op == SOCKOP_RR) {
			for (i = 0; i < c.count; i++)
				if (psperf_io_all(fd, buf, c.a, false) || psperf_io_all(fd, buf, c.b, true))
					goto out;
		} else {
			for (i = 0; i < c.count; i++)
				if (psperf_io_all(fd, buf, c.a, false))
					goto out;
			if (psperf_io_all(fd, buf, 8, true))
				goto out;
		}
	}
out:
	free(buf);
	close(fd);
}

void *psperf_sock_peer_main(void *arg)
{
	struct sock_peer *p = arg;

	do {
		struct pollfd pfd = { .fd = p->lfd, .events = POLLIN };
		int fd;
		if (p->forever && poll(&pfd, 1, 200) <= 0)
			continue;
		fd = accept(p->lfd, NULL, NULL);
		if (fd >= 0)
			sock_serve(fd);
	} while (p->forever && !*p->stop);
	return NULL;
}

/* Initiator: one request/response or stream run; fills the result. */
int psperf_sock_run(int fd, struct raw_result *res, long warmup, struct pass *p, char *buf)
{
	struct sock_cmd c = { SOCK_MAGIC, res->op == RAW_SOCK_RR ? SOCKOP_RR : SOCKOP_STREAM, res->a, res->b, 0 };
	long i, n = res->op == RAW_SOCK_RR ? res->iters : res->count;
	int ret = 0;

	c.count = (uint64_t)(warmup + n);
	if (psperf_io_all(fd, &c, sizeof(c), true))
		return -ECONNRESET;
	psperf_samples_reserve(&p->s, (size_t)n);
	for (i = -warmup; i < n && !ret; i++) {
		uint64_t t0;
		if (i == 0)
			p->t0 = rps__now_ns();
		t0 = rps__now_ns();
		ret = psperf_io_all(fd, buf, res->a, true);
		if (!ret && res->op == RAW_SOCK_RR)
			ret = psperf_io_all(fd, buf, res->b, false);
		if (i >= 0)
			psperf_samples_add(&p->s, rps__now_ns() - t0);
	}
	if (!ret && res->op == RAW_SOCK_STREAM)
		ret = psperf_io_all(fd, buf, 8, false);
	p->t1 = rps__now_ns();
	return ret;
}
