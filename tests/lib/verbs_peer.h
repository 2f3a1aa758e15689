/*
 * verbs_peer.h - one side of a connected pair for the transport tests: a
 * fabric, a CQ, registered regions and, by listening and accepting or by
 * connecting, an endpoint to the peer, with the regions' descriptions
 * exchanged in the connection's private data.  Built on the consumer
 * interface only (transport.h), so it runs on any provider; test_verbs runs
 * its two sides in two processes (the port goes through a pipe).
 *
 *	struct vpeer p;
 *	struct vpeer_opts o = { .cq_depth = 64, .mr = { { 65536, RPS__ACCESS_REMOTE_WRITE } }, .advertise = 1 };
 *	CHECK(vpeer_open(&p, RPS__KIND_VERBS, host, &o) == 0);
 *	CHECK(vpeer_listen(&p, port_fd) == 0 && vpeer_accept(&p, NULL) == 0);
 *	... p.ep, p.buf[0], p.theirs[0] ...
 *	CHECK(vpeer_close(&p) == 0);
 *
 * Every function returns 0 or a negative errno and, on failure, prints one
 * line naming the step and rps__errbuf().  vpeer_close undoes what was set
 * up, in reverse order, and may be called after any failure.
 */
#ifndef RPS_TESTS_VERBS_PEER_H
#define RPS_TESTS_VERBS_PEER_H

#include "transport/transport.h"

#include <stddef.h>
#include <stdint.h>

#define VPEER_MAX_MR 2

/* A region as the peer needs it to address it. */
struct vpeer_region {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct vpeer_opts {
	uint32_t cq_depth;		/* 0: 64 */
	struct rps__ep_attr attr;	/* all zero: the provider's defaults */
	struct {
		size_t len;		/* 0: no region */
		int access;		/* enum rps__access */
	} mr[VPEER_MAX_MR];		/* registered, page-aligned, zeroed */
	int advertise;			/* regions described in the private data, 0..VPEER_MAX_MR */
	const void *data;		/* else: this private data (len bytes), or none */
	size_t data_len;
};

struct vpeer {
	struct vpeer_opts o;
	const char *host;		/* to listen on and connect to */
	struct rps__fabric *fab;
	struct rps__cq *cq;
	char *buf[VPEER_MAX_MR];
	struct rps__mr *mr[VPEER_MAX_MR];
	struct vpeer_region mine[VPEER_MAX_MR];	/* what is advertised: whole regions, unless changed */
	struct rps__listener *l;	/* vpeer_listen */
	uint16_t port;			/* the listener's, or the one connected to */
	struct rps__ep *ep;		/* the connection accepted or made with ep == NULL */
	union {				/* the peer's private data ... */
		struct vpeer_region theirs[VPEER_MAX_MR];
		uint8_t theirs_data[RPS__PRIVDATA_MAX];	/* (rps__connect's reply holds this much) */
	};
	size_t theirs_len;		/* ... and its length in bytes */
};

/* Open a fabric of that kind (on the device that serves host), its CQ and
 * the regions of o.  p is cleared first. */
int vpeer_open(struct vpeer *p, enum rps__kind kind, const char *host, const struct vpeer_opts *o);
/* Listen on host, port 0; the port chosen into p->port and, when port_fd >=
 * 0, written there for the peer. */
int vpeer_listen(struct vpeer *p, int port_fd);
/* Wait up to 30 s for the next connection request on l (any listener):
 * 0, -ETIMEDOUT or the listener's error. */
int vpeer_wait_request(struct rps__listener *l, struct rps__conn_req **req);
/* Accept the next connection request (waiting up to 30 s) with the
 * advertised regions (or o.data) as the reply; the request's private data
 * into p->theirs.  ep NULL: the endpoint is p->ep (closed by vpeer_close),
 * else *ep (the caller closes it). */
int vpeer_accept(struct vpeer *p, struct rps__ep **ep);
/* Connect to host at the port read from port_fd (waiting up to 30 s), or
 * at p->port when port_fd < 0, retrying while nobody listens yet (30 s);
 * sends the advertised regions (or o.data), the reply into p->theirs.  ep
 * as for vpeer_accept. */
int vpeer_connect(struct vpeer *p, int port_fd, struct rps__ep **ep);
/* p->ep, the listener, the regions, the CQ, the fabric: 0, or the first
 * deregistration's error. */
int vpeer_close(struct vpeer *p);

#endif
