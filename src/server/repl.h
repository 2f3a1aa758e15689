/*
 * repl.h - the replication stream between a partition's primary and its
 * backups (doc/design.md "Replication"), as the rest of the data plane
 * calls it.  Private to src/server, like server_int.h (which it needs).
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

#include "server/server_int.h"

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
 * push): fail the TAKEN pushes of that step and later ones, naming it. */
void rps__srv_repl_step_orphaned(struct rps__server *srv, struct srv_tensor *t, struct shard *s, int rank);
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
/* Once per loop turn: dial, retry entries, batched REPL_ACKs. */
void rps__srv_repl_turn(struct rps__server *srv);
void rps__srv_repl_fini(struct rps__server *srv);
int rps__srv_repl_set_peer(struct rps__server *srv, uint64_t id, const char *uri);

#endif
