/*
 * partition.c - the partition API of the data plane (dataplane.h): what
 * the control plane asks of a partition when the map changes or a move
 * goes on.  Fencing seals the lock words of a leaving partition, the image
 * carries it (parameters, versions, optimizer state, sync accumulators,
 * clocks, applied push ids, parked pushes) to its new owner, or to a new
 * backup (which keeps the sync step in progress too), which checks every
 * field before anything of it is installed.
 */
#include "config.h"
#include "common/common.h"
#include "common/crc.h"
#include "kernels/agg.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

#define MIG_MAGIC 0x47494d50u	/* "PMIG" */
#define MIG_VERSION 2u	/* 2: removed ranks, sync contributions summed */

static uint64_t fenced_word(uint64_t w)
{
	return rps__lock_locked(rps__lock_version(w), RPS__LOCK_OWNER_FENCE);
}

static bool is_fenced(uint64_t w)
{
	return rps__lock_is_locked(w) && rps__lock_owner(w) == RPS__LOCK_OWNER_FENCE;
}

/* Refuse what waits for a partition that is leaving: held pushes (never
 * applied: the workers send them to the new owner) and WAITs. */
void rps__srv_refuse_partition(struct rps__server *srv, uint32_t part)
{
	uint32_t i = 0;

	while (i < srv->req.nwaiters) {
		struct waiter *w = &srv->req.waiters[i];
		struct srv_tensor *t = w->tensor_id < srv->ntensors ? srv->tensors[w->tensor_id] : NULL;
		if (t && t->shards[w->local].part == part) {
			rps__srv_conn_reply(w->conn, RPS__MSG_WAIT_REP, w->req_id, RPS_ESTALE_EPOCH, NULL, 0);
			*w = srv->req.waiters[--srv->req.nwaiters];
			continue;
		}
		i++;
	}
	rps__srv_repl_refuse_part(srv, part);
	/* consume() refuses pushes of a partition that is not served */
	rps__srv_drain_held(srv);
}

typedef void shard_fn(struct rps__server *srv, struct region *r, struct shard *s, void *arg);

/* fn on every shard of the partition, in each tensor that has its region. */
static void part_each_shard(struct rps__server *srv, uint32_t part, shard_fn *fn, void *arg)
{
	for (uint32_t i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
		struct region *r = t ? &t->regions[part] : NULL;
		if (!r || !r->mr)
			continue;
		for (uint32_t j = 0; j < r->nsh; j++)
			fn(srv, r, &t->shards[rps__part_shard(&t->layout, part, j)], arg);
	}
}

/* Seal the shard's lock word unless a worker holds it: *all false if not sealed. */
static void fence_shard(struct rps__server *srv, struct region *r, struct shard *s, void *all)
{
	uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE), old = 0;

	if (is_fenced(w))
		return;
	if (rps__lock_is_locked(w) ||
	    rps__local_cas(srv->fab, r->mr, &s->hdr->lock, w, fenced_word(w), &old) || old != w)
		*(bool *)all = false;
}

/* Seal every lock word of the partition.  A word a worker holds is left
 * until its push is decided (or its lease broken): 1 when all are sealed
 * and no update of it waits for its replicas. */
bool rps__srv_part_fence(struct rps__server *srv, uint32_t part)
{
	bool all = true;

	part_each_shard(srv, part, fence_shard, &all);
	if (rps__srv_repl_busy(srv, part))
		all = false;
	for (uint32_t i = 0; i < srv->push.nheld; i++) {
		struct srv_conn *c = srv->push.held[i].conn;
		const struct rps__push_desc *d =
			(const void *)(c->bufs.slots + (size_t)srv->push.held[i].slot * srv->slot_size);
		struct srv_tensor *t = d->tensor_id < srv->ntensors ? srv->tensors[d->tensor_id] : NULL;
		if (t && d->shard < t->layout.nshards && t->shards[d->shard].part == part)
			all = false;
	}
	return all;
}

/* Unseal the shard's lock word (a new version) and publish it at *epoch. */
static void unfence_shard(struct rps__server *srv, struct region *r, struct shard *s, void *epoch)
{
	uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE), old = 0;

	if (is_fenced(w))
		rps__local_cas(srv->fab, r->mr, &s->hdr->lock, w, rps__lock_unlocked(rps__lock_version(w) + 1), &old);
	rps__srv_publish(s, *(const uint64_t *)epoch);
}

void rps__srv_part_unfence(struct rps__server *srv, uint32_t part, uint64_t epoch)
{
	part_each_shard(srv, part, unfence_shard, &epoch);
	srv->rfence.dirty = true;	/* (the read fence may have to cover it again) */
}

/*
 * Promotion (a FAILOVER made us primary of a partition we backed up).
 *
 * The stream state: srv->repl.seq[part] is the seq of the last entry this
 * server applied as a backup, and the seq a primary numbers its next entry
 * after.  It is kept as it is, so the first entry we ship, repl_seq + 1,
 * is exactly the one a kept backup that applied the same entries expects
 * next, and no REPL_RESUME exchange is needed.  One that applied an entry
 * more (the old primary's last, never acknowledged) refuses it, its stream
 * breaks and the map drops it; it is seeded again (doc/design.md "Failover
 * and leases").  What the old primary still has in flight to us is refused by the
 * epoch check (repl_backup.c): its epoch is older than the map's now.
 *
 * Lock words: the old primary's workers took and released them on its
 * copy; ours were never written remotely.  A worker that held a lock there
 * resends with that word, so ours must be unlocked under a version no word
 * of the old primary can carry: epoch << 32 lies above every version
 * handed out under an older epoch unless 2^32 lock cycles of one shard
 * passed since the last promotion (versions move by one per cycle; a move
 * carries them on, rps__srv_part_unfence).
 *
 * Sync: the stream replicates completed steps only.  What the old primary
 * acknowledged of the step in progress before the partition had this
 * backup (summed, parked, taken early: plain acknowledgements, never
 * resent) came with the seeding image and is kept here as it was there:
 * the partial sum of ranks 0..next_rank-1 in rank order, and the parked
 * pushes, taken in their turn once we serve (dataplane.c, part_set), so
 * the step sums in the same order to the same bits.  Contributions the old
 * primary acknowledged TAKEN since are resent by their workers: one of a
 * rank already in the sum, or parked here, is counted once (-EALREADY;
 * push.c, park).  A backup seeded before the step began holds nothing of
 * it: every contribution to it was TAKEN, and is resent.
 */
static void promote_shard(struct rps__server *srv, struct region *r, struct shard *s, void *epoch_p)
{
	uint64_t epoch = *(const uint64_t *)epoch_p;
	uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE), old = 0;
	uint64_t version = RPS__MAX(rps__lock_version(w) + 1, epoch << 32);

	rps__local_cas(srv->fab, r->mr, &s->hdr->lock, w, rps__lock_unlocked(version), &old);
	s->lease_word = 0;
	s->repl_pending = 0;
	/* (a backup takes no pushes: nothing was taken early here; a push
	 * taken early on the primary came in the image as a parked one) */
	s->early_rank = -1;
	s->partial_seq = 0;	/* (shipped by us under an older reign, if ever: ship anew) */
	rps__srv_publish(s, epoch);
}

void rps__srv_part_promote(struct rps__server *srv, uint32_t part, uint64_t epoch)
{
	part_each_shard(srv, part, promote_shard, &epoch);
	srv->rfence.dirty = true;
	rps__log(RPS__LOG_INFO, "partition %u: promoted to primary under epoch %llu, after replication entry %llu",
		 part, (unsigned long long)epoch, (unsigned long long)srv->repl.seq[part]);
}

/* A growing byte buffer for the partition image. */
struct wbuf {
	char *p;
	size_t len, cap;
	int err;
};

/* n bytes at the end of the buffer for the caller to fill, or NULL */
static void *put_space(struct wbuf *b, size_t n)
{
	void *at;

	if (b->err)
		return NULL;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *g;
		while (cap < b->len + n)
			cap *= 2;
		g = realloc(b->p, cap);
		if (!g) {
			b->err = -ENOMEM;
			return NULL;
		}
		b->p = g;
		b->cap = cap;
	}
	at = b->p + b->len;
	b->len += n;
	return at;
}

static void put(struct wbuf *b, const void *v, size_t n)
{
	void *at = put_space(b, n);

	if (at && n)
		memcpy(at, v, n);
}

static void put64(struct wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put32(struct wbuf *b, uint32_t v) { put(b, &v, 4); }

struct rbuf {
	const char *p;
	size_t len, off;
	bool bad;
};

static const void *get(struct rbuf *b, size_t n)
{
	const void *v;

	if (b->bad || n > b->len - b->off) {
		b->bad = true;
		return NULL;
	}
	v = b->p + b->off;
	b->off += n;
	return v;
}

static uint64_t get64(struct rbuf *b)
{
	const void *v = get(b, 8);
	uint64_t x = 0;

	if (v)
		memcpy(&x, v, 8);
	return x;
}

static uint32_t get32(struct rbuf *b)
{
	const void *v = get(b, 4);
	uint32_t x = 0;

	if (v)
		memcpy(&x, v, 4);
	return x;
}

/* The ranks removed from t (psctl remove-rank): a new owner must skip them too. */
static void put_removed(struct wbuf *b, const struct srv_tensor *t)
{
	uint32_t n = 0;
	int r;

	for (r = 0; r < t->spec.num_workers; r++)
		n += rps__srv_rank_removed(t, r);
	put32(b, n);
	for (r = 0; r < t->spec.num_workers; r++)
		if (rps__srv_rank_removed(t, r))
			put32(b, (uint32_t)r);
}

/*
 * The image of a fenced partition (host byte order: both ends are rdmapsd
 * of the same build on one fabric; the crc covers all of it):
 *   magic, version, part, epoch, ntensors
 *   per tensor: name[64], spec, nremoved, removed ranks, nshards here,
 *   then per shard:
 *     index, step, min_clock, lock version, ready, next_rank, nsummed, elems,
 *     params, optimizer state, accumulator (sync), clocks (bounded),
 *     n applied-push-ids, (client, push id) pairs
 *   nparked, per parked push: tensor ordinal, shard, clock, rank, nbytes, data
 */
static int serialize_partition(struct rps__server *srv, uint32_t part, uint64_t epoch, struct wbuf *b)
{
	uint32_t i, j, nt = 0, np = 0;

	put32(b, MIG_MAGIC);
	put32(b, MIG_VERSION);
	put32(b, part);
	put64(b, epoch);
	for (i = 0; i < srv->ntensors; i++)
		nt += srv->tensors[i] && srv->tensors[i]->regions[part].mr ? 1u : 0u;
	put32(b, nt);
	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
		struct region *r = t ? &t->regions[part] : NULL;
		size_t nstate;
		if (!r || !r->mr)
			continue;
		put(b, t->name, sizeof(t->name));
		put(b, &t->spec, sizeof(t->spec));
		put_removed(b, t);
		put32(b, r->nsh);
		for (j = 0; j < r->nsh; j++) {
			struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
			uint64_t w = __atomic_load_n(&s->hdr->lock, __ATOMIC_ACQUIRE);
			put32(b, s->index);
			put64(b, s->step);
			put64(b, __atomic_load_n(&s->hdr->min_clock, __ATOMIC_ACQUIRE));
			put64(b, rps__lock_version(w));
			put32(b, s->ready);
			put32(b, (uint32_t)s->next_rank);
			put32(b, s->nsummed);
			put32(b, s->elems);
			put(b, s->params, (size_t)s->elems * 4);
			nstate = rps__optim_state_len(t->optim.type, s->elems);
			if (nstate)
				put(b, s->state, nstate * 4);
			if (s->acc)
				put(b, s->acc, (size_t)s->elems * 4);
			if (s->clocks)
				put(b, s->clocks, (size_t)t->spec.num_workers * 8);
			put32(b, s->ndd);
			if (s->ndd)
				put(b, s->dd, (size_t)s->ndd * sizeof(*s->dd));
		}
	}
	for (i = 0; i < srv->push.nparked; i++)
		np += srv->push.parked[i].t->shards[srv->push.parked[i].local].part == part;
	put32(b, np);
	for (i = 0; i < srv->push.nparked; i++) {
		struct parked *pk = &srv->push.parked[i];
		if (pk->t->shards[pk->local].part != part)
			continue;
		put(b, pk->t->name, sizeof(pk->t->name));
		put32(b, pk->local);
		put64(b, pk->clock);
		put32(b, (uint32_t)pk->rank);
		put64(b, pk->nbytes);
		if (pk->in_acc) {
			/* taken early: the accumulator holds it alone, widened
			 * exactly from the dtype, so narrowing gives it back */
			const struct shard *s = &pk->t->shards[pk->local];
			void *at = put_space(b, pk->nbytes);
			if (at)
				rps__f32_to_dtype(at, s->acc, pk->t->spec.dtype, s->elems);
		} else {
			put(b, pk->data, pk->nbytes);
		}
	}
	return b->err;
}

/* Parked pushes of a shipped partition now live in the image. */
void rps__srv_part_forget_parked(struct rps__server *srv, uint32_t part)
{
	uint32_t i = 0;

	while (i < srv->push.nparked) {
		struct parked *pk = &srv->push.parked[i];
		if (pk->t->shards[pk->local].part == part) {
			if (pk->in_acc)
				pk->t->shards[pk->local].early_rank = -1;
			rps__srv_parked_release(srv, pk);
			*pk = srv->push.parked[--srv->push.nparked];
			continue;
		}
		i++;
	}
}

void rps__srv_regions_free_part(struct rps__server *srv, uint32_t part)
{
	uint32_t i;

	rps__srv_part_forget_parked(srv, part);	/* (a backup's, from its image) */
	for (i = 0; i < srv->ntensors; i++)
		if (srv->tensors[i])
			rps__srv_region_free(srv, srv->tensors[i], part);
}

/* What the validation pass keeps of each tensor of an image. */
struct img_tensor {
	const char *name;
	struct rps__tensor_spec spec;
	struct rps__layout layout;
	uint32_t nsh;
	uint64_t *steps;	/* per shard of the partition, in image order */
	const uint32_t *removed;	/* its removed ranks (in the image, unaligned) */
	uint32_t nremoved;
};

/* Is rank among the image tensor's removed ranks (psctl remove-rank)? */
static bool img_rank_removed(const struct img_tensor *it, uint32_t rank)
{
	uint32_t k, x;

	for (k = 0; k < it->nremoved; k++) {
		memcpy(&x, &it->removed[k], 4);
		if (x == rank)
			return true;
	}
	return false;
}

static void img_tensors_free(struct img_tensor *it, uint32_t n)
{
	if (!it)
		return;
	for (uint32_t i = 0; i < n; i++)
		free(it[i].steps);
	free(it);
}

/*
 * Walk a partition image and check every field against this server before
 * anything of it is installed (install_partition trusts what passes): the
 * crc only says the bytes arrived as sent, not that the sender (a buggy or
 * confused peer, or another build) sent something this server can use.
 * No side effect: 0, or -EBADMSG with a message naming the first bad field.
 */
/* The image's findings: BAD() names the first bad field in what[] and
 * refuses the image (-EBADMSG); check_partition_image says where. */
#define BAD(...) do { snprintf(what, WHAT_LEN, __VA_ARGS__); return -EBADMSG; } while (0)
#define WHAT_LEN 160

/* Shard j of the partition in tensor it's part of the image. */
static int check_shard(struct rbuf *b, struct img_tensor *it, uint32_t part, uint32_t j, char *what)
{
	bool sync = it->spec.mode == RPS_MODE_SYNC, bounded = it->spec.mode == RPS_MODE_BOUNDED;
	uint32_t index = get32(b), ready, next_rank, nsummed, elems, ndd, k;
	uint64_t step = get64(b), min_clock = get64(b), lockv = get64(b);
	const struct dedup *dd;
	size_t nstate;

	ready = get32(b);
	next_rank = get32(b);
	nsummed = get32(b);
	elems = get32(b);
	if (b->bad)
		BAD("truncated in tensor '%s' shard %u", it->name, j);
	if (index != rps__part_shard(&it->layout, part, j))
		BAD("tensor '%s': shard %u where shard %u of the partition belongs", it->name, index,
		    rps__part_shard(&it->layout, part, j));
	/* the published seq is step * 2, the lock word keeps 48 bits of version */
	if (step > (UINT64_MAX >> 2) || lockv >= (1ull << 48) - 1)
		BAD("tensor '%s' shard %u: version %llu / lock version %llu out of range", it->name,
		    index, (unsigned long long)step, (unsigned long long)lockv);
	if (ready > 1)
		BAD("tensor '%s' shard %u: ready flag %u", it->name, index, ready);
	if (sync ? next_rank >= (uint32_t)it->spec.num_workers || nsummed > next_rank : next_rank || nsummed)
		BAD("tensor '%s' shard %u: next rank %u, %u summed (%d workers)", it->name, index, next_rank,
		    nsummed, it->spec.num_workers);
	if (elems != rps__shard_elems(&it->layout, index))
		BAD("tensor '%s' shard %u: %u elements, the shard has %u", it->name, index, elems,
		    rps__shard_elems(&it->layout, index));
	it->steps[j] = step;
	nstate = rps__optim_state_len((enum rps_optimizer)it->spec.optimizer, elems);
	if (!get(b, (size_t)elems * 4) || (nstate && !get(b, nstate * 4)) ||
	    (sync && !get(b, (size_t)elems * 4)))
		BAD("tensor '%s' shard %u: truncated in its values", it->name, index);
	if (bounded) {
		const uint64_t *clocks = get(b, (size_t)it->spec.num_workers * 8);
		uint64_t lo = UINT64_MAX, c;
		if (!clocks)
			BAD("tensor '%s' shard %u: truncated in its clocks", it->name, index);
		/* over the ranks left, as rps__srv_update_min_clock takes it */
		for (k = 0; k < (uint32_t)it->spec.num_workers; k++) {
			memcpy(&c, &clocks[k], 8);
			if (!img_rank_removed(it, k))
				lo = RPS__MIN(lo, c);
		}
		if (lo != min_clock)
			BAD("tensor '%s' shard %u: minimum clock %llu, its clocks say %llu", it->name,
			    index, (unsigned long long)min_clock, (unsigned long long)lo);
	}
	ndd = get32(b);
	if (b->bad || ndd > (b->len - b->off) / sizeof(*dd) || ndd > 1u << 20)
		BAD("tensor '%s' shard %u: %u applied-push sets cannot fit the image", it->name, index, ndd);
	dd = get(b, (size_t)ndd * sizeof(*dd));
	for (k = 0; k < ndd; k++) {
		struct dedup d;
		memcpy(&d, &dd[k], sizeof(d));
		if (d.next >= DEDUP_IDS)
			BAD("tensor '%s' shard %u: applied-push set %u is malformed", it->name, index, k);
	}
	return 0;
}

/* The ranks removed from the image's tensor: some of its ranks, never all. */
static int check_removed(struct rbuf *b, struct img_tensor *it, char *what)
{
	uint32_t n = get32(b), k;
	const uint32_t *r;

	if (b->bad || n > (it->spec.mode == RPS_MODE_ASYNC ? 0u : (uint32_t)it->spec.num_workers - 1))
		BAD("tensor '%s': %u removed ranks of %d", it->name, n, it->spec.num_workers);
	r = get(b, (size_t)n * 4);
	if (!r)
		BAD("tensor '%s': truncated in its removed ranks", it->name);
	for (k = 0; k < n; k++) {
		uint32_t x;
		memcpy(&x, &r[k], 4);
		if (x >= (uint32_t)it->spec.num_workers)
			BAD("tensor '%s': removed rank %u of %d", it->name, x, it->spec.num_workers);
	}
	it->removed = r;
	it->nremoved = n;
	return 0;
}

/* Tensor i of the image (its name, spec and shards), against this server. */
static int check_tensor(struct rps__server *srv, struct rbuf *b, struct img_tensor *its, uint32_t i, uint32_t nt,
			uint32_t part, char *what)
{
	struct img_tensor *it = &its[i];
	const struct rps__tensor_spec *sp;
	struct srv_tensor *t;
	uint32_t j, k;
	int ret;

	it->name = get(b, RPS__NAME_MAX);
	sp = get(b, sizeof(*sp));
	if (!it->name || !sp)
		BAD("truncated in tensor %u of %u", i + 1, nt);
	if (!memchr(it->name, '\0', RPS__NAME_MAX) || !it->name[0])
		BAD("tensor %u has no valid name", i + 1);
	for (k = 0; k < i; k++)
		if (!strcmp(its[k].name, it->name))
			BAD("tensor '%s' comes twice", it->name);
	memcpy(&it->spec, sp, sizeof(it->spec));
	t = rps__srv_tensor_by_name(srv, it->name);
	if (t) {
		if (memcmp(&t->spec, &it->spec, sizeof(it->spec)))
			BAD("tensor '%s' exists here with other options", it->name);
		it->layout = t->layout;
	} else if (rps__srv_spec_valid(srv, it->name, &it->spec, &it->layout)) {
		BAD("%s", rps__errbuf());
	}
	ret = check_removed(b, it, what);
	if (ret)
		return ret;
	it->nsh = get32(b);
	if (b->bad || it->nsh != rps__part_nshards(&it->layout, part))
		BAD("tensor '%s' has %u shards in the partition, this server expects %u", it->name, it->nsh,
		    rps__part_nshards(&it->layout, part));
	it->steps = calloc(it->nsh ? it->nsh : 1, sizeof(*it->steps));
	if (!it->steps)
		return rps__seterr(-ENOMEM, "partition %u: out of memory checking its image", part);
	for (j = 0; j < it->nsh; j++) {
		ret = check_shard(b, it, part, j, what);
		if (ret)
			return ret;
	}
	return 0;
}

/* Parked push i of np, of one of the image's tensors. */
static int check_parked(struct rbuf *b, struct img_tensor *its, uint32_t nt, uint32_t part, uint32_t i,
			uint32_t np, char *what)
{
	const char *name = get(b, RPS__NAME_MAX);
	uint32_t shard = get32(b), rank, k;
	uint64_t clock = get64(b), nbytes, want;
	struct img_tensor *it = NULL;

	rank = get32(b);
	nbytes = get64(b);
	if (b->bad || !memchr(name, '\0', RPS__NAME_MAX))
		BAD("truncated in parked push %u of %u", i + 1, np);
	for (k = 0; k < nt && !it; k++)
		if (!strcmp(its[k].name, name))
			it = &its[k];
	if (!it)
		BAD("parked push %u: tensor '%s' is not in the partition", i + 1, name);
	if (it->spec.mode != RPS_MODE_SYNC)
		BAD("parked push %u: tensor '%s' is not in sync mode", i + 1, it->name);
	if (shard >= it->layout.nshards || rps__shard_server(&it->layout, shard) != part)
		BAD("parked push %u: tensor '%s' shard %u is not in the partition", i + 1, it->name, shard);
	want = (uint64_t)rps__shard_elems(&it->layout, shard) * rps__dtype_size((enum rps_dtype)it->spec.dtype);
	if (nbytes != want)
		BAD("parked push %u: %llu bytes for tensor '%s' shard %u, which takes %llu", i + 1,
		    (unsigned long long)nbytes, it->name, shard, (unsigned long long)want);
	if (rank >= (uint32_t)it->spec.num_workers)
		BAD("parked push %u: rank %u of %d workers", i + 1, rank, it->spec.num_workers);
	if (clock < it->steps[rps__shard_local_index(&it->layout, shard)] || clock == UINT64_MAX)
		BAD("parked push %u: clock %llu of tensor '%s' shard %u is not ahead of its version", i + 1,
		    (unsigned long long)clock, it->name, shard);
	if (!get(b, nbytes))
		BAD("parked push %u: truncated in its data", i + 1);
	return 0;
}

static int check_partition_image(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img,
				 size_t len)
{
	struct rbuf b = { .p = img, .len = len };
	struct img_tensor *its = NULL;
	uint32_t nt, i, np;
	char what[WHAT_LEN] = "";
	int ret = 0;

	if (get32(&b) != MIG_MAGIC || get32(&b) != MIG_VERSION || get32(&b) != part || get64(&b) != epoch)
		return rps__seterr(-EBADMSG, "partition %u: not the image of this move", part);
	nt = get32(&b);
	/* every tensor takes at least its name, spec and count */
	if (b.bad || nt > (b.len - b.off) / (RPS__NAME_MAX + sizeof(struct rps__tensor_spec) + 4)) {
		snprintf(what, sizeof(what), "%u tensors cannot fit the image", nt);
		ret = -EBADMSG;
		goto out;
	}
	its = calloc(nt ? nt : 1, sizeof(*its));
	if (!its)
		return rps__seterr(-ENOMEM, "partition %u: out of memory checking its image", part);
	for (i = 0; i < nt && !ret; i++)
		ret = check_tensor(srv, &b, its, i, nt, part, what);
	if (!ret) {
		np = get32(&b);
		if (b.bad || np > (b.len - b.off) / (RPS__NAME_MAX + 4 + 8 + 4 + 8)) {
			snprintf(what, sizeof(what), "%u parked pushes cannot fit the image", np);
			ret = -EBADMSG;
		}
		for (i = 0; i < np && !ret; i++)
			ret = check_parked(&b, its, nt, part, i, np, what);
	}
	if (!ret && b.off != b.len) {
		snprintf(what, sizeof(what), "%zu bytes after its end", b.len - b.off);
		ret = -EBADMSG;
	}
out:
	if (ret == -EBADMSG)
		ret = rps__seterr(-EBADMSG, "partition %u: image refused, nothing installed: %s (at byte %zu of %zu)",
				  part, what, b.off, b.len);
	img_tensors_free(its, nt);
	return ret;
}
#undef BAD

/* What an install_* step returns for an image that is malformed after all
 * (check_partition_image passed it): positive, so never one of the
 * negative errnos the steps pass on. */
#define MALFORMED 1

/* One shard of a tensor's region (allocated, not yet registered).  As a
 * backup (seeding) too, the step in progress is kept (promote_shard says
 * why); the header keeps the map's epoch. */
static int install_shard(struct rbuf *b, struct srv_tensor *t, struct shard *s, uint64_t epoch, bool backup)
{
	size_t nstate = rps__optim_state_len(t->optim.type, s->elems);
	const void *v;

	if (get32(b) != s->index)
		return MALFORMED;
	s->step = get64(b);
	s->hdr->min_clock = get64(b);
	s->hdr->lock = rps__lock_unlocked(get64(b) + 1);
	s->ready = get32(b) != 0;
	s->next_rank = (int)get32(b);
	s->nsummed = get32(b);
	s->early_rank = -1;	/* (a push taken early comes as a parked one) */
	s->partial_seq = 0;
	if (get32(b) != s->elems)
		return MALFORMED;
	if (!(v = get(b, (size_t)s->elems * 4)))
		return MALFORMED;
	memcpy(s->params, v, (size_t)s->elems * 4);
	if (nstate) {
		if (!(v = get(b, nstate * 4)))
			return MALFORMED;
		memcpy(s->state, v, nstate * 4);
	}
	if (s->acc) {
		if (!(v = get(b, (size_t)s->elems * 4)))
			return MALFORMED;
		memcpy(s->acc, v, (size_t)s->elems * 4);
	}
	if (s->clocks) {
		if (!(v = get(b, (size_t)t->spec.num_workers * 8)))
			return MALFORMED;
		memcpy(s->clocks, v, (size_t)t->spec.num_workers * 8);
	}
	s->ndd = get32(b);
	if (s->ndd > 1u << 20 || !(v = get(b, (size_t)s->ndd * sizeof(*s->dd))))
		return MALFORMED;
	if (s->ndd) {
		s->dd = malloc((size_t)s->ndd * sizeof(*s->dd));
		if (!s->dd)
			return rps__seterr(-ENOMEM, "out of memory");
		memcpy(s->dd, v, (size_t)s->ndd * sizeof(*s->dd));
	}
	s->hdr->epoch = backup ? epoch : epoch + 1;
	s->hdr->seq = s->ready ? s->step * 2 : 1;
	return 0;
}

/* The image's removed ranks join this server's (checked before). */
static int install_removed(struct rbuf *b, struct srv_tensor *t)
{
	uint32_t n = get32(b), k, r;

	if (n && !t->ranks && !(t->ranks = calloc((size_t)t->spec.num_workers, 1)))
		return rps__seterr(-ENOMEM, "out of memory");
	for (k = 0; k < n; k++) {
		r = get32(b);
		if (b->bad || r >= (uint32_t)t->spec.num_workers)
			return MALFORMED;
		t->ranks[r] = RANK_REMOVED;
	}
	return 0;
}

/* One tensor of the image (created here if new): its region of the
 * partition, filled, then registered. */
static int install_tensor(struct rps__server *srv, struct rbuf *b, uint32_t part, uint64_t epoch, bool backup)
{
	const char *name = get(b, RPS__NAME_MAX);
	const struct rps__tensor_spec *sp = get(b, sizeof(*sp));
	struct rps__tensor_spec spec;
	struct srv_tensor *t;
	uint32_t nsh, j;
	int ret;

	if (!name || !sp || !memchr(name, '\0', RPS__NAME_MAX))
		return MALFORMED;
	memcpy(&spec, sp, sizeof(spec));
	t = rps__srv_tensor_by_name(srv, name);
	if (!t && (ret = rps__srv_tensor_add(srv, name, &spec, &t)))
		return ret;
	ret = install_removed(b, t);
	if (ret)
		return ret;
	nsh = get32(b);
	if (nsh != rps__part_nshards(&t->layout, part))
		return MALFORMED;
	if (backup)	/* (the stream may have made it empty already) */
		rps__srv_region_retire(srv, t, part);
	ret = rps__srv_region_alloc(srv, t, part, false, NULL);
	if (ret)
		return ret;
	for (j = 0; j < nsh; j++) {
		ret = install_shard(b, t, &t->shards[rps__part_shard(&t->layout, part, j)], epoch, backup);
		if (ret)
			return ret;
	}
	return rps__srv_region_register(srv, t, part);
}

/* One parked push of the image.  A backup keeps it too: it was
 * acknowledged before the partition had this backup, so nobody resends it
 * should the backup be promoted before the step that takes it is
 * replicated (sync_take takes nothing on a backup; the primary's step,
 * once applied here, covers it: rps__srv_sync_step_replicated). */
static int install_parked(struct rps__server *srv, struct rbuf *b)
{
	const char *name = get(b, RPS__NAME_MAX);
	uint32_t shard = get32(b);
	uint64_t clock = get64(b);
	int rank = (int)get32(b);
	uint64_t nbytes = get64(b);
	const void *data = get(b, nbytes);
	struct srv_tensor *t = name && memchr(name, '\0', RPS__NAME_MAX) ? rps__srv_tensor_by_name(srv, name) : NULL;

	if (!data || !t || shard >= t->layout.nshards)
		return MALFORMED;
	return rps__srv_parked_keep(srv, t, shard, clock, rank, data, nbytes);
}

/* Install an image READ from the old owner: tensors it does not know yet
 * come with it.  The regions are filled before they are registered.  The
 * image passed check_partition_image first: nothing is changed for one
 * that fails. */
static int install_partition(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img,
			     size_t len, bool backup)
{
	struct rbuf b = { .p = img, .len = len };
	uint32_t nt, i, np;
	int ret;

	ret = check_partition_image(srv, part, epoch, img, len);
	if (ret)
		return ret;
	if (get32(&b) != MIG_MAGIC || get32(&b) != MIG_VERSION || get32(&b) != part || get64(&b) != epoch)
		return rps__seterr(-EBADMSG, "partition %u: not the image of this move", part);
	/* a backup keeps the regions of tensors created after the cut (the
	 * stream fills them); install_tensor replaces the image's own.  The
	 * image's parked pushes replace any held here (a seeding again). */
	if (!backup)
		rps__srv_regions_free_part(srv, part);
	else
		rps__srv_part_forget_parked(srv, part);
	nt = get32(&b);
	for (i = 0; i < nt && !b.bad && !ret; i++)
		ret = install_tensor(srv, &b, part, epoch, backup);
	if (!ret) {
		np = get32(&b);
		for (i = 0; i < np && !b.bad && !ret; i++)
			ret = install_parked(srv, &b);
	}
	if (!ret && (b.bad || b.off != b.len))
		ret = MALFORMED;
	if (!ret)
		return 0;
	if (ret == MALFORMED)
		ret = rps__seterr(-EBADMSG, "partition %u: malformed image at byte %zu of %zu", part, b.off, b.len);
	rps__srv_regions_free_part(srv, part);
	return ret;
}
#undef MALFORMED

int rps__srv_image_build(struct rps__server *srv, uint32_t part, uint64_t epoch, void **img, size_t *len)
{
	struct wbuf b = { 0 };
	int ret = serialize_partition(srv, part, epoch, &b);

	if (ret) {
		free(b.p);
		return rps__seterr(ret, "partition %u: out of memory serialising it", part);
	}
	*img = b.p;
	*len = b.len;
	return 0;
}

int rps__srv_image_install(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img, size_t len)
{
	return install_partition(srv, part, epoch, img, len, false);
}

/* Seeding a backup: the image of a partition its primary keeps serving.
 * Regions kept, announced to nobody; the step in progress and the parked
 * pushes kept, not taken (promote_shard); the stream goes on after seq,
 * the primary's at the cut. */
int rps__srv_image_install_backup(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img,
				  size_t len, uint64_t seq)
{
	int ret = install_partition(srv, part, epoch, img, len, true);

	if (!ret) {
		srv->repl.seq[part] = seq;
		if (part < RPS__SMAP_MAX_PART)
			srv->parts[part].seeded = true;	/* (the next view says so too) */
	}
	return ret;
}

uint64_t rps__srv_repl_seq(struct rps__server *srv, uint32_t part)
{
	return part < RPS__SMAP_MAX_PART ? srv->repl.seq[part] : 0;
}

void rps__srv_repl_seq_set(struct rps__server *srv, uint32_t part, uint64_t seq)
{
	if (part < RPS__SMAP_MAX_PART)
		srv->repl.seq[part] = seq;
}

/* Publish an epoch in every header of the partition: a worker's READ of a
 * moved shard (RPS__EPOCH_MOVED) sees it did not read the owner's copy. */
void rps__srv_part_publish(struct rps__server *srv, uint32_t part, uint64_t epoch)
{
	uint32_t i, j;

	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
		struct region *r = t ? &t->regions[part] : NULL;
		if (!r || !r->mr)
			continue;
		for (j = 0; j < r->nsh; j++)
			rps__srv_publish(&t->shards[rps__part_shard(&t->layout, part, j)], epoch);
	}
	srv->rfence.dirty = true;
}

/*
 * The read fence (doc/design.md "The read fence").  The lease fences acknowledgements (push.c,
 * repl_stream.c), but a worker READs a primary's shards one-sidedly and never asks
 * it: a primary cut off from its peers whose partitions failed over would
 * go on handing workers that still hold its regions the values it had,
 * older than what the new primary has acknowledged since.  So whenever this
 * server serves a partition with backups without holding its lease, every
 * header of that partition shows RPS__EPOCH_MOVED: a READ of it fails the
 * epoch check, the worker reads the map again and goes to the primary the
 * map names.  When a lease is granted again (the control plane grants it
 * only once this server applied the log up to the leader's commit index at
 * the grant, repl_failover.c, so a primary deposed meanwhile knows it by
 * then) and the partition is still served here, the headers get its epoch
 * back.  Only the epoch word changes, by one atomic store: a READ sees
 * either epoch, with whatever seq (a version still being replicated stays
 * odd, unreadable, as it was).
 *
 * The order (repl_failover.c has the timing argument for the lease).  The
 * lease of a primary P ends at least failover_ms - lease_ms (failover_ms /
 * 2, less the drift) before the leader can declare P failed and a FAILOVER
 * be committed and applied by the new primary B.  This runs at the top of
 * every turn of P's loop, before its completions (the TCP provider serves
 * READs inside them), and the loop sleeps no later than the lease's end; so
 * the headers are fenced before B acknowledges anything, unless P's serving
 * thread stalls for that whole margin (a NIC keeps serving READs of a
 * frozen process: rdmapsd(8) states this).  A READ that saw the epoch word
 * unfenced read it before the fence, hence before B acknowledged anything:
 * every push acknowledged before the read began was acknowledged by P (or
 * is in P's state from an earlier primary), and P publishes before it
 * acknowledges, so the READ returns it.
 */
void rps__srv_read_fence(struct rps__server *srv)
{
	bool held = rps__srv_lease_held(srv, rps__dp_boottime_ns());
	uint32_t p, up = 0, down = 0;

	if (held == srv->rfence.held && !srv->rfence.dirty)
		return;
	srv->rfence.held = held;
	srv->rfence.dirty = false;
	for (p = 0; p < srv->npart && p < RPS__SMAP_MAX_PART; p++) {
		bool serving = rps__srv_part_serving(srv, p);
		bool want = !held && serving && rps__srv_repl_part(srv, p);
		uint64_t epoch;

		if (want)
			epoch = RPS__EPOCH_MOVED;	/* (again after a change: a publish may have undone it) */
		else if (srv->rfence.fenced[p] && serving)
			epoch = srv->parts[p].epoch;
		else
			continue;	/* (not served here: a fence up stays noted until it is again) */
		for (uint32_t i = 0; i < srv->ntensors; i++) {
			struct srv_tensor *t = srv->tensors[i];
			struct region *r = t ? &t->regions[p] : NULL;
			if (!r || !r->mr)
				continue;
			for (uint32_t j = 0; j < r->nsh; j++)
				__atomic_store_n(&t->shards[rps__part_shard(&t->layout, p, j)].hdr->epoch, epoch,
						 __ATOMIC_RELEASE);
		}
		up += want && !srv->rfence.fenced[p];
		down += !want && srv->rfence.fenced[p];
		srv->rfence.fenced[p] = want;
	}
	if (up)
		rps__log(RPS__LOG_INFO, "no primary lease: reads of %u partition%s fenced (their headers say moved)",
			 up, up == 1 ? "" : "s");
	if (down)
		rps__log(RPS__LOG_INFO, "primary lease held: reads of %u partition%s unfenced", down,
			 down == 1 ? "" : "s");
}

/* Empty regions of every tensor known (a new cluster, or a lost partition
 * accepted empty). */
void rps__srv_part_create(struct rps__server *srv, uint32_t part)
{
	uint32_t i;

	for (i = 0; i < srv->ntensors; i++)
		if (srv->tensors[i] && !rps__srv_region_alloc(srv, srv->tensors[i], part, false, NULL))
			rps__srv_region_register(srv, srv->tensors[i], part);
}

/* What this server holds of a tensor's partition, as one crc32c over every
 * shard's version, ready flag, parameters, optimizer state, clocks and
 * applied-push-id sets (not the lock word, the header or a step in
 * progress): equal on a primary and its backups once they agree (tests
 * compare replicas with it, psctl never shows it). */
int rps__srv_part_digest(struct rps__server *srv, const char *name, uint32_t part, uint32_t *crc,
			 uint64_t *versions, uint32_t *nshards)
{
	struct srv_tensor *t = rps__srv_tensor_by_name(srv, name);
	const struct region *r;
	uint32_t c = 0, j;

	if (!t || part >= t->layout.nservers)
		return -ENOENT;
	*versions = 0;
	*crc = 0;
	*nshards = 0;
	/* a small tensor has no shard in this partition: nothing, everywhere */
	if (!rps__part_nshards(&t->layout, part))
		return 0;
	if (!(r = &t->regions[part])->mem)
		return -ENOENT;
	for (j = 0; j < r->nsh; j++) {
		const struct shard *s = &t->shards[rps__part_shard(&t->layout, part, j)];
		size_t nstate = rps__optim_state_len(t->optim.type, s->elems);
		uint32_t ready = s->ready;

		c = rps__crc32c(c, &s->step, sizeof(s->step));
		c = rps__crc32c(c, &ready, sizeof(ready));
		c = rps__crc32c(c, s->params, (size_t)s->elems * 4);
		if (nstate)
			c = rps__crc32c(c, s->state, nstate * 4);
		if (s->clocks)
			c = rps__crc32c(c, s->clocks, (size_t)t->spec.num_workers * 8);
		c = rps__crc32c(c, &s->ndd, sizeof(s->ndd));
		for (uint32_t k = 0; k < s->ndd; k++) {
			c = rps__crc32c(c, &s->dd[k].client, sizeof(s->dd[k].client));
			c = rps__crc32c(c, s->dd[k].ids, sizeof(s->dd[k].ids));
			c = rps__crc32c(c, &s->dd[k].next, sizeof(s->dd[k].next));
		}
		*versions += s->step;
	}
	*crc = c;
	*nshards = r->nsh;
	return 0;
}
