/*
 * verbs_peer.c - the connected-pair fixture of tests/lib/verbs_peer.h:
 * set-up in the order a consumer of transport.h does it, tear-down in
 * reverse.
 */
#include "config.h"
#include "verbs_peer.h"
#include "common/common.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VPEER_WAIT_NS (30 * 1000000000ull)	/* for a request, a listener, a port */

static int said(int ret, const char *what)
{
	if (ret)
		fprintf(stderr, "    %s: %d %s\n", what, ret, rps__errbuf());
	return ret;
}

int vpeer_open(struct vpeer *p, enum rps__kind kind, const char *host, const struct vpeer_opts *o)
{
	struct rps__fabric_attr a = { .kind = kind, .device = NULL, .host = host };
	int i, ret;

	memset(p, 0, sizeof(*p));
	p->o = *o;
	p->host = host;
	ret = rps__fabric_open(&a, &p->fab);
	if (ret) {
		fprintf(stderr, "    fabric_open(%s): %s\n", host, rps__errbuf());
		return ret;
	}
	ret = rps__cq_create(p->fab, o->cq_depth ? o->cq_depth : 64, &p->cq);
	if (ret)
		return said(ret, "cq_create");
	for (i = 0; i < VPEER_MAX_MR && o->mr[i].len; i++) {
		size_t len = o->mr[i].len;

		p->buf[i] = aligned_alloc(4096, RPS__ALIGN_UP(len, 4096));
		if (!p->buf[i])
			return said(-ENOMEM, "aligned_alloc");
		memset(p->buf[i], 0, len);
		ret = rps__mr_reg(p->fab, p->buf[i], len, o->mr[i].access, &p->mr[i]);
		if (ret) {
			fprintf(stderr, "    mr_reg: %s\n", rps__errbuf());
			return ret;
		}
		p->mine[i] = (struct vpeer_region){ (uintptr_t)p->buf[i], rps__mr_rkey(p->mr[i]), (uint32_t)len };
	}
	return 0;
}

int vpeer_listen(struct vpeer *p, int port_fd)
{
	int ret = rps__listen(p->fab, p->host, 0, &p->l);

	if (ret)
		return said(ret, "listen");
	p->port = rps__listener_port(p->l);
	if (port_fd >= 0 && write(port_fd, &p->port, sizeof(p->port)) != (ssize_t)sizeof(p->port))
		return said(-EPIPE, "writing the port");
	return 0;
}

/* What this side sends in the private data. */
static const void *private_data(const struct vpeer *p, size_t *len)
{
	if (p->o.advertise) {
		*len = (size_t)p->o.advertise * sizeof(p->mine[0]);
		return p->mine;
	}
	*len = p->o.data_len;
	return p->o.data;
}

static const struct rps__ep_attr *ep_attr(const struct vpeer *p)
{
	static const struct rps__ep_attr none;

	return memcmp(&p->o.attr, &none, sizeof(none)) ? &p->o.attr : NULL;
}

int vpeer_wait_request(struct rps__listener *l, struct rps__conn_req **req)
{
	uint64_t deadline = rps__now_ns() + VPEER_WAIT_NS;
	struct pollfd pfd = { .fd = rps__listener_fd(l), .events = POLLIN };
	int ret;

	while ((ret = rps__listener_get_request(l, req)) == -EAGAIN) {
		if (rps__now_ns() > deadline)
			return -ETIMEDOUT;
		poll(&pfd, 1, 100);
	}
	return ret;
}

int vpeer_accept(struct vpeer *p, struct rps__ep **ep)
{
	struct rps__conn_req *req;
	const void *d, *data;
	size_t dl, len;
	int ret;

	ret = vpeer_wait_request(p->l, &req);
	if (ret)
		return said(ret, "get_request");
	d = rps__conn_req_data(req, &dl);
	p->theirs_len = dl;
	memcpy(p->theirs_data, d, dl < sizeof(p->theirs_data) ? dl : sizeof(p->theirs_data));
	data = private_data(p, &len);
	return said(rps__accept(req, p->cq, ep_attr(p), data, len, ep ? ep : &p->ep), "accept");
}

int vpeer_connect(struct vpeer *p, int port_fd, struct rps__ep **ep)
{
	uint64_t deadline = rps__now_ns() + VPEER_WAIT_NS;
	const void *data;
	size_t len;
	int ret;

	if (port_fd >= 0) {
		struct pollfd pfd = { .fd = port_fd, .events = POLLIN };
		if (poll(&pfd, 1, (int)(VPEER_WAIT_NS / 1000000)) <= 0 ||
		    read(port_fd, &p->port, sizeof(p->port)) != (ssize_t)sizeof(p->port))
			return said(-ETIMEDOUT, "reading the port");
	}
	data = private_data(p, &len);
	for (;;) {
		ret = rps__connect(p->fab, p->host, p->port, p->cq, ep_attr(p), data, len, 10000, p->theirs_data,
				   &p->theirs_len, ep ? ep : &p->ep);
		if (ret != -ECONNREFUSED || rps__now_ns() > deadline)
			break;
		usleep(50000);	/* not listening yet */
	}
	return said(ret, "connect");
}

int vpeer_close(struct vpeer *p)
{
	int i, ret = 0;

	if (p->ep)
		rps__ep_close(p->ep);
	if (p->l)
		rps__listener_close(p->l);
	for (i = VPEER_MAX_MR - 1; i >= 0; i--) {
		if (p->mr[i]) {
			int r = rps__mr_dereg(p->mr[i]);
			ret = ret ? ret : said(r, "mr_dereg");
		}
		free(p->buf[i]);
	}
	if (p->cq)
		rps__cq_destroy(p->cq);
	if (p->fab)
		rps__fabric_close(p->fab);
	memset(p, 0, sizeof(*p));
	return ret;
}
