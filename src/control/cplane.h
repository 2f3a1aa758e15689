/*
 * cplane.h - the server's control plane as the node composing it sees it
 * (daemon.c, tests/test_cplane.c): created from the configuration, started
 * over a data plane (its ops table and handle), it gives the hooks the
 * server loop calls it through.
 */
#ifndef RPS_CPLANE_H
#define RPS_CPLANE_H

#include <stdbool.h>
#include <stdint.h>

#include "server/dataplane.h"
#include "server/server.h"

struct rps__cplane;

/* Parse the cluster list and find this server in it (no I/O yet). */
int rps__cp_create(const struct rps__server_config *cfg, struct rps__cplane **out);
/* Open the Raft log, build the map and tell the data plane what it serves;
 * *hooks: what to register with the server loop (ctx: cp). */
int rps__cp_start(struct rps__cplane *cp, const struct rps__dp_ops *dp, struct rps__server *srv,
		  struct rps__dp_hooks *hooks);
void rps__cp_destroy(struct rps__cplane *cp);

/* Install what the checkpoint in dir holds for the partitions served here.
 * *installed / *seen: shards installed here / shards in all the files. */
int rps__ck_restore(struct rps__cplane *cp, const char *dir, uint32_t *installed, uint64_t *seen,
		    uint64_t *bytes);
/* A checkpoint was restored here: lost partitions owned here are back. */
void rps__cp_restored(struct rps__cplane *cp);

/* Test hook (rdmapsd with RPS_FAULT=isolate-signals): SIGUSR1 cuts this
 * server off from its peers (connections dropped, none accepted or made,
 * Raft messages lost), SIGUSR2 ends that.  Workers are not affected. */
extern volatile int rps__cp_isolated;

/* Test hook: nonzero, the clock of leases and failure detection
 * (CLOCK_BOOTTIME otherwise) reads this many ns. */
extern uint64_t rps__cp_fake_clock_ns;
/* Has the leader (this server) declared member id failed? */
bool rps__cp_member_failed(const struct rps__cplane *cp, uint64_t id);
/* Raft's role changed (leader: we lead; leader_id: who does, 0 if
 * unknown): the failure detector starts over (repl_failover.c).  Called
 * by the Raft node's callback; a test calls it to play an election. */
void rps__cp_failover_role(struct rps__cplane *cp, bool leader, uint64_t leader_id);
/* The leader: did member id renew its lease with us within lease_ms (or
 * is it us)?  What balancing moves partitions between. */
bool rps__cp_member_fresh(const struct rps__cplane *cp, uint64_t id);
/* The leader, --rebalance auto: will its balancing move a primary yet?
 * (STATUS: RPS__STATUS_BALANCING; repl_place.c) */
bool rps__cp_balance_pending(const struct rps__cplane *cp);

#endif
