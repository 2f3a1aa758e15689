/*
 * raft.h - the Raft consensus core that orders changes of shard ownership.
 *
 * The core is free of I/O: it never touches a socket, a clock or a file.  It
 * takes events (a tick of the logical clock, a message from a peer, a
 * proposal) and accumulates what the application must do; the application
 * collects that as a "ready" batch, carries it out, and acknowledges it with
 * advance.  So a deterministic simulator can drive it (tests/raft_sim.c), and
 * the server drives it from its event loop.
 *
 * Features: randomised election timeouts in [election, 2*election) ticks,
 * PreVote, CheckQuorum (with the leader lease that makes nodes ignore votes
 * while they hear from a leader), log replication with batching and
 * pipelining (probe / replicate / snapshot flow states, an in-flight window per
 * follower), fast back-off on conflicts with (index, term) hints, leadership
 * transfer (TimeoutNow), single-server membership changes with non-voting
 * learners that catch up before promotion, log compaction with snapshots and
 * InstallSnapshot, linearisable reads with ReadIndex.
 *
 * The ready / advance loop (as in etcd-raft's RawNode):
 *
 *	while (rps__raft_ready(r, &rd) > 0) {
 *		if (rd.snapshot)	persist it and drop every stored entry
 *		if (rd.n_entries)	drop stored entries >= rd.entries[0].index,
 *					append rd.entries
 *		if (rd.hard_state_changed)	persist rd.hard_state
 *		send rd.msgs			(only now: they promise the above)
 *		if (rd.snapshot)	reset the state machine from it
 *		apply rd.committed in order, serve rd.read_states once applied
 *		rps__raft_advance(r, &rd);
 *	}
 *
 * A leader may send rd.msgs before persisting (Raft thesis 10.2.1): they
 * promise nothing about its own disk, and it counts its followers' acks only
 * in a later step, so only once its own write is done (raft_node.c does this).
 *
 * Every pointer in a ready stays valid until advance, and between ready and
 * advance no other call may be made on the core (they return -EBUSY): the
 * application persists synchronously, which the control plane can afford
 * (ownership changes are rare).
 *
 * Membership: the configuration in force is the latest configuration entry in
 * the log, committed or not (Raft thesis 4.1), so it is rebuilt when a
 * conflicting suffix is truncated.  A leader accepts one change at a time:
 * only once the previous one is committed and once it has committed an entry
 * of its own term (the fix of the single-server change bug, raft-dev 2015).
 * A leader cannot remove itself: transfer leadership first.  The leader stops
 * replicating to a removed node as soon as it appends the removal, so that
 * node may never learn it: shut it down once the removal is committed (with
 * PreVote and CheckQuorum it cannot disrupt the cluster meanwhile).  A
 * learner is promoted only once it holds everything committed (-EAGAIN).
 *
 * A fresh cluster is bootstrapped by giving every initial member the same
 * config.peers: each then starts from the identical snapshot at index 1,
 * term 1, holding that configuration and an empty state machine (len 0: the
 * application treats it as its initial state), handed out in the first ready
 * like a snapshot from a leader.  A node that joins later starts empty (no
 * peers) and receives the configuration with the leader's snapshot.
 *
 * Errors are negative errno values with a message through rps__seterr():
 * -EPERM not the leader (rps__raft_leader() gives the hint), -EBUSY a ready is
 * outstanding or a change / transfer is pending, -EAGAIN retry later (leader
 * has not yet committed in its term, learner not caught up), -EINVAL bad
 * argument, -EPROTO a peer broke the protocol (an append conflicting with a
 * committed entry: a safety bug somewhere), -ENOMEM.  After -ENOMEM the core
 * refuses every call: free it and restart from what was persisted.
 *
 * Not thread-safe: one core is driven by one thread.
 */
#ifndef RPS_RAFT_H
#define RPS_RAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Node ids are nonzero; 0 means "nobody" (no vote, no known leader). */
#define RPS__RAFT_NONE 0u
/* Voters plus learners in one configuration: every member of the cluster
 * is one, all but a few of them learners. */
#define RPS__RAFT_MAX_NODES 1024u
/* Voters of one configuration: what a quorum is drawn from (the product
 * keeps 5), and so the bound of every vote tally and ack list. */
#define RPS__RAFT_MAX_VOTERS 16u
/* Largest entry payload and snapshot the codec accepts. */
#define RPS__RAFT_MAX_DATA (64u << 20)

enum rps__raft_role {
	RPS__RAFT_FOLLOWER,
	RPS__RAFT_PRE_CANDIDATE,
	RPS__RAFT_CANDIDATE,
	RPS__RAFT_LEADER,
};

enum rps__raft_entry_type {
	RPS__RAFT_ENTRY_NORMAL = 0,	/* application data (empty: the leader's no-op) */
	RPS__RAFT_ENTRY_CONF = 1,	/* a membership change, see rps__raft_conf_change_decode */
};

enum rps__raft_conf_op {
	RPS__RAFT_CONF_ADD_VOTER = 1,
	RPS__RAFT_CONF_ADD_LEARNER = 2,
	RPS__RAFT_CONF_PROMOTE = 3,	/* learner -> voter */
	RPS__RAFT_CONF_REMOVE = 4,	/* voter or learner */
};

enum rps__raft_msg_type {
	RPS__RAFT_MSG_APP = 1,		/* append entries (index/log_term: the entry before them) */
	RPS__RAFT_MSG_APP_RESP,		/* index: last matching index, or on reject the rejected one */
	RPS__RAFT_MSG_VOTE,		/* index/log_term: the candidate's last entry */
	RPS__RAFT_MSG_VOTE_RESP,
	RPS__RAFT_MSG_PRE_VOTE,		/* term: the term the candidate would campaign in */
	RPS__RAFT_MSG_PRE_VOTE_RESP,
	RPS__RAFT_MSG_HEARTBEAT,	/* commit, context: the newest pending ReadIndex */
	RPS__RAFT_MSG_HEARTBEAT_RESP,	/* context echoed */
	RPS__RAFT_MSG_SNAP,		/* InstallSnapshot, snapshot attached */
	RPS__RAFT_MSG_TIMEOUT_NOW,	/* leadership transfer: campaign at once */
	RPS__RAFT_MSG_READ_INDEX,	/* a follower forwards a read, context = ctx */
	RPS__RAFT_MSG_READ_INDEX_RESP,	/* index to wait for, context = ctx */
	RPS__RAFT_MSG_TYPE_MAX = RPS__RAFT_MSG_READ_INDEX_RESP,
};

/* msg.flags */
#define RPS__RAFT_MSG_F_TRANSFER 1u	/* vote asked for by a leadership transfer: bypasses the lease */

struct rps__raft_entry {
	uint64_t term;
	uint64_t index;
	uint32_t type;			/* enum rps__raft_entry_type */
	uint32_t len;
	const void *data;		/* owned by whoever made the entry */
};

/* n_voters <= RPS__RAFT_MAX_VOTERS, n_voters + n_learners <=
 * RPS__RAFT_MAX_NODES (rps__raft_conf_fits).  About 8 KiB: pass it by
 * pointer. */
struct rps__raft_conf_state {
	uint32_t n_voters;
	uint32_t n_learners;
	uint64_t voters[RPS__RAFT_MAX_VOTERS];
	uint64_t learners[RPS__RAFT_MAX_NODES];
};

/* A snapshot of the state machine after applying entry `index`. */
struct rps__raft_snapshot {
	uint64_t index;
	uint64_t term;
	struct rps__raft_conf_state conf;	/* configuration as of index */
	uint32_t len;
	const void *data;
};

/* What must survive a crash besides the log and the snapshot. */
struct rps__raft_hard_state {
	uint64_t term;
	uint64_t vote;
	uint64_t commit;
};

struct rps__raft_msg {
	uint8_t type;			/* enum rps__raft_msg_type */
	uint8_t reject;
	uint8_t flags;			/* RPS__RAFT_MSG_F_* */
	uint64_t to;
	uint64_t from;
	uint64_t term;
	uint64_t log_term;
	uint64_t index;
	uint64_t commit;
	uint64_t hint;			/* APP_RESP reject: probe from here (log_term = our term there) */
	uint64_t context;		/* ReadIndex ctx */
	uint32_t n_entries;
	const struct rps__raft_entry *entries;
	const struct rps__raft_snapshot *snapshot;	/* SNAP only */
	void *owned;			/* private: backing store of entries/snapshot */
};

/* A linearisable read is ready: serve it once the applied index >= index. */
struct rps__raft_read_state {
	uint64_t index;
	uint64_t ctx;
};

struct rps__raft_ready {
	/* Informational, always filled. */
	enum rps__raft_role role;
	uint64_t leader;

	bool hard_state_changed;
	struct rps__raft_hard_state hard_state;

	/* Received from the leader: persist it in place of the whole stored log
	 * (atomically), then reset the state machine from it. */
	const struct rps__raft_snapshot *snapshot;

	/* Persist: drop stored entries with index >= entries[0].index (a
	 * conflicting suffix, if any), then append these. */
	const struct rps__raft_entry *entries;
	size_t n_entries;

	/* Apply in order, after the snapshot if any. */
	const struct rps__raft_entry *committed;
	size_t n_committed;

	/* Send only after the above are persisted. */
	const struct rps__raft_msg *msgs;
	size_t n_msgs;

	const struct rps__raft_read_state *read_states;
	size_t n_read_states;
};

struct rps__raft_config {
	uint64_t id;			/* nonzero, never reused by another node */
	const uint64_t *peers;		/* bootstrap voters (including id) of a new cluster; */
	size_t n_peers;			/*   ignored when state is restored, 0 to join one */
	const void *boot_state;		/* the state machine's data in a new cluster's */
	size_t boot_state_len;		/*   snapshot at index 1 (copied; may be empty) */
	unsigned election_ticks;	/* > heartbeat_ticks; timeouts drawn in [e, 2e) */
	unsigned heartbeat_ticks;	/* >= 1 */
	bool pre_vote;
	bool check_quorum;
	unsigned max_inflight_msgs;	/* append messages in flight per follower, >= 1 */
	unsigned max_msg_entries;	/* entries per append message, >= 1 */
	uint64_t seed;			/* for the randomised election timeout */
};

/* What the application persisted, handed back after a restart. */
struct rps__raft_persisted {
	struct rps__raft_hard_state hard_state;
	const struct rps__raft_snapshot *snapshot;	/* NULL: none */
	const struct rps__raft_entry *entries;		/* contiguous, following the snapshot */
	size_t n_entries;
};

enum rps__raft_progress_state {
	RPS__RAFT_PROGRESS_PROBE,	/* one append at a time until we find where logs match */
	RPS__RAFT_PROGRESS_REPLICATE,	/* pipelined appends */
	RPS__RAFT_PROGRESS_SNAPSHOT,	/* a snapshot is on its way */
};

struct rps__raft_status {
	uint64_t id;
	enum rps__raft_role role;
	uint64_t term;
	uint64_t vote;
	uint64_t leader;
	uint64_t commit;
	uint64_t applied;
	uint64_t snapshot_index;	/* entries up to here are compacted */
	uint64_t last_index;
	uint64_t lead_transferee;
	bool promotable;		/* a voter of its own configuration */
	struct rps__raft_conf_state conf;
	uint64_t refused;		/* messages dropped unread (see rps__raft_step) */
};

struct rps__raft_progress_info {
	uint64_t match;
	uint64_t next;
	enum rps__raft_progress_state state;
	bool recent_active;
	unsigned inflight;
};

struct rps__raft;

/* Create a core.  restored may be NULL (a new node).  Returns 0 or -EINVAL,
 * -ENOMEM. */
int rps__raft_new(const struct rps__raft_config *cfg, const struct rps__raft_persisted *restored,
		  struct rps__raft **out);
void rps__raft_free(struct rps__raft *r);

/* One tick of the logical clock. */
int rps__raft_tick(struct rps__raft *r);
/* A message from a peer (borrowed: the core copies what it keeps).  Dropped
 * before it changes anything, and counted in status.refused: a term that
 * cannot be incremented, a snapshot from a later term or at an index above
 * 2^63, an ack beyond the leader's log (-EPROTO, a peer broke the protocol),
 * and a non-member's message other than an append or a vote request, which
 * a node must hear from a leader or candidate its configuration does not
 * list yet (returns 0: routine around membership changes).  No campaign goes
 * past term 2^64-2 (rps__raft_campaign: -EOVERFLOW). */
int rps__raft_step(struct rps__raft *r, const struct rps__raft_msg *m);
/* Start an election now (PreVote first if configured), e.g. at start up. */
int rps__raft_campaign(struct rps__raft *r);

/* Append data at the leader; *index and *term (may be NULL) say where: the
 * proposal succeeded iff the entry applied at *index has term *term.  The
 * appends to the followers go out with the next ready, so proposals made
 * before it travel together: one message per follower. */
int rps__raft_propose(struct rps__raft *r, const void *data, size_t len, uint64_t *index,
		      uint64_t *term);
int rps__raft_propose_conf_change(struct rps__raft *r, enum rps__raft_conf_op op, uint64_t node,
				  uint64_t *index);
int rps__raft_transfer_leader(struct rps__raft *r, uint64_t to);
/* Ask for a linearisable read; ctx comes back in a read state.  ctx must be
 * nonzero and unique in the cluster among pending reads (put the node id in
 * its high bits).  On a follower the request is forwarded to the leader; a
 * lost request is never answered, so time out and retry with a new ctx. */
int rps__raft_read_index(struct rps__raft *r, uint64_t ctx);
/* Log compaction.  data is a snapshot of the state machine after applying
 * index (<= the applied index); the core keeps a copy for followers that
 * fall behind and drops its entries up to index.  *snap (may be NULL) then
 * points at the core's snapshot, with the term and configuration as of
 * index, valid until the next call: persist it, and drop the stored entries
 * up to index (in either order: all of it is committed and applied). */
int rps__raft_compact(struct rps__raft *r, uint64_t index, const void *data, size_t len,
		      const struct rps__raft_snapshot **snap);

/* 1 and a filled rd if there is work (then advance is due), 0 if none. */
int rps__raft_ready(struct rps__raft *r, struct rps__raft_ready *rd);
int rps__raft_advance(struct rps__raft *r, const struct rps__raft_ready *rd);

uint64_t rps__raft_leader(const struct rps__raft *r);
/* st->conf is filled up to its counts only, the slots past them left as
 * they were: there is room for RPS__RAFT_MAX_NODES learners, mostly unused,
 * and status is called often. */
void rps__raft_status(const struct rps__raft *r, struct rps__raft_status *st);
/* The entry at index from the in-memory log, -ENOENT if compacted or beyond. */
int rps__raft_entry_at(const struct rps__raft *r, uint64_t index, const struct rps__raft_entry **e);
/* The leader's view of a peer; -ENOENT if not the leader or not a member. */
int rps__raft_progress(const struct rps__raft *r, uint64_t id, struct rps__raft_progress_info *pi);

/* Decode a RPS__RAFT_ENTRY_CONF entry. */
int rps__raft_conf_change_decode(const struct rps__raft_entry *e, enum rps__raft_conf_op *op,
				 uint64_t *node);
bool rps__raft_conf_is_voter(const struct rps__raft_conf_state *cs, uint64_t id);
bool rps__raft_conf_is_learner(const struct rps__raft_conf_state *cs, uint64_t id);
/* Whether a configuration of that many voters and learners is within the
 * bounds above: what a decoder checks before it trusts the counts. */
bool rps__raft_conf_fits(uint64_t n_voters, uint64_t n_learners);
/* *dst = *src, but only the counts and the ids they cover, not the unused
 * slots (src must fit the bounds). */
void rps__raft_conf_copy(struct rps__raft_conf_state *dst, const struct rps__raft_conf_state *src);

/* Wire format (little-endian, versioned).  encoded_size gives the exact size;
 * encode returns -ENOSPC if cap is short; decode returns one allocation
 * (release with rps__raft_msg_free), -EBADMSG for malformed or truncated
 * input, never reading outside buf. */
size_t rps__raft_msg_encoded_size(const struct rps__raft_msg *m);
int rps__raft_msg_encode(const struct rps__raft_msg *m, void *buf, size_t cap, size_t *len);
int rps__raft_msg_decode(const void *buf, size_t len, struct rps__raft_msg **out);
void rps__raft_msg_free(struct rps__raft_msg *m);

const char *rps__raft_msg_type_name(int type);

#endif
