/*
 * requests.c - a worker's control messages (HELLO, CREATE, WAIT, BARRIER)
 * and what a departing rank means for the waits of sync tensors; messages
 * of peers and psctl go up to the control plane's hook.
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "proto/proto.h"
#include "proto/shard.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdmaps.h"

#define conn_fail rps__srv_conn_fail
#define conn_reply rps__srv_conn_reply

/* ---- control messages ---------------------------------------------------- */

#define spec_equal rps__srv_spec_equal

bool rps__srv_spec_equal(const struct rps__tensor_spec *a, const struct rps__tensor_spec *b)
{
	return a->count == b->count && a->dtype == b->dtype && a->mode == b->mode &&
	       a->staleness == b->staleness && a->optimizer == b->optimizer &&
	       a->lr == b->lr && a->momentum == b->momentum && a->beta1 == b->beta1 &&
	       a->beta2 == b->beta2 && a->eps == b->eps && a->weight_decay == b->weight_decay &&
	       a->rescale == b->rescale && a->num_workers == b->num_workers &&
	       (a->flags & RPS__CREATE_HAS_INIT) == (b->flags & RPS__CREATE_HAS_INIT);
}

/* Sync: has rank contributed to step clock of shard s (summed, or parked
 * out of turn)?  Only steps from s->step on are asked about. */
static bool sync_has(const struct rps__server *srv, const struct srv_tensor *t, const struct shard *s,
		     uint32_t local, int rank, uint64_t clock)
{
	return (clock == s->step && rank < s->next_rank) || rps__srv_parked_has(srv, t, local, rank, clock);
}

/*
 * Where a new process of the connection's rank resumes (rps__create_rep):
 * per shard served here the first clock the rank has not contributed, then
 * the lowest and highest of them.  A rank that never pushed gets 0, 0: a
 * new job is unchanged.  Parked contributions count, held ones do not (they
 * went with the predecessor's connection and are resent).
 */
static void resume_clocks(const struct rps__server *srv, const struct srv_conn *c, const struct srv_tensor *t,
			  uint64_t *lo, uint64_t *hi)
{
	uint32_t p, j;
	bool any = false;

	*lo = *hi = 0;
	if (t->spec.mode == RPS_MODE_ASYNC || c->rank < 0 || c->rank >= t->spec.num_workers)
		return;
	for (p = 0; p < t->layout.nservers; p++) {
		if (!t->regions[p].mr || !rps__srv_part_serving(srv, p))
			continue;
		for (j = 0; j < rps__part_nshards(&t->layout, p); j++) {
			uint32_t local = rps__part_shard(&t->layout, p, j);
			const struct shard *s = &t->shards[local];
			uint64_t next;

			if (!s->hdr)
				continue;
			if (t->spec.mode == RPS_MODE_BOUNDED) {
				next = s->clocks ? s->clocks[c->rank] : 0;
			} else {
				next = s->step;
				while (sync_has(srv, t, s, local, c->rank, next))
					next++;
			}
			*lo = any ? RPS__MIN(*lo, next) : next;
			*hi = any ? RPS__MAX(*hi, next) : next;
			any = true;
		}
	}
}

/* The reply names the regions of partitions served here, a page at a time
 * (the worker asks again with CREATE.first for the rest), each through a
 * window of this connection's own: read and atomics for a worker, read
 * alone for a reader.  A page stops short where the send queue has no
 * room left to bind (an empty one: the worker asks again shortly). */
static void create_reply(struct rps__server *srv, struct srv_conn *c, uint64_t req_id, struct srv_tensor *t,
			 bool created, uint32_t first)
{
	int access = RPS__ACCESS_REMOTE_READ | (c->auth.key_role == RPS__KEY_READER ? 0 : RPS__ACCESS_REMOTE_ATOMIC);
	struct rps__create_rep rep;
	bool cut = false;
	uint32_t p, k = 0, rkey;
	int ret;

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
		if (k >= first && rep.nregions < RPS__CREATE_MAX_REGIONS && !cut) {
			struct rps__region_ref *ref = &rep.regions[rep.nregions];

			ret = rps__srv_conn_window(c, r->mr, access, &rkey);
			if (ret == -EAGAIN) {
				cut = true;
			} else if (ret) {
				rps__log(RPS__LOG_WARN, "tensor '%s' for %s: %s", t->name, rps__ep_peer(c->ep),
					 rps__errbuf());
				conn_reply(c, RPS__MSG_CREATE_REP, req_id, ret, NULL, 0);
				return;
			} else {
				ref->addr = (uint64_t)(uintptr_t)r->mem;
				ref->rkey = rkey;
				ref->part = (uint16_t)p;
				ref->epoch = srv->parts[p].epoch;
				rep.nregions++;
			}
		}
		k++;
	}
	rep.total = k;
	resume_clocks(srv, c, t, &rep.resume_clock, &rep.resume_until);
	conn_reply(c, RPS__MSG_CREATE_REP, req_id, 0, &rep, sizeof(rep));
}

/* A connection of a rank opened a sync tensor (see struct srv_tensor.ranks). */
static void rank_opened(struct srv_tensor *t, const struct srv_conn *c)
{
	if (t->spec.mode != RPS_MODE_SYNC || c->rank < 0 || c->rank >= t->spec.num_workers)
		return;
	if (!t->ranks && !(t->ranks = calloc((size_t)t->spec.num_workers, 1)))
		return;		/* then a missing rank shows as a timeout, as before */
	if (t->ranks[c->rank] != RANK_REMOVED)
		t->ranks[c->rank] = RANK_LIVE;
}

static void on_create(struct rps__server *srv, struct srv_conn *c, uint64_t req_id,
		      const struct rps__create *req)
{
	struct srv_tensor *t;
	bool created = false;
	uint32_t p;
	int ret;

	/* what librdmaps refuses cannot come from it: say so, escaped */
	ret = rps__name_check(req->name);
	if (ret)
		goto err;
	if (!rps__srv_scope_allows(c, req->name) ||
	    (c->auth.key_role == RPS__KEY_READER && !(req->flags & RPS__CREATE_OPEN_ONLY))) {
		/* nothing about the tensor is told, not even whether it exists */
		char why[200];
		snprintf(why, sizeof(why), "a %s of '%s' may not %s '%s'", rps__key_role_name(c->auth.key_role),
			 c->auth.scope, req->flags & RPS__CREATE_OPEN_ONLY ? "open" : "create", req->name);
		rps__srv_log_refusal(srv, c, why);
		conn_reply(c, RPS__MSG_CREATE_REP, req_id, c->auth.key_role == RPS__KEY_READER &&
			   rps__srv_scope_allows(c, req->name) ? -EPERM : -EACCES, NULL, 0);
		return;
	}
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
			if (srv->parts[p].lost && rps__part_nshards(&l, p)) {
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
		/* unknown here, and partitions here lost: it may well have
		 * had shards in them (a restart took the catalog with the
		 * memory); say lost, not "never created" */
		for (p = 0; p < srv->npart; p++)
			if (srv->parts[p].owned_lost) {
				rps__log(RPS__LOG_WARN, "open of '%s' from %s refused: not known here, and partition %u is"
					 " lost", req->name, rps__ep_peer(c->ep), p);
				conn_reply(c, RPS__MSG_CREATE_REP, req_id, -ENODATA, NULL, 0);
				return;
			}
		conn_reply(c, RPS__MSG_CREATE_REP, req_id, -ENOENT, NULL, 0);
		return;
	}
	ret = rps__srv_tensor_add(srv, req->name, &req->spec, &t);
	if (ret)
		goto err;
	for (p = 0; p < t->layout.nservers; p++) {
		/* and partitions on their way here: they come without this
		 * tensor; and those we back up: the stream fills them */
		if (!rps__srv_part_serving(srv, p) && !srv->parts[p].incoming && !srv->parts[p].backup)
			continue;
		ret = rps__srv_region_alloc(srv, t, p, req->spec.flags & RPS__CREATE_HAS_INIT,
					    rps__srv_part_serving(srv, p) || srv->parts[p].incoming ? c : NULL);
		if (!ret)
			ret = rps__srv_region_register(srv, t, p);
		if (ret) {
			srv->tensors[--srv->ntensors] = NULL;
			rps__srv_tensor_free(srv, t);
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

/* Was this client (a process) replaced by a takeover here? */
static bool client_fenced(const struct rps__server *srv, uint64_t client_id)
{
	uint32_t n = RPS__MIN(srv->req.nfenced, (uint32_t)RPS__ARRAY_SIZE(srv->req.fenced));

	for (uint32_t i = 0; i < n; i++)
		if (srv->req.fenced[i] == client_id)
			return true;
	return false;
}

/* A replacement process of c's rank: its predecessor may have died without
 * a reset (a whole host), so close the rank's other worker connections now
 * rather than at their idle timeout, and refuse the predecessor should it
 * dial again (a process that was only stopped, or cut off, and comes back
 * would push as that rank beside its replacement).  Their held pushes go
 * with them (the replacement resends); what was summed or parked stays
 * counted.  A rank is a rank of one job: only connections of the same key
 * scope and role are taken over, never by a reader (on_hello), and never
 * the replacement's own. */
static void take_over_rank(struct rps__server *srv, struct srv_conn *c)
{
	uint32_t i;

	for (i = 0; i < srv->nconns; i++) {
		struct srv_conn *o = srv->conns[i];
		if (o != c && o->role == CONN_WORKER && o->hello_done && !o->dead && o->rank == c->rank &&
		    o->auth.key_role == c->auth.key_role && rps__srv_same_scope(o, c) && o->client_id != c->client_id) {
			conn_fail(o, "taken over by a new process of its rank");
			if (!client_fenced(srv, o->client_id))
				srv->req.fenced[srv->req.nfenced++ % RPS__ARRAY_SIZE(srv->req.fenced)] = o->client_id;
		}
	}
}

static void on_hello(struct rps__server *srv, struct srv_conn *c, uint64_t req_id, const struct rps__hello *h)
{
	struct rps__hello_rep rep;
	uint32_t map_rkey = 0, slot_rkey = 0;
	int ret = 0;

	if (h->version != RPS__PROTO_VERSION) {
		conn_reply(c, RPS__MSG_HELLO_REP, req_id, -EPROTO, NULL, 0);
		return;
	}
	/* the map to READ and, but for a reader, the staging slots to WRITE:
	 * through windows of this connection alone */
	if (srv->mapbuf_mr)
		ret = rps__srv_conn_window(c, srv->mapbuf_mr, RPS__ACCESS_REMOTE_READ, &map_rkey);
	if (!ret && c->bufs.slots_mr && c->auth.key_role != RPS__KEY_READER)
		ret = rps__srv_conn_window(c, c->bufs.slots_mr, RPS__ACCESS_REMOTE_WRITE, &slot_rkey);
	if (ret) {
		rps__log(RPS__LOG_WARN, "HELLO of %s: %s", rps__ep_peer(c->ep), rps__errbuf());
		conn_reply(c, RPS__MSG_HELLO_REP, req_id, ret, NULL, 0);
		return;
	}
	c->rank = h->rank;
	c->client_id = h->client_id;
	c->num_workers = h->num_workers;
	if (h->rank >= 0 && client_fenced(srv, h->client_id)) {
		char why[120];
		snprintf(why, sizeof(why), "rank %d: this process was taken over by a newer one of its rank: refused",
			 h->rank);
		rps__srv_log_refusal(srv, c, why);
		conn_reply(c, RPS__MSG_HELLO_REP, req_id, -ESTALE, NULL, 0);
		return;
	}
	c->hello_done = true;
	if ((h->flags & RPS__HELLO_TAKEOVER) && h->rank >= 0 && c->auth.key_role != RPS__KEY_READER)
		take_over_rank(srv, c);
	memset(&rep, 0, sizeof(rep));
	rep.magic = RPS__HELLO_MAGIC;
	rep.version = RPS__PROTO_VERSION;
	rep.nthreads = srv->thr.nthreads;
	rep.member_id = srv->my_id;
	rep.map_addr = (uint64_t)(uintptr_t)srv->mapbuf;
	rep.map_rkey = map_rkey;	/* (0: no map, no layer above) */
	rep.map_len = srv->thr.index ? RPS__PROBE_AREA : RPS__MAP_BUF;	/* (threads.c) */
	rep.thread_index = srv->thr.index;
	rep.shard_elems = srv->shard_elems;
	rep.nslots = srv->cfg.nslots;
	rep.slot_size = (uint32_t)srv->slot_size;
	rep.slot_addr = (uint64_t)(uintptr_t)c->bufs.slots;
	rep.slot_rkey = slot_rkey;	/* (0: a reader pushes nothing) */
	rep.owner = c->owner;
	rep.lease_ms = srv->cfg.lease_ms;
	rep.failover_ms = srv->cfg.failover_ms ? srv->cfg.failover_ms : 1000;
	rep.incarnation = srv->incarnation;
	conn_reply(c, RPS__MSG_HELLO_REP, req_id, 0, &rep, sizeof(rep));
}

/* Sync: the lowest rank whose connections all closed while the shard's
 * current step still lacks its push (neither added nor parked here), or -1.
 * The step cannot complete until a new process of that rank opens the
 * tensor (it resumes at the step, see resume_clocks). */
int rps__srv_missing_rank(struct rps__server *srv, struct srv_tensor *t, uint32_t local)
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
		for (i = 0; i < srv->push.nparked && !parked; i++)
			parked = srv->push.parked[i].t == t && srv->push.parked[i].local == local &&
				 srv->push.parked[i].rank == r && srv->push.parked[i].clock == s->step;
		if (!parked)
			return r;
	}
	return -1;
}

/* Tell a waiter that its version will never come, and which rank it waits for. */
static void wait_fail_missing(struct srv_conn *c, uint64_t req_id, struct shard *s, int rank)
{
	struct rps__wait_rep rep = { .version = s->step, .min_clock = s->hdr->min_clock, .missing_rank = rank };

	conn_reply(c, RPS__MSG_WAIT_REP, req_id, -EPIPE, &rep, sizeof(rep));
}

/* A live connection of `rank` that may reach t (of t's job) is left. */
static bool rank_reaches(const struct rps__server *srv, int rank, const struct srv_tensor *t)
{
	uint32_t i;

	for (i = 0; i < srv->nconns; i++) {
		const struct srv_conn *o = srv->conns[i];
		if (o->role == CONN_WORKER && o->hello_done && !o->dead && o->rank == rank &&
		    rps__srv_scope_allows(o, t->name))
			return true;
	}
	return false;
}

/* The rank of departure d is gone: note it from the sync tensors it opened
 * here that no connection of the rank may reach now (another job's rank of
 * the same number does not keep it), and fail the waits that only it could
 * satisfy (with backups, the TAKEN pushes waiting for the step too). */
static void rank_gone(struct rps__server *srv, const struct srv_departure *d)
{
	uint32_t i;

	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
		uint32_t local;
		if (!t || !t->ranks || d->rank >= t->spec.num_workers || t->ranks[d->rank] != RANK_LIVE ||
		    !rps__srv_scope_str_allows(srv, d->scope, sizeof(d->scope), t->name) || rank_reaches(srv, d->rank, t))
			continue;
		t->ranks[d->rank] = RANK_GONE;
		for (local = 0; local < t->layout.nshards; local++) {
			int r = rps__srv_missing_rank(srv, t, local);
			if (r >= 0)
				rps__srv_repl_step_orphaned(srv, &t->shards[local], r);
		}
	}
	i = 0;
	while (i < srv->req.nwaiters) {
		struct waiter *w = &srv->req.waiters[i];
		struct srv_tensor *t = rps__srv_tensor_by_id(srv, w->tensor_id);
		int r = t ? rps__srv_missing_rank(srv, t, w->local) : -1;
		if (r >= 0 && w->min_version > t->shards[w->local].step) {
			rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: rank %d left before its push for step %llu: "
				 "failing the waits for it", t->name, w->local, r,
				 (unsigned long long)t->shards[w->local].step);
			wait_fail_missing(w->conn, w->req_id, &t->shards[w->local], r);
			*w = srv->req.waiters[--srv->req.nwaiters];
			continue;
		}
		i++;
	}
}

/*
 * A worker's connection closed.  Its rank is gone only if none of its
 * connections is back within the grace (--failover-ms, what this server
 * allows a silent peer too): a worker's connection may go while the
 * process lives on (on RDMA a remote access error takes the whole
 * connection down, a stale key after a move among the causes; a network
 * blip), and it dials again at once.  Declaring its rank gone at the
 * close would end every other rank's step with "rank R left" though R is
 * about to push.  A process that died has no successor by then (or a
 * replacement that took its rank over: then nothing is missing).
 */
void rps__srv_rank_left(struct rps__server *srv, struct srv_conn *c)
{
	uint64_t grace = (uint64_t)(srv->cfg.failover_ms ? srv->cfg.failover_ms : 1000) * 1000000ull;
	struct srv_departure *d = NULL;
	uint32_t i;

	if (c->role != CONN_WORKER || !c->hello_done || c->rank < 0)
		return;
	for (i = 0; i < srv->req.ndepartures && !d; i++)	/* (gone again: the grace starts again) */
		if (srv->req.departures[i].rank == c->rank &&
		    !strncmp(srv->req.departures[i].scope, c->auth.scope, sizeof(d->scope)))
			d = &srv->req.departures[i];
	if (!d) {
		if (rps__grow(&srv->req.departures, &srv->req.departures_cap, srv->req.ndepartures + 1,
			      sizeof(*srv->req.departures), 16)) {
			struct srv_departure now = { .rank = c->rank };	/* (no memory: gone at once) */
			memcpy(now.scope, c->auth.scope, sizeof(now.scope));
			c->dead = true;
			rank_gone(srv, &now);
			return;
		}
		d = &srv->req.departures[srv->req.ndepartures++];
		d->rank = c->rank;
		memcpy(d->scope, c->auth.scope, sizeof(d->scope));
	}
	d->due = rps__now_ns() + grace;
}

void rps__srv_departures_run(struct rps__server *srv, uint64_t now, bool all)
{
	uint32_t i = 0;

	while (i < srv->req.ndepartures) {
		struct srv_departure d = srv->req.departures[i];
		if (!all && now < d.due) {
			i++;
			continue;
		}
		srv->req.departures[i] = srv->req.departures[--srv->req.ndepartures];
		rank_gone(srv, &d);
	}
}

/* A pull waiting this long says, once, for what and for whom: a worker's
 * own timeout names only its shard, and on a job stuck for good the
 * servers' log is where an operator looks (the soak's CI failure of
 * c568533 would have named the rank). */
#define WAIT_SLOW_NS (10000ull * 1000000ull)

static void waiter_warn(struct rps__server *srv, const struct waiter *w, uint64_t now)
{
	struct srv_tensor *t = rps__srv_tensor_by_id(srv, w->tensor_id);
	const struct shard *s = t ? &t->shards[w->local] : NULL;
	double waited = (double)(now - w->since) * 1e-9;
	int r, slow = -1;

	if (!s || !s->hdr)
		return;
	if (w->min_clock && s->clocks && s->hdr->min_clock < w->min_clock) {
		for (r = 0; r < t->spec.num_workers; r++)
			if (!rps__srv_rank_removed(t, r) && (slow < 0 || s->clocks[r] < s->clocks[slow]))
				slow = r;
		rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: a pull from %s has waited %.1f s for every rank's "
			 "clock to reach %llu: rank %d is at %llu (stopped pushing, or waiting for that worker on "
			 "another tensor: rdmaps(3), \"Replacing a worker\")", t->name, w->local,
			 rps__ep_peer(w->conn->ep), waited, (unsigned long long)w->min_clock, slow,
			 (unsigned long long)(slow >= 0 ? s->clocks[slow] : 0));
	} else if (w->min_version > s->step && t->spec.mode == RPS_MODE_SYNC) {
		rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: a pull from %s has waited %.1f s for step %llu: the "
			 "shard is at step %llu, waiting for rank %d's push (the ranks before it are in)", t->name,
			 w->local, rps__ep_peer(w->conn->ep), waited, (unsigned long long)(w->min_version - 1),
			 (unsigned long long)s->step, s->next_rank);
	} else {
		rps__log(RPS__LOG_WARN, "tensor '%s' shard %u: a pull from %s has waited %.1f s for version %llu: "
			 "the shard is at %llu%s", t->name, w->local, rps__ep_peer(w->conn->ep), waited,
			 (unsigned long long)w->min_version, (unsigned long long)s->step,
			 s->ready ? "" : ", not initialised yet");
	}
}

void rps__srv_waiters_check(struct rps__server *srv, uint64_t now)
{
	uint64_t slow_ns = WAIT_SLOW_NS;
	long ms;

	/* (a test warns sooner: RPS_FAULT=wait-slow-ms-N) */
	if (RPS__UNLIKELY(rps__fault_arg("wait-slow-ms-", &ms)) && ms >= 0)
		slow_ns = (uint64_t)ms * 1000000ull;
	for (uint32_t i = 0; i < srv->req.nwaiters; i++) {
		struct waiter *w = &srv->req.waiters[i];
		if (w->warned || now < w->since || now - w->since < slow_ns)
			continue;
		w->warned = true;
		waiter_warn(srv, w, now);
		return;		/* (one line a check: a job's pulls stall together) */
	}
}

static void on_wait(struct rps__server *srv, struct srv_conn *c, uint64_t req_id, const struct rps__wait *w)
{
	struct srv_tensor *t = rps__srv_tensor_by_id(srv, w->tensor_id);
	uint32_t local;

	/* out of scope: refused as CREATE refuses it, and an id unknown here
	 * the same way to a scoped key (telling them apart would tell which
	 * ids exist) */
	if ((t && !rps__srv_scope_allows(c, t->name)) || (!t && c->auth.scope[0])) {
		char why[120];
		snprintf(why, sizeof(why), "a %s of '%s' may not wait on tensor id %u",
			 rps__key_role_name(c->auth.key_role), c->auth.scope, w->tensor_id);
		rps__srv_log_refusal(srv, c, why);
		conn_reply(c, RPS__MSG_WAIT_REP, req_id, -EACCES, NULL, 0);
		return;
	}
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
		int r = rps__srv_missing_rank(srv, t, local);
		if (r >= 0) {
			wait_fail_missing(c, req_id, &t->shards[local], r);
			return;
		}
	}
	if (rps__grow(&srv->req.waiters, &srv->req.waiters_cap, srv->req.nwaiters + 1, sizeof(*srv->req.waiters), 64)) {
		conn_reply(c, RPS__MSG_WAIT_REP, req_id, -ENOMEM, NULL, 0);
		return;
	}
	srv->req.waiters[srv->req.nwaiters++] = (struct waiter){
		.conn = c, .req_id = req_id, .tensor_id = t->id, .local = local,
		.min_version = w->min_version, .min_clock = w->min_clock, .since = rps__now_ns(),
	};
	rps__srv_wake_waiters(srv, t, local);
}

/* Barriers are per key scope: job B's workers neither arrive at job A's
 * barrier nor see it (without a key every scope is "", one barrier). */
static void on_barrier(struct rps__server *srv, struct srv_conn *c, uint64_t req_id)
{
	uint32_t i, n = 0;
	int need = 0;

	if (c->auth.key_role == RPS__KEY_READER) {
		/* a reader is no rank of the job: it must not release one */
		rps__srv_log_refusal(srv, c, "a reader may not arrive at a barrier");
		conn_reply(c, RPS__MSG_BARRIER_REP, req_id, -EPERM, NULL, 0);
		return;
	}
	if (c->num_workers < 1) {
		conn_reply(c, RPS__MSG_BARRIER_REP, req_id, -EINVAL, NULL, 0);
		return;
	}
	for (i = 0; i < srv->req.narrivals; i++)
		if (rps__srv_same_scope(srv->req.arrivals[i].conn, c)) {
			need = srv->req.arrivals[i].need;
			n++;
		}
	/* The first arrival fixes the barrier's size: a worker that counts
	 * differently must not release (or hold back) the others. */
	if (n && c->num_workers != need) {
		rps__log(RPS__LOG_WARN, "worker %s (rank %d): barrier with num_workers %d, but the %u waiting say %d: refused",
			 rps__ep_peer(c->ep), c->rank, c->num_workers, n, need);
		conn_reply(c, RPS__MSG_BARRIER_REP, req_id, -EINVAL, NULL, 0);
		return;
	}
	if (rps__grow(&srv->req.arrivals, &srv->req.arrivals_cap, srv->req.narrivals + 1, sizeof(*srv->req.arrivals),
		      16)) {
		conn_reply(c, RPS__MSG_BARRIER_REP, req_id, -ENOMEM, NULL, 0);
		return;
	}
	srv->req.arrivals[srv->req.narrivals++] =
		(struct srv_arrival){ .conn = c, .req_id = req_id, .need = c->num_workers };
	if ((int)n + 1 < c->num_workers)
		return;
	for (i = 0; i < srv->req.narrivals;) {
		struct srv_arrival *a = &srv->req.arrivals[i];
		if (rps__srv_same_scope(a->conn, c)) {
			conn_reply(a->conn, RPS__MSG_BARRIER_REP, a->req_id, 0, NULL, 0);
			*a = srv->req.arrivals[--srv->req.narrivals];
		} else {
			i++;
		}
	}
}

void rps__srv_on_message(struct rps__server *srv, struct srv_conn *c, void *buf, uint32_t len)
{
	struct rps__msg_hdr h;
	void *body = rps__msg_body(buf);
	int ret;

	ret = rps__msg_check(buf, len);
	if (ret) {
		/* A peer that sends garbage is not trusted with more: drop it. */
		rps__log(RPS__LOG_WARN, "%s %s: %s", rps__srv_role_name(c), rps__ep_peer(c->ep), rps__errbuf());
		conn_fail(c, "sent a malformed message");
		return;
	}
	memcpy(&h, buf, sizeof(h));
	if (!c->auth.authed) {
		rps__srv_auth_on_message(srv, c, &h, body);
		return;
	}
	if (h.type == RPS__MSG_AUTH || h.type == RPS__MSG_AUTH_REP || h.type == RPS__MSG_AUTH_DONE) {
		conn_fail(c, "sent AUTH twice");
		return;
	}
	if (c->role == CONN_REPL) {
		rps__srv_repl_on_message(srv, c, &h, body);
		return;
	}
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

/* ---- removing a rank (psctl remove-rank) ------------------------------------------ */

/* Take rank out of t; -EINVAL (message set) if it cannot be. */
static int remove_from(struct rps__server *srv, struct srv_tensor *t, int rank)
{
	uint32_t local;
	int r, left = 0;

	if (rank >= t->spec.num_workers)
		return rps__seterr(-EINVAL, "tensor '%s' has ranks 0..%d, not %d", t->name, t->spec.num_workers - 1,
				   rank);
	if (!t->ranks && !(t->ranks = calloc((size_t)t->spec.num_workers, 1)))
		return rps__seterr(-ENOMEM, "out of memory");
	for (r = 0; r < t->spec.num_workers; r++)
		left += r != rank && t->ranks[r] != RANK_REMOVED;
	if (!left)
		return rps__seterr(-EINVAL, "tensor '%s': rank %d is the last one left", t->name, rank);
	t->ranks[rank] = RANK_REMOVED;
	for (local = 0; local < t->layout.nshards; local++) {
		struct shard *s = &t->shards[local];
		if (!s->hdr || !s->ready)
			continue;
		if (t->spec.mode == RPS_MODE_SYNC) {
			rps__srv_sync_advance(srv, t, local, false);
		} else {
			rps__srv_update_min_clock(t, s);
			rps__srv_wake_waiters(srv, t, local);
		}
	}
	rps__log(RPS__LOG_INFO, "tensor '%s': rank %d removed, %d ranks go on", t->name, rank, left);
	return 1;
}

/*
 * psctl remove-rank: a dead worker's rank leaves a sync or bounded tensor
 * (name "", every one) for good.  Sync: each shard skips the rank's turn
 * from the first step it has not contributed to (what it already gave,
 * summed or parked, counts), so the step completes with the others'
 * contributions times the tensor's rescale, unchanged; bounded: the slowest
 * clock is taken over the others.  Its later pushes are refused (-EPERM).
 * Returns the tensors it was removed from now (0: it was already), or
 * -ENOENT for a named tensor not known here.
 */
int rps__srv_rank_remove(struct rps__server *srv, const char *name, int rank)
{
	uint32_t i;
	int n = 0, ret;
	bool found = false;

	if (rank < 0)
		return rps__seterr(-EINVAL, "rank %d: ranks are 0 or more", rank);
	for (i = 0; i < srv->ntensors; i++) {
		struct srv_tensor *t = srv->tensors[i];
		if (!t || (name[0] && strcmp(t->name, name)))
			continue;
		found = true;
		if (t->spec.mode == RPS_MODE_ASYNC) {
			if (name[0])
				return rps__seterr(-EINVAL, "tensor '%s' is async: it has no ranks to remove", name);
			continue;
		}
		if (rps__srv_rank_removed(t, rank))
			continue;
		if (!name[0] && rank >= t->spec.num_workers)
			continue;
		ret = remove_from(srv, t, rank);
		if (ret < 0)
			return ret;
		n++;
	}
	if (name[0] && !found)	/* (psctl asks every member: one may not know it) */
		return rps__seterr(-ENOENT, "no tensor '%s' here", name);
	rps__srv_drain_held(srv);	/* parked pushes of the next steps may go now */
	return n;
}

