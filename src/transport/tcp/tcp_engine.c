/*
 * tcp_engine.c - the TCP provider's engine, frames in (tcp.c has the
 * overview): as target it executes the peer's SEND, WRITE, READ and atomics
 * on registered memory with the checks an HCA makes; as initiator it matches
 * ACKs, NAKs and responses to its ops; and it runs the progress loop inside
 * rps__cq_poll().
 */
#include "config.h"
#include "common/common.h"
#include "transport/tcp/tcp_int.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* the engine: frames in                                                    */

static void rx_payload_done(struct tcp_ep *ep);

/* A READ response scatters over its op's segments: move to the next one
 * that takes bytes.  false when there is none (the payload is in). */
static bool rx_next_seg(struct tcp_rx *rx)
{
	if (rx->sink != SINK_READ_RESP)
		return false;
	while (++rx->seg < rx->op->ndst) {
		if (rx->op->dst[rx->seg].len) {
			rx->dst = rx->op->dst[rx->seg].addr;
			rx->remaining = rx->op->dst[rx->seg].len;
			return true;
		}
	}
	return false;
}

/* k payload bytes were placed at rx->dst. */
static void rx_placed(struct tcp_ep *ep, uint32_t k)
{
	struct tcp_rx *rx = &ep->rx;

	rx->dst += k;
	rx->remaining -= k;
	if (!rx->remaining && !rx_next_seg(rx))
		rx_payload_done(ep);
}

static void rx_begin_payload(struct tcp_ep *ep, enum rx_sink sink, uint8_t *dst, uint32_t len)
{
	ep->rx.sink = sink;
	ep->rx.dst = dst;
	ep->rx.remaining = len;
	ep->rx.seg = 0;
	ep->rx.in_payload = true;
	if (!len && !rx_next_seg(&ep->rx))
		rx_payload_done(ep);
}

/* A request must be the next one: the peer numbers them 1, 2, 3... */
static bool rx_request_in_order(struct tcp_ep *ep)
{
	if (ep->rx.hdr.seq == ep->peer_seq + 1)
		return true;
	rps__tcp_ep_fail(ep);
	return false;
}

/* A WRITE_IMM was placed: its immediate consumes a receive, or waits for one. */
static void rx_deliver_imm(struct tcp_ep *ep, const struct wire_hdr *h)
{
	struct tcp_unexpected *u;
	struct tcp_recv *r;

	if (!ep->unx_head && ep->rq_head != ep->rq_tail) {
		r = &ep->recvs[ep->rq_head++ & ep->rq_mask];
		rps__tcp_ep_complete(ep, r->wr_id, RPS__WC_SUCCESS, RPS__WC_RECV_IMM, h->len, h->imm);
		ep->peer_seq = h->seq;
		return;
	}
	if (!rps__tcp_unexpected_room(ep, 0)) {
		rps__tcp_target_nak(ep, h->seq, RPS__WC_RNR_RETRY_EXC_ERR);
		return;
	}
	u = malloc(sizeof(*u));
	if (!u) {
		rps__tcp_target_nak(ep, h->seq, RPS__WC_REM_OP_ERR);
		return;
	}
	u->seq = h->seq;
	u->len = h->len;
	u->imm = h->imm;
	u->is_imm = true;
	rps__tcp_unexpected_append(ep, u);
	ep->peer_seq = h->seq;
}

static void rx_payload_done(struct tcp_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	struct tcp_recv *r;
	struct tcp_op *op;

	rx->in_payload = false;
	switch (rx->sink) {
	case SINK_TARGET_MEM:
		if (rx->hdr.type == F_WRITE_IMM)
			rx_deliver_imm(ep, &rx->hdr);
		else
			ep->peer_seq = rx->hdr.seq;
		break;
	case SINK_RECV:
		r = &ep->recvs[ep->rq_head++ & ep->rq_mask];
		rps__tcp_ep_complete(ep, r->wr_id, RPS__WC_SUCCESS, RPS__WC_RECV, rx->hdr.len, 0);
		ep->peer_seq = rx->hdr.seq;
		break;
	case SINK_UNEXPECTED:
		rps__tcp_unexpected_append(ep, rx->unx);
		rx->unx = NULL;
		ep->peer_seq = rx->hdr.seq;
		rps__tcp_rq_match(ep);	/* a receive may have been posted while it streamed in */
		break;
	case SINK_READ_RESP:
		op = rx->op;
		op->responded = true;
		ep->rd_unanswered--;
		rps__tcp_sq_complete_done(ep);
		rps__tcp_sq_release_held(ep);
		break;
	}
}

static void rx_send(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct tcp_unexpected *u;
	struct tcp_recv *r;

	if (!rx_request_in_order(ep))
		return;
	if (!ep->unx_head && ep->rq_head != ep->rq_tail) {
		r = &ep->recvs[ep->rq_head & ep->rq_mask];
		if (h->len > r->len) {
			ep->rq_head++;
			rps__tcp_ep_complete(ep, r->wr_id, RPS__WC_LOC_ERR, RPS__WC_RECV, h->len, 0);
			rps__tcp_target_nak(ep, h->seq, RPS__WC_REM_OP_ERR);
			return;
		}
		/* the receive stays at the ring head until the payload is in */
		rx_begin_payload(ep, SINK_RECV, r->addr, h->len);
		return;
	}
	if (!rps__tcp_unexpected_room(ep, h->len)) {
		rps__tcp_target_nak(ep, h->seq, RPS__WC_RNR_RETRY_EXC_ERR);
		return;
	}
	u = malloc(sizeof(*u) + h->len);
	if (!u) {
		rps__tcp_target_nak(ep, h->seq, RPS__WC_REM_OP_ERR);
		return;
	}
	u->seq = h->seq;
	u->len = h->len;
	u->imm = 0;
	u->is_imm = false;
	ep->rx.unx = u;
	rx_begin_payload(ep, SINK_UNEXPECTED, u->data, h->len);
}

static void rx_write(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	uint8_t *dst = NULL;

	if (!rx_request_in_order(ep))
		return;
	if (h->len) {	/* IB: a zero-length WRITE checks no key */
		pthread_rwlock_rdlock(&ep->fab->mr_lock);
		dst = rps__tcp_mr_target(ep->fab, ep->id, h->rkey, h->raddr, h->len, RPS__ACCESS_REMOTE_WRITE);
		pthread_rwlock_unlock(&ep->fab->mr_lock);
		if (!dst) {
			rps__tcp_target_nak(ep, h->seq, RPS__WC_REM_ACCESS_ERR);
			return;
		}
	}
	rx_begin_payload(ep, SINK_TARGET_MEM, dst, h->len);
}

static void rx_read(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct wire_hdr resp = { .type = F_READ_RESP, .seq = h->seq, .len = h->len };
	uint8_t *src = NULL;

	if (!rx_request_in_order(ep))
		return;
	if (h->len) {
		pthread_rwlock_rdlock(&ep->fab->mr_lock);
		src = rps__tcp_mr_target(ep->fab, ep->id, h->rkey, h->raddr, h->len, RPS__ACCESS_REMOTE_READ);
		pthread_rwlock_unlock(&ep->fab->mr_lock);
		if (!src) {
			rps__tcp_target_nak(ep, h->seq, RPS__WC_REM_ACCESS_ERR);
			return;
		}
	}
	/* The payload is taken from the region when it goes to the socket, so
	 * a later WRITE of the same initiator may overtake this READ - as IB
	 * allows; RPS__WR_FENCE on the WRITE prevents it. */
	if (!rps__tcp_resp_queue(ep, &resp, src, h->len, h->rkey))
		return;
	ep->peer_seq = h->seq;
}

static void rx_atomic(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct wire_hdr resp = { .type = F_ATOMIC_RESP, .seq = h->seq, .len = 8 };
	uint64_t *word;
	uint64_t old;

	if (!rx_request_in_order(ep))
		return;
	pthread_rwlock_rdlock(&ep->fab->mr_lock);
	word = (uint64_t *)(void *)rps__tcp_mr_target(ep->fab, ep->id, h->rkey, h->raddr, 8, RPS__ACCESS_REMOTE_ATOMIC);
	if (!word || (h->raddr & 7)) {
		pthread_rwlock_unlock(&ep->fab->mr_lock);
		rps__tcp_target_nak(ep, h->seq, RPS__WC_REM_ACCESS_ERR);
		return;
	}
	if (h->type == F_CAS) {
		old = h->arg0;
		__atomic_compare_exchange_n(word, &old, h->arg1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	} else {
		old = __atomic_fetch_add(word, h->arg0, __ATOMIC_SEQ_CST);
	}
	pthread_rwlock_unlock(&ep->fab->mr_lock);

	resp.arg0 = old;
	if (!rps__tcp_resp_queue(ep, &resp, NULL, 0, 0))
		return;
	ep->peer_seq = h->seq;
}

/* The op a response answers: sent, not yet answered, of the right kind. */
static struct tcp_op *rx_answered_op(struct tcp_ep *ep, uint32_t seq, bool read)
{
	struct tcp_op *op;

	if (!seq_le(ep->sq_head, seq) || !seq_le(seq, ep->sq_sent))
		return NULL;
	op = &ep->ops[seq & ep->sq_mask];
	if (op->responded || !rps__tcp_op_wants_response(op->op) || (op->op == RPS__OP_READ) != read)
		return NULL;
	return op;
}

static void rx_ack(struct tcp_ep *ep)
{
	uint32_t w = ep->rx.hdr.seq;

	if (!seq_le(ep->peer_acked, w) || !seq_le(w, ep->sq_sent)) {
		rps__tcp_ep_fail(ep);
		return;
	}
	ep->peer_acked = w;
	rps__tcp_sq_complete_done(ep);
}

static void rx_nak(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	enum rps__wc_status status = (enum rps__wc_status)h->status;
	uint32_t w = (uint32_t)h->arg0;

	if (status != RPS__WC_REM_ACCESS_ERR && status != RPS__WC_REM_OP_ERR &&
	    status != RPS__WC_RNR_RETRY_EXC_ERR)
		status = RPS__WC_REM_OP_ERR;
	/* what the target executed before refusing completes normally */
	if (seq_le(ep->peer_acked, w) && seq_le(w, ep->sq_sent)) {
		ep->peer_acked = w;
		rps__tcp_sq_complete_done(ep);
	}
	rps__tcp_tx_purge_ops(ep);
	rps__tcp_ep_abort(ep);
	rps__tcp_ep_flush(ep, true, h->seq, status);
}

static void rx_read_resp(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct tcp_op *op = rx_answered_op(ep, h->seq, true);

	if (!op || h->len != op->len) {
		rps__tcp_ep_fail(ep);
		return;
	}
	ep->rx.op = op;
	/* (the lengths add up to op->len: checked at post) */
	rx_begin_payload(ep, SINK_READ_RESP, op->ndst ? op->dst[0].addr : NULL, op->ndst ? op->dst[0].len : 0);
}

static void rx_atomic_resp(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct tcp_op *op = rx_answered_op(ep, h->seq, false);

	if (!op) {
		rps__tcp_ep_fail(ep);
		return;
	}
	memcpy(op->local, &h->arg0, sizeof(h->arg0));
	op->responded = true;
	ep->rd_unanswered--;
	rps__tcp_sq_complete_done(ep);
	rps__tcp_sq_release_held(ep);
}

static void rx_frame(struct tcp_ep *ep)
{
	switch (ep->rx.hdr.type) {
	case F_SEND: rx_send(ep); break;
	case F_WRITE:
	case F_WRITE_IMM: rx_write(ep); break;
	case F_READ: rx_read(ep); break;
	case F_CAS:
	case F_FADD: rx_atomic(ep); break;
	case F_ACK: rx_ack(ep); break;
	case F_NAK: rx_nak(ep); break;
	case F_READ_RESP: rx_read_resp(ep); break;
	case F_ATOMIC_RESP: rx_atomic_resp(ep); break;
	default: rps__tcp_ep_fail(ep); break;
	}
}

/* Copy payload bytes that arrived in the receive buffer to their sink.
 * Target memory is rechecked under the lock on every chunk: a region
 * deregistered while a large WRITE streams in takes no further byte. */
static void rx_sink_copy(struct tcp_ep *ep, const uint8_t *src, uint32_t k)
{
	struct tcp_rx *rx = &ep->rx;

	if (rx->sink == SINK_TARGET_MEM) {
		pthread_rwlock_rdlock(&ep->fab->mr_lock);
		if (!rps__tcp_mr_target(ep->fab, ep->id, rx->hdr.rkey, (uintptr_t)rx->dst, rx->remaining, RPS__ACCESS_REMOTE_WRITE)) {
			pthread_rwlock_unlock(&ep->fab->mr_lock);
			rps__tcp_target_nak(ep, rx->hdr.seq, RPS__WC_REM_ACCESS_ERR);
			return;
		}
		memcpy(rx->dst, src, k);
		pthread_rwlock_unlock(&ep->fab->mr_lock);
	} else {
		memcpy(rx->dst, src, k);
	}
	rx_placed(ep, k);
}

static void rx_parse(struct tcp_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	uint32_t k;

	while (ep->conn == CONN_OPEN) {
		if (!rx->in_payload) {
			if (rx->end - rx->start < TCP_HDR_SIZE)
				break;
			rps__tcp_hdr_get(&rx->hdr, rx->buf + rx->start);
			rx->start += TCP_HDR_SIZE;
			rx_frame(ep);
		} else {
			k = RPS__MIN(rx->end - rx->start, rx->remaining);
			if (!k)
				break;
			rx->start += k;
			rx_sink_copy(ep, rx->buf + rx->start - k, k);
		}
	}
	if (rx->start == rx->end)
		rx->start = rx->end = 0;
}

/* Large payload with nothing buffered: recv straight into its destination. */
static ssize_t rx_read_direct(struct tcp_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	bool locked = rx->sink == SINK_TARGET_MEM;
	ssize_t n;

	if (locked) {
		pthread_rwlock_rdlock(&ep->fab->mr_lock);
		if (!rps__tcp_mr_target(ep->fab, ep->id, rx->hdr.rkey, (uintptr_t)rx->dst, rx->remaining, RPS__ACCESS_REMOTE_WRITE)) {
			pthread_rwlock_unlock(&ep->fab->mr_lock);
			rps__tcp_target_nak(ep, rx->hdr.seq, RPS__WC_REM_ACCESS_ERR);
			return -1;
		}
	}
	n = recv(ep->fd, rx->dst, rx->remaining, MSG_DONTWAIT);
	if (locked)
		pthread_rwlock_unlock(&ep->fab->mr_lock);
	if (n > 0)
		rx_placed(ep, (uint32_t)n);
	return n;
}

/* Read what ep's socket holds (its CQ's poll_lock held: the CQ's buffer
 * is ours until we return). */
static void ep_rx(struct tcp_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	size_t budget = TCP_RX_BUDGET, want;
	ssize_t n;

	rx->buf = ep->cq->rxbuf;
	memcpy(rx->buf, rx->carry, rx->ncarry);
	rx->start = 0;
	rx->end = rx->ncarry;
	while (ep->conn == CONN_OPEN && budget) {
		if (rx->in_payload && rx->start == rx->end && rx->remaining >= TCP_DIRECT_MIN) {
			want = rx->remaining;
			n = rx_read_direct(ep);
			if (ep->conn != CONN_OPEN)
				break;
		} else {
			if (rx->start) {	/* at most a partial header is left */
				memmove(rx->buf, rx->buf + rx->start, rx->end - rx->start);
				rx->end -= rx->start;
				rx->start = 0;
			}
			want = TCP_RXBUF_SIZE - rx->end;
			n = recv(ep->fd, rx->buf + rx->end, want, MSG_DONTWAIT);
			if (n > 0) {
				rx->end += (uint32_t)n;
				rx_parse(ep);
			}
		}
		if (n == 0) {
			rps__tcp_ep_fail(ep);	/* EOF: the peer closed */
			break;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				rps__tcp_ep_fail(ep);	/* ECONNRESET and friends */
			break;
		}
		budget -= RPS__MIN((size_t)n, budget);
		rps__tcp_queue_ack(ep);	/* one cumulative ACK for what this read brought */
		if ((size_t)n < want)
			break;	/* drained: spare the recv that would say EAGAIN, epoll is level-triggered */
	}
	/* parsing leaves at most a partial header on an open endpoint */
	rx->ncarry = ep->conn == CONN_OPEN ? rx->end - rx->start : 0;
	assert(rx->ncarry < TCP_HDR_SIZE);
	memcpy(rx->carry, rx->buf + rx->start, rx->ncarry);
	rx->buf = NULL;
	rx->start = rx->end = 0;
}

/* Remember ep for a later flush (caller holds poll_lock); false if the
 * list cannot grow, and the caller flushes now. */
static bool defer_flush(struct tcp_cq *cq, struct tcp_ep *ep)
{
	if (ep->deferred)
		return true;
	if (rps__grow(&cq->deferred, &cq->deferred_cap, cq->ndeferred + 1, sizeof(*cq->deferred), 16))
		return false;
	cq->deferred[cq->ndeferred++] = ep;
	ep->deferred = true;
	return true;
}

/* Flush what defer_flush() held back (caller holds poll_lock). */
void rps__tcp_flush_deferred(struct tcp_cq *cq)
{
	uint32_t i;

	for (i = 0; i < cq->ndeferred; i++) {
		struct tcp_ep *ep = cq->deferred[i];
		pthread_mutex_lock(&ep->lock);
		ep->deferred = false;
		if (ep->conn != CONN_CLOSED)
			rps__tcp_ep_tx_flush(ep);
		pthread_mutex_unlock(&ep->lock);
	}
	cq->ndeferred = 0;
}

static void ep_progress(struct tcp_ep *ep, uint32_t events)
{
	bool defer = false;

	pthread_mutex_lock(&ep->lock);
	if (ep->conn == CONN_OPEN && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		ep_rx(ep);
	/* Responses produced by what we just read may wait for the end of
	 * this poll (see tcp_cq.deferred); a socket that has room again, or a
	 * closing endpoint, is flushed now. */
	if (ep->conn == CONN_OPEN && !(events & EPOLLOUT) && ep->tx_head)
		defer = defer_flush(ep->cq, ep);
	if (!defer && ep->conn != CONN_CLOSED)
		rps__tcp_ep_tx_flush(ep);
	pthread_mutex_unlock(&ep->lock);
}

static void cq_progress(struct tcp_cq *cq)
{
	struct epoll_event evs[TCP_EPOLL_BATCH];
	uint64_t counter;
	int i, n;

	n = epoll_wait(cq->epfd, evs, TCP_EPOLL_BATCH, 0);
	for (i = 0; i < n; i++) {
		if (!evs[i].data.ptr) {
			if (read(cq->evfd, &counter, sizeof(counter)) < 0) {
				/* already drained: nothing to do */
			}
			continue;
		}
		ep_progress(evs[i].data.ptr, evs[i].events);
	}
}

int rps__tcp_cq_poll(struct rps__cq *base, struct rps__wc *wc, int n)
{
	struct tcp_cq *cq = rps__container_of(base, struct tcp_cq, base);
	uint32_t queued;
	int got;

	if (n <= 0)
		return 0;
	pthread_mutex_lock(&cq->poll_lock);
	/* The caller handled what the last poll returned, and posted its
	 * answers: what is still held back goes now. */
	rps__tcp_flush_deferred(cq);
	pthread_mutex_lock(&cq->lock);
	/* The caller is awake: completions the engine queues now need no
	 * eventfd wake-up (cq_arm re-checks before it sleeps again). */
	cq->armed = false;
	queued = cq->count;
	pthread_mutex_unlock(&cq->lock);
	if (queued < (uint32_t)n)
		cq_progress(cq);
	got = rps__tcp_cq_pop(cq, wc, n);
	if (!got)
		rps__tcp_flush_deferred(cq);	/* no completion to act on: nothing to wait for */
	pthread_mutex_unlock(&cq->poll_lock);
	return got;
}
