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
 * Commands carry the epoch they expect, so a duplicate, late or replayed
 * command is refused deterministically (every replica decides the same) and
 * whichever of COMMIT and ABORT comes first in the log wins.
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

#define RPS__SMAP_MAX_MEMBERS 16u
#define RPS__SMAP_MAX_PART 256u
#define RPS__SMAP_DEFAULT_PART 64u
#define RPS__SMAP_URI_MAX 128u		/* including the NUL */
/* Epoch that a fenced shard header shows: "not here any more". */
#define RPS__EPOCH_MOVED UINT64_MAX

struct rps__smap_member {
	uint64_t id;
	char uri[RPS__SMAP_URI_MAX];	/* "tcp://host:port" / "verbs://addr:port" */
};

struct rps__smap_part {
	uint64_t owner;		/* member id */
	uint64_t epoch;		/* >= 1; moves on with every committed move */
	uint64_t moving_to;	/* 0, or the destination of a move in progress */
	uint64_t lost;		/* 0, or the member whose memory its contents were lost with:
				 * refused (-ENODATA) until restored or forgotten */
};

struct rps__smap {
	uint64_t applied;	/* Raft index of the last command applied (0: none) */
	uint64_t max_id;	/* highest member id ever added */
	uint32_t npart;
	uint32_t nmembers;
	struct rps__smap_member members[RPS__SMAP_MAX_MEMBERS];	/* sorted by id */
	struct rps__smap_part parts[RPS__SMAP_MAX_PART];
};

enum rps__smap_cmd_type {
	RPS__SMAP_ADD_MEMBER = 1,	/* id, uri */
	RPS__SMAP_REMOVE_MEMBER = 2,	/* id: must own no partition and be no move's target */
	RPS__SMAP_MOVE_BEGIN = 3,	/* part, from (current owner), to, epoch (current) */
	RPS__SMAP_MOVE_COMMIT = 4,	/* part, to, epoch (the one BEGIN named) */
	RPS__SMAP_MOVE_ABORT = 5,	/* part, epoch */
	RPS__SMAP_NOP = 6,		/* changes nothing but applied (commit latency probes) */
	RPS__SMAP_MARK_LOST = 7,	/* part, from (current owner), epoch: its owner restarted
					 * without it (the contents are gone) */
	RPS__SMAP_CLEAR_LOST = 8,	/* part, epoch: restored, or accepted empty */
	RPS__SMAP_FORCE_REMOVE = 9,	/* id: a dead member goes: its moves are aborted, its
					 * partitions pass to the others (round robin by id,
					 * epoch + 1) marked lost with it */
};

struct rps__smap_cmd {
	uint32_t type;			/* enum rps__smap_cmd_type */
	uint32_t part;
	uint64_t id;			/* ADD/REMOVE_MEMBER */
	uint64_t from, to;
	uint64_t epoch;
	char uri[RPS__SMAP_URI_MAX];	/* ADD_MEMBER */
};

/* A bootstrapped cluster: members 1..n at uris[0..n-1], npart partitions
 * (0 = RPS__SMAP_DEFAULT_PART), partition p owned by member (p mod n) + 1,
 * epoch 1.  -EINVAL for n or npart out of range or a uri too long. */
int rps__smap_init(struct rps__smap *m, const char *const *uris, uint32_t n, uint32_t npart);

/* The partition of shard `shard` of a tensor whose placement seed is seed. */
static inline uint32_t rps__smap_part_of(const struct rps__smap *m, uint32_t seed, uint32_t shard)
{
	return (uint32_t)(((uint64_t)seed + shard) % m->npart);
}

const struct rps__smap_member *rps__smap_member(const struct rps__smap *m, uint64_t id);
/* Partitions owned by id (a move in progress still counts for its owner). */
uint32_t rps__smap_owned(const struct rps__smap *m, uint64_t id);
/* Partitions whose contents are lost (the lost field set). */
uint32_t rps__smap_nlost(const struct rps__smap *m);

/* Check a command against the state without applying it: 0, or a negative
 * errno with a one-line message (rps__seterr) saying why:
 * -ENOENT unknown member / partition, -EEXIST member id or uri taken,
 * -ENOSPC member table full, -ESTALE epoch or owner not the current one,
 * -EBUSY partition already moving (BEGIN) or member still owns partitions
 * or is a move's target (REMOVE), -EINVAL malformed (to == from, bad type,
 * id 0, id <= max_id on ADD, empty uri), -ENODATA a move of a lost
 * partition, -EALREADY MARK_LOST of a lost one, -EBUSY FORCE_REMOVE of the
 * last member. */
int rps__smap_check(const struct rps__smap *m, const struct rps__smap_cmd *c);
/* Apply a command committed at Raft index `index` (> m->applied): applies
 * it if the check passes, otherwise leaves the state as it was; either way
 * m->applied = index.  Returns what the check returned. */
int rps__smap_apply(struct rps__smap *m, uint64_t index, const struct rps__smap_cmd *c);

/* Command wire format (little-endian, versioned).  Encoded size is at most
 * RPS__SMAP_CMD_MAX.  decode: -EBADMSG for anything malformed or truncated,
 * never reading outside buf. */
#define RPS__SMAP_CMD_MAX 192u
int rps__smap_cmd_encode(const struct rps__smap_cmd *c, void *buf, size_t cap, size_t *len);
int rps__smap_cmd_decode(const void *buf, size_t len, struct rps__smap_cmd *c);

/* The whole map (snapshots, and what servers send workers and psctl):
 * little-endian, versioned, ends with a crc32c (rps__crc32c_noinv, crc.h) of what precedes it.
 * RPS__SMAP_ENC_MAX bounds the size.  decode: -EBADMSG malformed or
 * truncated, -EILSEQ crc mismatch (message says so). */
#define RPS__SMAP_ENC_MAX (64u + RPS__SMAP_MAX_MEMBERS * (8u + RPS__SMAP_URI_MAX) + \
			   RPS__SMAP_MAX_PART * 32u + 4u)
size_t rps__smap_encoded_size(const struct rps__smap *m);
int rps__smap_encode(const struct rps__smap *m, void *buf, size_t cap, size_t *len);
int rps__smap_decode(const void *buf, size_t len, struct rps__smap *m);

const char *rps__smap_cmd_name(uint32_t type);
/* One line describing a command, e.g. "move partition 7 from 2 to 3 (epoch 4)". */
const char *rps__smap_cmd_str(const struct rps__smap_cmd *c, char *buf, size_t len);

/* Human table / JSON of the map (psctl status).  JSON is one object:
 * {"applied":N,"partitions":[{"partition":0,"owner":1,"epoch":1,
 *   "moving_to":0,"lost":0},...],"members":[{"id":1,"uri":"tcp://..."},...]} */
void rps__smap_print(const struct rps__smap *m, FILE *f);
void rps__smap_print_json(const struct rps__smap *m, FILE *f);

#endif
