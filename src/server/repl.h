/*
 * repl.h - the replication stream between a partition's primary and its
 * backups (doc/design.md "Replication"), as the rest of the data plane
 * calls it, and its parts of the server's structs.  Private to src/server,
 * like server_int.h (which includes it).
 *
 * Replication's files share the prefix repl_ in both planes:
 *   src/server/repl_stream.c   the stream, the primary's side, and what both
 *                              sides share: pairing, messages, a broken stream
 *   src/server/repl_backup.c   the stream, the backup's side: accepting a
 *                              primary, applying its entries
 *   src/control/repl_place.c   replica sets: placing backups, seeding a new one
 *   src/control/repl_failover.c  failure detection, primary leases, FAILOVER
 * An update applied on the primary goes to every backup before the worker's
 * ack (async, bounded) or STEP_DONE (sync) goes out; apply.c applies it the
 * same way on both sides, so replicas stay bit-identical.
 */
#ifndef RPS_SERVER_REPL_H
#define RPS_SERVER_REPL_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/proto.h"
#include "proto/smap.h"

/* (server_int.h includes this header: its structs embed the parts below) */
struct rps__server;
struct srv_conn;
struct srv_tensor;
struct shard;
struct repl_wait;

/* A replication stream's part of its connection (CONN_REPL): the primary's
 * side (out) writes entries from its ring into the backup's slots; the
 * backup applies them in order. */
struct srv_conn_repl {
	bool out;		/* we dialed: we are the primary */
	bool ready;		/* primary: the backup answered REPL_HELLO */
	uint32_t nslots;
	uint32_t slot_size;
	uint64_t raddr;		/* primary: the backup's slots */
	uint32_t rkey;
	uint32_t credits;	/* primary: free slots on the backup */
	uint64_t cseq;		/* primary: entries sent; backup: entries applied */
	uint64_t cseq_acked;	/* primary: entries the backup applied */
	uint32_t credits_owed;	/* backup: freed since the last REPL_ACK */
	uint32_t npending;	/* backup: entries waiting for the map to catch up */
	bool refused;		/* backup: an entry was refused (NACK): apply no more */
	bool rev_in;		/* a REPL_REV stream it dialed: we are its primary */
	uint32_t *tmap;		/* backup: the primary's tensor id -> ours + 1 */
	uint32_t ntmap;
	uint8_t *bound;		/* primary: tensor ids bound on this stream */
	uint32_t nbound;
};

/* A sync worker's part of its connection: steps replicated, not yet told
 * (STEP_DONE, repl_stream.c). */
struct srv_conn_sd {
	struct rps__step_done_ent *ent;
	uint32_t n, cap;
	uint32_t inflight;	/* STEP_DONE messages in the send queue */
};

/* A member this server streams to, or is streamed to by. */
struct repl_peer {
	uint64_t id;
	char uri[RPS__SMAP_URI_MAX];
	struct srv_conn *conn;	/* our stream to it (we are primary) */
	bool wanted;		/* a partition of ours has it as a replica */
	uint64_t next_dial;
	uint32_t fails;		/* dials failed in a row (backoff) */
	/* its stream to us, which we dial when our id is the higher */
	struct srv_conn *in;
	uint64_t next_dial_in;
	uint32_t fails_in;
};

/* Replication's part of the server (repl_stream.c, repl_backup.c). */
struct srv_repl {
	struct repl_peer peers[RPS__SMAP_MAX_MEMBERS];
	uint32_t npeers;
	bool active;			/* a stream or a wait exists: repl turn has work */
	bool orphans_owed;		/* orphaned sync contributions to ship or end (repl_stream.c) */
	uint64_t slow_check;		/* next look for updates that wait long (repl_stream.c) */
	uint64_t unknown;		/* a replica with no address, logged once */
	struct repl_wait *rwaits;	/* updates waiting for their replicas, in order */
	uint32_t nrwaits, rwaits_cap;
	uint64_t seq[RPS__SMAP_MAX_PART];	/* primary: entries sent; backup: applied */
	uint64_t diverged[RPS__SMAP_MAX_PART];	/* primary: a replica whose stream broke before it
						 * confirmed an update (repl_stream.c): to be dropped */
	/* backup: the map's epoch when its primary became primary (the epoch
	 * moves on without it when the replica set changes) */
	uint64_t primary_since[RPS__SMAP_MAX_PART];
	char fp[RPS__REPL_FP_MAX];	/* kernel fingerprint */
	struct {
		uint64_t entries_sent, entries_applied, acks_sent, acks_received, deferred, refused;
		uint64_t pairings_refused;	/* kernel fingerprints differed */
		uint64_t taken_acks;		/* sync: PUSH_ACKs with RPS__ACK_TAKEN */
		uint64_t step_done_resend;	/* STEP_DONE entries saying "resend" */
		uint64_t step_done_orphaned;	/* ... and "orphaned by a rank" */
		uint64_t orphan_entries;	/* REPL_PARTIAL and REPL_PARKED entries shipped for them */
		uint64_t step_done_sent;	/* sync: STEP_DONE messages ... */
		uint64_t step_done_entries;	/* ... and the entries in them */
		struct rps__step_done_ent last_step_done;	/* the last entry sent */
		uint64_t lease_refused;		/* acks refused at ack time: the lease had run out */
	} stats;
};

/* 0: every replica of the partition can take the entry (and t's binding)
 * now; -EAGAIN: not yet (the push stays held, its replica is dialed). */
int rps__srv_repl_reserve(struct rps__server *srv, struct srv_tensor *t, uint32_t part);
/* After rps__srv_repl_reserve: ship the update just applied (published
 * from publish_begin on, not ended) and defer its publication and the
 * worker's ack (c, slot) until every replica confirmed it. */
void rps__srv_repl_push(struct rps__server *srv, struct srv_tensor *t, struct shard *s,
			const struct rps__push_desc *d, struct srv_conn *c, uint32_t slot, uint64_t holds);
void rps__srv_repl_init(struct rps__server *srv, struct srv_tensor *t, struct shard *s, struct srv_conn *c,
			uint32_t slot);
void rps__srv_repl_step(struct rps__server *srv, struct srv_tensor *t, struct shard *s);
/* Sync: c's contribution to step `clock` was acknowledged TAKEN; tell c
 * STEP_DONE once that step is on every replica. */
void rps__srv_repl_step_wait(struct rps__server *srv, struct srv_conn *c, struct srv_tensor *t, struct shard *s,
			     uint64_t clock);
bool rps__srv_repl_step_confirmed(const struct shard *s, uint64_t clock);
/* Sync: the current step of s is orphaned by `rank` (gone before its
 * push): end the TAKEN pushes of that step and later ones, naming it, once
 * every replica holds them. */
void rps__srv_repl_step_orphaned(struct rps__server *srv, struct shard *s, int rank);
/* Complete the waits every replica confirmed (after an ack, or a view
 * that dropped a replica). */
void rps__srv_repl_confirm(struct rps__server *srv);
/* The map changed part's replica set: the replicas it dropped are let go
 * by the waits for good (a member seeded again is a new replica). */
void rps__srv_repl_view_changed(struct rps__server *srv, uint32_t part);
/* The partition is refused from now (moved away, paused): its sync pushes
 * taken here are told to resend (STEP_DONE entries of version 0). */
void rps__srv_repl_refuse_part(struct rps__server *srv, uint32_t part);
bool rps__srv_repl_busy(const struct rps__server *srv, uint32_t part);
void rps__srv_repl_on_entry(struct rps__server *srv, struct srv_conn *c, uint32_t slot);
void rps__srv_repl_on_message(struct rps__server *srv, struct srv_conn *c, const struct rps__msg_hdr *h,
			      const void *body);
const char *rps__srv_repl_fingerprint(struct rps__server *srv);
uint32_t rps__srv_repl_slot_size(const struct rps__server *srv);
/* the stream's connections: repl_backup.c (accepted, on_hello,
 * backup_turn; and rps__srv_repl_on_entry above) and repl_stream.c (the rest) */
int rps__srv_repl_accepted(struct rps__server *srv, struct srv_conn *c);
/* a backup with a higher member id dialed us for its stream */
void rps__srv_repl_rev_accepted(struct rps__server *srv, struct srv_conn *c);
void rps__srv_repl_on_hello(struct rps__server *srv, struct srv_conn *c, const struct rps__msg_hdr *h,
			    const struct rps__repl_hello *hello);
void rps__srv_repl_backup_turn(struct rps__server *srv, struct srv_conn *c);
void rps__srv_repl_conn_gone(struct rps__server *srv, struct srv_conn *c);
uint64_t rps__srv_repl_diverged(struct rps__server *srv, uint32_t part);
/* Is our stream to member id up (a planned switch hands over only then)?
 * If not, it is dialed. */
bool rps__srv_repl_stream_up(struct rps__server *srv, uint32_t part, uint64_t id);
/* Once per loop turn: dial, retry entries, batched REPL_ACKs. */
void rps__srv_repl_turn(struct rps__server *srv);
void rps__srv_repl_fini(struct rps__server *srv);
int rps__srv_repl_set_peer(struct rps__server *srv, uint64_t id, const char *uri);

#endif
