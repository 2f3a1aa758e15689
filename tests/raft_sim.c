/*
 * raft_sim.c - deterministic simulator and safety checkers for the Raft core
 * (see raft_sim.h for what it models and what it checks).
 *
 * Time: the random scenarios advance in units; every SIM_TICK_UNITS units
 * each running node gets one tick, and a message takes one or more units, so
 * several round trips fit in a tick as on a real network with heartbeats of
 * tens of milliseconds.  All randomness comes from one seeded generator and
 * every loop visits nodes and packets in a fixed order: a seed replays
 * exactly.
 *
 * Two state machines sit side by side on every node: the toy map of
 * raft_sim.h and the product's shard map (proto/smap.h), each with its
 * own entry kind ('W' and 'M'); a snapshot holds both.
 */
#include "config.h"
#include "raft_sim.h"
#include "common/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_TICK_UNITS 4u
/* Random runs: every HOSTILE_EVERY-th delivery is preceded by forged twins
 * no peer may send (see inject_hostile); a prime, to vary the message type. */
#define HOSTILE_EVERY 61u
#define STRANGER (SIM_CAP_IDS + 1)	/* never a member */
#define NODE_OK(s, id) ((id) >= 1 && (id) <= (s)->n_ids && (s)->nodes[id].r)
/* The linearisability register of the shard map, after the toy's shards. */
#define SIM_MAP_REG SIM_SHARDS

struct sim_store {
	struct rps__raft_hard_state hs;
	bool has_snap;
	struct rps__raft_snapshot snap;		/* data owned */
	struct rps__raft_entry *ents;		/* data owned */
	size_t n;
	size_t cap;
};

struct shard_val {
	uint64_t owner;
	uint64_t epoch;
	uint64_t wid;				/* write id, 0: initial value */
};

struct sim_node {
	uint64_t id;
	bool exists;			/* started once and not destroyed */
	bool bootstrap;			/* initial member: an empty disk bootstraps again */
	struct rps__raft *r;		/* NULL while down */
	unsigned incarnation;
	struct sim_store st;
	uint64_t applied;
	struct shard_val sm[SIM_SHARDS];
	uint64_t checked_commit;
	uint64_t down_until;		/* random runs: restart then */
	uint64_t paused_until;		/* random runs: no ticks, messages wait */
	uint64_t destroy_at;		/* random runs: removed from the cluster */
	uint64_t leader_since;		/* when it last became leader */
	uint64_t isolated_until;	/* churn phase: cut off until then */
	struct rps__smap map;		/* the product's shard map */
	uint64_t map_wid;		/* the map write it is as of, 0: the initial map */
	uint64_t map_hash;		/* of its encoding */
	uint64_t map_epoch[SIM_MAP_PARTS];	/* highest epoch seen in this life */
	unsigned map_applies;		/* for SIM_FAULT_SKIP_APPLY */
};

struct packet {
	uint64_t at;
	uint64_t from;
	uint64_t to;
	uint8_t *buf;
	size_t len;
};

struct com_rec {
	uint64_t term;
	uint64_t hash;
	uint64_t seen_in;		/* a term by which it was committed (>= the real one) */
};

struct ent_rec {
	uint64_t index;			/* 0: free slot */
	uint64_t term;
	uint64_t hash;
	uint64_t prev_term;
};

enum op_state { OP_PENDING, OP_DONE, OP_FAILED };

struct write_op {
	uint32_t shard;
	uint64_t node;
	unsigned incarnation;
	uint64_t index;
	uint64_t term;
	uint64_t inv;
	uint64_t resp;
	uint64_t log_index;		/* where it was applied, 0: never */
	enum op_state state;
};

struct read_op {
	uint32_t shard;
	uint64_t node;
	unsigned incarnation;
	uint64_t ctx;
	uint64_t inv;
	uint64_t resp;
	bool have_index;
	uint64_t wait_index;
	uint64_t value;			/* 1 + write id seen */
	uint64_t map_hash;		/* map reads: the map it returned */
	enum op_state state;
};

/* The shard map any node held after applying an index. */
struct map_rec {
	uint64_t hash;			/* 0: nobody yet */
	uint64_t wid;
	uint64_t node;
};

struct sim {
	struct sim_config cfg;
	uint64_t rng;
	bool random_mode;
	unsigned trace;			/* 1: events, 2: and every message */
	uint64_t now;
	uint64_t seq;			/* history clock: one step per event */
	unsigned n_ids;			/* ids 1..n_ids exist (arrays: SIM_CAP_IDS) */
	struct sim_node nodes[SIM_CAP_IDS + 1];
	uint64_t initial[SIM_CAP_IDS];
	unsigned n_initial;

	struct packet *net;
	size_t n_net;
	size_t cap_net;
	bool cut[SIM_CAP_IDS + 1][SIM_CAP_IDS + 1];
	unsigned loss_pm;		/* per million */
	unsigned dup_pm;
	unsigned crash_pm;		/* per persistence step */
	unsigned min_delay;
	unsigned max_delay;
	bool (*drop)(void *arg, const struct rps__raft_msg *m);
	void *drop_arg;
	void (*seen)(void *arg, const struct rps__raft_msg *m);
	void *seen_arg;

	uint64_t *leader_of;
	size_t cap_leader_of;
	struct com_rec *com;
	size_t cap_com;
	uint64_t max_com;
	struct ent_rec *emap;
	size_t emap_cap;
	size_t emap_n;

	struct write_op *writes;
	size_t n_writes;
	size_t cap_writes;
	struct read_op *reads;
	size_t n_reads;
	size_t cap_reads;
	uint64_t next_ctx;
	uint64_t deliveries;

	struct rps__raft_conf_state conf_view;	/* latest applied configuration */
	uint64_t conf_view_index;
	unsigned compact_every;

	enum sim_map_fault fault;
	struct rps__smap map0;			/* the bootstrap shard map */
	uint64_t map0_hash;
	struct map_rec *map_at;			/* by Raft index */
	size_t cap_map_at;
	uint64_t *owner_at[SIM_MAP_PARTS];	/* by epoch, over every node's history; 0: unknown */
	size_t cap_owner_at[SIM_MAP_PARTS];
	uint8_t snap_buf[24 * SIM_SHARDS + 8 + RPS__SMAP_ENC_MAX];	/* snapshots, map hashes */

	struct sim_run_stats stats;
	bool failed;
	char err[1024];
};

/* ------------------------------------------------------------------------ */

static uint64_t rnd(struct sim *s)
{
	uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rnd_below(struct sim *s, uint64_t n)
{
	return n ? rnd(s) % n : 0;
}

static bool chance(struct sim *s, unsigned per_million)
{
	return per_million && rnd_below(s, 1000000) < per_million;
}

static void sim_fail(struct sim *s, const char *fmt, ...) RPS__PRINTF(2, 3);

static void sim_fail(struct sim *s, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (s->failed)
		return;
	s->failed = true;
	n = snprintf(s->err, sizeof(s->err), "t=%llu: ", (unsigned long long)s->now);
	va_start(ap, fmt);
	vsnprintf(s->err + n, sizeof(s->err) - (size_t)n, fmt, ap);
	va_end(ap);
	if (s->trace)
		fprintf(stderr, "FAIL %s\n", s->err);
}

static void trace(struct sim *s, const char *fmt, ...) RPS__PRINTF(2, 3);

static void trace(struct sim *s, const char *fmt, ...)
{
	va_list ap;

	if (!s->trace)
		return;
	fprintf(stderr, "[%6llu] ", (unsigned long long)s->now);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void *grow(void *p, size_t *cap, size_t need, size_t size)
{
	size_t c = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return p;
	while (c < need)
		c *= 2;
	q = realloc(p, c * size);
	if (!q) {
		fprintf(stderr, "raft_sim: out of memory\n");
		abort();
	}
	memset((char *)q + *cap * size, 0, (c - *cap) * size);
	*cap = c;
	return q;
}

static void *xmemdup(const void *p, size_t n)
{
	void *q;

	if (!n)
		return NULL;
	q = malloc(n);
	if (!q)
		abort();
	memcpy(q, p, n);
	return q;
}

static uint64_t entry_hash(const struct rps__raft_entry *e)
{
	const uint8_t *p = e->data;
	uint64_t h = 1469598103934665603ull ^ e->type;

	h *= 1099511628211ull;
	for (uint32_t i = 0; i < e->len; i++) {
		h ^= p[i];
		h *= 1099511628211ull;
	}
	return h ^ ((uint64_t)e->len << 40);
}

/* ------------------------------------------------------------------------ */
/* the disk */

static uint64_t store_last(const struct sim_store *st)
{
	return st->n ? st->ents[st->n - 1].index : st->has_snap ? st->snap.index : 0;
}

static bool store_term(const struct sim_store *st, uint64_t index, uint64_t *term)
{
	if (st->has_snap && index == st->snap.index) {
		*term = st->snap.term;
		return true;
	}
	if (index == 0) {
		*term = 0;
		return true;
	}
	for (size_t i = 0; i < st->n; i++)
		if (st->ents[i].index == index) {
			*term = st->ents[i].term;
			return true;
		}
	return false;
}

static void store_truncate(struct sim_store *st, uint64_t from)
{
	while (st->n && st->ents[st->n - 1].index >= from) {
		free((void *)st->ents[st->n - 1].data);
		st->n--;
	}
}

static void store_append(struct sim_store *st, const struct rps__raft_entry *e)
{
	st->ents = grow(st->ents, &st->cap, st->n + 1, sizeof(*st->ents));
	st->ents[st->n] = *e;
	st->ents[st->n].data = xmemdup(e->data, e->len);
	st->n++;
}

static void store_set_snap(struct sim_store *st, const struct rps__raft_snapshot *snap)
{
	free((void *)st->snap.data);
	st->snap = *snap;
	st->snap.data = xmemdup(snap->data, snap->len);
	st->has_snap = true;
}

/* Drop entries <= index. */
static void store_compact(struct sim_store *st, uint64_t index)
{
	size_t k = 0;

	while (k < st->n && st->ents[k].index <= index) {
		free((void *)st->ents[k].data);
		k++;
	}
	memmove(st->ents, st->ents + k, (st->n - k) * sizeof(*st->ents));
	st->n -= k;
}

static void store_free(struct sim_store *st)
{
	store_truncate(st, 0);
	free(st->ents);
	free((void *)st->snap.data);
	memset(st, 0, sizeof(*st));
}

/* ------------------------------------------------------------------------ */
/* the state machine: shard -> (owner, epoch, write id) */

#define CMD_LEN 21u	/* 'W', u32 shard, u64 owner, u64 write id */
#define MAP_HDR 9u	/* 'M', u64 write id, then an encoded struct rps__smap_cmd */

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static void sm_encode(const struct sim_node *n, uint8_t *buf)
{
	for (unsigned i = 0; i < SIM_SHARDS; i++) {
		put64(buf + 24 * i, n->sm[i].owner);
		put64(buf + 24 * i + 8, n->sm[i].epoch);
		put64(buf + 24 * i + 16, n->sm[i].wid);
	}
}

static void map_changed(struct sim *s, struct sim_node *n, bool check_epochs);
static void map_record(struct sim *s, struct sim_node *n, uint64_t index);

/* A snapshot: the toy map, the map write id, the encoded shard map. */
#define SNAP_TOY_LEN (24u * SIM_SHARDS)
#define SNAP_HDR (SNAP_TOY_LEN + 8u)

/* Both state machines as of snap (NULL or empty: the initial state).  A
 * node restarting from its disk may restore an older map than it held
 * before its crash; a snapshot installed while up may not (check_epochs). */
static void sm_reset(struct sim *s, struct sim_node *n, const struct rps__raft_snapshot *snap, bool check_epochs)
{
	const uint8_t *p = snap ? snap->data : NULL;

	memset(n->sm, 0, sizeof(n->sm));
	n->applied = snap ? snap->index : 0;
	n->map = s->map0;
	n->map_wid = 0;
	if (snap && snap->len) {
		if (snap->len < SNAP_HDR) {
			sim_fail(s, "node %llu: snapshot of %u bytes is not a shard map", (unsigned long long)n->id,
				 snap->len);
			return;
		}
		for (unsigned i = 0; i < SIM_SHARDS; i++) {
			n->sm[i].owner = get64(p + 24 * i);
			n->sm[i].epoch = get64(p + 24 * i + 8);
			n->sm[i].wid = get64(p + 24 * i + 16);
		}
		n->map_wid = get64(p + SNAP_TOY_LEN);
		if (s->fault != SIM_FAULT_SNAPSHOT_NO_MAP &&
		    rps__smap_decode(p + SNAP_HDR, snap->len - SNAP_HDR, &n->map)) {
			sim_fail(s, "node %llu: snapshot %llu: %s", (unsigned long long)n->id,
				 (unsigned long long)snap->index, rps__errbuf());
			return;
		}
	}
	if (!check_epochs)
		memset(n->map_epoch, 0, sizeof(n->map_epoch));
	map_changed(s, n, check_epochs);
	map_record(s, n, n->applied);
}

/* ------------------------------------------------------------------------ */
/* invariant tables */

static void record_committed(struct sim *s, uint64_t node, uint64_t node_term, uint64_t index, uint64_t term,
			     uint64_t hash)
{
	struct com_rec *c;

	s->com = grow(s->com, &s->cap_com, index + 1, sizeof(*s->com));
	c = &s->com[index];
	if (!c->term) {
		c->term = term;
		c->hash = hash;
		c->seen_in = node_term;
		if (index > s->max_com)
			s->max_com = index;
		return;
	}
	if (c->term != term || c->hash != hash)
		sim_fail(s, "committed entry %llu changed: was term %llu, node %llu has term %llu%s",
			 (unsigned long long)index, (unsigned long long)c->term, (unsigned long long)node,
			 (unsigned long long)term, c->term == term ? " with other contents" : "");
}

static struct ent_rec *emap_slot(struct sim *s, uint64_t index, uint64_t term)
{
	size_t mask = s->emap_cap - 1, i = (size_t)((index * 0x9e3779b97f4a7c15ull) ^ (term * 0xc2b2ae3d27d4eb4full)) & mask;

	while (s->emap[i].index && (s->emap[i].index != index || s->emap[i].term != term))
		i = (i + 1) & mask;
	return &s->emap[i];
}

/* Log matching, over everything any node ever persisted: equal (index, term)
 * means equal contents and an equal predecessor (so, by induction, equal
 * logs up to there). */
static void record_persisted(struct sim *s, uint64_t node, const struct rps__raft_entry *e, uint64_t prev_term)
{
	struct ent_rec *slot;
	uint64_t h = entry_hash(e);

	if (2 * (s->emap_n + 1) > s->emap_cap) {
		struct ent_rec *old = s->emap;
		size_t old_cap = s->emap_cap;

		s->emap_cap = old_cap ? 2 * old_cap : 1024;
		s->emap = calloc(s->emap_cap, sizeof(*s->emap));
		if (!s->emap)
			abort();
		for (size_t i = 0; i < old_cap; i++)
			if (old[i].index)
				*emap_slot(s, old[i].index, old[i].term) = old[i];
		free(old);
	}
	slot = emap_slot(s, e->index, e->term);
	if (!slot->index) {
		slot->index = e->index;
		slot->term = e->term;
		slot->hash = h;
		slot->prev_term = prev_term;
		s->emap_n++;
		return;
	}
	if (slot->hash != h || slot->prev_term != prev_term)
		sim_fail(s, "log matching: node %llu stores entry (%llu, term %llu) with %s than another node",
			 (unsigned long long)node, (unsigned long long)e->index, (unsigned long long)e->term,
			 slot->hash != h ? "other contents" : "another predecessor");
}

static void record_leader(struct sim *s, struct sim_node *n, const struct rps__raft_status *st)
{
	uint64_t *l;

	s->leader_of = grow(s->leader_of, &s->cap_leader_of, st->term + 1, sizeof(*s->leader_of));
	l = &s->leader_of[st->term];
	if (*l == n->id)
		return;
	if (*l) {
		sim_fail(s, "election safety: nodes %llu and %llu are both leaders of term %llu",
			 (unsigned long long)*l, (unsigned long long)n->id, (unsigned long long)st->term);
		return;
	}
	*l = n->id;
	n->leader_since = s->now;
	s->stats.leaders++;
	trace(s, "node %llu leads term %llu (last %llu commit %llu)", (unsigned long long)n->id,
	      (unsigned long long)st->term, (unsigned long long)st->last_index, (unsigned long long)st->commit);
	/* leader completeness: it holds every entry committed in an earlier
	 * term (a leader of an old term can be elected late: its votes may
	 * have waited in a paused node's inbox) */
	for (uint64_t i = st->snapshot_index + 1; i <= s->max_com; i++) {
		const struct rps__raft_entry *e;

		if (!s->com[i].term || s->com[i].seen_in >= st->term)
			continue;
		if (rps__raft_entry_at(n->r, i, &e) || e->term != s->com[i].term ||
		    entry_hash(e) != s->com[i].hash) {
			sim_fail(s, "leader completeness: leader %llu of term %llu lacks committed entry %llu (term %llu)",
				 (unsigned long long)n->id, (unsigned long long)st->term, (unsigned long long)i,
				 (unsigned long long)s->com[i].term);
			return;
		}
	}
}

/* raft.h's membership rules, restated independently of raft.c. */
static void mirror_conf_apply(struct rps__raft_conf_state *cs, enum rps__raft_conf_op op, uint64_t node)
{
	bool voter = rps__raft_conf_is_voter(cs, node), learner = rps__raft_conf_is_learner(cs, node);

	if ((op == RPS__RAFT_CONF_PROMOTE || op == RPS__RAFT_CONF_ADD_VOTER) && cs->n_voters >= RPS__RAFT_MAX_VOTERS)
		return;		/* no room for a voter: changes nothing */
	for (uint32_t i = 0; i < cs->n_learners; i++)
		if (cs->learners[i] == node && (op == RPS__RAFT_CONF_REMOVE || op == RPS__RAFT_CONF_PROMOTE ||
						op == RPS__RAFT_CONF_ADD_VOTER)) {
			memmove(&cs->learners[i], &cs->learners[i + 1], (cs->n_learners - i - 1) * sizeof(uint64_t));
			cs->n_learners--;
			break;
		}
	if (op == RPS__RAFT_CONF_REMOVE) {
		for (uint32_t i = 0; i < cs->n_voters; i++)
			if (cs->voters[i] == node) {
				memmove(&cs->voters[i], &cs->voters[i + 1], (cs->n_voters - i - 1) * sizeof(uint64_t));
				cs->n_voters--;
				break;
			}
	} else if (op == RPS__RAFT_CONF_ADD_LEARNER) {
		if (!voter && !learner && cs->n_voters + cs->n_learners < RPS__RAFT_MAX_NODES)
			cs->learners[cs->n_learners++] = node;
	} else if (op == RPS__RAFT_CONF_PROMOTE) {
		if (learner)
			cs->voters[cs->n_voters++] = node;
	} else if (!voter && (learner || cs->n_voters + cs->n_learners < RPS__RAFT_MAX_NODES)) {
		cs->voters[cs->n_voters++] = node;
	}
}

static bool same_members(const struct rps__raft_conf_state *a, const struct rps__raft_conf_state *b)
{
	if (a->n_voters != b->n_voters || a->n_learners != b->n_learners)
		return false;
	for (uint32_t i = 0; i < a->n_voters; i++)
		if (!rps__raft_conf_is_voter(b, a->voters[i]))
			return false;
	for (uint32_t i = 0; i < a->n_learners; i++)
		if (!rps__raft_conf_is_learner(b, a->learners[i]))
			return false;
	return true;
}

/* After any call on a node: the checks that look at its core. */
static void check_node(struct sim *s, struct sim_node *n)
{
	struct rps__raft_status st;

	if (!n->r)
		return;
	rps__raft_status(n->r, &st);
	if (st.role == RPS__RAFT_LEADER)
		record_leader(s, n, &st);
	if (st.last_index > st.snapshot_index) {
		const struct rps__raft_entry *last;

		if (rps__raft_entry_at(n->r, st.last_index, &last) == 0 && last->term > st.term)
			sim_fail(s, "node %llu is in term %llu with an entry of term %llu in its log",
				 (unsigned long long)n->id, (unsigned long long)st.term, (unsigned long long)last->term);
	}
	/* the configuration in force is the latest one in the log (raft.h),
	 * folded over the snapshot's; checkable when the disk holds the same
	 * snapshot as the core */
	if (n->st.has_snap && n->st.snap.index == st.snapshot_index) {
		struct rps__raft_conf_state cs;

		rps__raft_conf_copy(&cs, &n->st.snap.conf);	/* not the empty slots: this runs at every step */
		for (uint64_t i = st.snapshot_index + 1; i <= st.last_index; i++) {
			const struct rps__raft_entry *e;
			enum rps__raft_conf_op op;
			uint64_t node;

			if (rps__raft_entry_at(n->r, i, &e) == 0 && rps__raft_conf_change_decode(e, &op, &node) == 0)
				mirror_conf_apply(&cs, op, node);
		}
		if (!same_members(&cs, &st.conf))
			sim_fail(s, "node %llu: configuration in force (%u voters, %u learners) is not the latest in its log (%u, %u)",
				 (unsigned long long)n->id, st.conf.n_voters, st.conf.n_learners, cs.n_voters,
				 cs.n_learners);
	}
	if (n->checked_commit < st.snapshot_index)
		n->checked_commit = st.snapshot_index;
	for (uint64_t i = n->checked_commit + 1; i <= st.commit; i++) {
		const struct rps__raft_entry *e;

		if (rps__raft_entry_at(n->r, i, &e)) {
			sim_fail(s, "node %llu: committed index %llu is not in its log", (unsigned long long)n->id,
				 (unsigned long long)i);
			return;
		}
		record_committed(s, n->id, st.term, i, e->term, entry_hash(e));
	}
	if (st.commit > n->checked_commit)
		n->checked_commit = st.commit;
}

/* ------------------------------------------------------------------------ */
/* node life cycle */

static void orphan_ops(struct sim *s, struct sim_node *n)
{
	/* pending writes may still commit (their outcome is unknown); pending
	 * reads of a crashed node never answer */
	for (size_t i = 0; i < s->n_reads; i++)
		if (s->reads[i].node == n->id && s->reads[i].state == OP_PENDING)
			s->reads[i].state = OP_FAILED;
}

void sim_crash(struct sim *s, uint64_t id)
{
	struct sim_node *n = &s->nodes[id];

	if (!n->r)
		return;
	trace(s, "node %llu crashes", (unsigned long long)id);
	rps__raft_free(n->r);
	n->r = NULL;
	memset(n->sm, 0, sizeof(n->sm));
	n->applied = 0;
	n->map_wid = 0;
	orphan_ops(s, n);
	s->stats.crashes++;
}

static void process(struct sim *s, struct sim_node *n);

static int start_node(struct sim *s, struct sim_node *n)
{
	struct rps__raft_config cfg = {
		.id = n->id,
		.peers = n->bootstrap ? s->initial : NULL,
		.n_peers = n->bootstrap ? s->n_initial : 0,
		.election_ticks = s->cfg.election_ticks,
		.heartbeat_ticks = s->cfg.heartbeat_ticks,
		.pre_vote = s->cfg.pre_vote,
		.check_quorum = s->cfg.check_quorum,
		.max_inflight_msgs = s->cfg.max_inflight,
		.max_msg_entries = s->cfg.max_entries,
		.seed = s->cfg.seed * 31 + n->incarnation,
	};
	struct rps__raft_persisted p = {
		.hard_state = n->st.hs,
		.snapshot = n->st.has_snap ? &n->st.snap : NULL,
		.entries = n->st.ents,
		.n_entries = n->st.n,
	};
	int err;

	n->incarnation++;
	err = rps__raft_new(&cfg, &p, &n->r);
	if (err) {
		sim_fail(s, "node %llu: restart from its disk failed: %d", (unsigned long long)n->id, err);
		return err;
	}
	n->exists = true;
	sm_reset(s, n, n->st.has_snap ? &n->st.snap : NULL, false);
	n->checked_commit = 0;
	trace(s, "node %llu starts (disk: term %llu vote %llu commit %llu, snap %llu, %zu entries)",
	      (unsigned long long)n->id, (unsigned long long)n->st.hs.term, (unsigned long long)n->st.hs.vote,
	      (unsigned long long)n->st.hs.commit, (unsigned long long)(n->st.has_snap ? n->st.snap.index : 0),
	      n->st.n);
	process(s, n);
	return 0;
}

int sim_restart(struct sim *s, uint64_t id)
{
	struct sim_node *n = &s->nodes[id];

	if (n->r)
		return 0;
	return start_node(s, n);
}

int sim_start_joiner(struct sim *s, uint64_t id)
{
	struct sim_node *n = &s->nodes[id];

	if (id < 1 || id > s->n_ids || n->exists || n->r)
		return -EEXIST;
	n->id = id;
	n->bootstrap = false;
	return start_node(s, n);
}

static void destroy_node(struct sim *s, struct sim_node *n)
{
	trace(s, "node %llu is shut down for good", (unsigned long long)n->id);
	if (n->r) {
		rps__raft_free(n->r);
		n->r = NULL;
		orphan_ops(s, n);
	}
	n->exists = false;
	n->destroy_at = 0;
}

/* ------------------------------------------------------------------------ */
/* the network */

static void net_push(struct sim *s, uint64_t at, uint64_t from, uint64_t to, uint8_t *buf, size_t len)
{
	s->net = grow(s->net, &s->cap_net, s->n_net + 1, sizeof(*s->net));
	s->net[s->n_net].at = at;
	s->net[s->n_net].from = from;
	s->net[s->n_net].to = to;
	s->net[s->n_net].buf = buf;
	s->net[s->n_net].len = len;
	s->n_net++;
}

static uint64_t delay(struct sim *s)
{
	return s->min_delay + rnd_below(s, s->max_delay - s->min_delay + 1);
}

static void send_msg(struct sim *s, const struct rps__raft_msg *m)
{
	size_t size = rps__raft_msg_encoded_size(m), len;
	uint8_t *buf = malloc(size ? size : 1);

	if (!buf)
		abort();
	if (rps__raft_msg_encode(m, buf, size, &len) || len != size) {
		sim_fail(s, "encoding a %s failed", rps__raft_msg_type_name(m->type));
		free(buf);
		return;
	}
	s->stats.msgs++;
	if (s->trace > 1)
		trace(s, "  %llu -> %llu %s term %llu index %llu log_term %llu commit %llu%s%s n %u ctx %llx",
		      (unsigned long long)m->from, (unsigned long long)m->to, rps__raft_msg_type_name(m->type),
		      (unsigned long long)m->term, (unsigned long long)m->index, (unsigned long long)m->log_term,
		      (unsigned long long)m->commit, m->reject ? " reject" : "",
		      m->snapshot ? " +snapshot" : "", m->n_entries, (unsigned long long)m->context);
	if (s->seen)
		s->seen(s->seen_arg, m);
	if (s->random_mode && chance(s, s->loss_pm)) {
		free(buf);
		return;
	}
	if (s->random_mode && chance(s, s->dup_pm))
		net_push(s, s->now + delay(s), m->from, m->to, xmemdup(buf, len), len);
	net_push(s, s->now + (s->random_mode ? delay(s) : 0), m->from, m->to, buf, len);
}

/* Messages promise state: check that it is on disk before they leave. */
static void check_send_order(struct sim *s, struct sim_node *n, const struct rps__raft_msg *m)
{
	const struct sim_store *st = &n->st;
	const char *type = rps__raft_msg_type_name(m->type);

	if (m->from != n->id)
		sim_fail(s, "node %llu sends a %s from %llu", (unsigned long long)n->id, type,
			 (unsigned long long)m->from);
	/* PreVote traffic carries the term it would campaign in */
	if (m->type != RPS__RAFT_MSG_PRE_VOTE && m->type != RPS__RAFT_MSG_PRE_VOTE_RESP && m->term > st->hs.term)
		sim_fail(s, "node %llu sends a %s of term %llu with term %llu on disk", (unsigned long long)n->id,
			 type, (unsigned long long)m->term, (unsigned long long)st->hs.term);
	if (m->type == RPS__RAFT_MSG_VOTE_RESP && !m->reject &&
	    (st->hs.vote != m->to || st->hs.term != m->term))
		sim_fail(s, "node %llu grants its vote to %llu in term %llu before persisting it (disk: vote %llu term %llu)",
			 (unsigned long long)n->id, (unsigned long long)m->to, (unsigned long long)m->term,
			 (unsigned long long)st->hs.vote, (unsigned long long)st->hs.term);
	if (m->type == RPS__RAFT_MSG_VOTE && (st->hs.vote != n->id || st->hs.term != m->term))
		sim_fail(s, "node %llu campaigns in term %llu before persisting its own vote",
			 (unsigned long long)n->id, (unsigned long long)m->term);
	if (m->type == RPS__RAFT_MSG_APP_RESP && !m->reject && m->index > store_last(st))
		sim_fail(s, "node %llu acknowledges index %llu with only %llu on disk", (unsigned long long)n->id,
			 (unsigned long long)m->index, (unsigned long long)store_last(st));
	if (m->type == RPS__RAFT_MSG_APP && m->n_entries &&
	    m->entries[m->n_entries - 1].index > store_last(st))
		sim_fail(s, "leader %llu sends entries up to %llu with only %llu on disk", (unsigned long long)n->id,
			 (unsigned long long)m->entries[m->n_entries - 1].index, (unsigned long long)store_last(st));
}

static bool crash_point(struct sim *s, struct sim_node *n)
{
	if (!s->random_mode || !chance(s, s->crash_pm))
		return false;
	s->nodes[n->id].down_until = s->now + SIM_TICK_UNITS * (1 + rnd_below(s, 4 * s->cfg.election_ticks));
	sim_crash(s, n->id);
	return true;
}

/* ------------------------------------------------------------------------ */
/* applying */

static void complete_reads(struct sim *s, struct sim_node *n)
{
	for (size_t i = 0; i < s->n_reads; i++) {
		struct read_op *rd = &s->reads[i];

		if (rd->state != OP_PENDING || rd->node != n->id || rd->incarnation != n->incarnation ||
		    !rd->have_index || n->applied < rd->wait_index)
			continue;
		if (rd->shard == SIM_MAP_REG) {
			rd->value = 1 + n->map_wid;
			rd->map_hash = n->map_hash;
			s->stats.map_reads_ok++;
		} else {
			rd->value = 1 + n->sm[rd->shard].wid;
			s->stats.reads_ok++;
		}
		rd->resp = ++s->seq;
		rd->state = OP_DONE;
	}
}

static void schedule_destroy(struct sim *s, uint64_t id)
{
	struct sim_node *n = &s->nodes[id];

	if (s->random_mode && n->exists && !n->destroy_at)
		n->destroy_at = s->now + SIM_TICK_UNITS * (1 + rnd_below(s, 3 * s->cfg.election_ticks));
}

static void note_write_applied(struct sim *s, uint64_t wid, uint64_t index)
{
	struct write_op *w = &s->writes[wid - 1];

	if (w->log_index && w->log_index != index)
		sim_fail(s, "write %llu applied at index %llu and at %llu", (unsigned long long)wid,
			 (unsigned long long)w->log_index, (unsigned long long)index);
	w->log_index = index;
}

static void apply_map_entry(struct sim *s, struct sim_node *n, const struct rps__raft_entry *e);

static void apply_entry(struct sim *s, struct sim_node *n, uint64_t node_term, const struct rps__raft_entry *e)
{
	const uint8_t *p = e->data;

	if (e->index != n->applied + 1) {
		sim_fail(s, "node %llu applies index %llu after %llu", (unsigned long long)n->id,
			 (unsigned long long)e->index, (unsigned long long)n->applied);
		return;
	}
	if (e->index > store_last(&n->st))
		sim_fail(s, "node %llu applies index %llu with only %llu on disk", (unsigned long long)n->id,
			 (unsigned long long)e->index, (unsigned long long)store_last(&n->st));
	/* state-machine safety: the same entry at an index everywhere */
	record_committed(s, n->id, node_term, e->index, e->term, entry_hash(e));
	n->applied = e->index;
	if (e->type == RPS__RAFT_ENTRY_CONF) {
		enum rps__raft_conf_op op;
		uint64_t node;

		if (rps__raft_conf_change_decode(e, &op, &node) == 0 && e->index > s->conf_view_index) {
			s->conf_view_index = e->index;
			mirror_conf_apply(&s->conf_view, op, node);
			if (op == RPS__RAFT_CONF_REMOVE && node <= s->n_ids)
				schedule_destroy(s, node);
		}
	}
	if (e->type == RPS__RAFT_ENTRY_NORMAL && e->len == CMD_LEN && p[0] == 'W') {
		uint32_t shard = (uint32_t)p[1] | (uint32_t)p[2] << 8 | (uint32_t)p[3] << 16 | (uint32_t)p[4] << 24;
		uint64_t owner = get64(p + 5), wid = get64(p + 13);

		if (shard >= SIM_SHARDS || wid == 0 || wid > s->n_writes) {
			sim_fail(s, "node %llu applies a garbled command at %llu", (unsigned long long)n->id,
				 (unsigned long long)e->index);
			return;
		}
		n->sm[shard].owner = owner;
		n->sm[shard].epoch++;
		n->sm[shard].wid = wid;
		note_write_applied(s, wid, e->index);
	}
	if (e->type == RPS__RAFT_ENTRY_NORMAL && e->len >= MAP_HDR && p[0] == 'M')
		apply_map_entry(s, n, e);
	map_record(s, n, e->index);
	/* the client at the proposing node learns the outcome */
	for (size_t i = 0; i < s->n_writes; i++) {
		struct write_op *w = &s->writes[i];

		if (w->state != OP_PENDING || w->node != n->id || w->incarnation != n->incarnation ||
		    w->index != e->index)
			continue;
		if (w->term == e->term) {
			w->state = OP_DONE;
			w->resp = ++s->seq;
			s->stats.writes_ok++;
		} else {
			w->state = OP_FAILED;	/* overwritten: it can never commit */
		}
	}
}

/* ------------------------------------------------------------------------ */
/* the product's shard map */

static uint64_t bytes_hash(const uint8_t *p, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull ^ len, w;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		memcpy(&w, p + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 29;
	}
	for (; i < len; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h | 1;	/* 0 means "none" */
}

static uint64_t map_hash(struct sim *s, const struct rps__smap *m)
{
	size_t len = 0;

	if (rps__smap_encode(m, s->snap_buf, sizeof(s->snap_buf), &len)) {
		sim_fail(s, "encoding a shard map: %s", rps__errbuf());
		return 1;
	}
	return bytes_hash(s->snap_buf, len);
}

/* One partition of a node's map just changed or was restored. */
static void check_map_part(struct sim *s, struct sim_node *n, uint32_t p, bool check_epochs)
{
	const struct rps__smap_part *pt = &n->map.parts[p];
	unsigned long long id = n->id;
	uint64_t *owner;

	if (check_epochs && pt->epoch < n->map_epoch[p])
		sim_fail(s, "node %llu: partition %u's epoch went back from %llu to %llu", id, p,
			 (unsigned long long)n->map_epoch[p], (unsigned long long)pt->epoch);
	n->map_epoch[p] = pt->epoch;
	s->owner_at[p] = grow(s->owner_at[p], &s->cap_owner_at[p], pt->epoch + 1, sizeof(uint64_t));
	owner = &s->owner_at[p][pt->epoch];
	if (!*owner)
		*owner = pt->owner;
	else if (*owner != pt->owner)
		sim_fail(s, "partition %u has two owners in epoch %llu: %llu, and %llu at node %llu", p,
			 (unsigned long long)pt->epoch, (unsigned long long)*owner, (unsigned long long)pt->owner, id);
	for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++) {
		uint64_t b = pt->backups[k];

		if (!b)
			continue;
		if (b == pt->owner)
			sim_fail(s, "node %llu: partition %u's owner %llu is also its backup", id, p,
				 (unsigned long long)b);
		if (!rps__smap_member(&n->map, b) || (k && !pt->backups[k - 1]))
			sim_fail(s, "node %llu: partition %u's backup %llu is not a member or follows a hole", id, p,
				 (unsigned long long)b);
		for (uint32_t j = 0; j < k; j++)
			if (pt->backups[j] == b)
				sim_fail(s, "node %llu: partition %u has backup %llu twice", id, p,
					 (unsigned long long)b);
	}
}

/* After the map changed (applied a command, or restored): the checks on the
 * history of every partition, then the map's hash. */
static void map_changed(struct sim *s, struct sim_node *n, bool check_epochs)
{
	for (uint32_t p = 0; p < n->map.npart && p < SIM_MAP_PARTS; p++)
		check_map_part(s, n, p, check_epochs);
	n->map_hash = map_hash(s, &n->map);
}

/* Every node's map is byte-identical at equal applied index. */
static void map_record(struct sim *s, struct sim_node *n, uint64_t index)
{
	struct map_rec *r;

	s->map_at = grow(s->map_at, &s->cap_map_at, index + 1, sizeof(*s->map_at));
	r = &s->map_at[index];
	if (!r->hash) {
		r->hash = n->map_hash;
		r->wid = n->map_wid;
		r->node = n->id;
	} else if (r->hash != n->map_hash || r->wid != n->map_wid) {
		sim_fail(s, "shard maps differ at applied index %llu: node %llu's (as of write %llu) is not node %llu's (write %llu)",
			 (unsigned long long)index, (unsigned long long)n->id, (unsigned long long)n->map_wid,
			 (unsigned long long)r->node, (unsigned long long)r->wid);
	}
}

/* The deliberate bugs of enum sim_map_fault, after an accepted command. */
static void inject_map_fault(struct sim *s, struct sim_node *n, const struct rps__smap_cmd *c,
			     const struct rps__smap_part *before)
{
	struct rps__smap_part *pt = &n->map.parts[c->part];
	uint32_t nb = rps__smap_nbackups(&n->map, c->part);

	if (c->type == RPS__SMAP_FAILOVER &&
	    (s->fault == SIM_FAULT_FAILOVER_KEEPS_OLD || (s->fault == SIM_FAULT_SPLIT_OWNER && n->id == 2)))
		pt->owner = before->owner;
	if (c->type == RPS__SMAP_REPLICA_COMMIT && s->fault == SIM_FAULT_OWNER_BACKUP)
		pt->backups[nb - 1] = pt->owner;
	if (c->type == RPS__SMAP_REPLICA_COMMIT && s->fault == SIM_FAULT_TWIN_BACKUPS && nb > 1)
		pt->backups[nb - 1] = pt->backups[0];
}

/* A FAILOVER that applied: its new primary was a backup the epoch before. */
static void check_failover(struct sim *s, struct sim_node *n, const struct rps__smap_cmd *c,
			   const struct rps__smap_part *before)
{
	const struct rps__smap_part *pt = &n->map.parts[c->part];
	bool was_backup = false;

	for (uint32_t k = 0; k < RPS__SMAP_MAX_REPLICAS - 1; k++)
		was_backup |= before->backups[k] && before->backups[k] == pt->owner;
	if (!was_backup || pt->owner != c->to || pt->epoch != before->epoch + 1)
		sim_fail(s, "node %llu: FAILOVER of partition %u to %llu made %llu primary in epoch %llu; in epoch %llu the backups were %llu, %llu",
			 (unsigned long long)n->id, c->part, (unsigned long long)c->to, (unsigned long long)pt->owner,
			 (unsigned long long)pt->epoch, (unsigned long long)before->epoch,
			 (unsigned long long)before->backups[0], (unsigned long long)before->backups[1]);
}

/* As src/control/cp_map.c's cb_apply: decode, apply; a refused or
 * undecodable command changes nothing but the applied index, on every node
 * alike. */
static void apply_map_entry(struct sim *s, struct sim_node *n, const struct rps__raft_entry *e)
{
	const uint8_t *p = e->data;
	uint64_t wid = get64(p + 1);
	struct rps__smap_part before;
	struct rps__smap_cmd c;
	bool first = e->index >= s->cap_map_at || !s->map_at[e->index].hash;
	int rc;

	if (wid == 0 || wid > s->n_writes || s->writes[wid - 1].shard != SIM_MAP_REG) {
		sim_fail(s, "node %llu applies a garbled map command at %llu", (unsigned long long)n->id,
			 (unsigned long long)e->index);
		return;
	}
	note_write_applied(s, wid, e->index);
	n->map_wid = wid;
	memset(&before, 0, sizeof(before));
	memset(&c, 0, sizeof(c));
	if (s->fault == SIM_FAULT_SKIP_APPLY && n->id == 2 && ++n->map_applies % 5 == 0)
		return;
	if (rps__smap_cmd_decode(p + MAP_HDR, e->len - MAP_HDR, &c)) {
		n->map.applied = e->index;
		rc = -EBADMSG;
	} else {
		if (c.part < n->map.npart)
			before = n->map.parts[c.part];
		rc = rps__smap_apply(&n->map, e->index, &c);
		if (!rc && s->fault)
			inject_map_fault(s, n, &c, &before);
	}
	map_changed(s, n, true);
	if (first && s->trace) {
		char what[256];

		rps__smap_cmd_str(&c, what, sizeof(what));
		trace(s, "node %llu applies map entry %llu: %s%s%s", (unsigned long long)n->id,
		      (unsigned long long)e->index, what, rc ? ": refused: " : "", rc ? rps__errbuf() : "");
	}
	if (!rc && c.type == RPS__SMAP_FAILOVER)
		check_failover(s, n, &c, &before);
	if (first && rc)
		s->stats.map_refused++;
	else if (first)
		s->stats.map_ok[c.type]++;
}

/* A leader's own membership change: one at a time (every earlier one
 * committed) and only once it committed an entry of its term (raft.h). */
static void check_conf_proposal(struct sim *s, struct sim_node *n, const struct rps__raft_entry *conf,
				const struct rps__raft_hard_state *hs)
{
	const struct rps__raft_entry *e;
	struct rps__raft_status st;

	rps__raft_status(n->r, &st);
	for (uint64_t i = conf->index - 1; i > st.snapshot_index && i > hs->commit; i--)
		if (rps__raft_entry_at(n->r, i, &e) == 0 && e->type == RPS__RAFT_ENTRY_CONF) {
			sim_fail(s, "leader %llu appends membership change %llu while %llu is not committed (commit %llu)",
				 (unsigned long long)n->id, (unsigned long long)conf->index, (unsigned long long)i,
				 (unsigned long long)hs->commit);
			return;
		}
	if (hs->commit > st.snapshot_index &&
	    (rps__raft_entry_at(n->r, hs->commit, &e) || e->term != hs->term))
		sim_fail(s, "leader %llu appends membership change %llu before committing in its term %llu",
			 (unsigned long long)n->id, (unsigned long long)conf->index, (unsigned long long)hs->term);
}

static void handle_ready(struct sim *s, struct sim_node *n, struct rps__raft_ready *rd)
{
	struct sim_store *st = &n->st;
	struct rps__raft *r = n->r;

	if (crash_point(s, n))
		return;
	if (rd->snapshot) {
		/* atomically: the snapshot replaces the whole log */
		store_truncate(st, 0);
		store_set_snap(st, rd->snapshot);
		if (rd->snapshot->index > 1)
			s->stats.snapshots++;	/* not the bootstrap one */
		trace(s, "node %llu installs snapshot %llu (term %llu)", (unsigned long long)n->id,
		      (unsigned long long)rd->snapshot->index, (unsigned long long)rd->snapshot->term);
		if (crash_point(s, n))
			return;
	}
	if (rd->n_entries) {
		uint64_t first = rd->entries[0].index, prev_term;
		size_t keep = rd->n_entries;
		bool torn = false;

		store_truncate(st, first);
		if (first != store_last(st) + 1 || !store_term(st, first - 1, &prev_term)) {
			sim_fail(s, "node %llu: ready entries from %llu do not follow its disk (last %llu)",
				 (unsigned long long)n->id, (unsigned long long)first,
				 (unsigned long long)store_last(st));
			return;
		}
		if (s->random_mode && chance(s, s->crash_pm)) {
			keep = (size_t)rnd_below(s, rd->n_entries);	/* a torn write keeps a prefix */
			torn = true;
		}
		for (size_t i = 0; i < keep; i++) {
			if (rd->role == RPS__RAFT_LEADER && rd->entries[i].type == RPS__RAFT_ENTRY_CONF &&
			    rd->entries[i].term == rd->hard_state.term)
				check_conf_proposal(s, n, &rd->entries[i], &rd->hard_state);
			record_persisted(s, n->id, &rd->entries[i], prev_term);
			prev_term = rd->entries[i].term;
			store_append(st, &rd->entries[i]);
		}
		if (torn) {
			n->down_until = s->now + SIM_TICK_UNITS * (1 + rnd_below(s, 2 * s->cfg.election_ticks));
			sim_crash(s, n->id);
			return;
		}
		if (crash_point(s, n))
			return;
	}
	if (rd->hard_state_changed) {
		const struct rps__raft_hard_state *hs = &rd->hard_state;

		if (hs->term < st->hs.term)
			sim_fail(s, "node %llu persists term %llu after %llu", (unsigned long long)n->id,
				 (unsigned long long)hs->term, (unsigned long long)st->hs.term);
		if (hs->term == st->hs.term && st->hs.vote && hs->vote != st->hs.vote)
			sim_fail(s, "node %llu votes twice in term %llu: for %llu, then %llu", (unsigned long long)n->id,
				 (unsigned long long)hs->term, (unsigned long long)st->hs.vote,
				 (unsigned long long)hs->vote);
		if (hs->commit > store_last(st))
			sim_fail(s, "node %llu persists commit %llu beyond its disk's last index %llu",
				 (unsigned long long)n->id, (unsigned long long)hs->commit,
				 (unsigned long long)store_last(st));
		st->hs = *hs;
		if (s->trace > 1)
			trace(s, "  node %llu persists term %llu vote %llu commit %llu", (unsigned long long)n->id,
			      (unsigned long long)hs->term, (unsigned long long)hs->vote, (unsigned long long)hs->commit);
		if (crash_point(s, n))
			return;
	}
	for (size_t i = 0; i < rd->n_msgs; i++) {
		check_send_order(s, n, &rd->msgs[i]);
		send_msg(s, &rd->msgs[i]);
		/* a crash half way through sending */
		if (rd->n_msgs > 1 && s->random_mode && chance(s, s->crash_pm / 4)) {
			n->down_until = s->now + SIM_TICK_UNITS * (1 + rnd_below(s, 2 * s->cfg.election_ticks));
			sim_crash(s, n->id);
			return;
		}
	}
	if (rd->snapshot)
		sm_reset(s, n, rd->snapshot, true);
	for (size_t i = 0; i < rd->n_committed && !s->failed; i++)
		apply_entry(s, n, rd->hard_state.term, &rd->committed[i]);
	for (size_t i = 0; i < rd->n_read_states; i++)
		for (size_t k = 0; k < s->n_reads; k++) {
			struct read_op *op = &s->reads[k];

			if (op->ctx == rd->read_states[i].ctx && op->node == n->id && op->state == OP_PENDING &&
			    op->incarnation == n->incarnation) {
				op->have_index = true;
				op->wait_index = rd->read_states[i].index;
			}
		}
	complete_reads(s, n);
	rps__raft_advance(r, rd);
}

static void maybe_compact(struct sim *s, struct sim_node *n);

static void process(struct sim *s, struct sim_node *n)
{
	struct rps__raft_ready rd;

	while (n->r && !s->failed) {
		int rc = rps__raft_ready(n->r, &rd);

		if (rc < 0) {
			sim_fail(s, "node %llu: ready failed: %d", (unsigned long long)n->id, rc);
			return;
		}
		if (!rc)
			break;
		handle_ready(s, n, &rd);
	}
	check_node(s, n);
	if (s->random_mode)
		maybe_compact(s, n);
}

int sim_compact(struct sim *s, uint64_t id)
{
	struct sim_node *n = &s->nodes[id];
	const struct rps__raft_snapshot *snap;
	uint8_t *buf = s->snap_buf;
	size_t len;
	int err;

	if (!n->r)
		return -ENOENT;
	sm_encode(n, buf);
	put64(buf + SNAP_TOY_LEN, n->map_wid);
	err = rps__smap_encode(&n->map, buf + SNAP_HDR, sizeof(s->snap_buf) - SNAP_HDR, &len);
	if (err) {
		sim_fail(s, "node %llu: encoding its shard map: %s", (unsigned long long)id, rps__errbuf());
		return err;
	}
	err = rps__raft_compact(n->r, n->applied, buf, SNAP_HDR + len, &snap);
	if (err)
		return err;
	/* the snapshot and the dropped prefix reach the disk together */
	store_set_snap(&n->st, snap);
	store_compact(&n->st, snap->index);
	trace(s, "node %llu compacts to %llu", (unsigned long long)id, (unsigned long long)snap->index);
	return 0;
}

static void maybe_compact(struct sim *s, struct sim_node *n)
{
	uint64_t snap = n->st.has_snap ? n->st.snap.index : 0;

	if (n->r && n->applied > snap && n->applied - snap >= s->compact_every && !crash_point(s, n))
		sim_compact(s, n->id);
}

/* ------------------------------------------------------------------------ */
/* driving */

/* Forged twins of m that the core must drop without changing anything: the
 * same message with a term that cannot be incremented, and a stranger's
 * answer of a higher term.  So the safety checks keep judging only what
 * correct peers sent. */
static void inject_hostile(struct sim *s, struct sim_node *n, const struct rps__raft_msg *m)
{
	struct rps__raft_status a, b;
	struct rps__raft_msg f = *m;
	int err;

	rps__raft_status(n->r, &a);
	f.term = UINT64_MAX;
	err = rps__raft_step(n->r, &f);
	if (err != -EPROTO)
		sim_fail(s, "node %llu: a %s of term 2^64-1 was not refused: %d", (unsigned long long)n->id,
			 rps__raft_msg_type_name(m->type), err);
	memset(&f, 0, sizeof(f));
	f.type = RPS__RAFT_MSG_APP_RESP;
	f.to = n->id;
	f.from = STRANGER;
	f.term = a.term + 1;
	err = rps__raft_step(n->r, &f);
	if (err)
		sim_fail(s, "node %llu: a stranger's answer failed the step: %d", (unsigned long long)n->id, err);
	rps__raft_status(n->r, &b);
	if (b.term != a.term || b.vote != a.vote || b.role != a.role || b.leader != a.leader ||
	    b.commit != a.commit || b.last_index != a.last_index || b.snapshot_index != a.snapshot_index ||
	    b.refused != a.refused + 2)
		sim_fail(s, "node %llu: refused messages changed its state (term %llu -> %llu, refused %llu -> %llu)",
			 (unsigned long long)n->id, (unsigned long long)a.term, (unsigned long long)b.term,
			 (unsigned long long)a.refused, (unsigned long long)b.refused);
}

static void deliver(struct sim *s, struct packet *p)
{
	struct sim_node *n = &s->nodes[p->to];
	struct rps__raft_msg *m;
	int err;

	if (p->to < 1 || p->to > s->n_ids || !n->r || s->cut[p->from][p->to]) {
		free(p->buf);
		return;
	}
	err = rps__raft_msg_decode(p->buf, p->len, &m);
	free(p->buf);
	if (err) {
		sim_fail(s, "decoding a message from %llu failed: %d", (unsigned long long)p->from, err);
		return;
	}
	if (s->drop && s->drop(s->drop_arg, m)) {
		rps__raft_msg_free(m);
		return;
	}
	if (s->random_mode && ++s->deliveries % HOSTILE_EVERY == 0)
		inject_hostile(s, n, m);
	err = rps__raft_step(n->r, m);
	if (err)
		sim_fail(s, "node %llu: step of a %s from %llu failed: %d", (unsigned long long)n->id,
			 rps__raft_msg_type_name(m->type), (unsigned long long)m->from, err);
	rps__raft_msg_free(m);
	process(s, n);
}

void sim_deliver_all(struct sim *s)
{
	size_t guard = 0;

	while (s->n_net && !s->failed && guard++ < 1000000) {
		struct packet p = s->net[0];

		memmove(s->net, s->net + 1, (s->n_net - 1) * sizeof(*s->net));
		s->n_net--;
		deliver(s, &p);
	}
}

/* Deliver what is due; messages to a paused node wait for it. */
static void deliver_due(struct sim *s)
{
	struct packet *due = NULL;
	size_t n_due = 0, cap_due = 0, k = 0;

	for (size_t i = 0; i < s->n_net; i++) {
		struct packet *p = &s->net[i];

		if (p->at <= s->now && p->to <= s->n_ids && s->nodes[p->to].paused_until > s->now)
			p->at = s->nodes[p->to].paused_until;
		if (p->at <= s->now) {
			due = grow(due, &cap_due, n_due + 1, sizeof(*due));
			due[n_due++] = *p;
		} else {
			s->net[k++] = *p;
		}
	}
	s->n_net = k;
	for (size_t i = 0; i < n_due; i++) {
		if (s->failed)
			free(due[i].buf);
		else
			deliver(s, &due[i]);
	}
	free(due);
}

size_t sim_pending(const struct sim *s)
{
	return s->n_net;
}

void sim_drop_pending(struct sim *s)
{
	for (size_t i = 0; i < s->n_net; i++)
		free(s->net[i].buf);
	s->n_net = 0;
}

void sim_cut(struct sim *s, uint64_t from, uint64_t to, bool cut)
{
	s->cut[from][to] = cut;
}

void sim_isolate(struct sim *s, uint64_t id)
{
	for (uint64_t i = 1; i <= s->n_ids; i++)
		if (i != id) {
			s->cut[id][i] = true;
			s->cut[i][id] = true;
		}
}

void sim_heal(struct sim *s)
{
	/* the rows in use only: the whole array is 16 KiB, and random runs
	 * heal often */
	for (uint64_t a = 0; a <= s->n_ids; a++)
		memset(s->cut[a], 0, (s->n_ids + 1) * sizeof(s->cut[a][0]));
}

void sim_set_filter(struct sim *s, bool (*drop)(void *arg, const struct rps__raft_msg *m), void *arg)
{
	s->drop = drop;
	s->drop_arg = arg;
}

void sim_set_observer(struct sim *s, void (*seen)(void *arg, const struct rps__raft_msg *m), void *arg)
{
	s->seen = seen;
	s->seen_arg = arg;
}

struct rps__raft *sim_raft(struct sim *s, uint64_t id)
{
	return id >= 1 && id <= s->n_ids ? s->nodes[id].r : NULL;
}

void sim_status(struct sim *s, uint64_t id, struct rps__raft_status *st)
{
	memset(st, 0, sizeof(*st));
	if (NODE_OK(s, id))
		rps__raft_status(s->nodes[id].r, st);
}

void sim_tick(struct sim *s, uint64_t id, unsigned n)
{
	for (unsigned i = 0; i < n && NODE_OK(s, id); i++) {
		int err = rps__raft_tick(s->nodes[id].r);

		if (err)
			sim_fail(s, "node %llu: tick failed: %d", (unsigned long long)id, err);
		process(s, &s->nodes[id]);
	}
}

void sim_tick_all(struct sim *s, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		for (uint64_t id = 1; id <= s->n_ids; id++)
			sim_tick(s, id, 1);
		sim_deliver_all(s);
	}
}

/* Run a call on a node and handle what it produced. */
static int after_call(struct sim *s, uint64_t id, int err)
{
	process(s, &s->nodes[id]);
	return err;
}

int sim_campaign(struct sim *s, uint64_t id)
{
	if (!NODE_OK(s, id))
		return -ENOENT;
	return after_call(s, id, rps__raft_campaign(s->nodes[id].r));
}

int sim_propose(struct sim *s, uint64_t id, const void *data, size_t len, uint64_t *index)
{
	if (!NODE_OK(s, id))
		return -ENOENT;
	return after_call(s, id, rps__raft_propose(s->nodes[id].r, data, len, index, NULL));
}

int sim_conf_change(struct sim *s, uint64_t id, enum rps__raft_conf_op op, uint64_t node)
{
	if (!NODE_OK(s, id))
		return -ENOENT;
	return after_call(s, id, rps__raft_propose_conf_change(s->nodes[id].r, op, node, NULL));
}

int sim_step(struct sim *s, uint64_t id, const struct rps__raft_msg *m)
{
	if (!NODE_OK(s, id))
		return -ENOENT;
	return after_call(s, id, rps__raft_step(s->nodes[id].r, m));
}

int sim_transfer(struct sim *s, uint64_t id, uint64_t to)
{
	if (!NODE_OK(s, id))
		return -ENOENT;
	return after_call(s, id, rps__raft_transfer_leader(s->nodes[id].r, to));
}

/* A client write of cmd, which already names write id n_writes + 1. */
static int client_write(struct sim *s, uint64_t id, uint32_t reg, const uint8_t *cmd, size_t len)
{
	struct sim_node *n = &s->nodes[id];
	struct write_op *w;
	uint64_t index, term;
	int err;

	/* the write exists before the call: the apply may happen inside it */
	s->writes = grow(s->writes, &s->cap_writes, s->n_writes + 1, sizeof(*s->writes));
	w = &s->writes[s->n_writes];
	memset(w, 0, sizeof(*w));
	w->shard = reg;
	w->node = id;
	w->incarnation = n->incarnation;
	w->inv = ++s->seq;
	w->resp = UINT64_MAX;
	w->state = OP_PENDING;
	w->index = UINT64_MAX;
	s->n_writes++;
	err = rps__raft_propose(n->r, cmd, len, &index, &term);
	if (err) {
		s->n_writes--;	/* never happened */
		return err;
	}
	w = &s->writes[s->n_writes - 1];
	w->index = index;
	w->term = term;
	process(s, n);
	return 0;
}

int sim_write(struct sim *s, uint64_t id, uint32_t shard, uint64_t owner)
{
	uint8_t cmd[CMD_LEN];

	if (!NODE_OK(s, id))
		return -ENOENT;
	cmd[0] = 'W';
	cmd[1] = (uint8_t)shard;
	cmd[2] = (uint8_t)(shard >> 8);
	cmd[3] = (uint8_t)(shard >> 16);
	cmd[4] = (uint8_t)(shard >> 24);
	put64(cmd + 5, owner);
	put64(cmd + 13, s->n_writes + 1);
	return client_write(s, id, shard, cmd, sizeof(cmd));
}

int sim_map_write(struct sim *s, uint64_t id, const struct rps__smap_cmd *c)
{
	uint8_t cmd[MAP_HDR + RPS__SMAP_CMD_MAX];
	size_t len;
	int err;

	if (!NODE_OK(s, id))
		return -ENOENT;
	err = rps__smap_cmd_encode(c, cmd + MAP_HDR, sizeof(cmd) - MAP_HDR, &len);
	if (err)
		return err;
	cmd[0] = 'M';
	put64(cmd + 1, s->n_writes + 1);
	return client_write(s, id, SIM_MAP_REG, cmd, MAP_HDR + len);
}

static int client_read(struct sim *s, uint64_t id, uint32_t reg, uint64_t *ctx)
{
	struct sim_node *n = &s->nodes[id];
	struct read_op *rd;
	int err;

	if (!NODE_OK(s, id))
		return -ENOENT;
	s->reads = grow(s->reads, &s->cap_reads, s->n_reads + 1, sizeof(*s->reads));
	rd = &s->reads[s->n_reads];
	memset(rd, 0, sizeof(*rd));
	rd->shard = reg;
	rd->node = id;
	rd->incarnation = n->incarnation;
	rd->ctx = ((uint64_t)id << 48) | ++s->next_ctx;
	rd->inv = ++s->seq;
	rd->resp = UINT64_MAX;
	rd->state = OP_PENDING;
	s->n_reads++;
	if (reg == SIM_MAP_REG && s->fault == SIM_FAULT_STALE_READ) {
		/* the bug: answered from whatever this node applied */
		rd->have_index = true;
		err = 0;
	} else {
		err = rps__raft_read_index(n->r, rd->ctx);
	}
	if (err) {
		s->n_reads--;
		return err;
	}
	if (ctx)
		*ctx = rd->ctx;
	complete_reads(s, n);
	process(s, n);
	return 0;
}

int sim_read(struct sim *s, uint64_t id, uint32_t shard, uint64_t *ctx)
{
	return client_read(s, id, shard, ctx);
}

int sim_map_read(struct sim *s, uint64_t id, uint64_t *ctx)
{
	return client_read(s, id, SIM_MAP_REG, ctx);
}

uint64_t sim_read_result(struct sim *s, uint64_t ctx)
{
	for (size_t i = 0; i < s->n_reads; i++)
		if (s->reads[i].ctx == ctx)
			return s->reads[i].state == OP_DONE ? s->reads[i].value : 0;
	return 0;
}

uint64_t sim_leader(struct sim *s)
{
	uint64_t best = 0, best_term = 0;

	for (uint64_t id = 1; id <= s->n_ids; id++) {
		struct rps__raft_status st;

		if (!NODE_OK(s, id))
			continue;
		rps__raft_status(s->nodes[id].r, &st);
		if (st.role == RPS__RAFT_LEADER && st.term >= best_term) {
			best = id;
			best_term = st.term;
		}
	}
	return best;
}

uint64_t sim_applied(struct sim *s, uint64_t id)
{
	return s->nodes[id].applied;
}

void sim_shard(struct sim *s, uint64_t id, uint32_t shard, uint64_t *owner, uint64_t *epoch)
{
	*owner = s->nodes[id].sm[shard].owner;
	*epoch = s->nodes[id].sm[shard].epoch;
}

const struct rps__smap *sim_map(struct sim *s, uint64_t id)
{
	return &s->nodes[id].map;
}

size_t sim_stored_entries(struct sim *s, uint64_t id)
{
	return s->nodes[id].st.n;
}

const char *sim_error(const struct sim *s)
{
	return s->failed ? s->err : NULL;
}

struct sim *sim_new(const struct sim_config *cfg)
{
	static const char *const map_uris[] = { "tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000", "tcp://10.0.0.3:7000",
						"tcp://10.0.0.4:7000", "tcp://10.0.0.5:7000" };
	struct sim *s;

	if (cfg->n_ids > SIM_CAP_IDS || cfg->n_voters > RPS__RAFT_MAX_VOTERS ||
	    cfg->n_voters > (cfg->n_ids ? cfg->n_ids : SIM_DEFAULT_IDS)) {
		fprintf(stderr, "raft_sim: %u voters among %u ids: at most %u voters, %u ids\n", cfg->n_voters,
			cfg->n_ids, RPS__RAFT_MAX_VOTERS, SIM_CAP_IDS);
		return NULL;
	}
	s = calloc(1, sizeof(*s));	/* 4 MiB: room for SIM_CAP_IDS nodes */
	if (!s)
		return NULL;
	s->cfg = *cfg;
	s->n_ids = cfg->n_ids ? cfg->n_ids : SIM_DEFAULT_IDS;
	s->rng = cfg->seed ^ 0x5eed5eed5eedull;
	s->min_delay = 1;
	s->max_delay = 1;
	s->compact_every = UINT32_MAX;
	if (rps__smap_init_replicated(&s->map0, map_uris, RPS__ARRAY_SIZE(map_uris), SIM_MAP_PARTS,
				      cfg->map_replicas ? cfg->map_replicas : 2)) {
		fprintf(stderr, "raft_sim: %s\n", rps__errbuf());
		free(s);
		return NULL;
	}
	s->map0_hash = map_hash(s, &s->map0);
	for (unsigned i = 0; i < cfg->n_voters; i++) {
		s->initial[s->n_initial++] = i + 1;
		s->conf_view.voters[s->conf_view.n_voters++] = i + 1;
	}
	for (uint64_t id = 1; id <= s->n_ids; id++)
		s->nodes[id].id = id;
	for (unsigned i = 0; i < s->n_initial; i++) {
		s->nodes[i + 1].bootstrap = true;
		start_node(s, &s->nodes[i + 1]);
	}
	return s;
}

void sim_free(struct sim *s)
{
	if (!s)
		return;
	for (uint64_t id = 1; id <= s->n_ids; id++) {
		rps__raft_free(s->nodes[id].r);
		store_free(&s->nodes[id].st);
	}
	sim_drop_pending(s);
	free(s->net);
	free(s->leader_of);
	free(s->com);
	free(s->emap);
	free(s->writes);
	free(s->reads);
	free(s->map_at);
	for (uint32_t p = 0; p < SIM_MAP_PARTS; p++)
		free(s->owner_at[p]);
	free(s);
}

/* ------------------------------------------------------------------------ */
/* linearisability */

/* Time points, scaled so that "just after t" exists between t and t + 1. */
static uint64_t scaled(uint64_t t)
{
	return t == UINT64_MAX ? UINT64_MAX : t << 24;
}

/* The writes' order is known (the log's), so greedily give each write the
 * earliest linearisation point it can have: after its predecessor and after
 * every read that saw its predecessor.  A read is placed at the earliest
 * point after the write it saw; it fails if that is after its response, a
 * write fails if it must come after its own response. */
int sim_lin_check(const struct sim_lin_write *writes, size_t n_writes, const struct sim_lin_read *reads,
		  size_t n_reads, size_t *bad)
{
	uint64_t point = 0;

	for (size_t k = 0; k <= n_writes; k++) {
		uint64_t lo = point;
		size_t pusher = n_reads;

		for (size_t i = 0; i < n_reads; i++) {
			uint64_t p;

			if (reads[i].saw != k)
				continue;
			p = RPS__MAX(scaled(reads[i].inv), point + 1);
			if (p > scaled(reads[i].resp)) {
				*bad = i;
				return -1;
			}
			if (p > lo) {
				lo = p;
				pusher = i;
			}
		}
		if (k == n_writes)
			break;
		point = RPS__MAX(scaled(writes[k].inv), lo + 1);
		if (point > scaled(writes[k].resp)) {
			*bad = pusher;
			return -1;
		}
	}
	return 0;
}

static int cmp_write_pos(const void *a, const void *b)
{
	const struct write_op *x = *(const struct write_op *const *)a, *y = *(const struct write_op *const *)b;

	return x->log_index < y->log_index ? -1 : x->log_index > y->log_index;
}

int sim_check_linearizable(struct sim *s)
{
	struct write_op **order = calloc(s->n_writes + 1, sizeof(*order));
	struct sim_lin_write *lw = calloc(s->n_writes + 1, sizeof(*lw));
	struct sim_lin_read *lr = calloc(s->n_reads + 1, sizeof(*lr));
	size_t *pos = calloc(s->n_writes + 1, sizeof(*pos));
	size_t *read_of = calloc(s->n_reads + 1, sizeof(*read_of));
	int rc = 0;

	if (!order || !lw || !lr || !pos || !read_of)
		abort();
	for (uint32_t shard = 0; shard <= SIM_MAP_REG && !rc; shard++) {
		size_t nw = 0, nr = 0, bad;

		for (size_t i = 0; i < s->n_writes; i++) {
			if (s->writes[i].shard != shard)
				continue;
			if (s->writes[i].state == OP_DONE && !s->writes[i].log_index) {
				sim_fail(s, "write %zu was acknowledged but never applied", i + 1);
				rc = -1;
				break;
			}
			if (s->writes[i].log_index)
				order[nw++] = &s->writes[i];
		}
		if (rc)
			break;
		qsort(order, nw, sizeof(*order), cmp_write_pos);
		for (size_t k = 0; k < nw; k++) {
			lw[k].inv = order[k]->inv;
			lw[k].resp = order[k]->state == OP_DONE ? order[k]->resp : UINT64_MAX;
			pos[order[k] - s->writes] = k + 1;
		}
		for (size_t i = 0; i < s->n_reads; i++) {
			const struct read_op *rd = &s->reads[i];
			size_t wid;

			if (rd->shard != shard || rd->state != OP_DONE)
				continue;
			wid = (size_t)(rd->value - 1);
			if (wid && (wid > s->n_writes || s->writes[wid - 1].shard != shard || !pos[wid - 1])) {
				sim_fail(s, "read of register %u returned write %zu, which was never applied there", shard, wid);
				rc = -1;
				break;
			}
			/* a map read returned the map as of the write it saw */
			if (shard == SIM_MAP_REG &&
			    rd->map_hash != (wid ? s->map_at[s->writes[wid - 1].log_index].hash : s->map0_hash)) {
				sim_fail(s, "map read at node %llu (ctx %llx) returned a map that no node held after write %zu",
					 (unsigned long long)rd->node, (unsigned long long)rd->ctx, wid);
				rc = -1;
				break;
			}
			lr[nr].inv = rd->inv;
			lr[nr].resp = rd->resp;
			lr[nr].saw = wid ? pos[wid - 1] : 0;
			read_of[nr++] = i;
		}
		if (rc)
			break;
		if (sim_lin_check(lw, nw, lr, nr, &bad)) {
			const struct read_op *rd = bad < nr ? &s->reads[read_of[bad]] : NULL;

			if (rd)
				sim_fail(s, "not linearisable: register %u read at node %llu (ctx %llx, index %llu, events %llu..%llu) returned write %llu, "
					 "the %zu-th write in log order",
					 shard, (unsigned long long)rd->node, (unsigned long long)rd->ctx,
					 (unsigned long long)rd->wait_index, (unsigned long long)rd->inv,
					 (unsigned long long)rd->resp, (unsigned long long)(rd->value - 1), lr[bad].saw);
			else
				sim_fail(s, "not linearisable: register %u writes cannot be ordered", shard);
			rc = -1;
		}
		for (size_t k = 0; k < nw; k++)
			pos[order[k] - s->writes] = 0;
	}
	free(order);
	free(lw);
	free(lr);
	free(pos);
	free(read_of);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* random scenarios */

static unsigned live_nodes(struct sim *s, uint64_t *ids)
{
	unsigned n = 0;

	for (uint64_t id = 1; id <= s->n_ids; id++)
		if (s->nodes[id].r)
			ids[n++] = id;
	return n;
}

static uint64_t random_live(struct sim *s)
{
	uint64_t ids[SIM_CAP_IDS];
	unsigned n = live_nodes(s, ids);

	return n ? ids[rnd_below(s, n)] : 0;
}

static void partition_random(struct sim *s)
{
	bool side[SIM_CAP_IDS + 1];

	sim_heal(s);
	for (uint64_t id = 1; id <= s->n_ids; id++)
		side[id] = rnd_below(s, 2);
	for (uint64_t a = 1; a <= s->n_ids; a++)
		for (uint64_t b = 1; b <= s->n_ids; b++)
			s->cut[a][b] = side[a] != side[b];
}

enum phase_kind {
	PHASE_CALM,
	PHASE_LOSSY,
	PHASE_PARTITION,
	PHASE_ISOLATE_LEADER,
	PHASE_ONE_WAY,
	PHASE_FLAPPING,
	PHASE_PAUSE,
	PHASE_CRASHY,
	PHASE_CHURN,
	PHASE_KINDS,
};

static const char *const phase_names[] = {
	"calm", "lossy", "partition", "isolate-leader", "one-way", "flapping", "pause", "crashy", "churn",
};

static void set_isolated(struct sim *s, uint64_t id, bool cut)
{
	for (uint64_t i = 1; i <= s->n_ids; i++)
		if (i != id && !(s->nodes[i].isolated_until && !cut)) {
			s->cut[id][i] = cut;
			s->cut[i][id] = cut;
		}
}

/* Leaders that barely get to send anything before they are cut off or
 * crash: entries of many terms end up half replicated, the ground for the
 * Figure 8 scenario of the Raft paper. */
static void churn(struct sim *s, unsigned window)
{
	uint64_t l = sim_leader(s);

	for (uint64_t id = 1; id <= s->n_ids; id++)
		if (s->nodes[id].isolated_until && s->nodes[id].isolated_until <= s->now) {
			s->nodes[id].isolated_until = 0;
			set_isolated(s, id, false);
		}
	if (!l || s->nodes[l].isolated_until || s->now - s->nodes[l].leader_since < window)
		return;
	if (rnd_below(s, 3) == 0) {
		s->nodes[l].down_until = s->now + SIM_TICK_UNITS * (1 + rnd_below(s, 3 * s->cfg.election_ticks));
		sim_crash(s, l);
	} else {
		s->nodes[l].isolated_until = s->now + SIM_TICK_UNITS * (2 + rnd_below(s, 2 * s->cfg.election_ticks));
		set_isolated(s, l, true);
		trace(s, "node %llu cut off until %llu", (unsigned long long)l,
		      (unsigned long long)s->nodes[l].isolated_until);
	}
}

static enum phase_kind new_phase(struct sim *s)
{
	enum phase_kind k = rnd_below(s, 4) == 0 ? PHASE_CHURN : (enum phase_kind)rnd_below(s, PHASE_CHURN);
	uint64_t victim;

	sim_heal(s);
	for (uint64_t id = 1; id <= s->n_ids; id++)
		s->nodes[id].isolated_until = 0;
	s->loss_pm = 0;
	s->dup_pm = 0;
	s->min_delay = 1;
	s->max_delay = 3;
	s->crash_pm = 300;
	/* any phase may also be lossy and reordering */
	if (rnd_below(s, 3) == 0 || k == PHASE_LOSSY) {
		s->loss_pm = (unsigned)(20000 + rnd_below(s, 250000));
		s->dup_pm = (unsigned)rnd_below(s, 80000);
		s->max_delay = (unsigned)(2 + rnd_below(s, 6 * SIM_TICK_UNITS));
	}
	switch (k) {
	case PHASE_PARTITION:
		partition_random(s);
		break;
	case PHASE_ISOLATE_LEADER:
		victim = sim_leader(s);
		if (victim)
			sim_isolate(s, victim);
		break;
	case PHASE_ONE_WAY:
		for (unsigned i = 0, n = 1 + (unsigned)rnd_below(s, 3); i < n; i++) {
			uint64_t a = 1 + rnd_below(s, s->n_ids), b = 1 + rnd_below(s, s->n_ids);

			if (rnd_below(s, 2) && sim_leader(s))
				a = sim_leader(s);
			s->cut[a][b] = true;
		}
		break;
	case PHASE_PAUSE:
		victim = rnd_below(s, 2) ? sim_leader(s) : random_live(s);
		if (victim) {
			s->nodes[victim].paused_until =
				s->now + SIM_TICK_UNITS * (s->cfg.election_ticks * 3 / 2 +
							   rnd_below(s, 2 * s->cfg.election_ticks));
			trace(s, "node %llu pauses until %llu", (unsigned long long)victim,
			      (unsigned long long)s->nodes[victim].paused_until);
		}
		break;
	case PHASE_CRASHY:
		s->crash_pm = 15000;
		break;
	default:
		break;
	}
	trace(s, "phase %s loss %u dup %u delay %u..%u", phase_names[k], s->loss_pm, s->dup_pm, s->min_delay,
	      s->max_delay);
	return k;
}

static void random_admin(struct sim *s)
{
	uint64_t l = sim_leader(s), target = 0;
	struct rps__raft_status st;
	unsigned choice = (unsigned)rnd_below(s, 10);
	int err;

	if (!l)
		return;
	sim_status(s, l, &st);
	if (choice < 3) {
		/* a new learner, on a fresh id */
		for (uint64_t id = 1; id <= s->n_ids; id++)
			if (!s->nodes[id].incarnation && !s->nodes[id].bootstrap) {
				target = id;
				break;
			}
		if (!target || st.conf.n_voters + st.conf.n_learners >= 6)
			return;
		err = sim_conf_change(s, l, rnd_below(s, 5) ? RPS__RAFT_CONF_ADD_LEARNER : RPS__RAFT_CONF_ADD_VOTER,
				      target);
		if (!err) {
			trace(s, "leader %llu adds node %llu", (unsigned long long)l, (unsigned long long)target);
			sim_start_joiner(s, target);
			s->stats.conf_changes++;
		}
	} else if (choice < 6) {
		if (!st.conf.n_learners)
			return;
		target = st.conf.learners[rnd_below(s, st.conf.n_learners)];
		if (rnd_below(s, 4) == 0) {
			if (!sim_conf_change(s, l, RPS__RAFT_CONF_REMOVE, target)) {
				trace(s, "leader %llu removes learner %llu", (unsigned long long)l, (unsigned long long)target);
				s->stats.conf_changes++;
			}
		} else if (!sim_conf_change(s, l, RPS__RAFT_CONF_PROMOTE, target)) {
			trace(s, "leader %llu promotes %llu", (unsigned long long)l, (unsigned long long)target);
			s->stats.conf_changes++;
		}
	} else if (choice < 8) {
		if (st.conf.n_voters <= 3)
			return;
		target = st.conf.voters[rnd_below(s, st.conf.n_voters)];
		if (target != l && !sim_conf_change(s, l, RPS__RAFT_CONF_REMOVE, target)) {
			trace(s, "leader %llu removes voter %llu", (unsigned long long)l, (unsigned long long)target);
			s->stats.conf_changes++;
		}
	} else {
		target = st.conf.voters[rnd_below(s, st.conf.n_voters)];
		if (target != l && !sim_transfer(s, l, target)) {
			trace(s, "leader %llu transfers to %llu", (unsigned long long)l, (unsigned long long)target);
			s->stats.transfers++;
		}
	}
}

static uint64_t map_member(struct sim *s, const struct rps__smap *m)
{
	if (rnd_below(s, 10) == 0)
		return rnd_below(s, m->max_id + 3);	/* 0, a stranger or a removed member */
	return m->members[rnd_below(s, m->nmembers)].id;
}

/* Mostly a partition with a move, a seeding or a loss under way (busy
 * returns the member concerned), from a random start; else part. */
static uint32_t busy_part(struct sim *s, const struct rps__smap *m, uint32_t part,
			  uint64_t (*busy)(const struct rps__smap_part *p))
{
	if (rnd_below(s, 5) == 0)
		return part;
	for (uint32_t k = 0; k < m->npart; k++)
		if (busy(&m->parts[(part + k) % m->npart]))
			return (part + k) % m->npart;
	return part;
}

static uint64_t part_moving(const struct rps__smap_part *p)
{
	return p->moving_to;
}

static uint64_t part_joining(const struct rps__smap_part *p)
{
	return p->joining;
}

static uint64_t part_lost(const struct rps__smap_part *p)
{
	return p->lost;
}

/* Mostly a member that holds nothing (one REMOVE_MEMBER accepts). */
static uint64_t idle_member(struct sim *s, const struct rps__smap *m)
{
	uint32_t start = (uint32_t)rnd_below(s, m->nmembers);

	for (uint32_t i = 0; i < m->nmembers && (i || rnd_below(s, 5)); i++) {
		uint64_t id = m->members[(start + i) % m->nmembers].id;
		bool busy = rps__smap_owned(m, id) || rps__smap_backed(m, id);

		for (uint32_t p = 0; p < m->npart && !busy; p++)
			busy = m->parts[p].moving_to == id || m->parts[p].joining == id;
		if (!busy)
			return id;
	}
	return map_member(s, m);
}

/* A map command that a proposer looking at m would send, or one that is
 * wrong in some way (stale epoch, wrong member, unknown partition or type):
 * every type, weighted to failover, replica sets, moves and removals. */
static void random_map_cmd(struct sim *s, const struct rps__smap *m, struct rps__smap_cmd *c)
{
	static const char *const zones[] = { "", "a", "b", "c", "no space" };
	unsigned t = (unsigned)rnd_below(s, 100);
	uint32_t part = (uint32_t)rnd_below(s, m->npart), nb;
	const struct rps__smap_part *p;
	uint64_t backup;

	if (m->nmembers - rps__smap_nwitnesses(m) < 4 && rnd_below(s, 2))
		t = 85;		/* keep the cluster from dwindling */
	if ((t >= 33 && t < 46) || (t >= 70 && t < 79) || (t >= 93 && t < 95))
		part = busy_part(s, m, part, t < 46 ? part_joining : t < 79 ? part_moving : part_lost);
	p = &m->parts[part];
	nb = rps__smap_nbackups(m, part);
	backup = nb && rnd_below(s, 6) ? p->backups[rnd_below(s, nb)] : map_member(s, m);
	memset(c, 0, sizeof(*c));
	c->part = rnd_below(s, 30) ? part : m->npart + (uint32_t)rnd_below(s, 3);
	c->epoch = rnd_below(s, 8) ? p->epoch : p->epoch + rnd_below(s, 3) - 1;
	if (t < 22) {
		c->type = RPS__SMAP_FAILOVER;
		c->from = rnd_below(s, 8) ? p->owner : map_member(s, m);
		c->to = backup;
		for (uint32_t k = 0; k < nb; k++)
			if (p->backups[k] != c->to && rnd_below(s, 3))
				c->keep[c->nkeep++] = p->backups[k];
		if (c->nkeep < RPS__SMAP_MAX_REPLICAS - 1 && rnd_below(s, 20) == 0)
			c->keep[c->nkeep++] = map_member(s, m);
	} else if (t < 33) {
		c->type = RPS__SMAP_REPLICA_BEGIN;
		c->to = rnd_below(s, 4) ? rps__smap_pick_backup(m, part, NULL, NULL) : map_member(s, m);
	} else if (t < 42) {
		c->type = RPS__SMAP_REPLICA_COMMIT;
		c->to = p->joining && rnd_below(s, 5) ? p->joining : map_member(s, m);
	} else if (t < 46) {
		c->type = RPS__SMAP_REPLICA_ABORT;
	} else if (t < 54) {
		c->type = RPS__SMAP_REPLICA_DROP;
		c->id = backup;
	} else if (t < 58) {
		c->type = RPS__SMAP_SET_REPLICAS;
		c->id = rnd_below(s, 5);
	} else if (t < 62) {
		c->type = RPS__SMAP_SET_ZONE;
		c->id = map_member(s, m);
		strcpy(c->zone, zones[rnd_below(s, RPS__ARRAY_SIZE(zones))]);
	} else if (t < 70) {
		c->type = RPS__SMAP_MOVE_BEGIN;
		c->from = rnd_below(s, 8) ? p->owner : map_member(s, m);
		c->to = map_member(s, m);
	} else if (t < 76) {
		c->type = RPS__SMAP_MOVE_COMMIT;
		c->to = p->moving_to && rnd_below(s, 5) ? p->moving_to : map_member(s, m);
	} else if (t < 79) {
		c->type = RPS__SMAP_MOVE_ABORT;
	} else if (t < 84) {
		c->type = RPS__SMAP_FORCE_REMOVE;
		c->id = map_member(s, m);
	} else if (t < 90) {
		c->type = RPS__SMAP_ADD_MEMBER;
		c->id = rnd_below(s, 6) ? m->max_id + 1 : map_member(s, m);
		snprintf(c->uri, sizeof(c->uri), "tcp://10.0.1.%u:7000", (unsigned)rnd_below(s, 24));
	} else if (t < 91) {
		c->type = RPS__SMAP_REMOVE_MEMBER;
		c->id = idle_member(s, m);
	} else if (t < 93) {
		c->type = RPS__SMAP_MARK_LOST;
		c->from = p->owner;
	} else if (t < 95) {
		c->type = RPS__SMAP_CLEAR_LOST;
	} else if (t < 96) {
		c->type = RPS__SMAP_SET_WITNESS;
		c->id = map_member(s, m);
	} else if (t < 97) {
		c->type = RPS__SMAP_NOP;
	} else {
		/* encodes, but no node can decode it */
		c->type = rnd_below(s, 2) ? 0 : RPS__SMAP_CMD_LAST + 1 + (uint32_t)rnd_below(s, 3);
	}
}

/* A client next to a random node: writes go to the node it believes leads. */
static void random_client(struct sim *s)
{
	uint64_t id = random_live(s), ctx;
	uint32_t shard = (uint32_t)rnd_below(s, SIM_SHARDS);

	if (!id || s->nodes[id].paused_until > s->now)
		return;
	if (rnd_below(s, 2)) {
		uint64_t lead = rps__raft_leader(s->nodes[id].r);

		if (lead && lead <= s->n_ids && s->nodes[lead].r && s->nodes[lead].paused_until <= s->now)
			id = lead;
		sim_write(s, id, shard, 1 + rnd_below(s, 1000));
	} else {
		sim_read(s, id, shard, &ctx);
	}
}

/* The same for the shard map: a command made from the map of the node the
 * client is next to (maybe behind: stale commands are refused alike
 * everywhere), or a read of the whole map. */
static void random_map_client(struct sim *s)
{
	uint64_t id = random_live(s), ctx;

	if (!id || s->nodes[id].paused_until > s->now)
		return;
	if (rnd_below(s, 2)) {
		uint64_t lead = rps__raft_leader(s->nodes[id].r);
		struct rps__smap_cmd c;

		random_map_cmd(s, &s->nodes[id].map, &c);
		if (lead && lead <= s->n_ids && s->nodes[lead].r && s->nodes[lead].paused_until <= s->now)
			id = lead;
		sim_map_write(s, id, &c);
	} else {
		sim_map_read(s, id, &ctx);
	}
}

/* One unit of time: ticks, deliveries, node restarts and shutdowns. */
static void run_unit(struct sim *s)
{
	s->now++;
	for (uint64_t id = 1; id <= s->n_ids; id++) {
		struct sim_node *n = &s->nodes[id];

		if (n->destroy_at && n->destroy_at <= s->now)
			destroy_node(s, n);
		if (n->exists && !n->r && n->down_until <= s->now)
			sim_restart(s, id);
	}
	if (s->now % SIM_TICK_UNITS == 0) {
		s->stats.ticks++;
		for (uint64_t id = 1; id <= s->n_ids; id++)
			if (s->nodes[id].r && s->nodes[id].paused_until <= s->now)
				sim_tick(s, id, 1);
	}
	deliver_due(s);
}

/* After the faults: does the cluster converge and serve reads? */
static int check_liveness(struct sim *s)
{
	unsigned limit = 30 * s->cfg.election_ticks;

	s->loss_pm = s->dup_pm = s->crash_pm = 0;
	s->min_delay = 1;
	s->max_delay = 2;
	sim_heal(s);
	for (uint64_t id = 1; id <= s->n_ids; id++) {
		s->nodes[id].paused_until = 0;
		s->nodes[id].isolated_until = 0;
		if (s->nodes[id].destroy_at)
			destroy_node(s, &s->nodes[id]);
		s->nodes[id].down_until = 0;
	}
	for (unsigned t = 0; t < limit && !s->failed; t++) {
		uint64_t l = sim_leader(s);
		struct rps__raft_status ls;
		bool converged = true;

		for (unsigned u = 0; u < SIM_TICK_UNITS; u++)
			run_unit(s);
		if (!l)
			continue;
		sim_status(s, l, &ls);
		if (ls.commit != ls.last_index || ls.lead_transferee)
			continue;
		for (uint32_t i = 0; i < ls.conf.n_voters + ls.conf.n_learners; i++) {
			uint64_t id = i < ls.conf.n_voters ? ls.conf.voters[i] : ls.conf.learners[i - ls.conf.n_voters];
			struct rps__raft_status st;

			sim_status(s, id, &st);
			if (!s->nodes[id].r || st.term != ls.term || s->nodes[id].applied != ls.commit)
				converged = false;
		}
		if (!converged)
			continue;
		/* every member serves a linearisable read */
		{
			uint64_t ctx[RPS__RAFT_MAX_NODES];
			uint32_t n = ls.conf.n_voters + ls.conf.n_learners;
			bool all = true;

			for (uint32_t i = 0; i < n; i++) {
				uint64_t id = i < ls.conf.n_voters ? ls.conf.voters[i] : ls.conf.learners[i - ls.conf.n_voters];

				ctx[i] = 0;
				if (sim_read(s, id, 0, &ctx[i]))
					all = false;
			}
			for (unsigned u = 0; u < 8 * SIM_TICK_UNITS; u++)
				run_unit(s);
			for (uint32_t i = 0; i < n; i++)
				if (!ctx[i] || !sim_read_result(s, ctx[i]))
					all = false;
			if (all)
				return 0;
		}
	}
	if (!s->failed)
		sim_fail(s, "liveness: no converged leader serving reads %u ticks after healing (leader %llu)", limit,
			 (unsigned long long)sim_leader(s));
	return -1;
}

int sim_run_random(uint64_t seed, unsigned trace_on, struct sim_run_stats *stats, char *err, size_t errlen)
{
	return sim_run_random_fault(seed, SIM_FAULT_NONE, trace_on, stats, err, errlen);
}

int sim_run_random_fault(uint64_t seed, enum sim_map_fault fault, unsigned trace_on, struct sim_run_stats *stats,
			 char *err, size_t errlen)
{
	struct sim_config cfg;
	struct sim *s;
	uint64_t rng = seed * 0x2545f4914f6cdd1dull + 1;
	unsigned fault_ticks, phase_end = 0;
	enum phase_kind phase = PHASE_CALM;
	unsigned churn_window = 0;
	int rc;

	/* the scenario's shape comes from the seed too */
	memset(&cfg, 0, sizeof(cfg));
	cfg.seed = seed;
	cfg.n_voters = 3 + (unsigned)((rng >> 8) % 3);
	cfg.election_ticks = 10;
	cfg.heartbeat_ticks = 1 + (unsigned)((rng >> 16) % 3);
	cfg.pre_vote = (rng >> 20) % 4 != 0;
	cfg.check_quorum = (rng >> 24) % 4 != 0;
	cfg.max_inflight = 1 + (unsigned)((rng >> 28) % 6);
	/* single-entry appends split an old entry from the new leader's
	 * no-op: the ground for the Figure 8 scenario */
	cfg.max_entries = (rng >> 32) % 3 == 0 ? 1 : 2 + (unsigned)((rng >> 34) % 4);
	cfg.map_replicas = 2 + (unsigned)((rng >> 56) % 2);
	s = sim_new(&cfg);
	if (!s)
		return -ENOMEM;
	s->fault = fault;
	s->trace = trace_on;
	s->random_mode = true;
	s->compact_every = 4 + (unsigned)((rng >> 40) % 40);
	fault_ticks = 150 + (unsigned)((rng >> 48) % 200);
	trace(s, "seed %llu: %u voters, heartbeat %u, pre_vote %d, check_quorum %d, inflight %u, entries %u, compact every %u, map R %u",
	      (unsigned long long)seed, cfg.n_voters, cfg.heartbeat_ticks, cfg.pre_vote, cfg.check_quorum,
	      cfg.max_inflight, cfg.max_entries, s->compact_every, cfg.map_replicas);

	for (unsigned t = 0; t < fault_ticks && !s->failed; t++) {
		if (t >= phase_end) {
			phase = new_phase(s);
			phase_end = t + 10 + (unsigned)rnd_below(s, 60);
			churn_window = (unsigned)rnd_below(s, 3 * SIM_TICK_UNITS);
		}
		if (phase == PHASE_FLAPPING && rnd_below(s, 4) == 0) {
			if (rnd_below(s, 2))
				partition_random(s);
			else
				sim_heal(s);
		}
		for (unsigned u = 0; u < SIM_TICK_UNITS && !s->failed; u++) {
			run_unit(s);
			if (phase == PHASE_CHURN)
				churn(s, churn_window);
			if (chance(s, 120000))
				random_client(s);
			if (chance(s, 120000))
				random_client(s);
			if (chance(s, 120000))
				random_map_client(s);
			if (chance(s, 4000)) {
				/* sometimes a burst: only the first may pass */
				for (unsigned k = rnd_below(s, 3) ? 1 : 3; k > 0; k--)
					random_admin(s);
			}
			if (chance(s, 1500)) {
				uint64_t victim = random_live(s);

				if (victim) {
					s->nodes[victim].down_until =
						s->now + SIM_TICK_UNITS * rnd_below(s, 4 * s->cfg.election_ticks);
					sim_crash(s, victim);
				}
			}
		}
	}
	if (!s->failed)
		check_liveness(s);
	if (!s->failed)
		sim_check_linearizable(s);
	rc = s->failed ? -1 : 0;
	if (rc && err)
		snprintf(err, errlen, "%s", s->err);
	s->stats.nodes = 0;
	for (uint64_t id = 1; id <= s->n_ids; id++)
		s->stats.nodes += s->nodes[id].incarnation > 0;
	if (stats)
		*stats = s->stats;
	sim_free(s);
	return rc;
}
