/*
 * repl_stream.c - the replication stream: a primary ships every update of a
 * partition that has backups to each of them, and publishes and
 * acknowledges it only once all of them applied it (doc/design.md
 * "Replication").
 *
 * One REPL connection per (primary server, backup server), dialed by the
 * one with the higher member id, carries every partition between them
 * (one ordering domain).  The
 * backup registers REPL_SLOTS slots for it and says where in its HELLO
 * reply, with its kernel fingerprint; an entry (struct rps__repl_desc, then
 * the payload) is one WRITE_WITH_IMM into slot k (imm = k, slots in turn),
 * one credit each.  The backup applies entries in order with the primary's
 * own code (apply.c), checks the stream's continuity, the partition's seq
 * and epoch and the resulting version, and returns credits in one
 * cumulative REPL_ACK per loop turn.  The primary reserves a credit on
 * every replica before applying (none: the push stays held), applies
 * between publish_begin and a deferred publish_end, and publishes, releases
 * the lock, acknowledges and wakes waiters when every replica confirmed
 * (struct repl_wait).  No reader sees, and no worker is told of, a version
 * that is not on every replica.  Transport calls only: the same over verbs.
 * The backup's side (pairing, applying entries) is in repl_backup.c.
 */
#include "config.h"
#include "common/common.h"
#include "common/topo.h"
#include "kernels/agg.h"
#include "kernels/optim.h"
#include "proto/proto.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

/* A dial does not stop the loop (dial.c): the stream's work waits until it
 * is up or failed.  Only the higher member id dials (dial()); dials back
 * off so that a dead member is not dialed without end. */
#define REPL_CONNECT_TIMEOUT_MS 2000
#define REPL_REDIAL_NS (200ull * 1000000ull)
#define REPL_REDIAL_MAX_NS (5000ull * 1000000ull)

/* RW_HELD: a REPL_PARTIAL or REPL_PARKED entry (orphans, below): nothing
 * of it is published or acknowledged by itself. */
enum rw_kind { RW_PUSH, RW_INIT, RW_STEP, RW_HELD, RW_STEP_DONE };

/* An update applied here, waiting for its replicas (or, RW_STEP_DONE, a
 * sync contribution, acknowledged TAKEN, waiting for its step). */
struct repl_wait {
	enum rw_kind kind;
	uint64_t seq;		/* the partition's entry seq (not STEP_DONE) */
	/* STEP_DONE of a step orphaned by rank `orphan` (-1: not), ended as
	 * taken once entry orphan_seq (0: not shipped yet) is confirmed */
	int orphan;
	uint64_t orphan_seq;
	struct srv_tensor *t;
	struct shard *s;
	struct srv_conn *c;		/* the worker to acknowledge (NULL: gone, or none) */
	uint32_t slot;
	uint64_t holds;		/* PUSH: the lock word to release ... */
	bool hold;		/* ... unless the worker's next push follows under it */
	uint64_t clock;		/* STEP_DONE: the step it is part of */
	uint64_t since;		/* when it began waiting (rps__now_ns) */
	bool warned;		/* said once that it waits long */
	uint32_t nrep;
	struct {
		uint64_t id;
		struct srv_conn *rc;	/* NULL: the stream broke */
		uint64_t cseq;		/* confirmed once rc->repl.cseq_acked reaches it */
	} rep[REPL_MAX];
};

const char *rps__srv_repl_fingerprint(struct rps__server *srv)
{
	if (!srv->repl.fp[0])
		snprintf(srv->repl.fp, sizeof(srv->repl.fp), "rdmaps %s agg=%s optim=%d", PACKAGE_VERSION,
			 rps__agg_isa_name(rps__agg_best_isa()), (int)rps__optim_best_path());
	return srv->repl.fp;
}

/* Bytes per slot: the descriptor and the largest payload (a shard in
 * fp32, or a tensor binding). */
uint32_t rps__srv_repl_slot_size(const struct rps__server *srv)
{
	size_t payload = RPS__MAX((size_t)srv->shard_elems * 4u, sizeof(struct rps__repl_tensor));

	return (uint32_t)RPS__ALIGN_UP(RPS__REPL_DESC_SIZE + payload, 64);
}

static uint32_t replicas(const struct rps__dp_part *v, uint64_t ids[REPL_MAX])
{
	uint32_t k, n = 0;

	for (k = 0; k < v->nbackups && k < 2; k++)
		ids[n++] = v->backups[k];
	if (v->joining)
		ids[n++] = v->joining;
	return n;
}

static bool still_replica(const struct rps__server *srv, uint32_t part, uint64_t id)
{
	uint64_t ids[REPL_MAX];
	uint32_t k, n = replicas(&srv->parts[part], ids);

	for (k = 0; k < n; k++)
		if (ids[k] == id)
			return true;
	return false;
}

static struct repl_peer *peer_find(struct rps__server *srv, uint64_t id)
{
	uint32_t i;

	for (i = 0; i < srv->repl.npeers; i++)
		if (srv->repl.peers[i].id == id)
			return &srv->repl.peers[i];
	return NULL;
}

int rps__srv_repl_set_peer(struct rps__server *srv, uint64_t id, const char *uri)
{
	struct repl_peer *p = peer_find(srv, id);

	if (!p) {
		if (!uri || srv->repl.npeers == RPS__SMAP_MAX_MEMBERS)
			return uri ? -ENOSPC : 0;
		p = &srv->repl.peers[srv->repl.npeers++];
		memset(p, 0, sizeof(*p));
		p->id = id;
	}
	if (!uri)
		uri = "";
	if (strcmp(p->uri, uri)) {
		snprintf(p->uri, sizeof(p->uri), "%s", uri);
		if (p->conn)
			rps__srv_conn_fail(p->conn, "its member moved to another address");
		if (p->in)
			rps__srv_conn_fail(p->in, "its member moved to another address");
	}
	return 0;
}

static bool is_bound(const struct srv_conn *rc, uint32_t tensor_id)
{
	return tensor_id < rc->repl.nbound && rc->repl.bound[tensor_id];
}

/* ---- the primary: shipping ---------------------------------------------- */

int rps__srv_repl_reserve(struct rps__server *srv, struct srv_tensor *t, uint32_t part)
{
	uint64_t ids[REPL_MAX];
	uint32_t k, n = replicas(&srv->parts[part], ids);
	int ret = 0;

	srv->repl.active = true;
	if (rps__grow(&srv->repl.rwaits, &srv->repl.rwaits_cap, srv->repl.nrwaits + 1, sizeof(*srv->repl.rwaits), 64))
		return -EAGAIN;
	for (k = 0; k < n; k++) {
		struct repl_peer *p = peer_find(srv, ids[k]);
		struct srv_conn *rc = p ? p->conn : NULL;
		if (p)
			p->wanted = true;
		else if (srv->repl.unknown != ids[k]) {
			srv->repl.unknown = ids[k];	/* said once, not per push */
			rps__log(RPS__LOG_ERROR, "partition %u: no address for its replica member %llu: its pushes wait",
				 part, (unsigned long long)ids[k]);
		}
		if (!rc || rc->dead || !rc->repl.ready || rc->repl.credits < 1u + !is_bound(rc, t->id))
			ret = -EAGAIN;
	}
	return ret;
}

static void post_entry(struct rps__server *srv, struct srv_conn *rc, struct rps__repl_desc d, const void *payload)
{
	uint32_t k = (uint32_t)(rc->repl.cseq % rc->repl.nslots);
	char *buf = rc->bufs.slots + (size_t)k * rc->repl.slot_size;
	struct rps__wr wr;

	/* credits: a free slot on the backup for this entry (rps__srv_repl_reserve
	 * made sure), never more than it has; nothing acked that was not sent */
	assert(rc->repl.credits > 0 && rc->repl.credits <= rc->repl.nslots);
	assert(rc->repl.cseq_acked <= rc->repl.cseq);
	d.magic = RPS__REPL_MAGIC;
	d.cseq = ++rc->repl.cseq;
	memcpy(buf, &d, sizeof(d));
	if (d.nbytes)
		memcpy(buf + RPS__REPL_DESC_SIZE, payload, d.nbytes);
	rc->repl.credits--;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uint64_t)WRID_REPL << 32;
	wr.op = RPS__OP_WRITE_IMM;
	wr.sge.addr = buf;
	wr.sge.len = RPS__REPL_DESC_SIZE + d.nbytes;
	wr.sge.mr = rc->bufs.slots_mr;
	wr.raddr = rc->repl.raddr + (uint64_t)k * rc->repl.slot_size;
	wr.rkey = rc->repl.rkey;
	wr.imm = k;
	if (rps__post(rc->ep, &wr, 1))
		rps__srv_conn_fail(rc, rps__errbuf());
	srv->repl.stats.entries_sent++;
}

static void bind_tensor(struct rps__server *srv, struct srv_conn *rc, struct srv_tensor *t)
{
	struct rps__repl_desc d;
	struct rps__repl_tensor bt;

	if (is_bound(rc, t->id))
		return;
	if (t->id >= rc->repl.nbound) {
		uint8_t *grown = realloc(rc->repl.bound, t->id + 1u);
		if (!grown) {
			rps__srv_conn_fail(rc, "out of memory binding a tensor");
			return;
		}
		memset(grown + rc->repl.nbound, 0, t->id + 1u - rc->repl.nbound);
		rc->repl.bound = grown;
		rc->repl.nbound = t->id + 1u;
	}
	memset(&bt, 0, sizeof(bt));
	snprintf(bt.name, sizeof(bt.name), "%s", t->name);
	bt.spec = t->spec;
	memset(&d, 0, sizeof(d));
	d.kind = RPS__REPL_TENSOR;
	d.tensor_id = t->id;
	d.part = UINT32_MAX;
	d.nbytes = sizeof(bt);
	post_entry(srv, rc, d, &bt);
	rc->repl.bound[t->id] = 1;
}

/* Ship entry d (of shard s) to every replica of its partition: the wait w
 * learns what confirms it. */
static void ship(struct rps__server *srv, struct srv_tensor *t, struct shard *s, struct rps__repl_desc d,
		 const void *payload, struct repl_wait *w)
{
	uint64_t ids[REPL_MAX];
	uint32_t k, n = replicas(&srv->parts[s->part], ids);

	d.tensor_id = t->id;
	d.shard = s->index;
	d.part = s->part;
	d.epoch = srv->parts[s->part].epoch;
	d.seq = ++srv->repl.seq[s->part];
	assert(d.seq != 0);	/* forward only: never wraps */
	d.version = s->step;
	w->seq = d.seq;
	w->orphan = -1;
	w->t = t;
	w->s = s;
	w->since = rps__now_ns();
	w->warned = false;
	w->nrep = 0;
	for (k = 0; k < n; k++) {
		struct repl_peer *p = peer_find(srv, ids[k]);
		struct srv_conn *rc = p->conn;	/* rps__srv_repl_reserve saw it ready */
		assert(rc && rc->repl.ready && rc->repl.credits >= 1u + !is_bound(rc, t->id));
		bind_tensor(srv, rc, t);
		post_entry(srv, rc, d, payload);
		w->rep[w->nrep].id = ids[k];
		w->rep[w->nrep].rc = rc;
		w->rep[w->nrep].cseq = rc->repl.cseq;
		w->nrep++;
	}
	if (w->kind != RW_HELD)
		s->repl_pending++;
	srv->repl.stats.deferred++;
	srv->repl.rwaits[srv->repl.nrwaits++] = *w;	/* room made by rps__srv_repl_reserve */
}

void rps__srv_repl_push(struct rps__server *srv, struct srv_tensor *t, struct shard *s,
			const struct rps__push_desc *pd, struct srv_conn *c, uint32_t slot, uint64_t holds)
{
	struct repl_wait w = { .kind = RW_PUSH, .c = c, .slot = slot, .holds = holds,
			       .hold = (pd->flags & RPS__DESC_HOLD) != 0 };
	struct rps__repl_desc d;

	memset(&d, 0, sizeof(d));
	d.kind = RPS__REPL_PUSH;
	d.dtype = pd->dtype;
	d.rank = pd->rank;
	d.nbytes = pd->nbytes;
	d.push_id = pd->push_id;
	d.client_id = c->client_id;
	d.clock = pd->clock;
	c->bufs.slot_state[slot] = 1;
	ship(srv, t, s, d, (const char *)pd + RPS__PUSH_DESC_SIZE, &w);
}

void rps__srv_repl_init(struct rps__server *srv, struct srv_tensor *t, struct shard *s, struct srv_conn *c,
			uint32_t slot)
{
	struct repl_wait w = { .kind = RW_INIT, .c = c, .slot = slot };
	struct rps__repl_desc d;

	memset(&d, 0, sizeof(d));
	d.kind = RPS__REPL_INIT;
	d.dtype = RPS_DTYPE_F32;
	d.nbytes = s->elems * 4u;
	c->bufs.slot_state[slot] = 1;
	ship(srv, t, s, d, s->params, &w);
}

/* The step's fp32 sum, once: backups do not recompute it. */
void rps__srv_repl_step(struct rps__server *srv, struct srv_tensor *t, struct shard *s)
{
	struct repl_wait w = { .kind = RW_STEP };
	struct rps__repl_desc d;

	memset(&d, 0, sizeof(d));
	d.kind = RPS__REPL_STEP;
	d.dtype = RPS_DTYPE_F32;
	d.nbytes = s->elems * 4u;
	d.clock = s->step - 1;
	ship(srv, t, s, d, s->acc, &w);
}

/*
 * Sync, replicated: the two-stage acknowledgement.  A contribution, summed
 * in its turn or parked out of turn, was acknowledged TAKEN (push.c): its
 * slot is free, as with one ack, so parking keeps its deadlock freedom (a
 * rank whose slots all held summed contributions could otherwise block the
 * pushes that complete those steps).  Its connection is told STEP_DONE
 * once the step is on every replica; until then the worker keeps the
 * gradient and resends it to a new primary if this one dies (a resend of a
 * step already there is -EALREADY: counted).
 */
void rps__srv_repl_step_wait(struct rps__server *srv, struct srv_conn *c, struct srv_tensor *t, struct shard *s,
			     uint64_t clock)
{
	if (rps__grow(&srv->repl.rwaits, &srv->repl.rwaits_cap, srv->repl.nrwaits + 1, sizeof(*srv->repl.rwaits), 64)) {
		rps__srv_conn_fail(c, "out of memory deferring an acknowledgement");
		return;
	}
	srv->repl.rwaits[srv->repl.nrwaits++] = (struct repl_wait){
		.kind = RW_STEP_DONE, .t = t, .s = s, .c = c, .clock = clock, .since = rps__now_ns(), .orphan = -1,
	};
	srv->repl.active = true;
}

/* Is step `clock` of s on every replica?  Sync ships one step at a time
 * (sync_take waits for repl_pending), so every step before the last is. */
bool rps__srv_repl_step_confirmed(const struct shard *s, uint64_t clock)
{
	return clock + 1 < s->step || (clock < s->step && !s->repl_pending);
}

static void sd_append(struct srv_conn *c, struct rps__step_done_ent e)
{
	if (rps__grow(&c->sd.ent, &c->sd.cap, c->sd.n + 1, sizeof(*c->sd.ent), 16)) {
		rps__srv_conn_fail(c, "out of memory for its STEP_DONE");
		return;
	}
	c->sd.ent[c->sd.n++] = e;
}

/* Owe c a STEP_DONE for (t, s, step): one entry per shard, the latest step
 * (it covers the earlier ones). */
static void step_done_note(struct srv_conn *c, const struct srv_tensor *t, const struct shard *s, uint64_t step,
			   bool resend)
{
	uint32_t k;

	for (k = 0; k < c->sd.n; k++)
		if (c->sd.ent[k].tensor_id == t->id && c->sd.ent[k].shard == s->index &&
		    c->sd.ent[k].missing_rank < 0) {
			/* "resend" covers the done steps below it too (their
			 * resends are answered -EALREADY: counted); a later
			 * done step covers every earlier one */
			if (resend || step > c->sd.ent[k].step) {
				c->sd.ent[k].step = RPS__MAX(step, c->sd.ent[k].step);
				c->sd.ent[k].version = resend ? 0 : step + 1;
			}
			return;
		}
	sd_append(c, (struct rps__step_done_ent){
		.tensor_id = t->id, .shard = s->index, .step = step, .version = resend ? 0 : step + 1,
		.missing_rank = -1,
	});
}

/* Owe c the end of its TAKEN push to step `step` of (t, s), orphaned by
 * `rank`: an entry of its own (it covers that step alone, so a done entry
 * of an earlier step, before or after it, still says that one is on every
 * replica). */
static void step_done_orphaned(struct srv_conn *c, const struct srv_tensor *t, const struct shard *s, uint64_t step,
			       int rank)
{
	uint32_t k;

	for (k = 0; k < c->sd.n; k++)
		if (c->sd.ent[k].tensor_id == t->id && c->sd.ent[k].shard == s->index &&
		    c->sd.ent[k].missing_rank >= 0 && c->sd.ent[k].step == step)
			return;
	sd_append(c, (struct rps__step_done_ent){
		.tensor_id = t->id, .shard = s->index, .step = step, .version = 0, .missing_rank = rank,
	});
}

/*
 * Sync: `rank` left before its push for the current step of s, which
 * cannot complete until a new process of that rank pushes or psctl
 * remove-rank drops it (requests.c, rps__srv_missing_rank).  Without
 * backups the others' pushes were acknowledged, and their pulls' WAITs are
 * failed naming the rank; here their pushes were TAKEN and would wait for
 * a STEP_DONE past their timeout.  They are ended as taken (STEP_DONE
 * entries naming the rank: orphans_turn), so that the workers go on to the
 * pull that says which rank is missing, as without backups.  A worker
 * forgets a push ended so: it must be on every backup first, for a backup
 * promoted before the step completes (this primary killed while the job
 * waits for the rank's replacement) to complete it with the replacement's
 * push alone, to the same bits.  Nothing is applied: the step completes
 * and replicates whole once the rank is replaced or removed.
 */
void rps__srv_repl_step_orphaned(struct rps__server *srv, struct shard *s, int rank)
{
	for (uint32_t i = 0; i < srv->repl.nrwaits; i++) {
		struct repl_wait *w = &srv->repl.rwaits[i];

		if (w->kind == RW_STEP_DONE && w->s == s && w->clock >= s->step && w->orphan < 0) {
			w->orphan = rank;
			w->orphan_seq = 0;
			srv->repl.orphans_owed = true;	/* the repl turn ships them, then ends them */
		}
	}
	srv->repl.active = true;
}

/* The parked push of (t, shard `local`) of `rank` for step `clock`, or NULL. */
static struct parked *parked_find(struct rps__server *srv, const struct srv_tensor *t, uint32_t local, int rank,
				  uint64_t clock)
{
	for (uint32_t i = 0; i < srv->push.nparked; i++) {
		struct parked *pk = &srv->push.parked[i];

		if (pk->t == t && pk->local == local && pk->rank == rank && pk->clock == clock)
			return pk;
	}
	return NULL;
}

/*
 * Put the contribution of orphaned wait rwaits[i] on every replica: in the
 * step's sum so far, a REPL_PARTIAL of that sum (one serves every wait of
 * the step until the sum takes another rank's); parked, a REPL_PARKED of
 * it.  The wait is ended once that entry is confirmed.  -EAGAIN: no room
 * on a replica yet (or no lease): next turn.
 */
static int orphan_ship(struct rps__server *srv, uint32_t i)
{
	struct repl_wait held = { .kind = RW_HELD }, *w = &srv->repl.rwaits[i];
	struct srv_tensor *t = w->t;
	struct shard *s = w->s;
	uint32_t local = (uint32_t)(s - t->shards);
	int rank = w->c->rank;
	struct rps__repl_desc d;
	struct parked *pk;
	void *conv = NULL;

	if (srv->parts[s->part].primary != srv->my_id || rps__srv_lease_fenced(srv, s->part) || !s->hdr)
		return -EAGAIN;	/* (moved away: rps__srv_repl_refuse_part tells it to resend) */
	memset(&d, 0, sizeof(d));
	if (w->clock == s->step && rank < s->next_rank) {
		if (s->partial_seq && s->partial_step == s->step && s->partial_rank == s->next_rank) {
			w->orphan_seq = s->partial_seq;
			return 0;
		}
		if (rps__srv_repl_reserve(srv, t, s->part))
			return -EAGAIN;
		d.kind = RPS__REPL_PARTIAL;
		d.dtype = RPS_DTYPE_F32;
		d.rank = s->next_rank;
		d.nsummed = s->nsummed;
		d.clock = s->step;
		d.nbytes = s->elems * 4u;
		ship(srv, t, s, d, s->acc, &held);
		s->partial_step = s->step;
		s->partial_rank = s->next_rank;
		s->partial_seq = held.seq;
	} else if ((pk = parked_find(srv, t, local, rank, w->clock)) != NULL) {
		if (rps__srv_repl_reserve(srv, t, s->part))
			return -EAGAIN;
		if (pk->in_acc) {
			/* taken early (before the partition had backups): the
			 * accumulator holds it alone, widened exactly */
			conv = malloc(pk->nbytes ? pk->nbytes : 1);
			if (!conv)
				return -EAGAIN;
			rps__f32_to_dtype(conv, s->acc, t->spec.dtype, s->elems);
		}
		d.kind = RPS__REPL_PARKED;
		d.dtype = (uint16_t)t->spec.dtype;
		d.rank = rank;
		d.clock = pk->clock;
		d.nbytes = (uint32_t)pk->nbytes;
		ship(srv, t, s, d, conv ? conv : pk->data, &held);
		free(conv);
	} else {
		/* neither in the sum nor parked: not a contribution this step
		 * holds (never expected); ended after what was shipped */
		rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: rank %d's taken push of step %llu is neither summed "
			 "nor parked here", t->name, s->index, rank, (unsigned long long)w->clock);
		held.seq = srv->repl.seq[s->part];
	}
	srv->repl.stats.orphan_entries += d.kind != 0;
	srv->repl.rwaits[i].orphan_seq = held.seq ? held.seq : 1;	/* (ship may have moved rwaits) */
	return 0;
}

/* Is every entry of partition `part` up to seq on every replica? */
static bool entries_confirmed(const struct rps__server *srv, uint32_t part, uint64_t seq)
{
	for (uint32_t i = 0; i < srv->repl.nrwaits; i++) {
		const struct repl_wait *w = &srv->repl.rwaits[i];

		if (w->kind != RW_STEP_DONE && w->s->part == part && w->seq <= seq)
			return false;
	}
	return true;
}

/* Orphaned contributions: ship what is not on the replicas yet, and end
 * as taken what is (rps__srv_repl_step_orphaned). */
static void orphans_turn(struct rps__server *srv)
{
	bool owed = false;
	uint32_t i = 0;

	while (i < srv->repl.nrwaits) {
		struct repl_wait w = srv->repl.rwaits[i];

		if (w.kind != RW_STEP_DONE || w.orphan < 0) {
			i++;
			continue;
		}
		if (w.clock < w.s->step) {
			/* the step completed meanwhile: its STEP_DONE as usual */
			srv->repl.rwaits[i++].orphan = -1;
			continue;
		}
		if (w.c && !w.orphan_seq && orphan_ship(srv, i)) {
			owed = true;
			i++;
			continue;
		}
		w = srv->repl.rwaits[i];
		if (w.c && (!entries_confirmed(srv, w.s->part, w.orphan_seq) || rps__srv_lease_fenced(srv, w.s->part))) {
			owed = true;
			i++;
			continue;
		}
		memmove(&srv->repl.rwaits[i], &srv->repl.rwaits[i + 1], (srv->repl.nrwaits - i - 1) * sizeof(w));
		srv->repl.nrwaits--;
		if (!w.c)
			continue;	/* nobody left to tell */
		rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: rank %d left before its push for step %llu: "
			 "ending the taken push of %s (on every replica)", w.t->name, w.s->index, w.orphan,
			 (unsigned long long)w.clock, rps__ep_peer(w.c->ep));
		step_done_orphaned(w.c, w.t, w.s, w.clock, w.orphan);	/* sent at the end of the turn */
		srv->repl.stats.step_done_orphaned++;
	}
	srv->repl.orphans_owed = owed;
}

/* Does an update of the partition still wait for its replicas (a step or a
 * push applied here, not yet confirmed by every backup)?  A fence waits
 * for them: what a move ships, or what a backup takes over in a planned
 * switch, must be what every backup holds. */
bool rps__srv_repl_busy(const struct rps__server *srv, uint32_t part)
{
	for (uint32_t i = 0; i < srv->repl.nrwaits; i++)
		if (srv->repl.rwaits[i].kind != RW_STEP_DONE && srv->repl.rwaits[i].s->part == part)
			return true;
	return false;
}

void rps__srv_repl_refuse_part(struct rps__server *srv, uint32_t part)
{
	uint32_t i = 0;

	while (i < srv->repl.nrwaits) {
		struct repl_wait w = srv->repl.rwaits[i];
		if (w.kind != RW_STEP_DONE || w.s->part != part) {
			i++;
			continue;
		}
		memmove(&srv->repl.rwaits[i], &srv->repl.rwaits[i + 1], (srv->repl.nrwaits - i - 1) * sizeof(w));
		srv->repl.nrwaits--;
		if (w.c) {
			step_done_note(w.c, w.t, w.s, w.clock, true);	/* sent at the end of the turn */
			srv->repl.stats.step_done_resend++;
		}
	}
}

/* Once per loop turn: one STEP_DONE per worker connection that is owed
 * some, within its window (the rest wait for a later turn). */
static void step_done_flush(struct rps__server *srv)
{
	uint32_t i;

	for (i = 0; i < srv->nconns; i++) {
		struct srv_conn *c = srv->conns[i];
		struct rps__step_done sd;
		uint32_t n;
		if (c->role != CONN_WORKER || !c->sd.n || c->dead || c->sd.inflight >= RPS__STEP_DONE_WINDOW)
			continue;
		n = RPS__MIN(c->sd.n, RPS__STEP_DONE_MAX);
		memset(&sd, 0, sizeof(sd));
		sd.n = n;
		memcpy(sd.e, c->sd.ent, n * sizeof(*c->sd.ent));
		memmove(c->sd.ent, c->sd.ent + n, (c->sd.n - n) * sizeof(*c->sd.ent));
		c->sd.n -= n;
		srv->repl.stats.step_done_sent++;
		srv->repl.stats.step_done_entries += n;
		srv->repl.stats.last_step_done = sd.e[n - 1];
		rps__srv_conn_send_step_done(c, &sd);
	}
}

/* ---- the primary: confirmation ------------------------------------------ */

static bool wait_confirmed(const struct rps__server *srv, const struct repl_wait *w)
{
	uint32_t k;

	for (k = 0; k < w->nrep; k++) {
		/* a replica the map dropped (committed, epoch+1) is not waited for */
		if (!w->rep[k].id || !still_replica(srv, w->s->part, w->rep[k].id))
			continue;
		if (!w->rep[k].rc || w->rep[k].rc->repl.cseq_acked < w->rep[k].cseq)
			return false;
	}
	return true;
}

static void wait_complete(struct rps__server *srv, const struct repl_wait *w)
{
	struct srv_tensor *t = w->t;
	struct shard *s = w->s;
	uint64_t lock = 0;

	if (w->kind == RW_HELD)
		return;		/* (orphans: note_orphans ends what waited for it) */
	s->repl_pending--;
	if (!s->hdr)
		return;		/* the partition was dropped meanwhile */
	rps__srv_publish_end(s);
	if (w->kind == RW_PUSH && w->holds && w->c && !rps__srv_lease_fenced(srv, s->part)) {
		/* acknowledged, then released (or kept for the chain's next push) */
		rps__srv_ack_then_release(srv, w->c, w->slot, 0, t, s, w->holds, w->hold);
	} else {
		if (w->kind == RW_PUSH && w->holds && w->hold) {
			lock = w->holds;	/* kept for the chain's next push: its lease starts again */
			s->lease_word = 0;
		} else if (w->kind == RW_PUSH && w->holds && t->regions[s->part].mr) {
			lock = rps__srv_release_lock(srv, t, s, w->holds);
		}
		if (w->c && w->kind != RW_STEP) {
			/* On every replica, but our lease ran out: a new primary may
			 * be serving it already, so say nothing of it; the worker
			 * resends there (or here), where its push id is known. */
			if (rps__srv_lease_fenced(srv, s->part)) {
				srv->repl.stats.lease_refused++;
				rps__srv_push_ack(w->c, w->slot, RPS_ESTALE_EPOCH, 0, lock);
			} else {
				rps__srv_push_ack(w->c, w->slot, 0, s->step, lock);
			}
		}
	}
	rps__srv_wake_waiters(srv, t, s->index);
}

/*
 * The map changed partition part's replica set.  A replica it dropped is
 * let go by every update waiting for it, for good: were the member seeded
 * again later (a joiner), its image is fenced after these updates, so it
 * holds them, and the stream the wait named is gone with the old one.
 * Matching by id alone would wait on that dead stream again once the
 * member is back (the drop and the seeding are applied in one loop turn
 * under load): its primary could then never fence the image the joiner
 * waits for, and both sides would time out the seeding.
 */
void rps__srv_repl_view_changed(struct rps__server *srv, uint32_t part)
{
	for (uint32_t i = 0; i < srv->repl.nrwaits; i++) {
		struct repl_wait *w = &srv->repl.rwaits[i];

		if (w->kind == RW_STEP_DONE || w->s->part != part)
			continue;
		for (uint32_t k = 0; k < w->nrep; k++)
			if (w->rep[k].id && !still_replica(srv, part, w->rep[k].id)) {
				w->rep[k].id = 0;
				w->rep[k].rc = NULL;
			}
	}
	rps__srv_repl_confirm(srv);
}

/* Complete what every replica confirmed, in order; then note the
 * STEP_DONEs of sync contributions whose step is confirmed. */
void rps__srv_repl_confirm(struct rps__server *srv)
{
	bool any = false;
	uint32_t i = 0;

	while (i < srv->repl.nrwaits) {
		struct repl_wait w = srv->repl.rwaits[i];
		if (w.kind == RW_STEP_DONE || !wait_confirmed(srv, &w)) {
			i++;
			continue;
		}
		memmove(&srv->repl.rwaits[i], &srv->repl.rwaits[i + 1], (srv->repl.nrwaits - i - 1) * sizeof(w));
		srv->repl.nrwaits--;
		wait_complete(srv, &w);
		any = true;
	}
	i = 0;
	while (i < srv->repl.nrwaits) {
		struct repl_wait w = srv->repl.rwaits[i];
		/* no STEP_DONE without the lease: it waits for the lease to
		 * come back (or the worker's resend to the new primary) */
		if (w.kind != RW_STEP_DONE || !rps__srv_repl_step_confirmed(w.s, w.clock) ||
		    rps__srv_lease_fenced(srv, w.s->part)) {
			i++;
			continue;
		}
		memmove(&srv->repl.rwaits[i], &srv->repl.rwaits[i + 1], (srv->repl.nrwaits - i - 1) * sizeof(w));
		srv->repl.nrwaits--;
		if (w.c)
			step_done_note(w.c, w.t, w.s, w.clock, false);	/* sent at the end of the turn */
	}
	if (any)
		rps__srv_drain_held(srv);
}

/* ---- the primary: the connection ------------------------------------------ */

static void send_hello(struct rps__server *srv, struct srv_conn *c)
{
	struct rps__repl_hello h;

	memset(&h, 0, sizeof(h));
	h.from_id = srv->my_id;
	snprintf(h.fingerprint, sizeof(h.fingerprint), "%s", rps__srv_repl_fingerprint(srv));
	rps__srv_conn_reply(c, RPS__MSG_REPL_HELLO, 0, 0, &h, sizeof(h));
}

/*
 * Dial member p for a stream: ours to it (we are primary), or, rev, its
 * stream to us (we are the backup).  Only the higher member id dials, as
 * for PEER connections, so two servers never both dial for one stream.
 * The dial goes on while the loop runs (dial.c): pushes for p stay held
 * until repl_dialed() has the stream up.  0 started, or -1.
 */
static int dial(struct rps__server *srv, struct repl_peer *p, bool rev)
{
	struct rps__conn_priv priv = {
		.magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION,
		.role = rev ? RPS__ROLE_REPL_REV : RPS__ROLE_REPL, .from_id = srv->my_id, .to_id = p->id,
	};
	struct rps__ep_attr attr = { 0 };
	struct srv_conn *c;

	if (rps__srv_conn_new(srv, CONN_REPL, &c)) {
		rps__log(RPS__LOG_WARN, "replication %s member %llu: %s", rev ? "from" : "to",
			 (unsigned long long)p->id, rps__errbuf());
		return -1;
	}
	/* the backup's slots exist before the primary's REPL_HELLO can come */
	if (rev && rps__srv_repl_accepted(srv, c)) {
		rps__log(RPS__LOG_WARN, "replication from member %llu: %s", (unsigned long long)p->id, rps__errbuf());
		rps__srv_conn_free(srv, c);
		return -1;
	}
	attr.sq_depth = c->bufs.nsend + (rev ? 0 : REPL_SLOTS) + 8 + RPS__BIND_RESERVE;
	attr.rq_depth = c->bufs.nrecv;
	attr.max_inline = 64;
	if (rps__srv_dial(srv, c, rev ? SRV_DIAL_REPL_REV : SRV_DIAL_REPL, p->id, p->uri, &priv, &attr,
			  REPL_CONNECT_TIMEOUT_MS)) {
		rps__log(RPS__LOG_INFO, "replication %s member %llu (%s): %s", rev ? "from" : "to",
			 (unsigned long long)p->id, p->uri, rps__errbuf());
		rps__srv_conn_free(srv, c);
		return -1;
	}
	return 0;
}

/* Back off after a failed dial: doubling up to 5 s, with a jitter that
 * differs per server. */
static void dial_failed(struct rps__server *srv, struct repl_peer *p, bool rev)
{
	uint64_t now = rps__now_ns();
	uint64_t *next = rev ? &p->next_dial_in : &p->next_dial;
	uint32_t *fails = rev ? &p->fails_in : &p->fails;

	*next = now + RPS__MIN(REPL_REDIAL_NS << RPS__MIN(*fails, 5u), REPL_REDIAL_MAX_NS) +
		(srv->my_id * 7919u + now) % REPL_REDIAL_NS;
	(*fails)++;
}

/* A dial is over: the stream is up, or p is dialed again later. */
void rps__srv_repl_dialed(struct rps__server *srv, struct srv_conn *c, bool rev, int ret, uint64_t to_id,
			  const char *uri, const struct rps__conn_priv *rp)
{
	struct repl_peer *p = peer_find(srv, to_id);

	if (!p || strcmp(p->uri, uri)) {	/* it moved meanwhile: dialed anew */
		rps__srv_conn_free(srv, c);
		return;
	}
	if (ret) {
		rps__log(RPS__LOG_INFO, "replication %s member %llu (%s): %s", rev ? "from" : "to",
			 (unsigned long long)p->id, p->uri, rps__errbuf());
		goto fail;
	}
	if (rp->from_id != p->id) {
		rps__log(RPS__LOG_WARN, "replication with %s: answered as member %llu, not %llu", p->uri,
			 (unsigned long long)rp->from_id, (unsigned long long)p->id);
		goto fail;
	}
	c->repl.out = !rev;
	c->peer_id = p->id;
	if (rps__srv_conn_attach(srv, c)) {	/* in no table yet when it fails */
		rps__log(RPS__LOG_WARN, "replication with %s: %s", p->uri, rps__errbuf());
		goto fail;
	}
	if (rev) {
		p->fails_in = 0;
		if (p->in)	/* it dialed us meanwhile?  Ours is the newer */
			rps__srv_conn_fail(p->in, "dialed again");
		p->in = c;
		return;
	}
	p->fails = 0;
	if (p->conn)
		rps__srv_conn_fail(p->conn, "dialed again");
	p->conn = c;
	send_hello(srv, c);
	srv->repl.active = true;
	return;
fail:
	rps__srv_conn_free(srv, c);
	dial_failed(srv, p, rev);
}

/* A backup with the higher member id dialed us for its stream: it is our
 * stream to it from now on (a newer dial replaces one it saw die). */
void rps__srv_repl_rev_accepted(struct rps__server *srv, struct srv_conn *c)
{
	struct repl_peer *p = peer_find(srv, c->peer_id);

	if (!p) {
		rps__srv_conn_fail(c, "replication from a member we know no address of");
		return;
	}
	if (p->conn && p->conn != c)
		rps__srv_conn_fail(p->conn, "its member dialed again");
	c->repl.out = true;
	p->conn = c;
	srv->repl.active = true;
	send_hello(srv, c);
}

/* The backup's slots: allocate our ring of the same shape. */
static void on_hello_rep(struct rps__server *srv, struct srv_conn *c, const struct rps__msg_hdr *h,
			 const struct rps__repl_hello_rep *r)
{
	size_t len;

	if (h->status || strncmp(r->fingerprint, rps__srv_repl_fingerprint(srv), sizeof(r->fingerprint))) {
		rps__log(RPS__LOG_ERROR, "replication to member %llu refused (%d): its kernel fingerprint is \"%.*s\", "
			 "ours \"%s\": run the same rdmapsd build on every server", (unsigned long long)c->peer_id,
			 h->status, (int)sizeof(r->fingerprint), r->fingerprint, rps__srv_repl_fingerprint(srv));
		rps__srv_conn_fail(c, "replication refused");
		srv->repl.stats.pairings_refused++;
		return;
	}
	if (c->repl.ready || !r->nslots || r->nslots > 1024 || r->slot_size < rps__srv_repl_slot_size(srv) ||
	    r->slot_size % 64) {
		rps__srv_conn_fail(c, "answered REPL_HELLO with slots we cannot use");
		return;
	}
	len = (size_t)r->nslots * r->slot_size;
	if (rps__srv_mem_take(srv, len, "replication ring"))
		goto err;
	c->bufs.slots = rps__topo_alloc(srv->topo, &srv->place, len);
	if (!c->bufs.slots) {
		rps__srv_mem_give(srv, len);
		goto err;
	}
	c->bufs.slots_len = len;
	if (rps__mr_reg(srv->fab, c->bufs.slots, len, RPS__ACCESS_LOCAL, &c->bufs.slots_mr))
		goto err;
	c->repl.nslots = r->nslots;
	c->repl.slot_size = r->slot_size;
	c->repl.raddr = r->slot_addr;
	c->repl.rkey = r->slot_rkey;
	c->repl.credits = r->nslots;
	c->repl.ready = true;
	rps__log(RPS__LOG_INFO, "replicating to member %llu (%s): %u slots of %u bytes",
		 (unsigned long long)c->peer_id, rps__ep_peer(c->ep), r->nslots, r->slot_size);
	rps__srv_drain_held(srv);
	return;
err:
	rps__srv_conn_fail(c, "out of memory for the replication ring");
}

static void on_ack(struct rps__server *srv, struct srv_conn *c, const struct rps__msg_hdr *h,
		   const struct rps__repl_ack *a)
{
	if (h->type == RPS__MSG_REPL_NACK) {
		rps__log(RPS__LOG_ERROR, "member %llu refused replication entry %llu (partition %u): %s",
			 (unsigned long long)c->peer_id, (unsigned long long)a->cseq + 1, a->part,
			 h->status == RPS_ESTALE_EPOCH ? "our epoch is older than its map's" : "it diverged");
		rps__srv_conn_fail(c, "replication refused");
		return;
	}
	if (a->cseq > c->repl.cseq || a->cseq < c->repl.cseq_acked || a->credits > c->repl.nslots - c->repl.credits) {
		rps__srv_conn_fail(c, "acknowledged replication entries never sent");
		return;
	}
	c->repl.cseq_acked = a->cseq;
	c->repl.credits += a->credits;
	assert(c->repl.credits <= c->repl.nslots && c->repl.cseq_acked <= c->repl.cseq);
	srv->repl.stats.acks_received++;
	rps__srv_repl_confirm(srv);
}

/* ---- both sides ------------------------------------------------------------- */

void rps__srv_repl_on_message(struct rps__server *srv, struct srv_conn *c, const struct rps__msg_hdr *h,
			      const void *body)
{
	if (!c->repl.out && h->type == RPS__MSG_REPL_HELLO)
		rps__srv_repl_on_hello(srv, c, h, body);
	else if (c->repl.out && h->type == RPS__MSG_REPL_HELLO_REP)
		on_hello_rep(srv, c, h, body);
	else if (c->repl.out && c->repl.ready && (h->type == RPS__MSG_REPL_ACK || h->type == RPS__MSG_REPL_NACK))
		on_ack(srv, c, h, body);
	else
		rps__srv_conn_fail(c, "sent a message type replication does not take");
}

/*
 * A broken stream.  Entries it carried that the replica had not confirmed
 * are gone with it (nothing resends them), so that replica no longer holds
 * what its partition holds, and the updates waiting for it would wait for
 * ever: the partition's primary asks the map to drop it (REPLICA_DROP, or
 * REPLICA_ABORT for a joiner: control/repl_place.c), which ends those
 * waits (a replica the map dropped is not waited for), and the leader
 * seeds a backup again.  A replica that confirmed everything keeps its
 * place: a new stream goes on from the seq it applied.
 */
void rps__srv_repl_conn_gone(struct rps__server *srv, struct srv_conn *c)
{
	uint32_t i, k;

	for (i = 0; i < srv->repl.nrwaits; i++) {
		struct repl_wait *w = &srv->repl.rwaits[i];
		if (w->c == c)
			w->c = NULL;
		for (k = 0; k < w->nrep; k++) {
			if (w->rep[k].rc != c)
				continue;
			w->rep[k].rc = NULL;
			if (c->repl.cseq_acked >= w->rep[k].cseq) {
				w->rep[k].id = 0;	/* it confirmed this one before the break */
				continue;
			}
			if (still_replica(srv, w->s->part, w->rep[k].id) && !srv->repl.diverged[w->s->part]) {
				srv->repl.diverged[w->s->part] = w->rep[k].id;
				rps__log(RPS__LOG_WARN, "partition %u: the replication stream to member %llu broke before it "
					 "confirmed every update: asking to drop it from the set (it is seeded again)",
					 w->s->part, (unsigned long long)w->rep[k].id);
			}
		}
	}
	for (i = 0; i < srv->repl.npeers; i++) {
		if (srv->repl.peers[i].conn == c) {
			srv->repl.peers[i].conn = NULL;
			srv->repl.peers[i].next_dial = rps__now_ns() + REPL_REDIAL_NS;
		}
		if (srv->repl.peers[i].in == c) {
			srv->repl.peers[i].in = NULL;
			srv->repl.peers[i].next_dial_in = rps__now_ns() + REPL_REDIAL_NS;
		}
	}
}

bool rps__srv_repl_stream_up(struct rps__server *srv, uint32_t part, uint64_t id)
{
	struct repl_peer *p = peer_find(srv, id);

	(void)part;	/* (one stream per member carries every partition) */
	if (!p)
		return false;
	if (p->conn && !p->conn->dead && p->conn->repl.ready)
		return true;
	/* an idle partition's stream is dialed when a push needs it: now
	 * (the repl turn), so that a live backup's is up in a moment */
	p->wanted = true;
	srv->repl.active = true;
	return false;
}

uint64_t rps__srv_repl_diverged(struct rps__server *srv, uint32_t part)
{
	if (part >= RPS__SMAP_MAX_PART || !srv->repl.diverged[part])
		return 0;
	if (srv->parts[part].primary != srv->my_id || !still_replica(srv, part, srv->repl.diverged[part])) {
		srv->repl.diverged[part] = 0;	/* dropped (or no longer ours): done */
		/* another replica's stream may have broken meanwhile (R = 3):
		 * it is the next to drop, else its waits would last for ever */
		for (uint32_t i = 0; i < srv->repl.nrwaits && srv->parts[part].primary == srv->my_id; i++) {
			const struct repl_wait *w = &srv->repl.rwaits[i];

			if (w->kind == RW_STEP_DONE || w->s->part != part)
				continue;
			for (uint32_t k = 0; k < w->nrep; k++)
				if (w->rep[k].id && !w->rep[k].rc && still_replica(srv, part, w->rep[k].id))
					return srv->repl.diverged[part] = w->rep[k].id;
		}
	}
	return srv->repl.diverged[part];
}

/* Are we a backup (or the joiner) of a partition member id leads? */
static bool streams_to_us(const struct rps__server *srv, uint64_t id)
{
	uint32_t p;

	for (p = 0; p < srv->npart && p < RPS__SMAP_MAX_PART; p++)
		if (srv->parts[p].backup && srv->parts[p].primary == id)
			return true;
	return false;
}

/* Is member id a replica (backup or joiner) of a partition we lead?  Not
 * any more once the map dropped it: a dead member is not redialed for
 * ever. */
static bool streams_from_us(const struct rps__server *srv, uint64_t id)
{
	uint32_t p;

	for (p = 0; p < srv->npart && p < RPS__SMAP_MAX_PART; p++)
		if (srv->parts[p].primary == srv->my_id && still_replica(srv, p, id))
			return true;
	return false;
}

/* Dial p (rev: for its stream to us) when due and not under way. */
static void dial_when_due(struct rps__server *srv, struct repl_peer *p, bool rev, uint64_t now)
{
	uint64_t *next = rev ? &p->next_dial_in : &p->next_dial;

	if (now < *next || rps__srv_dialing(srv, rev ? SRV_DIAL_REPL_REV : SRV_DIAL_REPL, p->id))
		return;
	if (dial(srv, p, rev))
		dial_failed(srv, p, rev);
}

/* An update that waits this long for a replica says so, once: a stalled
 * stream is otherwise silent (its workers time out much later, naming no
 * cause).  Checked every REPL_SLOW_NS / 2, one line a time at most (a
 * window of pushes stalls together). */
#define REPL_SLOW_NS (2000ull * 1000000ull)

/* How long w has waited at `now`: 0 for a wait made in this turn after
 * `now` was read (its `since` later than `now`; unsigned, the difference
 * would be some 584 years). */
static uint64_t waited_ns(const struct repl_wait *w, uint64_t now)
{
	return now > w->since ? now - w->since : 0;
}

static void warn_slow(struct rps__server *srv, uint64_t now)
{
	if (now < srv->repl.slow_check)
		return;
	srv->repl.slow_check = now + REPL_SLOW_NS / 2;
	/* A STEP_DONE its step allows, still held: every path that confirms
	 * a step should have sent it.  Say so, and send it, rather than let
	 * the workers time out. */
	for (uint32_t i = 0; i < srv->repl.nrwaits; i++) {
		const struct repl_wait *w = &srv->repl.rwaits[i];

		if (w->kind == RW_STEP_DONE && waited_ns(w, now) >= REPL_SLOW_NS &&
		    rps__srv_repl_step_confirmed(w->s, w->clock) && !rps__srv_lease_fenced(srv, w->s->part)) {
			rps__log(RPS__LOG_WARN, "partition %u: tensor '%s' shard %u: the STEP_DONE of step %llu was due "
				 "%.1f s ago and not sent: sending it now (a missed wakeup; please report)",
				 w->s->part, w->t->name, w->s->index, (unsigned long long)w->clock,
				 (double)waited_ns(w, now) * 1e-9);
			rps__srv_repl_confirm(srv);
			return;
		}
	}
	for (uint32_t i = 0; i < srv->repl.nrwaits; i++) {
		struct repl_wait *w = &srv->repl.rwaits[i];
		if (w->warned || waited_ns(w, now) < REPL_SLOW_NS)
			continue;
		if (w->kind == RW_STEP_DONE) {
			/* waiting for the other ranks is the sync contract; a
			 * step applied here and still not confirmed is not */
			if (w->clock >= w->s->step)
				continue;
			w->warned = true;
			rps__log(RPS__LOG_WARN, "partition %u: tensor '%s' shard %u: a taken push of step %llu waits "
				 "%.1f s for its STEP_DONE: the shard is at step %llu, %u update%s of it wait%s for "
				 "replicas%s", w->s->part, w->t->name, w->s->index, (unsigned long long)w->clock,
				 (double)waited_ns(w, now) * 1e-9, (unsigned long long)w->s->step, w->s->repl_pending,
				 w->s->repl_pending == 1 ? "" : "s", w->s->repl_pending == 1 ? "s" : "",
				 rps__srv_lease_fenced(srv, w->s->part) ? ", and the partition's lease ran out" : "");
			return;
		}
		w->warned = true;
		for (uint32_t k = 0; k < w->nrep; k++) {
			const struct srv_conn *rc = w->rep[k].rc;
			if (!w->rep[k].id || !still_replica(srv, w->s->part, w->rep[k].id) ||
			    (rc && rc->repl.cseq_acked >= w->rep[k].cseq))
				continue;
			if (rc)
				rps__log(RPS__LOG_WARN, "partition %u: tensor '%s' shard %u: an update waits %.1f s for "
					 "member %llu to confirm replication entry %llu (it confirmed %llu)",
					 w->s->part, w->t->name, w->s->index, (double)waited_ns(w, now) * 1e-9,
					 (unsigned long long)w->rep[k].id, (unsigned long long)w->rep[k].cseq,
					 (unsigned long long)rc->repl.cseq_acked);
			else
				rps__log(RPS__LOG_WARN, "partition %u: tensor '%s' shard %u: an update waits %.1f s for "
					 "member %llu, whose replication stream broke before it confirmed it",
					 w->s->part, w->t->name, w->s->index, (double)waited_ns(w, now) * 1e-9,
					 (unsigned long long)w->rep[k].id);
			return;
		}
	}
}

void rps__srv_repl_turn(struct rps__server *srv)
{
	uint64_t now = rps__now_ns();
	uint32_t i;

	/* the higher member id dials, whichever way the stream runs (dial()) */
	for (i = 0; i < srv->repl.npeers; i++) {
		struct repl_peer *p = &srv->repl.peers[i];
		if (!p->uri[0] || p->id > srv->my_id)
			continue;
		if (p->wanted && !p->conn && streams_from_us(srv, p->id))
			dial_when_due(srv, p, false, now);
		if (!p->in && streams_to_us(srv, p->id))
			dial_when_due(srv, p, true, now);
	}
	for (i = 0; i < srv->nconns; i++) {
		struct srv_conn *c = srv->conns[i];
		if (c->role == CONN_REPL && !c->repl.out && !c->dead && !c->repl.refused)
			rps__srv_repl_backup_turn(srv, c);
	}
	if (srv->repl.orphans_owed)
		orphans_turn(srv);
	step_done_flush(srv);
	if (srv->repl.nrwaits)
		warn_slow(srv, now);
}

void rps__srv_repl_fini(struct rps__server *srv)
{
	free(srv->repl.rwaits);
	srv->repl.rwaits = NULL;
	srv->repl.nrwaits = srv->repl.rwaits_cap = 0;
}
