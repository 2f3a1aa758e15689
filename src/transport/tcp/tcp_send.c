/*
 * tcp_send.c - the TCP provider's endpoint state and frames out (tcp.c has
 * the overview): posting work requests (the initiator), queueing and
 * writing frames - requests, ACKs, responses, the NAK - with their
 * completions, failing an endpoint, posted receives and early arrivals.
 */
#include "config.h"
#include "common/common.h"
#include "transport/tcp/tcp_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* ------------------------------------------------------------------------ */
/* endpoint state                                                           */

static enum rps__wc_opcode op_wc_opcode(uint8_t op)
{
	switch (op) {
	case RPS__OP_SEND: return RPS__WC_SEND;
	case RPS__OP_WRITE:
	case RPS__OP_WRITE_IMM: return RPS__WC_WRITE;
	case RPS__OP_READ: return RPS__WC_READ;
	case RPS__OP_CAS: return RPS__WC_CAS;
	default: return RPS__WC_FADD;
	}
}

static void ep_set_events(struct tcp_ep *ep)
{
	struct epoll_event ev = { .data.ptr = ep };

	if (ep->conn == CONN_CLOSED)
		return;
	if (ep->conn == CONN_OPEN)
		ev.events = EPOLLIN | (ep->tx_head ? EPOLLOUT : 0);
	else
		ev.events = EPOLLOUT;
	if (ev.events == ep->epoll_events)
		return;
	if (epoll_ctl(ep->cq->epfd, EPOLL_CTL_MOD, ep->fd, &ev) == 0)
		ep->epoll_events = ev.events;
}

/* Stop all traffic: out of epoll, socket shut so the peer sees EOF and flushes. */
void rps__tcp_ep_abort(struct tcp_ep *ep)
{
	struct tcp_txe *txe, *next;

	if (ep->conn == CONN_CLOSED)
		return;
	ep->conn = CONN_CLOSED;
	epoll_ctl(ep->cq->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
	shutdown(ep->fd, SHUT_RDWR);
	for (txe = ep->tx_head; txe; txe = next) {
		next = txe->next;
		if (txe->kind == TXE_RESP)
			rps__tcp_resp_free(ep, txe);
	}
	ep->tx_head = ep->tx_tail = ep->ack_tail = NULL;
}

void rps__tcp_unexpected_free_all(struct tcp_ep *ep)
{
	struct tcp_unexpected *u, *next;

	for (u = ep->unx_head; u; u = next) {
		next = u->next;
		free(u);
	}
	ep->unx_head = ep->unx_tail = NULL;
	ep->unx_count = 0;
	ep->unx_bytes = 0;
	free(ep->rx.unx);
	ep->rx.unx = NULL;
}

/* Remove our own requests from the outgoing queue: their ops are being
 * flushed and the caller may reuse their buffers at once.  Returns false when
 * the head is one of them half written: the stream cannot carry another
 * frame, the connection must be aborted. */
bool rps__tcp_tx_purge_ops(struct tcp_ep *ep)
{
	struct tcp_txe **link = &ep->tx_head, *txe;
	bool clean = true;

	ep->tx_tail = NULL;
	while ((txe = *link)) {
		if (txe->kind == TXE_OP) {
			if (txe == ep->tx_head && txe->sent)
				clean = false;
			*link = txe->next;
			continue;
		}
		ep->tx_tail = txe;
		link = &txe->next;
	}
	ep->ack_tail = NULL;
	return clean;
}

/* The error state: every outstanding op and posted receive completes, in
 * order, with FLUSH_ERR - except the op numbered fail_seq when has_fail,
 * which gets fail_status.  Unsignaled ops complete too: they failed. */
void rps__tcp_ep_flush(struct tcp_ep *ep, bool has_fail, uint32_t fail_seq, enum rps__wc_status fail_status)
{
	struct tcp_op *op;
	struct tcp_recv *r;

	__atomic_store_n(&ep->base.error, 1, __ATOMIC_RELEASE);
	for (; ep->sq_head != ep->sq_next; ep->sq_head++) {
		op = &ep->ops[ep->sq_head & ep->sq_mask];
		rps__tcp_ep_complete(ep, op->wr_id, has_fail && op->seq == fail_seq ? fail_status : RPS__WC_FLUSH_ERR,
			    op_wc_opcode(op->op), 0, 0);
	}
	ep->held_head = ep->held_tail = NULL;
	ep->rd_unanswered = 0;
	for (; ep->rq_head != ep->rq_tail; ep->rq_head++) {
		r = &ep->recvs[ep->rq_head & ep->rq_mask];
		rps__tcp_ep_complete(ep, r->wr_id, RPS__WC_FLUSH_ERR, RPS__WC_RECV, 0, 0);
	}
	rps__tcp_unexpected_free_all(ep);
}

/* Peer gone, protocol violated, or revoked memory mid-stream: flush and abort. */
void rps__tcp_ep_fail(struct tcp_ep *ep)
{
	rps__tcp_tx_purge_ops(ep);
	rps__tcp_ep_abort(ep);
	if (!ep->base.error)
		rps__tcp_ep_flush(ep, false, 0, RPS__WC_FLUSH_ERR);
}

/* What the target has executed, for ACK and NAK: everything up to peer_seq,
 * but a SEND or WRITE_IMM still waiting for a receive holds the line. */
static uint32_t target_watermark(const struct tcp_ep *ep)
{
	return ep->unx_head ? ep->unx_head->seq - 1 : ep->peer_seq;
}

/* The target refuses request seq: the peer's op gets status, both endpoints
 * go to the error state.  The NAK goes after the responses already queued
 * (they answer earlier requests), then the socket is shut down. */
void rps__tcp_target_nak(struct tcp_ep *ep, uint32_t seq, enum rps__wc_status status)
{
	struct wire_hdr h = { .type = F_NAK, .status = (uint8_t)status, .seq = seq };

	if (ep->conn != CONN_OPEN)
		return;
	h.arg0 = target_watermark(ep);
	if (!rps__tcp_tx_purge_ops(ep)) {
		rps__tcp_ep_fail(ep);
		return;
	}
	rps__tcp_ep_flush(ep, false, 0, RPS__WC_FLUSH_ERR);
	rps__tcp_hdr_put(ep->nak.hdr, &h);
	ep->nak.kind = TXE_NAK;
	ep->nak.nseg = 0;
	ep->nak.payload_len = 0;
	ep->nak.src_rkey = 0;
	rps__tcp_tx_append(ep, &ep->nak);
	ep->conn = CONN_DRAINING;
	ep_set_events(ep);
}

/* ------------------------------------------------------------------------ */
/* sending                                                                  */

static void tx_release(struct tcp_ep *ep, struct tcp_txe *txe)
{
	if (txe->kind == TXE_OP)
		ep->sq_sent = rps__container_of(txe, struct tcp_op, txe)->seq;
	else if (txe->kind == TXE_RESP)
		rps__tcp_resp_free(ep, txe);
}

static void tx_advance(struct tcp_ep *ep, size_t n)
{
	struct tcp_txe *txe;
	uint32_t total, take;

	while (n && (txe = ep->tx_head)) {
		total = TCP_HDR_SIZE + txe->payload_len;
		take = (uint32_t)RPS__MIN((size_t)(total - txe->sent), n);
		txe->sent += take;
		n -= take;
		if (txe == ep->ack_tail)
			ep->ack_tail = NULL;	/* partly on the wire: no longer rewritable */
		if (txe->sent < total)
			break;
		ep->tx_head = txe->next;
		if (!ep->tx_head)
			ep->tx_tail = NULL;
		tx_release(ep, txe);
	}
}

/* A READ response is read from the target region when it is written to the
 * socket, not when the request was executed: check that the region was not
 * deregistered meanwhile.  mr_lock held for reading.  (A response is one
 * segment.) */
static bool tx_sources_valid(struct tcp_ep *ep, struct tcp_txe *first, int count)
{
	struct tcp_txe *txe;
	uint32_t done;
	int i;

	for (txe = first, i = 0; txe && i < count; txe = txe->next, i++) {
		if (!txe->src_rkey)
			continue;
		done = txe->sent > TCP_HDR_SIZE ? txe->sent - TCP_HDR_SIZE : 0;
		if (!rps__tcp_mr_target(ep->fab, ep->id, txe->src_rkey, (uintptr_t)(txe->seg[0].addr + done),
			       txe->payload_len - done, RPS__ACCESS_REMOTE_READ))
			return false;
	}
	return true;
}

/* Write as much of the outgoing queue as the socket takes, without waiting.
 * What is left is finished from cq_poll when EPOLLOUT fires. */
void rps__tcp_ep_tx_flush(struct tcp_ep *ep)
{
	struct iovec iov[TCP_IOV_BATCH];
	struct msghdr msg = { .msg_iov = iov };
	struct tcp_txe *txe;
	int cnt, nframes;
	bool need_lock;
	ssize_t n;

	while (ep->tx_head && ep->conn != CONN_CLOSED) {
		cnt = 0;
		nframes = 0;
		need_lock = false;
		for (txe = ep->tx_head; txe && cnt + 1 + txe->nseg <= TCP_IOV_BATCH; txe = txe->next, nframes++) {
			uint32_t off = txe->sent, k;

			if (off < TCP_HDR_SIZE) {
				iov[cnt].iov_base = txe->hdr + off;
				iov[cnt++].iov_len = TCP_HDR_SIZE - off;
				off = 0;
			} else {
				off -= TCP_HDR_SIZE;
			}
			/* the segments still unsent, straight from their memory */
			for (k = 0; k < txe->nseg; k++) {
				if (off >= txe->seg[k].len) {
					off -= txe->seg[k].len;
					continue;
				}
				iov[cnt].iov_base = txe->seg[k].addr + off;
				iov[cnt++].iov_len = txe->seg[k].len - off;
				off = 0;
				need_lock |= txe->src_rkey != 0;
			}
		}
		msg.msg_iovlen = (size_t)cnt;
		if (need_lock) {
			pthread_rwlock_rdlock(&ep->fab->mr_lock);
			if (!tx_sources_valid(ep, ep->tx_head, nframes)) {
				pthread_rwlock_unlock(&ep->fab->mr_lock);
				rps__tcp_ep_fail(ep);
				return;
			}
		}
		n = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (need_lock)
			pthread_rwlock_unlock(&ep->fab->mr_lock);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			rps__tcp_ep_fail(ep);	/* EPIPE, ECONNRESET: the peer is gone */
			return;
		}
		tx_advance(ep, (size_t)n);
	}
	if (!ep->tx_head && ep->conn == CONN_DRAINING) {
		/* the NAK is out: FIN after it, and nothing more from this socket */
		shutdown(ep->fd, SHUT_WR);
		epoll_ctl(ep->cq->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
		ep->conn = CONN_CLOSED;
		return;
	}
	ep_set_events(ep);
}

/* Queue one cumulative ACK for what the target executed since the last one;
 * folded into the previous ACK while that one is still the unsent tail. */
void rps__tcp_queue_ack(struct tcp_ep *ep)
{
	struct wire_hdr h = { .type = F_ACK };
	struct tcp_txe *txe;
	uint32_t w;
	uint8_t le[4];

	if (ep->conn != CONN_OPEN)
		return;
	w = target_watermark(ep);
	if (w == ep->ack_queued)
		return;
	ep->ack_queued = w;
	if (ep->ack_tail) {
		uint32_t v = htole32(w);

		memcpy(le, &v, sizeof(le));
		memcpy(ep->ack_tail->hdr + HDR_SEQ_OFFSET, le, sizeof(le));
		return;
	}
	h.seq = w;
	txe = rps__tcp_resp_queue(ep, &h, NULL, 0, 0);
	if (txe)
		ep->ack_tail = txe;
}

/* Move ops from the held queue to the wire queue; a FENCE op waits until
 * every earlier READ and atomic is answered. */
void rps__tcp_sq_release_held(struct tcp_ep *ep)
{
	struct tcp_txe *txe;
	struct tcp_op *op;

	while ((txe = ep->held_head)) {
		op = rps__container_of(txe, struct tcp_op, txe);
		if (op->fence && ep->rd_unanswered)
			break;
		ep->held_head = txe->next;
		if (!ep->held_head)
			ep->held_tail = NULL;
		rps__tcp_tx_append(ep, txe);
		if (rps__tcp_op_wants_response(op->op))
			ep->rd_unanswered++;
	}
}

/* Deliver send-queue completions in posting order: stop at the first op the
 * target has not executed (WRITE/SEND: acked; READ/atomic: answered). */
void rps__tcp_sq_complete_done(struct tcp_ep *ep)
{
	struct tcp_op *op;

	while (ep->sq_head != ep->sq_next) {
		op = &ep->ops[ep->sq_head & ep->sq_mask];
		if (rps__tcp_op_wants_response(op->op) ? !op->responded : !seq_le(op->seq, ep->peer_acked))
			break;
		if (op->signaled)
			rps__tcp_ep_complete(ep, op->wr_id, RPS__WC_SUCCESS, op_wc_opcode(op->op),
				    op->op == RPS__OP_CAS || op->op == RPS__OP_FADD ? 8 : op->len, 0);
		ep->sq_head++;
	}
}

static int sge_check(const struct tcp_ep *ep, const struct rps__sge *sge, const char *what)
{
	const struct rps__mr *mr = sge->mr;
	uintptr_t start, addr = (uintptr_t)sge->addr;

	if (!sge->len)
		return 0;
	if (!mr)
		return rps__seterr(-EINVAL, "%s: buffer %p+%u has no memory region: register it with rps__mr_reg "
				   "(or use RPS__WR_INLINE for a small payload)", what, sge->addr, sge->len);
	if (mr->fab != &ep->fab->base)
		return rps__seterr(-EINVAL, "%s: buffer %p+%u is registered with another fabric: "
				   "register it with the endpoint's fabric", what, sge->addr, sge->len);
	start = (uintptr_t)mr->addr;
	if (addr < start || sge->len > mr->len || addr - start > mr->len - sge->len)
		return rps__seterr(-EINVAL, "%s: buffer %p+%u lies outside its region %p+%zu: "
				   "pass the region that holds it", what, sge->addr, sge->len, mr->addr, mr->len);
	return 0;
}

/* Every entry of wr in its region (an inline payload needs none). */
static int sgl_check(const struct tcp_ep *ep, const struct rps__wr *wr)
{
	int i, ret;

	for (i = 0; i < rps__wr_nsge(wr); i++) {
		if (wr->flags & RPS__WR_INLINE) {
			if (wr->sgl[i].len && !wr->sgl[i].addr)
				return rps__seterr(-EINVAL, "post: inline payload of %u bytes at NULL", wr->sgl[i].len);
			continue;
		}
		ret = sge_check(ep, &wr->sgl[i], "post");
		if (ret)
			return ret;
	}
	return 0;
}

static int wr_check(const struct tcp_ep *ep, const struct rps__wr *wr)
{
	bool inl = wr->flags & RPS__WR_INLINE;

	if (wr->num_sge < 0 || wr->num_sge > RPS__WR_MAX_SGE)
		return rps__seterr(-EINVAL, "post: %d scatter/gather entries, at most %d: split the request",
				   wr->num_sge, RPS__WR_MAX_SGE);
	if (rps__wr_len(wr) > UINT32_MAX)
		return rps__seterr(-EINVAL, "post: %llu bytes in one request, at most 4 GiB - 1: split it",
				   (unsigned long long)rps__wr_len(wr));
	switch (wr->op) {
	case RPS__OP_SEND:
	case RPS__OP_WRITE:
	case RPS__OP_WRITE_IMM:
		if (inl && rps__wr_len(wr) > ep->max_inline)
			return rps__seterr(-EINVAL, "post: inline payload of %llu bytes exceeds max_inline %u: "
					   "raise rps__ep_attr.max_inline or register the buffer",
					   (unsigned long long)rps__wr_len(wr), ep->max_inline);
		return sgl_check(ep, wr);
	case RPS__OP_READ:
		if (inl)
			return rps__seterr(-EINVAL, "post: a READ cannot be inline: drop RPS__WR_INLINE");
		return sgl_check(ep, wr);
	case RPS__OP_CAS:
	case RPS__OP_FADD:
		if (inl || rps__wr_nsge(wr) != 1 || wr->sge.len != 8 || ((uintptr_t)wr->sge.addr & 7))
			return rps__seterr(-EINVAL, "post: an atomic needs one 8-byte aligned registered local word "
					   "for the old value (got %p+%u%s)", wr->sge.addr, wr->sge.len,
					   inl ? ", inline" : "");
		return sge_check(ep, &wr->sge, "post");
	}
	return rps__seterr(-EINVAL, "post: unknown operation %d", (int)wr->op);
}

static void op_prepare(struct tcp_ep *ep, const struct rps__wr *wr)
{
	uint32_t slot = ep->sq_next & ep->sq_mask;
	struct tcp_op *op = &ep->ops[slot];
	int i, nsge = rps__wr_nsge(wr);
	struct wire_hdr h = {
		.seq = ep->sq_next,
		.rkey = wr->rkey,
		.raddr = wr->raddr,
		.len = (uint32_t)rps__wr_len(wr),
	};

	op->wr_id = wr->wr_id;
	op->op = (uint8_t)wr->op;
	op->signaled = wr->flags & RPS__WR_SIGNALED;
	op->fence = wr->flags & RPS__WR_FENCE;
	op->responded = false;
	op->seq = ep->sq_next;
	op->len = h.len;
	op->local = NULL;
	op->ndst = 0;
	op->txe.kind = TXE_OP;
	op->txe.src_rkey = 0;
	op->txe.nseg = 0;
	op->txe.payload_len = 0;

	switch (wr->op) {
	case RPS__OP_SEND:
	case RPS__OP_WRITE:
	case RPS__OP_WRITE_IMM:
		h.type = wr->op == RPS__OP_SEND ? F_SEND : wr->op == RPS__OP_WRITE ? F_WRITE : F_WRITE_IMM;
		h.imm = wr->op == RPS__OP_WRITE_IMM ? wr->imm : 0;
		op->txe.payload_len = h.len;
		if ((wr->flags & RPS__WR_INLINE) && h.len) {
			uint8_t *copy = ep->inline_buf + (size_t)slot * ep->max_inline;

			op->txe.seg[0] = (struct tcp_seg){ copy, h.len };
			op->txe.nseg = 1;
			for (i = 0; i < nsge; i++) {
				if (!wr->sgl[i].len)
					continue;
				memcpy(copy, wr->sgl[i].addr, wr->sgl[i].len);
				copy += wr->sgl[i].len;
			}
			break;
		}
		/* zero-copy: the frame is written from the caller's memory,
		 * which the contract keeps unchanged until the completion */
		for (i = 0; i < nsge; i++)
			if (wr->sgl[i].len)
				op->txe.seg[op->txe.nseg++] = (struct tcp_seg){ wr->sgl[i].addr, wr->sgl[i].len };
		break;
	case RPS__OP_READ:
		h.type = F_READ;
		for (i = 0; i < nsge; i++)
			op->dst[op->ndst++] = (struct tcp_seg){ wr->sgl[i].addr, wr->sgl[i].len };
		break;
	case RPS__OP_CAS:
	case RPS__OP_FADD:
		h.type = wr->op == RPS__OP_CAS ? F_CAS : F_FADD;
		h.len = 8;
		h.arg0 = wr->compare_add;
		h.arg1 = wr->op == RPS__OP_CAS ? wr->swap : 0;
		op->local = wr->sge.addr;
		break;
	}
	rps__tcp_hdr_put(op->txe.hdr, &h);

	op->txe.next = NULL;
	if (ep->held_tail)
		ep->held_tail->next = &op->txe;
	else
		ep->held_head = &op->txe;
	ep->held_tail = &op->txe;
	ep->sq_next++;
}

int rps__tcp_post(struct rps__ep *base, const struct rps__wr *wr, int n)
{
	struct tcp_ep *ep = rps__container_of(base, struct tcp_ep, base);
	bool queue_was_empty;
	uint32_t room;
	int i, ret;

	if (n < 0)
		return rps__seterr(-EINVAL, "post: negative count %d", n);
	/* all or nothing: check every request before queueing any */
	for (i = 0; i < n; i++) {
		ret = wr_check(ep, &wr[i]);
		if (ret)
			return ret;
	}
	if ((uint32_t)n > ep->sq_depth)
		return rps__seterr(-EINVAL, "post: %d requests exceed sq_depth %u: post fewer at a time",
				   n, ep->sq_depth);

	pthread_mutex_lock(&ep->lock);
	if (ep->base.error) {
		/* IB rules: posting to a QP in error succeeds and flushes */
		for (i = 0; i < n; i++)
			rps__tcp_ep_complete(ep, wr[i].wr_id, RPS__WC_FLUSH_ERR, op_wc_opcode((uint8_t)wr[i].op), 0, 0);
		pthread_mutex_unlock(&ep->lock);
		return 0;
	}
	room = ep->sq_depth - (ep->sq_next - ep->sq_head);
	if ((uint32_t)n > room) {
		pthread_mutex_unlock(&ep->lock);
		return rps__seterr(-EAGAIN, "post: send queue full (%u of %u outstanding): "
				   "poll the completion queue, then retry", ep->sq_depth - room, ep->sq_depth);
	}
	queue_was_empty = !ep->tx_head;
	for (i = 0; i < n; i++)
		op_prepare(ep, &wr[i]);
	rps__tcp_sq_release_held(ep);
	/* An empty queue means the socket may take it all now; a non-empty one
	 * means it said EAGAIN and EPOLLOUT is armed: cq_poll will write. */
	if (queue_was_empty)
		rps__tcp_ep_tx_flush(ep);
	pthread_mutex_unlock(&ep->lock);
	return 0;
}

/* The frames not written yet (sent in part, queued, or held behind a
 * FENCE) read their segments from the caller's memory when the socket takes
 * them (rps__tcp_ep_tx_flush, under ep->lock): point those in [from, from +
 * len) at the copy.  The bytes are the same, so a frame half written goes
 * on from the copy at the same offset. */
int rps__tcp_ep_rebase(struct rps__ep *base, const void *from, void *to, size_t len)
{
	struct tcp_ep *ep = rps__container_of(base, struct tcp_ep, base);
	const uint8_t *lo = from, *hi = lo + len;
	struct tcp_txe *lists[2], *txe;
	uint32_t k;
	int l;

	pthread_mutex_lock(&ep->lock);
	lists[0] = ep->tx_head;
	lists[1] = ep->held_head;
	for (l = 0; l < 2; l++)
		for (txe = lists[l]; txe; txe = txe->next)
			for (k = 0; k < txe->nseg; k++)
				if (txe->seg[k].addr >= lo && txe->seg[k].addr < hi)
					txe->seg[k].addr = (uint8_t *)to + (txe->seg[k].addr - lo);
	pthread_mutex_unlock(&ep->lock);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* receiving: posted receives and early arrivals                            */

/* Hand early SENDs / WRITE_IMMs to receives posted since, in order. */
void rps__tcp_rq_match(struct tcp_ep *ep)
{
	struct tcp_unexpected *u;
	struct tcp_recv *r;

	while ((u = ep->unx_head) && ep->rq_head != ep->rq_tail) {
		r = &ep->recvs[ep->rq_head & ep->rq_mask];
		if (!u->is_imm && u->len > r->len) {
			ep->rq_head++;
			rps__tcp_ep_complete(ep, r->wr_id, RPS__WC_LOC_ERR, RPS__WC_RECV, u->len, 0);
			rps__tcp_target_nak(ep, u->seq, RPS__WC_REM_OP_ERR);
			return;
		}
		if (!u->is_imm && u->len)
			memcpy(r->addr, u->data, u->len);
		ep->rq_head++;
		rps__tcp_ep_complete(ep, r->wr_id, RPS__WC_SUCCESS, u->is_imm ? RPS__WC_RECV_IMM : RPS__WC_RECV,
			    u->len, u->imm);
		ep->unx_head = u->next;
		if (!ep->unx_head)
			ep->unx_tail = NULL;
		ep->unx_count--;
		ep->unx_bytes -= u->len * !u->is_imm;
		free(u);
	}
}

bool rps__tcp_unexpected_room(const struct tcp_ep *ep, uint32_t len)
{
	return ep->unx_count < ep->rq_depth && ep->unx_bytes + len <= TCP_UNEXPECTED_BYTES;
}

void rps__tcp_unexpected_append(struct tcp_ep *ep, struct tcp_unexpected *u)
{
	u->next = NULL;
	if (ep->unx_tail)
		ep->unx_tail->next = u;
	else
		ep->unx_head = u;
	ep->unx_tail = u;
	ep->unx_count++;
	ep->unx_bytes += u->is_imm ? 0 : u->len;
}

int rps__tcp_post_recv(struct rps__ep *base, const struct rps__sge *sge, uint64_t wr_id)
{
	struct tcp_ep *ep = rps__container_of(base, struct tcp_ep, base);
	struct tcp_recv *r;
	int ret;

	ret = sge_check(ep, sge, "post_recv");
	if (ret)
		return ret;
	pthread_mutex_lock(&ep->lock);
	if (ep->base.error) {
		rps__tcp_ep_complete(ep, wr_id, RPS__WC_FLUSH_ERR, RPS__WC_RECV, 0, 0);
		pthread_mutex_unlock(&ep->lock);
		return 0;
	}
	if (ep->rq_tail - ep->rq_head == ep->rq_depth) {
		pthread_mutex_unlock(&ep->lock);
		return rps__seterr(-EAGAIN, "post_recv: receive queue full (%u posted): "
				   "raise rps__ep_attr.rq_depth or wait for receives to complete", ep->rq_depth);
	}
	r = &ep->recvs[ep->rq_tail++ & ep->rq_mask];
	r->wr_id = wr_id;
	r->addr = sge->addr;
	r->len = sge->len;
	if (ep->unx_head) {
		/* a held SEND now has its receive: it counts as executed, ack it */
		rps__tcp_rq_match(ep);
		rps__tcp_queue_ack(ep);
		rps__tcp_ep_tx_flush(ep);
	}
	pthread_mutex_unlock(&ep->lock);
	return 0;
}
