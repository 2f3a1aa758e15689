/*
 * push.c - pushes: consuming one when its consistency mode allows it (sync:
 * in rank order within a step; async/bounded: under the shard lock the
 * worker holds), holding or parking it until then, publishing the new
 * version under the header's seqlock, and the shard lock words (released
 * for the worker, broken when its lease expires or it disconnects).
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "kernels/agg.h"
#include "kernels/optim.h"
#include "proto/proto.h"
#include "proto/shard.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

#define conn_fail rps__srv_conn_fail
#define conn_reply rps__srv_conn_reply
#define publish_begin rps__srv_publish_begin
#define publish_end rps__srv_publish_end
#define shard_update rps__srv_shard_update
#define dedup_seen rps__srv_dedup_seen
#define dedup_note rps__srv_dedup_note
#define push_ack rps__srv_push_ack

/* ---- publishing -------------------------------------------------------- */

/* Publish a new epoch in the header (RPS__EPOCH_MOVED: fenced), so a
 * worker's READ of a moved shard sees it did not read the owner's copy.
 * A shard unpublished now (odd seq: not initialised yet, or an update
 * applied here and not yet on every replica) stays so: its publication is
 * the INIT's or the replicas' confirmation's (repl_stream.c), never an
 * epoch change's, or a reader could take a version that a failover then
 * loses. */
void rps__srv_publish(struct shard *s, uint64_t epoch)
{
	bool unpublished = (__atomic_load_n(&s->hdr->seq, __ATOMIC_RELAXED) & 1) != 0;

	publish_begin(s);
	s->hdr->epoch = epoch;
	if (!unpublished)
		publish_end(s);
}

void rps__srv_wake_waiters(struct rps__server *srv, struct srv_tensor *t, uint32_t local)
{
	struct shard *s = &t->shards[local];
	uint32_t i = 0;

	while (i < srv->req.nwaiters) {
		struct waiter *w = &srv->req.waiters[i];
		if (w->tensor_id == t->id && w->local == local &&
		    s->ready && s->step >= w->min_version && s->hdr->min_clock >= w->min_clock) {
			struct rps__wait_rep rep = { .version = s->step, .min_clock = s->hdr->min_clock };
			conn_reply(w->conn, RPS__MSG_WAIT_REP, w->req_id, 0, &rep, sizeof(rep));
			*w = srv->req.waiters[--srv->req.nwaiters];
			continue;
		}
		i++;
	}
}

/* ---- consuming pushes ------------------------------------------------- */

/* Has rank's push for step clock of the shard been parked here (out of
 * turn)?  A parked push was acknowledged: it counts for its step. */
bool rps__srv_parked_has(const struct rps__server *srv, const struct srv_tensor *t, uint32_t local, int rank,
			 uint64_t clock)
{
	uint32_t i;

	for (i = 0; i < srv->push.nparked; i++) {
		const struct parked *p = &srv->push.parked[i];
		if (p->t == t && p->local == local && p->rank == rank && p->clock == clock)
			return true;
	}
	return false;
}

/* ---- parking buffers --------------------------------------------------- */

#define PARK_POOL_MAX 4096u	/* buffers kept, whatever their size */

void *rps__srv_park_buf_get(struct rps__server *srv, size_t nbytes, size_t *cap)
{
	uint32_t i = srv->push.npark_pool;
	void *buf;

	nbytes = RPS__MAX(nbytes, 1u);
	/* a kept one that fits and is not twice too big (bf16 beside fp32) */
	while (i--) {
		struct park_buf *pb = &srv->push.park_pool[i];
		if (pb->cap >= nbytes && pb->cap / 2 < nbytes) {
			buf = pb->buf;
			*cap = pb->cap;
			assert(srv->push.park_pool_bytes >= pb->cap);
			srv->push.park_pool_bytes -= pb->cap;	/* (still in mem_used) */
			*pb = srv->push.park_pool[--srv->push.npark_pool];
			return buf;
		}
	}
	if (rps__srv_mem_take(srv, nbytes, "parking a push"))
		return NULL;
	buf = malloc(nbytes);
	if (!buf) {
		rps__srv_mem_give(srv, nbytes);
		rps__seterr(-ENOMEM, "parking a push: out of memory");
		return NULL;
	}
	*cap = nbytes;
	return buf;
}

void rps__srv_park_pool_trim(struct rps__server *srv, size_t bytes)
{
	size_t freed = 0;

	while (srv->push.npark_pool && freed < bytes) {
		struct park_buf *pb = &srv->push.park_pool[--srv->push.npark_pool];
		free(pb->buf);
		assert(srv->push.park_pool_bytes >= pb->cap);
		srv->push.park_pool_bytes -= pb->cap;
		rps__srv_mem_give(srv, pb->cap);
		freed += pb->cap;
	}
}

/* Kept while the pool is under a quarter of --park-limit: a steady job
 * parks about as much as it takes, and that much is reused. */
void rps__srv_parked_release(struct rps__server *srv, struct parked *p)
{
	if (p->in_acc || !p->data) {
		p->data = NULL;
		return;
	}
	assert(srv->push.parked_bytes >= p->nbytes);	/* its bytes were counted when it was parked */
	srv->push.parked_bytes -= p->nbytes;
	if (srv->push.npark_pool < PARK_POOL_MAX)	/* failing, the buffer is freed below */
		(void)rps__grow(&srv->push.park_pool, &srv->push.park_pool_cap, srv->push.npark_pool + 1,
				sizeof(*srv->push.park_pool), 16);
	if (srv->push.npark_pool < srv->push.park_pool_cap &&
	    srv->push.park_pool_bytes + p->cap <= srv->cfg.park_limit / 4) {
		srv->push.park_pool[srv->push.npark_pool].buf = p->data;
		srv->push.park_pool[srv->push.npark_pool].cap = p->cap;
		srv->push.npark_pool++;
		srv->push.park_pool_bytes += p->cap;
		assert(srv->push.npark_pool <= srv->push.park_pool_cap);
	} else {
		free(p->data);
		rps__srv_mem_give(srv, p->cap);
	}
	p->data = NULL;
}

/* The first rank from `from` on whose turn it is at the shard's step:
 * removed ranks with nothing parked for it are passed over (a push parked
 * before the removal still counts). */
static int next_turn(const struct rps__server *srv, const struct srv_tensor *t, uint32_t local, int from)
{
	while (from < t->spec.num_workers && rps__srv_rank_removed(t, from) &&
	       !rps__srv_parked_has(srv, t, local, from, t->shards[local].step))
		from++;
	return from;
}

/*
 * Sync mode: add rank's gradient for step `clock` to the shard's sum if it
 * is its turn (fixed summation order: rank 0's, + rank 1's, + ..., so the
 * sum is bit-identical whatever the arrival order), and apply the step when
 * the last rank is in.  0 taken, -EAGAIN not its turn yet, -EALREADY the
 * step already has it.
 *
 * A push taken early (take_early) sits alone in the accumulator: then the
 * push of next_rank makes the sum of both at once, early + next, which is
 * next + early to the bit (one IEEE addition commutes), and the turn passes
 * both.  If next_rank is removed meanwhile, the early rank's own turn comes
 * with data NULL (its parked entry): the accumulator already holds it.
 */
static int sync_take(struct rps__server *srv, struct srv_tensor *t, uint32_t local, uint64_t clock,
		     int rank, const void *data)
{
	struct shard *s = &t->shards[local];
	int early = s->early_rank, last;

	if (clock < s->step || (clock == s->step && rank < s->next_rank))
		return -EALREADY;
	/* only the partition's primary sums, and only while it serves: a
	 * backup keeps the step its image carried (seeding) for when it is
	 * promoted, and a fenced partition's image is cut already */
	if (!rps__srv_part_serving(srv, s->part))
		return -EAGAIN;
	if (clock >= t->hold_limit)
		return -EAGAIN;		/* a checkpoint holds the tensor at this step */
	if (!s->ready || clock > s->step || rank != s->next_rank)
		return -EAGAIN;
	if (!data && rank != early) {
		/* an entry taken early whose sum is gone: nothing to add */
		rps__log(RPS__LOG_ERROR, "tensor '%s' shard %u: rank %d's push taken early is not in the sum",
			 t->name, s->index, rank);
		return -EALREADY;
	}
	last = early >= 0 ? early : rank;	/* the last rank this take passes */
	/* replicated: one step at a time, and its last contribution only
	 * once every replica has room for the step */
	if (rps__srv_repl_part(srv, s->part) &&
	    (s->repl_pending || (next_turn(srv, t, local, last + 1) == t->spec.num_workers &&
				 rps__srv_repl_reserve(srv, t, s->part))))
		return -EAGAIN;
	if (rank == early) {
		s->nsummed++;			/* (next_rank's turn was passed over) */
	} else if (early >= 0) {
		rps__agg_add(s->acc, data, t->spec.dtype, s->elems);
		s->nsummed += 2;
	} else {
		if (s->nsummed == 0)
			rps__agg_copy(s->acc, data, t->spec.dtype, s->elems);
		else
			rps__agg_add(s->acc, data, t->spec.dtype, s->elems);
		s->nsummed++;
	}
	s->early_rank = -1;
	s->next_rank = last + 1;
	rps__srv_sync_advance(srv, t, local, rps__srv_repl_part(srv, s->part));
	return 0;
}

/*
 * Sync: pass over removed ranks whose turn it is (none of their pushes for
 * this step is here), and apply the step once every rank had its turn.  A
 * step with no contribution at all is never applied (the last rank cannot
 * be removed).  Called after each contribution and when a rank is removed.
 */
void rps__srv_sync_advance(struct rps__server *srv, struct srv_tensor *t, uint32_t local, bool reserved)
{
	struct shard *s = &t->shards[local];

	if (!rps__srv_part_serving(srv, s->part))
		return;		/* (a backup applies the primary's steps, whole) */
	for (;;) {
		s->next_rank = next_turn(srv, t, local, s->next_rank);
		if (s->next_rank < t->spec.num_workers || !s->nsummed || s->step >= t->hold_limit)
			return;
		if (rps__srv_repl_part(srv, s->part)) {
			/* the step's last contribution reserved the credits
			 * (sync_take: reserved); a removal completing it does here,
			 * and one that finds no credit leaves the step owed:
			 * drain_held applies it when the credits come back */
			if (!reserved && rps__srv_repl_reserve(srv, t, s->part)) {
				if (!s->advance_owed) {
					s->advance_owed = true;
					srv->push.advances_owed++;
				}
				return;
			}
			s->next_rank = 0;
			s->nsummed = 0;
			/* published and woken once on every replica (repl_stream.c) */
			publish_begin(s);
			rps__srv_shard_apply(t, s, s->acc);
			rps__srv_repl_step(srv, t, s);
			return;
		}
		s->next_rank = 0;
		s->nsummed = 0;
		shard_update(t, s, s->acc);
		rps__srv_wake_waiters(srv, t, local);
	}
}

/*
 * Sync, a backup: the primary's step `s->step - 1` of the shard is applied
 * here (its sum, REPL_STEP).  The step in progress that a seeding image
 * brought (the partial sum, which ranks are in, pushes parked for it) is
 * in that sum: forgotten, as are parked pushes of every step now applied.
 * Parked pushes of later steps stay: they were acknowledged before the
 * partition had this backup, and nobody will resend them.
 */
void rps__srv_sync_step_replicated(struct rps__server *srv, struct srv_tensor *t, uint32_t local)
{
	struct shard *s = &t->shards[local];
	uint32_t i = 0;

	s->next_rank = 0;
	s->nsummed = 0;
	s->early_rank = -1;
	while (i < srv->push.nparked) {
		struct parked *p = &srv->push.parked[i];
		if (p->t == t && p->local == local && p->clock < s->step) {
			rps__srv_parked_release(srv, p);
			*p = srv->push.parked[--srv->push.nparked];
			continue;
		}
		i++;
	}
}

/* Sync, a backup: its primary's sum so far of the shard's step
 * (REPL_PARTIAL) is applied here: parked pushes of that step it holds
 * (from a seeding image, or shipped) are forgotten. */
void rps__srv_sync_partial_replicated(struct rps__server *srv, struct srv_tensor *t, uint32_t local)
{
	struct shard *s = &t->shards[local];
	uint32_t i = 0;

	while (i < srv->push.nparked) {
		struct parked *p = &srv->push.parked[i];
		if (p->t == t && p->local == local && p->clock == s->step && p->rank < s->next_rank) {
			rps__srv_parked_release(srv, p);
			*p = srv->push.parked[--srv->push.nparked];
			continue;
		}
		i++;
	}
}

int rps__srv_parked_keep(struct rps__server *srv, struct srv_tensor *t, uint32_t local, uint64_t clock, int rank,
			 const void *data, size_t nbytes)
{
	struct parked *pk;

	if (rps__srv_parked_has(srv, t, local, rank, clock))
		return 0;
	if (rps__srv_parked_slot(srv, &pk))
		return rps__seterr(-ENOMEM, "out of memory");
	pk->data = malloc(nbytes ? nbytes : 1);
	if (!pk->data)
		return rps__seterr(-ENOMEM, "out of memory");
	pk->cap = nbytes;
	memcpy(pk->data, data, nbytes);
	pk->t = t;
	pk->local = local;
	pk->clock = clock;
	pk->rank = rank;
	pk->nbytes = nbytes;
	srv->push.nparked++;
	srv->push.parked_bytes += nbytes;
	rps__srv_mem_charge(srv, nbytes);
	return 0;
}

enum consume_result { CONSUMED, NOT_YET };

/* Release the lock word w (0: none held) on the worker's behalf, through
 * the transport's atomic path; returns the new word for the ack.  The
 * version moves on with every release, so a word never comes back. */
uint64_t rps__srv_release_lock(struct rps__server *srv, struct srv_tensor *t, struct shard *s, uint64_t w)
{
	uint64_t next, old = 0;

	if (!w)
		return 0;
	/* a word some holder locked: a fence is lifted by unfence_shard alone */
	assert(rps__lock_is_locked(w) && rps__lock_owner(w) != RPS__LOCK_OWNER_FENCE);
	next = rps__lock_unlocked(rps__lock_version(w) + 1);
	if (rps__local_cas(srv->fab, t->regions[s->part].mr, &s->hdr->lock, w, next, &old)) {
		rps__log(RPS__LOG_ERROR, "releasing lock of %s shard %u: %s", t->name, s->index, rps__errbuf());
		return 0;
	}
	return old == w ? next : old;
}

static struct rps__push_desc *slot_desc(struct srv_conn *c, uint32_t slot)
{
	return (struct rps__push_desc *)(c->bufs.slots + (size_t)slot * c->srv->slot_size);
}

void rps__srv_ack_then_release(struct rps__server *srv, struct srv_conn *c, uint32_t slot, int status,
			       struct srv_tensor *t, struct shard *s, uint64_t w, bool hold)
{
	uint64_t next = rps__lock_unlocked(rps__lock_version(w) + 1), left;

	if (!w || hold || !t->regions[s->part].mr) {
		if (hold)
			s->lease_word = 0;
		rps__srv_push_ack(c, slot, status, s->step, w && !hold ? 0 : w);
		return;
	}
	rps__srv_push_ack(c, slot, status, s->step, next);
	left = rps__srv_release_lock(srv, t, s, w);
	if (left != next)
		rps__log(RPS__LOG_DEBUG, "tensor '%s' shard %u: lock word %#llx at its release, not %#llx",
			 t->name, s->index, (unsigned long long)left, (unsigned long long)w);
}

void rps__srv_push_ack(struct srv_conn *c, uint32_t slot, int status, uint64_t version, uint64_t lock)
{
	struct rps__push_desc *d = slot_desc(c, slot);
	struct rps__push_ack ack = {
		.slot = slot, .shard = d->shard, .version = version, .lock = lock,
	};

	c->bufs.slot_state[slot] = 0;
	conn_reply(c, RPS__MSG_PUSH_ACK, d->push_id, status, &ack, sizeof(ack));
}

/* Sync, partition with backups: the first stage of the acknowledgement
 * (summed or parked: the slot is free); STEP_DONE completes the push once
 * its step `clock` is on every replica (repl_stream.c). */
static void push_taken(struct rps__server *srv, struct srv_conn *c, uint32_t slot, struct srv_tensor *t,
		       struct shard *s, uint64_t clock, uint64_t version)
{
	struct rps__push_desc *d = slot_desc(c, slot);
	struct rps__push_ack ack = { .slot = slot, .shard = d->shard, .version = version };
	int r;

	c->bufs.slot_state[slot] = 0;
	srv->repl.stats.taken_acks++;	/* (before the send: tests read it once the worker heard) */
	rps__srv_repl_step_wait(srv, c, t, s, clock);
	rps__srv_conn_reply_flags(c, RPS__MSG_PUSH_ACK, RPS__ACK_TAKEN, d->push_id, 0, &ack, sizeof(ack));
	/* a rank already left before its push for the step: end this one at
	 * once as taken, naming the rank (that STEP_DONE entry goes after the
	 * TAKEN, at the end of the turn) */
	r = rps__srv_missing_rank(srv, t, (uint32_t)(s - t->shards));
	if (r >= 0)
		rps__srv_repl_step_orphaned(srv, s, r);
}

/* Refuse a push for a partition whose contents are lost, or that is not
 * served here under the push's epoch.  True: refused (acknowledged). */
static bool refuse_unserved(struct rps__server *srv, struct srv_conn *c, uint32_t slot, struct srv_tensor *t,
			    struct shard *s, const struct rps__push_desc *d)
{
	if (rps__srv_part_lost(srv, s->part)) {
		push_ack(c, slot, -ENODATA, 0, 0);
		return true;
	}
	/* Fencing: only the owner of the partition, under the epoch the map
	 * gave it, takes pushes, and, if it has backups, only while this
	 * server's lease holds.  A refused push was not applied: the worker
	 * refreshes its map and sends it to the new owner. */
	if (!s->hdr || !rps__srv_part_serving(srv, s->part) || d->epoch != srv->parts[s->part].epoch ||
	    rps__srv_lease_fenced(srv, s->part) || RPS__UNLIKELY(rps__fault("push-stale-epoch"))) {
		uint64_t left = 0;
		/* a lock this worker took before the fence: let go of it, or
		 * fencing would wait for the lease */
		if (s->hdr && t->regions[s->part].mr && t->spec.mode != RPS_MODE_SYNC) {
			uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);
			if (w == d->lock && rps__lock_is_locked(w) && rps__lock_owner(w) == c->owner)
				left = rps__srv_release_lock(srv, t, s, w);
		}
		push_ack(c, slot, RPS_ESTALE_EPOCH, 0, left);
		return true;
	}
	return false;
}

/* The creator's initial values of a shard. */
static enum consume_result consume_init(struct rps__server *srv, struct srv_conn *c, uint32_t slot,
					struct srv_tensor *t, struct shard *s, uint32_t local,
					const struct rps__push_desc *d)
{
	const void *data = (const char *)d + RPS__PUSH_DESC_SIZE;

	if (s->ready || s->init_conn != c) {
		push_ack(c, slot, -EALREADY, s->step, 0);
		return CONSUMED;
	}
	if (d->nbytes != (uint64_t)s->elems * 4u) {
		push_ack(c, slot, -EMSGSIZE, 0, 0);
		return CONSUMED;
	}
	if (rps__srv_repl_part(srv, s->part)) {
		if (rps__srv_repl_reserve(srv, t, s->part))
			return NOT_YET;
		publish_begin(s);
		memcpy(s->params, data, d->nbytes);
		s->ready = true;
		s->init_conn = NULL;
		rps__srv_repl_init(srv, t, s, c, slot);	/* publish, ack, wake: once replicated */
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
 * have to come back for that: a push is one round trip).  True: decided
 * here (refused, or a retry acknowledged); else *holds is the lock word. */
static bool check_lock(struct rps__server *srv, struct srv_conn *c, uint32_t slot, struct srv_tensor *t,
		       struct shard *s, const struct rps__push_desc *d, uint64_t *holds)
{
	uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);

	if (w != d->lock || !rps__lock_is_locked(w) || rps__lock_owner(w) != c->owner) {
		push_ack(c, slot, RPS_ELEASE, s->step, d->lock);
		return true;
	}
	*holds = w;
	/* A retried push that was applied already (idempotent push ids):
	 * acknowledge, do not apply again. */
	if (dedup_seen(s, c->client_id, d->push_id)) {
		rps__srv_ack_then_release(srv, c, slot, 0, t, s, *holds, (d->flags & RPS__DESC_HOLD) != 0);
		return true;
	}
	return false;
}

/* A worker key covers the tensors under its scope only, a reader key no
 * push at all (doc/security.md "Roles"): refused, and a lock the push names and
 * its connection holds is let go, so no one waits for its lease. */
static bool refuse_out_of_scope(struct rps__server *srv, struct srv_conn *c, uint32_t slot, struct srv_tensor *t,
				struct shard *s, const struct rps__push_desc *d)
{
	bool in_scope = rps__srv_scope_allows(c, t->name);
	uint64_t w, released = 0;
	char why[200];

	if (in_scope && c->auth.key_role != RPS__KEY_READER)
		return false;
	if (t->spec.mode != RPS_MODE_SYNC && s->hdr) {
		w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);
		if (w == d->lock && rps__lock_is_locked(w) && rps__lock_owner(w) == c->owner)
			released = rps__srv_release_lock(srv, t, s, w);
	}
	snprintf(why, sizeof(why), "a %s of '%s' pushed to '%s'%s", rps__key_role_name(c->auth.key_role), c->auth.scope,
		 t->name, in_scope ? " (readers do not push)" : ", outside its scope");
	rps__srv_log_refusal(srv, c, why);
	push_ack(c, slot, in_scope ? -EPERM : -EACCES, 0, released);
	return true;
}

/* Refuse a gradient of the wrong dtype or size, from the wrong rank, or
 * (sync) for a step out of reach.  True: refused (acknowledged). */
static bool refuse_bad_grad(struct rps__server *srv, struct srv_conn *c, uint32_t slot, struct srv_tensor *t,
			    struct shard *s, const struct rps__push_desc *d, uint64_t holds)
{
	if (d->dtype != t->spec.dtype || d->nbytes != (uint64_t)s->elems * rps__dtype_size(t->spec.dtype)) {
		push_ack(c, slot, -EMSGSIZE, 0, rps__srv_release_lock(srv, t, s, holds));
		return true;
	}
	if ((t->spec.mode != RPS_MODE_ASYNC) && (d->rank < 0 || d->rank >= t->spec.num_workers || d->rank != c->rank)) {
		push_ack(c, slot, -EINVAL, 0, rps__srv_release_lock(srv, t, s, holds));
		return true;
	}
	/* psctl remove-rank took this rank out of the tensor for good */
	if (rps__srv_rank_removed(t, d->rank)) {
		push_ack(c, slot, -EPERM, s->step, rps__srv_release_lock(srv, t, s, holds));
		return true;
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
		return true;
	}
	return false;
}

/* Sync: added to the step's sum in its turn, else NOT_YET. */
static enum consume_result consume_sync(struct rps__server *srv, struct srv_conn *c, uint32_t slot,
					struct srv_tensor *t, struct shard *s, uint32_t local,
					const struct rps__push_desc *d)
{
	const void *data = (const char *)d + RPS__PUSH_DESC_SIZE;
	uint64_t step = s->step;
	int ret = sync_take(srv, t, local, d->clock, d->rank, data);

	if (ret == -EAGAIN)
		return NOT_YET;
	/* replicated: TAKEN now, STEP_DONE once the step is on every replica;
	 * so is a resend whose step has it but is not replicated yet */
	if (rps__srv_repl_part(srv, s->part) &&
	    (!ret || (ret == -EALREADY && !rps__srv_repl_step_confirmed(s, d->clock)))) {
		push_taken(srv, c, slot, t, s, d->clock, step);
		return CONSUMED;
	}
	push_ack(c, slot, ret, step, 0);
	return CONSUMED;
}

/* async and bounded, replicated: applied, shipped to every replica; the
 * publication, the lock's release and the ack wait for them (repl_stream.c). */
static enum consume_result apply_async_replicated(struct rps__server *srv, struct srv_conn *c, uint32_t slot,
						  struct srv_tensor *t, struct shard *s, const struct rps__push_desc *d,
						  uint64_t holds)
{
	if (rps__srv_repl_reserve(srv, t, s->part))
		return NOT_YET;
	publish_begin(s);
	rps__srv_shard_apply(t, s, rps__srv_grad_fp32(s, (const char *)d + RPS__PUSH_DESC_SIZE, d->dtype));
	dedup_note(s, c->client_id, d->push_id);
	if (t->spec.mode == RPS_MODE_BOUNDED)
		rps__srv_clock_note(t, s, d->rank, d->clock);
	rps__srv_repl_push(srv, t, s, d, c, slot, holds);	/* (HOLD: kept past the replicas) */
	return CONSUMED;
}

/* async and bounded: applied alone, under the lock the worker holds */
static void apply_async(struct rps__server *srv, struct srv_conn *c, uint32_t slot, struct srv_tensor *t,
			struct shard *s, uint32_t local, const struct rps__push_desc *d, uint64_t holds)
{
	shard_update(t, s, rps__srv_grad_fp32(s, (const char *)d + RPS__PUSH_DESC_SIZE, d->dtype));
	dedup_note(s, c->client_id, d->push_id);
	if (t->spec.mode == RPS_MODE_BOUNDED)
		rps__srv_clock_note(t, s, d->rank, d->clock);
	rps__srv_ack_then_release(srv, c, slot, 0, t, s, holds, (d->flags & RPS__DESC_HOLD) != 0);
	rps__srv_wake_waiters(srv, t, local);
}

/*
 * Decide what to do with the push in (c, slot).  Every path that does not
 * return NOT_YET acknowledges the push and frees the slot: a push is applied
 * once or refused, never silently dropped.  The steps are static and called
 * once: the compiler inlines them, the push path does no more than before.
 */
static enum consume_result consume(struct rps__server *srv, struct srv_conn *c, uint32_t slot)
{
	struct rps__push_desc *d = slot_desc(c, slot);
	struct srv_tensor *t = rps__srv_tensor_by_id(srv, d->tensor_id);
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
	if (refuse_unserved(srv, c, slot, t, s, d))
		return CONSUMED;
	if (srv->cfg.keys && refuse_out_of_scope(srv, c, slot, t, s, d))
		return CONSUMED;
	/* replicated: an update still on its way to the replicas holds the
	 * shard (its lock, its publication) */
	if (s->repl_pending && t->spec.mode != RPS_MODE_SYNC)
		return NOT_YET;
	if (d->kind == RPS__PUSH_INIT)
		return consume_init(srv, c, slot, t, s, local, d);
	if (t->spec.mode != RPS_MODE_SYNC && check_lock(srv, c, slot, t, s, d, &holds))
		return CONSUMED;
	if (refuse_bad_grad(srv, c, slot, t, s, d, holds))
		return CONSUMED;
	if (!s->ready)
		return NOT_YET;
	if (t->spec.mode == RPS_MODE_SYNC)
		return consume_sync(srv, c, slot, t, s, local, d);
	if (rps__srv_repl_part(srv, s->part))
		return apply_async_replicated(srv, c, slot, t, s, d, holds);
	apply_async(srv, c, slot, t, s, local, d, holds);
	return CONSUMED;
}

static int held_add(struct rps__server *srv, struct srv_conn *c, uint32_t slot)
{
	if (rps__grow(&srv->push.held, &srv->push.held_cap, srv->push.nheld + 1, sizeof(*srv->push.held), 64))
		return -ENOMEM;
	srv->push.held[srv->push.nheld].conn = c;
	srv->push.held[srv->push.nheld].slot = slot;
	srv->push.nheld++;
	assert(srv->push.nheld <= srv->push.held_cap);
	c->bufs.slot_state[slot] = 1;
	return 0;
}

/* Sync steps completed by a rank removal while a replica had no credit
 * (rps__srv_sync_advance): try each again.  True if one was applied.  Rare:
 * a scan of the tensors only while some are owed. */
static bool pay_owed_advances(struct rps__server *srv)
{
	uint32_t i, local, owed = 0;
	bool applied = false;

	if (!srv->push.advances_owed)
		return false;
	srv->push.advances_owed = 0;
	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
		if (!t || t->spec.mode != RPS_MODE_SYNC)
			continue;
		for (local = 0; local < t->layout.nshards; local++) {
			struct shard *s = &t->shards[local];
			uint64_t step = s->step;
			if (!s->advance_owed)
				continue;
			s->advance_owed = false;
			if (s->hdr && s->ready)
				rps__srv_sync_advance(srv, t, local, false);
			applied |= s->step != step;
			owed += s->advance_owed;
		}
	}
	srv->push.advances_owed = owed;
	return applied;
}

/* Consume held pushes until none can move.  Held pushes are few (at most
 * connections x slots), so a rescan is cheap. */
void rps__srv_drain_held(struct rps__server *srv)
{
	bool progress = true;

	while (progress) {
		uint32_t i = 0;
		progress = pay_owed_advances(srv);
		while (i < srv->push.nparked) {
			struct parked *p = &srv->push.parked[i];
			if (sync_take(srv, p->t, p->local, p->clock, p->rank, p->data) == -EAGAIN) {
				i++;
				continue;
			}
			/* taken: its acknowledgement (or, replicated, its TAKEN) went out when it was parked */
			rps__srv_parked_release(srv, p);
			*p = srv->push.parked[--srv->push.nparked];
			progress = true;
		}
		i = 0;
		while (i < srv->push.nheld) {
			struct held h = srv->push.held[i];
			if (!h.conn->dead && consume(srv, h.conn, h.slot) == NOT_YET) {
				i++;
				continue;
			}
			memmove(&srv->push.held[i], &srv->push.held[i + 1],
				(srv->push.nheld - i - 1) * sizeof(*srv->push.held));
			srv->push.nheld--;
			progress = true;
		}
	}
}

int rps__srv_parked_slot(struct rps__server *srv, struct parked **out)
{
	if (rps__grow(&srv->push.parked, &srv->push.parked_cap, srv->push.nparked + 1, sizeof(*srv->push.parked), 64))
		return -ENOMEM;
	assert(srv->push.nparked < srv->push.parked_cap);	/* counted by the caller once filled */
	*out = memset(&srv->push.parked[srv->push.nparked], 0, sizeof(**out));
	return 0;
}

/*
 * Sync, no backups: the push of the rank whose turn comes right after
 * next_rank's, with nothing summed yet, goes into the accumulator at once
 * (one pass over the data: the copy aside and the later sum cost two, and
 * with two workers every other push would be parked).  sync_take adds
 * next_rank's to it when it comes.  A partition with backups parks
 * instead: its pushes are acknowledged in two stages and the replicas
 * apply whole steps, so nothing is gained there.  0: taken, acknowledged.
 */
static int take_early(struct rps__server *srv, struct srv_conn *c, uint32_t slot, struct srv_tensor *t,
		      const struct rps__push_desc *d)
{
	struct shard *s = &t->shards[d->shard];
	struct parked *p;

	if (rps__srv_repl_part(srv, s->part) || !s->ready || s->nsummed || s->early_rank >= 0 ||
	    d->clock != s->step || d->clock >= t->hold_limit || d->rank <= s->next_rank ||
	    d->rank != next_turn(srv, t, d->shard, s->next_rank + 1) || rps__srv_parked_slot(srv, &p))
		return -EAGAIN;
	rps__agg_copy(s->acc, (const char *)d + RPS__PUSH_DESC_SIZE, t->spec.dtype, s->elems);
	s->early_rank = d->rank;
	p->t = t;
	p->local = d->shard;
	p->clock = d->clock;
	p->rank = d->rank;
	p->nbytes = d->nbytes;
	p->in_acc = true;
	srv->push.nparked++;
	srv->push.sync_early++;
	push_ack(c, slot, 0, s->step, 0);
	return 0;
}

/* Copy an out-of-turn sync push out of its slot and acknowledge it (see
 * struct parked).  -ENOSPC when it is not a sync push or over the budget:
 * the push then waits in its slot. */
static int park(struct rps__server *srv, struct srv_conn *c, uint32_t slot)
{
	struct rps__push_desc *d = slot_desc(c, slot);
	struct srv_tensor *t = rps__srv_tensor_by_id(srv, d->tensor_id);
	struct parked *p;

	if (!t || t->spec.mode != RPS_MODE_SYNC || d->kind != RPS__PUSH_GRAD)
		return -ENOSPC;
	if (d->shard >= t->layout.nshards || !t->shards[d->shard].hdr ||
	    !rps__srv_part_serving(srv, t->shards[d->shard].part))
		return -ENOSPC;
	/* the same push parked already (a resend to a primary promoted with
	 * the image's parked pushes): that entry stands for it, once */
	if (rps__srv_parked_has(srv, t, d->shard, d->rank, d->clock)) {
		if (rps__srv_repl_part(srv, t->shards[d->shard].part))
			push_taken(srv, c, slot, t, &t->shards[d->shard], d->clock, t->shards[d->shard].step);
		else
			push_ack(c, slot, 0, t->shards[d->shard].step, 0);
		return 0;
	}
	if (take_early(srv, c, slot, t, d) == 0)
		return 0;
	if (srv->push.parked_bytes + d->nbytes > srv->cfg.park_limit)
		return -ENOSPC;
	/* replicated, in its turn, waiting only for the replicas (credits, or
	 * the previous step's confirmation): it stays in its slot (it depends
	 * on no worker) and is summed, TAKEN, once they have room */
	if (rps__srv_repl_part(srv, t->shards[d->shard].part) && d->clock == t->shards[d->shard].step &&
	    d->rank == t->shards[d->shard].next_rank)
		return -ENOSPC;
	if (rps__srv_parked_slot(srv, &p))
		return -ENOSPC;
	p->data = rps__srv_park_buf_get(srv, d->nbytes, &p->cap);
	if (!p->data)
		return -ENOSPC;
	memcpy(p->data, (char *)d + RPS__PUSH_DESC_SIZE, d->nbytes);
	p->t = t;
	p->local = d->shard;
	p->clock = d->clock;
	p->rank = d->rank;
	p->nbytes = d->nbytes;
	srv->push.nparked++;
	srv->push.parked_bytes += d->nbytes;
	srv->push.sync_parked++;
	if (rps__srv_repl_part(srv, t->shards[p->local].part))
		push_taken(srv, c, slot, t, &t->shards[p->local], p->clock, t->shards[p->local].step);
	else
		push_ack(c, slot, 0, t->shards[p->local].step, 0);
	return 0;
}

void rps__srv_on_push(struct rps__server *srv, struct srv_conn *c, uint32_t slot)
{
	struct rps__push_desc *d;
	int ret;

	if (!c->hello_done || slot >= srv->cfg.nslots) {
		conn_fail(c, "sent a push to a slot it does not own");
		return;
	}
	if (c->bufs.slot_state[slot]) {
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

/* ---- locks ------------------------------------------------------------ */

/* Break a lock on behalf of a holder that is gone or past its lease.  The
 * version moves on as with every release: a holder that is merely slow,
 * and whose connection then takes the same shard's lock again, gets a new
 * word, so its stale push (naming the old word) can never pass the check. */
static void break_lock(struct rps__server *srv, struct srv_tensor *t, struct shard *s, uint64_t w,
		       const char *why)
{
	/* release_lock() returns the word it left, or what it found instead */
	if (rps__srv_release_lock(srv, t, s, w) == rps__lock_unlocked(rps__lock_version(w) + 1))
		rps__log(RPS__LOG_INFO, "tensor '%s' shard %u: broke lock of owner %u (%s)", t->name,
			 s->index, rps__lock_owner(w), why);
}

void rps__srv_scan_locks(struct rps__server *srv, uint32_t dead_owner)
{
	uint64_t now = rps__now_ns(), lease = (uint64_t)srv->cfg.lease_ms * 1000000ull;
	uint32_t i, j;

	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
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
