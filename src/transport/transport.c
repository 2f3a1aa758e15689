/*
 * transport.c - provider dispatch for the fabric abstraction (transport.h).
 *
 * Picks the provider at rps__fabric_open() and forwards every call through
 * the object's fabric ops table, so the product above never branches on the
 * transport.
 */
#include "config.h"
#include "transport/provider.h"
#include "common/common.h"

#include <errno.h>
#include <stdatomic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rps__fabric_open(const struct rps__fabric_attr *attr, struct rps__fabric **out)
{
	switch (attr->kind) {
	case RPS__KIND_TCP:
		return rps__tcp_ops.fabric_open(attr, out);
	case RPS__KIND_VERBS:
#ifdef HAVE_VERBS
		return rps__verbs_ops.fabric_open(attr, out);
#else
		return rps__seterr(-ENOSYS, "verbs transport: not built (configure found no libibverbs/librdmacm): use tcp://");
#endif
	}
	return rps__seterr(-EINVAL, "unknown transport kind %d", (int)attr->kind);
}

void rps__fabric_close(struct rps__fabric *fab)
{
	if (fab)
		fab->ops->fabric_close(fab);
}

enum rps__kind rps__fabric_kind(const struct rps__fabric *fab)
{
	return fab->kind;
}

const char *rps__fabric_name(const struct rps__fabric *fab)
{
	return fab->ops->fabric_name(fab);
}

int rps__mr_reg(struct rps__fabric *fab, void *addr, size_t len, int access, struct rps__mr **out)
{
	static _Atomic uint64_t serials;
	int ret = fab->ops->mr_reg(fab, addr, len, access, out);

	if (!ret)
		(*out)->serial = atomic_fetch_add_explicit(&serials, 1, memory_order_relaxed) + 1;
	return ret;
}

int rps__mr_reg_implicit(struct rps__fabric *fab, struct rps__mr **out)
{
	if (!fab->ops->mr_reg_implicit)
		return rps__seterr(-EOPNOTSUPP, "mr_reg_implicit: the %s transport sends only from registered "
				   "memory: register the buffer", fab->ops->name);
	return fab->ops->mr_reg_implicit(fab, out);
}

int rps__mr_dereg(struct rps__mr *mr)
{
	return mr ? mr->fab->ops->mr_dereg(mr) : 0;
}

uint32_t rps__mr_rkey(const struct rps__mr *mr) { return mr->rkey; }
uint64_t rps__mr_serial(const struct rps__mr *mr) { return mr->serial; }

#define REMOTE_RIGHTS (RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC)

int rps__mw_bind(struct rps__ep *ep, struct rps__mr *mr, int access, uint32_t *rkey)
{
	if (!mr || mr->fab != ep->fab || !(mr->access & RPS__ACCESS_WINDOWED))
		return rps__seterr(-EINVAL, "mw_bind: the region is not a windowed region of this fabric: "
				   "register it with RPS__ACCESS_WINDOWED");
	if (!access || (access & ~REMOTE_RIGHTS) || (access & ~mr->access))
		return rps__seterr(-EINVAL, "mw_bind: rights 0x%x are not a subset of the region's 0x%x",
				   (unsigned)access, (unsigned)(mr->access & REMOTE_RIGHTS));
	return ep->fab->ops->mw_bind(ep, mr, access, rkey);
}

int rps__fabric_windows(const struct rps__fabric *fab)
{
	return fab->ops->fabric_windows(fab);
}

uint32_t rps__ep_sq_room(struct rps__ep *ep)
{
	return ep->fab->ops->ep_sq_room(ep);
}

int rps__local_cas(struct rps__fabric *fab, struct rps__mr *mr, uint64_t *word,
		   uint64_t compare, uint64_t swap, uint64_t *old)
{
	return fab->ops->local_cas(fab, mr, word, compare, swap, old);
}

int rps__cq_create(struct rps__fabric *fab, uint32_t depth, struct rps__cq **out)
{
	return fab->ops->cq_create(fab, depth, out);
}

int rps__cq_grow(struct rps__cq *cq, uint32_t depth)
{
	return cq->fab->ops->cq_grow ? cq->fab->ops->cq_grow(cq, depth) : 0;
}

void rps__cq_destroy(struct rps__cq *cq)
{
	if (cq)
		cq->fab->ops->cq_destroy(cq);
}

int rps__cq_poll(struct rps__cq *cq, struct rps__wc *wc, int n)
{
	return cq->fab->ops->cq_poll(cq, wc, n);
}

int rps__cq_fd(struct rps__cq *cq)
{
	return cq->fab->ops->cq_fd(cq);
}

int rps__cq_arm(struct rps__cq *cq)
{
	return cq->fab->ops->cq_arm(cq);
}

int rps__cq_flush(struct rps__cq *cq)
{
	return cq->fab->ops->cq_flush ? cq->fab->ops->cq_flush(cq) : 0;
}

int rps__cq_wait(struct rps__cq *cq, struct rps__wc *wc, int n, int timeout_ms)
{
	struct pollfd pfd;
	int ret;

	ret = rps__cq_poll(cq, wc, n);
	if (ret != 0)
		return ret;
	ret = rps__cq_arm(cq);
	if (ret < 0)
		return ret;
	if (ret > 0) {
		ret = rps__cq_poll(cq, wc, n);
		if (ret != 0)
			return ret;
	}
	pfd.fd = rps__cq_fd(cq);
	pfd.events = POLLIN;
	pfd.revents = 0;
	ret = poll(&pfd, 1, timeout_ms);
	if (ret < 0)
		return errno == EINTR ? 0 : rps__seterr(-errno, "poll on completion queue failed");
	return rps__cq_poll(cq, wc, n);
}

int rps__listen(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__listener **out)
{
	return fab->ops->listen(fab, host, port, out);
}

uint16_t rps__listener_port(const struct rps__listener *l) { return l->port; }

int rps__listener_fd(struct rps__listener *l)
{
	return l->fab->ops->listener_fd(l);
}

int rps__listener_get_request(struct rps__listener *l, struct rps__conn_req **out)
{
	return l->fab->ops->listener_get_request(l, out);
}

const void *rps__conn_req_data(const struct rps__conn_req *req, size_t *len)
{
	*len = req->len;
	return req->data;
}

const char *rps__conn_req_peer(const struct rps__conn_req *req) { return req->peer; }
uint32_t rps__conn_req_peer_sq_depth(const struct rps__conn_req *req) { return req->peer_sq_depth; }

int rps__accept(struct rps__conn_req *req, struct rps__cq *cq, const struct rps__ep_attr *attr,
		const void *data, size_t len, struct rps__ep **out)
{
	if (len > RPS__PRIVDATA_MAX)
		return rps__seterr(-EINVAL, "accept: private data of %zu bytes exceeds %d", len, RPS__PRIVDATA_MAX);
	return req->fab->ops->accept(req, cq, attr, data, len, out);
}

int rps__reject(struct rps__conn_req *req, const void *data, size_t len)
{
	if (len > RPS__PRIVDATA_MAX)
		len = RPS__PRIVDATA_MAX;
	return req->fab->ops->reject(req, data, len);
}

void rps__listener_close(struct rps__listener *l)
{
	if (l)
		l->fab->ops->listener_close(l);
}

int rps__connect(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *cq,
		 const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		 void *reply, size_t *reply_len, struct rps__ep **out)
{
	if (len > RPS__PRIVDATA_MAX)
		return rps__seterr(-EINVAL, "connect: private data of %zu bytes exceeds %d", len, RPS__PRIVDATA_MAX);
	return fab->ops->connect(fab, host, port, cq, attr, data, len, timeout_ms, reply, reply_len, out);
}

/* A provider without an asynchronous connect: the dial is the blocking
 * connect's result, handed out by the first step. */
struct sync_dial {
	struct rps__dial base;
	int ret;
	struct rps__ep *ep;
	uint8_t reply[RPS__PRIVDATA_MAX];
	size_t reply_len;
	char err[256];
};

int rps__dial_start(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *cq,
		    const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		    struct rps__dial **out)
{
	struct sync_dial *d;

	if (len > RPS__PRIVDATA_MAX)
		return rps__seterr(-EINVAL, "connect: private data of %zu bytes exceeds %d", len, RPS__PRIVDATA_MAX);
	if (timeout_ms < 0)
		return rps__seterr(-EINVAL, "connect: a dial needs a timeout");
	if (fab->ops->dial_start)
		return fab->ops->dial_start(fab, host, port, cq, attr, data, len, timeout_ms, out);
	d = calloc(1, sizeof(*d));
	if (!d)
		return rps__seterr(-ENOMEM, "connect: out of memory");
	d->base.fab = fab;
	d->reply_len = sizeof(d->reply);
	d->ret = fab->ops->connect(fab, host, port, cq, attr, data, len, timeout_ms, d->reply, &d->reply_len, &d->ep);
	if (d->ret)
		snprintf(d->err, sizeof(d->err), "%s", rps__errbuf());
	*out = &d->base;
	return 0;
}

int rps__dial_fd(const struct rps__dial *d, short *events)
{
	if (d->fab->ops->dial_start)
		return d->fab->ops->dial_fd(d, events);
	*events = 0;
	return -1;
}

int rps__dial_step(struct rps__dial *base, void *reply, size_t *reply_len, struct rps__ep **out)
{
	struct sync_dial *d = (struct sync_dial *)base;
	int ret;

	if (base->fab->ops->dial_start)
		return base->fab->ops->dial_step(base, reply, reply_len, out);
	ret = d->ret;
	if (reply && d->reply_len)
		memcpy(reply, d->reply, d->reply_len);
	if (reply_len)
		*reply_len = d->reply_len;
	if (ret)
		rps__seterr(ret, "%s", d->err);
	else
		*out = d->ep;
	free(d);
	return ret;
}

void rps__dial_cancel(struct rps__dial *base)
{
	struct sync_dial *d = (struct sync_dial *)base;

	if (!base)
		return;
	if (base->fab->ops->dial_start) {
		base->fab->ops->dial_cancel(base);
		return;
	}
	rps__ep_close(d->ep);
	free(d);
}

void rps__ep_close(struct rps__ep *ep)
{
	if (ep)
		ep->fab->ops->ep_close(ep);
}

void rps__ep_set_context(struct rps__ep *ep, void *ctx) { ep->context = ctx; }
void *rps__ep_context(const struct rps__ep *ep) { return ep->context; }
const char *rps__ep_peer(const struct rps__ep *ep) { return ep->peer; }
const char *rps__ep_local(const struct rps__ep *ep) { return ep->local; }
int rps__ep_is_error(const struct rps__ep *ep) { return __atomic_load_n(&ep->error, __ATOMIC_ACQUIRE); }

int rps__ep_rebase(struct rps__ep *ep, const void *from, void *to, size_t len)
{
	if (!ep->fab->ops->ep_rebase)
		return rps__seterr(-EOPNOTSUPP, "%s: posted memory stays the caller's until its completion",
				   rps__fabric_name(ep->fab));
	return ep->fab->ops->ep_rebase(ep, from, to, len);
}

int rps__post(struct rps__ep *ep, const struct rps__wr *wr, int n)
{
	uint64_t bytes = 0;
	int ret = ep->fab->ops->post(ep, wr, n);

	if (ret)
		return ret;
	for (int i = 0; i < n; i++)
		switch (wr[i].op) {
		case RPS__OP_WRITE:
		case RPS__OP_WRITE_IMM:
		case RPS__OP_SEND:
			bytes += rps__wr_len(&wr[i]);
			break;
		case RPS__OP_CAS:
			bytes += 16;	/* compare and swap */
			break;
		case RPS__OP_FADD:
			bytes += 8;
			break;
		default:
			break;		/* a READ asks; the peer sends */
		}
	__atomic_add_fetch(&ep->fab->tx_bytes, bytes, __ATOMIC_RELAXED);
	return 0;
}

uint64_t rps__fabric_tx_bytes(const struct rps__fabric *fab)
{
	return __atomic_load_n(&fab->tx_bytes, __ATOMIC_RELAXED);
}

int rps__post_recv(struct rps__ep *ep, const struct rps__sge *sge, uint64_t wr_id)
{
	return ep->fab->ops->post_recv(ep, sge, wr_id);
}

const char *rps__wc_status_str(enum rps__wc_status s)
{
	switch (s) {
	case RPS__WC_SUCCESS: return "success";
	case RPS__WC_FLUSH_ERR: return "flushed (endpoint in error or disconnected)";
	case RPS__WC_REM_ACCESS_ERR: return "remote access error (bad key, bounds or rights)";
	case RPS__WC_REM_OP_ERR: return "remote operation error";
	case RPS__WC_RETRY_EXC_ERR: return "transport retry exceeded (peer unreachable)";
	case RPS__WC_RNR_RETRY_EXC_ERR: return "receiver not ready, retries exceeded";
	case RPS__WC_LOC_ERR: return "local protection or length error";
	case RPS__WC_GENERAL_ERR: return "general error";
	}
	return "unknown completion status";
}

#ifndef HAVE_VERBS
int rps__verbs_available(void)
{
	return 0;
}
#endif
