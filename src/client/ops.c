/*
 * ops.c - the shard op state machines (client.c has the overview) and the
 * per-connection resources they hold: staging slots, bounce buffers,
 * control credits, the queues of ops waiting for one.
 */
#include "config.h"
#include "common/common.h"
#include "common/crc.h"
#include "common/fault.h"
#include "kernels/agg.h"
#include "client/client_int.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- resources ------------------------------------------------------- */

/* The registered buffer that holds the op's part of the user's memory: a
 * push's gradient, a pull's parameters (a buffer stays registered while
 * an op that uses it is live). */
static void op_find_buffer(struct rps_client *cl, struct shard_op *op)
{
	const struct rps_tensor *t = op->t;
	size_t elems = rps__shard_elems(&t->layout, op->shard);

	op->buf = NULL;
	if (!cl->buffers || cl->copy_always)
		return;
	if (op->kind == OP_PUSH)
		op->buf = rps__buffer_find(cl, op->src, elems * rps__dtype_size((enum rps_dtype)t->spec.dtype));
	else if (op->kind == OP_PULL)
		op->buf = rps__buffer_find(cl, op->dst, elems * 4u);
	if (op->buf)
		op->buf->users++;
}

/* Ops are embedded in their request, which lives until the last op is
 * inactive; `owner` keeps that link even after op->req was cleared. */
static void active_add(struct conn *c, struct shard_op *op)
{
	op_find_buffer(c->cl, op);
	op->owner->live_ops++;
	op->t->live_ops++;
	c->cl->nactive++;
	assert(op->owner->live_ops <= (int)op->owner->nops);	/* an op is in one active list, once */
	op->aprev = NULL;
	op->anext = c->active;
	if (c->active)
		c->active->aprev = op;
	if (!c->active)
		c->busy_ns = rps__now_ns();
	c->active = op;
}

void rps__active_del(struct conn *c, struct shard_op *op)
{
	if (op->aprev)
		op->aprev->anext = op->anext;
	else
		c->active = op->anext;
	if (op->anext)
		op->anext->aprev = op->aprev;
	op->anext = op->aprev = NULL;
	assert(c->cl->nactive > 0 && op->t->live_ops > 0 && op->owner->live_ops > 0);
	c->cl->nactive--;
	if (op->buf) {		/* inactive: the fabric is done with its memory */
		op->buf->users--;
		op->buf = NULL;
	}
	if (--op->t->live_ops == 0) {
		if (op->t->closing)
			rps__tensor_free(op->t);	/* closed while this op outlived its request */
		else
			pthread_cond_broadcast(&c->cl->cond);
	}
	op->owner->live_ops--;
	rps__req_maybe_free(op->owner);
}

static void op_start(struct shard_op *op);
static void op_admit(struct shard_op *op);

/* async/bounded pushes run under the shard lock */
static bool locked_push(const struct shard_op *op)
{
	return op->kind == OP_PUSH && op->t->spec.mode != RPS_MODE_SYNC;
}

/*
 * A request that timed out has its error, and its caller may free the memory
 * it pushed from or pulled into (rps_push: "the buffer may be reused at
 * once").  Its ops lost their request (op->req NULL, run_timers) and stay
 * until the transport is done with them, but none may touch that memory
 * any more: one that has not started yet (queued for a slot, a bounce
 * buffer or its shard, or a chain member sent back to the queue) is let go
 * instead of starting, and a pull lets go at its next completion instead of
 * copying or reading again.  A push already posted goes on from the copy in
 * its slot (the gradient was copied when it started), so its outcome stays
 * what a timeout says: unknown.
 */
static bool abandoned(const struct shard_op *op)
{
	return !op->req && (op->kind == OP_PUSH || op->kind == OP_INIT || op->kind == OP_PULL);
}

static void queue_push(struct shard_op **head, struct shard_op **tail, struct shard_op *op)
{
	op->next = NULL;
	if (*tail)
		(*tail)->next = op;
	else
		*head = op;
	*tail = op;
}

static struct shard_op *queue_pop(struct shard_op **head, struct shard_op **tail)
{
	struct shard_op *op = *head;

	if (op) {
		*head = op->next;
		if (!*head)
			*tail = NULL;
		op->next = NULL;
	}
	return op;
}

static void send_wait(struct shard_op *op);

/* op is one of our locked pushes out on its shard (a chain's head or member). */
static void shard_take(struct shard_op *op)
{
	assert(!op->shard_turn);	/* counted once in shard_busy */
	op->shard_turn = true;
	op->t->shard_busy[op->shard]++;
}

/* The first of our pushes waiting for shard s of t, taken out of the queue. */
static struct shard_op *shard_queue_take(struct conn *c, const struct rps_tensor *t, uint32_t s)
{
	struct shard_op **pp = &c->shhead, *prev = NULL;

	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		struct shard_op *w = *pp;
		if (w->t != t || w->shard != s)
			continue;
		*pp = w->next;
		if (c->shtail == w)
			c->shtail = prev;
		w->next = NULL;
		return w;
	}
	return NULL;
}

static void shard_queue_push_front(struct conn *c, struct shard_op *op)
{
	op->state = ST_QUEUED;
	op->next = c->shhead;
	c->shhead = op;
	if (!c->shtail)
		c->shtail = op;
}

/* One of our locked pushes on this shard is decided (or back in the queue):
 * once none is out, the first waiting goes, leading those behind it. */
static void shard_done(struct shard_op *op)
{
	struct rps_tensor *t = op->t;
	struct shard_op *next;

	if (!op->shard_turn)
		return;
	op->shard_turn = false;
	assert(t->shard_busy[op->shard] > 0);
	if (--t->shard_busy[op->shard])
		return;
	next = shard_queue_take(op->c, t, op->shard);
	if (next) {
		shard_take(next);
		op_admit(next);
	}
}

static void res_give(struct shard_op *op)
{
	struct conn *c = op->c;

	if (op->has_res) {
		/* a slot or bounce buffer goes back once: never more free than
		 * the connection has */
		assert(op->kind == OP_PULL ? op->res < c->nbounce && c->nfree_bounce < c->nbounce :
					     op->res < c->nslots && c->nfree_slots < c->nslots);
		if (op->kind == OP_PULL)
			c->free_bounce[c->nfree_bounce++] = op->res;
		else
			c->free_slots[c->nfree_slots++] = op->res;
		op->has_res = false;
	}
}

/* Start the queued ops that have their slot or bounce buffer now. */
static void start_queued(struct conn *c)
{
	struct shard_op *next;

	while ((next = c->qhead) != NULL) {
		bool pull = next->kind == OP_PULL;
		if ((pull && !c->nfree_bounce) || (!pull && !c->nfree_slots))
			break;
		queue_pop(&c->qhead, &c->qtail);
		op_start(next);
	}
}

/* Give the op's slot or bounce buffer back and start whoever waited. */
static void op_release(struct shard_op *op)
{
	struct conn *c = op->c;

	res_give(op);
	if (locked_push(op))
		shard_done(op);
	rps__active_del(c, op);	/* may free op: do not touch it below */
	start_queued(c);
}

int rps__ctrl_take(struct conn *c)
{
	uint32_t i;

	for (i = 0; i < CTRL_CREDITS; i++)
		if (!c->ctrl[i].busy) {
			c->ctrl[i].busy = true;
			c->nfree_ctrl--;
			return (int)i;
		}
	return -1;
}

static void ctrl_give(struct conn *c, uint32_t i)
{
	struct shard_op *op;

	assert(i < CTRL_CREDITS && c->nfree_ctrl < CTRL_CREDITS);	/* a credit comes back once */
	c->ctrl[i] = (struct ctrl_entry){ 0 };
	c->nfree_ctrl++;
	op = queue_pop(&c->wqhead, &c->wqtail);
	if (op)
		send_wait(op);
}

static int post_one(struct conn *c, struct rps__wr *wr)
{
	int ret = rps__post(c->ep, wr, 1);

	if (ret && !c->dead) {
		c->dead = true;
		c->err = -ECONNRESET;
		rps__log(RPS__LOG_DEBUG, "%s: post failed: %s", c->name, rps__errbuf());
	}
	return ret;
}

int rps__send_ctrl(struct conn *c, uint32_t entry, unsigned type, const void *body, size_t len)
{
	struct rps__wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wrid_idx(entry, TAG_SEND);
	wr.op = RPS__OP_SEND;
	wr.sge.addr = c->sbufs + (size_t)entry * RPS__MSG_MAX;
	wr.sge.len = (uint32_t)rps__msg_build(wr.sge.addr, type, entry, 0, body, len);
	wr.sge.mr = c->sbufs_mr;
	return post_one(c, &wr);
}

/* ---- the shard op state machines --------------------------------------- */

/* The connection to the server that serves shard s (as far as we know). */
static struct conn *route(const struct rps_tensor *t, uint32_t s)
{
	int c = t->part[rps__shard_server(&t->layout, s)].conn;

	return &t->cl->conns[c >= 0 ? c : 0];
}

/* An op of request r on shard s of t, routed to its server. */
struct shard_op *rps__op_init(struct shard_op *op, struct rps_request *r, struct rps_tensor *t,
			      enum op_kind kind, uint32_t s)
{
	op->owner = op->req = r;
	op->t = t;
	op->c = route(t, s);
	op->epoch = t->part[rps__shard_server(&t->layout, s)].epoch;
	op->incarnation = op->c->hello.incarnation;
	op->kind = kind;
	op->shard = s;
	return op;
}

static void build_cas(struct rps__wr *wr, struct shard_op *op, enum wr_tag tag, uint64_t compare, uint64_t swap)
{
	struct conn *c = op->c;
	struct rps_tensor *t = op->t;
	uint32_t local = rps__shard_local_index(&t->layout, op->shard);
	uint32_t p = rps__shard_server(&t->layout, op->shard);

	/* The lock word's states (proto/shard.h): an acquire bets on an
	 * unlocked word and takes it locked at the same version; a release
	 * gives back the word it holds, unlocked at the next version.  The
	 * result lands in the op's slot's atomic. */
	assert(tag == TAG_CAS_ACQ || tag == TAG_CAS_REL);
	assert(tag == TAG_CAS_ACQ ?
	       !rps__lock_is_locked(compare) &&
	       swap == rps__lock_locked(rps__lock_version(compare), rps__lock_owner(swap)) :
	       rps__lock_is_locked(compare) && swap == rps__lock_unlocked(rps__lock_version(compare) + 1));
	assert(op->kind != OP_PULL && op->has_res && op->res < c->nslots);
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = wrid(op, tag);
	wr->op = RPS__OP_CAS;
	wr->flags = RPS__WR_SIGNALED;
	wr->sge.addr = &c->atomics[op->res];
	wr->sge.len = 8;
	wr->sge.mr = c->atomics_mr;
	wr->raddr = t->part[p].addr + local * t->stride + offsetof(struct rps__shard_hdr, lock);
	wr->rkey = t->part[p].rkey;
	wr->compare_add = compare;
	wr->swap = swap;
}

static void post_cas(struct shard_op *op, enum wr_tag tag, uint64_t compare, uint64_t swap)
{
	struct rps__wr wr;

	build_cas(&wr, op, tag, compare, swap);
	post_one(op->c, &wr);
}

/* Post the push's WRITE_IMM, preceded in the same post (one doorbell, one
 * write on TCP) by `before` if given.  The gradient goes once: a push sent
 * again to the same slot (its CAS lost, or its lease was broken) finds it
 * in the server's slot, where the server never writes, and sends only the
 * descriptor, which names the lock word of this try. */
static void post_push_write_after(struct shard_op *op, const struct rps__wr *before, bool hold)
{
	struct conn *c = op->c;
	struct rps__push_desc *d = (struct rps__push_desc *)slot_buf(c, op->res);
	struct rps__wr wrs[2], wr;

	d->lock = op->held;
	d->flags = (d->flags & ~(uint32_t)RPS__DESC_HOLD) | (hold ? RPS__DESC_HOLD : 0);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wrid(op, TAG_WRITE);
	wr.op = RPS__OP_WRITE_IMM;
	wr.sge.addr = d;
	wr.sge.len = RPS__PUSH_DESC_SIZE + (op->in_slot || op->src_mr ? 0 : d->nbytes);
	wr.sge.mr = c->pbufs_mr;
	if (op->src_mr && !op->in_slot) {
		/* zero-copy: the gradient follows the descriptor from the
		 * user's memory, landing right behind it in the slot */
		wr.sgl[1].addr = (void *)(uintptr_t)op->src;
		wr.sgl[1].len = d->nbytes;
		wr.sgl[1].mr = op->src_mr;
		wr.num_sge = 2;
	}
	wr.raddr = c->hello.slot_addr + (uint64_t)op->res * c->hello.slot_size;
	wr.rkey = c->hello.slot_rkey;
	wr.imm = op->res;
	op->in_slot = true;
	op->state = ST_WRITING;
	op->written_ns = rps__now_ns();
	c->slot_op[op->res] = op;
	if (RPS__UNLIKELY(op->die_mid_write)) {
		/* Test hook: write half of the data without the notification, and die. */
		wr.op = RPS__OP_WRITE;
		if (wr.num_sge == 2)
			wr.sgl[1].len = d->nbytes / 2;
		else
			wr.sge.len = RPS__PUSH_DESC_SIZE + d->nbytes / 2;
		wr.flags = RPS__WR_SIGNALED;
		if (before)
			post_one(c, (struct rps__wr *)before);
		post_one(c, &wr);
		usleep(20000);
		raise(SIGKILL);
	}
	if (!before) {
		post_one(c, &wr);
		return;
	}
	wrs[0] = *before;
	wrs[1] = wr;
	if (rps__post(c->ep, wrs, 2) && !c->dead) {
		c->dead = true;
		c->err = -ECONNRESET;
	}
}

static void post_push_write(struct shard_op *op)
{
	post_push_write_after(op, NULL, false);
}

static void post_reads(struct shard_op *op)
{
	struct conn *c = op->c;
	struct rps_tensor *t = op->t;
	uint32_t local = rps__shard_local_index(&t->layout, op->shard);
	uint32_t elems = rps__shard_elems(&t->layout, op->shard);
	uint32_t p = rps__shard_server(&t->layout, op->shard);
	uint64_t base = t->part[p].addr + local * t->stride;
	struct rps__wr wr[2];

	/* header + parameters, then the publish counter again: the target
	 * executes the two READs of one endpoint in order, so equal, even
	 * counters bracket an untorn copy. */
	memset(wr, 0, sizeof(wr));
	wr[0].wr_id = wrid(op, TAG_READ);
	wr[0].op = RPS__OP_READ;
	wr[0].sge.addr = bounce_buf(c, op->res);
	wr[0].sge.len = RPS__SHARD_HDR_SIZE + elems * 4u;
	wr[0].sge.mr = c->bbufs_mr;
	wr[0].raddr = base;
	wr[0].rkey = t->part[p].rkey;
	op->zc_dst = op->buf != NULL;
	if (op->zc_dst) {
		/* zero-copy: the header to the bounce buffer, the parameters
		 * straight into the user's registered memory */
		wr[0].sge.len = RPS__SHARD_HDR_SIZE;
		wr[0].sgl[1] = (struct rps__sge){ .addr = op->dst, .len = elems * 4u, .mr = op->buf->mr };
		wr[0].num_sge = 2;
	}
	wr[1] = wr[0];
	wr[1].num_sge = 0;
	wr[1].flags = RPS__WR_SIGNALED;
	wr[1].sge.addr = bounce_seq(c, op->res);
	wr[1].sge.len = 8;
	wr[1].raddr = base + offsetof(struct rps__shard_hdr, seq);
	op->state = ST_READING;
	if (rps__post(c->ep, wr, 2) && !c->dead) {
		c->dead = true;
		c->err = -ECONNRESET;
	}
}

static void start_lock(struct shard_op *op)
{
	uint32_t owner = op->c->hello.owner;

	op->state = ST_LOCKING;
	op->expected = op->t->lock_guess[op->shard];
	post_cas(op, TAG_CAS_ACQ, op->expected, rps__lock_locked(rps__lock_version(op->expected), owner));
}

static void post_push_write_after(struct shard_op *op, const struct rps__wr *before, bool hold);
static void fill_desc(struct shard_op *op);

/*
 * An async/bounded push in one round trip: the acquire CAS and the
 * WRITE_IMM go out together on one endpoint.  The target executes them in
 * order, so when the push reaches the server the CAS has already run: if
 * it won, the lock word is the one the descriptor names and the push is
 * applied, then the server releases the lock (through its own atomic path)
 * and acknowledges; if it lost, the server refuses the push (RPS_ELEASE),
 * nothing is applied, and we retry knowing the real lock word: the CAS and
 * the descriptor alone, the gradient being in the slot already (contended
 * pushes used to send it again on every try).  hold: pushes of ours to the
 * shard follow under this word (a chain, below).
 */
static void start_locked_push(struct shard_op *op, bool hold)
{
	struct rps__wr cas;

	op->expected = op->t->lock_guess[op->shard];
	op->held = rps__lock_locked(rps__lock_version(op->expected), op->c->hello.owner);
	op->cas_done = op->cas_ok = op->ack_done = false;
	op->chained = false;
	build_cas(&cas, op, TAG_CAS_ACQ, op->expected, op->held);
	post_push_write_after(op, &cas, hold);
}

/*
 * A window of pushes to one shard pipelines as a chain.  The pushes of ours
 * waiting for the shard go out right behind the head, each naming the word
 * the head's CAS takes and sending no CAS of its own; every push but the
 * last says HOLD, so the server applies it and keeps the lock for the next,
 * which arrives behind it on the same endpoint, and the last releases it.
 * The pushes of a chain are applied in the order they were posted.  If the
 * head's CAS lost, the word was never ours and the server refuses every
 * push of the chain (RPS_ELEASE): the members go back to the queue
 * (chain_requeue) and a new chain starts once the head is decided.  A word
 * never comes back (each release moves the version on), so a member can
 * only ever pass under the head it was posted with.
 *
 * Only a head alone on its shard leads a chain (a head retried while its
 * old members are out goes alone), and members take free slots only when
 * no other op waits for one.
 */
static void start_locked_chain(struct shard_op *head)
{
	struct conn *c = head->c;
	struct shard_op *m[MAX_SLOTS], *w;
	uint32_t n = 0, i;

	while (head->t->shard_busy[head->shard] == 1 + n && n < RPS__ARRAY_SIZE(m) &&
	       (w = shard_queue_take(c, head->t, head->shard)) != NULL) {
		if (abandoned(w)) {
			op_release(w);	/* its request timed out: see op_start */
			continue;
		}
		if (!w->has_res && (!c->nfree_slots || c->qhead)) {
			shard_queue_push_front(c, w);
			break;
		}
		shard_take(w);
		if (!w->has_res) {
			assert(c->nfree_slots > 0);
			w->res = c->free_slots[--c->nfree_slots];
			w->has_res = true;
			w->in_slot = false;
			fill_desc(w);
		}
		m[n++] = w;
	}
	start_locked_push(head, n > 0);
	for (i = 0; i < n; i++) {
		w = m[i];
		w->chained = true;
		w->expected = head->expected;
		w->held = head->held;
		w->cas_done = w->cas_ok = true;	/* it has no CAS: the head's stands for it */
		w->ack_done = false;
		post_push_write_after(w, NULL, i + 1 < n);
		__atomic_add_fetch(&c->cl->pushes_chained, 1, __ATOMIC_RELAXED);
	}
}

/* A member of a chain whose word was not ours (the head's CAS lost, or the
 * lease broke meanwhile): back to the front of the queue, its gradient
 * still in its slot. */
static void chain_requeue(struct shard_op *op)
{
	op->chained = false;
	__atomic_add_fetch(&op->c->cl->pushes_requeued, 1, __ATOMIC_RELAXED);
	shard_queue_push_front(op->c, op);
	shard_done(op);		/* the last out starts a new chain */
}

void rps__lock_retry(struct shard_op *op)
{
	if (op->kind == OP_LOCK)
		start_lock(op);
	else
		start_locked_chain(op);
}

static void fill_desc(struct shard_op *op)
{
	struct conn *c = op->c;
	struct rps_tensor *t = op->t;
	struct rps__push_desc *d = (struct rps__push_desc *)slot_buf(c, op->res);
	uint32_t elems = rps__shard_elems(&t->layout, op->shard);
	size_t esize = op->kind == OP_INIT ? 4 : rps__dtype_size((enum rps_dtype)t->spec.dtype);
	bool corrupt;

	memset(d, 0, sizeof(*d));
	d->magic = RPS__DESC_MAGIC;
	d->kind = op->kind == OP_INIT ? RPS__PUSH_INIT : RPS__PUSH_GRAD;
	d->dtype = (uint16_t)(op->kind == OP_INIT ? RPS_DTYPE_F32 : t->spec.dtype);
	d->tensor_id = t->at[c->index].id;
	d->shard = op->shard;
	d->epoch = t->part[rps__shard_server(&t->layout, op->shard)].epoch;
	d->nbytes = (uint32_t)(elems * esize);
	d->rank = c->cl->rank;
	d->clock = op->clock;
	d->push_id = op->push_id;
	corrupt = c->cl->verify && rps__fault_countdown(&c->cl->fault_corrupt_push);
	/* Zero-copy when the fabric can send from the gradient where it is:
	 * it lies in a registered buffer, or the fabric sends from any memory
	 * (tcp).  The test hook that flips a bit never touches user memory:
	 * its push takes the copy. */
	op->src_mr = NULL;
	if (op->kind == OP_PUSH && !corrupt)
		op->src_mr = op->buf ? op->buf->mr : c->cl->copy_always ? NULL : c->cl->implicit_mr;
	if (!op->src_mr)
		memcpy((char *)d + RPS__PUSH_DESC_SIZE, op->src, d->nbytes);
	else
		__atomic_add_fetch(&c->cl->zc_pushes, 1, __ATOMIC_RELAXED);
	if (rps__fault_countdown(&c->cl->fault_kill_mid_push))
		op->die_mid_write = true;	/* counts shard pushes, not retries */
	{	/* test hooks: as if each connection got a remote access error, or a reset */
		bool efault = rps__fault_countdown(&c->cl->fault_efault_all);
		if (efault || rps__fault_countdown(&c->cl->fault_reset_all))
			for (int k = 0; k < c->cl->nservers; k++)
				if (c->cl->conns[k].ep && !c->cl->conns[k].dead) {
					c->cl->conns[k].dead = true;
					c->cl->conns[k].err = efault ? -EFAULT : -ECONNRESET;
					c->cl->conns[k].peer_closed = !efault;
				}
	}
	if (c->cl->verify) {
		d->flags |= RPS__DESC_CRC;
		d->crc = op->src_mr ? rps__crc32c_noinv(op->src, d->nbytes) : rps__push_crc(d);
		if (corrupt)
			((unsigned char *)d)[RPS__PUSH_DESC_SIZE + d->nbytes / 2] ^= 0x10;	/* test hook: a flipped bit */
	}
}

/* The op has its resource: go. */
static void op_start(struct shard_op *op)
{
	struct conn *c = op->c;

	if (abandoned(op)) {
		op_release(op);	/* (gives back a requeued push's slot) */
		return;
	}
	/* (admitted only with a free slot or bounce buffer: op_admit) */
	assert(op->kind == OP_PULL ? c->nfree_bounce > 0 : op->has_res || c->nfree_slots > 0);
	if (op->kind == OP_PULL) {
		op->res = c->free_bounce[--c->nfree_bounce];
		op->has_res = true;
		post_reads(op);
		return;
	}
	if (!op->has_res) {	/* (a push back from a chain keeps its slot) */
		op->res = c->free_slots[--c->nfree_slots];
		op->has_res = true;
		op->in_slot = false;	/* a slot whose server side holds nothing of ours */
		if (op->kind == OP_PUSH || op->kind == OP_INIT)
			fill_desc(op);
	}
	if (op->kind == OP_LOCK) {
		start_lock(op);
		return;
	}
	if (op->kind == OP_UNLOCK) {
		op->state = ST_RELEASING;
		post_cas(op, TAG_CAS_REL, op->held, rps__lock_unlocked(rps__lock_version(op->held) + 1));
		return;
	}
	if (locked_push(op))
		start_locked_chain(op);
	else
		post_push_write(op);
}

/* The shard's partition lost its contents (its owner restarted or was
 * forced out): one line saying which and what to do, never zeros. */
static bool op_lost(struct shard_op *op)
{
	const struct rps__smap *m = &op->t->cl->map;
	uint32_t p = rps__shard_server(&op->t->layout, op->shard);
	struct rps_request *r = op->req;

	if (p >= m->npart || !m->parts[p].lost)
		return false;
	if (r && rps__status_overrides(r->status, -ENODATA)) {
		r->status = -ENODATA;
		snprintf(r->msg, sizeof(r->msg), "partition %u lost with member %llu: restore it (psctl restore NAME)"
			 " or accept it empty (psctl forget-lost %u)", p, (unsigned long long)m->parts[p].lost, p);
	}
	rps__op_report(op, -ENODATA);
	return true;
}

void rps__op_submit(struct shard_op *op)
{
	struct conn *c = op->c;
	uint32_t p = rps__shard_server(&op->t->layout, op->shard);
	int k;

	active_add(c, op);
	if (op_lost(op)) {
		rps__active_del(c, op);
		return;
	}
	if (op->t->part[p].conn < 0) {
		/* no server serves it now: its owner gone, or a move: refresh */
		for (k = 0; p < op->t->cl->map.npart && k < op->t->cl->nservers; k++) {
			struct conn *o = &op->t->cl->conns[k];
			if (o->member_id == op->t->cl->map.parts[p].owner && (o->dead || !o->ep)) {
				op->c = o;	/* the message names the server that is gone */
				rps__op_report(op, o->err ? o->err : -ECONNRESET);
				op->c = c;
				rps__active_del(c, op);
				return;
			}
		}
		rps__log(RPS__LOG_DEBUG, "'%s' shard %u: partition %u has no server we reach in our map (entry %llu)",
			 op->t->name, op->shard, p, (unsigned long long)op->t->cl->map.applied);
		rps__op_report(op, RPS_ESTALE_EPOCH);
		rps__active_del(c, op);
		return;
	}
	if (c->dead) {
		rps__op_report(op, c->err ? c->err : -ECONNRESET);
		rps__active_del(c, op);
		return;
	}
	if (op->t->part[p].gen != c->gen) {
		/* its keys came on a connection to that server we have since
		 * lost and made again (another tensor's op found it gone): they
		 * name memory windows that died with it, and using them would
		 * cost the new connection too (a remote access error closes
		 * it).  Learn the new ones first, as after a move. */
		rps__log(RPS__LOG_DEBUG, "%s: '%s' shard %u: its keys came on a connection since lost", c->name,
			 op->t->name, op->shard);
		rps__op_report(op, RPS_ESTALE_EPOCH);
		rps__active_del(c, op);
		return;
	}
	if (locked_push(op)) {
		if (op->t->shard_busy[op->shard]) {
			op->state = ST_QUEUED;
			queue_push(&c->shhead, &c->shtail, op);
			return;
		}
		shard_take(op);
	}
	op_admit(op);
}

/* The op may run: queue it for a slot or bounce buffer, or start it. */
static void op_admit(struct shard_op *op)
{
	struct conn *c = op->c;
	bool pull = op->kind == OP_PULL;

	if (op->has_res) {
		op_start(op);
		return;
	}
	if (c->qhead || (pull && !c->nfree_bounce) || (!pull && !c->nfree_slots)) {
		op->state = ST_QUEUED;
		queue_push(&c->qhead, &c->qtail, op);
		return;
	}
	op_start(op);
}

static void send_wait(struct shard_op *op)
{
	struct conn *c = op->c;
	struct rps__wait w = {
		.tensor_id = op->t->at[c->index].id,	/* (set: the op was routed here) */
		.shard = op->shard,
		.min_version = op->min_version,
		.min_clock = op->min_clock,
	};
	int e = rps__ctrl_take(c);

	if (e < 0) {
		op->state = ST_WAIT_QUEUED;
		queue_push(&c->wqhead, &c->wqtail, op);
		return;
	}
	c->ctrl[e].op = op;
	op->ctrl = (uint32_t)e;
	op->state = ST_WAITING;
	rps__send_ctrl(c, (uint32_t)e, RPS__MSG_WAIT, &w, sizeof(w));
}

static void finish_locked_push(struct shard_op *op);

static void backoff(struct shard_op *op)
{
	/* Busy: back off (exponentially, capped) instead of hammering the word. */
	op->backoff_us = op->backoff_us ? RPS__MIN(op->backoff_us * 2, 128u) : 2u;
	op->retry_at = rps__now_ns() + op->backoff_us * 1000ull;
	op->state = ST_BACKOFF;
	op->next = op->c->cl->backoff;
	op->c->cl->backoff = op;
}

static void on_cas_acq(struct shard_op *op)
{
	struct conn *c = op->c;
	uint64_t old = c->atomics[op->res];

	if (locked_push(op)) {
		op->cas_done = true;
		op->cas_ok = old == op->expected;
		if (!op->cas_ok)	/* a holder's release will most likely move it on by one */
			op->t->lock_guess[op->shard] =
				rps__lock_unlocked(rps__lock_version(old) + (uint64_t)rps__lock_is_locked(old));
		else if (rps__fault_countdown(&c->cl->fault_stop_after_lock))
			raise(SIGSTOP);	/* test hook: a worker that stalls holding the lock */
		op->expected = old;	/* what the word was, for the retry decision */
		if (op->ack_done)
			finish_locked_push(op);
		return;
	}
	if (old == op->expected) {
		op->held = rps__lock_locked(rps__lock_version(old), c->hello.owner);
		if (op->kind == OP_LOCK) {
			op->t->lock_held[op->shard] = op->held;
			rps__op_report(op, 0);
			op_release(op);
			return;
		}
		return;
	}
	if (rps__lock_is_locked(old) && rps__lock_owner(old) == RPS__LOCK_OWNER_FENCE) {
		/* the shard moved away: refresh the map and go to its new owner */
		rps__log(RPS__LOG_DEBUG, "%s: '%s' shard %u: fenced (moved away)", c->name, op->t->name, op->shard);
		rps__op_report(op, RPS_ESTALE_EPOCH);
		op_release(op);
		return;
	}
	op->t->lock_guess[op->shard] = rps__lock_unlocked(rps__lock_version(old));
	if (!rps__lock_is_locked(old)) {
		start_lock(op);	/* the version moved on: bet on the new one */
		return;
	}
	backoff(op);
}

/* Both halves of a speculative push are back: decide. */
static void finish_locked_push(struct shard_op *op)
{
	int status = op->ack_status;

	if (status == RPS_ELEASE) {
		/* Not applied: our CAS lost (or the lease was broken before the
		 * push got there).  Retry; wait first if someone holds it. */
		if (op->chained) {
			chain_requeue(op);
			return;
		}
		if (op->cas_ok)
			op->t->lock_guess[op->shard] = rps__lock_unlocked(rps__lock_version(op->held) + 1);
		if (!op->cas_ok && rps__lock_is_locked(op->expected))
			backoff(op);
		else
			start_locked_chain(op);
		return;
	}
	/* Decided (applied, or refused for good): the server has released the
	 * lock and told us the word it left. */
	if (op->cas_ok)
		op->t->lock_guess[op->shard] = rps__lock_is_locked(op->ack_lock) || !op->ack_lock ?
			rps__lock_unlocked(rps__lock_version(op->held) + 1) : op->ack_lock;
	rps__op_report(op, status);
	op_release(op);
}

static void on_push_ack(struct conn *c, const struct rps__msg_hdr *h, const struct rps__push_ack *ack)
{
	struct shard_op *op;

	if (h->status < 0 && h->len == sizeof(*h)) {
		/* error without body: we cannot tell which slot; the server only
		 * does this on protocol violations, so treat it as fatal */
		c->dead = true;
		c->err = h->status;
		return;
	}
	if (ack->slot >= c->nslots || !(op = c->slot_op[ack->slot]) || op->state != ST_WRITING) {
		rps__log(RPS__LOG_DEBUG, "%s: acknowledgement for an idle slot %u", c->name, ack->slot);
		c->dead = true;
		c->err = -EPROTO;
		return;
	}
	c->slot_op[ack->slot] = NULL;
	if (h->status == RPS_ESTALE_EPOCH) {
		rps__log(RPS__LOG_DEBUG, "%s: '%s' shard %u: push refused, stale epoch", c->name, op->t->name, op->shard);
		__atomic_add_fetch(&c->cl->pushes_fenced, 1, __ATOMIC_RELAXED);
	}
	if (h->flags & RPS__ACK_TAKEN) {
		/* sync with backups: summed or parked there, the slot is free;
		 * the push completes at STEP_DONE (until then src stays the
		 * user's, for a resend to a new primary) */
		if (op->kind != OP_PUSH || op->t->spec.mode != RPS_MODE_SYNC || h->status) {
			c->dead = true;
			c->err = -EPROTO;
			return;
		}
		res_give(op);
		op->state = ST_TAKEN;
		op->next = c->taken;
		c->taken = op;
		if (op->req && ++op->req->ntaken == op->req->remaining && rps__req_settled(op->req))
			pthread_cond_broadcast(&c->cl->cond);	/* its waiter resends now */
		start_queued(c);
		return;
	}
	if (locked_push(op)) {
		op->ack_done = true;
		op->ack_status = h->status;
		op->ack_lock = ack->lock;
		if (op->cas_done)
			finish_locked_push(op);
		return;
	}
	rps__op_report(op, h->status);
	op_release(op);
}

/* Steps replicated: complete our TAKEN pushes they cover (same tensor at
 * this server, same shard, clock <= step).  An orphaned step (a rank left
 * before its push) completes those of that step alone, as taken: as
 * without backups, the push is done and the pull's WAIT names the rank. */
static void on_step_done(struct conn *c, const struct rps__step_done *sd)
{
	uint32_t k;

	for (k = 0; k < sd->n; k++) {
		const struct rps__step_done_ent *e = &sd->e[k];
		struct shard_op **pp = &c->taken, *op;
		while ((op = *pp) != NULL) {
			if (op->shard != e->shard || op->clock > e->step || !op->t->at[c->index].known ||
			    op->t->at[c->index].id != e->tensor_id ||
			    (e->missing_rank >= 0 && op->clock != e->step)) {
				pp = &op->next;
				continue;
			}
			*pp = op->next;
			op->next = NULL;
			/* version 0: the step will not complete there (the
			 * partition moved, or paused): resent after a refresh */
			if (e->missing_rank >= 0)
				rps__log(RPS__LOG_DEBUG, "%s: '%s' shard %u step %llu: taken, orphaned by rank %d",
					 c->name, op->t->name, op->shard, (unsigned long long)e->step, e->missing_rank);
			rps__op_report(op, e->version || e->missing_rank >= 0 ? 0 : RPS_ESTALE_EPOCH);
			rps__active_del(c, op);	/* may free op */
		}
	}
}

static void on_cas_rel(struct shard_op *op)
{
	uint64_t old = op->c->atomics[op->res];

	if (op->kind == OP_UNLOCK) {
		op->t->lock_held[op->shard] = 0;
		op->t->lock_guess[op->shard] = rps__lock_unlocked(rps__lock_version(op->held) + 1);
		rps__op_report(op, old == op->held ? 0 : RPS_ELEASE);
		op_release(op);
		return;
	}
	/* The guess was set when the release was posted; a later push may
	 * already be betting on it, so leave it alone here. */
	if (old != op->held)
		rps__log(RPS__LOG_DEBUG, "%s shard %u: lock had been broken before release", op->t->name, op->shard);
	op_release(op);
}

static void on_read(struct shard_op *op)
{
	struct conn *c = op->c;
	const struct rps__shard_hdr *hdr = (const void *)bounce_buf(c, op->res);
	uint64_t seq1 = hdr->seq, seq2 = *bounce_seq(c, op->res);
	uint64_t version = seq1 / 2;

	if (abandoned(op)) {	/* its caller has its timeout: see op_start */
		op_release(op);
		return;
	}
	/* the retry loop below: a bounce buffer held, fewer torn tries than
	 * TORN_RETRIES so far */
	assert(op->kind == OP_PULL && op->has_res && op->res < op->c->nbounce);
	assert(op->torn >= 0 && op->torn < TORN_RETRIES);
	/* the epoch first: a copy that moved (or whose server lost its
	 * lease) says so whatever its seq, and a version its server is
	 * still replicating may stay odd there for ever */
	if (hdr->epoch != op->t->part[rps__shard_server(&op->t->layout, op->shard)].epoch) {
		/* a copy the server no longer owns (or not yet): refresh */
		rps__op_report(op, RPS_ESTALE_EPOCH);
		op_release(op);
		return;
	}
	if (seq1 != seq2 || (seq1 & 1)) {
		if (++op->torn < TORN_RETRIES) {
			post_reads(op);
			return;
		}
		op->torn = 0;
		/* Being written for a while (or not yet initialised): let the
		 * server tell us when it is readable. */
		if (op->min_version <= version)
			op->min_version = version + ((seq1 & 1) ? 0 : 1);
		assert(op->min_version >= version);	/* the WAIT asks for no older copy than this one */
		op->seen_min_clock = hdr->min_clock;
		send_wait(op);
		return;
	}
	if (version < op->min_version || hdr->min_clock < op->min_clock) {
		op->seen_min_clock = hdr->min_clock;	/* (for a timeout's message) */
		send_wait(op);
		return;
	}
	/* a header of another size than the shard's is not this shard's:
	 * never report a pull whose output was not written in full */
	if (hdr->elems != rps__shard_elems(&op->t->layout, op->shard)) {
		rps__log(RPS__LOG_WARN, "%s: '%s' shard %u: the server's header says %u elements, the shard has %u",
			 c->name, op->t->name, op->shard, hdr->elems, rps__shard_elems(&op->t->layout, op->shard));
		rps__op_report(op, -EPROTO);
		op_release(op);
		return;
	}
	/* an untorn copy (even, equal counters) as new as asked: what the
	 * pull reports never goes back */
	assert(seq1 == seq2 && !(seq1 & 1) && version >= op->min_version);
	if (!op->zc_dst)	/* (else the READ put them there) */
		memcpy(op->dst, hdr + 1, (size_t)hdr->elems * 4u);
	else
		__atomic_add_fetch(&c->cl->zc_pulls, 1, __ATOMIC_RELAXED);
	op->min_version = version;
	rps__op_report(op, 0);
	op_release(op);
}

static void on_wait_rep(struct shard_op *op, int status, const struct rps__wait_rep *rep)
{
	struct rps_request *r = op->req;

	if (abandoned(op)) {	/* its caller has its timeout: see op_start */
		op_release(op);
		return;
	}
	/* sync: a rank left before its push for the step this pull needs;
	 * say which, and where, instead of a bare error */
	if (status == -EPIPE && rep && r && rps__status_overrides(r->status, status)) {
		r->status = status;
		int n = snprintf(r->msg, sizeof(r->msg), "%s: tensor '%s' shard %u: worker rank %d disconnected before "
				 "its push for step %llu: start a replacement process of that rank, then pull again",
				 op->c->name, op->t->name, op->shard, rep->missing_rank,
				 (unsigned long long)rep->version);
		(void)n;	/* a cut message is still the right error */
	}
	if (status) {
		rps__op_report(op, status);
		op_release(op);
		return;
	}
	post_reads(op);
}

static void on_ctrl_reply(struct conn *c, void *buf, uint32_t len)
{
	struct rps__msg_hdr h;
	struct ctrl_entry *e;
	struct rps_request *r;
	uint32_t idx;

	if (rps__msg_check(buf, len)) {
		rps__log(RPS__LOG_DEBUG, "%s: %s", c->name, rps__errbuf());
		c->dead = true;
		c->err = -EPROTO;
		return;
	}
	memcpy(&h, buf, sizeof(h));
	if (h.type == RPS__MSG_PUSH_ACK) {
		on_push_ack(c, &h, rps__msg_body(buf));
		return;
	}
	if (h.type == RPS__MSG_STEP_DONE) {
		on_step_done(c, rps__msg_body(buf));
		return;
	}
	idx = (uint32_t)h.req_id;
	if (h.req_id >= CTRL_CREDITS || !c->ctrl[idx].busy) {
		rps__log(RPS__LOG_DEBUG, "%s: reply %s to no request", c->name, rps__msg_type_name(h.type));
		return;
	}
	e = &c->ctrl[idx];
	if (e->op) {
		struct shard_op *op = e->op;
		ctrl_give(c, idx);
		on_wait_rep(op, h.status,
			    h.len == sizeof(h) + sizeof(struct rps__wait_rep) ? rps__msg_body(buf) : NULL);
		return;
	}
	r = e->req;
	if (r) {
		if (h.status == 0 && r->reply_len && h.len - sizeof(h) == r->reply_len)
			memcpy((char *)r->replies + (size_t)e->server * r->reply_len, rps__msg_body(buf), r->reply_len);
		r->rstatus[e->server] = h.status;
		rps__req_part_done_at(r, h.status, c);
	}
	ctrl_give(c, idx);
}

/* ---- completions ------------------------------------------------------ */

void rps__on_completion(struct rps_client *cl, const struct rps__wc *wc)
{
	struct conn *c = wc->ep ? rps__ep_context(wc->ep) : NULL;
	enum wr_tag tag = (enum wr_tag)(wc->wr_id & 7u);
	struct shard_op *op = (struct shard_op *)(uintptr_t)(wc->wr_id & ~(uint64_t)7u);

	(void)cl;
	if (!c || c->dead)
		return;
	if (wc->status != RPS__WC_SUCCESS) {
		rps__log(RPS__LOG_DEBUG, "%s: %s", c->name, rps__wc_status_str(wc->status));
		c->dead = true;
		c->err = wc->status == RPS__WC_REM_ACCESS_ERR ? -EFAULT : -ECONNRESET;
		c->peer_closed = wc->status == RPS__WC_FLUSH_ERR;
		return;
	}
	c->wc_ns = rps__now_ns();
	switch (tag) {
	case TAG_RECV: {
		uint32_t i = (uint32_t)(wc->wr_id >> 3);
		c->rx_ns = c->wc_ns;
		struct rps__sge sge = { .addr = c->rbufs + (size_t)i * RPS__MSG_MAX, .len = RPS__MSG_MAX, .mr = c->rbufs_mr };
		if (i >= c->nrecv)
			return;
		on_ctrl_reply(c, sge.addr, wc->byte_len);
		if (!c->dead && rps__post_recv(c->ep, &sge, wc->wr_id)) {
			c->dead = true;
			c->err = -ECONNRESET;
		}
		break;
	}
	case TAG_CAS_ACQ:
		on_cas_acq(op);
		break;
	case TAG_CAS_REL:
		on_cas_rel(op);
		break;
	case TAG_READ:
		if (op)		/* (a map read has no op) */
			on_read(op);
		break;
	case TAG_PROBE:
		c->probing = false;
		/* what waits on a server that lost the majority waits for
		 * nothing: it goes with the server's word for why */
		if (c->hello.map_len == RPS__MAP_BUF && rps__note_take(c->cl, c, c->cl->probebuf) && !c->dead) {
			c->dead = true;
			c->err = -EHOSTDOWN;
		}
		break;
	case TAG_WRITE:
	case TAG_SEND:
		break;
	}
}
