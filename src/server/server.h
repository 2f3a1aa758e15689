/*
 * server.h - the data plane that rdmapsd runs: shards in registered memory,
 * staging slots, aggregation, optimizers, consistency modes, lock leases.
 * One thread drives it (rps__server_run).  Alone it serves nothing: the
 * control plane (control/daemon.h composes the two) tells it which
 * partitions are its own, through dataplane.h.
 */
#ifndef RPS_SERVER_H
#define RPS_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/proto.h"
#include "transport/uri.h"

struct rps__server;
struct rps__keyring;

/* Bounds of the configuration (rdmapsd refuses values beyond them). */
#define RPS__SERVER_MEM_MAX (1ull << 50)	/* --memory-limit, --park-limit: 1 PiB */
#define RPS__SERVER_CONNS_MAX 4096u		/* --max-connections */
#define RPS__SERVER_SPIN_US_MAX 1000000u	/* --spin-us: 1 s */
#define RPS__TENSOR_SHARDS_MAX (1u << 24)	/* shards of one tensor (~120 B of metadata each) */
#define RPS__SERVER_THREADS_MAX RPS__PROTO_THREADS_MAX	/* --threads */

struct rps__server_config {
	struct rps__uri listen;		/* where to accept workers */
	const char *cluster;		/* static cluster list (NULL: just this server) */
	int index;			/* this server's place in the list (-1: find by address) */
	uint32_t shard_bytes;		/* parameter bytes per shard (fp32), cluster-wide */
	uint32_t nslots;		/* staging slots per worker connection */
	uint32_t lease_ms;		/* a shard lock held longer than this is broken */
	uint32_t max_conns;		/* worker connections at once */
	uint32_t idle_timeout_ms;	/* drop a worker connection with no completion this long (0: never) */
	size_t mem_limit;		/* bytes for shards + staging; 0 = unlimited */
	size_t park_limit;		/* bytes of out-of-turn sync pushes kept aside */
	int spin_us;			/* busy-poll this long before sleeping */
	uint32_t nthreads;		/* --threads: serving threads (0, 1: one), each on port + its index */
	int numa_node;			/* --numa-node: shards and slots on this NUMA node (-1: near the HCA) */
	const char *cpus;		/* --cpus: pin the serving thread here (NULL: near the HCA) */
	int no_pin;			/* --no-pin: bind and pin nothing */
	const char *topology;		/* --topology: hwloc XML instead of this machine (debugging) */
	/* control plane */
	const char *data_dir;		/* --data-dir: Raft log and snapshots (NULL: a temporary dir) */
	int fsync_none;			/* --fsync none: do not sync the log (tests, benchmarks) */
	uint32_t npart;			/* --partitions at bootstrap (0: 64) */
	uint64_t join_id;		/* --join ID: a new member started empty (psctl add-server) */
	uint32_t tick_ms;		/* Raft tick (default 50 ms) */
	uint32_t election_ticks;	/* ticks before a follower campaigns (default 10) */
	uint32_t move_timeout_ms;	/* a move not installed by then is aborted (default 30000) */
	uint32_t drain_ms;		/* keep a moved partition's memory this long (default 2000) */
	uint32_t failover_ms;		/* a member silent this long is failed (0: 1000, or
					 * 10 x tick_ms if more) */
	uint32_t replicas;		/* --replicas R: the leader makes it the map's target
					 * (0: not given, the map's stands) */
	const char *zone;		/* --zone: this member's zone label (NULL: not given) */
	int rebalance_off;		/* --rebalance off: the leader leaves primaries where they
					 * are (control/repl_place.c; psctl rebalance) */
	int witness;			/* --witness: a Raft voter that holds no partitions and
					 * takes no worker (control/repl_place.c) */
	/* security (doc/security.md) */
	struct rps__keyring *keys;	/* --key: the cluster key, every connection authenticates
					 * (NULL: none; then only loopback peers are taken
					 * unless insecure) */
	int insecure;			/* --insecure: no key, and peers beyond loopback */
	const char *ckpt_dir;		/* --checkpoint-dir: the only place psctl checkpoint and
					 * restore write and read (NULL: they are refused) */
};

void rps__server_config_init(struct rps__server_config *cfg);
/* The checks rps__server_create makes of a configuration first. */
int rps__server_config_check(const struct rps__server_config *cfg);
/* The least --memory-limit that admits one worker connection and one shard. */
size_t rps__server_min_memory(const struct rps__server_config *cfg);
int rps__server_create(const struct rps__server_config *cfg, struct rps__server **out);
/* Serve until rps__server_stop().  Returns 0 after a clean stop. */
int rps__server_run(struct rps__server *srv);
/* Async-signal-safe: ask rps__server_run to return. */
void rps__server_stop(struct rps__server *srv);
void rps__server_destroy(struct rps__server *srv);
uint16_t rps__server_port(const struct rps__server *srv);
const char *rps__server_fabric_name(const struct rps__server *srv);
/* 1: each connection's remote access goes through memory windows of its
 * own (rps__fabric_windows); 0: through the regions' keys, process-wide. */
int rps__server_windows(const struct rps__server *srv);
/*
 * rdmapsd --threads N (threads.c): N instances, the k-th listening on the
 * first's port + k and serving the partitions p with p % N == k, each run
 * by a thread of its own; the first is run by the caller with
 * rps__server_run and takes the control plane (rps__dataplane_ops_group).
 * N <= 1: rps__server_create.  Start the others' threads once the first
 * is set up; stop (async-signal-safe) and join them all; destroy all.
 */
int rps__server_group_create(const struct rps__server_config *cfg, struct rps__server **first);
int rps__server_group_start(struct rps__server *first);
void rps__server_group_stop(struct rps__server *first);
/* 0, or the first error an instance stopped with */
int rps__server_group_join(struct rps__server *first);
void rps__server_group_destroy(struct rps__server *first);

/* rdmapsd --show-topology: open the fabric (no listening), decide the
 * placement as rps__server_create would, print it with the machine. */
int rps__server_show_topology(const struct rps__server_config *cfg, FILE *f);

#endif
