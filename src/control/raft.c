/*
 * raft.c - the Raft consensus core (see raft.h for the contract).
 *
 * The structure follows etcd-raft: one step function per role behind a
 * common term check, progress tracking per follower (probe / replicate /
 * snapshot with an in-flight window), a ready/advance batch for the
 * application.  Differences, each for a reason:
 *  - the core keeps the whole (compacted) log in memory, so there is no
 *    Storage interface: the control-plane log is small and a restart hands it
 *    back in rps__raft_persisted;
 *  - membership changes take effect when appended (Raft thesis 4.1), which is
 *    what makes single-server changes safe; etcd applies them on commit and
 *    needs joint consensus for safety;
 *  - a leader that cannot reach a follower with a snapshot retries after an
 *    election timeout instead of waiting for a ReportSnapshot call.
 *
 * Allocation failures deep inside a step leave the core half-updated, so the
 * core then refuses every further call (the sticky r->broken): the caller
 * frees it and restarts from what it persisted, which is always safe.
 */
#include "config.h"
#include "control/raft.h"
#include "common/common.h"
#include "common/le.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define READS_MAX 256u		/* pending ReadIndex requests at a leader */
/* Every campaign increments the term: a term that cannot be incremented is
 * refused wherever it comes from, so no node ever persists a term its next
 * campaign would wrap to 0 (which the log then refuses, on every restart). */
#define TERM_MAX (UINT64_MAX - 1)
/* No real log gets near this; above it index arithmetic could wrap. */
#define INDEX_MAX (UINT64_MAX >> 1)

/* ------------------------------------------------------------------------ */
/* in-flight window of a follower in replicate state: the last index of each
 * append message not yet acknowledged */

struct inflights {
	uint64_t *buf;
	unsigned start;
	unsigned count;
	unsigned cap;
};

static bool inflights_full(const struct inflights *in)
{
	return in->count == in->cap;
}

static void inflights_add(struct inflights *in, uint64_t last)
{
	in->buf[(in->start + in->count) % in->cap] = last;
	in->count++;
}

static void inflights_free_le(struct inflights *in, uint64_t to)
{
	while (in->count && in->buf[in->start] <= to) {
		in->start = (in->start + 1) % in->cap;
		in->count--;
	}
}

static void inflights_free_first(struct inflights *in)
{
	if (in->count)
		inflights_free_le(in, in->buf[in->start]);
}

static void inflights_reset(struct inflights *in)
{
	in->start = 0;
	in->count = 0;
}

/* ------------------------------------------------------------------------ */

struct progress {
	uint64_t id;
	uint64_t match;
	uint64_t next;
	enum rps__raft_progress_state state;
	bool probe_sent;		/* probe: wait for an answer before the next append */
	bool recent_active;		/* heard from it since the last quorum check */
	bool is_learner;
	uint64_t pending_snapshot;
	unsigned snapshot_ticks;	/* how long the snapshot has been on its way */
	struct inflights ins;
};

struct read_request {
	uint64_t ctx;
	uint64_t index;			/* commit index when the read arrived */
	uint64_t from;
	unsigned n_acks;
	uint64_t acks[RPS__RAFT_MAX_NODES];
};

/* ents[i] holds index snap_index + 1 + i. */
struct raft_log {
	struct rps__raft_entry *ents;
	size_t n;
	size_t cap;
	uint64_t snap_index;
	uint64_t snap_term;
	uint64_t committed;
	uint64_t applied;		/* handed out to apply (and acknowledged) */
	uint64_t unstable;		/* first index not yet handed out to persist */
};

struct rps__raft {
	uint64_t id;
	struct rps__raft_config cfg;
	int broken;			/* sticky negative errno, see the top comment */

	enum rps__raft_role role;
	uint64_t term;
	uint64_t vote;
	uint64_t lead;
	uint64_t lead_transferee;
	unsigned election_elapsed;
	unsigned heartbeat_elapsed;
	unsigned randomized_timeout;
	uint64_t rng;

	struct raft_log log;
	struct rps__raft_snapshot snap;	/* latest snapshot, data owned */
	bool snap_pending;		/* received from the leader, not yet handed out */

	struct rps__raft_conf_state conf;	/* in force: the latest in the log */
	uint64_t conf_index;		/* index of that entry, 0 if from the snapshot */

	struct progress prs[RPS__RAFT_MAX_NODES];
	unsigned n_prs;
	uint64_t *inflight_pool;

	unsigned n_votes;
	uint64_t vote_from[RPS__RAFT_MAX_NODES];
	bool vote_granted[RPS__RAFT_MAX_NODES];

	struct read_request *reads;
	unsigned n_reads;

	struct rps__raft_msg *msgs;
	size_t n_msgs;
	size_t cap_msgs;
	struct rps__raft_read_state *read_states;
	size_t n_read_states;
	size_t cap_read_states;

	struct rps__raft_hard_state prev_hs;	/* persisted, as far as we know */
	bool ready_out;
	struct rps__raft_hard_state ready_hs;
	uint64_t ready_last_index;
	uint64_t ready_applied_to;

	uint64_t refused;		/* messages dropped by refuse_reason() */
};

static void become_follower(struct rps__raft *r, uint64_t term, uint64_t lead);

static void fail(struct rps__raft *r, int err)
{
	if (!r->broken)
		r->broken = err;
}

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64: good enough to spread election timeouts, and seedable */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ------------------------------------------------------------------------ */
/* configuration */

static bool id_in(const uint64_t *ids, uint32_t n, uint64_t id)
{
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

static void id_remove(uint64_t *ids, uint32_t *n, uint64_t id)
{
	for (uint32_t i = 0; i < *n; i++)
		if (ids[i] == id) {
			memmove(&ids[i], &ids[i + 1], (*n - i - 1) * sizeof(*ids));
			(*n)--;
			return;
		}
}

bool rps__raft_conf_is_voter(const struct rps__raft_conf_state *cs, uint64_t id)
{
	return id_in(cs->voters, cs->n_voters, id);
}

bool rps__raft_conf_is_learner(const struct rps__raft_conf_state *cs, uint64_t id)
{
	return id_in(cs->learners, cs->n_learners, id);
}

static bool conf_has_room(const struct rps__raft_conf_state *cs)
{
	return cs->n_voters + cs->n_learners < RPS__RAFT_MAX_NODES;
}

/* Total and deterministic: every node applies the same entry the same way,
 * whatever it contains (proposals were validated at the leader). */
static void conf_apply(struct rps__raft_conf_state *cs, enum rps__raft_conf_op op, uint64_t id)
{
	bool voter = rps__raft_conf_is_voter(cs, id), learner = rps__raft_conf_is_learner(cs, id);

	if (id == RPS__RAFT_NONE)
		return;
	switch (op) {
	case RPS__RAFT_CONF_ADD_VOTER:
		if (voter)
			return;
		if (learner)
			id_remove(cs->learners, &cs->n_learners, id);
		else if (!conf_has_room(cs))
			return;
		cs->voters[cs->n_voters++] = id;
		return;
	case RPS__RAFT_CONF_ADD_LEARNER:
		if (voter || learner || !conf_has_room(cs))
			return;
		cs->learners[cs->n_learners++] = id;
		return;
	case RPS__RAFT_CONF_PROMOTE:
		if (!learner)
			return;
		id_remove(cs->learners, &cs->n_learners, id);
		cs->voters[cs->n_voters++] = id;
		return;
	case RPS__RAFT_CONF_REMOVE:
		id_remove(cs->voters, &cs->n_voters, id);
		id_remove(cs->learners, &cs->n_learners, id);
		return;
	}
}

#define CONF_DATA_LEN 9u	/* u8 op, u64 node */

int rps__raft_conf_change_decode(const struct rps__raft_entry *e, enum rps__raft_conf_op *op,
				 uint64_t *node)
{
	const uint8_t *p = e->data;

	if (e->type != RPS__RAFT_ENTRY_CONF || e->len != CONF_DATA_LEN || p[0] < RPS__RAFT_CONF_ADD_VOTER ||
	    p[0] > RPS__RAFT_CONF_REMOVE)
		return -EINVAL;
	*op = (enum rps__raft_conf_op)p[0];
	*node = rps__le_get64(p + 1);
	return 0;
}

static void conf_apply_entry(struct rps__raft_conf_state *cs, const struct rps__raft_entry *e)
{
	enum rps__raft_conf_op op;
	uint64_t node;

	if (rps__raft_conf_change_decode(e, &op, &node) == 0)
		conf_apply(cs, op, node);
}

static unsigned quorum(const struct rps__raft *r)
{
	return r->conf.n_voters / 2 + 1;
}

static bool promotable(const struct rps__raft *r)
{
	return rps__raft_conf_is_voter(&r->conf, r->id);
}

/* ------------------------------------------------------------------------ */
/* log */

static uint64_t log_last(const struct raft_log *l)
{
	return l->snap_index + l->n;
}

static bool log_term(const struct raft_log *l, uint64_t i, uint64_t *t)
{
	if (i == l->snap_index) {
		*t = l->snap_term;
		return true;
	}
	if (i < l->snap_index || i > log_last(l))
		return false;
	*t = l->ents[i - l->snap_index - 1].term;
	return true;
}

static uint64_t log_term_or0(const struct raft_log *l, uint64_t i)
{
	uint64_t t;

	return log_term(l, i, &t) ? t : 0;
}

static uint64_t log_last_term(const struct raft_log *l)
{
	return log_term_or0(l, log_last(l));
}

static bool log_match_term(const struct raft_log *l, uint64_t i, uint64_t t)
{
	uint64_t x;

	return log_term(l, i, &x) && x == t;
}

/* i in (snap_index, last] */
static struct rps__raft_entry *log_entry(const struct raft_log *l, uint64_t i)
{
	return &l->ents[i - l->snap_index - 1];
}

static bool log_up_to_date(const struct raft_log *l, uint64_t last_index, uint64_t last_term)
{
	uint64_t my_term = log_last_term(l);

	return last_term > my_term || (last_term == my_term && last_index >= log_last(l));
}

/* The largest index <= index whose term is <= term: all entries after it
 * conflict with a log whose entry at index has that term.  An index we no
 * longer know (compacted) may match, so it is returned as is. */
static uint64_t log_find_conflict_by_term(const struct raft_log *l, uint64_t index, uint64_t term,
					  uint64_t *found_term)
{
	uint64_t t;

	for (; index > 0; index--) {
		if (!log_term(l, index, &t)) {
			*found_term = 0;
			return index;
		}
		if (t <= term) {
			*found_term = t;
			return index;
		}
	}
	*found_term = 0;
	return 0;
}

static int log_append(struct raft_log *l, const struct rps__raft_entry *src)
{
	struct rps__raft_entry *e;
	void *data = NULL;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct rps__raft_entry *ents = realloc(l->ents, cap * sizeof(*ents));

		if (!ents)
			return -ENOMEM;
		l->ents = ents;
		l->cap = cap;
	}
	if (src->len) {
		data = malloc(src->len);
		if (!data)
			return -ENOMEM;
		memcpy(data, src->data, src->len);
	}
	e = &l->ents[l->n++];
	*e = *src;
	e->index = log_last(l);
	e->data = data;
	return 0;
}

/* Drop entries >= from. */
static void log_truncate(struct raft_log *l, uint64_t from)
{
	while (log_last(l) >= from && l->n) {
		free((void *)l->ents[l->n - 1].data);
		l->n--;
	}
	if (l->unstable > from)
		l->unstable = from;
}

/* Drop entries <= index, which becomes the snapshot point. */
static void log_compact(struct raft_log *l, uint64_t index, uint64_t term)
{
	size_t drop = (size_t)(index - l->snap_index);

	if (drop > l->n)
		drop = l->n;
	for (size_t i = 0; i < drop; i++)
		free((void *)l->ents[i].data);
	memmove(l->ents, l->ents + drop, (l->n - drop) * sizeof(*l->ents));
	l->n -= drop;
	l->snap_index = index;
	l->snap_term = term;
	if (l->unstable <= index)
		l->unstable = index + 1;
}

static void log_free(struct raft_log *l)
{
	log_truncate(l, l->snap_index + 1);
	free(l->ents);
	l->ents = NULL;
	l->cap = 0;
}

/* ------------------------------------------------------------------------ */
/* outgoing messages and read states */

static struct rps__raft_msg *msg_push(struct rps__raft *r, uint8_t type, uint64_t to)
{
	struct rps__raft_msg *m;

	if (r->n_msgs == r->cap_msgs) {
		size_t cap = r->cap_msgs ? 2 * r->cap_msgs : 16;
		struct rps__raft_msg *msgs = realloc(r->msgs, cap * sizeof(*msgs));

		if (!msgs) {
			fail(r, -ENOMEM);
			return NULL;
		}
		r->msgs = msgs;
		r->cap_msgs = cap;
	}
	m = &r->msgs[r->n_msgs++];
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->to = to;
	m->from = r->id;
	m->term = r->term;
	return m;
}

/* Copy entries [lo, hi] into one block owned by the message: the log may
 * change before the application sends it. */
static int msg_attach_entries(struct rps__raft *r, struct rps__raft_msg *m, uint64_t lo, uint64_t hi)
{
	size_t n = (size_t)(hi - lo + 1), data = 0, off;
	struct rps__raft_entry *ents;
	uint8_t *block;

	for (uint64_t i = lo; i <= hi; i++)
		data += log_entry(&r->log, i)->len;
	block = malloc(n * sizeof(*ents) + data);
	if (!block) {
		r->n_msgs--;
		fail(r, -ENOMEM);
		return -ENOMEM;
	}
	ents = (struct rps__raft_entry *)(void *)block;
	off = n * sizeof(*ents);
	for (size_t k = 0; k < n; k++) {
		const struct rps__raft_entry *e = log_entry(&r->log, lo + k);

		ents[k] = *e;
		ents[k].data = block + off;
		if (e->len)
			memcpy(block + off, e->data, e->len);
		off += e->len;
	}
	m->owned = block;
	m->entries = ents;
	m->n_entries = (uint32_t)n;
	return 0;
}

static int msg_attach_snapshot(struct rps__raft *r, struct rps__raft_msg *m)
{
	struct rps__raft_snapshot *s;
	uint8_t *block = malloc(sizeof(*s) + r->snap.len);

	if (!block) {
		r->n_msgs--;
		fail(r, -ENOMEM);
		return -ENOMEM;
	}
	s = (struct rps__raft_snapshot *)(void *)block;
	*s = r->snap;
	s->data = block + sizeof(*s);
	if (r->snap.len)
		memcpy(block + sizeof(*s), r->snap.data, r->snap.len);
	m->owned = block;
	m->snapshot = s;
	return 0;
}

static void msgs_clear(struct rps__raft *r)
{
	for (size_t i = 0; i < r->n_msgs; i++)
		free(r->msgs[i].owned);
	r->n_msgs = 0;
}

static void read_state_push(struct rps__raft *r, uint64_t index, uint64_t ctx)
{
	if (r->n_read_states == r->cap_read_states) {
		size_t cap = r->cap_read_states ? 2 * r->cap_read_states : 8;
		struct rps__raft_read_state *rs = realloc(r->read_states, cap * sizeof(*rs));

		if (!rs) {
			fail(r, -ENOMEM);
			return;
		}
		r->read_states = rs;
		r->cap_read_states = cap;
	}
	r->read_states[r->n_read_states].index = index;
	r->read_states[r->n_read_states].ctx = ctx;
	r->n_read_states++;
}

/* ------------------------------------------------------------------------ */
/* progress of followers, kept in step with the configuration */

static struct progress *progress_find(struct rps__raft *r, uint64_t id)
{
	for (unsigned i = 0; i < r->n_prs; i++)
		if (r->prs[i].id == id)
			return &r->prs[i];
	return NULL;
}

static void pr_reset_state(struct progress *pr, enum rps__raft_progress_state state)
{
	pr->state = state;
	pr->probe_sent = false;
	pr->pending_snapshot = 0;
	pr->snapshot_ticks = 0;
	inflights_reset(&pr->ins);
}

static void pr_become_probe(struct progress *pr)
{
	/* After a snapshot was acknowledged, continue after it. */
	uint64_t after = pr->state == RPS__RAFT_PROGRESS_SNAPSHOT ? pr->pending_snapshot + 1 : 0;

	pr_reset_state(pr, RPS__RAFT_PROGRESS_PROBE);
	pr->next = RPS__MAX(pr->match + 1, after);
}

static void pr_become_replicate(struct progress *pr)
{
	pr_reset_state(pr, RPS__RAFT_PROGRESS_REPLICATE);
	pr->next = pr->match + 1;
}

static void pr_become_snapshot(struct progress *pr, uint64_t index)
{
	pr_reset_state(pr, RPS__RAFT_PROGRESS_SNAPSHOT);
	pr->pending_snapshot = index;
}

static bool pr_maybe_update(struct progress *pr, uint64_t n)
{
	bool updated = false;

	if (pr->match < n) {
		pr->match = n;
		pr->probe_sent = false;
		updated = true;
	}
	if (pr->next < n + 1)
		pr->next = n + 1;
	return updated;
}

/* A rejection of the append after `rejected`; match_hint: where the
 * follower's log may match.  False if the rejection is stale. */
static bool pr_maybe_decr_to(struct progress *pr, uint64_t rejected, uint64_t match_hint)
{
	if (pr->state == RPS__RAFT_PROGRESS_REPLICATE) {
		if (rejected <= pr->match)
			return false;
		pr->next = pr->match + 1;
		return true;
	}
	if (pr->next - 1 != rejected)
		return false;
	pr->next = RPS__MAX(RPS__MIN(rejected, match_hint + 1), pr->match + 1);
	pr->probe_sent = false;
	return true;
}

static bool pr_paused(const struct progress *pr)
{
	switch (pr->state) {
	case RPS__RAFT_PROGRESS_PROBE:
		return pr->probe_sent;
	case RPS__RAFT_PROGRESS_REPLICATE:
		return inflights_full(&pr->ins);
	case RPS__RAFT_PROGRESS_SNAPSHOT:
		return true;
	}
	return true;
}

static void progress_init(struct rps__raft *r, struct progress *pr, uint64_t id)
{
	uint64_t *buf = pr->ins.buf;	/* each slot keeps its window buffer */

	memset(pr, 0, sizeof(*pr));
	pr->ins.buf = buf;
	pr->ins.cap = r->cfg.max_inflight_msgs;
	pr->id = id;
	pr->next = log_last(&r->log) + 1;
	pr->state = RPS__RAFT_PROGRESS_PROBE;
	if (id == r->id)
		pr->match = log_last(&r->log);
}

static void progress_reset_all(struct rps__raft *r)
{
	for (unsigned i = 0; i < r->n_prs; i++) {
		bool learner = r->prs[i].is_learner;

		progress_init(r, &r->prs[i], r->prs[i].id);
		r->prs[i].is_learner = learner;
	}
}

static void send_timeout_now(struct rps__raft *r, uint64_t to)
{
	msg_push(r, RPS__RAFT_MSG_TIMEOUT_NOW, to);
}

/* The configuration changed: follow it with the progress set and the role. */
static void conf_changed(struct rps__raft *r)
{
	unsigned i = 0;

	while (i < r->n_prs) {
		struct progress *pr = &r->prs[i];

		if (!rps__raft_conf_is_voter(&r->conf, pr->id) && !rps__raft_conf_is_learner(&r->conf, pr->id)) {
			struct progress tmp = *pr;	/* swap, so the slot keeps its buffer */

			*pr = r->prs[r->n_prs - 1];
			r->prs[r->n_prs - 1] = tmp;
			r->n_prs--;
			continue;
		}
		pr->is_learner = rps__raft_conf_is_learner(&r->conf, pr->id);
		i++;
	}
	for (uint32_t k = 0; k < r->conf.n_voters + r->conf.n_learners; k++) {
		uint64_t id = k < r->conf.n_voters ? r->conf.voters[k] : r->conf.learners[k - r->conf.n_voters];

		if (!progress_find(r, id)) {
			struct progress *pr = &r->prs[r->n_prs++];

			progress_init(r, pr, id);
			pr->is_learner = rps__raft_conf_is_learner(&r->conf, id);
			/* a new member gets an election timeout to answer before
			 * CheckQuorum counts it */
			pr->recent_active = true;
		}
	}
	if (r->role == RPS__RAFT_LEADER) {
		if (r->lead_transferee != RPS__RAFT_NONE && !rps__raft_conf_is_voter(&r->conf, r->lead_transferee))
			r->lead_transferee = RPS__RAFT_NONE;
	} else if (r->role != RPS__RAFT_FOLLOWER && !promotable(r)) {
		become_follower(r, r->term, RPS__RAFT_NONE);
	}
}

/* Rebuild the configuration from the snapshot's and the log's conf entries,
 * after the log lost a suffix or was replaced. */
static void conf_recompute(struct rps__raft *r)
{
	r->conf = r->snap.conf;
	r->conf_index = 0;
	for (size_t i = 0; i < r->log.n; i++)
		if (r->log.ents[i].type == RPS__RAFT_ENTRY_CONF) {
			conf_apply_entry(&r->conf, &r->log.ents[i]);
			r->conf_index = r->log.ents[i].index;
		}
	conf_changed(r);
}

/* Append entries following the log, taking conf entries into force. */
static int append_entries(struct rps__raft *r, const struct rps__raft_entry *ents, size_t n)
{
	bool conf = false;

	for (size_t i = 0; i < n; i++) {
		int err = log_append(&r->log, &ents[i]);

		if (err) {
			fail(r, err);
			return err;
		}
		if (ents[i].type == RPS__RAFT_ENTRY_CONF) {
			conf_apply_entry(&r->conf, &ents[i]);
			r->conf_index = log_last(&r->log);
			conf = true;
		}
	}
	if (conf)
		conf_changed(r);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* roles */

static void reset_randomized_timeout(struct rps__raft *r)
{
	r->randomized_timeout = r->cfg.election_ticks +
				(unsigned)(rng_next(&r->rng) % r->cfg.election_ticks);
}

static void abort_transfer(struct rps__raft *r)
{
	r->lead_transferee = RPS__RAFT_NONE;
}

static void reset(struct rps__raft *r, uint64_t term)
{
	if (r->term != term) {
		r->term = term;
		r->vote = RPS__RAFT_NONE;
	}
	r->lead = RPS__RAFT_NONE;
	r->election_elapsed = 0;
	r->heartbeat_elapsed = 0;
	reset_randomized_timeout(r);
	abort_transfer(r);
	r->n_votes = 0;
	r->n_reads = 0;
	progress_reset_all(r);
}

static void become_follower(struct rps__raft *r, uint64_t term, uint64_t lead)
{
	reset(r, term);
	r->lead = lead;
	r->role = RPS__RAFT_FOLLOWER;
}

static void become_pre_candidate(struct rps__raft *r)
{
	/* neither the term nor the vote change: a failed PreVote leaves no trace */
	r->role = RPS__RAFT_PRE_CANDIDATE;
	r->n_votes = 0;
	r->lead = RPS__RAFT_NONE;
}

static void become_candidate(struct rps__raft *r)
{
	reset(r, r->term + 1);
	r->vote = r->id;
	r->role = RPS__RAFT_CANDIDATE;
}

static bool maybe_commit(struct rps__raft *r);
static void bcast_append(struct rps__raft *r);

/* Append as leader: the entry gets our term and the next index. */
static int leader_append(struct rps__raft *r, uint32_t type, const void *data, size_t len,
			 uint64_t *index)
{
	struct rps__raft_entry e = {
		.term = r->term, .index = log_last(&r->log) + 1, .type = type,
		.len = (uint32_t)len, .data = data,
	};
	struct progress *self;
	int err = append_entries(r, &e, 1);

	if (err)
		return err;
	self = progress_find(r, r->id);
	if (self)
		pr_maybe_update(self, log_last(&r->log));
	if (index)
		*index = e.index;
	/* a single voter commits alone; otherwise followers have to answer */
	maybe_commit(r);
	return 0;
}

static void become_leader(struct rps__raft *r)
{
	struct progress *self;

	reset(r, r->term);
	r->lead = r->id;
	r->role = RPS__RAFT_LEADER;
	self = progress_find(r, r->id);
	if (self) {
		pr_become_replicate(self);
		self->recent_active = true;
	}
	/* Commit something of our own term: only then is everything before it
	 * known committed (Raft 5.4.2), and only then may reads and membership
	 * changes be served. */
	leader_append(r, RPS__RAFT_ENTRY_NORMAL, NULL, 0, NULL);
}

enum vote_result { VOTE_PENDING, VOTE_WON, VOTE_LOST };

static enum vote_result poll(struct rps__raft *r, uint64_t id, bool granted)
{
	unsigned yes = 0, no = 0, q = quorum(r);
	unsigned k;

	for (k = 0; k < r->n_votes; k++)
		if (r->vote_from[k] == id)
			break;
	if (k == r->n_votes && k < RPS__RAFT_MAX_NODES && rps__raft_conf_is_voter(&r->conf, id)) {
		r->vote_from[k] = id;
		r->vote_granted[k] = granted;
		r->n_votes++;
	}
	for (k = 0; k < r->n_votes; k++) {
		if (!rps__raft_conf_is_voter(&r->conf, r->vote_from[k]))
			continue;
		if (r->vote_granted[k])
			yes++;
		else
			no++;
	}
	if (yes >= q)
		return VOTE_WON;
	if (no > r->conf.n_voters - q)
		return VOTE_LOST;
	return VOTE_PENDING;
}

static void campaign(struct rps__raft *r, bool pre, bool transfer)
{
	uint8_t type;
	uint64_t term;

	if (pre) {
		become_pre_candidate(r);
		type = RPS__RAFT_MSG_PRE_VOTE;
		term = r->term + 1;
	} else {
		become_candidate(r);
		type = RPS__RAFT_MSG_VOTE;
		term = r->term;
	}
	if (poll(r, r->id, true) == VOTE_WON) {
		if (pre)
			campaign(r, false, false);
		else
			become_leader(r);
		return;
	}
	for (uint32_t i = 0; i < r->conf.n_voters; i++) {
		struct rps__raft_msg *m;

		if (r->conf.voters[i] == r->id)
			continue;
		m = msg_push(r, type, r->conf.voters[i]);
		if (!m)
			return;
		m->term = term;
		m->index = log_last(&r->log);
		m->log_term = log_last_term(&r->log);
		m->flags = transfer ? RPS__RAFT_MSG_F_TRANSFER : 0;
	}
}

static void hup(struct rps__raft *r, bool transfer)
{
	if (r->role == RPS__RAFT_LEADER || !promotable(r) || r->term >= TERM_MAX)
		return;
	campaign(r, r->cfg.pre_vote && !transfer, transfer);
}

/* ------------------------------------------------------------------------ */
/* leader: replication */

/* Send the follower what it misses, or a snapshot if that is compacted.
 * False if nothing was sent. */
static bool send_append(struct rps__raft *r, struct progress *pr, bool send_if_empty)
{
	uint64_t last = log_last(&r->log), prev, prev_term, hi;
	struct rps__raft_msg *m;

	if (pr->id == r->id || pr_paused(pr))
		return false;
	if (pr->next > last + 1)
		pr->next = last + 1;
	prev = pr->next - 1;
	if (!log_term(&r->log, prev, &prev_term)) {
		/* compacted away: only the snapshot can bring it up */
		m = msg_push(r, RPS__RAFT_MSG_SNAP, pr->id);
		if (!m || msg_attach_snapshot(r, m))
			return false;
		pr_become_snapshot(pr, r->snap.index);
		return true;
	}
	hi = RPS__MIN(last, prev + r->cfg.max_msg_entries);
	if (hi == prev && !send_if_empty)
		return false;
	m = msg_push(r, RPS__RAFT_MSG_APP, pr->id);
	if (!m)
		return false;
	m->index = prev;
	m->log_term = prev_term;
	m->commit = r->log.committed;
	if (hi > prev && msg_attach_entries(r, m, prev + 1, hi))
		return false;
	switch (pr->state) {
	case RPS__RAFT_PROGRESS_REPLICATE:
		if (hi > prev) {
			/* pipeline: assume it arrives, a rejection brings us back */
			pr->next = hi + 1;
			inflights_add(&pr->ins, hi);
		}
		break;
	case RPS__RAFT_PROGRESS_PROBE:
		pr->probe_sent = true;
		break;
	case RPS__RAFT_PROGRESS_SNAPSHOT:
		break;
	}
	return true;
}

static void bcast_append(struct rps__raft *r)
{
	for (unsigned i = 0; i < r->n_prs; i++)
		send_append(r, &r->prs[i], true);
}

static void bcast_heartbeat(struct rps__raft *r, uint64_t ctx)
{
	for (unsigned i = 0; i < r->n_prs; i++) {
		struct progress *pr = &r->prs[i];
		struct rps__raft_msg *m;

		if (pr->id == r->id)
			continue;
		m = msg_push(r, RPS__RAFT_MSG_HEARTBEAT, pr->id);
		if (!m)
			return;
		/* never past what it is known to hold: it may not have the rest */
		m->commit = RPS__MIN(pr->match, r->log.committed);
		m->context = ctx;
	}
}

static int cmp_u64_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

/* Commit what a quorum of voters holds, if it is of our term: an entry of
 * an older term may still be overwritten even when a majority stores it
 * (Raft figure 8); it commits along with the first one of ours. */
static bool maybe_commit(struct rps__raft *r)
{
	uint64_t matches[RPS__RAFT_MAX_NODES], mci;
	uint32_t n = r->conf.n_voters;

	if (!n)
		return false;
	for (uint32_t i = 0; i < n; i++) {
		struct progress *pr = progress_find(r, r->conf.voters[i]);

		matches[i] = pr ? pr->match : 0;
	}
	qsort(matches, n, sizeof(matches[0]), cmp_u64_desc);
	mci = matches[quorum(r) - 1];
	if (mci > r->log.committed && log_term_or0(&r->log, mci) == r->term) {
		r->log.committed = mci;
		return true;
	}
	return false;
}

/* ------------------------------------------------------------------------ */
/* leader: ReadIndex */

static bool leader_committed_in_term(const struct rps__raft *r)
{
	return log_term_or0(&r->log, r->log.committed) == r->term;
}

static void read_respond(struct rps__raft *r, uint64_t from, uint64_t index, uint64_t ctx)
{
	struct rps__raft_msg *m;

	if (from == r->id) {
		read_state_push(r, index, ctx);
		return;
	}
	m = msg_push(r, RPS__RAFT_MSG_READ_INDEX_RESP, from);
	if (!m)
		return;
	m->index = index;
	m->context = ctx;
}

/* Register a read; confirmed once a quorum answers a heartbeat sent after
 * it (no newer leader can have committed anything before that). */
static int read_request_add(struct rps__raft *r, uint64_t from, uint64_t ctx)
{
	struct read_request *rq;

	if (quorum(r) == 1) {
		read_respond(r, from, r->log.committed, ctx);
		return 0;
	}
	for (unsigned i = 0; i < r->n_reads; i++)
		if (r->reads[i].ctx == ctx)
			return -EEXIST;
	if (r->n_reads == READS_MAX)
		return -EAGAIN;
	rq = &r->reads[r->n_reads++];
	rq->ctx = ctx;
	rq->index = r->log.committed;
	rq->from = from;
	rq->n_acks = 1;
	rq->acks[0] = r->id;
	bcast_heartbeat(r, ctx);
	return 0;
}

static void read_ack(struct rps__raft *r, uint64_t from, uint64_t ctx)
{
	struct read_request *rq = NULL;
	unsigned k, votes = 0;

	for (k = 0; k < r->n_reads; k++)
		if (r->reads[k].ctx == ctx) {
			rq = &r->reads[k];
			break;
		}
	if (!rq)
		return;
	if (!id_in(rq->acks, rq->n_acks, from) && rq->n_acks < RPS__RAFT_MAX_NODES)
		rq->acks[rq->n_acks++] = from;
	for (unsigned i = 0; i < rq->n_acks; i++)
		if (rps__raft_conf_is_voter(&r->conf, rq->acks[i]))
			votes++;
	if (votes < quorum(r))
		return;
	/* the heartbeat for ctx went out after every earlier request too */
	for (unsigned i = 0; i <= k; i++)
		read_respond(r, r->reads[i].from, r->reads[i].index, r->reads[i].ctx);
	memmove(r->reads, r->reads + k + 1, (r->n_reads - k - 1) * sizeof(*r->reads));
	r->n_reads -= k + 1;
}

/* ------------------------------------------------------------------------ */
/* step */

static void step_leader(struct rps__raft *r, const struct rps__raft_msg *m)
{
	struct progress *pr;
	uint64_t last = log_last(&r->log);

	if (m->type == RPS__RAFT_MSG_READ_INDEX) {
		if (leader_committed_in_term(r))
			read_request_add(r, m->from, m->context);
		/* else dropped: the follower times out and retries */
		return;
	}
	pr = progress_find(r, m->from);
	if (!pr || pr->id == r->id)
		return;
	switch (m->type) {
	case RPS__RAFT_MSG_APP_RESP:
		pr->recent_active = true;
		if (m->reject) {
			uint64_t next_probe = m->hint, t;

			if (m->log_term > 0)
				next_probe = log_find_conflict_by_term(&r->log, m->hint, m->log_term, &t);
			if (pr_maybe_decr_to(pr, m->index, next_probe)) {
				if (pr->state == RPS__RAFT_PROGRESS_REPLICATE)
					pr_become_probe(pr);
				send_append(r, pr, true);
			}
			return;
		}
		{
			bool old_paused = pr_paused(pr);

			if (!pr_maybe_update(pr, m->index) &&
			    !(pr->match == m->index && pr->state == RPS__RAFT_PROGRESS_PROBE))
				return;
			switch (pr->state) {
			case RPS__RAFT_PROGRESS_PROBE:
				pr_become_replicate(pr);
				break;
			case RPS__RAFT_PROGRESS_SNAPSHOT:
				if (pr->match >= pr->pending_snapshot || pr->match + 1 > r->log.snap_index) {
					pr_become_probe(pr);
					if (pr->match + 1 > r->log.snap_index)
						pr_become_replicate(pr);
				}
				break;
			case RPS__RAFT_PROGRESS_REPLICATE:
				inflights_free_le(&pr->ins, m->index);
				break;
			}
			if (maybe_commit(r))
				bcast_append(r);
			else if (old_paused)
				send_append(r, pr, true);
			while (send_append(r, pr, false))
				;
			if (m->from == r->lead_transferee && pr->match == last)
				send_timeout_now(r, m->from);
		}
		return;
	case RPS__RAFT_MSG_HEARTBEAT_RESP:
		pr->recent_active = true;
		pr->probe_sent = false;
		/* a lost append would otherwise keep a full window stuck */
		if (pr->state == RPS__RAFT_PROGRESS_REPLICATE && inflights_full(&pr->ins))
			inflights_free_first(&pr->ins);
		if (pr->match < last)
			send_append(r, pr, true);
		if (m->context)
			read_ack(r, m->from, m->context);
		return;
	default:
		return;
	}
}

static void send_app_resp(struct rps__raft *r, uint64_t to, uint64_t index)
{
	struct rps__raft_msg *m = msg_push(r, RPS__RAFT_MSG_APP_RESP, to);

	if (m)
		m->index = index;
}

static int commit_to(struct rps__raft *r, uint64_t commit)
{
	if (commit <= r->log.committed)
		return 0;
	if (commit > log_last(&r->log))
		return rps__seterr(-EPROTO, "raft %llu: told to commit %llu beyond its last index %llu",
				   (unsigned long long)r->id, (unsigned long long)commit,
				   (unsigned long long)log_last(&r->log));
	r->log.committed = commit;
	return 0;
}

static int handle_append(struct rps__raft *r, const struct rps__raft_msg *m)
{
	uint64_t last_new, conflict = 0;
	uint32_t k;
	int err;

	for (k = 0; k < m->n_entries; k++)
		if (m->entries[k].index != m->index + 1 + k || m->entries[k].term > m->term ||
		    m->entries[k].term < m->log_term)
			return rps__seterr(-EBADMSG, "raft %llu: append from %llu has a malformed entry list",
					   (unsigned long long)r->id, (unsigned long long)m->from);
	if (m->index < r->log.committed) {
		send_app_resp(r, m->from, r->log.committed);
		return 0;
	}
	if (!log_match_term(&r->log, m->index, m->log_term)) {
		uint64_t hint_term, hint;

		hint = log_find_conflict_by_term(&r->log, RPS__MIN(m->index, log_last(&r->log)), m->log_term,
						 &hint_term);
		struct rps__raft_msg *resp = msg_push(r, RPS__RAFT_MSG_APP_RESP, m->from);
		if (resp) {
			resp->index = m->index;
			resp->reject = 1;
			resp->hint = hint;
			resp->log_term = hint_term;
		}
		return 0;
	}
	last_new = m->index + m->n_entries;
	for (k = 0; k < m->n_entries; k++)
		if (!log_match_term(&r->log, m->entries[k].index, m->entries[k].term)) {
			conflict = m->entries[k].index;
			break;
		}
	if (conflict) {
		if (conflict <= r->log.committed)
			return rps__seterr(-EPROTO, "raft %llu: entry %llu from %llu conflicts with a committed one",
					   (unsigned long long)r->id, (unsigned long long)conflict,
					   (unsigned long long)m->from);
		if (conflict <= log_last(&r->log)) {
			bool conf_lost = r->conf_index >= conflict;

			log_truncate(&r->log, conflict);
			if (conf_lost)
				conf_recompute(r);
		}
		err = append_entries(r, &m->entries[k], m->n_entries - k);
		if (err)
			return err;
	}
	err = commit_to(r, RPS__MIN(m->commit, last_new));
	if (err)
		return err;
	send_app_resp(r, m->from, last_new);
	return 0;
}

static int handle_heartbeat(struct rps__raft *r, const struct rps__raft_msg *m)
{
	struct rps__raft_msg *resp;
	int err = commit_to(r, m->commit);

	if (err)
		return err;
	resp = msg_push(r, RPS__RAFT_MSG_HEARTBEAT_RESP, m->from);
	if (resp)
		resp->context = m->context;
	return 0;
}

static int set_snapshot(struct rps__raft *r, const struct rps__raft_snapshot *s)
{
	void *data = NULL;

	if (s->len) {
		data = malloc(s->len);
		if (!data)
			return -ENOMEM;
		memcpy(data, s->data, s->len);
	}
	free((void *)r->snap.data);
	r->snap = *s;
	r->snap.data = data;
	return 0;
}

/* Install a snapshot from the leader; false if we already have what it holds. */
static bool restore(struct rps__raft *r, const struct rps__raft_snapshot *s)
{
	int err;

	if (s->index <= r->log.committed)
		return false;
	if (log_match_term(&r->log, s->index, s->term)) {
		/* our log has it: the entries up to it are committed, keep them */
		commit_to(r, s->index);
		return false;
	}
	err = set_snapshot(r, s);
	if (err) {
		fail(r, err);
		return false;
	}
	log_truncate(&r->log, r->log.snap_index + 1);
	r->log.snap_index = s->index;
	r->log.snap_term = s->term;
	r->log.committed = s->index;
	r->log.applied = s->index;	/* the application applies the snapshot first */
	r->log.unstable = s->index + 1;
	r->snap_pending = true;
	conf_recompute(r);
	return true;
}

static void handle_snapshot(struct rps__raft *r, const struct rps__raft_msg *m)
{
	if (!m->snapshot)
		return;
	if (restore(r, m->snapshot))
		send_app_resp(r, m->from, log_last(&r->log));
	else
		send_app_resp(r, m->from, r->log.committed);
}

static int step_follower(struct rps__raft *r, const struct rps__raft_msg *m)
{
	switch (m->type) {
	case RPS__RAFT_MSG_APP:
		r->election_elapsed = 0;
		r->lead = m->from;
		return handle_append(r, m);
	case RPS__RAFT_MSG_HEARTBEAT:
		r->election_elapsed = 0;
		r->lead = m->from;
		return handle_heartbeat(r, m);
	case RPS__RAFT_MSG_SNAP:
		r->election_elapsed = 0;
		r->lead = m->from;
		handle_snapshot(r, m);
		return 0;
	case RPS__RAFT_MSG_TIMEOUT_NOW:
		/* the leader asks us to take over: no PreVote, and the votes we
		 * ask for bypass the lease of the leader that sent us */
		hup(r, true);
		return 0;
	case RPS__RAFT_MSG_READ_INDEX_RESP:
		read_state_push(r, m->index, m->context);
		return 0;
	default:
		return 0;
	}
}

static int step_candidate(struct rps__raft *r, const struct rps__raft_msg *m)
{
	uint8_t resp_type = r->role == RPS__RAFT_PRE_CANDIDATE ? RPS__RAFT_MSG_PRE_VOTE_RESP
								 : RPS__RAFT_MSG_VOTE_RESP;

	switch (m->type) {
	case RPS__RAFT_MSG_APP:
	case RPS__RAFT_MSG_HEARTBEAT:
	case RPS__RAFT_MSG_SNAP:
		/* a leader of our term exists */
		become_follower(r, m->term, m->from);
		return step_follower(r, m);
	default:
		break;
	}
	if (m->type != resp_type)
		return 0;
	switch (poll(r, m->from, !m->reject)) {
	case VOTE_WON:
		if (r->role == RPS__RAFT_PRE_CANDIDATE)
			campaign(r, false, false);
		else {
			become_leader(r);
			bcast_append(r);
		}
		break;
	case VOTE_LOST:
		become_follower(r, r->term, RPS__RAFT_NONE);
		break;
	case VOTE_PENDING:
		break;
	}
	return 0;
}

static void handle_vote_request(struct rps__raft *r, const struct rps__raft_msg *m)
{
	uint8_t resp_type = m->type == RPS__RAFT_MSG_VOTE ? RPS__RAFT_MSG_VOTE_RESP : RPS__RAFT_MSG_PRE_VOTE_RESP;
	bool can_vote = r->vote == m->from ||
			/* not voted, and no leader known in this term */
			(r->vote == RPS__RAFT_NONE && r->lead == RPS__RAFT_NONE) ||
			/* a PreVote for a future term commits us to nothing */
			(m->type == RPS__RAFT_MSG_PRE_VOTE && m->term > r->term);
	struct rps__raft_msg *resp;

	if (can_vote && log_up_to_date(&r->log, m->index, m->log_term)) {
		resp = msg_push(r, resp_type, m->from);
		if (!resp)
			return;
		resp->term = m->term;
		if (m->type == RPS__RAFT_MSG_VOTE) {
			r->election_elapsed = 0;
			r->vote = m->from;
		}
	} else {
		resp = msg_push(r, resp_type, m->from);
		if (!resp)
			return;
		resp->reject = 1;
	}
}

/* Is m from a node we may hear?  Our configuration may lag behind the
 * leader's, so (Raft thesis 4.1) appends from a leader and vote requests from
 * a candidate it does not list yet are heard; anything else from a
 * non-member answers a message we never sent it (or comes from the leader we
 * follow). */
static bool sender_known(const struct rps__raft *r, const struct rps__raft_msg *m)
{
	if (rps__raft_conf_is_voter(&r->conf, m->from) || rps__raft_conf_is_learner(&r->conf, m->from))
		return true;
	switch (m->type) {
	case RPS__RAFT_MSG_APP:
	case RPS__RAFT_MSG_HEARTBEAT:
	case RPS__RAFT_MSG_SNAP:
	case RPS__RAFT_MSG_VOTE:
	case RPS__RAFT_MSG_PRE_VOTE:
		return true;
	default:
		return r->lead != RPS__RAFT_NONE && m->from == r->lead;
	}
}

/* Why m must be dropped before it touches anything: NULL if it may be
 * stepped, "" for a stranger's message (dropped quietly), else what is wrong
 * with it (values no correct peer sends, and that would leave persisted
 * state the node cannot continue or restart from). */
/*
 * What a real leader's append always is: entries at index+1, index+2...,
 * terms from log_term up, never past the message's term. Anything else
 * would be persisted as a log the WAL refuses to reopen (terms going down),
 * so one forged message could brick the node for good.
 */
static bool app_entries_ordered(const struct rps__raft_msg *m)
{
	uint64_t prev = m->log_term;

	if (m->n_entries && m->index > INDEX_MAX - m->n_entries)
		return false;
	for (uint32_t i = 0; i < m->n_entries; i++) {
		const struct rps__raft_entry *e = &m->entries[i];

		if (e->term < prev || e->term > m->term)	/* (indexes: checked in append) */
			return false;
		prev = e->term;
	}
	return true;
}

static const char *refuse_reason(const struct rps__raft *r, const struct rps__raft_msg *m)
{
	if (m->term > TERM_MAX)
		return "its term cannot be incremented";
	if (!sender_known(r, m))
		return "";
	if (m->type == RPS__RAFT_MSG_SNAP && m->snapshot &&
	    (m->snapshot->term > m->term || m->snapshot->index > INDEX_MAX))
		return "its snapshot is from a later term or at an impossible index";
	if (m->type == RPS__RAFT_MSG_APP && !app_entries_ordered(m))
		return "its entries' terms go down or pass the message's term";
	if (m->type == RPS__RAFT_MSG_APP_RESP && !m->reject && r->role == RPS__RAFT_LEADER &&
	    m->term == r->term && m->index > log_last(&r->log))
		return "it acknowledges entries beyond the leader's log";
	return NULL;
}

int rps__raft_step(struct rps__raft *r, const struct rps__raft_msg *m)
{
	const char *why;
	int err = 0;

	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: step while a ready is outstanding: call advance first");
	if (m->type < RPS__RAFT_MSG_APP || m->type > RPS__RAFT_MSG_TYPE_MAX || m->from == RPS__RAFT_NONE ||
	    (m->n_entries && !m->entries))
		return rps__seterr(-EINVAL, "raft %llu: message of type %u from %llu is invalid",
				   (unsigned long long)r->id, m->type, (unsigned long long)m->from);
	if (m->to != r->id)
		return rps__seterr(-EINVAL, "raft %llu: message for %llu delivered here",
				   (unsigned long long)r->id, (unsigned long long)m->to);
	if (m->from == r->id)
		return 0;
	why = refuse_reason(r, m);
	if (why) {
		r->refused++;
		if (!*why)
			return 0;	/* a stranger's answer: routine around membership changes */
		return rps__seterr(-EPROTO, "raft %llu: dropped %s from %llu (term %llu): %s",
				   (unsigned long long)r->id, rps__raft_msg_type_name(m->type),
				   (unsigned long long)m->from, (unsigned long long)m->term, why);
	}

	if (m->term > r->term) {
		if (m->type == RPS__RAFT_MSG_VOTE || m->type == RPS__RAFT_MSG_PRE_VOTE) {
			bool forced = m->flags & RPS__RAFT_MSG_F_TRANSFER;
			bool in_lease = r->cfg.check_quorum && r->lead != RPS__RAFT_NONE &&
					r->election_elapsed < r->cfg.election_ticks;

			/* we heard from a leader within the minimum election
			 * timeout: do not let a node that cannot hear it (or
			 * was removed) depose it */
			if (!forced && in_lease)
				return 0;
		}
		if (m->type == RPS__RAFT_MSG_PRE_VOTE) {
			/* never change term for a PreVote */
		} else if (m->type == RPS__RAFT_MSG_PRE_VOTE_RESP && !m->reject) {
			/* granted for the term we would campaign in: we move
			 * there when we win the PreVote */
		} else if (m->type == RPS__RAFT_MSG_APP || m->type == RPS__RAFT_MSG_HEARTBEAT ||
			   m->type == RPS__RAFT_MSG_SNAP) {
			become_follower(r, m->term, m->from);
		} else {
			become_follower(r, m->term, RPS__RAFT_NONE);
		}
	} else if (m->term < r->term) {
		if ((r->cfg.check_quorum || r->cfg.pre_vote) &&
		    (m->type == RPS__RAFT_MSG_HEARTBEAT || m->type == RPS__RAFT_MSG_APP)) {
			/* A stale leader (or one cut off by a node whose term
			 * ran ahead while it could not win): answer with our
			 * term so it steps down instead of the cluster
			 * waiting on it forever. */
			msg_push(r, RPS__RAFT_MSG_APP_RESP, m->from);
		} else if (m->type == RPS__RAFT_MSG_PRE_VOTE) {
			struct rps__raft_msg *resp = msg_push(r, RPS__RAFT_MSG_PRE_VOTE_RESP, m->from);

			if (resp)
				resp->reject = 1;
		}
		return r->broken;
	}

	switch (m->type) {
	case RPS__RAFT_MSG_VOTE:
	case RPS__RAFT_MSG_PRE_VOTE:
		handle_vote_request(r, m);
		break;
	default:
		switch (r->role) {
		case RPS__RAFT_LEADER:
			step_leader(r, m);
			break;
		case RPS__RAFT_CANDIDATE:
		case RPS__RAFT_PRE_CANDIDATE:
			err = step_candidate(r, m);
			break;
		case RPS__RAFT_FOLLOWER:
			err = step_follower(r, m);
			break;
		}
	}
	return r->broken ? r->broken : err;
}

/* ------------------------------------------------------------------------ */
/* ticks */

static bool quorum_active(struct rps__raft *r)
{
	unsigned active = 0;

	for (unsigned i = 0; i < r->n_prs; i++) {
		struct progress *pr = &r->prs[i];

		if (pr->is_learner)
			continue;
		if ((pr->id == r->id || pr->recent_active) && rps__raft_conf_is_voter(&r->conf, pr->id))
			active++;
	}
	for (unsigned i = 0; i < r->n_prs; i++)
		if (r->prs[i].id != r->id)
			r->prs[i].recent_active = false;
	return active >= quorum(r);
}

static void tick_leader(struct rps__raft *r)
{
	r->heartbeat_elapsed++;
	r->election_elapsed++;
	if (r->election_elapsed >= r->cfg.election_ticks) {
		r->election_elapsed = 0;
		if (r->cfg.check_quorum && !quorum_active(r)) {
			/* we cannot reach a quorum: stop serving reads and
			 * accepting writes that can never commit */
			become_follower(r, r->term, RPS__RAFT_NONE);
			return;
		}
		/* a transfer that did not finish in an election timeout failed */
		abort_transfer(r);
	}
	for (unsigned i = 0; i < r->n_prs; i++) {
		struct progress *pr = &r->prs[i];

		/* the snapshot, or its answer, was lost: probe again */
		if (pr->state == RPS__RAFT_PROGRESS_SNAPSHOT && ++pr->snapshot_ticks >= r->cfg.election_ticks) {
			pr_reset_state(pr, RPS__RAFT_PROGRESS_PROBE);
			pr->next = pr->match + 1;
		}
	}
	if (r->heartbeat_elapsed >= r->cfg.heartbeat_ticks) {
		r->heartbeat_elapsed = 0;
		bcast_heartbeat(r, r->n_reads ? r->reads[r->n_reads - 1].ctx : 0);
	}
}

int rps__raft_tick(struct rps__raft *r)
{
	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: tick while a ready is outstanding: call advance first");
	if (r->role == RPS__RAFT_LEADER) {
		tick_leader(r);
	} else {
		r->election_elapsed++;
		if (promotable(r) && r->election_elapsed >= r->randomized_timeout) {
			r->election_elapsed = 0;
			hup(r, false);
		}
	}
	return r->broken;
}

int rps__raft_campaign(struct rps__raft *r)
{
	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: campaign while a ready is outstanding");
	if (!promotable(r))
		return rps__seterr(-EPERM, "raft %llu: not a voter, cannot campaign", (unsigned long long)r->id);
	if (r->term >= TERM_MAX)
		return rps__seterr(-EOVERFLOW, "raft %llu: term %llu is the last one: no campaign can follow it",
				   (unsigned long long)r->id, (unsigned long long)r->term);
	hup(r, false);
	return r->broken;
}

/* ------------------------------------------------------------------------ */
/* proposals */

static int check_leader(struct rps__raft *r, const char *what)
{
	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: %s while a ready is outstanding: call advance first", what);
	if (r->role != RPS__RAFT_LEADER)
		return rps__seterr(-EPERM, "raft %llu: %s: not the leader (leader hint %llu)",
				   (unsigned long long)r->id, what, (unsigned long long)r->lead);
	if (r->lead_transferee != RPS__RAFT_NONE)
		return rps__seterr(-EBUSY, "raft %llu: %s: leadership is moving to %llu, retry there",
				   (unsigned long long)r->id, what, (unsigned long long)r->lead_transferee);
	return 0;
}

int rps__raft_propose(struct rps__raft *r, const void *data, size_t len, uint64_t *index,
		      uint64_t *term)
{
	int err = check_leader(r, "propose");

	if (err)
		return err;
	if (len > RPS__RAFT_MAX_DATA)
		return rps__seterr(-EMSGSIZE, "raft: proposal of %zu bytes exceeds %u", len, RPS__RAFT_MAX_DATA);
	if (term)
		*term = r->term;
	err = leader_append(r, RPS__RAFT_ENTRY_NORMAL, data, len, index);
	if (err)
		return err;
	bcast_append(r);
	return r->broken;
}

int rps__raft_propose_conf_change(struct rps__raft *r, enum rps__raft_conf_op op, uint64_t node,
				  uint64_t *index)
{
	bool voter = rps__raft_conf_is_voter(&r->conf, node), learner = rps__raft_conf_is_learner(&r->conf, node);
	uint8_t data[CONF_DATA_LEN];
	struct progress *pr;
	int err = check_leader(r, "membership change");

	if (err)
		return err;
	if (node == RPS__RAFT_NONE)
		return rps__seterr(-EINVAL, "raft: membership change of node 0");
	if (r->conf_index > r->log.committed)
		return rps__seterr(-EBUSY, "raft: the previous membership change (index %llu) is not committed yet",
				   (unsigned long long)r->conf_index);
	if (!leader_committed_in_term(r))
		return rps__seterr(-EAGAIN, "raft: new leader has not committed in its term yet, retry");
	switch (op) {
	case RPS__RAFT_CONF_ADD_VOTER:
	case RPS__RAFT_CONF_ADD_LEARNER:
		if (voter || learner)
			return rps__seterr(-EEXIST, "raft: node %llu is already a member", (unsigned long long)node);
		if (!conf_has_room(&r->conf))
			return rps__seterr(-ENOSPC, "raft: a configuration holds at most %u nodes", RPS__RAFT_MAX_NODES);
		break;
	case RPS__RAFT_CONF_PROMOTE:
		if (!learner)
			return rps__seterr(-EINVAL, "raft: node %llu is not a learner", (unsigned long long)node);
		/* a voter that cannot vote for lack of a log weakens the quorum */
		pr = progress_find(r, node);
		if (!pr || pr->match < r->log.committed)
			return rps__seterr(-EAGAIN, "raft: learner %llu has not caught up (%llu of %llu), retry later",
					   (unsigned long long)node, (unsigned long long)(pr ? pr->match : 0),
					   (unsigned long long)r->log.committed);
		break;
	case RPS__RAFT_CONF_REMOVE:
		if (!voter && !learner)
			return rps__seterr(-ENOENT, "raft: node %llu is not a member", (unsigned long long)node);
		if (node == r->id)
			return rps__seterr(-EBUSY, "raft: the leader cannot remove itself: transfer leadership first");
		break;
	default:
		return rps__seterr(-EINVAL, "raft: unknown membership change %d", (int)op);
	}
	data[0] = (uint8_t)op;
	rps__le_put64(data + 1, node);
	err = leader_append(r, RPS__RAFT_ENTRY_CONF, data, sizeof(data), index);
	if (err)
		return err;
	bcast_append(r);
	return r->broken;
}

int rps__raft_transfer_leader(struct rps__raft *r, uint64_t to)
{
	struct progress *pr;
	int err;

	if (r->role == RPS__RAFT_LEADER && r->lead_transferee == to && to != RPS__RAFT_NONE)
		return 0;	/* already on its way */
	err = check_leader(r, "transfer leadership");
	if (err)
		return err;
	if (to == r->id)
		return 0;
	if (!rps__raft_conf_is_voter(&r->conf, to))
		return rps__seterr(-EINVAL, "raft: cannot transfer leadership to %llu: not a voter",
				   (unsigned long long)to);
	pr = progress_find(r, to);
	r->lead_transferee = to;
	/* the transfer must finish within an election timeout */
	r->election_elapsed = 0;
	if (pr->match == log_last(&r->log))
		send_timeout_now(r, to);
	else
		send_append(r, pr, true);
	return r->broken;
}

int rps__raft_read_index(struct rps__raft *r, uint64_t ctx)
{
	struct rps__raft_msg *m;
	int err;

	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: read_index while a ready is outstanding");
	if (ctx == 0)
		return rps__seterr(-EINVAL, "raft: read_index context must be nonzero");
	if (r->role == RPS__RAFT_LEADER) {
		if (!leader_committed_in_term(r))
			return rps__seterr(-EAGAIN, "raft: new leader has not committed in its term yet, retry");
		err = read_request_add(r, r->id, ctx);
		if (err == -EEXIST)
			return rps__seterr(err, "raft: read context %llu is already pending", (unsigned long long)ctx);
		if (err)
			return rps__seterr(err, "raft: too many pending reads, retry");
		return r->broken;
	}
	if (r->lead == RPS__RAFT_NONE)
		return rps__seterr(-EAGAIN, "raft %llu: no leader known, retry", (unsigned long long)r->id);
	m = msg_push(r, RPS__RAFT_MSG_READ_INDEX, r->lead);
	if (m)
		m->context = ctx;
	return r->broken;
}

static void conf_at(const struct rps__raft *r, uint64_t index, struct rps__raft_conf_state *cs)
{
	*cs = r->snap.conf;
	for (uint64_t i = r->log.snap_index + 1; i <= index; i++) {
		const struct rps__raft_entry *e = log_entry(&r->log, i);

		if (e->type == RPS__RAFT_ENTRY_CONF)
			conf_apply_entry(cs, e);
	}
}

int rps__raft_compact(struct rps__raft *r, uint64_t index, const void *data, size_t len,
		      const struct rps__raft_snapshot **snap)
{
	struct rps__raft_snapshot s;
	int err;

	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: compact while a ready is outstanding");
	if (index <= r->log.snap_index || index > r->log.applied)
		return rps__seterr(-EINVAL, "raft: compact to %llu: must be in (%llu, applied %llu]",
				   (unsigned long long)index, (unsigned long long)r->log.snap_index,
				   (unsigned long long)r->log.applied);
	if (len > RPS__RAFT_MAX_DATA)
		return rps__seterr(-EMSGSIZE, "raft: snapshot of %zu bytes exceeds %u", len, RPS__RAFT_MAX_DATA);
	s.index = index;
	s.term = log_term_or0(&r->log, index);
	conf_at(r, index, &s.conf);
	s.len = (uint32_t)len;
	s.data = data;
	err = set_snapshot(r, &s);
	if (err)
		return rps__seterr(err, "raft: no memory for a snapshot of %zu bytes", len);
	log_compact(&r->log, index, s.term);
	if (snap)
		*snap = &r->snap;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* ready / advance */

int rps__raft_ready(struct rps__raft *r, struct rps__raft_ready *rd)
{
	struct raft_log *l = &r->log;
	uint64_t last = log_last(l);
	bool work = false;

	if (r->broken)
		return r->broken;
	if (r->ready_out)
		return rps__seterr(-EBUSY, "raft: ready called twice without advance");
	memset(rd, 0, sizeof(*rd));
	rd->role = r->role;
	rd->leader = r->lead;
	rd->hard_state.term = r->term;
	rd->hard_state.vote = r->vote;
	rd->hard_state.commit = l->committed;
	if (memcmp(&rd->hard_state, &r->prev_hs, sizeof(r->prev_hs)) != 0) {
		rd->hard_state_changed = true;
		work = true;
	}
	if (r->snap_pending) {
		rd->snapshot = &r->snap;
		work = true;
	}
	if (l->unstable <= l->snap_index)
		l->unstable = l->snap_index + 1;
	if (l->unstable <= last) {
		rd->entries = log_entry(l, l->unstable);
		rd->n_entries = (size_t)(last - l->unstable + 1);
		work = true;
	}
	if (l->committed > l->applied) {
		rd->committed = log_entry(l, l->applied + 1);
		rd->n_committed = (size_t)(l->committed - l->applied);
		work = true;
	}
	if (r->n_msgs) {
		rd->msgs = r->msgs;
		rd->n_msgs = r->n_msgs;
		work = true;
	}
	if (r->n_read_states) {
		rd->read_states = r->read_states;
		rd->n_read_states = r->n_read_states;
		work = true;
	}
	if (!work)
		return 0;
	r->ready_out = true;
	r->ready_hs = rd->hard_state;
	r->ready_last_index = last;
	r->ready_applied_to = l->committed;
	return 1;
}

int rps__raft_advance(struct rps__raft *r, const struct rps__raft_ready *rd)
{
	if (!r->ready_out)
		return rps__seterr(-EINVAL, "raft: advance without an outstanding ready");
	r->log.unstable = r->ready_last_index + 1;
	if (r->ready_applied_to > r->log.applied)
		r->log.applied = r->ready_applied_to;
	r->snap_pending = false;
	/* what was handed out, whatever the caller's copy became */
	r->prev_hs = r->ready_hs;
	msgs_clear(r);
	r->n_read_states = 0;
	r->ready_out = false;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* creation and introspection */

static int cmp_u64_asc(const void *a, const void *b)
{
	return -cmp_u64_desc(a, b);
}

static int validate_config(const struct rps__raft_config *cfg)
{
	if (cfg->id == RPS__RAFT_NONE)
		return rps__seterr(-EINVAL, "raft: node id 0 is reserved");
	if (cfg->heartbeat_ticks < 1 || cfg->election_ticks <= cfg->heartbeat_ticks)
		return rps__seterr(-EINVAL, "raft: need 1 <= heartbeat_ticks (%u) < election_ticks (%u)",
				   cfg->heartbeat_ticks, cfg->election_ticks);
	if (cfg->max_inflight_msgs < 1 || cfg->max_msg_entries < 1)
		return rps__seterr(-EINVAL, "raft: max_inflight_msgs and max_msg_entries must be >= 1");
	if (cfg->n_peers > RPS__RAFT_MAX_NODES)
		return rps__seterr(-EINVAL, "raft: at most %u peers", RPS__RAFT_MAX_NODES);
	for (size_t i = 0; i < cfg->n_peers; i++) {
		if (cfg->peers[i] == RPS__RAFT_NONE)
			return rps__seterr(-EINVAL, "raft: peer id 0 is reserved");
		for (size_t j = 0; j < i; j++)
			if (cfg->peers[i] == cfg->peers[j])
				return rps__seterr(-EINVAL, "raft: peer %llu listed twice",
						   (unsigned long long)cfg->peers[i]);
	}
	return 0;
}

static int restore_persisted(struct rps__raft *r, const struct rps__raft_persisted *p)
{
	const struct rps__raft_hard_state *hs = &p->hard_state;
	int err;

	if (p->snapshot) {
		const struct rps__raft_snapshot *s = p->snapshot;

		if (s->conf.n_voters + s->conf.n_learners > RPS__RAFT_MAX_NODES)
			return rps__seterr(-EINVAL, "raft: restored snapshot has too many members");
		err = set_snapshot(r, s);
		if (err)
			return err;
		r->log.snap_index = s->index;
		r->log.snap_term = s->term;
	}
	for (size_t i = 0; i < p->n_entries; i++) {
		const struct rps__raft_entry *e = &p->entries[i];

		if (e->index <= r->log.snap_index)
			continue;	/* compacted after it was stored */
		if (e->index != log_last(&r->log) + 1)
			return rps__seterr(-EINVAL, "raft: restored log has a gap before index %llu",
					   (unsigned long long)e->index);
		err = log_append(&r->log, e);
		if (err)
			return err;
	}
	if (hs->term > TERM_MAX || log_last_term(&r->log) > TERM_MAX || log_last(&r->log) > INDEX_MAX)
		return rps__seterr(-EINVAL, "raft: restored term %llu (log up to %llu, term %llu) cannot be"
				   " incremented: the log is unusable; restore this node from a peer",
				   (unsigned long long)hs->term, (unsigned long long)log_last(&r->log),
				   (unsigned long long)log_last_term(&r->log));
	r->term = hs->term;
	r->vote = hs->vote;
	r->log.committed = RPS__MAX(hs->commit, r->log.snap_index);
	if (r->log.committed > log_last(&r->log))
		return rps__seterr(-EINVAL, "raft: restored commit %llu is beyond the restored log (%llu)",
				   (unsigned long long)hs->commit, (unsigned long long)log_last(&r->log));
	if (log_last_term(&r->log) > r->term) {
		/* A crash between persisting entries and the hard state: keep
		 * term >= last log term.  No vote can be lost: a vote in that
		 * term would have been persisted along with the term. */
		r->term = log_last_term(&r->log);
		r->vote = RPS__RAFT_NONE;
	}
	r->log.applied = r->log.snap_index;	/* the application replays from its snapshot */
	r->log.unstable = log_last(&r->log) + 1;
	r->prev_hs = *hs;
	return 0;
}

/* A new cluster starts from a snapshot at index 1 holding the initial
 * configuration and an empty state machine: every initial member builds the
 * identical one, it is persisted atomically (a torn log write could keep only
 * part of a list of "add voter" entries, and a node that restarted believing
 * it formed a cluster alone would elect itself), and nodes that join later
 * receive it by InstallSnapshot. */
static int bootstrap(struct rps__raft *r, const struct rps__raft_config *cfg)
{
	struct rps__raft_snapshot s = { .index = 1, .term = 1 };

	if (!cfg->n_peers)
		return 0;	/* joins an existing cluster: learns everything from it */
	for (size_t i = 0; i < cfg->n_peers; i++)
		s.conf.voters[i] = cfg->peers[i];
	s.conf.n_voters = (uint32_t)cfg->n_peers;
	qsort(s.conf.voters, s.conf.n_voters, sizeof(s.conf.voters[0]), cmp_u64_asc);
	r->snap = s;
	r->snap_pending = true;
	r->log.snap_index = 1;
	r->log.snap_term = 1;
	r->log.committed = 1;
	r->log.applied = 1;
	r->log.unstable = 2;
	r->term = 1;
	return 0;
}

int rps__raft_new(const struct rps__raft_config *cfg, const struct rps__raft_persisted *restored,
		  struct rps__raft **out)
{
	struct rps__raft *r;
	int err;

	*out = NULL;
	err = validate_config(cfg);
	if (err)
		return err;
	r = calloc(1, sizeof(*r));
	if (!r)
		return rps__seterr(-ENOMEM, "raft: no memory for a core");
	r->id = cfg->id;
	r->cfg = *cfg;
	r->cfg.peers = NULL;	/* not kept: the caller owns it */
	r->rng = cfg->seed ^ (cfg->id * 0x9e3779b97f4a7c15ull);
	err = -ENOMEM;
	r->inflight_pool = calloc((size_t)RPS__RAFT_MAX_NODES * cfg->max_inflight_msgs, sizeof(uint64_t));
	r->reads = calloc(READS_MAX, sizeof(*r->reads));
	if (!r->inflight_pool || !r->reads)
		goto fail_core;
	for (unsigned i = 0; i < RPS__RAFT_MAX_NODES; i++)
		r->prs[i].ins.buf = r->inflight_pool + (size_t)i * cfg->max_inflight_msgs;

	if (restored && (restored->snapshot || restored->n_entries || restored->hard_state.term))
		err = restore_persisted(r, restored);
	else
		err = bootstrap(r, cfg);
	if (err)
		goto fail_log;
	conf_recompute(r);
	become_follower(r, r->term, RPS__RAFT_NONE);
	*out = r;
	return 0;

fail_log:
	log_free(&r->log);
	free((void *)r->snap.data);
fail_core:
	free(r->reads);
	free(r->inflight_pool);
	free(r);
	return err == -ENOMEM ? rps__seterr(err, "raft: no memory to create node %llu",
					    (unsigned long long)cfg->id) : err;
}

void rps__raft_free(struct rps__raft *r)
{
	if (!r)
		return;
	msgs_clear(r);
	free(r->msgs);
	free(r->read_states);
	log_free(&r->log);
	free((void *)r->snap.data);
	free(r->reads);
	free(r->inflight_pool);
	free(r);
}

uint64_t rps__raft_leader(const struct rps__raft *r)
{
	return r->lead;
}

void rps__raft_status(const struct rps__raft *r, struct rps__raft_status *st)
{
	memset(st, 0, sizeof(*st));
	st->id = r->id;
	st->role = r->role;
	st->term = r->term;
	st->vote = r->vote;
	st->leader = r->lead;
	st->commit = r->log.committed;
	st->applied = r->log.applied;
	st->snapshot_index = r->log.snap_index;
	st->last_index = log_last(&r->log);
	st->lead_transferee = r->lead_transferee;
	st->promotable = promotable(r);
	st->conf = r->conf;
	st->refused = r->refused;
}

int rps__raft_entry_at(const struct rps__raft *r, uint64_t index, const struct rps__raft_entry **e)
{
	if (index <= r->log.snap_index || index > log_last(&r->log))
		return -ENOENT;
	*e = log_entry(&r->log, index);
	return 0;
}

int rps__raft_progress(const struct rps__raft *r, uint64_t id, struct rps__raft_progress_info *pi)
{
	const struct progress *pr = NULL;

	if (r->role != RPS__RAFT_LEADER)
		return -ENOENT;
	for (unsigned i = 0; i < r->n_prs; i++)
		if (r->prs[i].id == id)
			pr = &r->prs[i];
	if (!pr)
		return -ENOENT;
	pi->match = pr->match;
	pi->next = pr->next;
	pi->state = pr->state;
	pi->recent_active = pr->recent_active;
	pi->inflight = pr->ins.count;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* wire format
 *
 *	u8 version, u8 type, u8 reject, u8 flags,
 *	u64 to, from, term, log_term, index, commit, hint, context,
 *	u32 n_entries, u8 has_snapshot,
 *	n_entries x { u64 term, u64 index, u32 type, u32 len, len bytes },
 *	[snapshot: u64 index, u64 term, u32 n_voters, u32 n_learners,
 *	 (n_voters + n_learners) x u64, u32 len, len bytes]
 */

#define WIRE_VERSION 1u
#define WIRE_HDR (4u + 8u * 8u + 4u + 1u)
#define WIRE_ENTRY_HDR (8u + 8u + 4u + 4u)
#define WIRE_SNAP_HDR (8u + 8u + 4u + 4u + 4u)

size_t rps__raft_msg_encoded_size(const struct rps__raft_msg *m)
{
	size_t n = WIRE_HDR;

	for (uint32_t i = 0; i < m->n_entries; i++)
		n += WIRE_ENTRY_HDR + m->entries[i].len;
	if (m->snapshot)
		n += WIRE_SNAP_HDR + 8u * (m->snapshot->conf.n_voters + m->snapshot->conf.n_learners) +
		     m->snapshot->len;
	return n;
}

int rps__raft_msg_encode(const struct rps__raft_msg *m, void *buf, size_t cap, size_t *len)
{
	size_t need = rps__raft_msg_encoded_size(m);
	uint8_t *p = buf;
	const uint64_t words[8] = { m->to, m->from, m->term, m->log_term, m->index, m->commit, m->hint, m->context };

	if (need > cap)
		return rps__seterr(-ENOSPC, "raft: message needs %zu bytes, buffer has %zu", need, cap);
	if (m->snapshot && (m->snapshot->conf.n_voters > RPS__RAFT_MAX_NODES ||
			    m->snapshot->conf.n_learners > RPS__RAFT_MAX_NODES))
		return rps__seterr(-EINVAL, "raft: snapshot configuration too large to encode");
	*p++ = WIRE_VERSION;
	*p++ = m->type;
	*p++ = m->reject;
	*p++ = m->flags;
	for (int i = 0; i < 8; i++, p += 8)
		rps__le_put64(p, words[i]);
	rps__le_put32(p, m->n_entries);
	p += 4;
	*p++ = m->snapshot != NULL;
	for (uint32_t i = 0; i < m->n_entries; i++) {
		const struct rps__raft_entry *e = &m->entries[i];

		rps__le_put64(p, e->term);
		rps__le_put64(p + 8, e->index);
		rps__le_put32(p + 16, e->type);
		rps__le_put32(p + 20, e->len);
		p += WIRE_ENTRY_HDR;
		if (e->len)
			memcpy(p, e->data, e->len);
		p += e->len;
	}
	if (m->snapshot) {
		const struct rps__raft_snapshot *s = m->snapshot;

		rps__le_put64(p, s->index);
		rps__le_put64(p + 8, s->term);
		rps__le_put32(p + 16, s->conf.n_voters);
		rps__le_put32(p + 20, s->conf.n_learners);
		p += 24;
		for (uint32_t i = 0; i < s->conf.n_voters; i++, p += 8)
			rps__le_put64(p, s->conf.voters[i]);
		for (uint32_t i = 0; i < s->conf.n_learners; i++, p += 8)
			rps__le_put64(p, s->conf.learners[i]);
		rps__le_put32(p, s->len);
		p += 4;
		if (s->len)
			memcpy(p, s->data, s->len);
		p += s->len;
	}
	*len = (size_t)(p - (uint8_t *)buf);
	return 0;
}

/* Bounds-checked reader: every take fails once the input is exhausted. */
struct reader {
	const uint8_t *p;
	size_t left;
};

static const uint8_t *take(struct reader *rd, size_t n)
{
	const uint8_t *p = rd->p;

	if (n > rd->left)
		return NULL;
	rd->p += n;
	rd->left -= n;
	return p;
}

/* First pass: validate the structure and size what the copy needs. */
static int wire_scan(const uint8_t *buf, size_t len, uint32_t *n_entries, bool *has_snap, size_t *data)
{
	struct reader rd = { buf, len };
	const uint8_t *p = take(&rd, WIRE_HDR);
	uint32_t n;

	if (!p || p[0] != WIRE_VERSION || p[1] < RPS__RAFT_MSG_APP || p[1] > RPS__RAFT_MSG_TYPE_MAX ||
	    p[2] > 1 || (p[3] & ~RPS__RAFT_MSG_F_TRANSFER) || p[4 + 64 + 4] > 1)
		return -EBADMSG;
	n = rps__le_get32(p + 4 + 64);
	*has_snap = p[4 + 64 + 4];
	if ((n && p[1] != RPS__RAFT_MSG_APP) || (*has_snap != (p[1] == RPS__RAFT_MSG_SNAP)))
		return -EBADMSG;
	if (n > rd.left / WIRE_ENTRY_HDR)
		return -EBADMSG;	/* before any allocation sized by n */
	*n_entries = n;
	*data = 0;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = take(&rd, WIRE_ENTRY_HDR);
		uint32_t elen;

		if (!e || rps__le_get32(e + 16) > RPS__RAFT_ENTRY_CONF)
			return -EBADMSG;
		elen = rps__le_get32(e + 20);
		if (elen > RPS__RAFT_MAX_DATA || !take(&rd, elen))
			return -EBADMSG;
		*data += elen;
	}
	if (*has_snap) {
		const uint8_t *s = take(&rd, 24);
		uint32_t nv, nl, slen;

		if (!s)
			return -EBADMSG;
		nv = rps__le_get32(s + 16);
		nl = rps__le_get32(s + 20);
		if (nv > RPS__RAFT_MAX_NODES || nl > RPS__RAFT_MAX_NODES || nv + nl > RPS__RAFT_MAX_NODES ||
		    !take(&rd, 8u * (nv + nl)))
			return -EBADMSG;
		s = take(&rd, 4);
		if (!s)
			return -EBADMSG;
		slen = rps__le_get32(s);
		if (slen > RPS__RAFT_MAX_DATA || !take(&rd, slen))
			return -EBADMSG;
		*data += slen;
	}
	if (rd.left)
		return -EBADMSG;	/* trailing garbage: the framing is off */
	return 0;
}

int rps__raft_msg_decode(const void *buf, size_t len, struct rps__raft_msg **out)
{
	struct rps__raft_entry *ents;
	struct rps__raft_snapshot *snap = NULL;
	struct rps__raft_msg *m;
	const uint8_t *p = buf;
	uint8_t *block, *data;
	uint32_t n;
	size_t data_len, size, off_ents, off_snap, off_data;
	bool has_snap;
	int err;

	*out = NULL;
	err = wire_scan(buf, len, &n, &has_snap, &data_len);
	if (err)
		return rps__seterr(err, "raft: malformed message of %zu bytes", len);
	off_ents = RPS__ALIGN_UP(sizeof(*m), 8);
	off_snap = off_ents + RPS__ALIGN_UP((size_t)n * sizeof(*ents), 8);
	off_data = off_snap + (has_snap ? RPS__ALIGN_UP(sizeof(*snap), 8) : 0);
	size = off_data + data_len;
	block = calloc(1, size);
	if (!block)
		return rps__seterr(-ENOMEM, "raft: no memory to decode a message of %zu bytes", len);
	m = (struct rps__raft_msg *)(void *)block;
	ents = (struct rps__raft_entry *)(void *)(block + off_ents);
	data = block + off_data;

	m->type = p[1];
	m->reject = p[2];
	m->flags = p[3];
	p += 4;
	m->to = rps__le_get64(p);
	m->from = rps__le_get64(p + 8);
	m->term = rps__le_get64(p + 16);
	m->log_term = rps__le_get64(p + 24);
	m->index = rps__le_get64(p + 32);
	m->commit = rps__le_get64(p + 40);
	m->hint = rps__le_get64(p + 48);
	m->context = rps__le_get64(p + 56);
	p += 64 + 4 + 1;
	m->n_entries = n;
	m->entries = n ? ents : NULL;
	for (uint32_t i = 0; i < n; i++) {
		ents[i].term = rps__le_get64(p);
		ents[i].index = rps__le_get64(p + 8);
		ents[i].type = rps__le_get32(p + 16);
		ents[i].len = rps__le_get32(p + 20);
		p += WIRE_ENTRY_HDR;
		ents[i].data = data;
		memcpy(data, p, ents[i].len);
		data += ents[i].len;
		p += ents[i].len;
	}
	if (has_snap) {
		snap = (struct rps__raft_snapshot *)(void *)(block + off_snap);
		snap->index = rps__le_get64(p);
		snap->term = rps__le_get64(p + 8);
		snap->conf.n_voters = rps__le_get32(p + 16);
		snap->conf.n_learners = rps__le_get32(p + 20);
		p += 24;
		for (uint32_t i = 0; i < snap->conf.n_voters; i++, p += 8)
			snap->conf.voters[i] = rps__le_get64(p);
		for (uint32_t i = 0; i < snap->conf.n_learners; i++, p += 8)
			snap->conf.learners[i] = rps__le_get64(p);
		snap->len = rps__le_get32(p);
		p += 4;
		snap->data = data;
		memcpy(data, p, snap->len);
		m->snapshot = snap;
	}
	m->owned = NULL;	/* the whole block is m itself */
	*out = m;
	return 0;
}

void rps__raft_msg_free(struct rps__raft_msg *m)
{
	free(m);
}

const char *rps__raft_msg_type_name(int type)
{
	static const char *const names[] = {
		[RPS__RAFT_MSG_APP] = "App",
		[RPS__RAFT_MSG_APP_RESP] = "AppResp",
		[RPS__RAFT_MSG_VOTE] = "Vote",
		[RPS__RAFT_MSG_VOTE_RESP] = "VoteResp",
		[RPS__RAFT_MSG_PRE_VOTE] = "PreVote",
		[RPS__RAFT_MSG_PRE_VOTE_RESP] = "PreVoteResp",
		[RPS__RAFT_MSG_HEARTBEAT] = "Heartbeat",
		[RPS__RAFT_MSG_HEARTBEAT_RESP] = "HeartbeatResp",
		[RPS__RAFT_MSG_SNAP] = "Snap",
		[RPS__RAFT_MSG_TIMEOUT_NOW] = "TimeoutNow",
		[RPS__RAFT_MSG_READ_INDEX] = "ReadIndex",
		[RPS__RAFT_MSG_READ_INDEX_RESP] = "ReadIndexResp",
	};

	if (type < RPS__RAFT_MSG_APP || type > RPS__RAFT_MSG_TYPE_MAX)
		return "?";
	return names[type];
}
