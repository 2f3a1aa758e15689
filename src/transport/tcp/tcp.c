/*
 * tcp.c - the TCP provider of the transport interface (transport.h): the
 * provider's glue - fabric, memory registration, completion queues,
 * endpoints, and the ops table.
 *
 * Gives the product RC queue-pair semantics over stream sockets, for machines
 * with no RDMA device (CI, laptops, plain Ethernet).  The initiator turns each
 * work request into a frame; the target executes one-sided WRITE, READ and
 * atomics on behalf of the initiator, with the key, bounds, rights and
 * alignment checks an HCA makes, and answers with acks and responses.
 *
 * Progress is manual (libfabric's FI_PROGRESS_MANUAL): every piece of engine
 * work - reading sockets, executing requests as target, completing ops as
 * initiator, finishing half-written frames - happens inside rps__cq_poll() of
 * the CQ the endpoint is bound to.  rps__post() only tries one non-blocking
 * writev and never waits for the socket.
 *
 * The pieces, in src/transport/tcp/ (tcp_int.h has what they share; the
 * interface they implement is ../provider.h; tests/filemaps.sh checks that
 * this map names each):
 *   tcp.c         this file: fabric, registration, CQs, endpoints, ops table
 *   tcp_codec.c   the wire format: handshake hello and frame header
 *   tcp_send.c    endpoint state and every frame out: posting work requests,
 *                 queueing and writing frames, failing an endpoint, receives
 *   tcp_engine.c  frames in: the target executes one-sided requests, the
 *                 initiator completes its ops; the progress loop (cq_poll)
 *   tcp_conn.c    sockets, handshake, listener, accept/reject, connect
 */
#include "config.h"
#include "common/common.h"
#include "transport/tcp/tcp_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

static uint32_t pow2_at_least(uint32_t v)
{
	uint32_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

/* ------------------------------------------------------------------------ */
/* fabric and memory registration                                           */

static int tcp_fabric_open(const struct rps__fabric_attr *attr, struct rps__fabric **out)
{
	struct tcp_fabric *fab;
	int ret;

	fab = calloc(1, sizeof(*fab));
	if (!fab)
		return rps__seterr(-ENOMEM, "tcp fabric: out of memory");
	ret = pthread_rwlock_init(&fab->mr_lock, NULL);
	if (ret) {
		ret = rps__seterr(-ret, "tcp fabric: pthread_rwlock_init: %s", strerror(ret));
		goto err_free;
	}
	fab->base.ops = &rps__tcp_ops;
	fab->base.kind = RPS__KIND_TCP;
	fab->free_head = MR_NONE;
	fab->free_tail = MR_NONE;
	*out = &fab->base;
	return 0;

err_free:
	free(fab);
	return ret;
}

static void tcp_fabric_close(struct rps__fabric *base)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	uint32_t i;

	/* regions the caller forgot: free their handles, nothing else owns them */
	for (i = 0; i < fab->nslots; i++)
		if (fab->slots[i].in_use)
			free(fab->slots[i].mr);
	free(fab->slots);
	pthread_rwlock_destroy(&fab->mr_lock);
	free(fab);
}

static const char *tcp_fabric_name(const struct rps__fabric *fab)
{
	return "tcp";
}

/* Take a slot, oldest freed first; grows the table.  mr_lock held for writing. */
static int mr_slot_alloc(struct tcp_fabric *fab, uint32_t *index)
{
	if (fab->free_head != MR_NONE) {
		*index = fab->free_head;
		fab->free_head = fab->slots[*index].next_free;
		if (fab->free_head == MR_NONE)
			fab->free_tail = MR_NONE;
		return 0;
	}
	if (fab->nslots == fab->cap) {
		if (fab->cap > MR_INDEX_MASK)
			return rps__seterr(-ENOSPC, "mr_reg: %u regions registered, the tcp limit: "
					   "register fewer, larger pools", fab->cap);
		if (rps__grow(&fab->slots, &fab->cap, fab->nslots + 1, sizeof(*fab->slots), 64))
			return rps__seterr(-ENOMEM, "mr_reg: out of memory for the region table");
	}
	*index = fab->nslots++;
	fab->slots[*index].gen = 0;
	return 0;
}

static int tcp_mr_reg(struct rps__fabric *base, void *addr, size_t len, int access, struct rps__mr **out)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	struct tcp_mr_slot *slot;
	struct tcp_mr *mr;
	uint32_t slot_index = 0;
	int ret;

	if (!addr || !len)
		return rps__seterr(-EINVAL, "mr_reg: empty region (addr %p, len %zu): register a real buffer", addr, len);
	if (access & ~(RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC |
		       RPS__ACCESS_WINDOWED))
		return rps__seterr(-EINVAL, "mr_reg: unknown access bits 0x%x", access);
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return rps__seterr(-ENOMEM, "mr_reg: out of memory");

	pthread_rwlock_wrlock(&fab->mr_lock);
	ret = mr_slot_alloc(fab, &slot_index);
	if (ret)
		goto err_unlock;
	slot = &fab->slots[slot_index];
	slot->gen = slot->gen % MR_GEN_MAX + 1;
	slot->addr = addr;
	slot->len = len;
	/* a windowed region's own key reaches it only locally (local_cas) */
	slot->access = (access & RPS__ACCESS_WINDOWED) ? RPS__ACCESS_LOCAL : access;
	slot->in_use = true;
	slot->next_free = MR_NONE;
	slot->mr = mr;
	slot->owner = 0;
	slot->parent = MR_NONE;
	mr->index = slot_index;
	mr->base.fab = base;
	mr->base.addr = addr;
	mr->base.len = len;
	mr->base.access = access;
	mr->base.rkey = slot->gen << MR_INDEX_BITS | slot_index;
	mr->base.lkey = mr->base.rkey;
	pthread_rwlock_unlock(&fab->mr_lock);
	*out = &mr->base;
	return 0;

err_unlock:
	pthread_rwlock_unlock(&fab->mr_lock);
	free(mr);
	return ret;
}

/* Sends read the caller's memory as they go (sendmsg iovecs), so any
 * address will do as a source.  The region takes no slot: no key names
 * it, so no peer ever reaches it. */
static int tcp_mr_reg_implicit(struct rps__fabric *base, struct rps__mr **out)
{
	struct tcp_mr *mr = calloc(1, sizeof(*mr));

	if (!mr)
		return rps__seterr(-ENOMEM, "mr_reg_implicit: out of memory");
	mr->index = MR_NONE;
	mr->base.fab = base;
	mr->base.addr = NULL;
	mr->base.len = SIZE_MAX;
	mr->base.access = RPS__ACCESS_LOCAL;
	*out = &mr->base;
	return 0;
}

/* Back to the free FIFO, oldest-freed reused first.  mr_lock held for writing. */
static void mr_slot_free(struct tcp_fabric *fab, uint32_t index)
{
	struct tcp_mr_slot *slot = &fab->slots[index];

	if (slot->owner)
		fab->nwindows--;
	slot->in_use = false;
	slot->mr = NULL;
	slot->owner = 0;
	slot->parent = MR_NONE;
	slot->next_free = MR_NONE;
	if (fab->free_tail == MR_NONE)
		fab->free_head = index;
	else
		fab->slots[fab->free_tail].next_free = index;
	fab->free_tail = index;
}

/* Free the windows that answer to endpoint `owner`, or that lie on region
 * slot `parent` (MR_NONE / 0: no such condition).  mr_lock held for writing. */
static void windows_free(struct tcp_fabric *fab, uint64_t owner, uint32_t parent)
{
	uint32_t i;

	for (i = 0; i < fab->nslots && fab->nwindows; i++) {
		const struct tcp_mr_slot *slot = &fab->slots[i];

		if (slot->in_use && slot->owner && (slot->owner == owner || slot->parent == parent))
			mr_slot_free(fab, i);
	}
}

static int tcp_mr_dereg(struct rps__mr *base)
{
	struct tcp_mr *mr = rps__container_of(base, struct tcp_mr, base);
	struct tcp_fabric *fab = rps__container_of(base->fab, struct tcp_fabric, base);

	if (mr->index == MR_NONE) {	/* the implicit region */
		free(mr);
		return 0;
	}

	/* Taking the lock for writing waits out every remote access in flight
	 * (they hold it for reading): once we return, no byte of the region is
	 * touched on behalf of a peer again, through its key or a window. */
	pthread_rwlock_wrlock(&fab->mr_lock);
	windows_free(fab, 0, mr->index);
	mr_slot_free(fab, mr->index);
	pthread_rwlock_unlock(&fab->mr_lock);
	free(mr);
	return 0;
}

/* A window is a slot of its own: a key the peer cannot tell from a region's,
 * owned by the endpoint (rps__tcp_mr_target checks the owner). */
static int tcp_mw_bind(struct rps__ep *bep, struct rps__mr *base, int access, uint32_t *rkey)
{
	struct tcp_ep *ep = rps__container_of(bep, struct tcp_ep, base);
	struct tcp_mr *mr = rps__container_of(base, struct tcp_mr, base);
	struct tcp_fabric *fab = ep->fab;
	struct tcp_mr_slot *slot;
	uint32_t index = 0;
	int ret;

	pthread_rwlock_wrlock(&fab->mr_lock);
	ret = mr_slot_alloc(fab, &index);
	if (ret) {
		pthread_rwlock_unlock(&fab->mr_lock);
		return ret;
	}
	slot = &fab->slots[index];
	slot->gen = slot->gen % MR_GEN_MAX + 1;
	slot->addr = base->addr;
	slot->len = base->len;
	slot->access = access;
	slot->in_use = true;
	slot->next_free = MR_NONE;
	slot->mr = NULL;
	slot->owner = ep->id;
	slot->parent = mr->index;
	fab->nwindows++;
	*rkey = slot->gen << MR_INDEX_BITS | index;
	pthread_rwlock_unlock(&fab->mr_lock);
	return 0;
}

static int tcp_fabric_windows(const struct rps__fabric *fab)
{
	(void)fab;
	return 1;
}

/* Windows of an endpoint die with it (called as it is freed). */
static void windows_release(struct tcp_ep *ep)
{
	pthread_rwlock_wrlock(&ep->fab->mr_lock);
	windows_free(ep->fab, ep->id, MR_NONE);
	pthread_rwlock_unlock(&ep->fab->mr_lock);
}

static uint32_t tcp_ep_sq_room(struct rps__ep *bep)
{
	struct tcp_ep *ep = rps__container_of(bep, struct tcp_ep, base);
	uint32_t used;

	pthread_mutex_lock(&ep->lock);
	used = ep->sq_next - ep->sq_head;
	pthread_mutex_unlock(&ep->lock);
	return used >= ep->sq_depth ? 0 : ep->sq_depth - used;
}

static int tcp_local_cas(struct rps__fabric *base, struct rps__mr *mr, uint64_t *word,
			 uint64_t compare, uint64_t swap, uint64_t *old)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	uint64_t expected = compare;

	if ((uintptr_t)word & 7)
		return rps__seterr(-EINVAL, "local_cas: word %p is not 8-byte aligned", (void *)word);
	/* Same lock and same __atomic builtins as the engine uses for remote
	 * CAS/FADD, so the two are atomic with respect to each other. */
	pthread_rwlock_rdlock(&fab->mr_lock);
	if (mr->fab != base || !rps__tcp_mr_target(fab, 0, mr->rkey, (uintptr_t)word, 8, RPS__ACCESS_LOCAL)) {
		pthread_rwlock_unlock(&fab->mr_lock);
		return rps__seterr(-EINVAL, "local_cas: word %p is not inside registered region %p+%zu: "
				   "pass the region that holds it", (void *)word, mr->addr, mr->len);
	}
	__atomic_compare_exchange_n(word, &expected, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	pthread_rwlock_unlock(&fab->mr_lock);
	*old = expected;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* completion queues                                                        */

static int tcp_cq_create(struct rps__fabric *base, uint32_t depth, struct rps__cq **out)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	struct tcp_cq *cq;
	int ret;

	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return rps__seterr(-ENOMEM, "cq_create: out of memory");
	cq->base.fab = base;
	cq->cap = pow2_at_least(RPS__MAX(depth, 64u));
	cq->ring = calloc(cq->cap, sizeof(*cq->ring));
	cq->rxbuf = malloc(TCP_RXBUF_SIZE);
	if (!cq->ring || !cq->rxbuf) {
		ret = rps__seterr(-ENOMEM, "cq_create: out of memory for %u completions", cq->cap);
		goto err_free_cq;
	}
	cq->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (cq->epfd < 0) {
		ret = rps__seterr(-errno, "cq_create: epoll_create1: %s: raise the open file limit (ulimit -n)",
				  strerror(errno));
		goto err_free_ring;
	}
	cq->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (cq->evfd < 0) {
		ret = rps__seterr(-errno, "cq_create: eventfd: %s: raise the open file limit (ulimit -n)",
				  strerror(errno));
		goto err_close_ep;
	}
	if (epoll_ctl(cq->epfd, EPOLL_CTL_ADD, cq->evfd, &ev)) {
		ret = rps__seterr(-errno, "cq_create: epoll_ctl: %s", strerror(errno));
		goto err_close_ev;
	}
	ret = pthread_mutex_init(&cq->poll_lock, NULL);
	if (ret) {
		ret = rps__seterr(-ret, "cq_create: pthread_mutex_init: %s", strerror(ret));
		goto err_close_ev;
	}
	ret = pthread_mutex_init(&cq->lock, NULL);
	if (ret) {
		ret = rps__seterr(-ret, "cq_create: pthread_mutex_init: %s", strerror(ret));
		goto err_destroy_poll_lock;
	}
	*out = &cq->base;
	return 0;

err_destroy_poll_lock:
	pthread_mutex_destroy(&cq->poll_lock);
err_close_ev:
	close(cq->evfd);
err_close_ep:
	close(cq->epfd);
err_free_ring:
	free(cq->rxbuf);
	free(cq->ring);
err_free_cq:
	free(cq);
	return ret;
}

static void tcp_cq_destroy(struct rps__cq *base)
{
	struct tcp_cq *cq = rps__container_of(base, struct tcp_cq, base);

	pthread_mutex_destroy(&cq->lock);
	pthread_mutex_destroy(&cq->poll_lock);
	close(cq->evfd);
	close(cq->epfd);
	free(cq->deferred);
	free(cq->rxbuf);
	free(cq->ring);
	free(cq);
}

/* Double the ring, unwrapping it.  cq->lock held. */
static bool cq_grow(struct tcp_cq *cq)
{
	struct rps__wc *ring;
	uint32_t i;

	ring = malloc(2 * (size_t)cq->cap * sizeof(*ring));
	if (!ring)
		return false;
	for (i = 0; i < cq->count; i++)
		ring[i] = cq->ring[(cq->head + i) & (cq->cap - 1)];
	free(cq->ring);
	cq->ring = ring;
	cq->head = 0;
	cq->cap *= 2;
	return true;
}

/* Queue one completion.  A consumer that armed and went to sleep is woken
 * through the eventfd; inside the engine nobody is armed, so the hot path
 * makes no syscall here. */
void rps__tcp_cq_push(struct tcp_cq *cq, struct tcp_ep *ep, uint64_t wr_id, enum rps__wc_status status,
		      enum rps__wc_opcode opcode, uint32_t byte_len, uint32_t imm)
{
	struct rps__wc *wc;
	bool wake = false;
	uint64_t one = 1;

	pthread_mutex_lock(&cq->lock);
	if (cq->count == cq->cap && !cq_grow(cq)) {
		/* out of memory: a lost completion is the least bad outcome */
		pthread_mutex_unlock(&cq->lock);
		return;
	}
	wc = &cq->ring[(cq->head + cq->count) & (cq->cap - 1)];
	wc->wr_id = wr_id;
	wc->status = status;
	wc->opcode = opcode;
	wc->byte_len = byte_len;
	wc->imm = imm;
	wc->ep = &ep->base;
	cq->count++;
	if (cq->armed) {
		cq->armed = false;
		wake = true;
	}
	pthread_mutex_unlock(&cq->lock);
	if (wake && write(cq->evfd, &one, sizeof(one)) < 0) {
		/* the counter cannot overflow at our rate: nothing to do */
	}
}

int rps__tcp_cq_pop(struct tcp_cq *cq, struct rps__wc *wc, int n)
{
	int got = 0;

	pthread_mutex_lock(&cq->lock);
	while (got < n && cq->count) {
		wc[got++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) & (cq->cap - 1);
		cq->count--;
	}
	pthread_mutex_unlock(&cq->lock);
	return got;
}

/* Remove every queued completion of ep, keeping the order of the others. */
static void cq_drop_ep(struct tcp_cq *cq, struct tcp_ep *ep)
{
	uint32_t i, kept = 0, mask;

	pthread_mutex_lock(&cq->lock);
	mask = cq->cap - 1;
	for (i = 0; i < cq->count; i++) {
		struct rps__wc *wc = &cq->ring[(cq->head + i) & mask];

		if (wc->ep != &ep->base)
			cq->ring[(cq->head + kept++) & mask] = *wc;
	}
	cq->count = kept;
	pthread_mutex_unlock(&cq->lock);
}

static int tcp_cq_fd(struct rps__cq *base)
{
	return rps__container_of(base, struct tcp_cq, base)->epfd;
}

static int tcp_cq_flush(struct rps__cq *base)
{
	struct tcp_cq *cq = rps__container_of(base, struct tcp_cq, base);

	pthread_mutex_lock(&cq->poll_lock);
	rps__tcp_flush_deferred(cq);
	pthread_mutex_unlock(&cq->poll_lock);
	return 0;
}

static int tcp_cq_arm(struct rps__cq *base)
{
	struct tcp_cq *cq = rps__container_of(base, struct tcp_cq, base);
	bool wake;
	uint64_t one = 1;

	/* Sockets are level-triggered in the epoll set and need no arming; only
	 * completions already queued (or queued later by another thread) must
	 * make the fd readable.  Nothing may stay held back while the caller
	 * sleeps. */
	pthread_mutex_lock(&cq->poll_lock);
	rps__tcp_flush_deferred(cq);
	pthread_mutex_unlock(&cq->poll_lock);
	pthread_mutex_lock(&cq->lock);
	wake = cq->count > 0;
	cq->armed = !wake;
	pthread_mutex_unlock(&cq->lock);
	if (wake && write(cq->evfd, &one, sizeof(one)) < 0)
		return rps__seterr(-errno, "cq_arm: eventfd write: %s", strerror(errno));
	/* Sockets are level-triggered and later completions write the eventfd:
	 * unless something is queued already, the caller may sleep at once. */
	return wake ? 1 : 0;
}

/* ------------------------------------------------------------------------ */
/* endpoints                                                                */

static void resp_chunks_free(struct tcp_ep *ep)
{
	while (ep->resp_chunks) {
		struct tcp_resp_chunk *next = ep->resp_chunks->next;
		free(ep->resp_chunks);
		ep->resp_chunks = next;
	}
}

/* More response entries (rps__tcp_resp_alloc found none free): false at
 * nresp_max, where the peer has exceeded the sq_depth it announced, or
 * out of memory. */
bool rps__tcp_resp_grow(struct tcp_ep *ep)
{
	uint32_t n = RPS__MIN(TCP_RESP_CHUNK, ep->nresp_max - ep->nresp_made), i;
	struct tcp_resp_chunk *ch;

	if (!n || !(ch = calloc(1, sizeof(*ch) + (size_t)n * sizeof(ch->e[0]))))
		return false;
	ch->next = ep->resp_chunks;
	ep->resp_chunks = ch;
	ep->nresp_made += n;
	for (i = 0; i < n; i++)
		rps__tcp_resp_free(ep, &ch->e[i]);
	return true;
}

void rps__tcp_ep_free(struct tcp_ep *ep)
{
	if (ep->fab && ep->id)
		windows_release(ep);
	rps__tcp_unexpected_free_all(ep);
	pthread_mutex_destroy(&ep->lock);
	free(ep->recvs);
	resp_chunks_free(ep);
	free(ep->inline_buf);
	free(ep->ops);
	free(ep);
}

/* What an endpoint needs is allocated here: the hot path does not
 * allocate, but for early SENDs and for response entries past the most
 * the peer had in flight so far (rps__tcp_resp_grow, TCP_RESP_CHUNK at a
 * time: a worker's few, not the 2 x its sq_depth it may have).  Its reads
 * go through its CQ's buffer. */
int rps__tcp_ep_create(struct tcp_fabric *fab, struct tcp_cq *cq, int fd, const struct ep_sizes *sz,
		       uint32_t peer_sq_depth, const char *peer, struct tcp_ep **out)
{
	uint32_t sq_ring = pow2_at_least(sz->sq_depth);
	uint32_t rq_ring = pow2_at_least(sz->rq_depth);
	uint32_t nresp = 2 * peer_sq_depth + 1;	/* an answer + an ACK per peer op, at most */
	struct tcp_ep *ep = NULL;
	int ret;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return rps__seterr(-ENOMEM, "endpoint to %s: out of memory", peer);
	ep->ops = calloc(sq_ring, sizeof(*ep->ops));
	ep->inline_buf = malloc((size_t)sq_ring * sz->max_inline);
	ep->recvs = calloc(rq_ring, sizeof(*ep->recvs));
	if (!ep->ops || !ep->inline_buf || !ep->recvs) {
		ret = rps__seterr(-ENOMEM, "endpoint to %s: out of memory for queues (sq %u, rq %u, inline %u): "
				  "ask for smaller depths", peer, sz->sq_depth, sz->rq_depth, sz->max_inline);
		goto err_free_queues;
	}
	ret = pthread_mutex_init(&ep->lock, NULL);
	if (ret) {
		ret = rps__seterr(-ret, "endpoint: pthread_mutex_init: %s", strerror(ret));
		goto err_free_queues;
	}
	ep->nresp_max = nresp;

	ep->base.fab = &fab->base;
	ep->base.cq = &cq->base;
	snprintf(ep->base.peer, sizeof(ep->base.peer), "%s", peer);
	{
		struct sockaddr_storage ss;
		socklen_t slen = sizeof(ss);
		if (!getsockname(fd, (struct sockaddr *)&ss, &slen))
			rps__tcp_sockaddr_str((struct sockaddr *)&ss, slen, ep->base.local, sizeof(ep->base.local));
	}
	ep->fab = fab;
	ep->id = atomic_fetch_add_explicit(&fab->next_ep_id, 1, memory_order_relaxed) + 1;
	ep->cq = cq;
	ep->fd = fd;
	ep->conn = CONN_OPEN;
	ep->sq_depth = sz->sq_depth;
	ep->sq_mask = sq_ring - 1;
	ep->sq_head = ep->sq_next = 1;	/* seq 0 means "nothing yet" */
	ep->max_inline = sz->max_inline;
	ep->rq_depth = sz->rq_depth;
	ep->rq_mask = rq_ring - 1;
	ep->peer_sq_depth = peer_sq_depth;
	*out = ep;
	return 0;

err_free_queues:
	free(ep->recvs);
	free(ep->inline_buf);
	free(ep->ops);
	free(ep);
	return ret;
}

/* Put the socket in the CQ's epoll set: from here on cq_poll drives it. */
int rps__tcp_ep_bind(struct tcp_ep *ep)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = ep };

	if (epoll_ctl(ep->cq->epfd, EPOLL_CTL_ADD, ep->fd, &ev))
		return rps__seterr(-errno, "endpoint to %s: epoll_ctl: %s", ep->base.peer, strerror(errno));
	ep->epoll_events = EPOLLIN;
	return 0;
}

static void tcp_ep_close(struct rps__ep *base)
{
	struct tcp_ep *ep = rps__container_of(base, struct tcp_ep, base);
	struct tcp_cq *cq = ep->cq;

	/* poll_lock: no engine pass of this CQ is inside the endpoint, and
	 * none will find it in its epoll set afterwards */
	pthread_mutex_lock(&cq->poll_lock);
	if (ep->deferred) {
		uint32_t i;
		for (i = 0; i < cq->ndeferred; i++)
			if (cq->deferred[i] == ep)
				cq->deferred[i] = cq->deferred[--cq->ndeferred];
		ep->deferred = false;
	}
	pthread_mutex_lock(&ep->lock);
	if (ep->conn != CONN_CLOSED)
		epoll_ctl(cq->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
	ep->conn = CONN_CLOSED;
	close(ep->fd);
	pthread_mutex_unlock(&ep->lock);
	cq_drop_ep(cq, ep);
	pthread_mutex_unlock(&cq->poll_lock);
	rps__tcp_ep_free(ep);
}

const struct rps__transport_ops rps__tcp_ops = {
	.name = "tcp",
	.fabric_open = tcp_fabric_open,
	.fabric_close = tcp_fabric_close,
	.fabric_name = tcp_fabric_name,
	.mr_reg = tcp_mr_reg,
	.mr_dereg = tcp_mr_dereg,
	.mr_reg_implicit = tcp_mr_reg_implicit,
	.mw_bind = tcp_mw_bind,
	.fabric_windows = tcp_fabric_windows,
	.ep_sq_room = tcp_ep_sq_room,
	.ep_rebase = rps__tcp_ep_rebase,
	.local_cas = tcp_local_cas,
	.cq_create = tcp_cq_create,
	.cq_destroy = tcp_cq_destroy,
	.cq_poll = rps__tcp_cq_poll,
	.cq_fd = tcp_cq_fd,
	.cq_arm = tcp_cq_arm,
	.cq_flush = tcp_cq_flush,
	.listen = rps__tcp_listen,
	.listener_fd = rps__tcp_listener_fd,
	.listener_get_request = rps__tcp_listener_get_request,
	.accept = rps__tcp_accept,
	.reject = rps__tcp_reject,
	.listener_close = rps__tcp_listener_close,
	.connect = rps__tcp_connect,
	.dial_start = rps__tcp_dial_start,
	.dial_fd = rps__tcp_dial_fd,
	.dial_step = rps__tcp_dial_step,
	.dial_cancel = rps__tcp_dial_cancel,
	.ep_close = tcp_ep_close,
	.post = rps__tcp_post,
	.post_recv = rps__tcp_post_recv,
};
