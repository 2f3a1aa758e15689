/*
 * provider.h - the provider side of the fabric abstraction: what a transport
 * implementation fills and what the dispatch in transport.c calls through.
 *
 * transport.h is the interface the layers above call (client, server,
 * control plane, programs); this header is what only the providers need, as
 * rdma-core splits verbs.h (consumers) from driver.h (providers).  Included
 * by src/transport/ (the dispatch and the TCP provider, src/transport/tcp/)
 * and verbs/ (the verbs provider) only; tests/layering.sh enforces that.
 *
 * A provider fills one struct rps__transport_ops, embeds the common heads
 * below first in its private objects (container_of style), and is picked by
 * rps__fabric_open() from the fabric kind (transport.c).
 */
#ifndef RPS_TRANSPORT_PROVIDER_H
#define RPS_TRANSPORT_PROVIDER_H

#include "transport/transport.h"

#include <stddef.h>
#include <stdint.h>

/*
 * Provider dispatch.  Each implementation fills one ops table; the generic
 * functions of transport.h call through fab->ops / the object's fabric.
 * Objects of every provider start with the common part below.
 */
struct rps__transport_ops {
	const char *name;
	int (*fabric_open)(const struct rps__fabric_attr *attr, struct rps__fabric **out);
	void (*fabric_close)(struct rps__fabric *fab);
	const char *(*fabric_name)(const struct rps__fabric *fab);
	int (*mr_reg)(struct rps__fabric *fab, void *addr, size_t len, int access, struct rps__mr **out);
	int (*mr_dereg)(struct rps__mr *mr);
	int (*mr_reg_implicit)(struct rps__fabric *fab, struct rps__mr **out);	/* optional */
	int (*mw_bind)(struct rps__ep *ep, struct rps__mr *mr, int access, uint32_t *rkey);
	int (*fabric_windows)(const struct rps__fabric *fab);
	uint32_t (*ep_sq_room)(struct rps__ep *ep);
	int (*local_cas)(struct rps__fabric *fab, struct rps__mr *mr, uint64_t *word,
			 uint64_t compare, uint64_t swap, uint64_t *old);
	int (*cq_create)(struct rps__fabric *fab, uint32_t depth, struct rps__cq **out);
	void (*cq_destroy)(struct rps__cq *cq);
	int (*cq_grow)(struct rps__cq *cq, uint32_t depth);	/* NULL: the queue grows by itself */
	int (*cq_poll)(struct rps__cq *cq, struct rps__wc *wc, int n);
	int (*cq_fd)(struct rps__cq *cq);
	int (*cq_arm)(struct rps__cq *cq);
	int (*cq_flush)(struct rps__cq *cq);	/* NULL: nothing is held back */
	int (*listen)(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__listener **out);
	int (*listener_fd)(struct rps__listener *l);
	int (*listener_get_request)(struct rps__listener *l, struct rps__conn_req **out);
	int (*accept)(struct rps__conn_req *req, struct rps__cq *cq, const struct rps__ep_attr *attr,
		      const void *data, size_t len, struct rps__ep **out);
	int (*reject)(struct rps__conn_req *req, const void *data, size_t len);
	void (*listener_close)(struct rps__listener *l);
	int (*connect)(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *cq,
		       const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		       void *reply, size_t *reply_len, struct rps__ep **out);
	/* optional, all four or none (dial_start NULL: rps__dial_start() runs connect) */
	int (*dial_start)(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *cq,
			  const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
			  struct rps__dial **out);
	int (*dial_fd)(const struct rps__dial *d, short *events);
	int (*dial_step)(struct rps__dial *d, void *reply, size_t *reply_len, struct rps__ep **out);
	void (*dial_cancel)(struct rps__dial *d);
	void (*ep_close)(struct rps__ep *ep);
	int (*post)(struct rps__ep *ep, const struct rps__wr *wr, int n);
	int (*post_recv)(struct rps__ep *ep, const struct rps__sge *sge, uint64_t wr_id);
	int (*ep_rebase)(struct rps__ep *ep, const void *from, void *to, size_t len);	/* optional */
};

/* Common heads; providers embed these first in their private structs. */
struct rps__fabric {
	const struct rps__transport_ops *ops;
	enum rps__kind kind;
	uint64_t tx_bytes;		/* rps__fabric_tx_bytes (atomic, relaxed) */
};
struct rps__mr {
	struct rps__fabric *fab;
	void *addr;
	size_t len;
	uint32_t lkey;
	uint32_t rkey;
	int access;
	uint64_t serial;		/* rps__mr_serial (set by rps__mr_reg) */
};
struct rps__cq {
	struct rps__fabric *fab;
};
struct rps__listener {
	struct rps__fabric *fab;
	uint16_t port;
};
struct rps__conn_req {
	struct rps__fabric *fab;
	uint8_t data[RPS__PRIVDATA_MAX];
	size_t len;
	uint32_t peer_sq_depth;		/* tcp: the depth the connector announced, which
					 * sizes our response pool (0: not known) */
	char peer[64];			/* the connector's address, as rps__ep_peer() */
};
struct rps__dial {
	struct rps__fabric *fab;
};
struct rps__ep {
	struct rps__fabric *fab;
	struct rps__cq *cq;
	void *context;
	int error;			/* set once the endpoint is in the error state */
	char peer[64];
	char local[64];			/* our address of this connection ("" if not known) */
};

/* the providers, picked by rps__fabric_open() */
extern const struct rps__transport_ops rps__tcp_ops;
#ifdef HAVE_VERBS
extern const struct rps__transport_ops rps__verbs_ops;
#endif

#endif
