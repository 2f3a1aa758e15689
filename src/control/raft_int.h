/*
 * raft_int.h - what the pieces of the Raft core share (private to
 * the core's files named below; the API is raft.h, which raft_node.c, the
 * node that drives the core, uses).
 *
 * The core is split as etcd-raft is: the state machine (raft.c) apart from
 * its log (raft_log.c), progress tracking (raft_tracker.c), quorum
 * arithmetic (raft_quorum.c) and configuration changes (raft_confchange.c);
 * messages (raft_msg.c) and the application's side (raft_rawnode.c: proposals,
 * ready / advance, creation) beside it.  All of them work on one struct
 * rps__raft, defined here.
 */
#ifndef RPS_RAFT_INT_H
#define RPS_RAFT_INT_H

#include "control/raft.h"

#define READS_MAX 256u		/* pending ReadIndex requests at a leader */
/* Every campaign increments the term: a term that cannot be incremented is
 * refused wherever it comes from, so no node ever persists a term its next
 * campaign would wrap to 0 (which the log then refuses, on every restart). */
#define TERM_MAX (UINT64_MAX - 1)
/* No real log gets near this; above it index arithmetic could wrap. */
#define INDEX_MAX (UINT64_MAX >> 1)

#define CONF_DATA_LEN 9u	/* a conf entry's data: u8 op, u64 node */

/* in-flight window of a follower in replicate state: the last index of each
 * append message not yet acknowledged */

struct inflights {
	uint64_t *buf;			/* cap slots, malloc'ed on entering replicate */
	unsigned start;
	unsigned count;
	unsigned cap;
};

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
	uint64_t acks[RPS__RAFT_MAX_VOTERS];	/* voters only: only they count */
};

/* ents[i] holds index snap_index + 1 + i. */
struct raft_log {
	struct rps__raft_entry *ents;
	size_t n;
	uint32_t cap;
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

	/* prs[0..n_prs): one per member; a slot past n_prs owns no window */
	struct progress prs[RPS__RAFT_MAX_NODES];
	unsigned n_prs;

	unsigned n_votes;		/* voters only: only they vote */
	uint64_t vote_from[RPS__RAFT_MAX_VOTERS];
	bool vote_granted[RPS__RAFT_MAX_VOTERS];

	struct read_request *reads;
	unsigned n_reads;

	struct rps__raft_msg *msgs;
	size_t n_msgs;
	uint32_t cap_msgs;
	struct rps__raft_read_state *read_states;
	size_t n_read_states;
	uint32_t cap_read_states;

	bool bcast_pending;		/* proposals not yet sent: ready sends them */
	struct rps__raft_hard_state prev_hs;	/* persisted, as far as we know */
	bool ready_out;
	struct rps__raft_hard_state ready_hs;
	uint64_t ready_last_index;
	uint64_t ready_applied_to;

	uint64_t refused;		/* messages dropped by refuse_reason() */
};

enum vote_result { VOTE_PENDING, VOTE_WON, VOTE_LOST };

/* raft_log.c: the log in memory */
uint64_t rps__raft_log_last(const struct raft_log *l);
bool rps__raft_log_term(const struct raft_log *l, uint64_t i, uint64_t *t);
uint64_t rps__raft_log_term_or0(const struct raft_log *l, uint64_t i);
uint64_t rps__raft_log_last_term(const struct raft_log *l);
bool rps__raft_log_match_term(const struct raft_log *l, uint64_t i, uint64_t t);
struct rps__raft_entry *rps__raft_log_entry(const struct raft_log *l, uint64_t i);
bool rps__raft_log_up_to_date(const struct raft_log *l, uint64_t last_index, uint64_t last_term);
uint64_t rps__raft_log_find_conflict_by_term(const struct raft_log *l, uint64_t index, uint64_t term,
					     uint64_t *found_term);
int rps__raft_log_append(struct raft_log *l, const struct rps__raft_entry *src);
void rps__raft_log_truncate(struct raft_log *l, uint64_t from);
void rps__raft_log_compact(struct raft_log *l, uint64_t index, uint64_t term);
void rps__raft_log_free(struct raft_log *l);

/* raft_tracker.c: each follower's progress and in-flight window */
bool rps__raft_inflights_full(const struct inflights *in);
void rps__raft_inflights_add(struct inflights *in, uint64_t last);
void rps__raft_inflights_free_le(struct inflights *in, uint64_t to);
void rps__raft_inflights_free_first(struct inflights *in);
struct progress *rps__raft_progress_find(struct rps__raft *r, uint64_t id);
void rps__raft_pr_reset_state(struct progress *pr, enum rps__raft_progress_state state);
void rps__raft_pr_become_probe(struct progress *pr);
void rps__raft_pr_become_replicate(struct rps__raft *r, struct progress *pr);
void rps__raft_pr_become_snapshot(struct progress *pr, uint64_t index);
bool rps__raft_pr_maybe_update(struct progress *pr, uint64_t n);
bool rps__raft_pr_maybe_decr_to(struct progress *pr, uint64_t rejected, uint64_t match_hint);
bool rps__raft_pr_paused(const struct progress *pr);
void rps__raft_progress_init(struct rps__raft *r, struct progress *pr, uint64_t id);
void rps__raft_progress_free(struct progress *pr);
void rps__raft_progress_reset_all(struct rps__raft *r);

/* raft_quorum.c: commit index, vote tally, CheckQuorum */
unsigned rps__raft_quorum(const struct rps__raft *r);
enum vote_result rps__raft_poll(struct rps__raft *r, uint64_t id, bool granted);
int rps__raft_cmp_u64_desc(const void *a, const void *b);
bool rps__raft_maybe_commit(struct rps__raft *r);
bool rps__raft_quorum_active(struct rps__raft *r);

/* raft_confchange.c: voters, learners, conf entries */
bool rps__raft_id_in(const uint64_t *ids, uint32_t n, uint64_t id);
bool rps__raft_conf_has_room(const struct rps__raft_conf_state *cs);
bool rps__raft_conf_has_voter_room(const struct rps__raft_conf_state *cs);
void rps__raft_conf_apply_entry(struct rps__raft_conf_state *cs, const struct rps__raft_entry *e);
bool rps__raft_promotable(const struct rps__raft *r);
void rps__raft_conf_changed(struct rps__raft *r);
void rps__raft_conf_recompute(struct rps__raft *r);
void rps__raft_conf_at(const struct rps__raft *r, uint64_t index, struct rps__raft_conf_state *cs);

/* raft_msg.c: the outbox of messages and read states */
struct rps__raft_msg *rps__raft_msg_push(struct rps__raft *r, uint8_t type, uint64_t to);
int rps__raft_msg_attach_entries(struct rps__raft *r, struct rps__raft_msg *m, uint64_t lo, uint64_t hi);
int rps__raft_msg_attach_snapshot(struct rps__raft *r, struct rps__raft_msg *m);
void rps__raft_msgs_clear(struct rps__raft *r);
void rps__raft_read_state_push(struct rps__raft *r, uint64_t index, uint64_t ctx);

/* raft.c: the state machine */
void rps__raft_fail(struct rps__raft *r, int err);
void rps__raft_send_timeout_now(struct rps__raft *r, uint64_t to);
void rps__raft_become_follower(struct rps__raft *r, uint64_t term, uint64_t lead);
int rps__raft_leader_append(struct rps__raft *r, uint32_t type, const void *data, size_t len,
			    uint64_t *index);
bool rps__raft_send_append(struct rps__raft *r, struct progress *pr, bool send_if_empty);
void rps__raft_bcast_append(struct rps__raft *r);
bool rps__raft_leader_committed_in_term(const struct rps__raft *r);
int rps__raft_read_request_add(struct rps__raft *r, uint64_t from, uint64_t ctx);
int rps__raft_set_snapshot(struct rps__raft *r, const struct rps__raft_snapshot *s);

#endif
