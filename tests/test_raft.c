/*
 * test_raft.c - unit tests of the Raft core (src/control/raft.c) and the seeded
 * simulator runs (tests/raft_sim.c).
 *
 * The unit tests follow etcd-raft's checklist: elections and vote rules,
 * PreVote and CheckQuorum, log replication and its flow control, the commit
 * rule of the current term, leadership transfer, learners and membership
 * changes, snapshots, ReadIndex, restarts, the ready contract and the wire
 * codec.  Single cores are driven with hand-made messages where the exact
 * exchange matters; clusters run in the simulator (which checks the safety
 * invariants all along) where the outcome matters.
 *
 * Environment: RAFT_SIM_SEEDS=N runs N random scenarios (default 2500),
 * RAFT_SIM_FIRST=F starts at seed F, RAFT_SIM_SEED=S replays seed S alone and
 * RAFT_SIM_TRACE=1 prints its events (2: and every message).
 */
#include "config.h"
#include "common/common.h"
#include "common/le.h"
#include "control/raft.h"
#include "raft_sim.h"
#include "lib/cutest.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* single cores */

#define MAX_GOT 256

/* Messages taken out of readies (headers only: entries go with advance). */
struct got {
	size_t n;
	struct rps__raft_msg m[MAX_GOT];
	uint64_t first_entry[MAX_GOT];
	struct rps__raft_hard_state hs;
	size_t n_read_states;
	struct rps__raft_read_state rs[16];
};

static void drain(struct rps__raft *r, struct got *g)
{
	struct rps__raft_ready rd;

	memset(g, 0, sizeof(*g));
	while (rps__raft_ready(r, &rd) > 0) {
		for (size_t i = 0; i < rd.n_msgs && g->n < MAX_GOT; i++) {
			g->m[g->n] = rd.msgs[i];
			g->first_entry[g->n] = rd.msgs[i].n_entries ? rd.msgs[i].entries[0].index : 0;
			g->m[g->n].entries = NULL;
			g->m[g->n].snapshot = NULL;
			g->m[g->n].owned = NULL;
			g->n++;
		}
		for (size_t i = 0; i < rd.n_read_states && g->n_read_states < 16; i++)
			g->rs[g->n_read_states++] = rd.read_states[i];
		g->hs = rd.hard_state;
		rps__raft_advance(r, &rd);
	}
}

static size_t count(const struct got *g, uint8_t type, uint64_t to)
{
	size_t n = 0;

	for (size_t i = 0; i < g->n; i++)
		if (g->m[i].type == type && (!to || g->m[i].to == to))
			n++;
	return n;
}

static const struct rps__raft_msg *find(const struct got *g, uint8_t type, uint64_t to)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->m[i].type == type && (!to || g->m[i].to == to))
			return &g->m[i];
	return NULL;
}

/* The message, or the test stops here (and fails) rather than crash. */
static const struct rps__raft_msg *must_find(const struct got *g, uint8_t type, uint64_t to)
{
	const struct rps__raft_msg *m = find(g, type, to);

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	return m;
}

static struct rps__raft_config config(uint64_t id, bool pre_vote, bool check_quorum)
{
	struct rps__raft_config c = {
		.id = id, .election_ticks = 10, .heartbeat_ticks = 1, .pre_vote = pre_vote,
		.check_quorum = check_quorum, .max_inflight_msgs = 256, .max_msg_entries = 64, .seed = id,
	};
	return c;
}

/* A core restored with the bootstrap snapshot (index 1, voters 1..n) and
 * entries of the given terms at indexes 2, 3, ... */
static struct rps__raft *core_with_log(struct rps__raft_config *cfg, unsigned voters, const uint64_t *terms,
				       size_t n, uint64_t term, uint64_t commit)
{
	struct rps__raft_snapshot snap = { .index = 1, .term = 1 };
	struct rps__raft_entry ents[64];
	struct rps__raft_persisted p = { .hard_state = { term, 0, commit }, .snapshot = &snap, .entries = ents,
					 .n_entries = n };
	struct rps__raft *r = NULL;
	struct got g;

	for (unsigned i = 0; i < voters; i++)
		snap.conf.voters[snap.conf.n_voters++] = i + 1;
	for (size_t i = 0; i < n; i++) {
		memset(&ents[i], 0, sizeof(ents[i]));
		ents[i].term = terms[i];
		ents[i].index = i + 2;
	}
	CU_ASSERT_EQUAL_FATAL(rps__raft_new(cfg, &p, &r), 0);
	drain(r, &g);
	return r;
}

static struct rps__raft_msg msg(uint8_t type, uint64_t from, uint64_t to, uint64_t term)
{
	struct rps__raft_msg m;

	memset(&m, 0, sizeof(m));
	m.type = type;
	m.from = from;
	m.to = to;
	m.term = term;
	return m;
}

/* Make core 1 leader through a hand-made vote from 2. */
static void elect(struct rps__raft *r, struct got *g)
{
	struct rps__raft_status st;
	struct rps__raft_msg m;

	CU_ASSERT_EQUAL(rps__raft_campaign(r), 0);
	drain(r, g);
	rps__raft_status(r, &st);
	m = msg(RPS__RAFT_MSG_VOTE_RESP, 2, 1, st.term);
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL_FATAL(st.role, RPS__RAFT_LEADER);
}

static void test_bootstrap_and_join(void)
{
	static const uint64_t peers[] = { 3, 1, 2 };
	struct rps__raft_config cfg = config(1, true, true);
	struct rps__raft_ready rd;
	struct rps__raft_status st;
	struct rps__raft *r, *j;

	cfg.peers = peers;
	cfg.n_peers = 3;
	CU_ASSERT_EQUAL_FATAL(rps__raft_new(&cfg, NULL, &r), 0);
	CU_ASSERT_EQUAL_FATAL(rps__raft_ready(r, &rd), 1);
	/* the configuration comes as an atomic snapshot, identical everywhere */
	CU_ASSERT_PTR_NOT_NULL_FATAL(rd.snapshot);
	CU_ASSERT_EQUAL(rd.snapshot->index, 1);
	CU_ASSERT_EQUAL(rd.snapshot->term, 1);
	CU_ASSERT_EQUAL(rd.snapshot->conf.n_voters, 3);
	CU_ASSERT_EQUAL(rd.snapshot->conf.voters[0], 1);
	CU_ASSERT_EQUAL(rd.snapshot->conf.voters[2], 3);
	CU_ASSERT_TRUE(rd.hard_state_changed);
	CU_ASSERT_EQUAL(rd.hard_state.term, 1);
	CU_ASSERT_EQUAL(rd.hard_state.commit, 1);
	CU_ASSERT_EQUAL(rd.n_entries, 0);
	CU_ASSERT_EQUAL(rd.n_committed, 0);
	CU_ASSERT_EQUAL(rps__raft_advance(r, &rd), 0);
	CU_ASSERT_EQUAL(rps__raft_ready(r, &rd), 0);
	rps__raft_status(r, &st);
	CU_ASSERT_TRUE(st.promotable);

	/* a joiner knows nothing, and never campaigns on its own */
	cfg = config(4, true, true);
	CU_ASSERT_EQUAL_FATAL(rps__raft_new(&cfg, NULL, &j), 0);
	CU_ASSERT_EQUAL(rps__raft_ready(j, &rd), 0);
	for (int i = 0; i < 100; i++)
		CU_ASSERT_EQUAL(rps__raft_tick(j), 0);
	CU_ASSERT_EQUAL(rps__raft_ready(j, &rd), 0);
	rps__raft_status(j, &st);
	CU_ASSERT_FALSE(st.promotable);
	CU_ASSERT_EQUAL(st.term, 0);
	CU_ASSERT_EQUAL(rps__raft_campaign(j), -EPERM);
	rps__raft_free(j);
	rps__raft_free(r);
}

static void test_config_and_restore_validation(void)
{
	static const uint64_t dup[] = { 1, 2, 2 };
	struct rps__raft_snapshot snap = { .index = 5, .term = 2, .conf = { .n_voters = 1, .voters = { 1 } } };
	struct rps__raft_entry ents[2] = { { .term = 2, .index = 6 }, { .term = 4, .index = 8 } };
	struct rps__raft_persisted p = { .hard_state = { 2, 0, 5 }, .snapshot = &snap, .entries = ents, .n_entries = 2 };
	struct rps__raft_config cfg = config(1, false, false);
	struct rps__raft_status st;
	struct rps__raft *r = NULL;

	cfg.id = 0;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, NULL, &r), -EINVAL);
	cfg = config(1, false, false);
	cfg.election_ticks = 1;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, NULL, &r), -EINVAL);
	cfg = config(1, false, false);
	cfg.heartbeat_ticks = 0;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, NULL, &r), -EINVAL);
	cfg = config(1, false, false);
	cfg.max_inflight_msgs = 0;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, NULL, &r), -EINVAL);
	cfg = config(1, false, false);
	cfg.peers = dup;
	cfg.n_peers = 3;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, NULL, &r), -EINVAL);
	CU_ASSERT_PTR_NULL(r);

	cfg = config(1, false, false);
	/* a gap in the stored log */
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, &p, &r), -EINVAL);
	/* a commit index beyond the stored log */
	ents[1].index = 7;
	p.hard_state.commit = 9;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, &p, &r), -EINVAL);
	/* entries persisted, hard state not yet (a crash between): the term
	 * catches up with the log, the vote is not invented; entries the
	 * snapshot covers (compacted after they were stored) are skipped */
	{
		static struct rps__raft_entry three[3] = { { .term = 2, .index = 5 }, { .term = 2, .index = 6 },
							   { .term = 4, .index = 7 } };

		p.entries = three;
		p.n_entries = 3;
	}
	p.hard_state.commit = 6;
	CU_ASSERT_EQUAL_FATAL(rps__raft_new(&cfg, &p, &r), 0);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.term, 4);
	CU_ASSERT_EQUAL(st.vote, 0);
	CU_ASSERT_EQUAL(st.commit, 6);
	CU_ASSERT_EQUAL(st.applied, 5);
	CU_ASSERT_EQUAL(st.last_index, 7);
	CU_ASSERT_EQUAL(st.snapshot_index, 5);
	rps__raft_free(r);
}

static void test_ready_contract(void)
{
	struct rps__raft_config cfg = config(1, false, false);
	static const uint64_t terms[] = { 1 };
	struct rps__raft *r = core_with_log(&cfg, 3, terms, 1, 1, 1);
	struct rps__raft_msg m = msg(RPS__RAFT_MSG_VOTE, 2, 1, 2);
	struct rps__raft_ready rd;

	CU_ASSERT_EQUAL(rps__raft_ready(r, &rd), 0);	/* nothing to do */
	m.index = 2;
	m.log_term = 1;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	CU_ASSERT_EQUAL_FATAL(rps__raft_ready(r, &rd), 1);
	/* the vote to persist travels with the answer that promises it */
	CU_ASSERT_TRUE(rd.hard_state_changed);
	CU_ASSERT_EQUAL(rd.hard_state.term, 2);
	CU_ASSERT_EQUAL(rd.hard_state.vote, 2);
	CU_ASSERT_EQUAL_FATAL(rd.n_msgs, 1);
	CU_ASSERT_EQUAL(rd.msgs[0].type, RPS__RAFT_MSG_VOTE_RESP);
	CU_ASSERT_FALSE(rd.msgs[0].reject);
	/* nothing may change what the ready hands out until advance */
	CU_ASSERT_EQUAL(rps__raft_tick(r), -EBUSY);
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EBUSY);
	CU_ASSERT_EQUAL(rps__raft_propose(r, "x", 1, NULL, NULL), -EBUSY);
	CU_ASSERT_EQUAL(rps__raft_read_index(r, 1), -EBUSY);
	CU_ASSERT_EQUAL(rps__raft_compact(r, 1, NULL, 0, NULL), -EBUSY);
	CU_ASSERT_EQUAL(rps__raft_ready(r, &rd), -EBUSY);
	CU_ASSERT_EQUAL(rps__raft_advance(r, &rd), 0);
	CU_ASSERT_EQUAL(rps__raft_advance(r, &rd), -EINVAL);
	CU_ASSERT_EQUAL(rps__raft_ready(r, &rd), 0);
	/* misrouted and malformed messages */
	m.to = 9;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EINVAL);
	m.to = 1;
	m.type = 77;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EINVAL);
	m.type = RPS__RAFT_MSG_APP;
	m.n_entries = 1;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EINVAL);	/* entries missing */
	rps__raft_free(r);
}

/* ------------------------------------------------------------------------ */
/* elections */

static struct sim *cluster(unsigned n, bool pre_vote, bool check_quorum)
{
	struct sim_config c = {
		.n_voters = n, .election_ticks = 10, .heartbeat_ticks = 1, .max_inflight = 8, .max_entries = 8,
		.pre_vote = pre_vote, .check_quorum = check_quorum, .seed = 42,
	};
	struct sim *s = sim_new(&c);

	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	return s;
}

/* A cluster with node `leader` elected and everything delivered. */
static struct sim *cluster_led_by(unsigned n, bool pre_vote, bool check_quorum, uint64_t leader)
{
	struct sim *s = cluster(n, pre_vote, check_quorum);

	CU_ASSERT_EQUAL(sim_campaign(s, leader), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL_FATAL(sim_leader(s), leader);
	return s;
}

static void assert_no_violation(struct sim *s)
{
	const char *e = sim_error(s);

	if (e)
		fprintf(stderr, "\n  simulator: %s\n", e);
	CU_ASSERT_PTR_NULL(e);
}

static void test_leader_election(void)
{
	for (unsigned n = 1; n <= 5; n += 2)
		for (int pv = 0; pv < 2; pv++) {
			struct sim *s = cluster(n, pv, true);
			struct rps__raft_status st;

			CU_ASSERT_EQUAL(sim_campaign(s, 1), 0);
			sim_deliver_all(s);
			CU_ASSERT_EQUAL(sim_leader(s), 1);
			for (uint64_t id = 1; id <= n; id++) {
				sim_status(s, id, &st);
				CU_ASSERT_EQUAL(st.term, 2);
				CU_ASSERT_EQUAL(st.leader, 1);
				CU_ASSERT_EQUAL(st.role, id == 1 ? RPS__RAFT_LEADER : RPS__RAFT_FOLLOWER);
				/* the leader's empty entry of term 2 is committed */
				CU_ASSERT_EQUAL(st.commit, 2);
			}
			assert_no_violation(s);
			sim_free(s);
		}
}

static void test_election_needs_a_quorum(void)
{
	for (int pv = 0; pv < 2; pv++) {
		struct sim *s = cluster(3, pv, false);
		struct rps__raft_status st;

		sim_isolate(s, 1);
		CU_ASSERT_EQUAL(sim_campaign(s, 1), 0);
		sim_deliver_all(s);
		sim_status(s, 1, &st);
		if (pv) {
			/* a lost PreVote leaves the term alone */
			CU_ASSERT_EQUAL(st.role, RPS__RAFT_PRE_CANDIDATE);
			CU_ASSERT_EQUAL(st.term, 1);
		} else {
			CU_ASSERT_EQUAL(st.role, RPS__RAFT_CANDIDATE);
			CU_ASSERT_EQUAL(st.term, 2);
			CU_ASSERT_EQUAL(st.vote, 1);
		}
		CU_ASSERT_EQUAL(sim_leader(s), 0);
		assert_no_violation(s);
		sim_free(s);
	}
}

static void test_randomized_election_timeout(void)
{
	static const uint64_t peers[] = { 1, 2, 3 };
	bool seen[20] = { false };
	unsigned distinct = 0;

	for (uint64_t seed = 1; seed <= 60; seed++) {
		struct rps__raft_config cfg = config(1, false, false);
		struct rps__raft *r;
		struct got g;
		unsigned t;

		cfg.peers = peers;
		cfg.n_peers = 3;
		cfg.seed = seed;
		CU_ASSERT_EQUAL_FATAL(rps__raft_new(&cfg, NULL, &r), 0);
		drain(r, &g);
		for (t = 1; t < 100; t++) {
			rps__raft_tick(r);
			drain(r, &g);
			if (count(&g, RPS__RAFT_MSG_VOTE, 0))
				break;
		}
		/* in [election, 2 * election) */
		CU_ASSERT(t >= 10 && t < 20);
		if (t < 20 && !seen[t]) {
			seen[t] = true;
			distinct++;
		}
		rps__raft_free(r);
	}
	CU_ASSERT(distinct >= 6);
}

static void test_vote_rules(void)
{
	/* our log: (1,1) snapshot, (2,1), (3,2); term 2 */
	static const uint64_t terms[] = { 1, 2 };
	static const struct {
		uint64_t index, log_term;
		bool granted;
	} cases[] = {
		{ 3, 2, true },		/* as up to date */
		{ 4, 2, true },		/* longer */
		{ 1, 3, true },		/* higher last term beats length */
		{ 2, 2, false },	/* shorter, same last term */
		{ 9, 1, false },	/* lower last term loses whatever the length */
	};

	for (size_t i = 0; i < RPS__ARRAY_SIZE(cases); i++) {
		struct rps__raft_config cfg = config(1, false, false);
		struct rps__raft *r = core_with_log(&cfg, 3, terms, 2, 2, 1);
		struct rps__raft_msg m = msg(RPS__RAFT_MSG_VOTE, 2, 1, 3);
		const struct rps__raft_msg *resp;
		struct got g;

		m.index = cases[i].index;
		m.log_term = cases[i].log_term;
		CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
		drain(r, &g);
		resp = find(&g, RPS__RAFT_MSG_VOTE_RESP, 2);
		CU_ASSERT_PTR_NOT_NULL_FATAL(resp);
		CU_ASSERT_EQUAL(resp->reject, !cases[i].granted);
		CU_ASSERT_EQUAL(resp->term, 3);
		CU_ASSERT_EQUAL(g.hs.vote, cases[i].granted ? 2 : 0);
		rps__raft_free(r);
	}

	/* one vote per term; asking again gets the same answer */
	{
		struct rps__raft_config cfg = config(1, false, false);
		struct rps__raft *r = core_with_log(&cfg, 3, terms, 2, 2, 1);
		struct rps__raft_msg m = msg(RPS__RAFT_MSG_VOTE, 2, 1, 3);
		struct got g;

		m.index = 3;
		m.log_term = 2;
		rps__raft_step(r, &m);
		drain(r, &g);
		CU_ASSERT_FALSE(must_find(&g, RPS__RAFT_MSG_VOTE_RESP, 2)->reject);
		m.from = 3;
		rps__raft_step(r, &m);
		drain(r, &g);
		CU_ASSERT_TRUE(must_find(&g, RPS__RAFT_MSG_VOTE_RESP, 3)->reject);
		m.from = 2;
		rps__raft_step(r, &m);
		drain(r, &g);
		CU_ASSERT_FALSE(must_find(&g, RPS__RAFT_MSG_VOTE_RESP, 2)->reject);
		/* and a stale term is not answered at all */
		m.term = 1;
		rps__raft_step(r, &m);
		drain(r, &g);
		CU_ASSERT_EQUAL(g.n, 0);
		rps__raft_free(r);
	}
}

static void test_pre_vote_changes_nothing(void)
{
	static const uint64_t terms[] = { 1, 2 };
	struct rps__raft_config cfg = config(1, true, false);
	struct rps__raft *r = core_with_log(&cfg, 3, terms, 2, 2, 1);
	struct rps__raft_msg m = msg(RPS__RAFT_MSG_PRE_VOTE, 2, 1, 3);
	const struct rps__raft_msg *resp;
	struct rps__raft_status st;
	struct got g;

	m.index = 3;
	m.log_term = 2;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	resp = find(&g, RPS__RAFT_MSG_PRE_VOTE_RESP, 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(resp);
	CU_ASSERT_FALSE(resp->reject);
	CU_ASSERT_EQUAL(resp->term, 3);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.term, 2);
	CU_ASSERT_EQUAL(st.vote, 0);
	/* granted to several: it is only a poll */
	m.from = 3;
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_FALSE(must_find(&g, RPS__RAFT_MSG_PRE_VOTE_RESP, 3)->reject);
	/* a candidate with a stale log is told no, at our term */
	m.index = 2;
	m.log_term = 1;
	rps__raft_step(r, &m);
	drain(r, &g);
	resp = find(&g, RPS__RAFT_MSG_PRE_VOTE_RESP, 3);
	CU_ASSERT_TRUE(resp->reject);
	CU_ASSERT_EQUAL(resp->term, 2);
	rps__raft_free(r);
}

static void test_candidate_falls_back_to_follower(void)
{
	struct rps__raft_config cfg = config(1, false, false);
	struct rps__raft *r = core_with_log(&cfg, 3, NULL, 0, 1, 1);
	struct rps__raft_msg m;
	struct rps__raft_status st;
	struct got g;

	CU_ASSERT_EQUAL(rps__raft_campaign(r), 0);
	drain(r, &g);
	CU_ASSERT_EQUAL(count(&g, RPS__RAFT_MSG_VOTE, 0), 2);
	/* a leader of our term appends: it won, we follow */
	m = msg(RPS__RAFT_MSG_APP, 2, 1, 2);
	m.index = 1;
	m.log_term = 1;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.role, RPS__RAFT_FOLLOWER);
	CU_ASSERT_EQUAL(st.leader, 2);
	CU_ASSERT_EQUAL(st.term, 2);
	CU_ASSERT_EQUAL(st.vote, 1);	/* the vote of a term is never forgotten */
	/* any message of a higher term: follower of that term, no leader known */
	m = msg(RPS__RAFT_MSG_HEARTBEAT_RESP, 3, 1, 7);
	drain(r, &g);
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.term, 7);
	CU_ASSERT_EQUAL(st.vote, 0);
	CU_ASSERT_EQUAL(st.leader, 0);
	rps__raft_free(r);
}

/* ------------------------------------------------------------------------ */
/* replication and commit */

static void test_single_node_commits_alone(void)
{
	struct sim *s = cluster(1, true, true);
	uint64_t index, owner, epoch;

	CU_ASSERT_EQUAL(sim_campaign(s, 1), 0);
	CU_ASSERT_EQUAL(sim_leader(s), 1);
	CU_ASSERT_EQUAL(sim_write(s, 1, 2, 77), 0);
	sim_shard(s, 1, 2, &owner, &epoch);
	CU_ASSERT_EQUAL(owner, 77);
	CU_ASSERT_EQUAL(epoch, 1);
	CU_ASSERT_EQUAL(sim_propose(s, 1, "abc", 3, &index), 0);
	CU_ASSERT_EQUAL(sim_applied(s, 1), index);
	{
		uint64_t ctx;

		/* alone, it is its own quorum: reads are ready at once */
		CU_ASSERT_EQUAL(sim_read(s, 1, 2, &ctx), 0);
		CU_ASSERT_EQUAL(sim_read_result(s, ctx), 2);
	}
	assert_no_violation(s);
	sim_free(s);
}

static void test_log_replication(void)
{
	struct sim *s = cluster_led_by(5, true, true, 1);
	uint64_t owner, epoch;

	for (uint32_t i = 0; i < 20; i++)
		CU_ASSERT_EQUAL(sim_write(s, 1, i % SIM_SHARDS, 100 + i), 0);
	sim_deliver_all(s);
	sim_tick_all(s, 2);	/* heartbeats carry the final commit index */
	for (uint64_t id = 1; id <= 5; id++) {
		CU_ASSERT_EQUAL(sim_applied(s, id), 22);
		sim_shard(s, id, 3, &owner, &epoch);
		CU_ASSERT_EQUAL(owner, 119);
		CU_ASSERT_EQUAL(epoch, 5);
	}
	/* not the leader: refused, with a hint */
	CU_ASSERT_EQUAL(sim_write(s, 2, 0, 1), -EPERM);
	CU_ASSERT_EQUAL(rps__raft_leader(sim_raft(s, 2)), 1);
	assert_no_violation(s);
	sim_free(s);
}

/* Raft figure 8: a leader never commits an entry of an older term by
 * counting replicas; it commits with the first entry of its own term. */
static void test_commit_only_current_term_by_counting(void)
{
	static const uint64_t terms[] = { 2 };	/* (2, term 2), never committed */
	struct rps__raft_config cfg = config(1, false, false);
	struct rps__raft *r = core_with_log(&cfg, 3, terms, 1, 2, 1);
	struct rps__raft_status st;
	struct rps__raft_msg m;
	const struct rps__raft_msg *hb;
	struct got g;

	elect(r, &g);	/* term 3, empty entry at index 3 */
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.term, 3);
	CU_ASSERT_EQUAL(st.last_index, 3);
	m = msg(RPS__RAFT_MSG_APP_RESP, 2, 1, 3);
	m.index = 2;	/* a majority (1 and 2) now holds index 2 */
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.commit, 1);
	m.index = 3;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.commit, 3);
	/* heartbeats never tell a follower to commit past what it holds */
	rps__raft_tick(r);
	drain(r, &g);
	hb = find(&g, RPS__RAFT_MSG_HEARTBEAT, 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(hb);
	CU_ASSERT_EQUAL(hb->commit, 3);
	hb = find(&g, RPS__RAFT_MSG_HEARTBEAT, 3);
	CU_ASSERT_PTR_NOT_NULL_FATAL(hb);
	CU_ASSERT_EQUAL(hb->commit, 0);
	rps__raft_free(r);
}

static void test_follower_append_rules(void)
{
	/* follower log (2,1) (3,2) (4,2), commit 2 */
	static const uint64_t terms[] = { 1, 2, 2 };
	struct rps__raft_config cfg = config(2, false, false);
	struct rps__raft *r = core_with_log(&cfg, 3, terms, 3, 2, 2);
	struct rps__raft_entry ents[2] = { { .term = 3, .index = 4 }, { .term = 3, .index = 5 } };
	struct rps__raft_msg m = msg(RPS__RAFT_MSG_APP, 1, 2, 3);
	struct rps__raft_ready rd;
	struct rps__raft_status st;
	const struct rps__raft_msg *resp;
	struct got g;

	/* matching, but nothing new: commit only what the append verified (our
	 * (3,2), (4,2) may be a stale suffix the leader has not overwritten yet) */
	m.index = 2;
	m.log_term = 1;
	m.commit = 4;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.commit, 2);
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_APP_RESP, 1)->index, 2);
	m.commit = 0;
	/* mismatch at (4, term 3): rejected with a hint where logs may match */
	m.index = 4;
	m.log_term = 3;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	resp = find(&g, RPS__RAFT_MSG_APP_RESP, 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(resp);
	CU_ASSERT_TRUE(resp->reject);
	CU_ASSERT_EQUAL(resp->index, 4);
	CU_ASSERT_EQUAL(resp->hint, 4);
	CU_ASSERT_EQUAL(resp->log_term, 2);
	/* beyond our log: the hint is our last index */
	m.index = 9;
	m.log_term = 3;
	rps__raft_step(r, &m);
	drain(r, &g);
	resp = find(&g, RPS__RAFT_MSG_APP_RESP, 1);
	CU_ASSERT_TRUE(resp->reject);
	CU_ASSERT_EQUAL(resp->hint, 4);
	/* a conflicting uncommitted suffix is replaced: the ready says from where */
	m.index = 3;
	m.log_term = 2;
	m.entries = ents;
	m.n_entries = 2;
	m.commit = 5;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	CU_ASSERT_EQUAL_FATAL(rps__raft_ready(r, &rd), 1);
	CU_ASSERT_EQUAL_FATAL(rd.n_entries, 2);
	CU_ASSERT_EQUAL(rd.entries[0].index, 4);
	CU_ASSERT_EQUAL(rd.entries[0].term, 3);
	CU_ASSERT_EQUAL(rd.hard_state.commit, 5);
	CU_ASSERT_EQUAL(rd.n_committed, 3);	/* 3, 4, 5 */
	CU_ASSERT_EQUAL_FATAL(rd.n_msgs, 1);
	CU_ASSERT_FALSE(rd.msgs[0].reject);
	CU_ASSERT_EQUAL(rd.msgs[0].index, 5);
	rps__raft_advance(r, &rd);
	/* a stale append below the commit index is answered with the commit */
	m.index = 2;
	m.log_term = 1;
	m.entries = NULL;
	m.n_entries = 0;
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_APP_RESP, 1)->index, 5);
	/* entries that do not follow the append's position are refused */
	ents[0].index = 7;
	m.index = 5;
	m.log_term = 3;
	m.entries = ents;
	m.n_entries = 1;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EBADMSG);
	ents[0].index = 4;
	drain(r, &g);
	/* a duplicate of what we hold changes nothing */
	m.index = 3;
	m.log_term = 2;
	m.entries = ents;
	m.n_entries = 2;
	rps__raft_step(r, &m);
	CU_ASSERT_EQUAL(rps__raft_ready(r, &rd), 1);
	CU_ASSERT_EQUAL(rd.n_entries, 0);
	rps__raft_advance(r, &rd);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.last_index, 5);
	rps__raft_free(r);
}

/* The configuration in force is the latest in the log, committed or not:
 * losing an uncommitted change to a new leader gives the old one back. */
static void test_uncommitted_conf_change_rolled_back(void)
{
	struct rps__raft_snapshot snap = { .index = 1, .term = 1, .conf = { .n_voters = 3, .voters = { 1, 2, 3 } } };
	uint8_t remove3[9] = { RPS__RAFT_CONF_REMOVE, 3 };
	struct rps__raft_entry ents[2] = {
		{ .term = 1, .index = 2 },
		{ .term = 2, .index = 3, .type = RPS__RAFT_ENTRY_CONF, .len = sizeof(remove3), .data = remove3 },
	};
	struct rps__raft_persisted p = { .hard_state = { 2, 0, 2 }, .snapshot = &snap, .entries = ents, .n_entries = 2 };
	struct rps__raft_config cfg = config(2, false, false);
	struct rps__raft_entry theirs = { .term = 3, .index = 3 };
	struct rps__raft_msg m = msg(RPS__RAFT_MSG_APP, 1, 2, 3);
	struct rps__raft_status st;
	struct rps__raft *r;
	struct got g;

	CU_ASSERT_EQUAL_FATAL(rps__raft_new(&cfg, &p, &r), 0);
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.conf.n_voters, 2);	/* in force as soon as appended */
	CU_ASSERT_FALSE(rps__raft_conf_is_voter(&st.conf, 3));
	m.index = 2;
	m.log_term = 1;
	m.entries = &theirs;
	m.n_entries = 1;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.last_index, 3);
	CU_ASSERT_EQUAL(st.conf.n_voters, 3);
	CU_ASSERT_TRUE(rps__raft_conf_is_voter(&st.conf, 3));
	rps__raft_free(r);
}

static void test_flow_control(void)
{
	struct rps__raft_config cfg = config(1, false, false);
	struct rps__raft *r;
	struct rps__raft_progress_info pi;
	struct rps__raft_msg m;
	struct got g;

	cfg.max_inflight_msgs = 2;
	cfg.max_msg_entries = 1;
	r = core_with_log(&cfg, 3, NULL, 0, 1, 1);
	elect(r, &g);	/* term 2, index 2; one probe to each follower */
	CU_ASSERT_EQUAL(count(&g, RPS__RAFT_MSG_APP, 2), 1);
	CU_ASSERT_EQUAL(rps__raft_progress(r, 2, &pi), 0);
	CU_ASSERT_EQUAL(pi.state, RPS__RAFT_PROGRESS_PROBE);
	/* probing: one append at a time */
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(rps__raft_propose(r, "p", 1, NULL, NULL), 0);	/* 3, 4, 5 */
	drain(r, &g);
	CU_ASSERT_EQUAL(count(&g, RPS__RAFT_MSG_APP, 2), 0);
	/* the probe matched: replicate, pipelined up to the window */
	m = msg(RPS__RAFT_MSG_APP_RESP, 2, 1, 2);
	m.index = 2;
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_EQUAL(rps__raft_progress(r, 2, &pi), 0);
	CU_ASSERT_EQUAL(pi.state, RPS__RAFT_PROGRESS_REPLICATE);
	CU_ASSERT_EQUAL(count(&g, RPS__RAFT_MSG_APP, 2), 2);
	CU_ASSERT_EQUAL(pi.inflight, 2);
	CU_ASSERT_EQUAL(pi.next, 5);
	/* a full window stays shut... */
	CU_ASSERT_EQUAL(rps__raft_propose(r, "p", 1, NULL, NULL), 0);	/* 6 */
	drain(r, &g);
	CU_ASSERT_EQUAL(count(&g, RPS__RAFT_MSG_APP, 2), 0);
	/* ...until an ack frees a slot */
	m.index = 3;
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_EQUAL(count(&g, RPS__RAFT_MSG_APP, 2), 1);
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_APP, 2)->index, 4);
	/* or a heartbeat answer (an append may have been lost) */
	m = msg(RPS__RAFT_MSG_HEARTBEAT_RESP, 2, 1, 2);
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_EQUAL(count(&g, RPS__RAFT_MSG_APP, 2), 1);
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_APP, 2)->index, 5);
	/* a rejection sends it back to probing from its match */
	m = msg(RPS__RAFT_MSG_APP_RESP, 2, 1, 2);
	m.reject = 1;
	m.index = 5;
	m.hint = 3;
	m.log_term = 2;
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_EQUAL(rps__raft_progress(r, 2, &pi), 0);
	CU_ASSERT_EQUAL(pi.state, RPS__RAFT_PROGRESS_PROBE);
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_APP, 2)->index, 3);
	rps__raft_free(r);
}

static unsigned rejects_from_1;

static void count_rejects(void *arg, const struct rps__raft_msg *m)
{
	if (m->type == RPS__RAFT_MSG_APP_RESP && m->reject && m->from == 1)
		rejects_from_1++;
}

static void test_divergent_log_is_repaired_quickly(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status s1, s2;
	uint64_t l = 0;

	/* the old leader piles up entries nobody else has */
	sim_isolate(s, 1);
	for (int i = 0; i < 40; i++)
		CU_ASSERT_EQUAL(sim_propose(s, 1, "stale", 5, NULL), 0);
	/* the others elect a leader and commit other entries */
	for (int t = 0; t < 60 && (l = sim_leader(s)) < 2; t++)
		sim_tick_all(s, 1);
	CU_ASSERT_FATAL(l == 2 || l == 3);
	for (int i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(sim_propose(s, l, "fresh", 5, NULL), 0);
	sim_deliver_all(s);
	rejects_from_1 = 0;
	sim_set_observer(s, count_rejects, NULL);
	sim_heal(s);
	sim_tick_all(s, 5);
	sim_status(s, 1, &s1);
	sim_status(s, l, &s2);
	CU_ASSERT_EQUAL(s1.last_index, s2.last_index);
	CU_ASSERT_EQUAL(s1.commit, s2.commit);
	for (uint64_t i = s2.snapshot_index + 1; i <= s2.last_index; i++) {
		const struct rps__raft_entry *a, *b;

		CU_ASSERT_EQUAL_FATAL(rps__raft_entry_at(sim_raft(s, 1), i, &a), 0);
		CU_ASSERT_EQUAL_FATAL(rps__raft_entry_at(sim_raft(s, l), i, &b), 0);
		CU_ASSERT_EQUAL(a->term, b->term);
	}
	/* the (index, term) hint skips the whole stale term at once */
	CU_ASSERT(rejects_from_1 <= 2);
	assert_no_violation(s);
	sim_free(s);
}

/* ------------------------------------------------------------------------ */
/* PreVote, CheckQuorum */

static void test_pre_vote_prevents_disruption(void)
{
	for (int pv = 0; pv < 2; pv++) {
		struct sim *s = cluster_led_by(3, pv, pv, 1);
		struct rps__raft_status st;

		sim_isolate(s, 3);
		sim_tick(s, 3, 100);
		sim_status(s, 3, &st);
		/* with PreVote the partitioned node never raises its term */
		if (pv) {
			CU_ASSERT_EQUAL(st.term, 2);
		} else {
			CU_ASSERT(st.term > 5);
		}
		sim_drop_pending(s);
		sim_heal(s);
		sim_tick_all(s, 20);
		sim_status(s, 1, &st);
		if (pv) {
			CU_ASSERT_EQUAL(sim_leader(s), 1);
			CU_ASSERT_EQUAL(st.term, 2);
		} else {
			/* without it the rejoining node deposes a healthy leader */
			CU_ASSERT(st.term > 2);
		}
		assert_no_violation(s);
		sim_free(s);
	}
}

static void test_check_quorum_steps_down(void)
{
	for (int cq = 0; cq < 2; cq++) {
		struct sim *s = cluster_led_by(3, true, cq, 1);
		struct rps__raft_status st;

		sim_isolate(s, 1);
		/* the first check still counts the answers of the election */
		sim_tick(s, 1, 20);
		sim_status(s, 1, &st);
		CU_ASSERT_EQUAL(st.role, cq ? RPS__RAFT_FOLLOWER : RPS__RAFT_LEADER);
		CU_ASSERT_EQUAL(st.term, 2);
		/* and a leader that hears from a quorum stays */
		sim_heal(s);
		if (!cq) {
			sim_tick_all(s, 30);
			CU_ASSERT_EQUAL(sim_leader(s), 1);
		}
		assert_no_violation(s);
		sim_free(s);
	}
	{
		struct sim *s = cluster_led_by(3, true, true, 1);

		sim_tick_all(s, 50);
		CU_ASSERT_EQUAL(sim_leader(s), 1);
		assert_no_violation(s);
		sim_free(s);
	}
}

static void test_leader_lease_ignores_votes(void)
{
	for (int cq = 0; cq < 2; cq++) {
		struct sim *s = cluster_led_by(3, false, cq, 1);
		struct rps__raft_msg m = msg(RPS__RAFT_MSG_VOTE, 3, 2, 9);
		struct rps__raft_status st;

		m.index = 100;
		m.log_term = 2;
		CU_ASSERT_EQUAL(sim_step(s, 2, &m), 0);
		sim_status(s, 2, &st);
		/* 2 heard from its leader within the timeout: ignore the vote */
		CU_ASSERT_EQUAL(st.term, cq ? 2 : 9);
		CU_ASSERT_EQUAL(st.vote, cq ? 1 : 3);	/* 1: its vote for the leader */
		/* a vote requested by a leadership transfer goes through */
		m.term = 10;
		m.flags = RPS__RAFT_MSG_F_TRANSFER;
		CU_ASSERT_EQUAL(sim_step(s, 2, &m), 0);
		sim_status(s, 2, &st);
		CU_ASSERT_EQUAL(st.term, 10);
		sim_drop_pending(s);
		assert_no_violation(s);
		sim_free(s);
	}
}

/* ------------------------------------------------------------------------ */
/* leadership transfer */

static void test_leader_transfer(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status st;

	CU_ASSERT_EQUAL(sim_transfer(s, 1, 2), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_leader(s), 2);
	sim_status(s, 2, &st);
	CU_ASSERT_EQUAL(st.term, 3);
	/* to itself: nothing to do; not the leader: refused */
	CU_ASSERT_EQUAL(sim_transfer(s, 2, 2), 0);
	CU_ASSERT_EQUAL(sim_transfer(s, 1, 3), -EPERM);
	CU_ASSERT_EQUAL(sim_transfer(s, 2, 7), -EINVAL);
	assert_no_violation(s);
	sim_free(s);
}

static void test_leader_transfer_to_lagging_follower(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status st;

	sim_isolate(s, 3);
	for (int i = 0; i < 10; i++)
		CU_ASSERT_EQUAL(sim_write(s, 1, 0, 5 + i), 0);
	sim_deliver_all(s);
	sim_heal(s);
	/* 3 gets the missing entries first, then TimeoutNow */
	CU_ASSERT_EQUAL(sim_transfer(s, 1, 3), 0);
	CU_ASSERT_EQUAL(sim_write(s, 1, 0, 1), -EBUSY);	/* no proposals meanwhile */
	sim_tick_all(s, 5);
	CU_ASSERT_EQUAL(sim_leader(s), 3);
	sim_status(s, 3, &st);
	CU_ASSERT_EQUAL(st.commit, st.last_index);
	CU_ASSERT(st.last_index >= 13);
	assert_no_violation(s);
	sim_free(s);
}

static void test_leader_transfer_times_out(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status st;

	sim_isolate(s, 3);
	CU_ASSERT_EQUAL(sim_transfer(s, 1, 3), 0);
	CU_ASSERT_EQUAL(sim_transfer(s, 1, 2), -EBUSY);
	sim_tick_all(s, 10);
	sim_status(s, 1, &st);
	CU_ASSERT_EQUAL(st.role, RPS__RAFT_LEADER);
	CU_ASSERT_EQUAL(st.lead_transferee, 0);
	CU_ASSERT_EQUAL(sim_write(s, 1, 0, 1), 0);
	assert_no_violation(s);
	sim_free(s);
}

/* ------------------------------------------------------------------------ */
/* membership */

static unsigned votes_from_4;

static void count_votes_from_4(void *arg, const struct rps__raft_msg *m)
{
	if (m->from == 4 && (m->type == RPS__RAFT_MSG_VOTE || m->type == RPS__RAFT_MSG_PRE_VOTE))
		votes_from_4++;
}

static void test_learner_catches_up_then_promoted(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status st;

	for (int i = 0; i < 5; i++)
		sim_write(s, 1, 1, 10 + i);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_ADD_LEARNER, 4), 0);
	CU_ASSERT_EQUAL(sim_start_joiner(s, 4), 0);
	sim_deliver_all(s);
	sim_tick_all(s, 3);
	sim_status(s, 4, &st);
	CU_ASSERT_TRUE(rps__raft_conf_is_learner(&st.conf, 4));
	CU_ASSERT_FALSE(st.promotable);
	CU_ASSERT_EQUAL(sim_applied(s, 4), sim_applied(s, 1));
	/* a learner never campaigns */
	votes_from_4 = 0;
	sim_set_observer(s, count_votes_from_4, NULL);
	sim_isolate(s, 4);
	sim_tick(s, 4, 100);
	CU_ASSERT_EQUAL(votes_from_4, 0);
	/* a learner that fell behind cannot be promoted yet */
	for (int i = 0; i < 5; i++)
		sim_write(s, 1, 1, 20 + i);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_PROMOTE, 4), -EAGAIN);
	sim_heal(s);
	sim_tick_all(s, 3);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_PROMOTE, 4), 0);
	sim_deliver_all(s);
	sim_tick_all(s, 2);
	for (uint64_t id = 1; id <= 4; id++) {
		sim_status(s, id, &st);
		CU_ASSERT_EQUAL(st.conf.n_voters, 4);
		CU_ASSERT_TRUE(rps__raft_conf_is_voter(&st.conf, 4));
		CU_ASSERT_EQUAL(st.conf.n_learners, 0);
	}
	sim_status(s, 4, &st);
	CU_ASSERT_TRUE(st.promotable);
	/* a quorum of four is three: two nodes down stall commits */
	sim_isolate(s, 3);
	sim_isolate(s, 4);
	sim_write(s, 1, 0, 1);
	sim_deliver_all(s);
	sim_status(s, 1, &st);
	CU_ASSERT(st.commit < st.last_index);
	assert_no_violation(s);
	sim_free(s);
}

static void test_membership_change_rules(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status st;
	struct rps__raft_config cfg = config(1, false, false);
	struct rps__raft *r = core_with_log(&cfg, 3, NULL, 0, 1, 1);
	struct got g;

	/* one at a time */
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_ADD_LEARNER, 4), 0);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_ADD_LEARNER, 5), -EBUSY);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_ADD_LEARNER, 5), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_ADD_LEARNER, 5), -EEXIST);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_PROMOTE, 2), -EINVAL);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_REMOVE, 7), -ENOENT);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_REMOVE, 1), -EBUSY);	/* itself */
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_ADD_VOTER, 0), -EINVAL);
	CU_ASSERT_EQUAL(sim_conf_change(s, 2, RPS__RAFT_CONF_ADD_LEARNER, 6), -EPERM);
	/* removing learners and voters */
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_REMOVE, 5), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_REMOVE, 3), 0);
	sim_deliver_all(s);
	sim_tick_all(s, 2);
	for (uint64_t id = 1; id <= 2; id++) {
		sim_status(s, id, &st);
		CU_ASSERT_EQUAL(st.conf.n_voters, 2);
		CU_ASSERT_FALSE(rps__raft_conf_is_voter(&st.conf, 3));
		CU_ASSERT_TRUE(rps__raft_conf_is_learner(&st.conf, 4));
	}
	/* (the leader stops replicating to 3 as soon as it appends the
	 * removal: 3 may never learn it, see the next test) */
	/* {1, 2} commits with both */
	CU_ASSERT_EQUAL(sim_write(s, 1, 0, 9), 0);
	sim_deliver_all(s);
	sim_status(s, 1, &st);
	CU_ASSERT_EQUAL(st.commit, st.last_index);
	assert_no_violation(s);
	sim_free(s);

	/* a new leader changes nothing before it committed in its term */
	elect(r, &g);
	CU_ASSERT_EQUAL(rps__raft_propose_conf_change(r, RPS__RAFT_CONF_ADD_LEARNER, 4, NULL), -EAGAIN);
	CU_ASSERT_EQUAL(rps__raft_read_index(r, 1), -EAGAIN);
	rps__raft_free(r);
}

/* A configuration holds at most RPS__RAFT_MAX_VOTERS voters: a new cluster
 * starts with at most that many, a 17th is refused when proposed, and a
 * conf entry that would make one (from a forged or foreign log) changes
 * nothing when applied, alike on every node. */
static void test_voter_bound(void)
{
	static struct rps__raft_snapshot snap;	/* 8 KiB: not on the stack */
	static uint64_t peers[RPS__RAFT_MAX_VOTERS + 1];
	uint8_t promote[9] = { RPS__RAFT_CONF_PROMOTE, 17 }, add[9] = { RPS__RAFT_CONF_ADD_VOTER, 18 };
	struct rps__raft_entry ents[2] = {
		{ .term = 1, .index = 2, .type = RPS__RAFT_ENTRY_CONF, .len = sizeof(promote), .data = promote },
		{ .term = 1, .index = 3, .type = RPS__RAFT_ENTRY_CONF, .len = sizeof(add), .data = add },
	};
	struct rps__raft_persisted p = { .hard_state = { 1, 0, 1 }, .snapshot = &snap, .entries = ents, .n_entries = 2 };
	struct rps__raft_config cfg = config(1, false, false);
	struct rps__raft_status st;
	struct rps__raft_msg m;
	struct rps__raft *r = NULL;
	struct got g;

	CU_ASSERT_EQUAL(RPS__RAFT_MAX_VOTERS, 16);
	for (unsigned i = 0; i <= RPS__RAFT_MAX_VOTERS; i++)
		peers[i] = i + 1;
	cfg.peers = peers;
	cfg.n_peers = RPS__RAFT_MAX_VOTERS + 1;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, NULL, &r), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "at most 16 voters"));
	cfg.n_peers = RPS__RAFT_MAX_VOTERS;
	CU_ASSERT_EQUAL_FATAL(rps__raft_new(&cfg, NULL, &r), 0);
	rps__raft_free(r);

	/* restored: 16 voters and learner 17 fit, 17 voters or 1,025 nodes do not */
	cfg = config(1, false, false);
	memset(&snap, 0, sizeof(snap));
	snap.index = 1;
	snap.term = 1;
	for (unsigned i = 0; i < RPS__RAFT_MAX_VOTERS; i++)
		snap.conf.voters[snap.conf.n_voters++] = i + 1;
	snap.conf.learners[snap.conf.n_learners++] = 17;
	snap.conf.n_voters = RPS__RAFT_MAX_VOTERS + 1;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, &p, &r), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "17 voters"));
	snap.conf.n_voters = RPS__RAFT_MAX_VOTERS;
	snap.conf.n_learners = RPS__RAFT_MAX_NODES - RPS__RAFT_MAX_VOTERS + 1;
	CU_ASSERT_EQUAL(rps__raft_new(&cfg, &p, &r), -EINVAL);
	snap.conf.n_learners = 1;
	/* the log's promotion of 17 and addition of voter 18 change nothing */
	CU_ASSERT_EQUAL_FATAL(rps__raft_new(&cfg, &p, &r), 0);
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.last_index, 3);
	CU_ASSERT_EQUAL(st.conf.n_voters, RPS__RAFT_MAX_VOTERS);
	CU_ASSERT_EQUAL(st.conf.n_learners, 1);
	CU_ASSERT_TRUE(rps__raft_conf_is_learner(&st.conf, 17));
	CU_ASSERT_FALSE(rps__raft_conf_is_voter(&st.conf, 18) || rps__raft_conf_is_learner(&st.conf, 18));

	/* elected by 8 others of 16, its no-op (4) committed by 8 others */
	CU_ASSERT_EQUAL(rps__raft_campaign(r), 0);
	drain(r, &g);
	rps__raft_status(r, &st);
	for (uint64_t id = 2; id <= 9; id++) {
		m = msg(RPS__RAFT_MSG_VOTE_RESP, id, 1, st.term);
		CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	}
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL_FATAL(st.role, RPS__RAFT_LEADER);
	for (uint64_t id = 2; id <= 9; id++) {
		m = msg(RPS__RAFT_MSG_APP_RESP, id, 1, st.term);
		m.index = 4;
		CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	}
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL_FATAL(st.commit, 4);
	/* no 17th voter, whichever way */
	CU_ASSERT_EQUAL(rps__raft_propose_conf_change(r, RPS__RAFT_CONF_PROMOTE, 17, NULL), -ENOSPC);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "at most 16 voters"));
	CU_ASSERT_EQUAL(rps__raft_propose_conf_change(r, RPS__RAFT_CONF_ADD_VOTER, 18, NULL), -ENOSPC);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "add node 18 as a learner"));
	/* nor through a snapshot: dropped unread */
	snap.conf.n_voters = RPS__RAFT_MAX_VOTERS + 1;
	m = msg(RPS__RAFT_MSG_SNAP, 2, 1, st.term);
	m.snapshot = &snap;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EPROTO);
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "too many voters"));
	snap.conf.n_voters = RPS__RAFT_MAX_VOTERS;
	/* once a voter left, 17 may take its place */
	CU_ASSERT_EQUAL(rps__raft_propose_conf_change(r, RPS__RAFT_CONF_REMOVE, 16, NULL), 0);
	drain(r, &g);
	for (uint64_t id = 2; id <= 9; id++) {
		m = msg(RPS__RAFT_MSG_APP_RESP, id, 1, st.term);
		m.index = 5;
		CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	}
	m = msg(RPS__RAFT_MSG_APP_RESP, 17, 1, st.term);
	m.index = 5;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	CU_ASSERT_EQUAL(rps__raft_propose_conf_change(r, RPS__RAFT_CONF_PROMOTE, 17, NULL), 0);
	drain(r, &g);
	rps__raft_status(r, &st);
	CU_ASSERT_EQUAL(st.conf.n_voters, RPS__RAFT_MAX_VOTERS);
	CU_ASSERT_TRUE(rps__raft_conf_is_voter(&st.conf, 17));
	CU_ASSERT_EQUAL(st.conf.n_learners, 0);
	rps__raft_free(r);
}

static void test_removed_node_does_not_disrupt(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status st;

	/* 3 is removed while cut off: it never learns it */
	sim_isolate(s, 3);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_REMOVE, 3), 0);
	sim_deliver_all(s);
	sim_status(s, 1, &st);
	CU_ASSERT_EQUAL(st.commit, st.last_index);
	sim_tick(s, 3, 100);
	sim_heal(s);
	sim_tick_all(s, 30);
	CU_ASSERT_EQUAL(sim_leader(s), 1);
	sim_status(s, 1, &st);
	CU_ASSERT_EQUAL(st.term, 2);
	assert_no_violation(s);
	sim_free(s);
}

/* Nothing a peer sends may leave state that cannot go on or restart: a term
 * that cannot be incremented (the next campaign would wrap to 0), a snapshot
 * from the future, an ack of entries the leader never had.  Such messages,
 * and answers from nodes outside the configuration, are counted and dropped
 * without changing anything. */
/* Found by fuzz_raft: an append whose entries' terms go down (or pass the
 * message's term) was persisted as a log that the WAL
 * refuses to reopen. Refused now, nothing persisted; a real one still goes. */
static void test_app_entries_out_of_order_refused(void)
{
	static const uint64_t terms[] = { 1, 2 };
	struct rps__raft_config cfg = config(1, false, true);
	struct rps__raft *r = core_with_log(&cfg, 3, terms, 2, 2, 1);
	struct rps__raft_entry e[2] = { { .term = 3, .index = 4 }, { .term = 2, .index = 5 } };
	struct rps__raft_status a, b;
	struct rps__raft_ready rd;
	struct rps__raft_msg m;
	struct got g;

	rps__raft_status(r, &a);
	m = msg(RPS__RAFT_MSG_APP, 2, 1, 3);
	m.index = 3;
	m.log_term = 2;
	m.entries = e;
	m.n_entries = 2;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EPROTO);	/* terms 3 then 2 */
	CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "terms go down"));
	e[1].term = 4;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EPROTO);	/* past the message's term */
	e[1].term = 3;
	e[0].term = 1;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EPROTO);	/* below the previous entry's term */
	rps__raft_status(r, &b);
	CU_ASSERT_EQUAL(b.refused, a.refused + 3);
	CU_ASSERT_EQUAL(b.term, a.term);
	CU_ASSERT_EQUAL(b.last_index, a.last_index);
	CU_ASSERT_EQUAL(rps__raft_ready(r, &rd), 0);
	e[0].term = 3;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	rps__raft_status(r, &b);
	CU_ASSERT_EQUAL(b.last_index, 5);
	CU_ASSERT_EQUAL(b.term, 3);
	rps__raft_free(r);
}

static void test_unusable_messages_refused(void)
{
	static const uint64_t terms[] = { 1, 2 };
	struct rps__raft_config cfg = config(1, false, true);
	struct rps__raft *r = core_with_log(&cfg, 3, terms, 2, 2, 1);
	struct rps__raft_snapshot snap = { .index = 50, .term = 99, .conf = { .n_voters = 1, .voters = { 1 } } };
	struct rps__raft_status a, b;
	struct rps__raft_ready rd;
	struct rps__raft_msg m;
	struct got g;
	static const uint8_t max_term_types[] = {
		RPS__RAFT_MSG_APP_RESP, RPS__RAFT_MSG_HEARTBEAT, RPS__RAFT_MSG_APP, RPS__RAFT_MSG_VOTE,
		RPS__RAFT_MSG_PRE_VOTE, RPS__RAFT_MSG_VOTE_RESP, RPS__RAFT_MSG_TIMEOUT_NOW,
	};

	elect(r, &g);
	rps__raft_status(r, &a);
	CU_ASSERT_EQUAL(a.refused, 0);
	for (size_t i = 0; i < RPS__ARRAY_SIZE(max_term_types); i++) {
		m = msg(max_term_types[i], 2, 1, UINT64_MAX);
		CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EPROTO);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "cannot be incremented"));
	}
	/* a stranger's answer, even of a plausible term */
	m = msg(RPS__RAFT_MSG_APP_RESP, 9, 1, a.term + 1);
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	m = msg(RPS__RAFT_MSG_HEARTBEAT_RESP, 9, 1, a.term);
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	/* an ack of entries beyond the leader's log */
	m = msg(RPS__RAFT_MSG_APP_RESP, 2, 1, a.term);
	m.index = UINT64_MAX;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EPROTO);
	rps__raft_status(r, &b);
	CU_ASSERT_EQUAL(b.term, a.term);
	CU_ASSERT_EQUAL(b.vote, a.vote);
	CU_ASSERT_EQUAL(b.role, RPS__RAFT_LEADER);
	CU_ASSERT_EQUAL(b.commit, a.commit);
	CU_ASSERT_EQUAL(b.last_index, a.last_index);
	CU_ASSERT_EQUAL(b.refused, RPS__ARRAY_SIZE(max_term_types) + 3);
	CU_ASSERT_EQUAL(rps__raft_ready(r, &rd), 0);	/* nothing to persist or send */
	{
		struct rps__raft_progress_info pi;

		CU_ASSERT_EQUAL(rps__raft_progress(r, 2, &pi), 0);
		CU_ASSERT(pi.match <= a.last_index);
		CU_ASSERT(pi.next <= a.last_index + 1);
	}
	rps__raft_free(r);

	/* a follower: snapshots from a future term or at an index that cannot
	 * be followed by another entry */
	r = core_with_log(&cfg, 3, terms, 2, 2, 1);
	rps__raft_status(r, &a);
	m = msg(RPS__RAFT_MSG_SNAP, 2, 1, 3);
	m.snapshot = &snap;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EPROTO);
	snap.term = 3;
	snap.index = UINT64_MAX;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), -EPROTO);
	rps__raft_status(r, &b);
	CU_ASSERT_EQUAL(b.term, a.term);
	CU_ASSERT_EQUAL(b.snapshot_index, a.snapshot_index);
	CU_ASSERT_EQUAL(b.commit, a.commit);
	CU_ASSERT_EQUAL(rps__raft_ready(r, &rd), 0);
	/* a real one still installs */
	snap.index = 50;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	rps__raft_status(r, &b);
	CU_ASSERT_EQUAL(b.snapshot_index, 50);
	CU_ASSERT_EQUAL(b.term, 3);
	drain(r, &g);
	rps__raft_free(r);

	/* the last usable term is reachable, but no campaign goes past it */
	r = core_with_log(&cfg, 3, terms, 2, 2, 1);
	m = msg(RPS__RAFT_MSG_HEARTBEAT, 2, 1, UINT64_MAX - 1);
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	CU_ASSERT_EQUAL(g.hs.term, UINT64_MAX - 1);
	CU_ASSERT_EQUAL(rps__raft_campaign(r), -EOVERFLOW);
	for (int i = 0; i < 100; i++) {
		CU_ASSERT_EQUAL(rps__raft_tick(r), 0);
		drain(r, &g);
		CU_ASSERT_EQUAL(g.n, 0);
	}
	rps__raft_status(r, &b);
	CU_ASSERT_EQUAL(b.term, UINT64_MAX - 1);
	CU_ASSERT_EQUAL(b.role, RPS__RAFT_FOLLOWER);
	rps__raft_free(r);

	/* Raft thesis 4.1: a leader or a candidate this node's configuration
	 * does not list yet is still heard */
	r = core_with_log(&cfg, 3, terms, 2, 2, 1);
	m = msg(RPS__RAFT_MSG_VOTE, 4, 1, 3);
	m.index = 3;
	m.log_term = 2;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	CU_ASSERT_FALSE(must_find(&g, RPS__RAFT_MSG_VOTE_RESP, 4)->reject);
	m = msg(RPS__RAFT_MSG_HEARTBEAT, 4, 1, 3);
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	CU_ASSERT_PTR_NOT_NULL(find(&g, RPS__RAFT_MSG_HEARTBEAT_RESP, 4));
	rps__raft_status(r, &b);
	CU_ASSERT_EQUAL(b.refused, 0);
	rps__raft_free(r);
}

/* ------------------------------------------------------------------------ */
/* snapshots, restarts */

static unsigned snaps_sent;

static void count_snaps(void *arg, const struct rps__raft_msg *m)
{
	if (m->type == RPS__RAFT_MSG_SNAP)
		snaps_sent++;
}

static bool drop_snaps(void *arg, const struct rps__raft_msg *m)
{
	return m->type == RPS__RAFT_MSG_SNAP && *(int *)arg > 0 && (*(int *)arg)-- > 0;
}

static void test_snapshot_install(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status st;
	uint64_t o1, e1, o3, e3;
	int drops = 1;

	sim_isolate(s, 3);
	for (int i = 0; i < 30; i++)
		CU_ASSERT_EQUAL(sim_write(s, 1, (uint32_t)i % SIM_SHARDS, 1000 + i), 0);
	sim_deliver_all(s);
	sim_tick_all(s, 1);
	CU_ASSERT_EQUAL(sim_compact(s, 1), 0);
	CU_ASSERT_EQUAL(sim_compact(s, 2), 0);
	CU_ASSERT_EQUAL(sim_stored_entries(s, 1), 0);
	sim_status(s, 1, &st);
	CU_ASSERT_EQUAL(st.snapshot_index, 32);
	/* compaction rules */
	CU_ASSERT_EQUAL(rps__raft_compact(sim_raft(s, 1), 32, NULL, 0, NULL), -EINVAL);
	CU_ASSERT_EQUAL(rps__raft_compact(sim_raft(s, 1), 40, NULL, 0, NULL), -EINVAL);
	{
		const struct rps__raft_entry *e;

		CU_ASSERT_EQUAL(rps__raft_entry_at(sim_raft(s, 1), 32, &e), -ENOENT);
	}
	/* 3 can only catch up with the snapshot; the first one is lost */
	snaps_sent = 0;
	sim_set_observer(s, count_snaps, NULL);
	sim_set_filter(s, drop_snaps, &drops);
	sim_heal(s);
	sim_tick_all(s, 3);
	CU_ASSERT(sim_applied(s, 3) < 32);
	sim_tick_all(s, 15);	/* the leader notices and sends it again */
	CU_ASSERT(snaps_sent >= 2);
	CU_ASSERT_EQUAL(sim_applied(s, 3), 32);
	sim_status(s, 3, &st);
	CU_ASSERT_EQUAL(st.snapshot_index, 32);
	for (uint32_t sh = 0; sh < SIM_SHARDS; sh++) {
		sim_shard(s, 1, sh, &o1, &e1);
		sim_shard(s, 3, sh, &o3, &e3);
		CU_ASSERT_EQUAL(o1, o3);
		CU_ASSERT_EQUAL(e1, e3);
	}
	/* and replication continues after it */
	CU_ASSERT_EQUAL(sim_write(s, 1, 0, 5), 0);
	sim_deliver_all(s);
	sim_tick_all(s, 1);
	CU_ASSERT_EQUAL(sim_applied(s, 3), 33);
	assert_no_violation(s);
	sim_free(s);
}

static struct rps__smap_cmd map_cmd(uint32_t type, uint32_t part, uint64_t from, uint64_t to, uint64_t epoch)
{
	struct rps__smap_cmd c;

	memset(&c, 0, sizeof(c));
	c.type = type;
	c.part = part;
	c.from = from;
	c.to = to;
	c.epoch = epoch;
	return c;
}

/* Shard map commands go through the log and the product's apply on every
 * node, refusals included; a lagging node catches up through a snapshot
 * that carries the map, a restarted one from its disk; a ReadIndex read of
 * the map at a follower sees the last command. */
static void test_shard_map_through_raft(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__smap_cmd c[5];
	const struct rps__smap *m1;
	uint64_t ctx = 0;

	m1 = sim_map(s, 1);
	/* the bootstrap map: 5 members, R = 2, partition 0 on 1 backed by 2 */
	CU_ASSERT_EQUAL(m1->nmembers, 5);
	CU_ASSERT_EQUAL(m1->replicas, 2);
	CU_ASSERT_EQUAL(m1->parts[0].owner, 1);
	CU_ASSERT_EQUAL(m1->parts[0].backups[0], 2);
	sim_isolate(s, 3);
	c[0] = map_cmd(RPS__SMAP_FAILOVER, 0, 1, 2, 1);
	c[1] = map_cmd(RPS__SMAP_FAILOVER, 0, 1, 2, 1);		/* a replay: refused */
	c[2] = map_cmd(RPS__SMAP_REPLICA_BEGIN, 0, 0, 3, 2);
	c[3] = map_cmd(RPS__SMAP_REPLICA_COMMIT, 0, 0, 3, 2);
	c[4] = map_cmd(0, 0, 0, 0, 0);				/* undecodable */
	for (int i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(sim_map_write(s, 1, &c[i]), 0);
	sim_deliver_all(s);
	sim_tick_all(s, 1);
	CU_ASSERT_EQUAL(m1->applied, sim_applied(s, 1));
	CU_ASSERT_EQUAL(m1->parts[0].owner, 2);
	CU_ASSERT_EQUAL(m1->parts[0].epoch, 2);
	CU_ASSERT_EQUAL(m1->parts[0].backups[0], 3);
	CU_ASSERT_EQUAL(m1->parts[0].backups[1], 0);
	CU_ASSERT_EQUAL(memcmp(m1, sim_map(s, 2), sizeof(*m1)), 0);
	CU_ASSERT_EQUAL(sim_map(s, 3)->parts[0].owner, 1);	/* cut off */
	/* a linearisable read of the map at a follower */
	CU_ASSERT_EQUAL(sim_map_read(s, 2, &ctx), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_read_result(s, ctx), 1 + 5);
	/* 3 catches up through a snapshot, which brings the map */
	CU_ASSERT_EQUAL(sim_compact(s, 1), 0);
	CU_ASSERT_EQUAL(sim_compact(s, 2), 0);
	sim_heal(s);
	sim_tick_all(s, 20);
	CU_ASSERT_EQUAL(sim_applied(s, 3), sim_applied(s, 1));
	CU_ASSERT_EQUAL(memcmp(m1, sim_map(s, 3), sizeof(*m1)), 0);
	/* a restart restores the map from the node's own disk */
	sim_crash(s, 2);
	CU_ASSERT_EQUAL(sim_restart(s, 2), 0);
	sim_tick_all(s, 3);
	CU_ASSERT_EQUAL(memcmp(m1, sim_map(s, 2), sizeof(*m1)), 0);
	CU_ASSERT_EQUAL(sim_check_linearizable(s), 0);
	assert_no_violation(s);
	sim_free(s);
}

static void test_restart_recovers_persisted_state(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_status before, after;
	uint64_t o1, e1, o2, e2;

	for (int i = 0; i < 12; i++)
		sim_write(s, 1, (uint32_t)i % SIM_SHARDS, 50 + i);
	sim_deliver_all(s);
	sim_tick_all(s, 1);
	CU_ASSERT_EQUAL(sim_compact(s, 2), 0);
	for (int i = 0; i < 3; i++)
		sim_write(s, 1, 1, 90 + i);
	sim_deliver_all(s);
	sim_tick_all(s, 1);
	sim_status(s, 2, &before);
	sim_crash(s, 2);
	CU_ASSERT_PTR_NULL(sim_raft(s, 2));
	CU_ASSERT_EQUAL(sim_restart(s, 2), 0);
	sim_status(s, 2, &after);
	CU_ASSERT_EQUAL(after.term, before.term);
	CU_ASSERT_EQUAL(after.vote, before.vote);
	CU_ASSERT_EQUAL(after.last_index, before.last_index);
	CU_ASSERT_EQUAL(after.commit, before.commit);
	CU_ASSERT_EQUAL(after.snapshot_index, before.snapshot_index);
	/* the state machine is rebuilt: snapshot, then the committed tail */
	CU_ASSERT_EQUAL(sim_applied(s, 2), before.commit);
	for (uint32_t sh = 0; sh < SIM_SHARDS; sh++) {
		sim_shard(s, 1, sh, &o1, &e1);
		sim_shard(s, 2, sh, &o2, &e2);
		CU_ASSERT_EQUAL(o1, o2);
		CU_ASSERT_EQUAL(e1, e2);
	}
	/* the leader itself crashes: another takes over, nothing is lost */
	sim_crash(s, 1);
	sim_tick_all(s, 40);
	CU_ASSERT(sim_leader(s) == 2 || sim_leader(s) == 3);
	CU_ASSERT_EQUAL(sim_restart(s, 1), 0);
	sim_tick_all(s, 5);
	sim_status(s, 1, &after);
	CU_ASSERT_EQUAL(after.role, RPS__RAFT_FOLLOWER);
	CU_ASSERT_EQUAL(sim_applied(s, 1), after.commit);
	assert_no_violation(s);
	sim_free(s);
}

/* ------------------------------------------------------------------------ */
/* ReadIndex */

static void test_read_index(void)
{
	struct sim *s = cluster_led_by(3, true, true, 1);
	struct rps__raft_config cfg = config(1, false, false);
	struct rps__raft *r = core_with_log(&cfg, 3, NULL, 0, 1, 1);
	struct rps__raft_msg m;
	struct got g;
	uint64_t ctx, ctx2;

	CU_ASSERT_EQUAL(sim_write(s, 1, 2, 33), 0);	/* write 1 */
	sim_deliver_all(s);
	/* at the leader: ready only after a heartbeat round confirms it leads */
	CU_ASSERT_EQUAL(sim_read(s, 1, 2, &ctx), 0);
	CU_ASSERT_EQUAL(sim_read_result(s, ctx), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_read_result(s, ctx), 2);	/* 1 + write id 1 */
	/* at a follower: forwarded to the leader */
	CU_ASSERT_EQUAL(sim_read(s, 3, 2, &ctx), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_read_result(s, ctx), 2);
	/* a leader cut off from the majority cannot confirm: no answer (and a
	 * read on the new majority sees the new write) */
	sim_isolate(s, 1);
	CU_ASSERT_EQUAL(sim_read(s, 1, 2, &ctx), 0);
	sim_deliver_all(s);
	{
		uint64_t l = 0;

		for (int t = 0; t < 100 && (l = sim_leader(s)) < 2; t++)
			sim_tick_all(s, 1);
		CU_ASSERT_FATAL(l == 2 || l == 3);
		CU_ASSERT_EQUAL(sim_write(s, l, 2, 44), 0);	/* write 2 */
		sim_deliver_all(s);
		CU_ASSERT_EQUAL(sim_read(s, l == 2 ? 3 : 2, 2, &ctx2), 0);
		sim_deliver_all(s);
		CU_ASSERT_EQUAL(sim_read_result(s, ctx2), 3);
	}
	sim_tick(s, 1, 3);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_read_result(s, ctx), 0);
	CU_ASSERT_EQUAL(sim_check_linearizable(s), 0);
	assert_no_violation(s);
	sim_free(s);

	/* the exchange in detail, on one core: ctx rides the heartbeat */
	elect(r, &g);
	m = msg(RPS__RAFT_MSG_APP_RESP, 2, 1, 2);
	m.index = 2;
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_EQUAL(rps__raft_read_index(r, 0), -EINVAL);
	CU_ASSERT_EQUAL(rps__raft_read_index(r, 77), 0);
	CU_ASSERT_EQUAL(rps__raft_read_index(r, 77), -EEXIST);
	drain(r, &g);
	CU_ASSERT_EQUAL(g.n_read_states, 0);
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_HEARTBEAT, 3)->context, 77);
	m = msg(RPS__RAFT_MSG_HEARTBEAT_RESP, 3, 1, 2);
	m.context = 77;
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_EQUAL_FATAL(g.n_read_states, 1);
	CU_ASSERT_EQUAL(g.rs[0].ctx, 77);
	CU_ASSERT_EQUAL(g.rs[0].index, 2);
	/* a forwarded one is answered to its follower */
	m = msg(RPS__RAFT_MSG_READ_INDEX, 3, 1, 2);
	m.context = 78;
	rps__raft_step(r, &m);
	m = msg(RPS__RAFT_MSG_HEARTBEAT_RESP, 2, 1, 2);
	m.context = 78;
	rps__raft_step(r, &m);
	drain(r, &g);
	CU_ASSERT_PTR_NOT_NULL_FATAL(find(&g, RPS__RAFT_MSG_READ_INDEX_RESP, 3));
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_READ_INDEX_RESP, 3)->context, 78);
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_READ_INDEX_RESP, 3)->index, 2);
	rps__raft_free(r);
}

/* Learners answer heartbeats too, but only voters confirm a read: a
 * thousand learners' acks must neither count nor crowd the voters' out. */
static void test_read_index_counts_voters_only(void)
{
	static struct rps__raft_snapshot snap = {
		.index = 1, .term = 1, .conf = { .n_voters = 3, .voters = { 1, 2, 3 } },
	};
	struct rps__raft_persisted p = { .hard_state = { 1, 0, 1 }, .snapshot = &snap };
	struct rps__raft_config cfg = config(1, false, false);
	struct rps__raft_msg m;
	struct rps__raft *r;
	struct got g;

	/* more learners than a read has room for acks */
	for (snap.conf.n_learners = 0; snap.conf.n_learners < RPS__RAFT_MAX_VOTERS + 4; snap.conf.n_learners++)
		snap.conf.learners[snap.conf.n_learners] = 4 + snap.conf.n_learners;
	CU_ASSERT_EQUAL_FATAL(rps__raft_new(&cfg, &p, &r), 0);
	drain(r, &g);
	elect(r, &g);
	m = msg(RPS__RAFT_MSG_APP_RESP, 2, 1, 2);
	m.index = 2;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	CU_ASSERT_EQUAL(rps__raft_read_index(r, 77), 0);
	drain(r, &g);
	CU_ASSERT_EQUAL(must_find(&g, RPS__RAFT_MSG_HEARTBEAT, 4)->context, 77);
	for (uint64_t id = 4; id < 4 + snap.conf.n_learners; id++) {
		m = msg(RPS__RAFT_MSG_HEARTBEAT_RESP, id, 1, 2);
		m.context = 77;
		CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	}
	drain(r, &g);
	CU_ASSERT_EQUAL(g.n_read_states, 0);	/* the leader and learners: no quorum */
	m = msg(RPS__RAFT_MSG_HEARTBEAT_RESP, 3, 1, 2);
	m.context = 77;
	CU_ASSERT_EQUAL(rps__raft_step(r, &m), 0);
	drain(r, &g);
	CU_ASSERT_EQUAL_FATAL(g.n_read_states, 1);
	CU_ASSERT_EQUAL(g.rs[0].ctx, 77);
	rps__raft_free(r);
}

/* ------------------------------------------------------------------------ */
/* wire codec */

static void assert_same_msg(const struct rps__raft_msg *a, const struct rps__raft_msg *b)
{
	CU_ASSERT_EQUAL(a->type, b->type);
	CU_ASSERT_EQUAL(a->reject, b->reject);
	CU_ASSERT_EQUAL(a->flags, b->flags);
	CU_ASSERT_EQUAL(a->to, b->to);
	CU_ASSERT_EQUAL(a->from, b->from);
	CU_ASSERT_EQUAL(a->term, b->term);
	CU_ASSERT_EQUAL(a->log_term, b->log_term);
	CU_ASSERT_EQUAL(a->index, b->index);
	CU_ASSERT_EQUAL(a->commit, b->commit);
	CU_ASSERT_EQUAL(a->hint, b->hint);
	CU_ASSERT_EQUAL(a->context, b->context);
	CU_ASSERT_EQUAL_FATAL(a->n_entries, b->n_entries);
	for (uint32_t i = 0; i < a->n_entries; i++) {
		CU_ASSERT_EQUAL(a->entries[i].term, b->entries[i].term);
		CU_ASSERT_EQUAL(a->entries[i].index, b->entries[i].index);
		CU_ASSERT_EQUAL(a->entries[i].type, b->entries[i].type);
		CU_ASSERT_EQUAL_FATAL(a->entries[i].len, b->entries[i].len);
		if (a->entries[i].len)
			CU_ASSERT_EQUAL(memcmp(a->entries[i].data, b->entries[i].data, a->entries[i].len), 0);
	}
	CU_ASSERT_EQUAL_FATAL(!a->snapshot, !b->snapshot);
	if (a->snapshot) {
		CU_ASSERT_EQUAL(a->snapshot->index, b->snapshot->index);
		CU_ASSERT_EQUAL(a->snapshot->term, b->snapshot->term);
		CU_ASSERT_EQUAL(memcmp(&a->snapshot->conf, &b->snapshot->conf, sizeof(a->snapshot->conf)), 0);
		CU_ASSERT_EQUAL_FATAL(a->snapshot->len, b->snapshot->len);
		CU_ASSERT_EQUAL(memcmp(a->snapshot->data, b->snapshot->data, a->snapshot->len), 0);
	}
}

static struct rps__raft_entry codec_ents[3] = {
	{ .term = 5, .index = 10, .type = RPS__RAFT_ENTRY_NORMAL, .len = 3, .data = "abc" },
	{ .term = 5, .index = 11, .type = RPS__RAFT_ENTRY_NORMAL, .len = 0, .data = NULL },
	{ .term = 6, .index = 12, .type = RPS__RAFT_ENTRY_CONF, .len = 9, .data = "\x01\x07\0\0\0\0\0\0\0" },
};
static struct rps__raft_snapshot codec_snap = {
	.index = 99, .term = 7,
	.conf = { .n_voters = 3, .n_learners = 1, .voters = { 1, 2, 3 }, .learners = { 0xffffffffffffull } },
	.len = 5, .data = "state",
};

static struct rps__raft_msg codec_app(void)
{
	struct rps__raft_msg m = msg(RPS__RAFT_MSG_APP, 0x0102030405060708ull, 2, 6);

	m.log_term = 4;
	m.index = 9;
	m.commit = 8;
	m.hint = 3;
	m.context = 0xdeadbeefcafef00dull;
	m.reject = 1;
	m.flags = RPS__RAFT_MSG_F_TRANSFER;
	m.entries = codec_ents;
	m.n_entries = 3;
	return m;
}

static void test_codec_roundtrip(void)
{
	struct rps__raft_msg cases[4], *out;
	uint8_t buf[1024];
	size_t len;

	cases[0] = codec_app();
	cases[1] = msg(RPS__RAFT_MSG_SNAP, 1, 2, 7);
	cases[1].snapshot = &codec_snap;
	cases[2] = msg(RPS__RAFT_MSG_HEARTBEAT, 3, 1, UINT64_MAX);
	cases[2].context = 5;
	cases[3] = msg(RPS__RAFT_MSG_READ_INDEX_RESP, 1, 3, 2);
	for (size_t i = 0; i < RPS__ARRAY_SIZE(cases); i++) {
		CU_ASSERT_EQUAL_FATAL(rps__raft_msg_encode(&cases[i], buf, sizeof(buf), &len), 0);
		CU_ASSERT_EQUAL(len, rps__raft_msg_encoded_size(&cases[i]));
		CU_ASSERT_EQUAL_FATAL(rps__raft_msg_decode(buf, len, &out), 0);
		assert_same_msg(&cases[i], out);
		rps__raft_msg_free(out);
	}
	/* little-endian on the wire, whatever the host */
	CU_ASSERT_EQUAL_FATAL(rps__raft_msg_encode(&cases[0], buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(buf[0], 1);			/* version */
	CU_ASSERT_EQUAL(buf[1], RPS__RAFT_MSG_APP);
	CU_ASSERT_EQUAL(buf[12], 0x08);			/* from, low byte first */
	CU_ASSERT_EQUAL(buf[19], 0x01);
	CU_ASSERT_EQUAL(rps__raft_msg_encode(&cases[0], buf, len - 1, &len), -ENOSPC);
	CU_ASSERT_STRING_EQUAL(rps__raft_msg_type_name(RPS__RAFT_MSG_TIMEOUT_NOW), "TimeoutNow");
	CU_ASSERT_STRING_EQUAL(rps__raft_msg_type_name(0), "?");
}

static void test_codec_rejects_malformed(void)
{
	struct rps__raft_msg app = codec_app(), snap = msg(RPS__RAFT_MSG_SNAP, 1, 2, 7), *out = NULL;
	uint8_t buf[1024], bad[1024];
	size_t len, slen;
	uint64_t rng = 12345;

	snap.snapshot = &codec_snap;
	CU_ASSERT_EQUAL_FATAL(rps__raft_msg_encode(&app, buf, sizeof(buf), &len), 0);
	/* every truncation, into an exactly sized heap copy (ASan sees any
	 * read past it) */
	for (size_t cut = 0; cut < len; cut++) {
		uint8_t *p = malloc(cut ? cut : 1);

		memcpy(p, buf, cut);
		CU_ASSERT_EQUAL(rps__raft_msg_decode(p, cut, &out), -EBADMSG);
		CU_ASSERT_PTR_NULL(out);
		free(p);
	}
	/* trailing garbage */
	memcpy(bad, buf, len);
	bad[len] = 0;
	CU_ASSERT_EQUAL(rps__raft_msg_decode(bad, len + 1, &out), -EBADMSG);
	/* header fields out of range */
	static const struct {
		size_t off;
		uint8_t val;
	} pokes[] = {
		{ 0, 2 },			/* version */
		{ 1, 0 },			/* type */
		{ 1, 200 },
		{ 2, 2 },			/* reject is a bool */
		{ 3, 0x80 },			/* unknown flag */
		{ 4 + 64 + 4, 1 },		/* snapshot on an append */
		{ 4 + 64 + 3, 0x40 },		/* a billion entries in a small buffer */
		{ 73 + 16, 9 },			/* entry type */
		{ 73 + 23, 0x7f },		/* entry longer than the buffer */
	};
	for (size_t i = 0; i < RPS__ARRAY_SIZE(pokes); i++) {
		memcpy(bad, buf, len);
		bad[pokes[i].off] = pokes[i].val;
		CU_ASSERT_EQUAL(rps__raft_msg_decode(bad, len, &out), -EBADMSG);
	}
	/* entries on a message type that carries none */
	memcpy(bad, buf, len);
	bad[1] = RPS__RAFT_MSG_HEARTBEAT;
	CU_ASSERT_EQUAL(rps__raft_msg_decode(bad, len, &out), -EBADMSG);
	/* snapshot: too many members, no snapshot on a SNAP */
	CU_ASSERT_EQUAL_FATAL(rps__raft_msg_encode(&snap, buf, sizeof(buf), &slen), 0);
	memcpy(bad, buf, slen);
	bad[73 + 16] = 17;
	CU_ASSERT_EQUAL(rps__raft_msg_decode(bad, slen, &out), -EBADMSG);
	memcpy(bad, buf, slen);
	bad[72] = 0;
	CU_ASSERT_EQUAL(rps__raft_msg_decode(bad, slen, &out), -EBADMSG);
	/* random corruption: a clean error or a message, never a stray read */
	CU_ASSERT_EQUAL_FATAL(rps__raft_msg_encode(&app, buf, sizeof(buf), &len), 0);
	for (int i = 0; i < 20000; i++) {
		size_t n = len;
		uint8_t *p;
		int err;

		if (i % 2)
			memcpy(bad, buf, len);	/* else corruption accumulates */
		for (int k = 0; k < 1 + i % 4; k++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			bad[(rng >> 33) % len] ^= (uint8_t)(1u << ((rng >> 20) % 8));
		}
		if (i % 7 == 0)
			n = (size_t)((rng >> 40) % (len + 1));
		p = malloc(n ? n : 1);
		memcpy(p, bad, n);
		err = rps__raft_msg_decode(p, n, &out);
		CU_ASSERT(err == 0 || err == -EBADMSG);
		if (!err) {
			CU_ASSERT_EQUAL(rps__raft_msg_encoded_size(out), n);
			rps__raft_msg_free(out);
		}
		free(p);
	}
}

/* A configuration at the bounds (16 voters, 1,024 nodes) crosses the wire;
 * counts past them are refused by the encoder, and by the decoder even
 * when the ids they claim are all there. */
static void test_codec_conf_bounds(void)
{
	static struct rps__raft_snapshot big;	/* 8 KiB: not on the stack */
	const size_t counts_at = 73 + 16, ids_end = 73 + 24 + 8u * RPS__RAFT_MAX_NODES;
	struct rps__raft_msg m = msg(RPS__RAFT_MSG_SNAP, 1, 2, 7), *out = NULL;
	size_t len, blen;
	uint8_t *buf, *bad;

	memset(&big, 0, sizeof(big));
	big.index = 99;
	big.term = 7;
	big.len = 5;
	big.data = "state";
	for (unsigned i = 0; i < RPS__RAFT_MAX_VOTERS; i++)
		big.conf.voters[big.conf.n_voters++] = i + 1;
	for (unsigned i = 0; i < RPS__RAFT_MAX_NODES - RPS__RAFT_MAX_VOTERS; i++)
		big.conf.learners[big.conf.n_learners++] = 1000 + i;
	CU_ASSERT_EQUAL(big.conf.n_learners, 1008);
	m.snapshot = &big;
	len = rps__raft_msg_encoded_size(&m);
	CU_ASSERT_EQUAL_FATAL(len, ids_end + 4 + 5);
	buf = malloc(len);
	bad = malloc(len + 8);
	CU_ASSERT_FATAL(buf && bad);
	CU_ASSERT_EQUAL_FATAL(rps__raft_msg_encode(&m, buf, len, &len), 0);
	CU_ASSERT_EQUAL_FATAL(rps__raft_msg_decode(buf, len, &out), 0);
	assert_same_msg(&m, out);
	rps__raft_msg_free(out);

	/* the encoder: 17 voters, or 16 and 1,009 learners */
	big.conf.n_voters = 17;
	CU_ASSERT_EQUAL(rps__raft_msg_encode(&m, bad, len + 8, &blen), -EINVAL);
	big.conf.n_voters = 16;
	big.conf.learners[big.conf.n_learners++] = 5000;
	CU_ASSERT_EQUAL(rps__raft_msg_encode(&m, bad, len + 8, &blen), -EINVAL);
	big.conf.n_learners--;

	/* the decoder: 17 voters and 1,007 learners, every id there */
	memcpy(bad, buf, len);
	rps__le_put32(bad + counts_at, 17);
	rps__le_put32(bad + counts_at + 4, 1007);
	CU_ASSERT_EQUAL(rps__raft_msg_decode(bad, len, &out), -EBADMSG);
	CU_ASSERT_PTR_NULL(out);
	/* (15 and 1,009 of the same bytes are fine: it is the bound) */
	rps__le_put32(bad + counts_at, 15);
	rps__le_put32(bad + counts_at + 4, 1009);
	CU_ASSERT_EQUAL_FATAL(rps__raft_msg_decode(bad, len, &out), 0);
	CU_ASSERT_EQUAL(out->snapshot->conf.n_voters, 15);
	CU_ASSERT_EQUAL(out->snapshot->conf.learners[0], 16);
	rps__raft_msg_free(out);
	/* 1,025 nodes, the 1,025th id inserted: as 16 + 1,009 and as 0 + 1,025 */
	memcpy(bad, buf, ids_end);
	rps__le_put64(bad + ids_end, 5000);
	memcpy(bad + ids_end + 8, buf + ids_end, len - ids_end);
	rps__le_put32(bad + counts_at + 4, 1009);
	CU_ASSERT_EQUAL(rps__raft_msg_decode(bad, len + 8, &out), -EBADMSG);
	rps__le_put32(bad + counts_at, 0);
	rps__le_put32(bad + counts_at + 4, 1025);
	CU_ASSERT_EQUAL(rps__raft_msg_decode(bad, len + 8, &out), -EBADMSG);
	CU_ASSERT_PTR_NULL(out);
	free(buf);
	free(bad);
}

/* ------------------------------------------------------------------------ */
/* the checker and the simulator */

static void test_linearizability_checker(void)
{
	static const struct sim_lin_write one[] = { { 1, 2 } }, open_write[] = { { 1, UINT64_MAX } },
					  two[] = { { 1, 2 }, { 3, 4 } }, slow[] = { { 1, 10 } };
	struct sim_lin_read r[2];
	size_t bad;

	r[0] = (struct sim_lin_read){ 3, 4, 1 };
	CU_ASSERT_EQUAL(sim_lin_check(one, 1, r, 1, &bad), 0);
	/* stale: the write finished before the read started */
	r[0] = (struct sim_lin_read){ 3, 4, 0 };
	CU_ASSERT_EQUAL(sim_lin_check(one, 1, r, 1, &bad), -1);
	CU_ASSERT_EQUAL(bad, 0);
	/* from the future: the read ended before the write started */
	r[0] = (struct sim_lin_read){ 0, 0, 1 };
	CU_ASSERT_EQUAL(sim_lin_check(one, 1, r, 1, &bad), -1);
	/* concurrent: either value */
	r[0] = (struct sim_lin_read){ 2, 3, 0 };
	CU_ASSERT_EQUAL(sim_lin_check(slow, 1, r, 1, &bad), 0);
	r[0] = (struct sim_lin_read){ 2, 3, 1 };
	CU_ASSERT_EQUAL(sim_lin_check(slow, 1, r, 1, &bad), 0);
	/* but not new then old */
	r[0] = (struct sim_lin_read){ 2, 3, 1 };
	r[1] = (struct sim_lin_read){ 4, 5, 0 };
	CU_ASSERT_EQUAL(sim_lin_check(slow, 1, r, 2, &bad), -1);
	/* an unanswered write may take effect at any point after it started */
	r[0] = (struct sim_lin_read){ 50, 51, 0 };
	r[1] = (struct sim_lin_read){ 60, 61, 1 };
	CU_ASSERT_EQUAL(sim_lin_check(open_write, 1, r, 2, &bad), 0);
	/* a later write already done: reading the older one is stale */
	r[0] = (struct sim_lin_read){ 5, 6, 1 };
	CU_ASSERT_EQUAL(sim_lin_check(two, 2, r, 1, &bad), -1);
	r[0] = (struct sim_lin_read){ 5, 6, 2 };
	CU_ASSERT_EQUAL(sim_lin_check(two, 2, r, 1, &bad), 0);
}

static unsigned long long env_ull(const char *name, unsigned long long def)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : def;
}

static void test_simulator_random_seeds(void)
{
	const char *one = getenv("RAFT_SIM_SEED");
	unsigned long long first = one ? strtoull(one, NULL, 0) : env_ull("RAFT_SIM_FIRST", 1);
	unsigned long long n = one ? 1 : env_ull("RAFT_SIM_SEEDS", 2500);
	unsigned trace = one ? (unsigned)env_ull("RAFT_SIM_TRACE", 0) : 0;
	struct sim_run_stats tot, st;
	unsigned failures = 0, map_ok = 0;
	clock_t t0 = clock();

	memset(&tot, 0, sizeof(tot));
	for (unsigned long long seed = first; seed < first + n; seed++) {
		char err[1024];

		if (sim_run_random(seed, trace, &st, err, sizeof(err))) {
			fprintf(stderr, "\n  seed %llu: %s\n  replay: RAFT_SIM_SEED=%llu RAFT_SIM_TRACE=2 tests/test_raft\n",
				seed, err, seed);
			if (++failures >= 5)
				break;
		}
		tot.ticks += st.ticks;
		tot.leaders += st.leaders;
		tot.crashes += st.crashes;
		tot.writes_ok += st.writes_ok;
		tot.reads_ok += st.reads_ok;
		tot.conf_changes += st.conf_changes;
		tot.transfers += st.transfers;
		tot.snapshots += st.snapshots;
		tot.msgs += st.msgs;
		tot.map_reads_ok += st.map_reads_ok;
		tot.map_refused += st.map_refused;
		for (unsigned t = 0; t <= RPS__SMAP_CMD_LAST; t++) {
			tot.map_ok[t] += st.map_ok[t];
			map_ok += st.map_ok[t];
		}
	}
	CU_ASSERT_EQUAL(failures, 0);
	fprintf(stderr, "\n  %llu seeds from %llu in %.1f s: %u ticks, %u leaders, %u crashes, %u writes, %u reads, "
		"%u membership changes, %u transfers, %u snapshots installed, %u messages; "
		"shard map: %u commands applied (%u failovers), %u refused, %u reads\n",
		n, first, (double)(clock() - t0) / CLOCKS_PER_SEC, tot.ticks, tot.leaders, tot.crashes, tot.writes_ok,
		tot.reads_ok, tot.conf_changes, tot.transfers, tot.snapshots, tot.msgs, map_ok,
		tot.map_ok[RPS__SMAP_FAILOVER], tot.map_refused, tot.map_reads_ok);
	if (n < 500)
		return;
	/* the runs went everywhere: every command type applied somewhere */
	CU_ASSERT_EQUAL(tot.map_ok[0], 0);
	for (unsigned t = RPS__SMAP_ADD_MEMBER; t <= RPS__SMAP_CMD_LAST; t++) {
		if (tot.map_ok[t] < 10 || getenv("RAFT_SIM_VERBOSE"))
			fprintf(stderr, "  %u %s commands applied\n", tot.map_ok[t], rps__smap_cmd_name(t));
		CU_ASSERT(tot.map_ok[t] >= 10);
	}
	CU_ASSERT(tot.map_refused >= map_ok / 4);
	CU_ASSERT(tot.map_reads_ok >= 1000);
}

/* ------------------------------------------------------------------------ */
/* a large cluster */

#define SCALE_VOTERS 5u
#define SCALE_LEARNERS 100u
#define SCALE_IDS (SCALE_VOTERS + SCALE_LEARNERS)

static unsigned long scale_msgs, scale_snaps;

static void count_scale_msg(void *arg, const struct rps__raft_msg *m)
{
	(void)arg;
	scale_msgs++;
	scale_snaps += m->type == RPS__RAFT_MSG_SNAP;
}

/* Every member of the leader's configuration is up and applied all that
 * the leader committed, which is its whole log. */
static bool scale_caught_up(struct sim *s, uint64_t leader)
{
	struct rps__raft_status ls;

	sim_status(s, leader, &ls);
	if (ls.commit != ls.last_index)
		return false;
	for (uint32_t i = 0; i < ls.conf.n_voters + ls.conf.n_learners; i++) {
		uint64_t id = i < ls.conf.n_voters ? ls.conf.voters[i] : ls.conf.learners[i - ls.conf.n_voters];

		if (!sim_raft(s, id) || sim_applied(s, id) != ls.commit)
			return false;
	}
	return true;
}

/* Tick everyone until every member caught up; the ticks it took, or
 * UINT_MAX if it did not within limit. */
static unsigned scale_settle(struct sim *s, uint64_t leader, unsigned limit)
{
	for (unsigned t = 1; t <= limit; t++) {
		sim_tick_all(s, 1);
		if (scale_caught_up(s, leader))
			return t;
	}
	return UINT_MAX;
}

static unsigned scale_writes(struct sim *s, uint64_t leader, unsigned n, uint64_t tag)
{
	unsigned ok = 0;

	for (unsigned i = 0; i < n; i++) {
		ok += sim_write(s, leader, i % SIM_SHARDS, tag + i) == 0;
		if (i % 10 == 9)
			sim_deliver_all(s);	/* batches of 10, as a busy leader sees them */
	}
	sim_deliver_all(s);
	return ok;
}

/* 5 voters and 100 learners, the shape of the product's largest clusters
 * scaled down: learners join one change at a time, everyone applies a few
 * hundred writes, a crashed voter and crashed or cut-off learners catch up
 * (by snapshot: the leader compacted meanwhile), a learner replaces a
 * removed voter, and the configuration stops at 16 voters.  The simulator checks
 * Raft's safety properties at every step. */
static void test_simulator_learners_at_scale(void)
{
	struct sim_config c = {
		.n_voters = SCALE_VOTERS, .election_ticks = 10, .heartbeat_ticks = 2, .max_inflight = 4,
		.max_entries = 32, .pre_vote = true, .check_quorum = true, .seed = 1024, .n_ids = SCALE_IDS,
	};
	struct rps__raft_status st, ls;
	unsigned ticks = 0, t, writes = 0;
	struct timespec t0, t1;
	uint64_t next_voter = SCALE_VOTERS + 1;
	unsigned long snaps;
	struct sim *s;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	scale_msgs = scale_snaps = 0;
	s = sim_new(&c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	sim_set_observer(s, count_scale_msg, NULL);
	CU_ASSERT_EQUAL(sim_campaign(s, 1), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL_FATAL(sim_leader(s), 1);

	/* each learner's addition commits before the next (one at a time) */
	for (uint64_t id = SCALE_VOTERS + 1; id <= SCALE_IDS; id++) {
		CU_ASSERT_EQUAL_FATAL(sim_conf_change(s, 1, RPS__RAFT_CONF_ADD_LEARNER, id), 0);
		CU_ASSERT_EQUAL(sim_start_joiner(s, id), 0);
		sim_deliver_all(s);
	}
	t = scale_settle(s, 1, 20);
	CU_ASSERT_FATAL(t != UINT_MAX);
	ticks += t;
	sim_status(s, 1, &ls);
	CU_ASSERT_EQUAL(ls.conf.n_voters, SCALE_VOTERS);
	CU_ASSERT_EQUAL(ls.conf.n_learners, SCALE_LEARNERS);
	for (uint64_t id = 1; id <= SCALE_IDS; id++) {
		sim_status(s, id, &st);
		CU_ASSERT_EQUAL(st.conf.n_learners, SCALE_LEARNERS);
		CU_ASSERT_EQUAL(st.promotable, id <= SCALE_VOTERS);
	}

	/* a few hundred writes reach everyone */
	writes += scale_writes(s, 1, 300, 10000);
	CU_ASSERT_EQUAL(writes, 300);
	t = scale_settle(s, 1, 10);
	CU_ASSERT_FATAL(t != UINT_MAX);
	ticks += t;

	/* voter 3 and learners 10..19 crash, learners 50 and 60 are cut off;
	 * the leader compacts, so some of them can only catch up by snapshot */
	sim_crash(s, 3);
	for (uint64_t id = 10; id < 20; id++)
		sim_crash(s, id);
	sim_isolate(s, 50);
	sim_isolate(s, 60);
	writes += scale_writes(s, 1, 100, 20000);
	sim_tick_all(s, 2);
	ticks += 2;
	CU_ASSERT_EQUAL(sim_compact(s, 1), 0);
	writes += scale_writes(s, 1, 50, 30000);
	CU_ASSERT_EQUAL(writes, 450);
	sim_status(s, 1, &ls);
	CU_ASSERT_EQUAL(ls.commit, ls.last_index);	/* 4 voters of 5 commit */
	CU_ASSERT(sim_applied(s, 50) < ls.commit);
	CU_ASSERT_EQUAL(sim_restart(s, 3), 0);
	for (uint64_t id = 10; id < 20; id++)
		CU_ASSERT_EQUAL(sim_restart(s, id), 0);
	sim_heal(s);
	snaps = scale_snaps;
	t = scale_settle(s, 1, 30);
	CU_ASSERT_FATAL(t != UINT_MAX);
	ticks += t;
	/* 3, 10..19, 50 and 60 missed entries the leader compacted away */
	CU_ASSERT(scale_snaps - snaps >= 13);
	for (uint32_t sh = 0; sh < SIM_SHARDS; sh++) {
		uint64_t o1, e1, o, e;

		sim_shard(s, 1, sh, &o1, &e1);
		for (uint64_t id = 2; id <= SCALE_IDS; id++) {
			sim_shard(s, id, sh, &o, &e);
			CU_ASSERT(o == o1 && e == e1);
		}
	}

	/* voter 5 leaves, learner 6 takes its place */
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_REMOVE, 5), 0);
	sim_deliver_all(s);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_PROMOTE, 6), 0);
	sim_deliver_all(s);
	sim_crash(s, 5);	/* shut down once its removal committed */
	writes += scale_writes(s, 1, 50, 40000);
	t = scale_settle(s, 1, 10);
	CU_ASSERT_FATAL(t != UINT_MAX);
	ticks += t;
	for (uint64_t id = 1; id <= SCALE_IDS; id++) {
		if (id == 5)
			continue;
		sim_status(s, id, &st);
		CU_ASSERT_EQUAL(st.conf.n_voters, SCALE_VOTERS);
		CU_ASSERT_TRUE(rps__raft_conf_is_voter(&st.conf, 6));
		CU_ASSERT_FALSE(rps__raft_conf_is_voter(&st.conf, 5) || rps__raft_conf_is_learner(&st.conf, 5));
		CU_ASSERT_EQUAL(st.conf.n_learners, SCALE_LEARNERS - 1);
	}
	/* 6 counts: with 2 and 3 cut off, 1, 4 and 6 are the quorum */
	sim_isolate(s, 2);
	sim_isolate(s, 3);
	sim_write(s, 1, 0, 7);
	sim_deliver_all(s);
	sim_status(s, 1, &ls);
	CU_ASSERT_EQUAL(ls.commit, ls.last_index);
	sim_heal(s);

	/* learners are promoted up to 16 voters, and no further */
	sim_status(s, 1, &ls);
	for (uint64_t id = 7; ls.conf.n_voters < RPS__RAFT_MAX_VOTERS; id++) {
		CU_ASSERT_EQUAL_FATAL(sim_conf_change(s, 1, RPS__RAFT_CONF_PROMOTE, id), 0);
		sim_deliver_all(s);
		sim_status(s, 1, &ls);
		next_voter = id + 1;
	}
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_PROMOTE, next_voter), -ENOSPC);
	CU_ASSERT_EQUAL(sim_conf_change(s, 1, RPS__RAFT_CONF_ADD_VOTER, 5), -ENOSPC);
	writes += scale_writes(s, 1, 10, 50000);
	t = scale_settle(s, 1, 10);
	CU_ASSERT_FATAL(t != UINT_MAX);
	ticks += t;
	assert_no_violation(s);
	sim_status(s, 1, &ls);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fprintf(stderr, "\n  5 voters + 100 learners, %u + %u at the end: %u writes, commit %llu, %u ticks, %lu messages (%lu snapshots) in %.1f s\n",
		ls.conf.n_voters, ls.conf.n_learners, writes, (unsigned long long)ls.commit, ticks, scale_msgs, scale_snaps,
		(double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	sim_free(s);
}

/* Each shard map check fails when what it guards is broken (the simulator
 * injects the bug): the first seeds that fail say why. */
static void test_simulator_map_checks_fail(void)
{
	static const struct {
		enum sim_map_fault fault;
		const char *says;
	} cases[] = {
		{ SIM_FAULT_SKIP_APPLY, "shard maps differ at applied index" },
		{ SIM_FAULT_SNAPSHOT_NO_MAP, "epoch went back" },
		{ SIM_FAULT_SNAPSHOT_NO_MAP, "shard maps differ at applied index" },
		{ SIM_FAULT_SPLIT_OWNER, "has two owners in epoch" },
		{ SIM_FAULT_FAILOVER_KEEPS_OLD, "the backups were" },
		{ SIM_FAULT_OWNER_BACKUP, "is also its backup" },
		{ SIM_FAULT_TWIN_BACKUPS, "twice" },
		{ SIM_FAULT_STALE_READ, "not linearisable: register 4 read" },
	};

	for (size_t i = 0; i < RPS__ARRAY_SIZE(cases); i++) {
		unsigned long long seed, failed = 0;
		char err[1024] = "";

		for (seed = 1; seed <= 200; seed++) {
			if (!sim_run_random_fault(seed, cases[i].fault, 0, NULL, err, sizeof(err)))
				continue;
			failed++;
			if (strstr(err, cases[i].says))
				break;
			if (getenv("RAFT_SIM_VERBOSE"))
				fprintf(stderr, "\n  fault %d, seed %llu, not yet: %s", (int)cases[i].fault, seed, err);
		}
		if (getenv("RAFT_SIM_VERBOSE") && seed <= 200)
			fprintf(stderr, "\n  fault %d, seed %llu: %s", (int)cases[i].fault, seed, err);
		if (seed > 200)
			fprintf(stderr, "\n  fault %d: no seed failed with \"%s\" (%llu failed otherwise, last: %s)\n",
				(int)cases[i].fault, cases[i].says, failed, err);
		CU_ASSERT(seed <= 200);
	}
}

int main(void)
{
	static const struct cutest core_tests[] = {
		{ "bootstrap snapshot, joiner waits", test_bootstrap_and_join },
		{ "config and restore validation", test_config_and_restore_validation },
		{ "ready/advance contract", test_ready_contract },
		{ "leader election (1, 3, 5 nodes, +-PreVote)", test_leader_election },
		{ "election needs a quorum", test_election_needs_a_quorum },
		{ "randomised election timeout in [e, 2e)", test_randomized_election_timeout },
		{ "vote rules: up to date, once per term", test_vote_rules },
		{ "PreVote changes neither term nor vote", test_pre_vote_changes_nothing },
		{ "candidate falls back to follower", test_candidate_falls_back_to_follower },
		{ "single node commits alone", test_single_node_commits_alone },
		{ "log replication", test_log_replication },
		{ "commit only the current term by counting", test_commit_only_current_term_by_counting },
		{ "follower append rules, conflict truncation", test_follower_append_rules },
		{ "uncommitted membership change rolled back", test_uncommitted_conf_change_rolled_back },
		{ "flow control: probe, replicate, window", test_flow_control },
		{ "divergent log repaired with few probes", test_divergent_log_is_repaired_quickly },
		{ "PreVote prevents disruption on rejoin", test_pre_vote_prevents_disruption },
		{ "CheckQuorum: leader steps down", test_check_quorum_steps_down },
		{ "leader lease ignores votes", test_leader_lease_ignores_votes },
		{ "leadership transfer", test_leader_transfer },
		{ "transfer to a lagging follower", test_leader_transfer_to_lagging_follower },
		{ "transfer times out", test_leader_transfer_times_out },
		{ "learner catches up, then promoted", test_learner_catches_up_then_promoted },
		{ "membership change rules", test_membership_change_rules },
		{ "at most 16 voters: a new cluster, proposals, the log, snapshots", test_voter_bound },
		{ "removed node does not disrupt", test_removed_node_does_not_disrupt },
		{ "unusable messages and strangers refused", test_unusable_messages_refused },
		{ "appended entries out of order refused", test_app_entries_out_of_order_refused },
		{ "snapshot install (and resend)", test_snapshot_install },
		{ "restart recovers persisted state", test_restart_recovers_persisted_state },
		{ "shard map commands through Raft", test_shard_map_through_raft },
		{ "ReadIndex", test_read_index },
		{ "ReadIndex: only voters' acks count", test_read_index_counts_voters_only },
		{ "codec round trip", test_codec_roundtrip },
		{ "codec rejects malformed input", test_codec_rejects_malformed },
		{ "codec: 16 voters and 1,024 nodes pass, more do not", test_codec_conf_bounds },
	};
	static const struct cutest sim_tests[] = {
		{ "linearisability checker", test_linearizability_checker },
		{ "random seeds", test_simulator_random_seeds },
		{ "shard map checks catch injected bugs", test_simulator_map_checks_fail },
		{ "5 voters and 100 learners", test_simulator_learners_at_scale },
	};
	const struct cutest_suite suites[] = {
		{ "raft", NULL, NULL, NULL, NULL, core_tests, CUTEST_COUNT(core_tests) },
		{ "raft simulator", NULL, NULL, NULL, NULL, sim_tests, CUTEST_COUNT(sim_tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
