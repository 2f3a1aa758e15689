/*
 * verbs_conn.c - the verbs provider's endpoints and their connections:
 * listening, accepting, rejecting and connecting through rdma_cm (verbs.c has
 * the overview).
 */
#include "config.h"
#include "common/common.h"
#include "transport/transport.h"
#include "verbs/verbs_int.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- endpoints ----------------------------------------------------------- */

static void v_ep_free(struct v_ep *ep)
{
	pthread_mutex_destroy(&ep->sq_lock);
	pthread_mutex_destroy(&ep->rq_lock);
	free(ep->rring);
	free(ep->ssge);
	free(ep->swr);
	free(ep->sring);
	free(ep);
}

/* Allocates the endpoint and its QP (RESET state), not yet in the CQ table. */
static int v_ep_create(struct v_fab *f, struct v_cq *c, const struct rps__ep_attr *attr, const char *peer,
		       struct v_ep **out)
{
	struct ibv_qp_init_attr ia, qia;
	struct ibv_qp_attr qa;
	struct v_ep *ep;
	int ret, e;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return rps__seterr(-ENOMEM, "verbs: out of memory creating an endpoint");
	ep->base.fab = &f->base;
	ep->base.cq = &c->base;
	snprintf(ep->base.peer, sizeof(ep->base.peer), "%s", peer);
	ep->fab = f;
	ep->cq = c;
	ep->sq_depth = attr && attr->sq_depth ? attr->sq_depth : V_DEF_DEPTH;
	ep->rq_depth = attr && attr->rq_depth ? attr->rq_depth : V_DEF_DEPTH;
	ep->max_inline = attr && attr->max_inline ? attr->max_inline : V_DEF_INLINE;
	ep->sig_every = RPS__MAX(ep->sq_depth / 2, 1u);
	pthread_mutex_init(&ep->sq_lock, NULL);
	pthread_mutex_init(&ep->rq_lock, NULL);
	if (ep->sq_depth > (uint32_t)f->dattr.max_qp_wr || ep->rq_depth > (uint32_t)f->dattr.max_qp_wr) {
		ret = rps__seterr(-EINVAL, "verbs: sq_depth %u / rq_depth %u exceed %s's max_qp_wr %d",
				  ep->sq_depth, ep->rq_depth, f->name, f->dattr.max_qp_wr);
		goto err_free;
	}
	ep->sring = calloc(ep->sq_depth, sizeof(*ep->sring));
	ep->swr = calloc(ep->sq_depth + 1, sizeof(*ep->swr));
	ep->ssge = calloc((size_t)(ep->sq_depth + 1) * RPS__WR_MAX_SGE, sizeof(*ep->ssge));
	ep->rring = calloc(ep->rq_depth, sizeof(*ep->rring));
	if (!ep->sring || !ep->swr || !ep->ssge || !ep->rring) {
		ret = rps__seterr(-ENOMEM, "verbs: out of memory for endpoint rings (sq %u, rq %u)", ep->sq_depth, ep->rq_depth);
		goto err_free;
	}

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = c->cq;
	ia.recv_cq = c->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.sq_sig_all = 0;
	ia.cap.max_send_wr = ep->sq_depth;
	ia.cap.max_recv_wr = ep->rq_depth;
	/* a push sends its descriptor and the user's gradient as one WRITE_IMM
	 * of two entries; a pull reads a header and user memory in one READ */
	ia.cap.max_send_sge = RPS__MIN(RPS__WR_MAX_SGE, RPS__MAX(f->dattr.max_sge, 1));
	ia.cap.max_recv_sge = 1;
	ia.cap.max_inline_data = ep->max_inline;
	ep->qp = v_fault("ibv_create_qp") ? NULL : ibv_create_qp(f->pd, &ia);
	if (!ep->qp) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "ibv_create_qp(%s, sq %u, rq %u, inline %u): %s", f->name, ep->sq_depth,
				  ep->rq_depth, ep->max_inline, strerror(e));
		goto err_free;
	}
	ep->qpn = ep->qp->qp_num;
	/* the device may give more inline room than asked (or round): use what it has */
	if (ibv_query_qp(ep->qp, &qa, IBV_QP_CAP, &qia) == 0)
		ep->max_inline = qia.cap.max_inline_data;
	else
		ep->max_inline = ia.cap.max_inline_data;
	*out = ep;
	return 0;

err_free:
	v_ep_free(ep);
	return ret;
}

void rps__verbs_ep_close(struct rps__ep *bep)
{
	struct v_ep *ep = VEP(bep);
	struct v_fab *f = ep->fab;

	pthread_mutex_lock(&f->cm_lock);
	ep->id->context = NULL;	/* CM events of this id are now ignored */
	rps__verbs_ep_shutdown(ep);
	pthread_mutex_unlock(&f->cm_lock);
	if (ep->in_table)
		rps__verbs_table_del(ep->cq, ep);	/* its queued completions are now dropped */
	rps__verbs_windows_release_ep(ep);	/* keys issued on it fail from here on */
	ibv_destroy_qp(ep->qp);
	rdma_destroy_id(ep->id);
	v_ep_free(ep);
}

/* ---- listening and accepting ------------------------------------------- */

/* Can an id bind this address with some free port? */
static int v_addr_ok(const struct sockaddr_storage *ss)
{
	struct sockaddr_storage any = *ss;
	struct rdma_cm_id *id;
	int ok;

	if (any.ss_family == AF_INET)
		((struct sockaddr_in *)&any)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&any)->sin6_port = 0;
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
		return 0;
	ok = rdma_bind_addr(id, (struct sockaddr *)&any) == 0;
	rdma_destroy_id(id);
	return ok;
}

static int v_is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
	return ss->ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
}

int rps__verbs_listen(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__listener **out)
{
	struct v_fab *f = VFAB(fab);
	struct sockaddr_storage ss;
	struct v_lis *l;
	char where[80];
	int ret, e;

	ret = rps__verbs_resolve(host, port, 1, &ss);
	if (ret)
		return ret;
	rps__verbs_addr_str((struct sockaddr *)&ss, where, sizeof(where));
	l = calloc(1, sizeof(*l));
	if (!l)
		return rps__seterr(-ENOMEM, "verbs: out of memory creating a listener");
	l->base.fab = fab;
	l->fab = f;
	l->ch = rps__verbs_channel();
	if (!l->ch) {
		e = v_errno(ENODEV);
		ret = rps__seterr(-e, "verbs: rdma_create_event_channel: %s", strerror(e));
		goto err_free;
	}
	if (v_fault("rdma_create_id") || rdma_create_id(l->ch, &l->id, l, RDMA_PS_TCP)) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "verbs: rdma_create_id: %s", strerror(e));
		goto err_ch;
	}
	if (v_fault("rdma_bind_addr") || rdma_bind_addr(l->id, (struct sockaddr *)&ss)) {
		e = v_errno(EADDRNOTAVAIL);
		/* the kernel CM says EADDRNOTAVAIL for a taken port too */
		if (e == EADDRNOTAVAIL && port && v_addr_ok(&ss))
			e = EADDRINUSE;
		ret = rps__seterr(-e, "verbs: rdma_bind_addr(%s): %s%s", where, strerror(e),
				  e == EADDRINUSE ? ": another listener has that port" :
				  e == EADDRNOTAVAIL ? ": not an address of an RDMA-capable interface" : "");
		goto err_id;
	}
	if (l->id->verbs && l->id->verbs != f->ctx) {
		ret = rps__seterr(-EXDEV, "verbs: %s belongs to RDMA device %s, but the fabric is on %s: open the fabric with that device",
				  where, ibv_get_device_name(l->id->verbs->device), f->name);
		goto err_id;
	}
	if (v_fault("rdma_listen") || rdma_listen(l->id, 128)) {
		e = v_errno(EINVAL);
		ret = rps__seterr(-e, "verbs: rdma_listen(%s): %s", where, strerror(e));
		goto err_id;
	}
	l->base.port = ntohs(rdma_get_src_port(l->id));
	*out = &l->base;
	return 0;

err_id:
	rdma_destroy_id(l->id);
err_ch:
	rdma_destroy_event_channel(l->ch);
err_free:
	free(l);
	return ret;
}

int rps__verbs_listener_fd(struct rps__listener *bl)
{
	return VLIS(bl)->ch->fd;
}

int rps__verbs_listener_get_request(struct rps__listener *bl, struct rps__conn_req **out)
{
	struct v_lis *l = VLIS(bl);
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct v_req *r;
	int e;

	/* a server loop may sit on its listener a while: keep endpoints' CM
	 * events (disconnects) moving from here too */
	rps__verbs_cm_progress(l->fab, 0);
	for (;;) {
		if (v_fault("rdma_get_cm_event@listener") || rdma_get_cm_event(l->ch, &ev)) {
			e = v_errno(EIO);
			if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)
				return rps__seterr(-EAGAIN, "verbs: no connection request waiting");
			return rps__seterr(-e, "verbs: rdma_get_cm_event(listener): %s", strerror(e));
		}
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			rdma_ack_cm_event(ev);	/* nothing else concerns a listener */
			continue;
		}
		id = ev->id;
		if (id->verbs != l->fab->ctx) {
			/* came in through another device: our PD cannot serve it */
			rdma_reject(id, NULL, 0);
			rdma_ack_cm_event(ev);
			rdma_destroy_id(id);
			continue;
		}
		r = calloc(1, sizeof(*r));
		if (!r) {
			rdma_reject(id, NULL, 0);
			rdma_ack_cm_event(ev);
			rdma_destroy_id(id);
			return rps__seterr(-ENOMEM, "verbs: out of memory for a connection request");
		}
		r->base.fab = bl->fab;
		r->fab = l->fab;
		r->id = id;
		id->context = NULL;	/* inherited the listener's; nothing owns it yet */
		r->base.len = rps__verbs_req_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, r->base.data);
		r->peer_init_depth = ev->param.conn.initiator_depth;
		r->peer_resp_res = ev->param.conn.responder_resources;
		rps__verbs_addr_str(rdma_get_peer_addr(id), r->peer, sizeof(r->peer));
		snprintf(r->base.peer, sizeof(r->base.peer), "%s", r->peer);
		/* ack now: the private data is copied, and rdma_migrate_id would
		 * otherwise wait for this ack */
		rdma_ack_cm_event(ev);
		*out = &r->base;
		return 0;
	}
}

int rps__verbs_reject(struct rps__conn_req *breq, const void *data, size_t len)
{
	struct v_req *r = VREQ(breq);
	uint8_t buf[1 + RPS__PRIVDATA_MAX];
	int ret = 0, e;

	buf[0] = (uint8_t)len;
	if (len)
		memcpy(buf + 1, data, len);
	if (v_fault("rdma_reject") || rdma_reject(r->id, buf, (uint8_t)(1 + len))) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: rdma_reject(%s): %s", r->peer, strerror(e));
	}
	rdma_destroy_id(r->id);
	free(r);
	return ret;
}

/* Answer the REQ with a REP carrying data (one length byte first); ep is in
 * the CQ's table from here on. */
static int accept_send_rep(struct v_cq *c, struct v_ep *ep, const void *data, size_t len, uint8_t resp_res,
			   uint8_t init_depth, const char *peer)
{
	struct rdma_conn_param param;
	uint8_t buf[1 + RPS__PRIVDATA_MAX];
	int e;

	buf[0] = (uint8_t)len;
	if (len)
		memcpy(buf + 1, data, len);
	memset(&param, 0, sizeof(param));
	param.private_data = buf;
	param.private_data_len = (uint8_t)(1 + len);
	param.responder_resources = resp_res;
	param.initiator_depth = init_depth;
	param.retry_count = V_RETRY;
	param.rnr_retry_count = V_RNR_RETRY;
	param.qp_num = ep->qpn;
	rps__verbs_table_add(c, ep);
	if (v_fault("rdma_accept") || rdma_accept(ep->id, &param)) {
		e = v_errno(EIO);
		return rps__seterr(-e, "verbs: rdma_accept(%s): %s: the peer may have given up", peer, strerror(e));
	}
	return 0;
}

/* Wait on the private channel tmp for the initiator's RTU (ESTABLISHED), at
 * most V_ACCEPT_WAIT_MS: 0 once it came or the wait is over (the fabric's
 * CM channel then takes what comes later), or why the connection failed. */
static int accept_wait_established(struct rdma_event_channel *tmp, const char *peer)
{
	uint64_t deadline = v_deadline(V_ACCEPT_WAIT_MS);
	struct rdma_cm_event *ev;
	int ret, done;

	for (done = 0; !done;) {
		ret = rps__verbs_get_event(tmp, deadline, &ev);
		if (ret == -ETIMEDOUT) {
			rps__log(RPS__LOG_DEBUG, "verbs: accept %s: no RTU within %d ms: the endpoint is handed out,"
				 " the CM settles it", peer, V_ACCEPT_WAIT_MS);
			return 0;
		}
		if (ret) {
			rps__seterr(ret, "verbs: accept %s: no RTU from the peer: %s", peer, strerror(-ret));
			return ret;
		}
		switch (ev->event) {
		case RDMA_CM_EVENT_ESTABLISHED:
			done = 1;
			break;
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_DEVICE_REMOVAL:
			ret = rps__seterr(-ECONNABORTED, "verbs: accept %s: %s before the connection was established",
					  peer, rdma_event_str(ev->event));
			rdma_ack_cm_event(ev);
			return ret;
		default:
			break;
		}
		rdma_ack_cm_event(ev);
	}
	return 0;
}

int rps__verbs_accept(struct rps__conn_req *breq, struct rps__cq *bcq, const struct rps__ep_attr *attr,
		      const void *data, size_t len, struct rps__ep **out)
{
	struct v_req *r = VREQ(breq);
	struct v_fab *f = r->fab;
	struct v_cq *c = VCQ(bcq);
	struct rdma_event_channel *tmp;
	uint8_t resp_res, init_depth;
	struct v_ep *ep;
	int ret, e;

	if (c->fab != f) {
		ret = rps__seterr(-EINVAL, "verbs: accept: the CQ belongs to another fabric");
		goto err_reject;
	}
	ret = v_ep_create(f, c, attr, r->peer, &ep);
	if (ret)
		goto err_reject;
	ep->id = r->id;
	rps__verbs_addr_str(rdma_get_local_addr(ep->id), ep->base.local, sizeof(ep->base.local));
	/* what the peer asked for, within what this device can do */
	resp_res = (uint8_t)RPS__MIN(r->peer_init_depth, f->max_rd);
	init_depth = (uint8_t)RPS__MIN(r->peer_resp_res, f->max_init);
	ret = rps__verbs_qp_init(ep->id, ep->qp);
	if (!ret)
		ret = rps__verbs_qp_rtr_rts(f, ep->id, ep->qp, resp_res, init_depth);
	if (ret) {
		rps__seterr(ret, "verbs: accept %s: QP to RTS: %s", r->peer, strerror(-ret));
		goto err_ep;
	}
	tmp = rps__verbs_channel();
	if (!tmp) {
		e = v_errno(ENOMEM);
		ret = rps__seterr(-e, "verbs: accept %s: rdma_create_event_channel: %s", r->peer, strerror(e));
		goto err_ep;
	}
	/* a private channel until ESTABLISHED, so the wait sees only this id */
	if (v_fault("rdma_migrate_id") || rdma_migrate_id(ep->id, tmp)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: accept %s: rdma_migrate_id: %s", r->peer, strerror(e));
		goto err_tmp;
	}

	ret = accept_send_rep(c, ep, data, len, resp_res, init_depth, r->peer);
	if (ret)
		goto err_table;
	ret = accept_wait_established(tmp, r->peer);
	if (ret)
		goto err_disc;
	pthread_mutex_lock(&f->cm_lock);
	ep->id->context = ep;
	pthread_mutex_unlock(&f->cm_lock);
	if (v_fault("rdma_migrate_id") || rdma_migrate_id(ep->id, f->cm_ch)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: accept %s: rdma_migrate_id: %s", r->peer, strerror(e));
		goto err_ctx;
	}
	rdma_destroy_event_channel(tmp);
	free(r);
	*out = &ep->base;
	return 0;

err_ctx:
	pthread_mutex_lock(&f->cm_lock);
	ep->id->context = NULL;
	pthread_mutex_unlock(&f->cm_lock);
err_disc:
	rps__verbs_qp_error(ep->qp);
	rdma_disconnect(ep->id);
err_table:
	rps__verbs_table_del(c, ep);
	ibv_destroy_qp(ep->qp);
	rdma_destroy_id(r->id);	/* before its channel */
	v_ep_free(ep);
	rdma_destroy_event_channel(tmp);
	free(r);
	return ret;
err_tmp:
	rdma_destroy_event_channel(tmp);
err_ep:
	ibv_destroy_qp(ep->qp);
	v_ep_free(ep);
err_reject:
	rdma_reject(r->id, NULL, 0);
	rdma_destroy_id(r->id);
	free(r);
	return ret;
}

void rps__verbs_listener_close(struct rps__listener *bl)
{
	struct v_lis *l = VLIS(bl);

	rdma_destroy_id(l->id);
	rdma_destroy_event_channel(l->ch);
	free(l);
}

/* ---- connecting ---------------------------------------------------------- */

/*
 * Connecting, as a dial the caller steps (transport.h): the CM resolves the
 * address, then the route, our REQ goes out and the peer's REP comes in,
 * each an event on the dial's own non-blocking channel, whose descriptor
 * the caller polls; no step waits.  A peer whose host died answers nothing,
 * and a server's loop that connected to it blocking stood still (Raft
 * heartbeats, leases, every worker) for the whole timeout.
 * rps__verbs_connect() is the same dial with a poll() between the steps.
 */
enum v_dial_state { V_DIAL_ADDR, V_DIAL_ROUTE, V_DIAL_REP };

struct v_dial {
	struct rps__dial base;
	struct v_fab *fab;
	struct v_cq *cq;
	struct rps__ep_attr attr;
	int has_attr;
	enum v_dial_state state;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct v_ep *ep;		/* from the route on; its QP in INIT once the REQ is out */
	struct sockaddr_storage ss;
	uint64_t deadline;		/* UINT64_MAX: none (rps__verbs_connect's timeout < 0) */
	uint8_t data[RPS__PRIVDATA_MAX];
	size_t len;
	char peer[80];
};

static void dial_free(struct v_dial *d)
{
	if (d->ep) {
		ibv_destroy_qp(d->ep->qp);
		v_ep_free(d->ep);
	}
	if (d->id)
		rdma_destroy_id(d->id);
	if (d->ch)
		rdma_destroy_event_channel(d->ch);
	free(d);
}

/* The ms a CM resolution may take: what is left, 2 s without a deadline. */
static int dial_cm_timeout(const struct v_dial *d)
{
	int left = v_ms_left(d->deadline);

	return left < 0 ? 2000 : RPS__MAX(left, 1);
}

static int dial_begin(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *bcq,
		      const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		      struct v_dial **out)
{
	struct v_fab *f = VFAB(fab);
	struct v_cq *c = VCQ(bcq);
	struct v_dial *d;
	int ret, e;

	if (c->fab != f)
		return rps__seterr(-EINVAL, "verbs: connect: the CQ belongs to another fabric");
	d = calloc(1, sizeof(*d));
	if (!d)
		return rps__seterr(-ENOMEM, "verbs: connect: out of memory");
	d->base.fab = fab;
	d->fab = f;
	d->cq = c;
	if (attr) {
		d->attr = *attr;
		d->has_attr = 1;
	}
	memcpy(d->data, data, len);
	d->len = len;
	d->deadline = v_deadline(timeout_ms);
	ret = rps__verbs_resolve(host, port, 0, &d->ss);
	if (ret)
		goto err;
	rps__verbs_addr_str((struct sockaddr *)&d->ss, d->peer, sizeof(d->peer));
	d->ch = rps__verbs_channel();
	if (!d->ch) {
		e = v_errno(ENODEV);
		ret = rps__seterr(-e, "verbs: rdma_create_event_channel: %s: is rdma_ucm loaded?", strerror(e));
		goto err;
	}
	if (v_fault("rdma_create_id") || rdma_create_id(d->ch, &d->id, NULL, RDMA_PS_TCP)) {
		e = v_errno(ENOMEM);
		d->id = NULL;
		ret = rps__seterr(-e, "verbs: rdma_create_id: %s", strerror(e));
		goto err;
	}
	if (v_fault("rdma_resolve_addr") ||
	    rdma_resolve_addr(d->id, NULL, (struct sockaddr *)&d->ss, dial_cm_timeout(d))) {
		e = v_errno(EHOSTUNREACH);
		ret = rps__seterr(-e, "verbs: rdma_resolve_addr(%s): %s", d->peer, strerror(e));
		goto err;
	}
	d->state = V_DIAL_ADDR;
	*out = d;
	return 0;
err:
	dial_free(d);
	return ret;
}

/* The address is resolved: on our device?  Then the route. */
static int dial_on_addr(struct v_dial *d, struct rdma_cm_event *ev)
{
	int ret, e;

	if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
		ret = rps__seterr(-EHOSTUNREACH, "verbs: %s: %s (status %d): no route to it through an RDMA device",
				  d->peer, rdma_event_str(ev->event), ev->status);
		rdma_ack_cm_event(ev);
		return ret;
	}
	rdma_ack_cm_event(ev);
	if (d->id->verbs != d->fab->ctx)
		return rps__seterr(-EXDEV, "verbs: %s is reached through RDMA device %s, but the fabric is on %s: open the fabric with that device",
				   d->peer, d->id->verbs ? ibv_get_device_name(d->id->verbs->device) : "?", d->fab->name);
	if (v_fault("rdma_resolve_route") || rdma_resolve_route(d->id, dial_cm_timeout(d))) {
		e = v_errno(EHOSTUNREACH);
		return rps__seterr(-e, "verbs: rdma_resolve_route(%s): %s%s", d->peer, strerror(e),
				   v_is_loopback(&d->ss) ? ": RoCE cannot route the loopback address; use the address of the RDMA device's netdev" : "");
	}
	d->state = V_DIAL_ROUTE;
	return 0;
}

/* The route is resolved: the endpoint, its QP to INIT, and the REQ carrying
 * our private data on its way. */
static int dial_on_route(struct v_dial *d, struct rdma_cm_event *ev)
{
	struct v_fab *f = d->fab;
	struct rdma_conn_param param;
	uint8_t req[V_REQ_PRIV];
	int ret, e;

	if (ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
		ret = rps__seterr(-EHOSTUNREACH, "verbs: route to %s: %s (status %d)", d->peer,
				  rdma_event_str(ev->event), ev->status);
		rdma_ack_cm_event(ev);
		return ret;
	}
	rdma_ack_cm_event(ev);
	ret = v_ep_create(f, d->cq, d->has_attr ? &d->attr : NULL, d->peer, &d->ep);
	if (ret) {
		d->ep = NULL;
		return ret;
	}
	d->ep->id = d->id;
	rps__verbs_addr_str(rdma_get_local_addr(d->id), d->ep->base.local, sizeof(d->ep->base.local));
	ret = rps__verbs_qp_init(d->id, d->ep->qp);
	if (ret)
		return rps__seterr(ret, "verbs: connect %s: QP to INIT: %s", d->peer, strerror(-ret));
	rps__verbs_req_encode(req, d->data, d->len);
	memset(&param, 0, sizeof(param));
	param.private_data = req;
	param.private_data_len = V_REQ_PRIV;
	param.responder_resources = f->max_rd;
	param.initiator_depth = f->max_init;
	param.retry_count = V_RETRY;
	param.rnr_retry_count = V_RNR_RETRY;
	param.qp_num = d->ep->qpn;
	if (v_fault("rdma_connect") || rdma_connect(d->id, &param)) {
		e = v_errno(EIO);
		return rps__seterr(-e, "verbs: rdma_connect(%s): %s", d->peer, strerror(e));
	}
	d->state = V_DIAL_REP;
	return 0;
}

/* What the peer answered, if it is not its REP: 1 for an event that says
 * nothing (skip it), else why the connection failed (a rejection's private
 * data in rep/rlen).  ev is acknowledged unless it is the REP (0). */
static int dial_classify_rep(const struct v_dial *d, struct rdma_cm_event *ev, uint8_t *rep, size_t *rlen)
{
	int ret;

	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		return 0;
	case RDMA_CM_EVENT_REJECTED:
		if (ev->status == V_REJ_CONSUMER) {
			*rlen = rps__verbs_lp_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, rep);
			ret = rps__seterr(-ECONNREFUSED, "verbs: connect %s: rejected by the peer%s%.*s", d->peer,
					  *rlen ? ": " : "", (int)strnlen((char *)rep, *rlen), (char *)rep);
		} else {
			ret = rps__seterr(-ECONNREFUSED, "verbs: connect %s: refused (%s, IB CM reason %d)", d->peer,
					  ev->status == V_REJ_INVALID_SID ? "nobody listens on that port" : "rejected by the CM",
					  ev->status);
		}
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
		ret = ev->status == -ETIMEDOUT ?
			rps__seterr(-ETIMEDOUT, "verbs: connect %s: no answer from the peer's CM", d->peer) :
			rps__seterr(-EHOSTUNREACH, "verbs: connect %s: unreachable (status %d)", d->peer, ev->status);
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		ret = rps__seterr(-ECONNABORTED, "verbs: connect %s: %s (status %d)", d->peer,
				  rdma_event_str(ev->event), ev->status);
		break;
	default:
		ret = 1;
		break;
	}
	rdma_ack_cm_event(ev);
	return ret;
}

/* The REP is in (we own the QP): RTR/RTS, then RTU via rdma_establish, and
 * the id joins the fabric's CM channel.  On success the endpoint is the
 * caller's and d no longer holds it. */
static int dial_on_rep(struct v_dial *d, struct rdma_cm_event *ev, uint8_t *rep, size_t *rlen)
{
	struct v_fab *f = d->fab;
	struct v_ep *ep = d->ep;
	struct rdma_cm_id *id = d->id;
	int ret, e, peer_resp;

	*rlen = rps__verbs_lp_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, rep);
	peer_resp = ev->param.conn.responder_resources;
	rdma_ack_cm_event(ev);
	ret = rps__verbs_qp_rtr_rts(f, id, ep->qp, f->max_rd, (uint8_t)RPS__MIN(f->max_init, peer_resp));
	if (ret) {
		rps__seterr(ret, "verbs: connect %s: QP to RTS: %s", d->peer, strerror(-ret));
		rdma_reject(id, NULL, 0);
		return ret;
	}
	rps__verbs_table_add(d->cq, ep);
	if (v_fault("rdma_establish") || rdma_establish(id)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: connect %s: rdma_establish: %s", d->peer, strerror(e));
		goto err_table;
	}
	pthread_mutex_lock(&f->cm_lock);
	id->context = ep;
	pthread_mutex_unlock(&f->cm_lock);
	if (v_fault("rdma_migrate_id") || rdma_migrate_id(id, f->cm_ch)) {
		e = v_errno(EIO);
		ret = rps__seterr(-e, "verbs: connect %s: rdma_migrate_id: %s", d->peer, strerror(e));
		goto err_ctx;
	}
	d->ep = NULL;	/* the caller's, with the id */
	d->id = NULL;
	return 0;

err_ctx:
	pthread_mutex_lock(&f->cm_lock);
	id->context = NULL;
	pthread_mutex_unlock(&f->cm_lock);
	rps__verbs_qp_error(ep->qp);
	rdma_disconnect(id);
err_table:
	rps__verbs_table_del(d->cq, ep);
	return ret;
}

/* Why the dial ran out of time, by how far it got. */
static int dial_timed_out(const struct v_dial *d)
{
	switch (d->state) {
	case V_DIAL_ADDR:
		return rps__seterr(-ETIMEDOUT, "verbs: resolving %s: %s", d->peer, strerror(ETIMEDOUT));
	case V_DIAL_ROUTE:
		return rps__seterr(-ETIMEDOUT, "verbs: route to %s: %s", d->peer, strerror(ETIMEDOUT));
	default:
		return rps__seterr(-ETIMEDOUT, "verbs: connect %s: timed out waiting for the peer's answer", d->peer);
	}
}

/* Reading the channel failed, by how far the dial got. */
static int dial_event_failed(const struct v_dial *d, int ret)
{
	switch (d->state) {
	case V_DIAL_ADDR:
		return rps__seterr(ret, "verbs: resolving %s: %s", d->peer, strerror(-ret));
	case V_DIAL_ROUTE:
		return rps__seterr(ret, "verbs: route to %s: %s", d->peer, strerror(-ret));
	default:
		return rps__seterr(ret, "verbs: connect %s: %s", d->peer, strerror(-ret));
	}
}

/* Every event that is in, in turn: 0 connected (*out), -EINPROGRESS, or
 * why not; over unless -EINPROGRESS.  The channel is read only when poll()
 * says an event is there: one read per event, as the blocking connect did. */
static int dial_advance(struct v_dial *d, uint8_t *rep, size_t *rlen, struct rps__ep **out)
{
	struct rdma_cm_event *ev;
	int ret;

	for (;;) {
		struct pollfd p = { .fd = d->ch->fd, .events = POLLIN };

		if (poll(&p, 1, 0) <= 0)
			return v_ms_left(d->deadline) == 0 ? dial_timed_out(d) : -EINPROGRESS;
		/* deadline 0: take what is there, never wait */
		ret = rps__verbs_get_event(d->ch, 0, &ev);
		if (ret == -ETIMEDOUT)
			return v_ms_left(d->deadline) == 0 ? dial_timed_out(d) : -EINPROGRESS;
		if (ret)
			return dial_event_failed(d, ret);
		switch (d->state) {
		case V_DIAL_ADDR:
			ret = dial_on_addr(d, ev);
			break;
		case V_DIAL_ROUTE:
			ret = dial_on_route(d, ev);
			break;
		case V_DIAL_REP:
			ret = dial_classify_rep(d, ev, rep, rlen);
			if (ret == 1)
				continue;
			if (ret == 0) {
				struct v_ep *ep = d->ep;

				ret = dial_on_rep(d, ev, rep, rlen);
				if (ret == 0)
					*out = &ep->base;
			}
			return ret;
		}
		if (ret)
			return ret;
	}
}

int rps__verbs_dial_start(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *bcq,
			  const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
			  struct rps__dial **out)
{
	struct v_dial *d;
	int ret = dial_begin(fab, host, port, bcq, attr, data, len, timeout_ms, &d);

	if (!ret)
		*out = &d->base;
	return ret;
}

int rps__verbs_dial_fd(const struct rps__dial *base, short *events)
{
	const struct v_dial *d = rps__container_of(base, const struct v_dial, base);

	*events = POLLIN;
	return d->ch->fd;
}

/* reply holds RPS__PRIVDATA_MAX bytes (transport.h); the REP's or a
 * rejection's private data lands there. */
static void dial_reply(const uint8_t *rep, size_t rlen, void *reply, size_t *reply_len)
{
	if (reply && rlen)
		memcpy(reply, rep, rlen);
	if (reply_len)
		*reply_len = rlen;
}

int rps__verbs_dial_step(struct rps__dial *base, void *reply, size_t *reply_len, struct rps__ep **out)
{
	struct v_dial *d = rps__container_of(base, struct v_dial, base);
	uint8_t rep[RPS__PRIVDATA_MAX];
	size_t rlen = 0;
	int ret;

	if (reply_len)
		*reply_len = 0;
	ret = dial_advance(d, rep, &rlen, out);
	if (ret == -EINPROGRESS)
		return ret;
	if (ret == 0 || ret == -ECONNREFUSED)
		dial_reply(rep, rlen, reply, reply_len);
	dial_free(d);
	return ret;
}

void rps__verbs_dial_cancel(struct rps__dial *base)
{
	if (base)
		dial_free(rps__container_of(base, struct v_dial, base));
}

int rps__verbs_connect(struct rps__fabric *fab, const char *host, uint16_t port, struct rps__cq *bcq,
		       const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		       void *reply, size_t *reply_len, struct rps__ep **out)
{
	struct v_dial *d;
	int ret;

	if (reply_len)
		*reply_len = 0;
	ret = dial_begin(fab, host, port, bcq, attr, data, len, timeout_ms, &d);
	if (ret)
		return ret;
	for (;;) {
		struct pollfd pfd = { .fd = d->ch->fd, .events = POLLIN };
		int left;

		ret = rps__verbs_dial_step(&d->base, reply, reply_len, out);
		if (ret != -EINPROGRESS)
			return ret;
		left = v_ms_left(d->deadline);
		if (poll(&pfd, 1, left) < 0 && errno != EINTR)
			ret = rps__seterr(-errno, "verbs: connect %s: poll: %s", d->peer, strerror(errno));
		if (ret != -EINPROGRESS) {
			dial_free(d);
			return ret;
		}
	}
}
