/*
 * server.c - the parameter server core (see server.h).
 *
 * One thread polls one completion queue for every worker connection.  What
 * arrives:
 *  - control messages (SEND) in pre-posted receive buffers: HELLO, CREATE,
 *    WAIT, BARRIER;
 *  - pushes: a WRITE_WITH_IMM that put a descriptor and gradient data into a
 *    staging slot of the connection; the immediate names the slot.
 * A push is consumed when its consistency mode allows it (sync: in rank
 * order within a step, so sums are bit-identical whatever the arrival
 * order; async/bounded: under the shard lock the worker holds) and is held
 * in its slot until then.  A slot is the worker's own, so the worker's
 * back-pressure is its slot count and staging memory is bounded by
 * connections x slots x slot size, whatever the model size.
 *
 * Shard parameters are published with a seqlock (hdr->seq odd while written)
 * so workers can READ them one-sidedly and detect a torn read.  The lock word
 * is never stored by this CPU: a lease that expired, or the lock of a worker
 * that disconnected, is broken with rps__local_cas (through the HCA).
 */
#include "config.h"
#include "server.h"
#include "agg.h"
#include "common.h"
#include "optim.h"
#include "proto.h"
#include "shard.h"
#include "topo.h"
#include "transport.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "rdmaps.h"

#define CTRL_CREDITS 32u	/* control requests a worker may have outstanding */
#define WRID_RECV 1u
#define WRID_SEND 2u

struct conn;

/* A push that arrived but may not be consumed yet. */
struct held {
	struct conn *conn;
	uint32_t slot;
};

/*
 * A sync push that arrived before its turn (an earlier rank's push of its
 * step, or the step itself, is not in yet), copied out of its slot so the
 * slot can be acknowledged and reused.  Without this, a worker whose slots
 * all hold out-of-turn pushes could wait on another worker that waits on it
 * (two workers pushing tensors in different orders).  Bounded by
 * park_limit (and the memory limit); past that, pushes wait in their slots.
 */
struct parked {
	struct tensor *t;
	uint32_t local;
	uint64_t clock;
	int rank;
	void *data;		/* the gradient, in the tensor's dtype */
	size_t nbytes;
};

struct waiter {
	struct conn *conn;
	uint64_t req_id;
	uint32_t tensor_id;
	uint32_t local;		/* local shard index */
	uint64_t min_version;
	uint64_t min_clock;
};

struct shard {
	struct rps__shard_hdr *hdr;
	float *params;
	uint32_t index;		/* global shard index */
	uint32_t elems;
	bool ready;		/* initial values in place */
	struct conn *init_conn;	/* who must send them */
	float *state;		/* optimizer state */
	float *acc;		/* sync: this step's sum so far */
	float *scratch;		/* gradients converted to fp32 */
	uint64_t step;		/* updates applied == published version */
	int next_rank;		/* sync: whose contribution comes next */
	uint64_t *clocks;	/* bounded: pushes applied per rank */
	uint64_t lease_word;	/* lock word seen by the lease scan ... */
	uint64_t lease_since;	/* ... since this time (ns) */
};

struct tensor {
	char name[RPS__NAME_MAX];
	uint32_t id;
	struct rps__tensor_spec spec;
	struct rps__layout layout;
	struct rps__optim optim;
	uint32_t nlocal;
	size_t stride;
	void *region;
	size_t region_len;
	size_t mem_charged;
	struct rps__mr *mr;
	struct shard *shards;
};

struct conn {
	struct rps__server *srv;
	struct rps__ep *ep;
	bool hello_done;
	bool dead;
	int rank;
	int num_workers;
	uint32_t owner;
	/* staging slots */
	char *slots;
	struct rps__mr *slots_mr;
	uint8_t *slot_state;	/* 0 free, 1 held */
	/* control buffers */
	char *rbufs;
	struct rps__mr *rbufs_mr;
	uint32_t nrecv;
	char *sbufs;
	struct rps__mr *sbufs_mr;
	uint32_t nsend;
	uint32_t *sfree;
	uint32_t nsfree;
};

struct rps__server {
	struct rps__server_config cfg;
	struct rps__uri *cluster;
	int ncluster;
	int index;
	uint32_t shard_elems;
	size_t slot_size;
	struct rps__fabric *fab;
	struct rps__cq *cq;
	struct rps__listener *listener;
	struct rps__topo *topo;		/* hwloc: where memory and the serving thread go */
	struct rps__placement place;
	int stop_fd;
	struct conn **conns;
	uint32_t nconns;
	struct tensor **tensors;
	uint32_t ntensors;
	struct held *held;
	uint32_t nheld, held_cap;
	struct parked *parked;
	uint32_t nparked, parked_cap;
	size_t parked_bytes;
	struct waiter *waiters;
	uint32_t nwaiters, waiters_cap;
	/* barrier */
	struct {
		struct conn **conn;
		uint64_t *req_id;
		uint32_t n, cap;
		int need;
	} barrier;
	size_t mem_used;
	uint8_t owner_used[RPS__LOCK_OWNER_MAX + 1];
	uint32_t next_owner;
	uint64_t next_lease_scan;
};

void rps__server_config_init(struct rps__server_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->listen.kind = RPS__KIND_TCP;
	strcpy(cfg->listen.host, "127.0.0.1");
	cfg->listen.port = 7000;
	cfg->index = -1;
	cfg->shard_bytes = 1u << 20;
	cfg->nslots = 8;
	cfg->lease_ms = 5000;
	cfg->max_conns = 64;
	cfg->numa_node = -1;
	cfg->park_limit = 256u << 20;
}

/* ---- memory accounting ------------------------------------------------ */

static int mem_take(struct rps__server *srv, size_t bytes, const char *what)
{
	if (srv->cfg.mem_limit && srv->mem_used + bytes > srv->cfg.mem_limit)
		return rps__seterr(-ENOMEM, "%s: %zu bytes would exceed the memory limit (%zu of %zu used): raise rdmapsd --memory-limit",
				   what, bytes, srv->mem_used, srv->cfg.mem_limit);
	srv->mem_used += bytes;
	return 0;
}

static void mem_give(struct rps__server *srv, size_t bytes)
{
	srv->mem_used -= bytes;
}

/* Where shards, staging slots and the serving thread go: near the HCA
 * (verbs), or the whole machine (tcp), unless --numa-node/--cpus/--no-pin. */
static int place_server(const struct rps__server_config *cfg, struct rps__fabric *fab,
			struct rps__topo **topo, struct rps__placement *place)
{
	struct rps__topo_opts to = { .xml_path = cfg->topology, .log = 1 };
	struct rps__topo_overrides ov = { .numa_node = cfg->numa_node, .cpus = cfg->cpus, .no_pin = cfg->no_pin };
	const char *dev = cfg->listen.kind == RPS__KIND_VERBS ? rps__fabric_name(fab) : NULL;
	int ret;

	ret = rps__topo_open(&to, topo);
	if (ret)
		return ret;
	ret = rps__topo_place(*topo, dev, &ov, place);
	if (ret) {
		rps__topo_close(*topo);
		*topo = NULL;
	}
	return ret;
}

/* ---- sending replies -------------------------------------------------- */

static char *sbuf(struct conn *c, uint32_t i)
{
	return c->sbufs + (size_t)i * RPS__MSG_MAX;
}

static char *rbuf(struct conn *c, uint32_t i)
{
	return c->rbufs + (size_t)i * RPS__MSG_MAX;
}

static void conn_fail(struct conn *c, const char *why)
{
	if (!c->dead)
		rps__log(RPS__LOG_INFO, "worker %s (rank %d): %s", rps__ep_peer(c->ep), c->rank, why);
	c->dead = true;
}

static void conn_reply(struct conn *c, unsigned type, uint64_t req_id, int32_t status,
		       const void *body, size_t len)
{
	struct rps__wr wr;
	uint32_t i;
	int ret;

	if (c->dead)
		return;
	if (!c->nsfree) {
		conn_fail(c, "exceeded its control credits");
		return;
	}
	i = c->sfree[--c->nsfree];
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = ((uint64_t)WRID_SEND << 32) | i;
	wr.op = RPS__OP_SEND;
	wr.flags = RPS__WR_SIGNALED;
	wr.sge.addr = sbuf(c, i);
	wr.sge.len = (uint32_t)rps__msg_build(wr.sge.addr, type, req_id, status, body, body ? len : 0);
	wr.sge.mr = c->sbufs_mr;
	ret = rps__post(c->ep, &wr, 1);
	if (ret) {
		c->sfree[c->nsfree++] = i;
		conn_fail(c, rps__errbuf());
	}
}

/* ---- publishing -------------------------------------------------------- */

/* Seqlock writer: readers that see an odd or changed seq retry. */
static void publish_begin(struct shard *s)
{
	__atomic_store_n(&s->hdr->seq, s->step * 2 + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
}

static void publish_end(struct shard *s)
{
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&s->hdr->seq, s->step * 2, __ATOMIC_RELEASE);
}

static struct tensor *tensor_by_id(struct rps__server *srv, uint32_t id)
{
	return id < srv->ntensors ? srv->tensors[id] : NULL;
}

static void wake_waiters(struct rps__server *srv, struct tensor *t, uint32_t local)
{
	struct shard *s = &t->shards[local];
	uint32_t i = 0;

	while (i < srv->nwaiters) {
		struct waiter *w = &srv->waiters[i];
		if (w->tensor_id == t->id && w->local == local &&
		    s->ready && s->step >= w->min_version && s->hdr->min_clock >= w->min_clock) {
			struct rps__wait_rep rep = { .version = s->step, .min_clock = s->hdr->min_clock };
			conn_reply(w->conn, RPS__MSG_WAIT_REP, w->req_id, 0, &rep, sizeof(rep));
			*w = srv->waiters[--srv->nwaiters];
			continue;
		}
		i++;
	}
}

/* Apply one fp32 gradient to the shard and publish version step+1. */
static void shard_update(struct tensor *t, struct shard *s, const float *g)
{
	publish_begin(s);
	s->step++;
	rps__optim_apply(&t->optim, s->params, g, s->state, s->elems, s->step);
	publish_end(s);
}

/* ---- consuming pushes ------------------------------------------------- */

/*
 * Sync mode: add rank's gradient for step `clock` to the shard's sum if it
 * is its turn (fixed summation order: rank 0's, + rank 1's, + ..., so the
 * sum is bit-identical whatever the arrival order), and apply the step when
 * the last rank is in.  0 taken, -EAGAIN not its turn yet, -EALREADY the
 * step already has it.
 */
static int sync_take(struct rps__server *srv, struct tensor *t, uint32_t local, uint64_t clock,
		     int rank, const void *data)
{
	struct shard *s = &t->shards[local];

	if (clock < s->step || (clock == s->step && rank < s->next_rank))
		return -EALREADY;
	if (!s->ready || clock > s->step || rank != s->next_rank)
		return -EAGAIN;
	if (s->next_rank == 0)
		rps__agg_copy(s->acc, data, t->spec.dtype, s->elems);
	else
		rps__agg_add(s->acc, data, t->spec.dtype, s->elems);
	s->next_rank++;
	if (s->next_rank == t->spec.num_workers) {
		s->next_rank = 0;
		shard_update(t, s, s->acc);
		wake_waiters(srv, t, local);
	}
	return 0;
}

enum consume_result { CONSUMED, NOT_YET };

/* Release the lock word w (0: none held) on the worker's behalf, through
 * the transport's atomic path; returns the new word for the ack.  The
 * version moves on with every release, so a word never comes back. */
static uint64_t release_lock(struct rps__server *srv, struct tensor *t, struct shard *s, uint64_t w)
{
	uint64_t next, old = 0;

	if (!w)
		return 0;
	next = rps__lock_unlocked(rps__lock_version(w) + 1);
	if (rps__local_cas(srv->fab, t->mr, &s->hdr->lock, w, next, &old)) {
		rps__log(RPS__LOG_ERROR, "releasing lock of %s shard %u: %s", t->name, s->index, rps__errbuf());
		return 0;
	}
	return old == w ? next : old;
}

static struct rps__push_desc *slot_desc(struct conn *c, uint32_t slot)
{
	return (struct rps__push_desc *)(c->slots + (size_t)slot * c->srv->slot_size);
}

static void push_ack(struct conn *c, uint32_t slot, int status, uint64_t version, uint64_t lock)
{
	struct rps__push_desc *d = slot_desc(c, slot);
	struct rps__push_ack ack = {
		.slot = slot, .shard = d->shard, .version = version, .lock = lock,
	};

	c->slot_state[slot] = 0;
	conn_reply(c, RPS__MSG_PUSH_ACK, d->push_id, status, &ack, sizeof(ack));
}

static const float *grad_fp32(struct shard *s, const struct rps__push_desc *d)
{
	const void *data = (const char *)d + RPS__PUSH_DESC_SIZE;

	if (d->dtype == RPS_DTYPE_F32)
		return data;
	rps__agg_copy(s->scratch, data, (enum rps_dtype)d->dtype, s->elems);
	return s->scratch;
}

static void update_min_clock(struct tensor *t, struct shard *s)
{
	uint64_t m = UINT64_MAX;
	int r;

	for (r = 0; r < t->spec.num_workers; r++)
		m = RPS__MIN(m, s->clocks[r]);
	__atomic_store_n(&s->hdr->min_clock, m, __ATOMIC_RELEASE);
}

/*
 * Decide what to do with the push in (c, slot).  Every path that does not
 * return NOT_YET acknowledges the push and frees the slot: a push is applied
 * once or refused, never silently dropped.
 */
static enum consume_result consume(struct rps__server *srv, struct conn *c, uint32_t slot)
{
	struct rps__push_desc *d = slot_desc(c, slot);
	struct tensor *t = tensor_by_id(srv, d->tensor_id);
	const void *data = (const char *)d + RPS__PUSH_DESC_SIZE;
	uint64_t holds = 0;
	struct shard *s;
	uint32_t local;

	if (!t) {
		push_ack(c, slot, -ENOENT, 0, 0);
		return CONSUMED;
	}
	if (d->shard >= t->layout.nshards || rps__shard_server(&t->layout, d->shard) != (uint32_t)srv->index) {
		push_ack(c, slot, -EINVAL, 0, 0);
		return CONSUMED;
	}
	local = rps__shard_local_index(&t->layout, d->shard);
	s = &t->shards[local];

	if (d->kind == RPS__PUSH_INIT) {
		if (s->ready || s->init_conn != c) {
			push_ack(c, slot, -EALREADY, s->step, 0);
			return CONSUMED;
		}
		if (d->nbytes != (uint64_t)s->elems * 4u) {
			push_ack(c, slot, -EMSGSIZE, 0, 0);
			return CONSUMED;
		}
		publish_begin(s);
		memcpy(s->params, data, d->nbytes);
		s->ready = true;
		s->init_conn = NULL;
		publish_end(s);
		push_ack(c, slot, 0, s->step, 0);
		wake_waiters(srv, t, local);
		return CONSUMED;
	}

	/* async and bounded: the worker must hold the shard lock it names; the
	 * server releases it once the push is decided (the worker does not
	 * have to come back for that: a push is one round trip). */
	if (t->spec.mode != RPS_MODE_SYNC) {
		uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);
		if (w != d->lock || !rps__lock_is_locked(w) || rps__lock_owner(w) != c->owner) {
			push_ack(c, slot, RPS_ELEASE, s->step, d->lock);
			return CONSUMED;
		}
		holds = w;
	}
	if (d->dtype != t->spec.dtype || d->nbytes != (uint64_t)s->elems * rps__dtype_size(t->spec.dtype)) {
		push_ack(c, slot, -EMSGSIZE, 0, release_lock(srv, t, s, holds));
		return CONSUMED;
	}
	if ((t->spec.mode != RPS_MODE_ASYNC) && (d->rank < 0 || d->rank >= t->spec.num_workers || d->rank != c->rank)) {
		push_ack(c, slot, -EINVAL, 0, release_lock(srv, t, s, holds));
		return CONSUMED;
	}
	if (!s->ready)
		return NOT_YET;

	if (t->spec.mode == RPS_MODE_SYNC) {
		uint64_t step = s->step;
		int ret = sync_take(srv, t, local, d->clock, d->rank, data);
		if (ret == -EAGAIN)
			return NOT_YET;
		push_ack(c, slot, ret, step, 0);
		return CONSUMED;
	}

	/* async and bounded: applied alone, under the lock the worker holds */
	shard_update(t, s, grad_fp32(s, d));
	if (t->spec.mode == RPS_MODE_BOUNDED) {
		if (d->clock + 1 > s->clocks[d->rank])
			s->clocks[d->rank] = d->clock + 1;
		update_min_clock(t, s);
	}
	push_ack(c, slot, 0, s->step, release_lock(srv, t, s, holds));
	wake_waiters(srv, t, local);
	return CONSUMED;
}

static int held_add(struct rps__server *srv, struct conn *c, uint32_t slot)
{
	if (srv->nheld == srv->held_cap) {
		uint32_t cap = srv->held_cap ? srv->held_cap * 2 : 64;
		struct held *h = realloc(srv->held, cap * sizeof(*h));
		if (!h)
			return -ENOMEM;
		srv->held = h;
		srv->held_cap = cap;
	}
	srv->held[srv->nheld].conn = c;
	srv->held[srv->nheld].slot = slot;
	srv->nheld++;
	c->slot_state[slot] = 1;
	return 0;
}

/* Consume held pushes until none can move.  Held pushes are few (at most
 * connections x slots), so a rescan is cheap. */
static void drain_held(struct rps__server *srv)
{
	bool progress = true;

	while (progress) {
		uint32_t i = 0;
		progress = false;
		while (i < srv->nparked) {
			struct parked *p = &srv->parked[i];
			if (sync_take(srv, p->t, p->local, p->clock, p->rank, p->data) == -EAGAIN) {
				i++;
				continue;
			}
			/* taken: its acknowledgement went out when it was parked */
			free(p->data);
			mem_give(srv, p->nbytes);
			srv->parked_bytes -= p->nbytes;
			*p = srv->parked[--srv->nparked];
			progress = true;
		}
		i = 0;
		while (i < srv->nheld) {
			struct held h = srv->held[i];
			if (!h.conn->dead && consume(srv, h.conn, h.slot) == NOT_YET) {
				i++;
				continue;
			}
			memmove(&srv->held[i], &srv->held[i + 1], (srv->nheld - i - 1) * sizeof(*srv->held));
			srv->nheld--;
			progress = true;
		}
	}
}

/* Copy an out-of-turn sync push out of its slot and acknowledge it (see
 * struct parked).  -ENOSPC when it is not a sync push or over the budget:
 * the push then waits in its slot. */
static int park(struct rps__server *srv, struct conn *c, uint32_t slot)
{
	struct rps__push_desc *d = slot_desc(c, slot);
	struct tensor *t = tensor_by_id(srv, d->tensor_id);
	struct parked *p;

	if (!t || t->spec.mode != RPS_MODE_SYNC || d->kind != RPS__PUSH_GRAD ||
	    srv->parked_bytes + d->nbytes > srv->cfg.park_limit)
		return -ENOSPC;
	if (srv->nparked == srv->parked_cap) {
		uint32_t cap = srv->parked_cap ? srv->parked_cap * 2 : 64;
		struct parked *grown = realloc(srv->parked, cap * sizeof(*grown));
		if (!grown)
			return -ENOSPC;
		srv->parked = grown;
		srv->parked_cap = cap;
	}
	if (mem_take(srv, d->nbytes, "parking a push"))
		return -ENOSPC;
	p = &srv->parked[srv->nparked];
	p->data = malloc(d->nbytes ? d->nbytes : 1);
	if (!p->data) {
		mem_give(srv, d->nbytes);
		return -ENOSPC;
	}
	memcpy(p->data, (char *)d + RPS__PUSH_DESC_SIZE, d->nbytes);
	p->t = t;
	p->local = rps__shard_local_index(&t->layout, d->shard);
	p->clock = d->clock;
	p->rank = d->rank;
	p->nbytes = d->nbytes;
	srv->nparked++;
	srv->parked_bytes += d->nbytes;
	push_ack(c, slot, 0, t->shards[p->local].step, 0);
	return 0;
}

static void on_push(struct rps__server *srv, struct conn *c, uint32_t slot)
{
	struct rps__push_desc *d;
	int ret;

	if (!c->hello_done || slot >= srv->cfg.nslots) {
		conn_fail(c, "sent a push to a slot it does not own");
		return;
	}
	if (c->slot_state[slot]) {
		conn_fail(c, "pushed into a slot that is still in use");
		return;
	}
	d = slot_desc(c, slot);
	ret = rps__desc_check(d, srv->slot_size);
	if (ret) {
		rps__log(RPS__LOG_WARN, "worker %s: %s", rps__ep_peer(c->ep), rps__errbuf());
		push_ack(c, slot, ret, 0, 0);
		return;
	}
	if (consume(srv, c, slot) == CONSUMED) {
		drain_held(srv);
		return;
	}
	if (park(srv, c, slot) == 0)
		return;
	if (held_add(srv, c, slot))
		conn_fail(c, "out of memory holding a push");
}

/* ---- control messages ---------------------------------------------------- */

static bool spec_equal(const struct rps__tensor_spec *a, const struct rps__tensor_spec *b)
{
	return a->count == b->count && a->dtype == b->dtype && a->mode == b->mode &&
	       a->staleness == b->staleness && a->optimizer == b->optimizer &&
	       a->lr == b->lr && a->momentum == b->momentum && a->beta1 == b->beta1 &&
	       a->beta2 == b->beta2 && a->eps == b->eps && a->weight_decay == b->weight_decay &&
	       a->rescale == b->rescale && a->num_workers == b->num_workers &&
	       (a->flags & RPS__CREATE_HAS_INIT) == (b->flags & RPS__CREATE_HAS_INIT);
}

static void tensor_free(struct rps__server *srv, struct tensor *t)
{
	uint32_t j;

	if (!t)
		return;
	for (j = 0; t->shards && j < t->nlocal; j++) {
		free(t->shards[j].state);
		free(t->shards[j].acc);
		free(t->shards[j].scratch);
		free(t->shards[j].clocks);
	}
	free(t->shards);
	rps__mr_dereg(t->mr);
	rps__topo_free(srv->topo, t->region, t->region_len);
	mem_give(srv, t->mem_charged);
	free(t);
}

static int tensor_new(struct rps__server *srv, const struct rps__create *req, struct conn *c,
		      struct tensor **out)
{
	const struct rps__tensor_spec *sp = &req->spec;
	struct tensor *t;
	size_t per_elem;
	uint32_t j;
	int ret;

	if (sp->dtype < RPS_DTYPE_F32 || sp->dtype > RPS_DTYPE_F16)
		return rps__seterr(-EINVAL, "tensor '%s': unknown dtype %u", req->name, sp->dtype);
	if (sp->mode < RPS_MODE_SYNC || sp->mode > RPS_MODE_ASYNC)
		return rps__seterr(-EINVAL, "tensor '%s': unknown consistency mode %u", req->name, sp->mode);
	if (sp->mode != RPS_MODE_ASYNC && (sp->num_workers < 1 || sp->num_workers > 4096))
		return rps__seterr(-EINVAL, "tensor '%s': sync and bounded modes need num_workers in 1..4096 (got %d)",
				   req->name, sp->num_workers);
	t = calloc(1, sizeof(*t));
	if (!t)
		return rps__seterr(-ENOMEM, "out of memory");
	memcpy(t->name, req->name, sizeof(t->name));
	t->spec = *sp;
	t->optim = (struct rps__optim){
		.type = (enum rps_optimizer)sp->optimizer, .lr = sp->lr, .momentum = sp->momentum,
		.beta1 = sp->beta1, .beta2 = sp->beta2, .eps = sp->eps,
		.weight_decay = sp->weight_decay, .rescale = sp->rescale,
	};
	ret = rps__optim_validate(&t->optim);
	if (ret) {
		rps__preerr(ret, "tensor '%s'", req->name);
		goto err_free;
	}
	ret = rps__layout_init(&t->layout, req->name, sp->count, srv->shard_elems, (uint32_t)srv->ncluster);
	if (ret)
		goto err_free;
	t->nlocal = rps__server_nshards(&t->layout, (uint32_t)srv->index);
	t->stride = rps__shard_stride(srv->shard_elems);
	t->region_len = RPS__MAX(t->stride * t->nlocal, (size_t)64);
	/* optimizer state, the sync accumulator and conversion scratch: fp32 each */
	per_elem = 4u * (rps__optim_state_len(t->optim.type, 1) + (sp->mode == RPS_MODE_SYNC) +
			 (sp->dtype != RPS_DTYPE_F32));
	ret = mem_take(srv, t->region_len + per_elem * (size_t)t->nlocal * srv->shard_elems, req->name);
	if (ret)
		goto err_free;
	t->mem_charged = t->region_len + per_elem * (size_t)t->nlocal * srv->shard_elems;
	t->region = rps__topo_alloc(srv->topo, &srv->place, t->region_len);
	t->shards = calloc(t->nlocal ? t->nlocal : 1, sizeof(*t->shards));
	if (!t->region || !t->shards)
		goto err_nomem;
	for (j = 0; j < t->nlocal; j++) {
		struct shard *s = &t->shards[j];
		size_t n;
		s->index = rps__server_shard(&t->layout, (uint32_t)srv->index, j);
		s->elems = rps__shard_elems(&t->layout, s->index);
		s->hdr = (struct rps__shard_hdr *)((char *)t->region + j * t->stride);
		s->params = (float *)((char *)s->hdr + RPS__SHARD_HDR_SIZE);
		s->hdr->shard = s->index;
		s->hdr->elems = s->elems;
		s->ready = !(sp->flags & RPS__CREATE_HAS_INIT);
		s->init_conn = s->ready ? NULL : c;
		s->hdr->seq = s->ready ? 0 : 1;	/* odd: not readable until INIT */
		n = rps__optim_state_len(t->optim.type, s->elems);
		if (n && !(s->state = calloc(n, sizeof(float))))
			goto err_nomem;
		if (sp->mode == RPS_MODE_SYNC && !(s->acc = calloc(s->elems, sizeof(float))))
			goto err_nomem;
		if (sp->dtype != RPS_DTYPE_F32 && !(s->scratch = calloc(s->elems, sizeof(float))))
			goto err_nomem;
		if (sp->mode == RPS_MODE_BOUNDED &&
		    !(s->clocks = calloc((size_t)sp->num_workers, sizeof(uint64_t))))
			goto err_nomem;
	}
	ret = rps__mr_reg(srv->fab, t->region, t->region_len,
			  RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC, &t->mr);
	if (ret)
		goto err_free;
	*out = t;
	return 0;
err_nomem:
	ret = rps__seterr(-ENOMEM, "tensor '%s': out of memory for %llu elements", req->name,
			  (unsigned long long)sp->count);
err_free:
	tensor_free(srv, t);
	return ret;
}

static struct tensor *tensor_by_name(struct rps__server *srv, const char *name)
{
	uint32_t i;

	for (i = 0; i < srv->ntensors; i++)
		if (srv->tensors[i] && !strcmp(srv->tensors[i]->name, name))
			return srv->tensors[i];
	return NULL;
}

static void create_reply(struct conn *c, uint64_t req_id, struct tensor *t, bool created)
{
	struct rps__create_rep rep;

	memset(&rep, 0, sizeof(rep));
	rep.spec = t->spec;
	rep.tensor_id = t->id;
	rep.created = created;
	rep.region_addr = (uint64_t)(uintptr_t)t->region;
	rep.region_rkey = rps__mr_rkey(t->mr);
	rep.nlocal = t->nlocal;
	rep.stride = t->stride;
	conn_reply(c, RPS__MSG_CREATE_REP, req_id, 0, &rep, sizeof(rep));
}

static void on_create(struct rps__server *srv, struct conn *c, uint64_t req_id,
		      const struct rps__create *req)
{
	struct tensor *t = tensor_by_name(srv, req->name), **grown;
	int ret;

	if (t) {
		if (!(req->flags & RPS__CREATE_OPEN_ONLY) && !spec_equal(&t->spec, &req->spec)) {
			rps__log(RPS__LOG_WARN, "worker %s: tensor '%s' exists with different options",
				 rps__ep_peer(c->ep), req->name);
			conn_reply(c, RPS__MSG_CREATE_REP, req_id, -EEXIST, NULL, 0);
			return;
		}
		create_reply(c, req_id, t, false);
		return;
	}
	if (req->flags & RPS__CREATE_OPEN_ONLY) {
		conn_reply(c, RPS__MSG_CREATE_REP, req_id, -ENOENT, NULL, 0);
		return;
	}
	grown = realloc(srv->tensors, (srv->ntensors + 1) * sizeof(*srv->tensors));
	if (!grown) {
		conn_reply(c, RPS__MSG_CREATE_REP, req_id, -ENOMEM, NULL, 0);
		return;
	}
	srv->tensors = grown;
	ret = tensor_new(srv, req, c, &t);
	if (ret) {
		rps__log(RPS__LOG_WARN, "create from %s: %s", rps__ep_peer(c->ep), rps__errbuf());
		conn_reply(c, RPS__MSG_CREATE_REP, req_id, ret, NULL, 0);
		return;
	}
	t->id = srv->ntensors;
	srv->tensors[srv->ntensors++] = t;
	rps__log(RPS__LOG_INFO, "tensor '%s': %llu elements, %u of %u shards here", t->name,
		 (unsigned long long)t->spec.count, t->nlocal, t->layout.nshards);
	create_reply(c, req_id, t, true);
}

static void on_hello(struct rps__server *srv, struct conn *c, uint64_t req_id, const struct rps__hello *h)
{
	struct rps__hello_rep rep;

	if (h->version != RPS__PROTO_VERSION) {
		conn_reply(c, RPS__MSG_HELLO_REP, req_id, -EPROTO, NULL, 0);
		return;
	}
	if (h->nservers != (uint32_t)srv->ncluster || h->server_index != (uint32_t)srv->index) {
		rps__log(RPS__LOG_WARN, "worker %s lists this server as %u of %u; the cluster list says %d of %d",
			 rps__ep_peer(c->ep), h->server_index, h->nservers, srv->index, srv->ncluster);
		conn_reply(c, RPS__MSG_HELLO_REP, req_id, -EXDEV, NULL, 0);
		return;
	}
	c->rank = h->rank;
	c->num_workers = h->num_workers;
	c->hello_done = true;
	memset(&rep, 0, sizeof(rep));
	rep.magic = RPS__HELLO_MAGIC;
	rep.version = RPS__PROTO_VERSION;
	rep.server_index = (uint32_t)srv->index;
	rep.nservers = (uint32_t)srv->ncluster;
	rep.shard_elems = srv->shard_elems;
	rep.nslots = srv->cfg.nslots;
	rep.slot_size = (uint32_t)srv->slot_size;
	rep.slot_addr = (uint64_t)(uintptr_t)c->slots;
	rep.slot_rkey = rps__mr_rkey(c->slots_mr);
	rep.owner = c->owner;
	rep.lease_ms = srv->cfg.lease_ms;
	conn_reply(c, RPS__MSG_HELLO_REP, req_id, 0, &rep, sizeof(rep));
}

static void on_wait(struct rps__server *srv, struct conn *c, uint64_t req_id, const struct rps__wait *w)
{
	struct tensor *t = tensor_by_id(srv, w->tensor_id);
	struct waiter *nw;
	uint32_t local;

	if (!t || w->shard >= t->layout.nshards || rps__shard_server(&t->layout, w->shard) != (uint32_t)srv->index) {
		conn_reply(c, RPS__MSG_WAIT_REP, req_id, -EINVAL, NULL, 0);
		return;
	}
	local = rps__shard_local_index(&t->layout, w->shard);
	if (srv->nwaiters == srv->waiters_cap) {
		uint32_t cap = srv->waiters_cap ? srv->waiters_cap * 2 : 64;
		nw = realloc(srv->waiters, cap * sizeof(*nw));
		if (!nw) {
			conn_reply(c, RPS__MSG_WAIT_REP, req_id, -ENOMEM, NULL, 0);
			return;
		}
		srv->waiters = nw;
		srv->waiters_cap = cap;
	}
	srv->waiters[srv->nwaiters++] = (struct waiter){
		.conn = c, .req_id = req_id, .tensor_id = t->id, .local = local,
		.min_version = w->min_version, .min_clock = w->min_clock,
	};
	wake_waiters(srv, t, local);
}

static void on_barrier(struct rps__server *srv, struct conn *c, uint64_t req_id)
{
	uint32_t i;

	if (c->num_workers < 1) {
		conn_reply(c, RPS__MSG_BARRIER_REP, req_id, -EINVAL, NULL, 0);
		return;
	}
	if (srv->barrier.n == srv->barrier.cap) {
		uint32_t cap = srv->barrier.cap ? srv->barrier.cap * 2 : 16;
		struct conn **nc = realloc(srv->barrier.conn, cap * sizeof(*nc));
		uint64_t *nr;
		if (nc)
			srv->barrier.conn = nc;
		nr = nc ? realloc(srv->barrier.req_id, cap * sizeof(*nr)) : NULL;
		if (!nr) {
			conn_reply(c, RPS__MSG_BARRIER_REP, req_id, -ENOMEM, NULL, 0);
			return;
		}
		srv->barrier.req_id = nr;
		srv->barrier.cap = cap;
	}
	srv->barrier.conn[srv->barrier.n] = c;
	srv->barrier.req_id[srv->barrier.n] = req_id;
	srv->barrier.n++;
	srv->barrier.need = c->num_workers;
	if ((int)srv->barrier.n < srv->barrier.need)
		return;
	for (i = 0; i < srv->barrier.n; i++)
		conn_reply(srv->barrier.conn[i], RPS__MSG_BARRIER_REP, srv->barrier.req_id[i], 0, NULL, 0);
	srv->barrier.n = 0;
}

static void on_message(struct rps__server *srv, struct conn *c, void *buf, uint32_t len)
{
	struct rps__msg_hdr h;
	void *body = rps__msg_body(buf);
	int ret;

	ret = rps__msg_check(buf, len);
	if (ret) {
		/* A peer that sends garbage is not trusted with more: drop it. */
		rps__log(RPS__LOG_WARN, "worker %s: %s", rps__ep_peer(c->ep), rps__errbuf());
		conn_fail(c, "sent a malformed message");
		return;
	}
	memcpy(&h, buf, sizeof(h));
	if (!c->hello_done && h.type != RPS__MSG_HELLO) {
		conn_fail(c, "sent a request before HELLO");
		return;
	}
	switch (h.type) {
	case RPS__MSG_HELLO:
		on_hello(srv, c, h.req_id, body);
		break;
	case RPS__MSG_CREATE:
		on_create(srv, c, h.req_id, body);
		break;
	case RPS__MSG_WAIT:
		on_wait(srv, c, h.req_id, body);
		break;
	case RPS__MSG_BARRIER:
		on_barrier(srv, c, h.req_id);
		break;
	default:
		conn_fail(c, "sent a message type servers do not take");
		break;
	}
}

/* ---- locks ------------------------------------------------------------ */

/* Break a lock on behalf of a holder that is gone or past its lease.  The
 * version moves on as with every release: a holder that is merely slow,
 * and whose connection then takes the same shard's lock again, gets a new
 * word, so its stale push (naming the old word) can never pass the check. */
static void break_lock(struct rps__server *srv, struct tensor *t, struct shard *s, uint64_t w,
		       const char *why)
{
	/* release_lock() returns the word it left, or what it found instead */
	if (release_lock(srv, t, s, w) == rps__lock_unlocked(rps__lock_version(w) + 1))
		rps__log(RPS__LOG_INFO, "tensor '%s' shard %u: broke lock of owner %u (%s)", t->name,
			 s->index, rps__lock_owner(w), why);
}

static void scan_locks(struct rps__server *srv, uint32_t dead_owner)
{
	uint64_t now = rps__now_ns(), lease = (uint64_t)srv->cfg.lease_ms * 1000000ull;
	uint32_t i, j;

	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *t = srv->tensors[i];
		if (!t || t->spec.mode == RPS_MODE_SYNC)
			continue;
		for (j = 0; j < t->nlocal; j++) {
			struct shard *s = &t->shards[j];
			uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);
			if (!rps__lock_is_locked(w)) {
				s->lease_word = 0;
				continue;
			}
			if (dead_owner) {
				if (rps__lock_owner(w) == dead_owner)
					break_lock(srv, t, s, w, "its worker disconnected");
				continue;
			}
			if (w != s->lease_word) {
				s->lease_word = w;
				s->lease_since = now;
			} else if (now - s->lease_since >= lease) {
				break_lock(srv, t, s, w, "lease expired");
				s->lease_word = 0;
			}
		}
	}
}

/* ---- connections ------------------------------------------------------- */

static int post_recv_buf(struct conn *c, uint32_t i)
{
	struct rps__sge sge = { .addr = rbuf(c, i), .len = RPS__MSG_MAX, .mr = c->rbufs_mr };

	return rps__post_recv(c->ep, &sge, ((uint64_t)WRID_RECV << 32) | i);
}

static void conn_free(struct rps__server *srv, struct conn *c)
{
	rps__ep_close(c->ep);
	rps__mr_dereg(c->slots_mr);
	rps__mr_dereg(c->rbufs_mr);
	rps__mr_dereg(c->sbufs_mr);
	rps__topo_free(srv->topo, c->slots, (size_t)srv->cfg.nslots * srv->slot_size);
	rps__topo_free(srv->topo, c->rbufs, (size_t)c->nrecv * RPS__MSG_MAX);
	rps__topo_free(srv->topo, c->sbufs, (size_t)c->nsend * RPS__MSG_MAX);
	free(c->sfree);
	free(c->slot_state);
	if (c->owner)
		srv->owner_used[c->owner] = 0;
	mem_give(srv, (size_t)srv->cfg.nslots * srv->slot_size);
	free(c);
}

static void conn_destroy(struct rps__server *srv, struct conn *c)
{
	uint32_t i;

	rps__log(RPS__LOG_INFO, "worker %s (rank %d) gone", rps__ep_peer(c->ep), c->rank);
	if (c->owner)
		scan_locks(srv, c->owner);
	for (i = 0; i < srv->nheld;) {
		if (srv->held[i].conn == c)
			srv->held[i] = srv->held[--srv->nheld];
		else
			i++;
	}
	for (i = 0; i < srv->nwaiters;) {
		if (srv->waiters[i].conn == c)
			srv->waiters[i] = srv->waiters[--srv->nwaiters];
		else
			i++;
	}
	for (i = 0; i < srv->barrier.n;) {
		if (srv->barrier.conn[i] == c) {
			srv->barrier.n--;
			srv->barrier.conn[i] = srv->barrier.conn[srv->barrier.n];
			srv->barrier.req_id[i] = srv->barrier.req_id[srv->barrier.n];
		} else {
			i++;
		}
	}
	/* A creator that vanished before sending initial values: the shards
	 * stay unreadable, so say so rather than publish zeros. */
	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *t = srv->tensors[i];
		uint32_t j;
		for (j = 0; t && j < t->nlocal; j++)
			if (t->shards[j].init_conn == c) {
				t->shards[j].init_conn = NULL;
				rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: creator left before sending initial values",
					 t->name, t->shards[j].index);
			}
	}
	for (i = 0; i < srv->nconns; i++)
		if (srv->conns[i] == c) {
			srv->conns[i] = srv->conns[--srv->nconns];
			break;
		}
	conn_free(srv, c);
	/* Pushes held behind the departed worker (sync) stay held: the step
	 * cannot complete without it, and applying a partial sum would break
	 * the sync invariant. */
	drain_held(srv);
}

static uint32_t owner_alloc(struct rps__server *srv)
{
	uint32_t i;

	for (i = 0; i < RPS__LOCK_OWNER_MAX; i++) {
		uint32_t o = 1 + (srv->next_owner + i) % RPS__LOCK_OWNER_MAX;
		if (!srv->owner_used[o]) {
			srv->owner_used[o] = 1;
			srv->next_owner = o;
			return o;
		}
	}
	return 0;
}

static void accept_one(struct rps__server *srv, struct rps__conn_req *req)
{
	struct rps__conn_priv priv;
	struct rps__ep_attr attr = { 0 };
	struct conn *c;
	size_t len, slots_len;
	const void *data = rps__conn_req_data(req, &len);
	const char *why = NULL;
	uint32_t i;
	int ret;

	memset(&priv, 0, sizeof(priv));
	memcpy(&priv, data, RPS__MIN(len, sizeof(priv)));
	if (len < sizeof(priv) || priv.magic != RPS__DESC_MAGIC)
		why = "not an rdmaps worker";
	else if (priv.version != RPS__PROTO_VERSION)
		why = "protocol version mismatch: upgrade librdmaps or rdmapsd";
	else if (srv->nconns >= srv->cfg.max_conns)
		why = "server full: raise rdmapsd --max-connections";
	if (why) {
		rps__log(RPS__LOG_WARN, "rejecting a connection: %s", why);
		rps__reject(req, why, strlen(why) + 1 > RPS__PRIVDATA_MAX ? RPS__PRIVDATA_MAX : strlen(why) + 1);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		goto err_reject;
	c->srv = srv;
	c->rank = -1;
	slots_len = (size_t)srv->cfg.nslots * srv->slot_size;
	if (mem_take(srv, slots_len, "staging slots")) {
		rps__log(RPS__LOG_WARN, "rejecting a connection: %s", rps__errbuf());
		free(c);
		rps__reject(req, "server out of memory", 21);
		return;
	}
	c->nrecv = CTRL_CREDITS + srv->cfg.nslots + 4;
	c->nsend = CTRL_CREDITS + srv->cfg.nslots + 4;
	c->slots = rps__topo_alloc(srv->topo, &srv->place, slots_len);
	c->slot_state = calloc(srv->cfg.nslots, 1);
	c->rbufs = rps__topo_alloc(srv->topo, &srv->place, (size_t)c->nrecv * RPS__MSG_MAX);
	c->sbufs = rps__topo_alloc(srv->topo, &srv->place, (size_t)c->nsend * RPS__MSG_MAX);
	c->sfree = calloc(c->nsend, sizeof(*c->sfree));
	c->owner = owner_alloc(srv);
	if (!c->slots || !c->slot_state || !c->rbufs || !c->sbufs || !c->sfree || !c->owner)
		goto err_free;
	for (i = 0; i < c->nsend; i++)
		c->sfree[i] = c->nsend - 1 - i;
	c->nsfree = c->nsend;
	if (rps__mr_reg(srv->fab, c->slots, slots_len, RPS__ACCESS_REMOTE_WRITE, &c->slots_mr) ||
	    rps__mr_reg(srv->fab, c->rbufs, (size_t)c->nrecv * RPS__MSG_MAX, RPS__ACCESS_LOCAL, &c->rbufs_mr) ||
	    rps__mr_reg(srv->fab, c->sbufs, (size_t)c->nsend * RPS__MSG_MAX, RPS__ACCESS_LOCAL, &c->sbufs_mr)) {
		rps__log(RPS__LOG_ERROR, "%s", rps__errbuf());
		goto err_free;
	}
	attr.sq_depth = c->nsend + 4;
	attr.rq_depth = c->nrecv;
	attr.max_inline = 64;
	priv.role = 0;
	ret = rps__accept(req, srv->cq, &attr, &priv, sizeof(priv), &c->ep);
	req = NULL;
	if (ret) {
		rps__log(RPS__LOG_WARN, "accept failed: %s", rps__errbuf());
		goto err_free;
	}
	rps__ep_set_context(c->ep, c);
	for (i = 0; i < c->nrecv; i++)
		if (post_recv_buf(c, i)) {
			rps__log(RPS__LOG_WARN, "posting receives for %s: %s", rps__ep_peer(c->ep), rps__errbuf());
			goto err_free;
		}
	srv->conns[srv->nconns++] = c;
	rps__log(RPS__LOG_INFO, "worker connected from %s", rps__ep_peer(c->ep));
	return;
err_free:
	conn_free(srv, c);
err_reject:
	if (req)
		rps__reject(req, "server out of memory", 21);
}

/* ---- the loop ------------------------------------------------------------- */

static void on_completion(struct rps__server *srv, const struct rps__wc *wc)
{
	struct conn *c = wc->ep ? rps__ep_context(wc->ep) : NULL;
	uint32_t kind = (uint32_t)(wc->wr_id >> 32), idx = (uint32_t)wc->wr_id;

	if (!c)
		return;
	if (wc->status != RPS__WC_SUCCESS) {
		if (!c->dead)
			rps__log(RPS__LOG_INFO, "worker %s: %s", rps__ep_peer(c->ep), rps__wc_status_str(wc->status));
		c->dead = true;
		return;
	}
	if (kind == WRID_SEND) {
		if (idx < c->nsend)
			c->sfree[c->nsfree++] = idx;
		return;
	}
	if (kind != WRID_RECV || idx >= c->nrecv)
		return;
	if (!c->dead) {
		if (wc->opcode == RPS__WC_RECV_IMM)
			on_push(srv, c, wc->imm);
		else
			on_message(srv, c, rbuf(c, idx), wc->byte_len);
	}
	if (!c->dead && post_recv_buf(c, idx))
		conn_fail(c, rps__errbuf());
}

static void reap_dead(struct rps__server *srv)
{
	uint32_t i = 0;

	while (i < srv->nconns) {
		if (srv->conns[i]->dead) {
			conn_destroy(srv, srv->conns[i]);
			continue;
		}
		i++;
	}
}

static void accept_pending(struct rps__server *srv)
{
	struct rps__conn_req *req;

	while (rps__listener_get_request(srv->listener, &req) == 0)
		accept_one(srv, req);
}

int rps__server_run(struct rps__server *srv)
{
	struct rps__wc wc[32];
	uint64_t spin_ns = (uint64_t)srv->cfg.spin_us * 1000ull;
	uint64_t scan_every = RPS__MAX((uint64_t)srv->cfg.lease_ms * 1000000ull / 4, 1000000ull);
	uint64_t idle_since = rps__now_ns();

	/* The serving thread near the HCA; what it mallocs (optimizer state,
	 * accumulators) then lands on its node by first touch. */
	if (rps__topo_pin_thread(srv->topo, &srv->place))
		rps__log(RPS__LOG_WARN, "%s: serving unpinned", rps__errbuf());
	srv->next_lease_scan = rps__now_ns() + scan_every;
	for (;;) {
		struct pollfd pfd[3];
		uint64_t now;
		int n, i, timeout;

		n = rps__cq_poll(srv->cq, wc, (int)RPS__ARRAY_SIZE(wc));
		if (n < 0) {
			rps__log(RPS__LOG_ERROR, "polling completions: %s", rps__errbuf());
			return n;
		}
		for (i = 0; i < n; i++)
			on_completion(srv, &wc[i]);
		reap_dead(srv);
		now = rps__now_ns();
		if (now >= srv->next_lease_scan) {
			scan_locks(srv, 0);
			srv->next_lease_scan = now + scan_every;
		}
		if (n > 0) {
			idle_since = now;
			continue;
		}
		if (now - idle_since < spin_ns) {
			accept_pending(srv);
			continue;
		}
		n = rps__cq_arm(srv->cq);
		if (n < 0)
			return -EIO;
		if (n)
			n = rps__cq_poll(srv->cq, wc, (int)RPS__ARRAY_SIZE(wc));
		for (i = 0; i < n; i++)
			on_completion(srv, &wc[i]);
		if (n > 0) {
			idle_since = rps__now_ns();
			continue;
		}
		pfd[0] = (struct pollfd){ .fd = rps__cq_fd(srv->cq), .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = rps__listener_fd(srv->listener), .events = POLLIN };
		pfd[2] = (struct pollfd){ .fd = srv->stop_fd, .events = POLLIN };
		timeout = (int)((srv->next_lease_scan - now) / 1000000ull) + 1;
		if (poll(pfd, 3, timeout) < 0 && errno != EINTR)
			return rps__seterr(-errno, "poll: %s", strerror(errno));
		if (pfd[2].revents)
			return 0;
		if (pfd[1].revents)
			accept_pending(srv);
		idle_since = rps__now_ns();
	}
}

void rps__server_stop(struct rps__server *srv)
{
	uint64_t one = 1;
	ssize_t r = write(srv->stop_fd, &one, sizeof(one));

	(void)r;
}

uint16_t rps__server_port(const struct rps__server *srv)
{
	return rps__listener_port(srv->listener);
}

const char *rps__server_fabric_name(const struct rps__server *srv)
{
	return rps__fabric_name(srv->fab);
}

static int find_index(struct rps__server *srv)
{
	int i;

	if (srv->cfg.index >= 0) {
		if (srv->cfg.index >= srv->ncluster)
			return rps__seterr(-EINVAL, "--index %d is outside the %d-server cluster list",
					   srv->cfg.index, srv->ncluster);
		return srv->cfg.index;
	}
	for (i = 0; i < srv->ncluster; i++)
		if (!strcmp(srv->cluster[i].host, srv->cfg.listen.host) &&
		    srv->cluster[i].port == srv->cfg.listen.port)
			return i;
	return rps__seterr(-EINVAL, "the listen address is not in the cluster list: give --index N");
}

int rps__server_create(const struct rps__server_config *cfg, struct rps__server **out)
{
	struct rps__fabric_attr fattr = { 0 };
	struct rps__server *srv;
	int ret;

	if (cfg->shard_bytes < 64 || cfg->shard_bytes % 4 || cfg->shard_bytes > (1u << 30))
		return rps__seterr(-EINVAL, "--shard-size %u: must be a multiple of 4 between 64 B and 1 GiB",
				   cfg->shard_bytes);
	if (cfg->nslots < 1 || cfg->nslots > 64)
		return rps__seterr(-EINVAL, "--slots %u: must be between 1 and 64 (workers use at most 64)", cfg->nslots);
	if (cfg->max_conns < 1)
		return rps__seterr(-EINVAL, "--max-connections must be at least 1");
	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return rps__seterr(-ENOMEM, "out of memory");
	srv->cfg = *cfg;
	srv->stop_fd = -1;
	if (cfg->cluster) {
		ret = rps__uri_list_parse(cfg->cluster, &srv->cluster, &srv->ncluster);
		if (ret)
			goto err_free;
	} else {
		srv->cluster = malloc(sizeof(*srv->cluster));
		if (!srv->cluster) {
			ret = rps__seterr(-ENOMEM, "out of memory");
			goto err_free;
		}
		srv->cluster[0] = cfg->listen;
		srv->ncluster = 1;
	}
	ret = find_index(srv);
	if (ret < 0)
		goto err_free;
	srv->index = ret;
	srv->shard_elems = cfg->shard_bytes / 4;
	srv->slot_size = RPS__ALIGN_UP(RPS__PUSH_DESC_SIZE + (size_t)cfg->shard_bytes, 64);
	srv->conns = calloc(cfg->max_conns, sizeof(*srv->conns));
	if (!srv->conns) {
		ret = rps__seterr(-ENOMEM, "out of memory");
		goto err_free;
	}
	srv->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (srv->stop_fd < 0) {
		ret = rps__seterr(-errno, "eventfd: %s", strerror(errno));
		goto err_free;
	}
	fattr.kind = cfg->listen.kind;
	fattr.host = cfg->listen.host;
	ret = rps__fabric_open(&fattr, &srv->fab);
	if (ret)
		goto err_free;
	ret = place_server(cfg, srv->fab, &srv->topo, &srv->place);
	if (ret)
		goto err_fabric;
	rps__log(srv->place.warn ? RPS__LOG_WARN : RPS__LOG_INFO, "placement: %s", srv->place.reason);
	ret = rps__cq_create(srv->fab, cfg->max_conns * 2 * (CTRL_CREDITS + cfg->nslots + 8), &srv->cq);
	if (ret)
		goto err_fabric;
	ret = rps__listen(srv->fab, cfg->listen.host, cfg->listen.port, &srv->listener);
	if (ret)
		goto err_cq;
	*out = srv;
	return 0;
err_cq:
	rps__cq_destroy(srv->cq);
err_fabric:
	rps__topo_close(srv->topo);
	rps__fabric_close(srv->fab);
err_free:
	if (srv->stop_fd >= 0)
		close(srv->stop_fd);
	free(srv->conns);
	free(srv->cluster);
	free(srv);
	return ret;
}

void rps__server_destroy(struct rps__server *srv)
{
	uint32_t i;

	if (!srv)
		return;
	while (srv->nconns)
		conn_destroy(srv, srv->conns[srv->nconns - 1]);
	rps__listener_close(srv->listener);
	for (i = 0; i < srv->ntensors; i++)
		tensor_free(srv, srv->tensors[i]);
	free(srv->tensors);
	free(srv->held);
	while (srv->nparked)
		free(srv->parked[--srv->nparked].data);
	free(srv->parked);
	free(srv->waiters);
	free(srv->barrier.conn);
	free(srv->barrier.req_id);
	rps__cq_destroy(srv->cq);
	rps__fabric_close(srv->fab);
	rps__topo_close(srv->topo);	/* after every rps__topo_free */
	close(srv->stop_fd);
	free(srv->conns);
	free(srv->cluster);
	free(srv);
}

int rps__server_show_topology(const struct rps__server_config *cfg, FILE *f)
{
	struct rps__fabric_attr fattr = { 0 };
	struct rps__fabric *fab;
	struct rps__topo *topo;
	struct rps__placement place;
	int ret;

	fattr.kind = cfg->listen.kind;
	fattr.host = cfg->listen.host;
	ret = rps__fabric_open(&fattr, &fab);
	if (ret)
		return ret;
	ret = place_server(cfg, fab, &topo, &place);
	if (!ret) {
		fprintf(f, "transport: %s\n", rps__fabric_name(fab));
		ret = rps__topo_print(topo, &place, f);
		rps__topo_close(topo);
	}
	rps__fabric_close(fab);
	return ret;
}
