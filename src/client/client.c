/*
 * client.c - librdmaps, the worker side of rdmaps (the API of rdmaps.h).
 *
 * A client holds one connection per server, one completion queue and one
 * progress thread.  Every tensor operation is cut into per-shard operations
 * (struct shard_op) that move through small state machines:
 *
 *   push, sync:        get slot -> WRITE_IMM(desc+data) -> PUSH_ACK
 *   push, async/bnd:   get slot -> CAS acquire lock -> WRITE_IMM -> PUSH_ACK
 *                      (the request completes here) -> CAS release -> slot free
 *   pull:              get bounce buffer -> READ(header+params), READ(seq)
 *                      -> validate seqlock; if the version is not yet the one
 *                      this worker must see -> WAIT message -> READ again
 *
 * Resources (staging slots at the server, bounce buffers, control credits)
 * are bounded per connection; a shard op that finds none waits in the
 * connection's FIFO queue.  A resource goes back to the pool only when the
 * transport has returned it (its completion arrived, or the endpoint was
 * closed), so a request that timed out can never let a late completion
 * scribble over memory that is in use again.
 *
 * One mutex guards the client; user threads post work and sleep on a
 * condition variable, the progress thread polls completions and finishes
 * requests.
 */
#include "config.h"
#include "kernels/agg.h"
#include "common/common.h"
#include "kernels/optim.h"
#include "proto/proto.h"
#include "proto/shard.h"
#include "proto/smap.h"
#include "common/topo.h"
#include "transport/transport.h"
#include "transport/uri.h"
#include "client/client.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "rdmaps.h"

#define RPS_EXPORT __attribute__((visibility("default")))

#define CTRL_CREDITS 32u	/* must not exceed the server's */
#define NBOUNCE 4u		/* pull bounce buffers per server */
#define TORN_RETRIES 8		/* torn reads before asking the server to wait */

enum wr_tag {
	TAG_CAS_ACQ = 1,
	TAG_WRITE = 2,
	TAG_CAS_REL = 3,
	TAG_READ = 4,
	TAG_RECV = 5,
	TAG_SEND = 6,
};

enum op_kind { OP_PUSH, OP_INIT, OP_PULL, OP_LOCK, OP_UNLOCK };

enum op_state {
	ST_QUEUED,	/* waiting for a slot / bounce buffer */
	ST_LOCKING,	/* CAS acquire in flight */
	ST_BACKOFF,	/* lock busy, retry at retry_at */
	ST_WRITING,	/* WRITE_IMM posted, PUSH_ACK awaited */
	ST_RELEASING,	/* CAS release in flight */
	ST_READING,	/* READs in flight */
	ST_WAITING,	/* WAIT message sent, reply awaited */
	ST_WAIT_QUEUED,	/* a WAIT needs a control credit */
};

struct conn;
struct rps_request;

struct shard_op {
	struct rps_request *req;	/* NULL once its part is reported */
	struct rps_request *owner;	/* the request whose memory holds this op */
	struct rps_tensor *t;
	struct conn *c;
	enum op_kind kind;
	enum op_state state;
	uint32_t shard;
	uint32_t res;		/* slot or bounce buffer index */
	bool has_res;
	uint64_t expected;	/* CAS acquire: the unlocked word we bet on */
	uint64_t held;		/* the locked word we hold */
	uint64_t clock;
	uint64_t push_id;
	uint64_t min_version, min_clock;
	const void *src;	/* push: this shard's part of the user buffer */
	float *dst;		/* pull: where the parameters go */
	int torn;
	bool cas_done, cas_ok;	/* speculative push: the acquire CAS came back */
	bool ack_done;		/* ... and the server's PUSH_ACK */
	bool die_mid_write;	/* test hook: kill-mid-push chose this op */
	bool shard_freed;	/* shard_done() ran */
	int result;		/* what op_report() said */
	int ack_status;
	uint64_t ack_lock;	/* the lock word the server left */
	uint32_t backoff_us;
	uint64_t retry_at;
	uint32_t ctrl;		/* control entry of a WAIT */
	struct shard_op *next;	/* queue link */
	struct shard_op *anext, *aprev;	/* the connection's active list */
};

enum req_kind { REQ_SHARDS, REQ_CTRL };

struct rps_request {
	struct rps_client *cl;
	enum req_kind kind;
	int remaining;
	int status;
	bool done;
	bool waited;		/* the caller has its status: free when no op is live */
	int live_ops;		/* ops still in a connection's active list */
	uint64_t deadline;
	uint64_t min_version_seen;
	uint64_t *version_out;
	struct rps_request *dnext, *dprev;	/* deadline list */
	/* control requests: one reply per server */
	void *replies;		/* nservers reply bodies */
	int32_t *rstatus;
	size_t reply_len;
	char msg[512];		/* one line for rps_last_error() of the waiter */
	uint32_t nops;
	struct shard_op ops[];
};

struct ctrl_entry {
	bool busy;
	struct rps_request *req;	/* control request ... */
	struct shard_op *op;		/* ... or a pull's WAIT */
	int server;
};

struct conn {
	struct rps_client *cl;
	int index;
	uint64_t member_id;	/* the server's id in the shard map */
	struct rps__uri uri;
	char name[300];
	struct rps__ep *ep;
	bool dead;
	int err;
	struct rps__hello_rep hello;
	/* staging slots: ours mirror the server's */
	char *pbufs;
	struct rps__mr *pbufs_mr;
	uint32_t nslots;
	uint32_t *free_slots, nfree_slots;
	/* pull bounce buffers + their trailing seq words */
	char *bbufs;
	size_t bsize;
	struct rps__mr *bbufs_mr;
	uint32_t *free_bounce, nfree_bounce;
	/* 8-byte atomic results, one per slot */
	uint64_t *atomics;
	struct rps__mr *atomics_mr;
	/* control messages */
	char *rbufs, *sbufs;
	struct rps__mr *rbufs_mr, *sbufs_mr;
	uint32_t nrecv;
	struct ctrl_entry ctrl[CTRL_CREDITS];
	uint32_t nfree_ctrl;
	struct shard_op *slot_op[1024];	/* slot -> op awaiting its ack */
	struct shard_op *qhead, *qtail;	/* waiting for a slot/bounce buffer */
	struct shard_op *wqhead, *wqtail;	/* waiting for a control credit */
	struct shard_op *shhead, *shtail;	/* locked pushes waiting for their shard */
	struct shard_op *active;
};

struct rps_client {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct rps__fabric *fab;
	struct rps__topo *topo;		/* verbs only: buffers near the HCA; NULL: plain memory */
	struct rps__placement place;
	struct rps__cq *cq;
	struct conn *conns;	/* RPS__SMAP_MAX_MEMBERS of them, nservers in use */
	int nservers;
	struct rps__smap map;	/* the shard map as last read */
	char *mapbuf;		/* registered: READ target for the map */
	struct rps__mr *mapbuf_mr;
	uint64_t client_id;	/* names our pushes to every server */
	int rank, num_workers, timeout_ms;
	uint32_t shard_elems;
	uint64_t next_push_id;
	pthread_t thread;
	bool thread_started;
	bool stopping;
	bool polling;		/* a thread is in progress_once() */
	bool progress_polling;	/* ... and it is the progress thread */
	int nactive;		/* ops in the connections' active lists */
	pthread_cond_t pcond;	/* the progress thread sleeps here when idle */
	uint64_t spin_ns;	/* busy-poll this long before sleeping */
	uint64_t idle_since;
	int waiters;		/* callers blocked in a wait */
	int wake_fd;
	struct rps_request *deadlines;
	struct shard_op *backoff;	/* ops in ST_BACKOFF (linked by next) */
	bool verify;		/* crc32c on every push */
	int fault_kill_mid_push;	/* test hooks (RPS_FAULT, see rdmaps(3)) */
	int fault_stop_after_lock;
	int fault_corrupt_push;
};

struct rps_tensor {
	struct rps_client *cl;
	char name[RPS__NAME_MAX];
	struct rps__tensor_spec spec;
	struct rps__layout layout;
	struct {
		uint32_t id;	/* the tensor's id at that server */
		bool known;
	} *at;			/* per connection (RPS__SMAP_MAX_MEMBERS) */
	struct {
		int conn;	/* who serves the partition (-1: nobody we know) */
		uint64_t addr;	/* its region of this tensor's shards */
		uint32_t rkey;
		uint64_t epoch;
	} *part;		/* per partition */
	uint64_t stride;
	uint64_t *lock_guess;	/* per shard: last unlocked lock word seen */
	uint64_t *lock_held;	/* per shard: word held via rps__tensor_lock() */
	uint8_t *shard_busy;	/* per shard: one of our locked pushes is running */
	uint64_t clock;		/* pushes issued by this worker */
	int live_ops;		/* ops still running (one may outlive a timed-out request) */
	bool closing;		/* closed by the user: the last op frees it */
};

/* ---- small helpers --------------------------------------------------- */

static uint64_t wrid(void *p, enum wr_tag tag)
{
	return (uint64_t)(uintptr_t)p | (uint64_t)tag;
}

static uint64_t wrid_idx(uint32_t idx, enum wr_tag tag)
{
	return ((uint64_t)idx << 3) | (uint64_t)tag;
}

static char *slot_buf(struct conn *c, uint32_t s)
{
	return c->pbufs + (size_t)s * c->hello.slot_size;
}

static char *bounce_buf(struct conn *c, uint32_t b)
{
	return c->bbufs + (size_t)b * c->bsize;
}

static uint64_t *bounce_seq(struct conn *c, uint32_t b)
{
	return (uint64_t *)(bounce_buf(c, b) + c->bsize - 64);
}

static void wake_progress(struct rps_client *cl)
{
	uint64_t one = 1;
	ssize_t r = write(cl->wake_fd, &one, sizeof(one));

	(void)r;
}

/* ---- request completion --------------------------------------------- */

static void req_free(struct rps_request *r)
{
	free(r->replies);
	free(r->rstatus);
	free(r);
}

static void deadline_unlink(struct rps_client *cl, struct rps_request *r)
{
	if (r->dprev)
		r->dprev->dnext = r->dnext;
	else if (cl->deadlines == r)
		cl->deadlines = r->dnext;
	if (r->dnext)
		r->dnext->dprev = r->dprev;
	r->dnext = r->dprev = NULL;
}

static void req_maybe_free(struct rps_request *r)
{
	if (r->done && r->waited && r->live_ops == 0)
		req_free(r);
}

static void req_finish(struct rps_request *r)
{
	struct rps_client *cl = r->cl;

	r->done = true;
	deadline_unlink(cl, r);
	if (r->version_out && r->status == 0 && r->kind == REQ_SHARDS && r->min_version_seen != UINT64_MAX)
		*r->version_out = r->min_version_seen;
	pthread_cond_broadcast(&cl->cond);
}

static const char *status_text(int status)
{
	switch (status) {
	case -EMSGSIZE: return "gradient size or dtype does not match the tensor";
	case -EILSEQ: return "the push arrived corrupted (checksum mismatch) and was not applied";
	case -EBADMSG: return "the server found the push malformed and did not apply it";
	case -ENOENT: return "the server does not know this tensor (was it created?)";
	case -EINVAL: return "the server refused the request as invalid (rank, shard or tensor id)";
	case -EALREADY: return "this step already has this worker's push (duplicate)";
	case -EEXIST: return "the tensor exists with different options (count, dtype, mode, optimizer, workers or init)";
	case -EFAULT: return "remote access error: the server revoked or never granted this memory";
	case -EPROTO: return "protocol error: librdmaps and rdmapsd versions differ?";
	case -ENOMEM: return "the server is out of memory: raise rdmapsd --memory-limit or add servers";
	case -EFBIG: return "the tensor has too many shards: lower its count or raise rdmapsd --shard-size";
	case -ECONNRESET: return "connection lost: is rdmapsd running and reachable?";
	case -ENODATA: return "the shard's partition was lost with its server: restore it (psctl restore DIR) or accept it empty (psctl forget-lost PART)";
	case RPS_ELEASE: return "the shard lock lease expired";
	case RPS_ESTALE_EPOCH: return "the shard moved and no server serves it yet (a move in progress or aborted?)";
	case -EAGAIN: return "the server is not ready (it has not learnt the shard map yet)";
	case -ECONNREFUSED: return "this server refused the connection when the client connected (is rdmapsd running there?)";
	case -EHOSTUNREACH: return "this server could not be reached (or its address is bad) when the client connected";
	case -ERANGE: return "the push's clock is beyond the steps the tensor can reach (a foreign or corrupted client?)";
	case -EPIPE: return "a worker of this sync tensor disconnected before its push: the step can never complete";
	default: return "failed";
	}
}

static void req_part_done_at(struct rps_request *r, int status, const struct conn *c)
{
	if (status && !r->status) {
		r->status = status;
		snprintf(r->msg, sizeof(r->msg), "%s: %s", c ? c->name : "rdmaps", status_text(status));
	}
	if (--r->remaining == 0)
		req_finish(r);
}



/* The op's part of the request is over (the op may live on to release
 * resources). */
static void op_report(struct shard_op *op, int status)
{
	struct rps_request *r = op->req;

	if (!r)
		return;
	op->req = NULL;
	op->result = status;
	if (status == 0 && op->kind == OP_PULL && op->min_version < r->min_version_seen)
		r->min_version_seen = op->min_version;
	req_part_done_at(r, status, op->c);
}

/* ---- resources ------------------------------------------------------- */

static void tensor_free(struct rps_tensor *t);

/* Ops are embedded in their request, which lives until the last op is
 * inactive; `owner` keeps that link even after op->req was cleared. */
static void active_add(struct conn *c, struct shard_op *op)
{
	op->owner->live_ops++;
	op->t->live_ops++;
	c->cl->nactive++;
	op->aprev = NULL;
	op->anext = c->active;
	if (c->active)
		c->active->aprev = op;
	c->active = op;
}

static void active_del(struct conn *c, struct shard_op *op)
{
	if (op->aprev)
		op->aprev->anext = op->anext;
	else
		c->active = op->anext;
	if (op->anext)
		op->anext->aprev = op->aprev;
	op->anext = op->aprev = NULL;
	c->cl->nactive--;
	if (--op->t->live_ops == 0) {
		if (op->t->closing)
			tensor_free(op->t);	/* closed while this op outlived its request */
		else
			pthread_cond_broadcast(&c->cl->cond);
	}
	op->owner->live_ops--;
	req_maybe_free(op->owner);
}

static void op_start(struct shard_op *op);
static void op_admit(struct shard_op *op);

/* async/bounded pushes run under the shard lock */
static bool locked_push(const struct shard_op *op)
{
	return op->kind == OP_PUSH && op->t->spec.mode != RPS_MODE_SYNC;
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

/* Our locked push on this shard is decided: admit the next of ours. */
static void shard_done(struct shard_op *op)
{
	struct conn *c = op->c;
	struct rps_tensor *t = op->t;
	uint32_t shard = op->shard;
	struct shard_op **pp = &c->shhead, *prev = NULL;

	if (op->shard_freed)
		return;
	op->shard_freed = true;
	t->shard_busy[shard] = 0;
	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		struct shard_op *w = *pp;
		if (w->t != t || w->shard != shard)
			continue;
		*pp = w->next;
		if (c->shtail == w)
			c->shtail = prev;
		w->next = NULL;
		t->shard_busy[shard] = 1;
		op_admit(w);
		break;
	}
}

/* Give the op's slot or bounce buffer back and start whoever waited. */
static void op_release(struct shard_op *op)
{
	struct conn *c = op->c;
	struct shard_op *next;

	if (op->has_res) {
		if (op->kind == OP_PULL)
			c->free_bounce[c->nfree_bounce++] = op->res;
		else
			c->free_slots[c->nfree_slots++] = op->res;
		op->has_res = false;
	}
	if (locked_push(op))
		shard_done(op);
	active_del(c, op);	/* may free op: do not touch it below */
	while ((next = c->qhead) != NULL) {
		bool pull = next->kind == OP_PULL;
		if ((pull && !c->nfree_bounce) || (!pull && !c->nfree_slots))
			break;
		queue_pop(&c->qhead, &c->qtail);
		op_start(next);
	}
}

static int ctrl_take(struct conn *c)
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

static int send_ctrl(struct conn *c, uint32_t entry, unsigned type, const void *body, size_t len)
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
static struct shard_op *op_init(struct shard_op *op, struct rps_request *r, struct rps_tensor *t,
				enum op_kind kind, uint32_t s)
{
	op->owner = op->req = r;
	op->t = t;
	op->c = route(t, s);
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
 * write on TCP) by `before` if given. */
static void post_push_write_after(struct shard_op *op, const struct rps__wr *before)
{
	struct conn *c = op->c;
	struct rps__push_desc *d = (struct rps__push_desc *)slot_buf(c, op->res);
	struct rps__wr wrs[2], wr;

	d->lock = op->held;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wrid(op, TAG_WRITE);
	wr.op = RPS__OP_WRITE_IMM;
	wr.sge.addr = d;
	wr.sge.len = RPS__PUSH_DESC_SIZE + d->nbytes;
	wr.sge.mr = c->pbufs_mr;
	wr.raddr = c->hello.slot_addr + (uint64_t)op->res * c->hello.slot_size;
	wr.rkey = c->hello.slot_rkey;
	wr.imm = op->res;
	op->state = ST_WRITING;
	c->slot_op[op->res] = op;
	if (RPS__UNLIKELY(op->die_mid_write)) {
		/* Test hook: write half of the data without the notification, and die. */
		wr.op = RPS__OP_WRITE;
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
	post_push_write_after(op, NULL);
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
	wr[1] = wr[0];
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


static void post_push_write_after(struct shard_op *op, const struct rps__wr *before);

/*
 * An async/bounded push in one round trip: the acquire CAS and the
 * WRITE_IMM go out together on one endpoint.  The target executes them in
 * order, so when the push reaches the server the CAS has already run: if
 * it won, the lock word is the one the descriptor names and the push is
 * applied, then the server releases the lock (through its own atomic path)
 * and acknowledges; if it lost, the server refuses the push (RPS_ELEASE),
 * nothing is applied, and we retry knowing the real lock word.  Our own
 * pushes to one shard are serialised (shard_busy), so no second push of
 * ours can carry the same word.
 */
static void start_locked_push(struct shard_op *op)
{
	struct rps__wr cas;

	op->expected = op->t->lock_guess[op->shard];
	op->held = rps__lock_locked(rps__lock_version(op->expected), op->c->hello.owner);
	op->cas_done = op->cas_ok = op->ack_done = false;
	build_cas(&cas, op, TAG_CAS_ACQ, op->expected, op->held);
	post_push_write_after(op, &cas);
}

static void lock_retry(struct shard_op *op)
{
	if (op->kind == OP_LOCK)
		start_lock(op);
	else
		start_locked_push(op);
}

static void fill_desc(struct shard_op *op)
{
	struct conn *c = op->c;
	struct rps_tensor *t = op->t;
	struct rps__push_desc *d = (struct rps__push_desc *)slot_buf(c, op->res);
	uint32_t elems = rps__shard_elems(&t->layout, op->shard);
	size_t esize = op->kind == OP_INIT ? 4 : rps__dtype_size((enum rps_dtype)t->spec.dtype);

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
	memcpy((char *)d + RPS__PUSH_DESC_SIZE, op->src, d->nbytes);
	if (RPS__UNLIKELY(c->cl->fault_kill_mid_push) && --c->cl->fault_kill_mid_push == 0)
		op->die_mid_write = true;	/* counts shard pushes, not retries */
	if (c->cl->verify) {
		d->flags |= RPS__DESC_CRC;
		d->crc = rps__push_crc(d);
		if (RPS__UNLIKELY(c->cl->fault_corrupt_push) && --c->cl->fault_corrupt_push == 0)
			((unsigned char *)d)[RPS__PUSH_DESC_SIZE + d->nbytes / 2] ^= 0x10;	/* test hook: a flipped bit */
	}
}

/* The op has its resource: go. */
static void op_start(struct shard_op *op)
{
	struct conn *c = op->c;

	if (op->kind == OP_PULL) {
		op->res = c->free_bounce[--c->nfree_bounce];
		op->has_res = true;
		post_reads(op);
		return;
	}
	op->res = c->free_slots[--c->nfree_slots];
	op->has_res = true;
	if (op->kind == OP_LOCK) {
		start_lock(op);
		return;
	}
	if (op->kind == OP_UNLOCK) {
		op->state = ST_RELEASING;
		post_cas(op, TAG_CAS_REL, op->held, rps__lock_unlocked(rps__lock_version(op->held) + 1));
		return;
	}
	fill_desc(op);
	if (locked_push(op))
		start_locked_push(op);
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
	if (r && !r->status) {
		r->status = -ENODATA;
		snprintf(r->msg, sizeof(r->msg), "partition %u lost with member %llu: restore it (psctl restore DIR)"
			 " or accept it empty (psctl forget-lost %u)", p, (unsigned long long)m->parts[p].lost, p);
	}
	op_report(op, -ENODATA);
	return true;
}

static void op_submit(struct shard_op *op)
{
	struct conn *c = op->c;
	uint32_t p = rps__shard_server(&op->t->layout, op->shard);
	int k;

	active_add(c, op);
	if (op_lost(op)) {
		active_del(c, op);
		return;
	}
	if (op->t->part[p].conn < 0) {
		/* no server serves it now: its owner gone, or a move: refresh */
		for (k = 0; p < op->t->cl->map.npart && k < op->t->cl->nservers; k++) {
			struct conn *o = &op->t->cl->conns[k];
			if (o->member_id == op->t->cl->map.parts[p].owner && (o->dead || !o->ep)) {
				op->c = o;	/* the message names the server that is gone */
				op_report(op, o->err ? o->err : -ECONNRESET);
				op->c = c;
				active_del(c, op);
				return;
			}
		}
		op_report(op, RPS_ESTALE_EPOCH);
		active_del(c, op);
		return;
	}
	if (c->dead) {
		op_report(op, c->err ? c->err : -ECONNRESET);
		active_del(c, op);
		return;
	}
	if (locked_push(op)) {
		if (op->t->shard_busy[op->shard]) {
			op->state = ST_QUEUED;
			queue_push(&c->shhead, &c->shtail, op);
			return;
		}
		op->t->shard_busy[op->shard] = 1;
	}
	op_admit(op);
}

/* The op may run: queue it for a slot or bounce buffer, or start it. */
static void op_admit(struct shard_op *op)
{
	struct conn *c = op->c;
	bool pull = op->kind == OP_PULL;

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
	int e = ctrl_take(c);

	if (e < 0) {
		op->state = ST_WAIT_QUEUED;
		queue_push(&c->wqhead, &c->wqtail, op);
		return;
	}
	c->ctrl[e].op = op;
	op->ctrl = (uint32_t)e;
	op->state = ST_WAITING;
	send_ctrl(c, (uint32_t)e, RPS__MSG_WAIT, &w, sizeof(w));
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
		else if (RPS__UNLIKELY(c->cl->fault_stop_after_lock) && --c->cl->fault_stop_after_lock == 0)
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
			op_report(op, 0);
			op_release(op);
			return;
		}
		return;
	}
	if (rps__lock_is_locked(old) && rps__lock_owner(old) == RPS__LOCK_OWNER_FENCE) {
		/* the shard moved away: refresh the map and go to its new owner */
		op_report(op, RPS_ESTALE_EPOCH);
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
		if (op->cas_ok)
			op->t->lock_guess[op->shard] = rps__lock_unlocked(rps__lock_version(op->held) + 1);
		if (!op->cas_ok && rps__lock_is_locked(op->expected))
			backoff(op);
		else
			start_locked_push(op);
		return;
	}
	/* Decided (applied, or refused for good): the server has released the
	 * lock and told us the word it left. */
	if (op->cas_ok)
		op->t->lock_guess[op->shard] = rps__lock_is_locked(op->ack_lock) || !op->ack_lock ?
			rps__lock_unlocked(rps__lock_version(op->held) + 1) : op->ack_lock;
	op_report(op, status);
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
	if (locked_push(op)) {
		op->ack_done = true;
		op->ack_status = h->status;
		op->ack_lock = ack->lock;
		if (op->cas_done)
			finish_locked_push(op);
		return;
	}
	op_report(op, h->status);
	op_release(op);
}

static void on_cas_rel(struct shard_op *op)
{
	uint64_t old = op->c->atomics[op->res];

	if (op->kind == OP_UNLOCK) {
		op->t->lock_held[op->shard] = 0;
		op->t->lock_guess[op->shard] = rps__lock_unlocked(rps__lock_version(op->held) + 1);
		op_report(op, old == op->held ? 0 : RPS_ELEASE);
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
		send_wait(op);
		return;
	}
	if (hdr->epoch != op->t->part[rps__shard_server(&op->t->layout, op->shard)].epoch) {
		/* a copy the server no longer owns (or not yet): refresh */
		op_report(op, RPS_ESTALE_EPOCH);
		op_release(op);
		return;
	}
	if (version < op->min_version || hdr->min_clock < op->min_clock) {
		send_wait(op);
		return;
	}
	memcpy(op->dst, hdr + 1, (size_t)hdr->elems * 4u);
	op->min_version = version;
	op_report(op, 0);
	op_release(op);
}

static void on_wait_rep(struct shard_op *op, int status, const struct rps__wait_rep *rep)
{
	struct rps_request *r = op->req;

	/* sync: a rank left before its push for the step this pull needs;
	 * say which, and where, instead of a bare error */
	if (status == -EPIPE && rep && r && !r->status) {
		r->status = status;
		snprintf(r->msg, sizeof(r->msg), "%s: tensor '%s' shard %u: worker rank %d disconnected before its push "
			 "for step %llu, which can never complete: restart the job (from a checkpoint)", op->c->name,
			 op->t->name, op->shard, rep->missing_rank, (unsigned long long)rep->version);
	}
	if (status) {
		op_report(op, status);
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
		req_part_done_at(r, h.status, c);
	}
	ctrl_give(c, idx);
}

/* ---- progress ---------------------------------------------------------- */

static void on_completion(struct rps_client *cl, const struct rps__wc *wc)
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
		return;
	}
	switch (tag) {
	case TAG_RECV: {
		uint32_t i = (uint32_t)(wc->wr_id >> 3);
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
	case TAG_WRITE:
	case TAG_SEND:
		break;
	}
}

static const char *conn_error_text(int err)
{
	switch (err) {
	case -EFAULT: return "remote access error (stale registration)";
	case -EPROTO: return "protocol error";
	default: return "connection lost: is rdmapsd running and reachable?";
	}
}

/* A connection died: fail everything on it.  Closing the endpoint first
 * drops its queued completions, so no completion can reach a freed op. */
static void conn_kill(struct rps_client *cl, struct conn *c)
{
	struct shard_op *op;
	uint32_t i;

	if (!c->ep)
		return;
	rps__ep_close(c->ep);
	c->ep = NULL;
	if (!c->err)
		c->err = -ECONNRESET;
	rps__log(RPS__LOG_DEBUG, "%s: %s", c->name, conn_error_text(c->err));
	{	/* ops in backoff that belong to this connection */
		struct shard_op **pp = &cl->backoff;
		while (*pp) {
			if ((*pp)->c == c)
				*pp = (*pp)->next;
			else
				pp = &(*pp)->next;
		}
	}
	while ((op = c->active) != NULL) {
		op_report(op, c->err);
		active_del(c, op);
	}
	c->qhead = c->qtail = c->wqhead = c->wqtail = c->shhead = c->shtail = NULL;
	for (i = 0; i < CTRL_CREDITS; i++) {
		if (c->ctrl[i].busy && c->ctrl[i].req) {
			c->ctrl[i].req->rstatus[c->ctrl[i].server] = c->err;
			req_part_done_at(c->ctrl[i].req, c->err, c);
		}
		c->ctrl[i].busy = false;
	}
}

static void run_timers(struct rps_client *cl, uint64_t now)
{
	struct shard_op **pp = &cl->backoff, *op;
	struct rps_request *r, *next;

	while ((op = *pp) != NULL) {
		if (op->retry_at <= now) {
			*pp = op->next;
			op->next = NULL;
			if (!op->c->dead)
				lock_retry(op);
			continue;
		}
		pp = &op->next;
	}
	for (r = cl->deadlines; r; r = next) {
		next = r->dnext;
		if (r->deadline && r->deadline <= now && !r->done) {
			/* The request gives up; its ops keep their resources until
			 * the transport hands them back. */
			uint32_t i;
			int k;
			for (i = 0; i < r->nops; i++)
				r->ops[i].req = NULL;
			for (k = 0; k < cl->nservers; k++)
				for (i = 0; i < CTRL_CREDITS; i++)
					if (cl->conns[k].ctrl[i].req == r)
						cl->conns[k].ctrl[i].req = NULL;
			r->status = -ETIMEDOUT;
			r->remaining = 0;
			snprintf(r->msg, sizeof(r->msg),
				 "request timed out after %d ms: a server or a worker is stalled (raise timeout_ms for slow steps)",
				 cl->timeout_ms);
			req_finish(r);
		}
	}
}

/* How long progress may sleep: until the next lock retry, at most 50 ms
 * (request deadlines are checked that often). */
static struct timespec next_timeout(struct rps_client *cl, uint64_t now)
{
	uint64_t soonest = now + 50ull * 1000000ull, ns;
	struct shard_op *op;
	struct timespec ts;

	for (op = cl->backoff; op; op = op->next)
		soonest = RPS__MIN(soonest, op->retry_at);
	ns = soonest > now ? soonest - now : 0;
	ts.tv_sec = (time_t)(ns / 1000000000ull);
	ts.tv_nsec = (long)(ns % 1000000000ull);
	return ts;
}

/*
 * One round of progress, with the lock held: reap completions, retire dead
 * connections, run timers; if there was nothing to do, sleep on the CQ's
 * file descriptor (lock dropped) for at most the next timer.  Exactly one
 * thread polls at a time (cl->polling): the progress thread when nobody
 * waits, otherwise a waiting caller itself, which saves the hand-off from the
 * progress thread to the waiter on the latency path.
 */
static void progress_once(struct rps_client *cl)
{
	struct rps__wc wc[32];
	struct pollfd pfd[2];
	struct timespec ts;
	uint64_t now;
	int i, n;

	n = rps__cq_poll(cl->cq, wc, (int)RPS__ARRAY_SIZE(wc));
	for (i = 0; i < n; i++)
		on_completion(cl, &wc[i]);
	for (i = 0; i < cl->nservers; i++)
		if (cl->conns[i].dead && cl->conns[i].ep)
			conn_kill(cl, &cl->conns[i]);
	now = rps__now_ns();
	run_timers(cl, now);
	if (n > 0) {
		cl->idle_since = now;
		return;
	}
	if (now - cl->idle_since < cl->spin_ns)
		return;	/* busy-poll a while before sleeping: saves a wake-up */
	if (rps__cq_arm(cl->cq) != 0) {
		n = rps__cq_poll(cl->cq, wc, (int)RPS__ARRAY_SIZE(wc));
		for (i = 0; i < n; i++)
			on_completion(cl, &wc[i]);
		if (n > 0)
			return;
	}
	pfd[0] = (struct pollfd){ .fd = rps__cq_fd(cl->cq), .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = cl->wake_fd, .events = POLLIN };
	ts = next_timeout(cl, now);
	pthread_mutex_unlock(&cl->lock);
	ppoll(pfd, 2, &ts, NULL);
	if (pfd[1].revents) {
		uint64_t v;
		ssize_t r = read(cl->wake_fd, &v, sizeof(v));
		(void)r;
	}
	pthread_mutex_lock(&cl->lock);
}

/* The progress thread works only for requests nobody waits on (the
 * non-blocking API, ops that outlived a timed-out request); a blocked
 * caller polls for itself, so a blocking push costs the same wake-ups as a
 * socket ping-pong. */
static void *progress_main(void *arg)
{
	struct rps_client *cl = arg;

	/* near the HCA when it is known (the library never logs: a refusal
	 * leaves the thread where it was) */
	(void)rps__topo_pin_thread(cl->topo, &cl->place);
	pthread_mutex_lock(&cl->lock);
	while (!cl->stopping) {
		if (cl->waiters || cl->polling || !cl->nactive) {
			pthread_cond_wait(&cl->pcond, &cl->lock);
			continue;
		}
		cl->polling = cl->progress_polling = true;
		progress_once(cl);
		cl->polling = cl->progress_polling = false;
		if (cl->waiters)
			pthread_cond_broadcast(&cl->cond);
	}
	pthread_mutex_unlock(&cl->lock);
	return NULL;
}

/* Wait for r with the lock held, polling ourselves when nobody else does. */
static void wait_done_locked(struct rps_client *cl, const struct rps_request *r)
{
	if (r->done)
		return;
	cl->waiters++;
	if (cl->progress_polling)
		wake_progress(cl);	/* get the progress thread out of its sleep */
	while (!r->done) {
		if (cl->polling) {
			pthread_cond_wait(&cl->cond, &cl->lock);
			continue;
		}
		cl->polling = true;
		progress_once(cl);
		cl->polling = false;
		if (cl->waiters > 1)
			pthread_cond_broadcast(&cl->cond);	/* hand the poll to another waiter */
	}
	cl->waiters--;
	if (cl->waiters)
		pthread_cond_broadcast(&cl->cond);
	else if (cl->nactive)
		pthread_cond_signal(&cl->pcond);	/* work left that nobody waits on */
}

/* ---- requests ------------------------------------------------------------ */

static struct rps_request *req_new(struct rps_client *cl, uint32_t nops)
{
	struct rps_request *r = calloc(1, sizeof(*r) + nops * sizeof(struct shard_op));

	if (!r)
		return NULL;
	r->cl = cl;
	r->nops = nops;
	r->remaining = (int)nops;
	r->min_version_seen = UINT64_MAX;
	return r;
}

static void req_arm_deadline(struct rps_client *cl, struct rps_request *r)
{
	r->deadline = rps__now_ns() + (uint64_t)cl->timeout_ms * 1000000ull;
	r->dnext = cl->deadlines;
	if (cl->deadlines)
		cl->deadlines->dprev = r;
	cl->deadlines = r;
}

/* Wait for r with the lock held and return its status.  The caller then
 * calls req_collect() (after copying anything it needs out of r). */
static int req_wait_locked(struct rps_client *cl, struct rps_request *r)
{
	wait_done_locked(cl, r);
	return r->status;
}

static void req_collect(struct rps_request *r)
{
	if (r->status)
		rps__seterr(r->status, "%s", r->msg);
	r->waited = true;
	req_maybe_free(r);
}

/* Send a control message to a set of servers and collect the replies. */
static int ctrl_call(struct rps_client *cl, unsigned type, const void *body, size_t len,
		     const bool *to, size_t reply_len, void *replies, int32_t *rstatus)
{
	struct rps_request *r = req_new(cl, 0);
	int i, n = 0, status;

	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_CTRL;
	r->reply_len = reply_len;
	r->replies = calloc((size_t)cl->nservers, reply_len ? reply_len : 1);
	r->rstatus = calloc((size_t)cl->nservers, sizeof(int32_t));
	if (!r->replies || !r->rstatus) {
		req_free(r);
		return rps__seterr(-ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&cl->lock);
	for (i = 0; i < cl->nservers; i++) {
		struct conn *c = &cl->conns[i];
		int e;
		if (!to[i])
			continue;
		n++;
		r->remaining++;
		if (c->dead || (e = ctrl_take(c)) < 0) {
			r->rstatus[i] = c->dead ? (c->err ? c->err : -ECONNRESET) : -EBUSY;
			req_part_done_at(r, r->rstatus[i], c);
			continue;
		}
		c->ctrl[e].req = r;
		c->ctrl[e].server = i;
		send_ctrl(c, (uint32_t)e, type, body, len);
	}
	if (n == 0 || r->remaining == 0) {
		r->done = true;
	} else {
		req_arm_deadline(cl, r);	/* a barrier too: a worker that died must not hang the rest */
	}
	wake_progress(cl);
	status = req_wait_locked(cl, r);
	if (replies && reply_len)
		memcpy(replies, r->replies, (size_t)cl->nservers * reply_len);
	if (rstatus)
		memcpy(rstatus, r->rstatus, (size_t)cl->nservers * sizeof(int32_t));
	req_collect(r);
	pthread_mutex_unlock(&cl->lock);
	return status;
}

/* ---- connection setup ------------------------------------------------- */

#define MAX_SLOTS 64u	/* we use at most this many of a server's slots */

static int alloc_reg(struct rps_client *cl, size_t len, int access, char **buf, struct rps__mr **mr)
{
	void *p = NULL;
	int ret;

	p = rps__topo_alloc(cl->topo, &cl->place, len);
	if (!p)
		return rps__seterr(-ENOMEM, "out of memory for %zu bytes of buffers", len);
	ret = rps__mr_reg(cl->fab, p, len, access, mr);
	if (ret) {
		rps__topo_free(cl->topo, p, len);
		return ret;
	}
	*buf = p;
	return 0;
}

static void free_reg(struct rps_client *cl, char **buf, struct rps__mr **mr, size_t len)
{
	rps__mr_dereg(*mr);
	*mr = NULL;
	if (*buf)
		rps__topo_free(cl->topo, *buf, len);
	*buf = NULL;
}

static void conn_free(struct conn *c)
{
	if (c->ep)
		rps__ep_close(c->ep);
	c->ep = NULL;
	free_reg(c->cl, &c->pbufs, &c->pbufs_mr, (size_t)c->nslots * c->hello.slot_size);
	free_reg(c->cl, &c->bbufs, &c->bbufs_mr, NBOUNCE * c->bsize);
	free_reg(c->cl, (char **)&c->atomics, &c->atomics_mr, (size_t)c->nslots * 8);
	free_reg(c->cl, &c->rbufs, &c->rbufs_mr, (size_t)c->nrecv * RPS__MSG_MAX);
	free_reg(c->cl, &c->sbufs, &c->sbufs_mr, (size_t)CTRL_CREDITS * RPS__MSG_MAX);
	free(c->free_slots);
	free(c->free_bounce);
	c->free_slots = c->free_bounce = NULL;
}

/* HELLO before the progress thread runs: poll the CQ here. */
static int hello_sync(struct rps_client *cl, struct conn *c)
{
	struct rps__hello h = {
		.magic = RPS__HELLO_MAGIC, .version = RPS__PROTO_VERSION, .rank = cl->rank,
		.num_workers = cl->num_workers, .client_id = cl->client_id,
	};
	uint64_t deadline = rps__now_ns() + (uint64_t)cl->timeout_ms * 1000000ull;
	struct rps__wc wc;
	int ret;

	ret = send_ctrl(c, 0, RPS__MSG_HELLO, &h, sizeof(h));
	if (ret)
		return rps__preerr(ret, "%s: sending HELLO", c->name);
	while (rps__now_ns() < deadline) {
		struct rps__msg_hdr mh;
		char *buf;
		uint32_t i;

		ret = rps__cq_wait(cl->cq, &wc, 1, 100);
		if (ret < 0)
			return ret;
		if (ret == 0)
			continue;
		if (wc.status != RPS__WC_SUCCESS && rps__ep_context(wc.ep) == c)
			return rps__seterr(-ECONNRESET, "%s: connection failed during HELLO: %s", c->name,
					   rps__wc_status_str(wc.status));
		if ((wc.wr_id & 7u) != TAG_RECV || rps__ep_context(wc.ep) != c) {
			if (cl->thread_started)
				on_completion(cl, &wc);	/* we hold the poller role: theirs */
			continue;
		}
		i = (uint32_t)(wc.wr_id >> 3);
		buf = c->rbufs + (size_t)i * RPS__MSG_MAX;
		ret = rps__msg_check(buf, wc.byte_len);
		if (ret)
			return rps__preerr(ret, "%s", c->name);
		memcpy(&mh, buf, sizeof(mh));
		if (mh.type != RPS__MSG_HELLO_REP)
			return rps__seterr(-EPROTO, "%s: expected HELLO_REP, got %s", c->name, rps__msg_type_name(mh.type));
		if (mh.status)
			return rps__seterr(mh.status, "%s: %s", c->name, status_text(mh.status));
		memcpy(&c->hello, rps__msg_body(buf), sizeof(c->hello));
		{
			struct rps__sge sge = { .addr = buf, .len = RPS__MSG_MAX, .mr = c->rbufs_mr };
			ret = rps__post_recv(c->ep, &sge, wc.wr_id);
			if (ret)
				return ret;
		}
		return 0;
	}
	return rps__seterr(-ETIMEDOUT, "%s: no HELLO reply within %d ms: is it an rdmapsd?", c->name, cl->timeout_ms);
}

static int conn_setup(struct rps_client *cl, struct conn *c, const struct rps__uri *u, int index)
{
	struct rps__conn_priv priv = { .magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION, .role = 1 };
	struct rps__ep_attr attr = { 0 };
	char reply[RPS__PRIVDATA_MAX + 1];
	size_t reply_len = RPS__PRIVDATA_MAX;
	uint32_t i;
	int ret;

	c->cl = cl;
	c->index = index;
	c->uri = *u;
	rps__uri_str(u, c->name, sizeof(c->name));
	c->nrecv = CTRL_CREDITS + MAX_SLOTS + 4;
	ret = alloc_reg(cl, (size_t)c->nrecv * RPS__MSG_MAX, RPS__ACCESS_LOCAL, &c->rbufs, &c->rbufs_mr);
	if (ret)
		return ret;
	ret = alloc_reg(cl, (size_t)CTRL_CREDITS * RPS__MSG_MAX, RPS__ACCESS_LOCAL, &c->sbufs, &c->sbufs_mr);
	if (ret)
		return ret;
	attr.sq_depth = MAX_SLOTS * 3 + NBOUNCE * 2 + CTRL_CREDITS + 16;
	attr.rq_depth = c->nrecv;
	attr.max_inline = 64;
	memset(reply, 0, sizeof(reply));
	ret = rps__connect(cl->fab, u->host, u->port, cl->cq, &attr, &priv, sizeof(priv),
			   cl->timeout_ms, reply, &reply_len, &c->ep);
	if (ret == -ECONNREFUSED && reply_len > 0 && reply[0] >= ' ')
		return rps__seterr(ret, "%s refused the connection: %.*s", c->name, (int)reply_len, reply);
	if (ret)
		return rps__preerr(ret, "connecting to %s", c->name);
	rps__ep_set_context(c->ep, c);
	for (i = 0; i < c->nrecv; i++) {
		struct rps__sge sge = { .addr = c->rbufs + (size_t)i * RPS__MSG_MAX, .len = RPS__MSG_MAX, .mr = c->rbufs_mr };
		ret = rps__post_recv(c->ep, &sge, wrid_idx(i, TAG_RECV));
		if (ret)
			return ret;
	}
	ret = hello_sync(cl, c);
	if (ret)
		return ret;
	c->nslots = RPS__MIN(c->hello.nslots, MAX_SLOTS);
	c->bsize = rps__shard_stride(c->hello.shard_elems) + 64;
	ret = alloc_reg(cl, (size_t)c->nslots * c->hello.slot_size, RPS__ACCESS_LOCAL, &c->pbufs, &c->pbufs_mr);
	if (!ret)
		ret = alloc_reg(cl, NBOUNCE * c->bsize, RPS__ACCESS_LOCAL, &c->bbufs, &c->bbufs_mr);
	if (!ret)
		ret = alloc_reg(cl, (size_t)c->nslots * 8, RPS__ACCESS_LOCAL, (char **)&c->atomics, &c->atomics_mr);
	if (ret)
		return ret;
	c->free_slots = calloc(c->nslots, sizeof(uint32_t));
	c->free_bounce = calloc(NBOUNCE, sizeof(uint32_t));
	if (!c->free_slots || !c->free_bounce)
		return rps__seterr(-ENOMEM, "out of memory");
	for (i = 0; i < c->nslots; i++)
		c->free_slots[i] = c->nslots - 1 - i;
	c->nfree_slots = c->nslots;
	for (i = 0; i < NBOUNCE; i++)
		c->free_bounce[i] = NBOUNCE - 1 - i;
	c->nfree_bounce = NBOUNCE;
	c->nfree_ctrl = CTRL_CREDITS;
	return 0;
}

/*
 * Read the shard map from c's server with one RDMA READ (it crc-checks
 * itself: a read that raced with the server rewriting it is read again).
 * The caller holds the poller role (or the progress thread is not running).
 */
static int map_read_sync(struct rps_client *cl, struct conn *c)
{
	uint64_t deadline = rps__now_ns() + (uint64_t)cl->timeout_ms * 1000000ull;
	struct rps__smap m;
	int tries, ret = -EIO;

	for (tries = 0; tries < 8; tries++) {
		struct rps__wr wr;
		struct rps__wc wc;
		bool done = false;

		memset(&wr, 0, sizeof(wr));
		wr.wr_id = TAG_READ;	/* no op: recognised below */
		wr.op = RPS__OP_READ;
		wr.flags = RPS__WR_SIGNALED;
		wr.sge.addr = cl->mapbuf;
		wr.sge.len = RPS__MIN(c->hello.map_len, RPS__MAP_BUF);
		wr.sge.mr = cl->mapbuf_mr;
		wr.raddr = c->hello.map_addr;
		wr.rkey = c->hello.map_rkey;
		ret = rps__post(c->ep, &wr, 1);
		if (ret)
			return rps__preerr(ret, "%s: reading the shard map", c->name);
		while (!done) {
			if (rps__now_ns() > deadline)
				return rps__seterr(-ETIMEDOUT, "%s: the shard map did not arrive within %d ms", c->name,
						   cl->timeout_ms);
			ret = rps__cq_wait(cl->cq, &wc, 1, 100);
			if (ret < 0)
				return ret;
			if (ret == 0)
				continue;
			if (wc.wr_id == TAG_READ && rps__ep_context(wc.ep) == c) {
				if (wc.status != RPS__WC_SUCCESS)
					return rps__seterr(-ECONNRESET, "%s: reading the shard map: %s", c->name,
							   rps__wc_status_str(wc.status));
				done = true;
			} else if (cl->thread_started) {
				on_completion(cl, &wc);
			}
		}
		{	/* [u32 length][encoded map] */
			uint32_t len;
			memcpy(&len, cl->mapbuf, 4);
			ret = len <= RPS__MIN(c->hello.map_len, RPS__MAP_BUF) - 4 ?
				rps__smap_decode(cl->mapbuf + 4, len, &m) :
				rps__seterr(-EBADMSG, "shard map: length %u does not fit", len);
		}
		if (!ret) {
			if (m.applied >= cl->map.applied || !cl->map.npart)
				cl->map = m;
			return 0;
		}
	}
	return rps__preerr(ret, "%s: reading the shard map", c->name);
}

/* Connect to the members of the map we have no connection to.  A member
 * that cannot be reached (or has a bad address) is not an error here: its
 * connection is left dead with the reason and its address, so ops on its
 * shards fail naming it while the others work.  Only a member that
 * disagrees on the cluster's configuration fails the whole call. */
static int connect_members(struct rps_client *cl)
{
	uint32_t i;
	int k, ret = 0, first_err = 0;

	for (i = 0; i < cl->map.nmembers; i++) {
		const struct rps__smap_member *m = &cl->map.members[i];
		struct rps__uri u;
		bool have = false;
		for (k = 0; k < cl->nservers; k++)
			if (cl->conns[k].member_id == m->id && cl->conns[k].ep)
				have = true;
		if (have)
			continue;
		for (k = 0; k < cl->nservers; k++)	/* a slot of a dead connection to it */
			if (cl->conns[k].member_id == m->id)
				break;
		if (k == cl->nservers && cl->nservers == (int)RPS__SMAP_MAX_MEMBERS)
			continue;
		if (k < cl->nservers)
			conn_free(&cl->conns[k]);
		memset(&cl->conns[k], 0, sizeof(cl->conns[k]));
		if (rps__uri_parse(m->uri, &u)) {
			char esc[4 * RPS__SMAP_URI_MAX];
			snprintf(cl->conns[k].name, sizeof(cl->conns[k].name), "member %llu at '%s'",
				 (unsigned long long)m->id, rps__escape(m->uri, esc, sizeof(esc)));
			ret = -EHOSTUNREACH;
		} else {
			ret = conn_setup(cl, &cl->conns[k], &u, k);
		}
		if (ret) {
			conn_free(&cl->conns[k]);
			cl->conns[k].cl = cl;
			cl->conns[k].index = k;
			cl->conns[k].dead = true;
			/* to its ops: a server we had is gone (as before the
			 * attempt); one we never reached refused or is unreachable */
			cl->conns[k].err = k < cl->nservers ? -ECONNRESET : ret == -ECONNREFUSED ? ret : -EHOSTUNREACH;
			cl->conns[k].member_id = m->id;
			if (k == cl->nservers)
				cl->nservers++;
			continue;
		}
		cl->conns[k].member_id = cl->conns[k].hello.member_id;
		if (cl->conns[k].hello.shard_elems != cl->shard_elems) {
			cl->conns[k].dead = true;
			cl->conns[k].err = -EINVAL;
			ret = rps__seterr(-EINVAL, "%s uses --shard-size %u but the cluster uses %u: give every rdmapsd the same",
					  cl->conns[k].name, cl->conns[k].hello.shard_elems * 4, cl->shard_elems * 4);
			if (!first_err)
				first_err = ret;
		}
		if (k == cl->nservers)
			cl->nservers++;
	}
	if (!first_err)
		rps__clearerr();
	return first_err;
}

/* Take the poller role from a user thread (the progress thread stands by). */
static void poll_claim(struct rps_client *cl)
{
	cl->waiters++;
	if (cl->progress_polling)
		wake_progress(cl);
	while (cl->polling)
		pthread_cond_wait(&cl->cond, &cl->lock);
	cl->polling = true;
}

static void poll_release(struct rps_client *cl)
{
	cl->polling = false;
	cl->waiters--;
	pthread_cond_broadcast(&cl->cond);
	if (!cl->waiters && cl->nactive)
		pthread_cond_signal(&cl->pcond);
}

/* Read the map again (from any server we reach) and connect to new members. */
static int map_refresh(struct rps_client *cl)
{
	int k, ret = -ECONNRESET;

	pthread_mutex_lock(&cl->lock);
	poll_claim(cl);
	for (k = 0; k < cl->nservers; k++) {
		struct conn *c = &cl->conns[k];
		if (!c->ep || c->dead)
			continue;
		ret = map_read_sync(cl, c);
		if (!ret)
			break;
	}
	if (!ret)
		connect_members(cl);
	poll_release(cl);
	pthread_mutex_unlock(&cl->lock);
	if (ret)
		rps__preerr(ret, "refreshing the shard map");
	return ret;
}

static int fault_count(const char *spec, const char *name)
{
	size_t n = strlen(name);

	if (spec && !strncmp(spec, name, n) && spec[n] == ':')
		return atoi(spec + n + 1);
	return 0;
}

/* ---- the API ------------------------------------------------------------- */

/* The caller's struct may be older (smaller) or newer (larger) than ours:
 * build the defaults in a struct of our own, then copy no more than the
 * caller has, zeroing the caller's members we do not know. */
static void opts_copy_out(void *dst, size_t size, const void *ours, size_t our_size)
{
	memcpy(dst, ours, RPS__MIN(size, our_size));
	if (size > our_size)
		memset((char *)dst + our_size, 0, size - our_size);
}

RPS_EXPORT void rps_client_opts_init_sized(struct rps_client_opts *opts, size_t size)
{
	struct rps_client_opts d;

	if (!opts || size < sizeof(d.size))
		return;
	memset(&d, 0, sizeof(d));
	d.size = RPS__MIN(size, sizeof(d));
	d.num_workers = 1;
	d.timeout_ms = 30000;
	opts_copy_out(opts, size, &d, sizeof(d));
}

static void tensor_opts_defaults(struct rps_tensor_opts *d)
{
	memset(d, 0, sizeof(*d));
	d->size = sizeof(*d);
	d->dtype = RPS_DTYPE_F32;
	d->mode = RPS_MODE_SYNC;
	d->optimizer = RPS_OPT_SUM;
	d->lr = 0.01f;
	d->momentum = 0.9f;
	d->beta1 = 0.9f;
	d->beta2 = 0.999f;
	d->eps = 1e-8f;
	d->rescale = 1.0f;
}

RPS_EXPORT void rps_tensor_opts_init_sized(struct rps_tensor_opts *opts, size_t size)
{
	struct rps_tensor_opts d;

	if (!opts || size < sizeof(d.size))
		return;
	tensor_opts_defaults(&d);
	d.size = RPS__MIN(size, sizeof(d));
	opts_copy_out(opts, size, &d, sizeof(d));
}

RPS_EXPORT int rps_version(const char **string)
{
	if (string)
		*string = RPS_VERSION_STRING;
	return RPS_VERSION_NUMBER;
}

RPS_EXPORT int rps_client_close(rps_client_t *cl)
{
	int i;

	if (!cl)
		return 0;
	if (cl->thread_started) {
		pthread_mutex_lock(&cl->lock);
		cl->stopping = true;
		pthread_cond_broadcast(&cl->cond);
		pthread_cond_broadcast(&cl->pcond);
		pthread_mutex_unlock(&cl->lock);
		wake_progress(cl);
		pthread_join(cl->thread, NULL);
	}
	for (i = 0; cl->conns && i < cl->nservers; i++) {
		if (cl->conns[i].ep) {
			cl->conns[i].err = -ECANCELED;
			conn_kill(cl, &cl->conns[i]);
		}
		conn_free(&cl->conns[i]);
	}
	free(cl->conns);
	free_reg(cl, &cl->mapbuf, &cl->mapbuf_mr, RPS__MAP_BUF);
	rps__cq_destroy(cl->cq);
	rps__fabric_close(cl->fab);
	rps__topo_close(cl->topo);	/* after every rps__topo_free */
	if (cl->wake_fd >= 0)
		close(cl->wake_fd);
	pthread_cond_destroy(&cl->cond);
	pthread_cond_destroy(&cl->pcond);
	pthread_mutex_destroy(&cl->lock);
	free(cl);
	return 0;
}

RPS_EXPORT int rps_client_connect(const struct rps_client_opts *opts, rps_client_t **out)
{
	struct rps__fabric_attr fattr = { 0 };
	struct rps__uri *uris = NULL;
	struct rps_client *cl;
	int i, nseeds = 0, ret;

	rps__clearerr();
	if (!opts || !out || opts->size < offsetof(struct rps_client_opts, timeout_ms) + sizeof(int))
		return rps__seterr(-EINVAL, "rps_client_connect: options not initialised with rps_client_opts_init()");
	if (opts->num_workers < 1 || opts->rank < 0 || opts->rank >= opts->num_workers)
		return rps__seterr(-EINVAL, "rps_client_connect: rank %d is not in 0..num_workers-1 (%d workers)",
				   opts->rank, opts->num_workers);
	cl = calloc(1, sizeof(*cl));
	if (!cl)
		return rps__seterr(-ENOMEM, "out of memory");
	pthread_mutex_init(&cl->lock, NULL);
	pthread_cond_init(&cl->cond, NULL);
	pthread_cond_init(&cl->pcond, NULL);
	cl->wake_fd = -1;
	cl->rank = opts->rank;
	cl->num_workers = opts->num_workers;
	cl->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : 30000;
	cl->fault_kill_mid_push = fault_count(getenv("RPS_FAULT"), "kill-mid-push");
	cl->fault_stop_after_lock = fault_count(getenv("RPS_FAULT"), "stop-after-lock");
	cl->fault_corrupt_push = fault_count(getenv("RPS_FAULT"), "corrupt-push");
	if (opts->size >= offsetof(struct rps_client_opts, verify) + sizeof(opts->verify))
		cl->verify = opts->verify != 0;
	if (opts->size >= offsetof(struct rps_client_opts, spin_us) + sizeof(opts->spin_us) && opts->spin_us > 0)
		cl->spin_ns = (uint64_t)opts->spin_us * 1000ull;
	ret = rps__uri_list_parse(opts->servers, &uris, &nseeds);
	if (ret)
		goto err;
	cl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	cl->conns = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*cl->conns));
	if (cl->wake_fd < 0 || !cl->conns) {
		ret = rps__seterr(-ENOMEM, "out of memory or file descriptors");
		goto err;
	}
	{	/* names this client's pushes on every server (idempotent retries) */
		uint64_t r = rps__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)cl;
		r ^= r >> 33;
		r *= 0xff51afd7ed558ccdull;
		r ^= r >> 33;
		cl->client_id = r ? r : 1;
	}
	fattr.kind = uris[0].kind;
	fattr.host = uris[0].host;
	ret = rps__fabric_open(&fattr, &cl->fab);
	if (ret)
		goto err;
	cl->place.numa_node = -1;
	if (fattr.kind == RPS__KIND_VERBS) {
		struct rps__topo_opts to = { .log = 0 };

		/* placement is an optimisation: without hwloc, plain memory */
		if (rps__topo_open(&to, &cl->topo) == 0 &&
		    rps__topo_place(cl->topo, rps__fabric_name(cl->fab), NULL, &cl->place)) {
			rps__topo_close(cl->topo);
			cl->topo = NULL;
			cl->place.numa_node = -1;
		}
		rps__clearerr();
	}
	ret = rps__cq_create(cl->fab, RPS__SMAP_MAX_MEMBERS * (MAX_SLOTS * 4 + NBOUNCE * 2 + CTRL_CREDITS * 2 + 32), &cl->cq);
	if (ret)
		goto err;
	ret = alloc_reg(cl, RPS__MAP_BUF, RPS__ACCESS_LOCAL, &cl->mapbuf, &cl->mapbuf_mr);
	if (ret)
		goto err;
	/* Any server of the list will do: it gives us the map, and the map
	 * gives us every member. */
	for (i = 0; i < nseeds; i++) {
		ret = conn_setup(cl, &cl->conns[0], &uris[i], 0);
		if (!ret) {
			cl->conns[0].member_id = cl->conns[0].hello.member_id;
			cl->shard_elems = cl->conns[0].hello.shard_elems;
			cl->nservers = 1;
			ret = map_read_sync(cl, &cl->conns[0]);
			if (!ret)
				break;
		}
		conn_free(&cl->conns[0]);
		memset(&cl->conns[0], 0, sizeof(cl->conns[0]));
		cl->nservers = 0;
	}
	if (ret)
		goto err;
	ret = connect_members(cl);
	if (ret)
		goto err;
	ret = pthread_create(&cl->thread, NULL, progress_main, cl);
	if (ret) {
		ret = rps__seterr(-ret, "pthread_create: %s", strerror(ret));
		goto err;
	}
	cl->thread_started = true;
	free(uris);
	*out = cl;
	return 0;
err:
	{
		char msg[512];
		snprintf(msg, sizeof(msg), "%s", rps__errbuf());
		free(uris);
		rps_client_close(cl);
		rps__seterr(ret, "%s", msg);
	}
	return ret;
}

static int spec_from_opts(const char *name, const struct rps_tensor_opts *o, int num_workers,
			  struct rps__tensor_spec *sp)
{
	if (!o || o->size < offsetof(struct rps_tensor_opts, init) + sizeof(void *))
		return rps__seterr(-EINVAL, "tensor '%s': options not initialised with rps_tensor_opts_init()", name);
	if (!o->count)
		return rps__seterr(-EINVAL, "tensor '%s': count must be at least 1", name);
	if (!rps__dtype_size(o->dtype))
		return rps__seterr(-EINVAL, "tensor '%s': unknown dtype %d", name, (int)o->dtype);
	if (o->mode < RPS_MODE_SYNC || o->mode > RPS_MODE_ASYNC)
		return rps__seterr(-EINVAL, "tensor '%s': unknown consistency mode %d", name, (int)o->mode);
	if (o->optimizer < RPS_OPT_SUM || o->optimizer > RPS_OPT_ADAM)
		return rps__seterr(-EINVAL, "tensor '%s': unknown optimizer %d", name, (int)o->optimizer);
	{	/* say what is wrong here rather than learn it from a server */
		struct rps__optim opt = { .type = o->optimizer, .lr = o->lr, .momentum = o->momentum,
					  .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
					  .weight_decay = o->weight_decay, .rescale = o->rescale };
		int ret = rps__optim_validate(&opt);
		if (ret)
			return rps__preerr(ret, "tensor '%s'", name);
	}
	memset(sp, 0, sizeof(*sp));
	sp->count = o->count;
	sp->dtype = (uint32_t)o->dtype;
	sp->mode = (uint32_t)o->mode;
	sp->staleness = o->mode == RPS_MODE_BOUNDED ? o->staleness : 0;
	sp->optimizer = (uint32_t)o->optimizer;
	sp->lr = o->lr;
	sp->momentum = o->momentum;
	sp->beta1 = o->beta1;
	sp->beta2 = o->beta2;
	sp->eps = o->eps;
	sp->weight_decay = o->weight_decay;
	sp->rescale = o->rescale;
	sp->num_workers = o->mode == RPS_MODE_ASYNC ? 0 : num_workers;
	sp->flags = o->init ? RPS__CREATE_HAS_INIT : 0;
	return 0;
}

static int submit_and_wait(struct rps_client *cl, struct rps_request *r, rps_request_t **async_out);

/*
 * Send msg (CREATE, or CREATE with OPEN_ONLY) to the servers marked in to,
 * page through their region lists, and rebuild t->part and t->at from what
 * they serve.  reps/rstatus: first replies per connection.  With
 * tolerate, a server that fails (gone, or does not know the tensor) is
 * skipped; otherwise its error is returned.
 */
static int tensor_regions(struct rps_client *cl, struct rps_tensor *t, const struct rps__create *msg,
			  bool *to, struct rps__create_rep *reps, int32_t *rstatus, bool tolerate)
{
	struct rps__create_rep *page = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*page));
	int32_t *pst = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*pst));
	bool *one = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*one));
	struct rps__create m = *msg;
	uint32_t p, k;
	int i, ret;

	if (!page || !pst || !one) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	ret = ctrl_call(cl, RPS__MSG_CREATE, msg, sizeof(*msg), to, sizeof(*reps), reps, rstatus);
	if (ret && !tolerate)
		goto out;
	ret = 0;
	pthread_mutex_lock(&cl->lock);
	/* forget what the servers asked serve; a server we could not ask
	 * (gone) keeps its partitions, so their ops fail with its error */
	for (p = 0; p < t->layout.nservers; p++)
		if (t->part[p].conn < 0 || to[t->part[p].conn])
			t->part[p].conn = -1;
	pthread_mutex_unlock(&cl->lock);
	m.flags |= RPS__CREATE_OPEN_ONLY;
	for (i = 0; i < cl->nservers; i++) {
		struct rps__create_rep *rp = &reps[i];
		if (!to[i] || rstatus[i])
			continue;
		for (;;) {
			pthread_mutex_lock(&cl->lock);
			t->at[i].id = rp->tensor_id;
			t->at[i].known = true;
			for (k = 0; k < rp->nregions && k < RPS__CREATE_MAX_REGIONS; k++) {
				const struct rps__region_ref *ref = &rp->regions[k];
				if (ref->part >= t->layout.nservers)
					continue;
				if (t->part[ref->part].conn >= 0 && t->part[ref->part].epoch > ref->epoch)
					continue;
				t->part[ref->part].conn = i;
				t->part[ref->part].addr = ref->addr;
				t->part[ref->part].rkey = ref->rkey;
				t->part[ref->part].epoch = ref->epoch;
			}
			pthread_mutex_unlock(&cl->lock);
			if (rp->first + rp->nregions >= rp->total || !rp->nregions)
				break;
			memset(one, 0, RPS__SMAP_MAX_MEMBERS * sizeof(*one));
			one[i] = true;
			m.first = rp->first + rp->nregions;
			ret = ctrl_call(cl, RPS__MSG_CREATE, &m, sizeof(m), one, sizeof(*page), page, pst);
			if (ret || pst[i]) {
				if (!tolerate)
					goto out;
				ret = 0;
				break;
			}
			rp = &page[i];
		}
	}
	/* partitions of a member we never reached: route them to its dead
	 * connection, so their ops fail naming it (not as "moved") */
	pthread_mutex_lock(&cl->lock);
	for (p = 0; p < t->layout.nservers && p < cl->map.npart; p++) {
		if (t->part[p].conn >= 0)
			continue;
		for (i = 0; i < cl->nservers; i++)
			if (cl->conns[i].dead && !cl->conns[i].ep && cl->conns[i].member_id == cl->map.parts[p].owner)
				t->part[p].conn = i;
	}
	pthread_mutex_unlock(&cl->lock);
out:
	free(page);
	free(pst);
	free(one);
	return ret;
}

static bool *live_conns(struct rps_client *cl)
{
	bool *to = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*to));
	int i;

	if (!to)
		return NULL;
	pthread_mutex_lock(&cl->lock);
	for (i = 0; i < cl->nservers; i++)
		to[i] = cl->conns[i].ep && !cl->conns[i].dead;
	pthread_mutex_unlock(&cl->lock);
	return to;
}

/* After a stale epoch: where does the tensor live now? */
static int tensor_refresh(struct rps_client *cl, struct rps_tensor *t)
{
	struct rps__create_rep *reps = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*reps));
	int32_t *rstatus = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*rstatus));
	bool *to = live_conns(cl);
	struct rps__create msg;
	int ret;

	if (!reps || !rstatus || !to) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	memset(&msg, 0, sizeof(msg));
	snprintf(msg.name, sizeof(msg.name), "%s", t->name);
	msg.flags = RPS__CREATE_OPEN_ONLY;
	ret = tensor_regions(cl, t, &msg, to, reps, rstatus, true);
out:
	free(reps);
	free(rstatus);
	free(to);
	return ret;
}

static void tensor_free(struct rps_tensor *t);

static int tensor_setup(struct rps_client *cl, const char *name, struct rps__create *msg,
			const struct rps_tensor_opts *o, rps_tensor_t **out)
{
	struct rps__create_rep *reps;
	int32_t *rstatus;
	bool *to;
	struct rps_tensor *t = NULL;
	int i, first = -1, ret;

	reps = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*reps));
	rstatus = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*rstatus));
	to = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*to));
	if (!reps || !rstatus || !to) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	for (i = 0; i < cl->nservers; i++)
		to[i] = !cl->conns[i].dead && cl->conns[i].ep;
	t = calloc(1, sizeof(*t));
	if (!t || !(t->at = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*t->at))) ||
	    !(t->part = calloc(cl->map.npart, sizeof(*t->part)))) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	t->cl = cl;
	snprintf(t->name, sizeof(t->name), "%s", name);
	/* the layout needs the count: from the request, or (open) a reply */
	t->spec = msg->spec;
	if (msg->flags & RPS__CREATE_OPEN_ONLY)
		t->spec.count = 1;
	ret = rps__layout_init(&t->layout, name, t->spec.count, cl->shard_elems, cl->map.npart);
	if (ret)
		goto out;
	ret = tensor_regions(cl, t, msg, to, reps, rstatus, false);
	if (ret == -ENODATA) {
		/* a server refused it: some of its shards are in a lost partition */
		uint32_t p;
		for (p = 0; p < cl->map.npart && p < t->layout.nservers; p++)
			if (cl->map.parts[p].lost && rps__part_nshards(&t->layout, p)) {
				rps__seterr(-ENODATA, "partition %u lost with member %llu: restore it (psctl restore DIR)"
					    " or accept it empty (psctl forget-lost %u)", p,
					    (unsigned long long)cl->map.parts[p].lost, p);
				break;
			}
	}
	if (ret) {
		rps__preerr(ret, "tensor '%s'", name);
		goto out;
	}
	for (i = 0; i < cl->nservers; i++) {
		if (!to[i])
			continue;
		if (first < 0) {
			first = i;
		} else if (memcmp(&reps[i].spec, &reps[first].spec, sizeof(reps[0].spec))) {
			ret = rps__seterr(-EEXIST, "tensor '%s': servers disagree about its options (a stale tensor on one of them?)", name);
			goto out;
		}
	}
	if (first < 0) {
		ret = rps__seterr(-ECONNRESET, "tensor '%s': no server reachable", name);
		goto out;
	}
	if (msg->flags & RPS__CREATE_OPEN_ONLY) {
		/* now we know its size: lay it out again and ask again */
		t->spec = reps[first].spec;
		ret = rps__layout_init(&t->layout, name, t->spec.count, cl->shard_elems, cl->map.npart);
		if (!ret)
			ret = tensor_regions(cl, t, msg, to, reps, rstatus, false);
		if (ret)
			goto out;
	}
	t->spec = reps[first].spec;
	t->stride = reps[first].stride;
	t->lock_guess = calloc(t->layout.nshards, sizeof(uint64_t));
	t->lock_held = calloc(t->layout.nshards, sizeof(uint64_t));
	t->shard_busy = calloc(t->layout.nshards, 1);
	if (!t->lock_guess || !t->lock_held || !t->shard_busy) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto out;
	}
	/* Initial values go to the shards whose server this call created the
	 * tensor on; the others got them from whoever created it there. */
	if (o && o->init) {
		uint32_t n = 0, k = 0, s;
		struct rps_request *r;
		for (s = 0; s < t->layout.nshards; s++) {
			int c = t->part[rps__shard_server(&t->layout, s)].conn;
			n += c >= 0 && reps[c].created ? 1u : 0u;
		}
		if (n) {
			r = req_new(cl, n);
			if (!r) {
				ret = rps__seterr(-ENOMEM, "out of memory");
				goto out;
			}
			r->kind = REQ_SHARDS;
			for (s = 0; s < t->layout.nshards; s++) {
				struct shard_op *op;
				int c = t->part[rps__shard_server(&t->layout, s)].conn;
				if (c < 0 || !reps[c].created)
					continue;
				op = op_init(&r->ops[k++], r, t, OP_INIT, s);
				op->src = o->init + rps__shard_first(&t->layout, s);
			}
			ret = submit_and_wait(cl, r, NULL);
			if (ret) {
				rps__preerr(ret, "tensor '%s': sending initial values", name);
				goto out;
			}
		}
	}
	*out = t;
	t = NULL;
out:
	if (t)
		tensor_free(t);
	free(reps);
	free(rstatus);
	free(to);
	return ret;
}

RPS_EXPORT int rps_tensor_create(rps_client_t *cl, const char *name, const struct rps_tensor_opts *opts,
				 rps_tensor_t **out)
{
	struct rps__create msg;
	int ret;

	rps__clearerr();
	if (!cl || !name || !out)
		return rps__seterr(-EINVAL, "rps_tensor_create: NULL argument");
	ret = rps__name_check(name);
	if (ret)
		return ret;
	memset(&msg, 0, sizeof(msg));
	snprintf(msg.name, sizeof(msg.name), "%s", name);
	ret = spec_from_opts(name, opts, cl->num_workers, &msg.spec);
	if (ret)
		return ret;
	msg.flags = msg.spec.flags;
	return tensor_setup(cl, name, &msg, opts, out);
}

RPS_EXPORT int rps_tensor_open(rps_client_t *cl, const char *name, rps_tensor_t **out)
{
	struct rps__create msg;
	int ret;

	rps__clearerr();
	if (!cl || !name || !out)
		return rps__seterr(-EINVAL, "rps_tensor_open: NULL argument");
	ret = rps__name_check(name);
	if (ret)
		return ret;
	memset(&msg, 0, sizeof(msg));
	snprintf(msg.name, sizeof(msg.name), "%s", name);
	msg.flags = RPS__CREATE_OPEN_ONLY;
	return tensor_setup(cl, name, &msg, NULL, out);
}

RPS_EXPORT int rps_tensor_info(const rps_tensor_t *t, struct rps_tensor_opts *o)
{
	struct rps_tensor_opts d;
	size_t size;

	if (!t || !o || o->size < offsetof(struct rps_tensor_opts, init))
		return rps__seterr(-EINVAL, "rps_tensor_info: NULL argument or options not initialised");
	/* filled in a struct of our own: an older caller's is smaller */
	size = o->size;
	tensor_opts_defaults(&d);
	d.size = RPS__MIN(size, sizeof(d));
	d.count = t->spec.count;
	d.dtype = (enum rps_dtype)t->spec.dtype;
	d.mode = (enum rps_mode)t->spec.mode;
	d.staleness = t->spec.staleness;
	d.optimizer = (enum rps_optimizer)t->spec.optimizer;
	d.lr = t->spec.lr;
	d.momentum = t->spec.momentum;
	d.beta1 = t->spec.beta1;
	d.beta2 = t->spec.beta2;
	d.eps = t->spec.eps;
	d.weight_decay = t->spec.weight_decay;
	d.rescale = t->spec.rescale;
	memcpy(o, &d, d.size);
	return 0;
}

RPS_EXPORT uint32_t rps_tensor_shards(const rps_tensor_t *t)
{
	return t ? t->layout.nshards : 0;
}

static void tensor_free(struct rps_tensor *t)
{
	free(t->at);
	free(t->part);
	free(t->lock_guess);
	free(t->lock_held);
	free(t->shard_busy);
	free(t);
}

RPS_EXPORT void rps_tensor_close(rps_tensor_t *t)
{
	struct rps_client *cl;

	if (!t)
		return;
	/* An op of a request that timed out may still be running; it frees
	 * the tensor when it ends (or when the client closes). */
	cl = t->cl;
	pthread_mutex_lock(&cl->lock);
	if (t->live_ops) {
		t->closing = true;
		t = NULL;
	}
	pthread_mutex_unlock(&cl->lock);
	if (t)
		tensor_free(t);
}

static int map_refresh(struct rps_client *cl);
static int tensor_refresh(struct rps_client *cl, struct rps_tensor *t);

/*
 * r finished with RPS_ESTALE_EPOCH: some shards moved (or are moving).
 * Read the map again, learn where the tensor lives now, and send the ops
 * that were refused there, with their push ids and clocks unchanged: a
 * refused push was not applied, and a server that did apply a push id
 * acknowledges it again without applying it.  Lock held; r is done.
 */
static bool retryable(int status)
{
	/* a moved shard, or the old owner's memory already deregistered (the
	 * remote access error took the connection with it: the refresh
	 * connects again), or a connection lost: worth a look at the map */
	return status == RPS_ESTALE_EPOCH || status == -EFAULT || status == -ECONNRESET;
}

/* After a refresh: resend an op whose connection was lost only if its
 * shard's partition has a new owner (a server that left the cluster after
 * its partitions moved); a server that died owning it is an error. */
static bool worth_resending(const struct rps_client *cl, const struct shard_op *op)
{
	uint32_t p;

	if (op->result != -ECONNRESET)
		return retryable(op->result);
	p = rps__shard_server(&op->t->layout, op->shard);
	/* (a partition lost with its server: resent, it is refused saying so) */
	return p < cl->map.npart && (cl->map.parts[p].owner != op->c->member_id || cl->map.parts[p].lost);
}

static int retry_stale(struct rps_client *cl, struct rps_request *r)
{
	uint64_t deadline = rps__now_ns() + (uint64_t)cl->timeout_ms * 1000000ull;
	struct rps_request *cur = r;
	uint32_t pause_us = 500;
	int status = r->status;

	while (retryable(status) && rps__now_ns() < deadline) {
		struct rps_tensor *t = NULL;
		struct rps_request *nr;
		uint32_t i, n = 0, k = 0;

		for (i = 0; i < cur->nops; i++)
			if (retryable(cur->ops[i].result)) {
				n++;
				t = cur->ops[i].t;
			}
		if (!n || !t)
			break;
		nr = req_new(cl, n);
		if (!nr) {
			status = rps__seterr(-ENOMEM, "out of memory");
			break;
		}
		nr->kind = REQ_SHARDS;
		nr->min_version_seen = cur->min_version_seen;
		t->live_ops++;	/* keep the tensor while we let go of the lock */
		pthread_mutex_unlock(&cl->lock);
		map_refresh(cl);
		tensor_refresh(cl, t);
		pthread_mutex_lock(&cl->lock);
		t->live_ops--;
		for (i = 0, n = 0; i < cur->nops; i++)
			n += worth_resending(cl, &cur->ops[i]);
		if (n < nr->nops) {
			/* a server died owning some of them: that is the answer */
			nr->waited = true;
			nr->done = true;
			req_maybe_free(nr);
			break;
		}
		pthread_mutex_unlock(&cl->lock);
		usleep(pause_us);
		pause_us = RPS__MIN(pause_us * 2, 50000u);
		pthread_mutex_lock(&cl->lock);
		for (i = 0; i < cur->nops; i++) {
			const struct shard_op *old = &cur->ops[i];
			struct shard_op *op;
			if (!retryable(old->result))
				continue;
			op = op_init(&nr->ops[k++], nr, old->t, old->kind, old->shard);
			op->clock = old->clock;
			op->push_id = old->push_id;
			op->src = old->src;
			op->dst = old->dst;
			op->min_version = old->min_version;
			op->min_clock = old->min_clock;
			op->held = old->held;
		}
		if (cur != r) {
			cur->waited = true;
			req_maybe_free(cur);
		}
		cur = nr;
		req_arm_deadline(cl, nr);
		nr->remaining++;
		for (i = 0; i < nr->nops; i++)
			op_submit(&nr->ops[i]);
		if (--nr->remaining == 0)
			req_finish(nr);
		status = req_wait_locked(cl, nr);
		if (status == -EALREADY) {
			/* A resent sync push (or initial value) that the server
			 * already has: it was applied before the connection went. */
			status = 0;
			for (i = 0; i < nr->nops; i++) {
				int res = nr->ops[i].result;
				if (res == -EALREADY && (nr->ops[i].kind == OP_PUSH || nr->ops[i].kind == OP_INIT))
					nr->ops[i].result = res = 0;
				if (res && !status)
					status = res;
			}
			nr->status = status;
		}
	}
	if (cur != r) {
		r->status = status;
		if (status)
			snprintf(r->msg, sizeof(r->msg), "%s", cur->msg);
		else if (r->version_out && r->kind == REQ_SHARDS && cur->min_version_seen != UINT64_MAX)
			*r->version_out = cur->min_version_seen;
		cur->waited = true;
		req_maybe_free(cur);
	}
	return status;
}

/* Submit every op of r; wait unless async_out is given. */
static int submit_and_wait(struct rps_client *cl, struct rps_request *r, rps_request_t **async_out)
{
	uint32_t i;
	int status;

	pthread_mutex_lock(&cl->lock);
	req_arm_deadline(cl, r);
	r->remaining++;	/* hold completion until every op is submitted */
	for (i = 0; i < r->nops; i++)
		op_submit(&r->ops[i]);
	if (--r->remaining == 0)
		req_finish(r);
	if (async_out) {
		*async_out = r;
		if (!cl->waiters)
			pthread_cond_signal(&cl->pcond);
		pthread_mutex_unlock(&cl->lock);
		return 0;
	}
	status = req_wait_locked(cl, r);
	if (retryable(status))
		status = retry_stale(cl, r);
	req_collect(r);
	pthread_mutex_unlock(&cl->lock);
	return status;
}

static int push_start(rps_tensor_t *t, const void *grad, size_t nbytes, rps_request_t **async_out)
{
	struct rps_client *cl;
	struct rps_request *r;
	size_t esize;
	uint64_t clock;
	uint32_t s;

	rps__clearerr();
	if (!t || !grad)
		return rps__seterr(-EINVAL, "rps_push: NULL argument");
	cl = t->cl;
	esize = rps__dtype_size((enum rps_dtype)t->spec.dtype);
	if (nbytes != t->spec.count * esize)
		return rps__seterr(-EMSGSIZE, "rps_push '%s': %zu bytes given, the tensor takes %llu %s elements = %llu bytes",
				   t->name, nbytes, (unsigned long long)t->spec.count,
				   rps__dtype_name((enum rps_dtype)t->spec.dtype),
				   (unsigned long long)(t->spec.count * esize));
	r = req_new(cl, t->layout.nshards);
	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_SHARDS;
	pthread_mutex_lock(&cl->lock);
	clock = t->clock++;
	for (s = 0; s < t->layout.nshards; s++) {
		struct shard_op *op = op_init(&r->ops[s], r, t, OP_PUSH, s);
		op->clock = clock;
		op->push_id = ++cl->next_push_id;
		op->src = (const char *)grad + rps__shard_first(&t->layout, s) * esize;
	}
	pthread_mutex_unlock(&cl->lock);
	return submit_and_wait(cl, r, async_out);
}

static int pull_start(rps_tensor_t *t, float *out, size_t nbytes, uint64_t *version,
		      rps_request_t **async_out)
{
	struct rps_client *cl;
	struct rps_request *r;
	uint64_t min_version = 0, min_clock = 0;
	uint32_t s;

	rps__clearerr();
	if (!t || !out)
		return rps__seterr(-EINVAL, "rps_pull: NULL argument");
	cl = t->cl;
	if (nbytes != t->spec.count * 4u)
		return rps__seterr(-EMSGSIZE, "rps_pull '%s': %zu bytes given, the tensor returns %llu fp32 = %llu bytes",
				   t->name, nbytes, (unsigned long long)t->spec.count,
				   (unsigned long long)(t->spec.count * 4u));
	r = req_new(cl, t->layout.nshards);
	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_SHARDS;
	r->version_out = version;
	pthread_mutex_lock(&cl->lock);
	if (t->spec.mode == RPS_MODE_SYNC)
		min_version = t->clock;
	else if (t->spec.mode == RPS_MODE_BOUNDED)
		min_clock = t->clock > t->spec.staleness ? t->clock - t->spec.staleness : 0;
	for (s = 0; s < t->layout.nshards; s++) {
		struct shard_op *op = op_init(&r->ops[s], r, t, OP_PULL, s);
		op->min_version = min_version;
		op->min_clock = min_clock;
		op->dst = out + rps__shard_first(&t->layout, s);
	}
	pthread_mutex_unlock(&cl->lock);
	return submit_and_wait(cl, r, async_out);
}

RPS_EXPORT int rps_push(rps_tensor_t *t, const void *grad, size_t nbytes)
{
	return push_start(t, grad, nbytes, NULL);
}

RPS_EXPORT int rps_pull(rps_tensor_t *t, float *out, size_t nbytes, uint64_t *version)
{
	return pull_start(t, out, nbytes, version, NULL);
}

RPS_EXPORT int rps_push_start(rps_tensor_t *t, const void *grad, size_t nbytes, rps_request_t **req)
{
	if (!req)
		return rps__seterr(-EINVAL, "rps_push_start: NULL request pointer");
	return push_start(t, grad, nbytes, req);
}

RPS_EXPORT int rps_pull_start(rps_tensor_t *t, float *out, size_t nbytes, uint64_t *version,
			      rps_request_t **req)
{
	if (!req)
		return rps__seterr(-EINVAL, "rps_pull_start: NULL request pointer");
	return pull_start(t, out, nbytes, version, req);
}

RPS_EXPORT int rps_test(rps_request_t *r, int *result)
{
	struct rps_client *cl;
	int done;

	if (!r)
		return rps__seterr(-EINVAL, "rps_test: NULL request");
	cl = r->cl;
	pthread_mutex_lock(&cl->lock);
	done = r->done;
	if (done) {
		if (retryable(r->status))
			retry_stale(cl, r);	/* blocks: a move is rare */
		if (result)
			*result = r->status;
		req_collect(r);
	}
	pthread_mutex_unlock(&cl->lock);
	return done;
}

RPS_EXPORT int rps_wait(rps_request_t *r)
{
	struct rps_client *cl;
	int status;

	if (!r)
		return rps__seterr(-EINVAL, "rps_wait: NULL request");
	cl = r->cl;
	pthread_mutex_lock(&cl->lock);
	status = req_wait_locked(cl, r);
	if (retryable(status))
		status = retry_stale(cl, r);
	req_collect(r);
	pthread_mutex_unlock(&cl->lock);
	return status;
}

RPS_EXPORT int rps_barrier(rps_client_t *cl)
{
	struct rps__barrier b = { 0 };
	bool *to;
	int ret;

	rps__clearerr();
	if (!cl)
		return rps__seterr(-EINVAL, "rps_barrier: NULL client");
	to = calloc(RPS__SMAP_MAX_MEMBERS, sizeof(*to));
	if (!to)
		return rps__seterr(-ENOMEM, "out of memory");
	/* the lowest member id counts arrivals: every worker picks the same */
	{
		int i, best = -1;
		pthread_mutex_lock(&cl->lock);
		for (i = 0; i < cl->nservers; i++)
			if (cl->conns[i].ep && (best < 0 || cl->conns[i].member_id < cl->conns[best].member_id))
				best = i;
		pthread_mutex_unlock(&cl->lock);
		to[best < 0 ? 0 : best] = true;
	}
	ret = ctrl_call(cl, RPS__MSG_BARRIER, &b, sizeof(b), to, 0, NULL, NULL);
	free(to);
	if (ret == -EINVAL)
		rps__seterr(ret, "rps_barrier: the workers already waiting in this barrier were connected with "
			    "another num_workers than this one's %d: give every worker the same", cl->num_workers);
	return ret;
}

RPS_EXPORT const char *rps_last_error(void)
{
	return rps__errbuf();
}

/* ---- internal hooks for psperf and tests (client.h) ------------------------ */

static int lock_op(rps_tensor_t *t, uint32_t shard, enum op_kind kind)
{
	struct rps_client *cl;
	struct rps_request *r;
	struct shard_op *op;

	if (!t || shard >= t->layout.nshards)
		return rps__seterr(-EINVAL, "shard %u: no such shard", shard);
	if (t->spec.mode == RPS_MODE_SYNC)
		return rps__seterr(-EINVAL, "tensor '%s': sync tensors have no shard lock", t->name);
	if (kind == OP_UNLOCK && !t->lock_held[shard])
		return rps__seterr(-EINVAL, "shard %u: not locked by us", shard);
	cl = t->cl;
	r = req_new(cl, 1);
	if (!r)
		return rps__seterr(-ENOMEM, "out of memory");
	r->kind = REQ_SHARDS;
	op = op_init(&r->ops[0], r, t, kind, shard);
	op->held = t->lock_held[shard];
	return submit_and_wait(cl, r, NULL);
}

int rps__tensor_lock(rps_tensor_t *t, uint32_t shard)
{
	return lock_op(t, shard, OP_LOCK);
}

int rps__tensor_unlock(rps_tensor_t *t, uint32_t shard)
{
	return lock_op(t, shard, OP_UNLOCK);
}

const char *rps__client_fabric_name(const rps_client_t *cl)
{
	return rps__fabric_name(cl->fab);
}

uint32_t rps__client_shard_bytes(const rps_client_t *cl)
{
	return cl->shard_elems * 4u;
}
