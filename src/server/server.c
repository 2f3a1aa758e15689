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
#include "server/server.h"
#include "kernels/agg.h"
#include "common/common.h"
#include "kernels/optim.h"
#include "proto/proto.h"
#include "proto/shard.h"
#include "common/topo.h"
#include "transport/transport.h"
#include "server/server_int.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "rdmaps.h"

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
	cfg->tick_ms = 50;
	cfg->election_ticks = 10;
	cfg->move_timeout_ms = 30000;
	cfg->drain_ms = 2000;
}

/* ---- memory accounting ------------------------------------------------ */

size_t rps__server_min_memory(const struct rps__server_config *cfg)
{
	size_t slot = RPS__ALIGN_UP(RPS__PUSH_DESC_SIZE + (size_t)cfg->shard_bytes, 64);

	return (size_t)cfg->nslots * slot + rps__shard_stride(cfg->shard_bytes / 4);
}

int rps__srv_mem_take(struct rps__server *srv, size_t bytes, const char *what)
{
	if (srv->cfg.mem_limit && bytes > srv->cfg.mem_limit - srv->mem_used)
		return rps__seterr(-ENOMEM, "%s: %zu bytes would exceed the memory limit (%zu of %zu used): raise rdmapsd --memory-limit",
				   what, bytes, srv->mem_used, srv->cfg.mem_limit);
	srv->mem_used += bytes;
	return 0;
}

void rps__srv_mem_give(struct rps__server *srv, size_t bytes)
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
	return c->sbufs + (size_t)i * c->msg_max;
}

static char *rbuf(struct conn *c, uint32_t i)
{
	return c->rbufs + (size_t)i * c->msg_max;
}

static const char *role_name(const struct conn *c)
{
	return c->role == CONN_PEER ? "peer" : c->role == CONN_ADMIN ? "admin" : "worker";
}

void rps__srv_conn_fail(struct conn *c, const char *why)
{
	if (!c->dead) {
		if (c->role == CONN_WORKER)
			rps__log(RPS__LOG_INFO, "worker %s (rank %d): %s", rps__ep_peer(c->ep), c->rank, why);
		else
			rps__log(RPS__LOG_INFO, "%s %s: %s", role_name(c), rps__ep_peer(c->ep), why);
	}
	c->dead = true;
}

#define conn_fail rps__srv_conn_fail
#define conn_reply rps__srv_conn_reply

void rps__srv_conn_reply(struct conn *c, unsigned type, uint64_t req_id, int32_t status,
			 const void *body, size_t len)
{
	struct rps__wr wr;
	uint32_t i;
	int ret;

	if (c->dead)
		return;
	if (!c->nsfree) {
		if (c->role == CONN_PEER)
			return;		/* best effort: Raft and the move duties retry */
		conn_fail(c, "exceeded its control credits");
		return;
	}
	if (sizeof(struct rps__msg_hdr) + (body ? len : 0) > c->msg_max) {
		rps__log(RPS__LOG_ERROR, "%s reply of %zu bytes does not fit a %zu-byte buffer",
			 rps__msg_type_name(type), len, c->msg_max);
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

/* Publish a new epoch in the header (RPS__EPOCH_MOVED: fenced), so a
 * worker's READ of a moved shard sees it did not read the owner's copy. */
void rps__srv_publish(struct shard *s, uint64_t epoch)
{
	publish_begin(s);
	s->hdr->epoch = epoch;
	publish_end(s);
}

static struct tensor *tensor_by_id(struct rps__server *srv, uint32_t id)
{
	return id < srv->ntensors ? srv->tensors[id] : NULL;
}

void rps__srv_wake_waiters(struct rps__server *srv, struct tensor *t, uint32_t local)
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
	if (clock >= t->hold_limit)
		return -EAGAIN;		/* a checkpoint holds the tensor at this step */
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
		rps__srv_wake_waiters(srv, t, local);
	}
	return 0;
}

enum consume_result { CONSUMED, NOT_YET };

/* Release the lock word w (0: none held) on the worker's behalf, through
 * the transport's atomic path; returns the new word for the ack.  The
 * version moves on with every release, so a word never comes back. */
uint64_t rps__srv_release_lock(struct rps__server *srv, struct tensor *t, struct shard *s, uint64_t w)
{
	uint64_t next, old = 0;

	if (!w)
		return 0;
	next = rps__lock_unlocked(rps__lock_version(w) + 1);
	if (rps__local_cas(srv->fab, t->regions[s->part].mr, &s->hdr->lock, w, next, &old)) {
		rps__log(RPS__LOG_ERROR, "releasing lock of %s shard %u: %s", t->name, s->index, rps__errbuf());
		return 0;
	}
	return old == w ? next : old;
}

static bool dedup_seen(const struct shard *s, uint64_t client, uint64_t push_id)
{
	uint32_t i, k;

	for (i = 0; i < s->ndd; i++)
		if (s->dd[i].client == client) {
			for (k = 0; k < DEDUP_IDS; k++)
				if (s->dd[i].ids[k] == push_id)
					return true;
			return false;
		}
	return false;
}

/* Remember a push applied for a worker: its last DEDUP_IDS pushes to this
 * shard (a resend comes within a few of them). */
static void dedup_note(struct shard *s, uint64_t client, uint64_t push_id)
{
	struct dedup *grown;
	uint32_t i;

	for (i = 0; i < s->ndd; i++)
		if (s->dd[i].client == client)
			break;
	if (i == s->ndd) {
		grown = realloc(s->dd, (s->ndd + 1) * sizeof(*grown));
		if (!grown)
			return;		/* then only the lock protocol guards it, as before */
		s->dd = grown;
		memset(&s->dd[s->ndd], 0, sizeof(*s->dd));
		s->dd[s->ndd].client = client;
		s->ndd++;
	}
	s->dd[i].ids[s->dd[i].next] = push_id;
	s->dd[i].next = (s->dd[i].next + 1) % DEDUP_IDS;
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
	if (d->shard >= t->layout.nshards) {
		push_ack(c, slot, -EINVAL, 0, 0);
		return CONSUMED;
	}
	local = d->shard;
	s = &t->shards[local];
	if (rps__srv_part_lost(srv, s->part)) {
		push_ack(c, slot, -ENODATA, 0, 0);
		return CONSUMED;
	}
	/* Fencing: only the owner of the partition, under the epoch the map
	 * gave it, takes pushes.  A refused push was not applied: the worker
	 * refreshes its map and sends it to the new owner. */
	if (!s->hdr || !rps__srv_part_serving(srv, s->part) || d->epoch != srv->parts[s->part].epoch) {
		uint64_t left = 0;
		/* a lock this worker took before the fence: let go of it, or
		 * fencing would wait for the lease */
		if (s->hdr && t->regions[s->part].mr && t->spec.mode != RPS_MODE_SYNC) {
			uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);
			if (w == d->lock && rps__lock_is_locked(w) && rps__lock_owner(w) == c->owner)
				left = rps__srv_release_lock(srv, t, s, w);
		}
		push_ack(c, slot, RPS_ESTALE_EPOCH, 0, left);
		return CONSUMED;
	}

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
		rps__srv_wake_waiters(srv, t, local);
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
		/* A retried push that was applied already (idempotent push ids):
		 * acknowledge, do not apply again. */
		if (dedup_seen(s, c->client_id, d->push_id)) {
			push_ack(c, slot, 0, s->step, rps__srv_release_lock(srv, t, s, holds));
			return CONSUMED;
		}
	}
	if (d->dtype != t->spec.dtype || d->nbytes != (uint64_t)s->elems * rps__dtype_size(t->spec.dtype)) {
		push_ack(c, slot, -EMSGSIZE, 0, rps__srv_release_lock(srv, t, s, holds));
		return CONSUMED;
	}
	if ((t->spec.mode != RPS_MODE_ASYNC) && (d->rank < 0 || d->rank >= t->spec.num_workers || d->rank != c->rank)) {
		push_ack(c, slot, -EINVAL, 0, rps__srv_release_lock(srv, t, s, holds));
		return CONSUMED;
	}
	/* Sync: a rank can be at most this many steps ahead of the shard:
	 * its pushes for the steps between are all here, in its slots or
	 * parked.  A clock past that can never be taken: parked, it would
	 * hold its share of --park-limit forever. */
	if (t->spec.mode == RPS_MODE_SYNC && d->clock > s->step &&
	    d->clock - s->step > 1 + srv->cfg.nslots + srv->cfg.park_limit / RPS__MAX(d->nbytes, 1u)) {
		rps__log(RPS__LOG_DEBUG, "worker %s (rank %d): tensor '%s' shard %u: clock %llu is beyond reach of step %llu",
			 rps__ep_peer(c->ep), c->rank, t->name, s->index, (unsigned long long)d->clock,
			 (unsigned long long)s->step);
		push_ack(c, slot, -ERANGE, s->step, 0);
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
	dedup_note(s, c->client_id, d->push_id);
	if (t->spec.mode == RPS_MODE_BOUNDED) {
		if (d->clock + 1 > s->clocks[d->rank])
			s->clocks[d->rank] = d->clock + 1;
		update_min_clock(t, s);
	}
	push_ack(c, slot, 0, s->step, rps__srv_release_lock(srv, t, s, holds));
	rps__srv_wake_waiters(srv, t, local);
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
void rps__srv_drain_held(struct rps__server *srv)
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
			rps__srv_mem_give(srv, p->nbytes);
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
	if (rps__srv_mem_take(srv, d->nbytes, "parking a push"))
		return -ENOSPC;
	p = &srv->parked[srv->nparked];
	p->data = malloc(d->nbytes ? d->nbytes : 1);
	if (!p->data) {
		rps__srv_mem_give(srv, d->nbytes);
		return -ENOSPC;
	}
	memcpy(p->data, (char *)d + RPS__PUSH_DESC_SIZE, d->nbytes);
	p->t = t;
	if (d->shard >= t->layout.nshards || !t->shards[d->shard].hdr ||
	    !rps__srv_part_serving(srv, t->shards[d->shard].part))
		return -ENOSPC;
	p->local = d->shard;
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
		rps__srv_drain_held(srv);
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

static void shard_free_mem(struct shard *s)
{
	free(s->state);
	free(s->acc);
	free(s->scratch);
	free(s->clocks);
	free(s->dd);
	s->state = s->acc = s->scratch = NULL;
	s->clocks = NULL;
	s->dd = NULL;
	s->ndd = 0;
	s->hdr = NULL;
	s->params = NULL;
}

/* Give up a tensor's region of a partition: deregistering revokes every
 * worker's remote access to those shards at once. */
void rps__srv_region_free(struct rps__server *srv, struct tensor *t, uint32_t part)
{
	struct region *r = &t->regions[part];
	uint32_t j;

	if (!r->mem)
		return;
	for (j = 0; j < r->nsh; j++)
		shard_free_mem(&t->shards[rps__part_shard(&t->layout, part, j)]);
	rps__mr_dereg(r->mr);
	rps__topo_free(srv->topo, r->mem, r->len);
	rps__srv_mem_give(srv, r->mem_charged);
	memset(r, 0, sizeof(*r));
}

static void tensor_free(struct rps__server *srv, struct tensor *t)
{
	uint32_t p;

	if (!t)
		return;
	for (p = 0; t->regions && p < t->layout.nservers; p++)
		rps__srv_region_free(srv, t, p);
	free(t->regions);
	free(t->shards);
	free(t->ranks);
	rps__srv_mem_give(srv, t->meta_charged);
	free(t);
}

static int spec_check(const char *name, const struct rps__tensor_spec *sp)
{
	if (sp->dtype < RPS_DTYPE_F32 || sp->dtype > RPS_DTYPE_F16)
		return rps__seterr(-EINVAL, "tensor '%s': unknown dtype %u", name, sp->dtype);
	if (sp->mode < RPS_MODE_SYNC || sp->mode > RPS_MODE_ASYNC)
		return rps__seterr(-EINVAL, "tensor '%s': unknown consistency mode %u", name, sp->mode);
	if (sp->mode != RPS_MODE_ASYNC && (sp->num_workers < 1 || sp->num_workers > 4096))
		return rps__seterr(-EINVAL, "tensor '%s': sync and bounded modes need num_workers in 1..4096 (got %d)",
				   name, sp->num_workers);
	return 0;
}

/* What rps__srv_tensor_add would check of a tensor it is told about, with
 * no side effect: a partition image is validated whole before anything of
 * it is installed.  *l: the tensor's layout on this server. */
int rps__srv_spec_valid(struct rps__server *srv, const char *name, const struct rps__tensor_spec *sp,
			struct rps__layout *l)
{
	struct rps__optim o = {
		.type = (enum rps_optimizer)sp->optimizer, .lr = sp->lr, .momentum = sp->momentum,
		.beta1 = sp->beta1, .beta2 = sp->beta2, .eps = sp->eps,
		.weight_decay = sp->weight_decay, .rescale = sp->rescale,
	};
	int ret = spec_check(name, sp);

	if (ret)
		return ret;
	ret = rps__optim_validate(&o);
	if (ret)
		return rps__preerr(ret, "tensor '%s'", name);
	if (sp->count > UINT64_MAX - srv->shard_elems)
		return rps__seterr(-EFBIG, "tensor '%s': %llu elements is beyond any layout", name,
				   (unsigned long long)sp->count);
	return rps__layout_init(l, name, sp->count, srv->shard_elems, srv->npart);
}

/* Know a tensor (its spec and layout) without holding any of its shards:
 * regions come with the partitions this server owns or receives. */
int rps__srv_tensor_add(struct rps__server *srv, const char *name, const struct rps__tensor_spec *sp,
			struct tensor **out)
{
	struct tensor *t, **grown;
	size_t meta;
	uint32_t i;
	int ret;

	ret = spec_check(name, sp);
	if (ret)
		return ret;
	grown = realloc(srv->tensors, (srv->ntensors + 1) * sizeof(*srv->tensors));
	if (!grown)
		return rps__seterr(-ENOMEM, "out of memory");
	srv->tensors = grown;
	t = calloc(1, sizeof(*t));
	if (!t)
		return rps__seterr(-ENOMEM, "out of memory");
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->spec = *sp;
	t->optim = (struct rps__optim){
		.type = (enum rps_optimizer)sp->optimizer, .lr = sp->lr, .momentum = sp->momentum,
		.beta1 = sp->beta1, .beta2 = sp->beta2, .eps = sp->eps,
		.weight_decay = sp->weight_decay, .rescale = sp->rescale,
	};
	ret = rps__optim_validate(&t->optim);
	if (ret) {
		rps__preerr(ret, "tensor '%s'", name);
		goto err_free;
	}
	ret = rps__layout_init(&t->layout, name, sp->count, srv->shard_elems, srv->npart);
	if (ret)
		goto err_free;
	t->stride = rps__shard_stride(srv->shard_elems);
	/* Every server keeps the whole shard table of every tensor: charge it
	 * before allocating it, or one CREATE with a huge count could take
	 * gigabytes past --memory-limit.  Without a limit, cap the table. */
	meta = sizeof(*t) + (size_t)t->layout.nshards * sizeof(*t->shards) +
	       (size_t)srv->npart * sizeof(*t->regions);
	if (t->layout.nshards > RPS__TENSOR_SHARDS_MAX) {
		ret = rps__seterr(-EFBIG, "tensor '%s': %llu elements make %u shards, more than %u: raise rdmapsd --shard-size",
				  name, (unsigned long long)sp->count, t->layout.nshards, RPS__TENSOR_SHARDS_MAX);
		goto err_free;
	}
	ret = rps__srv_mem_take(srv, meta, "shard table");
	if (ret) {
		rps__preerr(ret, "tensor '%s' (%llu elements)", name, (unsigned long long)sp->count);
		goto err_free;
	}
	t->meta_charged = meta;
	t->shards = calloc(t->layout.nshards, sizeof(*t->shards));
	t->regions = calloc(srv->npart, sizeof(*t->regions));
	if (!t->shards || !t->regions) {
		ret = rps__seterr(-ENOMEM, "tensor '%s': out of memory", name);
		goto err_free;
	}
	for (i = 0; i < t->layout.nshards; i++) {
		t->shards[i].index = i;
		t->shards[i].part = rps__shard_server(&t->layout, i);
		t->shards[i].elems = rps__shard_elems(&t->layout, i);
	}
	t->hold_limit = UINT64_MAX;
	t->id = srv->ntensors;
	srv->tensors[srv->ntensors++] = t;
	*out = t;
	return 0;
err_free:
	tensor_free(srv, t);
	return ret;
}

/*
 * Allocate (not yet register) a tensor's region of one partition, on the
 * HCA's NUMA node, with the optimizer state and accumulators of its shards.
 * The caller fills it (fresh: zeros, or a move's data) and registers it
 * with rps__srv_region_register, so the lock words are written by this CPU
 * only before any HCA atomic can reach them.
 */
int rps__srv_region_alloc(struct rps__server *srv, struct tensor *t, uint32_t part, bool has_init,
			  struct conn *init_conn)
{
	const struct rps__tensor_spec *sp = &t->spec;
	struct region *r = &t->regions[part];
	size_t per_elem, charge;
	uint32_t j;
	int ret;

	if (r->mem)
		return 0;
	r->nsh = rps__part_nshards(&t->layout, part);
	if (!r->nsh)
		return 0;
	r->len = t->stride * r->nsh;
	/* optimizer state, the sync accumulator and conversion scratch: fp32 each */
	per_elem = 4u * (rps__optim_state_len(t->optim.type, 1) + (sp->mode == RPS_MODE_SYNC) +
			 (sp->dtype != RPS_DTYPE_F32));
	charge = r->len + per_elem * (size_t)r->nsh * srv->shard_elems;
	ret = rps__srv_mem_take(srv, charge, t->name);
	if (ret) {
		r->nsh = 0;
		return ret;
	}
	r->mem_charged = charge;
	r->mem = rps__topo_alloc(srv->topo, &srv->place, r->len);
	if (!r->mem)
		goto err_nomem;
	memset(r->mem, 0, r->len);
	for (j = 0; j < r->nsh; j++) {
		struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
		size_t n;
		s->hdr = (struct rps__shard_hdr *)((char *)r->mem + j * t->stride);
		s->params = (float *)((char *)s->hdr + RPS__SHARD_HDR_SIZE);
		s->hdr->shard = s->index;
		s->hdr->elems = s->elems;
		s->hdr->epoch = srv->parts[part].map_epoch;
		s->ready = !has_init;
		s->init_conn = s->ready ? NULL : init_conn;
		s->hdr->seq = s->ready ? 0 : 1;	/* odd: not readable until INIT */
		s->step = 0;
		s->next_rank = 0;
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
	return 0;
err_nomem:
	ret = rps__seterr(-ENOMEM, "tensor '%s': out of memory for partition %u", t->name, part);
	rps__srv_region_free(srv, t, part);
	return ret;
}

int rps__srv_region_register(struct rps__server *srv, struct tensor *t, uint32_t part)
{
	struct region *r = &t->regions[part];
	int ret;

	if (!r->mem || r->mr)
		return 0;
	ret = rps__mr_reg(srv->fab, r->mem, r->len, RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC, &r->mr);
	if (ret)
		rps__srv_region_free(srv, t, part);
	return ret;
}

struct tensor *rps__srv_tensor_by_name(struct rps__server *srv, const char *name)
{
	uint32_t i;

	for (i = 0; i < srv->ntensors; i++)
		if (srv->tensors[i] && !strcmp(srv->tensors[i]->name, name))
			return srv->tensors[i];
	return NULL;
}

/* The reply names the regions of partitions served here, a page at a time
 * (the worker asks again with CREATE.first for the rest). */
static void create_reply(struct rps__server *srv, struct conn *c, uint64_t req_id, struct tensor *t,
			 bool created, uint32_t first)
{
	struct rps__create_rep rep;
	uint32_t p, k = 0;

	memset(&rep, 0, sizeof(rep));
	rep.spec = t->spec;
	rep.tensor_id = t->id;
	rep.created = created;
	rep.stride = t->stride;
	rep.map_applied = srv->map_applied;
	rep.first = first;
	for (p = 0; p < t->layout.nservers; p++) {
		struct region *r = &t->regions[p];
		if (!r->mr || !rps__srv_part_serving(srv, p))
			continue;
		if (k >= first && rep.nregions < RPS__CREATE_MAX_REGIONS) {
			struct rps__region_ref *ref = &rep.regions[rep.nregions++];
			ref->addr = (uint64_t)(uintptr_t)r->mem;
			ref->rkey = rps__mr_rkey(r->mr);
			ref->part = (uint16_t)p;
			ref->epoch = srv->parts[p].epoch;
		}
		k++;
	}
	rep.total = k;
	conn_reply(c, RPS__MSG_CREATE_REP, req_id, 0, &rep, sizeof(rep));
}

/* A connection of a rank opened a sync tensor (see struct tensor.ranks). */
static void rank_opened(struct tensor *t, const struct conn *c)
{
	if (t->spec.mode != RPS_MODE_SYNC || c->rank < 0 || c->rank >= t->spec.num_workers)
		return;
	if (!t->ranks && !(t->ranks = calloc((size_t)t->spec.num_workers, 1)))
		return;		/* then a missing rank shows as a timeout, as before */
	t->ranks[c->rank] = RANK_LIVE;
}

static void on_create(struct rps__server *srv, struct conn *c, uint64_t req_id,
		      const struct rps__create *req)
{
	struct tensor *t;
	bool created = false;
	uint32_t p;
	int ret;

	/* what librdmaps refuses cannot come from it: say so, escaped */
	ret = rps__name_check(req->name);
	if (ret)
		goto err;
	t = rps__srv_tensor_by_name(srv, req->name);
	if (!(req->flags & RPS__CREATE_OPEN_ONLY)) {
		struct rps__layout l;
		/* a tensor with shards in a lost partition here would have empty
		 * shards where trained ones were; the others are created as usual
		 * (a spec with no layout is refused below, saying why) */
		if (t)
			l = t->layout;
		else if (rps__layout_init(&l, req->name, req->spec.count, srv->shard_elems, srv->npart))
			l.nservers = 0;
		for (p = 0; p < l.nservers && p < srv->npart; p++)
			if (srv->parts[p].owned_lost && rps__part_nshards(&l, p)) {
				rps__log(RPS__LOG_WARN, "create of '%s' from %s refused: partition %u is lost", req->name,
					 rps__ep_peer(c->ep), p);
				conn_reply(c, RPS__MSG_CREATE_REP, req_id, -ENODATA, NULL, 0);
				return;
			}
	}
	if (t) {
		if (!(req->flags & RPS__CREATE_OPEN_ONLY) && !spec_equal(&t->spec, &req->spec)) {
			rps__log(RPS__LOG_WARN, "worker %s: tensor '%s' exists with different options",
				 rps__ep_peer(c->ep), req->name);
			conn_reply(c, RPS__MSG_CREATE_REP, req_id, -EEXIST, NULL, 0);
			return;
		}
		rank_opened(t, c);
		create_reply(srv, c, req_id, t, false, req->first);
		return;
	}
	if (req->flags & RPS__CREATE_OPEN_ONLY) {
		conn_reply(c, RPS__MSG_CREATE_REP, req_id, -ENOENT, NULL, 0);
		return;
	}
	ret = rps__srv_tensor_add(srv, req->name, &req->spec, &t);
	if (ret)
		goto err;
	for (p = 0; p < t->layout.nservers; p++) {
		/* and partitions on their way here: they come without this tensor */
		if (!rps__srv_part_serving(srv, p) && !srv->parts[p].incoming)
			continue;
		ret = rps__srv_region_alloc(srv, t, p, req->spec.flags & RPS__CREATE_HAS_INIT, c);
		if (!ret)
			ret = rps__srv_region_register(srv, t, p);
		if (ret) {
			srv->tensors[--srv->ntensors] = NULL;
			tensor_free(srv, t);
			goto err;
		}
	}
	created = true;
	rank_opened(t, c);
	{
		uint32_t n = 0;
		for (p = 0; p < t->layout.nservers; p++)
			n += t->regions[p].nsh;
		rps__log(RPS__LOG_INFO, "tensor '%s': %llu elements, %u of %u shards here", t->name,
			 (unsigned long long)t->spec.count, n, t->layout.nshards);
	}
	create_reply(srv, c, req_id, t, created, req->first);
	return;
err:
	rps__log(RPS__LOG_WARN, "create from %s: %s", rps__ep_peer(c->ep), rps__errbuf());
	conn_reply(c, RPS__MSG_CREATE_REP, req_id, ret, NULL, 0);
}

static void on_hello(struct rps__server *srv, struct conn *c, uint64_t req_id, const struct rps__hello *h)
{
	struct rps__hello_rep rep;

	if (h->version != RPS__PROTO_VERSION) {
		conn_reply(c, RPS__MSG_HELLO_REP, req_id, -EPROTO, NULL, 0);
		return;
	}
	c->rank = h->rank;
	c->client_id = h->client_id;
	c->num_workers = h->num_workers;
	c->hello_done = true;
	memset(&rep, 0, sizeof(rep));
	rep.magic = RPS__HELLO_MAGIC;
	rep.version = RPS__PROTO_VERSION;
	rep.member_id = srv->my_id;
	rep.map_addr = (uint64_t)(uintptr_t)srv->mapbuf;
	rep.map_rkey = srv->mapbuf_mr ? rps__mr_rkey(srv->mapbuf_mr) : 0;	/* (none: no layer above) */
	rep.map_len = RPS__MAP_BUF;
	rep.shard_elems = srv->shard_elems;
	rep.nslots = srv->cfg.nslots;
	rep.slot_size = (uint32_t)srv->slot_size;
	rep.slot_addr = (uint64_t)(uintptr_t)c->slots;
	rep.slot_rkey = rps__mr_rkey(c->slots_mr);
	rep.owner = c->owner;
	rep.lease_ms = srv->cfg.lease_ms;
	conn_reply(c, RPS__MSG_HELLO_REP, req_id, 0, &rep, sizeof(rep));
}

/* Sync: the lowest rank whose connections all closed while the shard's
 * current step still lacks its push (neither added nor parked here), or -1.
 * Such a step can never complete: the rank cannot rejoin (its clock would
 * start again at 0). */
static int missing_rank(struct rps__server *srv, struct tensor *t, uint32_t local)
{
	struct shard *s = &t->shards[local];
	uint32_t i;
	int r;

	if (t->spec.mode != RPS_MODE_SYNC || !t->ranks || !s->hdr || !s->ready)
		return -1;
	for (r = s->next_rank; r < t->spec.num_workers; r++) {
		bool parked = false;
		if (t->ranks[r] != RANK_GONE)
			continue;
		for (i = 0; i < srv->nparked && !parked; i++)
			parked = srv->parked[i].t == t && srv->parked[i].local == local &&
				 srv->parked[i].rank == r && srv->parked[i].clock == s->step;
		if (!parked)
			return r;
	}
	return -1;
}

/* Tell a waiter that its version will never come, and which rank it waits for. */
static void wait_fail_missing(struct conn *c, uint64_t req_id, struct shard *s, int rank)
{
	struct rps__wait_rep rep = { .version = s->step, .min_clock = s->hdr->min_clock, .missing_rank = rank };

	conn_reply(c, RPS__MSG_WAIT_REP, req_id, -EPIPE, &rep, sizeof(rep));
}

/* A worker's last connection closed: note its rank gone from the sync
 * tensors it opened here, and fail the waits that only it could satisfy. */
static void rank_left(struct rps__server *srv, struct conn *c)
{
	uint32_t i;

	if (c->role != CONN_WORKER || !c->hello_done || c->rank < 0)
		return;
	for (i = 0; i < srv->nconns; i++) {
		struct conn *o = srv->conns[i];
		if (o != c && o->role == CONN_WORKER && o->hello_done && !o->dead && o->rank == c->rank)
			return;		/* the rank still has a connection here */
	}
	for (i = 0; i < srv->ntensors; i++) {
		struct tensor *t = srv->tensors[i];
		if (t && t->ranks && c->rank < t->spec.num_workers && t->ranks[c->rank] == RANK_LIVE)
			t->ranks[c->rank] = RANK_GONE;
	}
	i = 0;
	while (i < srv->nwaiters) {
		struct waiter *w = &srv->waiters[i];
		struct tensor *t = tensor_by_id(srv, w->tensor_id);
		int r = t ? missing_rank(srv, t, w->local) : -1;
		if (r >= 0 && w->conn != c && w->min_version > t->shards[w->local].step) {
			rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: rank %d left before its push for step %llu: "
				 "failing the waits for it", t->name, w->local, r,
				 (unsigned long long)t->shards[w->local].step);
			wait_fail_missing(w->conn, w->req_id, &t->shards[w->local], r);
			*w = srv->waiters[--srv->nwaiters];
			continue;
		}
		i++;
	}
}

static void on_wait(struct rps__server *srv, struct conn *c, uint64_t req_id, const struct rps__wait *w)
{
	struct tensor *t = tensor_by_id(srv, w->tensor_id);
	struct waiter *nw;
	uint32_t local;

	if (!t || w->shard >= t->layout.nshards) {
		conn_reply(c, RPS__MSG_WAIT_REP, req_id, -EINVAL, NULL, 0);
		return;
	}
	local = w->shard;
	if (rps__srv_part_lost(srv, t->shards[local].part)) {
		conn_reply(c, RPS__MSG_WAIT_REP, req_id, -ENODATA, NULL, 0);
		return;
	}
	if (!t->shards[local].hdr || !rps__srv_part_serving(srv, t->shards[local].part)) {
		conn_reply(c, RPS__MSG_WAIT_REP, req_id, RPS_ESTALE_EPOCH, NULL, 0);
		return;
	}
	if (w->min_version > t->shards[local].step) {
		int r = missing_rank(srv, t, local);
		if (r >= 0) {
			wait_fail_missing(c, req_id, &t->shards[local], r);
			return;
		}
	}
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
	rps__srv_wake_waiters(srv, t, local);
}

static void on_barrier(struct rps__server *srv, struct conn *c, uint64_t req_id)
{
	uint32_t i;

	if (c->num_workers < 1) {
		conn_reply(c, RPS__MSG_BARRIER_REP, req_id, -EINVAL, NULL, 0);
		return;
	}
	/* The first arrival fixes the barrier's size: a worker that counts
	 * differently must not release (or hold back) the others. */
	if (srv->barrier.n && c->num_workers != srv->barrier.need) {
		rps__log(RPS__LOG_WARN, "worker %s (rank %d): barrier with num_workers %d, but the %u waiting say %d: refused",
			 rps__ep_peer(c->ep), c->rank, c->num_workers, srv->barrier.n, srv->barrier.need);
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
	if (!srv->barrier.n)
		srv->barrier.need = c->num_workers;
	srv->barrier.n++;
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
		rps__log(RPS__LOG_WARN, "%s %s: %s", role_name(c), rps__ep_peer(c->ep), rps__errbuf());
		conn_fail(c, "sent a malformed message");
		return;
	}
	memcpy(&h, buf, sizeof(h));
	if (c->role != CONN_WORKER) {
		if (srv->hooks.on_message)
			srv->hooks.on_message(srv->hooks.ctx, c, &h, body, len - (uint32_t)sizeof(h));
		else
			conn_fail(c, "sent a message type it may not send");
		return;
	}
	if (h.type == RPS__MSG_STATUS) {
		/* The reply (map included) does not fit a worker's buffers:
		 * refuse it, quietly, so a worker cannot flood the log. */
		conn_reply(c, RPS__MSG_STATUS_REP, h.req_id, -EPERM, NULL, 0);
		return;
	}
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
	if (rps__srv_release_lock(srv, t, s, w) == rps__lock_unlocked(rps__lock_version(w) + 1))
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
		for (j = 0; j < t->layout.nshards; j++) {
			struct shard *s = &t->shards[j];
			uint64_t w;
			if (!s->hdr || !t->regions[s->part].mr)
				continue;
			w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);
			if (!rps__lock_is_locked(w) || rps__lock_owner(w) == RPS__LOCK_OWNER_FENCE) {
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

int rps__srv_post_recv(struct conn *c, uint32_t i)
{
	struct rps__sge sge = { .addr = rbuf(c, i), .len = (uint32_t)c->msg_max, .mr = c->rbufs_mr };

	return rps__post_recv(c->ep, &sge, ((uint64_t)WRID_RECV << 32) | i);
}
#define post_recv_buf rps__srv_post_recv

void rps__srv_conn_free(struct rps__server *srv, struct conn *c)
{
	if (!c)
		return;
	rps__ep_close(c->ep);
	rps__mr_dereg(c->slots_mr);
	rps__mr_dereg(c->rbufs_mr);
	rps__mr_dereg(c->sbufs_mr);
	rps__mr_dereg(c->rd_mr);
	free(c->rd_buf);
	if (c->slots) {
		rps__topo_free(srv->topo, c->slots, (size_t)srv->cfg.nslots * srv->slot_size);
		rps__srv_mem_give(srv, (size_t)srv->cfg.nslots * srv->slot_size);
	}
	if (c->rbufs)
		rps__topo_free(srv->topo, c->rbufs, (size_t)c->nrecv * c->msg_max);
	if (c->sbufs)
		rps__topo_free(srv->topo, c->sbufs, (size_t)c->nsend * c->msg_max);
	free(c->sfree);
	free(c->slot_state);
	rps__srv_mem_give(srv, c->bufs_charged);
	if (c->owner)
		srv->owner_used[c->owner] = 0;
	free(c);
}
#define conn_free rps__srv_conn_free

static uint32_t owner_alloc(struct rps__server *srv);

/* A connection's buffers (before the endpoint exists): workers get staging
 * slots and small control buffers, peers and psctl big message buffers. */
int rps__srv_conn_new(struct rps__server *srv, enum conn_role_kind role, struct conn **out)
{
	size_t slots_len = (size_t)srv->cfg.nslots * srv->slot_size;
	struct conn *c;
	uint32_t i;
	int ret;

	c = calloc(1, sizeof(*c));
	if (!c)
		return rps__seterr(-ENOMEM, "out of memory");
	c->srv = srv;
	c->rank = -1;
	c->role = role;
	if (role == CONN_WORKER) {
		c->msg_max = RPS__MSG_MAX;
		c->nrecv = CTRL_CREDITS + srv->cfg.nslots + 4;
		c->nsend = CTRL_CREDITS + srv->cfg.nslots + 4;
		ret = rps__srv_mem_take(srv, slots_len, "staging slots");
		if (ret) {
			free(c);
			return ret;
		}
		c->slots = rps__topo_alloc(srv->topo, &srv->place, slots_len);
		if (!c->slots) {
			rps__srv_mem_give(srv, slots_len);
			goto err_nomem;
		}
		c->slot_state = calloc(srv->cfg.nslots, 1);
		c->owner = owner_alloc(srv);
		if (!c->slot_state || !c->owner)
			goto err_nomem;
	} else {
		c->msg_max = RPS__BIG_MSG_MAX;
		c->nrecv = PEER_RECV;
		c->nsend = PEER_SEND;
		/* 2 MiB each: counted like staging slots, or many psctl
		 * connections could take what --memory-limit promises to cap */
		ret = rps__srv_mem_take(srv, (size_t)(c->nrecv + c->nsend) * c->msg_max,
					role == CONN_PEER ? "peer connection buffers" : "admin connection buffers");
		if (ret) {
			free(c);
			return ret;
		}
		c->bufs_charged = (size_t)(c->nrecv + c->nsend) * c->msg_max;
	}
	c->rbufs = rps__topo_alloc(srv->topo, &srv->place, (size_t)c->nrecv * c->msg_max);
	c->sbufs = rps__topo_alloc(srv->topo, &srv->place, (size_t)c->nsend * c->msg_max);
	c->sfree = calloc(c->nsend, sizeof(*c->sfree));
	if (!c->rbufs || !c->sbufs || !c->sfree)
		goto err_nomem;
	for (i = 0; i < c->nsend; i++)
		c->sfree[i] = c->nsend - 1 - i;
	c->nsfree = c->nsend;
	ret = c->slots ? rps__mr_reg(srv->fab, c->slots, slots_len, RPS__ACCESS_REMOTE_WRITE, &c->slots_mr) : 0;
	if (!ret)
		ret = rps__mr_reg(srv->fab, c->rbufs, (size_t)c->nrecv * c->msg_max, RPS__ACCESS_LOCAL, &c->rbufs_mr);
	if (!ret)
		ret = rps__mr_reg(srv->fab, c->sbufs, (size_t)c->nsend * c->msg_max, RPS__ACCESS_LOCAL, &c->sbufs_mr);
	if (ret) {
		rps__srv_conn_free(srv, c);
		return ret;
	}
	*out = c;
	return 0;
err_nomem:
	rps__srv_conn_free(srv, c);
	return rps__seterr(-ENOMEM, "out of memory for a connection");
}

/* Add to the connection table (workers are capped by --max-connections;
 * peers and psctl are not: they are few and the cluster needs them). */
static int conn_table_add(struct rps__server *srv, struct conn *c)
{
	if (srv->nconns == srv->conns_cap) {
		uint32_t cap = srv->conns_cap ? srv->conns_cap * 2 : 16;
		struct conn **grown = realloc(srv->conns, cap * sizeof(*grown));
		if (!grown)
			return -ENOMEM;
		srv->conns = grown;
		srv->conns_cap = cap;
	}
	srv->conns[srv->nconns++] = c;
	return 0;
}

static uint32_t count_role(const struct rps__server *srv, enum conn_role_kind role)
{
	uint32_t i, n = 0;

	for (i = 0; i < srv->nconns; i++)
		n += srv->conns[i]->role == role;
	return n;
}

static void conn_destroy(struct rps__server *srv, struct conn *c)
{
	uint32_t i;

	if (c->role == CONN_WORKER)
		rps__log(RPS__LOG_INFO, "worker %s (rank %d) gone", rps__ep_peer(c->ep), c->rank);
	if (srv->hooks.on_conn_gone)
		srv->hooks.on_conn_gone(srv->hooks.ctx, c);
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
		for (j = 0; t && j < t->layout.nshards; j++)
			if (t->shards[j].init_conn == c) {
				t->shards[j].init_conn = NULL;
				rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: creator left before sending initial values",
					 t->name, t->shards[j].index);
			}
	}
	rank_left(srv, c);
	for (i = 0; i < srv->nconns; i++)
		if (srv->conns[i] == c) {
			srv->conns[i] = srv->conns[--srv->nconns];
			break;
		}
	conn_free(srv, c);
	/* Pushes held behind the departed worker (sync) stay held: the step
	 * cannot complete without it, and applying a partial sum would break
	 * the sync invariant. */
	rps__srv_drain_held(srv);
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

static void reject_with(struct rps__conn_req *req, const char *why)
{
	size_t len = strlen(why) + 1;

	rps__log(RPS__LOG_WARN, "rejecting a connection: %s", why);
	rps__reject(req, why, len > RPS__PRIVDATA_MAX ? RPS__PRIVDATA_MAX : len);
}

static void accept_one(struct rps__server *srv, struct rps__conn_req *req)
{
	struct rps__conn_priv priv;
	struct rps__ep_attr attr = { 0 };
	struct conn *c = NULL;
	size_t len;
	const void *data = rps__conn_req_data(req, &len);
	const char *why = NULL;
	uint32_t i;
	int ret;

	memset(&priv, 0, sizeof(priv));
	memcpy(&priv, data, RPS__MIN(len, sizeof(priv)));
	if (len < offsetof(struct rps__conn_priv, from_id) || priv.magic != RPS__DESC_MAGIC)
		why = "not an rdmaps worker";
	else if (priv.version != RPS__PROTO_VERSION)
		why = "protocol version mismatch: upgrade librdmaps or rdmapsd";
	else if (priv.role < RPS__ROLE_WORKER || priv.role > RPS__ROLE_ADMIN)
		why = "unknown connection role";
	else if (req->peer_sq_depth > ANNOUNCED_SQ_MAX)
		why = "announced send queue depth over 1024";
	else if (priv.role == RPS__ROLE_WORKER && count_role(srv, CONN_WORKER) >= srv->cfg.max_conns)
		why = "server full: raise rdmapsd --max-connections";
	else if (priv.role == RPS__ROLE_ADMIN && count_role(srv, CONN_ADMIN) >= ADMIN_CONNS_MAX)
		why = "too many admin connections (16): close psctl sessions";
	if (!why && priv.role == RPS__ROLE_PEER) {
		if (srv->hooks.accept_peer)
			srv->hooks.accept_peer(srv->hooks.ctx, priv.from_id, priv.to_id, &why);
		else
			why = "this server takes no peers";
	}
	if (why) {
		reject_with(req, why);
		return;
	}
	ret = rps__srv_conn_new(srv, (enum conn_role_kind)priv.role, &c);
	if (ret) {
		rps__log(RPS__LOG_WARN, "connection refused: %s", rps__errbuf());
		reject_with(req, ret == -ENOMEM ? "server out of memory: raise rdmapsd --memory-limit"
						: "server out of resources");
		return;
	}
	c->peer_id = priv.role == RPS__ROLE_PEER ? priv.from_id : 0;
	c->last_active_ns = rps__now_ns();
	attr.sq_depth = c->nsend + 8;
	attr.rq_depth = c->nrecv;
	attr.max_inline = 64;
	priv.role = 0;
	priv.from_id = srv->my_id;
	ret = rps__accept(req, srv->cq, &attr, &priv, sizeof(priv), &c->ep);
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
	if (conn_table_add(srv, c))
		goto err_free;
	if (c->role == CONN_PEER && srv->hooks.peer_attached)
		srv->hooks.peer_attached(srv->hooks.ctx, c);
	else
		rps__log(c->role == CONN_WORKER ? RPS__LOG_INFO : RPS__LOG_DEBUG, "%s connected from %s",
			 role_name(c), rps__ep_peer(c->ep));
	return;
err_free:
	conn_free(srv, c);
}

/* peer_dial: an outgoing peer connection joins the table. */
int rps__srv_conn_attach(struct rps__server *srv, struct conn *c)
{
	uint32_t i;
	int ret;

	rps__ep_set_context(c->ep, c);
	for (i = 0; i < c->nrecv; i++) {
		ret = post_recv_buf(c, i);
		if (ret)
			return ret;
	}
	return conn_table_add(srv, c) ? rps__seterr(-ENOMEM, "out of memory") : 0;
}

/* ---- the loop ------------------------------------------------------------- */

static void on_completion(struct rps__server *srv, const struct rps__wc *wc)
{
	struct conn *c = wc->ep ? rps__ep_context(wc->ep) : NULL;
	uint32_t kind = (uint32_t)(wc->wr_id >> 32), idx = (uint32_t)wc->wr_id;

	if (!c)
		return;
	if (wc->status != RPS__WC_SUCCESS) {
		if (kind == WRID_READ && srv->hooks.on_read_done)
			srv->hooks.on_read_done(srv->hooks.ctx, c, false, NULL);
		if (!c->dead)
			rps__log(RPS__LOG_INFO, "%s %s: %s", role_name(c), rps__ep_peer(c->ep),
				 rps__wc_status_str(wc->status));
		c->dead = true;
		return;
	}
	if (kind == WRID_SEND) {
		if (idx < c->nsend)
			c->sfree[c->nsfree++] = idx;
		if (c->role == CONN_PEER && srv->hooks.on_send_done)
			srv->hooks.on_send_done(srv->hooks.ctx, c);
		return;
	}
	if (kind == WRID_READ) {
		if (srv->hooks.on_read_done)
			srv->hooks.on_read_done(srv->hooks.ctx, c, true, c->rd_buf);
		return;
	}
	if (kind != WRID_RECV || idx >= c->nrecv)
		return;
	c->last_active_ns = rps__now_ns();
	if (!c->dead) {
		if (wc->opcode == RPS__WC_RECV_IMM && c->role == CONN_WORKER)
			on_push(srv, c, wc->imm);
		else if (wc->opcode == RPS__WC_RECV_IMM)
			conn_fail(c, "wrote into memory it does not own");
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

/* --idle-timeout-ms: a worker that sent nothing for that long gives its
 * --max-connections place back.  Pulls and lock operations are one-sided
 * (no completion here), so only requests and pushes count as activity. */
static void drop_idle_workers(struct rps__server *srv, uint64_t now)
{
	uint64_t limit = (uint64_t)srv->cfg.idle_timeout_ms * 1000000ull;
	char why[96];
	uint32_t i;

	for (i = 0; i < srv->nconns; i++) {
		struct conn *c = srv->conns[i];
		if (c->role != CONN_WORKER || c->dead || now - c->last_active_ns < limit)
			continue;
		snprintf(why, sizeof(why), "idle for %u ms: dropped (rdmapsd --idle-timeout-ms)",
			 srv->cfg.idle_timeout_ms);
		conn_fail(c, why);
	}
}

static void accept_pending(struct rps__server *srv)
{
	struct rps__conn_req *req;

	while (rps__listener_get_request(srv->listener, &req) == 0)
		accept_one(srv, req);
}

#define LISTENER_CHECK_NS (250ull * 1000000ull)
#define TIMERS_IDLE_MS 1000	/* no layer above: no timers of its own */

int rps__server_run(struct rps__server *srv)
{
	struct rps__wc wc[32];
	uint64_t spin_ns = (uint64_t)srv->cfg.spin_us * 1000ull;
	uint64_t scan_every = RPS__MAX((uint64_t)srv->cfg.lease_ms * 1000000ull / 4, 1000000ull);
	uint64_t idle_since = rps__now_ns();
	uint64_t next_listener_check = 0;

	/* The serving thread near the HCA; what it mallocs (optimizer state,
	 * accumulators) then lands on its node by first touch. */
	if (rps__topo_pin_thread(srv->topo, &srv->place))
		rps__log(RPS__LOG_WARN, "%s: serving unpinned", rps__errbuf());
	srv->next_lease_scan = rps__now_ns() + scan_every;
	for (;;) {
		struct pollfd pfd[3];
		bool stop = false;
		uint64_t now;
		int n, i, timeout, cp_ms = TIMERS_IDLE_MS;

		/* here, not only after poll(): busy completions or --spin-us
		 * may keep the loop from sleeping for as long as they last */
		if (__atomic_load_n(&srv->stopping, __ATOMIC_RELAXED))
			return 0;
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
		/* the listener drops silent handshakes only when asked: ask on a
		 * timer too, not only when a new connection arrives */
		if (now >= next_listener_check) {
			accept_pending(srv);
			if (srv->cfg.idle_timeout_ms)
				drop_idle_workers(srv, now);
			next_listener_check = now + LISTENER_CHECK_NS;
		}
		if (srv->hooks.run_timers)
			cp_ms = srv->hooks.run_timers(srv->hooks.ctx, now, &stop);
		if (cp_ms < 0)
			return cp_ms;
		if (stop)
			return 0;
		reap_dead(srv);
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
		if (cp_ms < timeout)
			timeout = cp_ms;
		if ((int)(LISTENER_CHECK_NS / 1000000ull) < timeout)
			timeout = (int)(LISTENER_CHECK_NS / 1000000ull);
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
	ssize_t r;

	/* atomic, not only volatile: a signal handler (rdmapsd) or another
	 * thread (tests, psperf's in-process servers) may call this */
	__atomic_store_n(&srv->stopping, 1, __ATOMIC_RELAXED);
	r = write(srv->stop_fd, &one, sizeof(one));

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

int rps__server_config_check(const struct rps__server_config *cfg)
{
	if (cfg->shard_bytes < 64 || cfg->shard_bytes % 4 || cfg->shard_bytes > (1u << 30))
		return rps__seterr(-EINVAL, "--shard-size %u: must be a multiple of 4 between 64 B and 1 GiB",
				   cfg->shard_bytes);
	if (cfg->nslots < 1 || cfg->nslots > 64)
		return rps__seterr(-EINVAL, "--slots %u: must be between 1 and 64 (workers use at most 64)", cfg->nslots);
	if (cfg->max_conns < 1 || cfg->max_conns > RPS__SERVER_CONNS_MAX)
		return rps__seterr(-EINVAL, "--max-connections %u: must be between 1 and %u", cfg->max_conns,
				   RPS__SERVER_CONNS_MAX);
	if (cfg->spin_us < 0 || (uint32_t)cfg->spin_us > RPS__SERVER_SPIN_US_MAX)
		return rps__seterr(-EINVAL, "--spin-us %d: must be between 0 and %u", cfg->spin_us,
				   RPS__SERVER_SPIN_US_MAX);
	if (cfg->mem_limit && cfg->mem_limit < rps__server_min_memory(cfg))
		return rps__seterr(-EINVAL, "--memory-limit %zu: below the %zu bytes one worker connection and one shard need",
				   cfg->mem_limit, rps__server_min_memory(cfg));
	return 0;
}

int rps__server_create(const struct rps__server_config *cfg, struct rps__server **out)
{
	struct rps__fabric_attr fattr = { 0 };
	struct rps__server *srv;
	int ret;

	ret = rps__server_config_check(cfg);
	if (ret)
		return ret;
	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return rps__seterr(-ENOMEM, "out of memory");
	srv->cfg = *cfg;
	srv->stop_fd = -1;
	srv->shard_elems = cfg->shard_bytes / 4;
	srv->slot_size = RPS__ALIGN_UP(RPS__PUSH_DESC_SIZE + (size_t)cfg->shard_bytes, 64);
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
	ret = rps__cq_create(srv->fab, cfg->max_conns * 2 * (CTRL_CREDITS + cfg->nslots + 8) +
			     (RPS__SMAP_MAX_MEMBERS + 8) * 2 * (PEER_RECV + PEER_SEND + 8), &srv->cq);
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
	if (srv->hooks.fini)
		srv->hooks.fini(srv->hooks.ctx);
	memset(&srv->hooks, 0, sizeof(srv->hooks));
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
