/*
 * raft_sim.h - a deterministic simulator that drives several Raft cores
 * (src/control/raft.h) over a simulated network and simulated stable storage, and
 * checks Raft's safety properties at every step.
 *
 * Each node is an application as raft.h describes it: it persists every
 * ready (snapshot, entries, hard state) to an in-memory "disk", sends the
 * messages only afterwards (checked), and applies committed entries to a
 * toy shard map shard -> (owner, epoch, write id) and, for entries of the
 * second kind, to the product's shard map (proto/smap.h) with the product's
 * decode and apply, as src/control/cp_map.c does (a refused or undecodable
 * command changes nothing but the map's applied index).  Snapshots carry
 * both.  A crash throws away the core and the state machines; a restart
 * hands the core exactly what the disk holds.
 *
 * The network carries every message encoded (rps__raft_msg_encode/decode), so
 * the codec is exercised on every delivery.
 *
 * Invariants checked as they happen (the first violation is kept, see
 * sim_error):
 *  - election safety: at most one leader per term;
 *  - log matching: entries with equal (index, term) have equal contents and
 *    equal predecessors, over everything ever persisted by any node;
 *  - committed entries are never lost or changed: what any node considers
 *    committed is recorded and every later view must agree;
 *  - leader completeness: a new leader holds every recorded committed entry;
 *  - state-machine safety: nodes apply the same entry at an index, in order;
 *  - messages go out only after the state they promise is on disk (a vote
 *    granted after the vote is persisted, an append acknowledged after the
 *    entries are, no term in a message ahead of the persisted term), and
 *    entries are applied only once on disk;
 *  - the persisted term never decreases, nor the vote of a term changes;
 *    the commit index on disk never passes the log on disk;
 *  - term >= the last log term; the configuration in force is the latest
 *    one in the log; a leader proposes a membership change only when the
 *    previous one is committed and it committed an entry of its term;
 *  - in random runs, forged twins of every 61st delivery (a term of 2^64-1,
 *    a stranger's answer) are refused and change nothing;
 *  - the product's shard map: every node's encoded map is byte-identical at
 *    equal applied index (applied or restored from a snapshot); over every
 *    node's whole history one owner per (partition, epoch); a partition's
 *    epoch never goes back within a node's life; the owner is never one of
 *    its backups, backups are distinct members; a FAILOVER that applied made
 *    primary a member that was a backup at the epoch before.
 * And at the end of a random run: linearisability of the client history
 * (writes "move shard s to owner o" and shard map commands, ReadIndex reads
 * of a shard and of the whole map, a map read's bytes being the map as of
 * the write it saw), and liveness once every fault is healed (a leader,
 * every member caught up, and a linearisable read served at each of them).
 *
 * A random run: 3 to 5 voters with seeded settings (PreVote and
 * CheckQuorum each on in 3 of 4 seeds, window, batch size, heartbeat), then
 * 150 to 350 ticks of phases of 10 to 70 ticks, each calm, lossy
 * (loss, duplication, reordering by random delays), a symmetric partition, the
 * leader cut off, one-way cuts, flapping partitions, a node paused for 1.5
 * to 3.5 election timeouts, crash-heavy, or "churn" (each new leader cut off or
 * crashed within a few ticks: entries of many terms half replicated, the
 * ground of the Raft paper's Figure 8); throughout, client writes and
 * reads at random nodes (shard map commands, valid and not, of every type,
 * over a map of 5 members, 16 partitions and 2 or 3 replicas), membership changes (learners added on fresh ids,
 * promoted, removed; voters added and removed; sometimes in bursts),
 * leadership transfers, compaction, crashes at any persistence step
 * (including a torn append that keeps only a prefix) and restarts from disk.
 *
 * Used two ways: unit tests build a cluster and step it by hand (deliver
 * everything pending, isolate nodes, tick one node, ...), and
 * sim_run_random() plays a whole seeded scenario of faults.
 */
#ifndef RPS_TEST_RAFT_SIM_H
#define RPS_TEST_RAFT_SIM_H

#include "control/raft.h"
#include "proto/smap.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_DEFAULT_IDS 8u	/* node ids 1..8, unless sim_config.n_ids says */
#define SIM_CAP_IDS 128u	/* the most ids one simulation can use */
#define SIM_SHARDS 4u
#define SIM_MAP_PARTS 16u	/* the product's shard map: 5 members, 16 partitions */

struct sim;

struct sim_config {
	unsigned n_voters;		/* initial members 1..n_voters, bootstrapped */
	unsigned election_ticks;
	unsigned heartbeat_ticks;
	unsigned max_inflight;
	unsigned max_entries;
	bool pre_vote;
	bool check_quorum;
	uint64_t seed;
	unsigned map_replicas;		/* R of the initial shard map, 0: 2 */
	unsigned n_ids;			/* node ids 1..n_ids exist, 0: SIM_DEFAULT_IDS; <= SIM_CAP_IDS */
};

/* A cluster with nodes 1..n_voters up and no message sent yet; NULL (and a
 * line on stderr) past RPS__RAFT_MAX_VOTERS voters or SIM_CAP_IDS ids. */
struct sim *sim_new(const struct sim_config *cfg);
void sim_free(struct sim *s);
/* The first invariant violation, or NULL. */
const char *sim_error(const struct sim *s);

struct rps__raft *sim_raft(struct sim *s, uint64_t id);	/* NULL if down */
void sim_status(struct sim *s, uint64_t id, struct rps__raft_status *st);

/* Node life cycle. */
int sim_start_joiner(struct sim *s, uint64_t id);	/* an empty node that joins later */
void sim_crash(struct sim *s, uint64_t id);
int sim_restart(struct sim *s, uint64_t id);

/* Drive one node; each call handles the readies it produces. */
void sim_tick(struct sim *s, uint64_t id, unsigned n);
void sim_tick_all(struct sim *s, unsigned n);	/* n rounds: tick each up node, deliver all */
int sim_campaign(struct sim *s, uint64_t id);
int sim_propose(struct sim *s, uint64_t id, const void *data, size_t len, uint64_t *index);
int sim_conf_change(struct sim *s, uint64_t id, enum rps__raft_conf_op op, uint64_t node);
int sim_transfer(struct sim *s, uint64_t id, uint64_t to);
/* A hand-made message, straight into a node. */
int sim_step(struct sim *s, uint64_t id, const struct rps__raft_msg *m);
/* Client operations, recorded for the linearisability check. */
int sim_write(struct sim *s, uint64_t id, uint32_t shard, uint64_t owner);
int sim_read(struct sim *s, uint64_t id, uint32_t shard, uint64_t *ctx);
/* The value a completed read returned: 0 pending, else 1 + write id. */
uint64_t sim_read_result(struct sim *s, uint64_t ctx);
/* A shard map command (its encoding, proposed like a write), and a ReadIndex
 * read of the whole map; sim_read_result says 1 + the write id of the map
 * command it saw (0 the initial map). */
int sim_map_write(struct sim *s, uint64_t id, const struct rps__smap_cmd *c);
int sim_map_read(struct sim *s, uint64_t id, uint64_t *ctx);
/* Node id's shard map (its state while up). */
const struct rps__smap *sim_map(struct sim *s, uint64_t id);
/* Compact node id's log up to what it applied (its disk and its core). */
int sim_compact(struct sim *s, uint64_t id);

/* Network. */
void sim_deliver_all(struct sim *s);		/* until nothing is pending */
size_t sim_pending(const struct sim *s);
void sim_drop_pending(struct sim *s);
void sim_cut(struct sim *s, uint64_t from, uint64_t to, bool cut);
void sim_isolate(struct sim *s, uint64_t id);
void sim_heal(struct sim *s);
/* Drop every message for which drop() is true (NULL: none). */
void sim_set_filter(struct sim *s, bool (*drop)(void *arg, const struct rps__raft_msg *m), void *arg);
/* Called for every message a node sends (NULL: none). */
void sim_set_observer(struct sim *s, void (*seen)(void *arg, const struct rps__raft_msg *m), void *arg);

/* Observations. */
uint64_t sim_leader(struct sim *s);		/* the leader of the highest term, 0 if none */
uint64_t sim_applied(struct sim *s, uint64_t id);
void sim_shard(struct sim *s, uint64_t id, uint32_t shard, uint64_t *owner, uint64_t *epoch);
size_t sim_stored_entries(struct sim *s, uint64_t id);	/* entries on its disk */
int sim_check_linearizable(struct sim *s);	/* 0, or -1 with sim_error set */

/* A whole random scenario.  Returns 0, or -1 with the violation in err. */
struct sim_run_stats {
	unsigned ticks;
	unsigned nodes;
	unsigned leaders;
	unsigned crashes;
	unsigned writes_ok;
	unsigned reads_ok;
	unsigned conf_changes;
	unsigned transfers;
	unsigned snapshots;
	unsigned msgs;
	unsigned map_reads_ok;
	unsigned map_refused;			/* committed map commands refused (each index once) */
	unsigned map_ok[RPS__SMAP_CMD_LAST + 1];	/* ... applied, by type */
};
/* trace: 0 quiet, 1 events on stderr, 2 events and every message. */
int sim_run_random(uint64_t seed, unsigned trace, struct sim_run_stats *stats, char *err, size_t errlen);

/* Deliberate bugs, to show the shard map checks catch them. */
enum sim_map_fault {
	SIM_FAULT_NONE,
	SIM_FAULT_SKIP_APPLY,		/* node 2 skips every 5th map command */
	SIM_FAULT_SNAPSHOT_NO_MAP,	/* a restored snapshot brings the initial map */
	SIM_FAULT_SPLIT_OWNER,		/* node 2: a FAILOVER keeps the old primary (epoch + 1) */
	SIM_FAULT_FAILOVER_KEEPS_OLD,	/* the same on every node */
	SIM_FAULT_OWNER_BACKUP,		/* every node: REPLICA_COMMIT appends the owner */
	SIM_FAULT_TWIN_BACKUPS,		/* every node: REPLICA_COMMIT doubles the first backup */
	SIM_FAULT_STALE_READ,		/* map reads answer at once, without ReadIndex */
	SIM_FAULT_KINDS,
};
int sim_run_random_fault(uint64_t seed, enum sim_map_fault fault, unsigned trace, struct sim_run_stats *stats,
			 char *err, size_t errlen);

/* The linearisability checker on its own, over one register whose writes
 * carry unique values, with the writes' order known (log order): times are
 * invocation / response sequence numbers, UINT64_MAX for "never answered". */
struct sim_lin_write {
	uint64_t inv;
	uint64_t resp;
};
struct sim_lin_read {
	uint64_t inv;
	uint64_t resp;
	size_t saw;			/* 0: the initial value, k: writes[k - 1] */
};
/* 0 if linearisable; else -1 and *bad = the first read that cannot be placed
 * (or n_reads if a write cannot). */
int sim_lin_check(const struct sim_lin_write *writes, size_t n_writes, const struct sim_lin_read *reads,
		  size_t n_reads, size_t *bad);

#endif
