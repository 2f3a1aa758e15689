/*
 * smap.h - the shard map: the replicated state machine of the Raft group.
 *
 * Shards are not placed one by one.  The cluster has a fixed number of
 * partitions (chosen when the cluster is bootstrapped); shard i of a tensor
 * whose name hashes to seed lives in partition (seed + i) mod npart, and the
 * map says which server owns each partition and under which epoch.  Moving a
 * partition moves every tensor's shards in it (like Redis cluster slots or
 * Ceph placement groups): the map stays small whatever the model size, and a
 * tensor is created without a consensus round.
 *
 * A move is two log entries:
 *   MOVE_BEGIN(p, from, to, epoch e)   p is now "moving": its owner fences it
 *                                      (refuses pushes, seals locks) and ships
 *                                      its shards to `to`
 *   MOVE_COMMIT(p, to, epoch e)        owner := to, epoch := e + 1
 *   MOVE_ABORT(p, epoch e)             the move is off, owner keeps p
 * A move to one of the partition's backups is a planned switch: the owner
 * fences it until every backup confirmed what it applied, ships nothing
 * (the backup holds the same state) and proposes the COMMIT itself, which
 * makes the backup primary (it leaves the backups) and drops the old owner
 * from the set; the leader then seeds a new backup.  A REPLICA_DROP of
 * the destination aborts it.
 *
 * Commands carry the epoch they expect, so a duplicate, late or replayed
 * command is refused deterministically (every replica decides the same) and
 * whichever of COMMIT and ABORT comes first in the log wins.
 *
 * Replica sets: a partition may also have up to RPS__SMAP_MAX_REPLICAS - 1
 * backups (ordered; the owner is the primary) and one member being seeded as
 * a new backup (joining, like moving_to).  Adding a backup keeps the epoch;
 * dropping one and FAILOVER (a backup becomes primary) move it on, so a
 * removed replica is fenced deterministically.  The map also holds the
 * replication target R (replicas) and each member's zone label.  With R = 1,
 * no backups and no zones, every encoding is byte-identical to the one
 * before replica sets existed.
 *
 * Members are the servers that can own partitions, with the address workers
 * and peers reach them at.  Ids are chosen by the operator (or 1..n for a
 * bootstrapped --cluster list), nonzero, never reused: the map remembers the
 * highest id it has seen.
 *
 * Pure data: no I/O, no allocation after init; every replica that applies
 * the same commands in the same order holds byte-identical state.
 */
#ifndef RPS_SMAP_H
#define RPS_SMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define RPS__SMAP_MAX_MEMBERS 64u
#define RPS__SMAP_MAX_PART 256u
#define RPS__SMAP_DEFAULT_PART 64u
#define RPS__SMAP_URI_MAX 128u		/* including the NUL */
#define RPS__SMAP_MAX_REPLICAS 3u	/* primary + backups */
#define RPS__SMAP_ZONE_MAX 16u		/* including the NUL */
/* Epoch that a fenced shard header shows: "not here any more". */
#define RPS__EPOCH_MOVED UINT64_MAX

struct rps__smap_member {
	uint64_t id;
	char uri[RPS__SMAP_URI_MAX];	/* "tcp://host:port" / "verbs://addr:port" */
	char zone[RPS__SMAP_ZONE_MAX];	/* "": none declared */
	uint32_t flags;			/* enum rps__smap_member_flags */
	uint32_t reserved;
};

enum rps__smap_member_flags {
	/* rdmapsd --witness: a Raft voter that holds no partition, never a
	 * primary, backup, joiner or move target (two data servers and a
	 * witness fail over as three servers do); workers do not connect */
	RPS__SMAP_WITNESS = 1u << 0,
};

struct rps__smap_part {
	uint64_t owner;		/* member id */
	uint64_t epoch;		/* >= 1; moves on with every committed move */
	uint64_t moving_to;	/* 0, or the destination of a move in progress */
	uint64_t lost;		/* 0, or the member whose memory its contents were lost with:
				 * refused (-ENODATA) until restored or forgotten */
	uint64_t backups[RPS__SMAP_MAX_REPLICAS - 1];	/* ordered, unused slots 0 */
	uint64_t joining;	/* 0, or a member being seeded as a new backup */
};

struct rps__smap {
	uint64_t applied;	/* Raft index of the last command applied (0: none) */
	uint64_t max_id;	/* highest member id ever added */
	uint32_t npart;
	uint32_t nmembers;
	uint32_t replicas;	/* replication target R, 1..RPS__SMAP_MAX_REPLICAS */
	uint32_t reserved;
	struct rps__smap_member members[RPS__SMAP_MAX_MEMBERS];	/* sorted by id */
	struct rps__smap_part parts[RPS__SMAP_MAX_PART];
};

enum rps__smap_cmd_type {
	RPS__SMAP_ADD_MEMBER = 1,	/* id, uri */
	RPS__SMAP_REMOVE_MEMBER = 2,	/* id: must own no partition and be no move's target */
	RPS__SMAP_MOVE_BEGIN = 3,	/* part, from (current owner), to (not its joiner), epoch (current) */
	RPS__SMAP_MOVE_COMMIT = 4,	/* part, to, epoch (the one BEGIN named); a backup `to`
					 * leaves the backups */
	RPS__SMAP_MOVE_ABORT = 5,	/* part, epoch */
	RPS__SMAP_NOP = 6,		/* changes nothing but applied (commit latency probes) */
	RPS__SMAP_MARK_LOST = 7,	/* part, from (current owner), epoch: its owner restarted
					 * without it (the contents are gone) */
	RPS__SMAP_CLEAR_LOST = 8,	/* part, epoch: restored, or accepted empty; id: the owner's
					 * start that restored it (0: psctl forget-lost) */
	RPS__SMAP_FORCE_REMOVE = 9,	/* id: a dead member goes: its moves are aborted, its
					 * partitions pass to the others (round robin by id,
					 * epoch + 1) marked lost with it; one with a backup
					 * fails over to its first backup instead (not lost),
					 * and it leaves every replica set */
	RPS__SMAP_SET_REPLICAS = 10,	/* id: the target R (1..RPS__SMAP_MAX_REPLICAS) */
	RPS__SMAP_SET_ZONE = 11,	/* id, zone ("" clears it) */
	RPS__SMAP_REPLICA_BEGIN = 12,	/* part, to, epoch: `to` is seeded as a new backup */
	RPS__SMAP_REPLICA_COMMIT = 13,	/* part, to, epoch: it is a backup now (epoch kept) */
	RPS__SMAP_REPLICA_ABORT = 14,	/* part, epoch: the seeding is off */
	RPS__SMAP_REPLICA_DROP = 15,	/* part, id (a backup), epoch: it leaves the set, epoch + 1 */
	RPS__SMAP_FAILOVER = 16,	/* part, from (the primary), to (a backup), epoch, keep[]:
					 * to becomes primary, the backups are keep[] (in
					 * map order), moves and seeding are off, epoch + 1 */
	RPS__SMAP_SET_WITNESS = 17,	/* id: the member becomes a witness.  Where it was a
					 * backup it leaves the set, where primary its first
					 * backup takes over (as FAILOVER), a move to it or a
					 * seeding of it is off, epoch + 1 each; refused
					 * (-EBUSY) while it owns a partition without a backup
					 * or it is the last member that is not a witness */
};
#define RPS__SMAP_CMD_LAST RPS__SMAP_SET_WITNESS

struct rps__smap_cmd {
	uint32_t type;			/* enum rps__smap_cmd_type */
	uint32_t part;
	uint64_t id;			/* ADD/REMOVE_MEMBER */
	uint64_t from, to;
	uint64_t epoch;
	char uri[RPS__SMAP_URI_MAX];	/* ADD_MEMBER */
	char zone[RPS__SMAP_ZONE_MAX];	/* SET_ZONE */
	uint32_t nkeep;			/* FAILOVER: backups that stay */
	uint32_t reserved;
	uint64_t keep[RPS__SMAP_MAX_REPLICAS - 1];
};

/* The partitions of a new cluster of n members when --partitions is not
 * given: RPS__SMAP_DEFAULT_PART up to 16 members, then 4 a member rounded
 * up to a power of two (128 up to 32, 256 up to 64), at most
 * RPS__SMAP_MAX_PART: every member primary of at least 4, so a failover or
 * a rebalance can spread a member's share over several others. */
uint32_t rps__smap_default_partitions(uint32_t n);
/* A bootstrapped cluster: members 1..n at uris[0..n-1], npart partitions
 * (0 = rps__smap_default_partitions(n)), partition p owned by member (p mod n) + 1,
 * epoch 1.  -EINVAL for n or npart out of range or a uri too long. */
int rps__smap_init(struct rps__smap *m, const char *const *uris, uint32_t n, uint32_t npart);
/* The same with replication target r (1..min(n, RPS__SMAP_MAX_REPLICAS)):
 * partition p's backups are members ((p + k) mod n) + 1, k = 1..r-1.
 * rps__smap_init is this with r = 1. */
int rps__smap_init_replicated(struct rps__smap *m, const char *const *uris, uint32_t n, uint32_t npart,
			      uint32_t r);

/* The partition of shard `shard` of a tensor whose placement seed is seed. */
static inline uint32_t rps__smap_part_of(const struct rps__smap *m, uint32_t seed, uint32_t shard)
{
	return (uint32_t)(((uint64_t)seed + shard) % m->npart);
}

/* A member address the map takes: tcp://HOST:PORT or verbs://ADDR:PORT
 * (IPv6 as [ADDR]), printable ASCII, port 1 to 65535.  ADD_MEMBER with
 * any other is refused when applied, whoever proposed it. */
bool rps__smap_uri_ok(const char *uri);

const struct rps__smap_member *rps__smap_member(const struct rps__smap *m, uint64_t id);
/* Partitions owned by id (a move in progress still counts for its owner). */
uint32_t rps__smap_owned(const struct rps__smap *m, uint64_t id);
/* Partitions whose contents are lost (the lost field set). */
uint32_t rps__smap_nlost(const struct rps__smap *m);

enum rps__smap_role { RPS__SMAP_ROLE_NONE, RPS__SMAP_ROLE_PRIMARY, RPS__SMAP_ROLE_BACKUP,
		      RPS__SMAP_ROLE_JOINING };
/* Backups of partition p (0..RPS__SMAP_MAX_REPLICAS - 1). */
uint32_t rps__smap_nbackups(const struct rps__smap *m, uint32_t p);
/* What member id is to partition p. */
enum rps__smap_role rps__smap_role(const struct rps__smap *m, uint32_t p, uint64_t id);
/* Partitions id is a backup of (seeding not counted). */
uint32_t rps__smap_backed(const struct rps__smap *m, uint64_t id);
/* Partitions with fewer copies than the target (lost ones not counted). */
uint32_t rps__smap_nunder(const struct rps__smap *m);
/* Does anything need the replicated encoding (backups, a joiner, a zone,
 * a target above 1)? */
bool rps__smap_replicated(const struct rps__smap *m);
/* Is member id a witness (RPS__SMAP_WITNESS)?  Members that hold data:
 * nmembers - rps__smap_nwitnesses. */
bool rps__smap_is_witness(const struct rps__smap *m, uint64_t id);
uint32_t rps__smap_nwitnesses(const struct rps__smap *m);
/* Placement: the member to seed as a new backup of p, among those with
 * alive(id) true (NULL: all), outside the set and not its joiner or move
 * target: first one whose zone neither the set nor its joiner has yet,
 * then the fewest replicas held (owned + backed), then the lowest id.
 * Never a witness.  0 if none. */
/* loads[i]: replicas member slot i holds (owned + backed), from
 * rps__smap_member_loads; a caller that places many partitions in one
 * pass counts them once (O(partitions)), not once per member per
 * partition.  rps__smap_pick_backup counts them itself. */
void rps__smap_member_loads(const struct rps__smap *m, uint32_t loads[RPS__SMAP_MAX_MEMBERS]);
uint64_t rps__smap_pick_backup_loaded(const struct rps__smap *m, uint32_t p, bool (*alive)(void *ctx, uint64_t id),
				      void *ctx, const uint32_t loads[RPS__SMAP_MAX_MEMBERS]);
uint64_t rps__smap_pick_backup(const struct rps__smap *m, uint32_t p, bool (*alive)(void *ctx, uint64_t id),
			       void *ctx);
/* Balancing: the next move that evens out the primaries of the members
 * that hold data (not witnesses) with alive(id) true (NULL: all).  While
 * the member that owns most owns two partitions more than the one that
 * owns fewest (ties: the lowest ids), one of its partitions goes to that
 * one: one that has it as a backup first (a planned switch ships
 * nothing), then one whose copies it adds a zone to, then any, the
 * highest-numbered of equals; never one moving, seeding a backup or lost.
 * 1 and *part, *from, *to: that move; 0: even; -EBUSY: the member that owns
 * most has nothing it can move now (*from says which). */
int rps__smap_balance_move(const struct rps__smap *m, bool (*alive)(void *ctx, uint64_t id), void *ctx,
			   uint32_t *part, uint64_t *from, uint64_t *to);
/* How many replicas of p (its primary and backups, not a joiner) are in
 * zone (0 for ""). */
uint32_t rps__smap_in_zone(const struct rps__smap *m, uint32_t p, const char *zone);
/* A backup of p that shares a declared zone with another replica of p
 * (the last such in set order), 0 if none: the copy to give up first. */
uint64_t rps__smap_zone_duplicate(const struct rps__smap *m, uint32_t p);

/* Check a command against the state without applying it: 0, or a negative
 * errno with a one-line message (rps__seterr) saying why:
 * -ENOENT unknown member / partition, -EEXIST member id or uri taken,
 * -ENOSPC member table full, -ESTALE epoch or owner not the current one,
 * -EBUSY partition already moving (BEGIN) or member still owns partitions
 * or is a move's target (REMOVE), -EINVAL malformed (to == from, bad type,
 * id 0, id <= max_id on ADD, empty uri), -ENODATA a move of a lost
 * partition, -EALREADY MARK_LOST of a lost one, -EBUSY FORCE_REMOVE of the
 * last member (or of the last one that is not a witness); MOVE_BEGIN or
 * REPLICA_BEGIN to a witness is -EINVAL. */
int rps__smap_check(const struct rps__smap *m, const struct rps__smap_cmd *c);
/* Apply a command committed at Raft index `index` (> m->applied): applies
 * it if the check passes, otherwise leaves the state as it was; either way
 * m->applied = index.  Returns what the check returned. */
int rps__smap_apply(struct rps__smap *m, uint64_t index, const struct rps__smap_cmd *c);

/* Command wire format (little-endian, versioned).  Encoded size is at most
 * RPS__SMAP_CMD_MAX.  decode: -EBADMSG for anything malformed or truncated,
 * never reading outside buf. */
#define RPS__SMAP_CMD_MAX 256u
int rps__smap_cmd_encode(const struct rps__smap_cmd *c, void *buf, size_t cap, size_t *len);
int rps__smap_cmd_decode(const void *buf, size_t len, struct rps__smap_cmd *c);

/* The whole map (snapshots, and what servers send workers and psctl):
 * little-endian, versioned, ends with a crc32c (rps__crc32c_noinv, crc.h) of what precedes it.
 * RPS__SMAP_ENC_MAX bounds the size.  decode: -EBADMSG malformed or
 * truncated, -EILSEQ crc mismatch (message says so). */
#define RPS__SMAP_ENC_MAX (64u + RPS__SMAP_MAX_MEMBERS * (14u + RPS__SMAP_URI_MAX + RPS__SMAP_ZONE_MAX) + \
			   RPS__SMAP_MAX_PART * (41u + 8u * (RPS__SMAP_MAX_REPLICAS - 1u)) + 4u)
size_t rps__smap_encoded_size(const struct rps__smap *m);
int rps__smap_encode(const struct rps__smap *m, void *buf, size_t cap, size_t *len);
int rps__smap_decode(const void *buf, size_t len, struct rps__smap *m);

const char *rps__smap_cmd_name(uint32_t type);
/* One line describing a command, e.g. "move partition 7 from 2 to 3 (epoch 4)". */
const char *rps__smap_cmd_str(const struct rps__smap_cmd *c, char *buf, size_t len);

/* Human table / JSON of the map (psctl status).  JSON is one object:
 * {"applied":N,"partitions":[{"partition":0,"owner":1,"epoch":1,
 *   "moving_to":0,"lost":0},...],"members":[{"id":1,"uri":"tcp://..."},...]}
 * A replicated map (rps__smap_replicated) adds "replicas" and
 * "under_replicated" to the object, "backups" and "joining" to each
 * partition and "zone" to each member; a map with a witness adds
 * "witness":true to that member. */
void rps__smap_print(const struct rps__smap *m, FILE *f);
void rps__smap_print_json(const struct rps__smap *m, FILE *f);

#endif
