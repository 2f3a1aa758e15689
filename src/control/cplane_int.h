/*
 * cplane_int.h - what the files of the control plane share.  The control
 * plane reaches the data plane only through the ops table it was given
 * (server/dataplane.h).
 *
 * The files of src/control/ (tests/filemaps.sh checks that this names each):
 *   cplane.c          start, stop, timers, the hooks the server loop calls
 *   cp_peers.c        connections to the other servers
 *   cp_map.c          applying the shard map, proposals
 *   cp_moves.c        moves of partitions
 *   repl_failover.c     failure detection, primary leases, FAILOVER proposals
 *   repl_place.c     replica sets: placing backups, seeding them,
 *                     --replicas and --zone, the witness
 *   cp_admin.c        psctl's requests, the leader's membership duties
 *   ckpt_srv.c        checkpoints and restores on the server's side
 *   ckpt.c            checkpoint files (ckpt.h)
 *   daemon.c          a server node: its data plane(s) and the control
 *                     plane over them (daemon.h)
 *   raft_node.c       a Raft node (rps__rnode): the core below driven over
 *                     its log on disk (wal.c) and the network, the
 *                     application behind callbacks (raft_node.h)
 *   raft.c raft_log.c raft_tracker.c raft_quorum.c raft_confchange.c
 *   raft_msg.c raft_rawnode.c
 *                     the I/O-free Raft core (raft.h; raft_int.h says which
 *                     file holds what)
 *   wal.c wal_open.c wal_replay.c wal_snap.c
 *                     the Raft log and snapshots on disk (wal.h, wal_int.h)
 * doc/design.md has the design ("The control plane", "Replicated
 * partitions and failover").
 */
#ifndef RPS_CPLANE_INT_H
#define RPS_CPLANE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "control/cplane.h"
#include "control/raft.h"
#include "control/raft_node.h"
#include "proto/proto.h"
#include "proto/smap.h"
#include "server/dataplane.h"
#include "server/server.h"
#include "transport/uri.h"

#define PEER_RETRY_NS 1000000000ull
/* A peer connection no longer needed (cp_peers.c peers_needed) is closed
 * by its dialer once it has not been needed this long: a pair that a move
 * or a seed brought together often meets again soon. */
#define PEER_UNNEEDED_NS (30ull * 1000000000ull)
#define DUTY_NS 20000000ull

/* What this server does with a partition. */
enum part_state {
	PART_NONE = 0,	/* not ours */
	PART_ACTIVE,	/* ours, serving */
	PART_LEAVING,	/* MOVE_BEGIN from us: fencing its shards */
	PART_SHIPPED,	/* fenced and offered to the destination (or, switching to a
			 * backup, fenced: the COMMIT proposed) */
	PART_INCOMING,	/* installed here, waiting for MOVE_COMMIT */
	PART_DRAINING,	/* moved away: regions freed at free_at */
	/* seeding a backup (repl_place.c) */
	PART_SEED_FENCING,	/* primary: REPLICA_BEGIN applied, fencing for the joiner `to` */
	PART_SEED_SHIPPED,	/* primary: fenced, image offered to `to` */
	PART_SEEDING,	/* the joiner: waiting for the image, then for REPLICA_COMMIT */
	PART_BACKUP,	/* a backup: regions kept, the stream applied, not served */
};

struct part_local {
	enum part_state st;
	uint64_t epoch;		/* ACTIVE: the epoch served; moves: the one BEGIN named */
	uint64_t to;		/* LEAVING/SHIPPED: the destination */
	uint64_t next_try;	/* ns: next offer / proposal */
	uint64_t give_up;	/* ns: SHIPPED without a commit by then: propose ABORT */
	uint64_t free_at;	/* DRAINING */
	void *blob;		/* SHIPPED: the partition's state, registered for READ */
	size_t blob_len;
	struct rps__mr *blob_mr;
	uint32_t blob_crc;
	uint64_t seq;		/* SEED_SHIPPED, SHIPPED: the stream's seq at the cut */
	bool offered;		/* MIGRATE sent, reply pending */
	bool installed;		/* destination answered 0 */
	bool switching;		/* LEAVING/SHIPPED: `to` is a backup (a planned switch) */
	bool gone;		/* ours, but its contents went with a restart: refused
				 * (-ENODATA) and proposed as lost until the map says so */
	bool cleared;		/* restored or accepted empty since the restart */
};

struct peer {
	uint64_t id;
	struct srv_conn *c;		/* NULL: not connected */
	uint64_t next_connect;	/* ns */
	bool dialing;		/* a dial is under way (peer_dialed ends it) */
	uint32_t inflight;	/* sends not yet completed */
	uint64_t unneeded_since;	/* connected but not needed since (ns; 0: needed) */
};

/* A psctl request waiting for the log. */
struct admin_wait {
	struct srv_conn *conn;
	uint64_t req_id;
	uint32_t op;
	uint32_t part;
	uint64_t id;
	uint64_t epoch;		/* MOVE: the epoch BEGIN named */
	uint64_t index;		/* proposals: where it must apply */
	uint64_t term;
	uint64_t deadline;	/* ns */
	int stage;
};

/* A partition image being READ from its old owner over a peer connection. */
struct cp_read {
	struct srv_conn *c;
	struct rps__migrate mig;
	uint64_t req_id;
	bool seed;		/* a backup's image (SEED), not a move's */
	uint64_t seq;		/* seed: the stream goes on after it */
};

struct ckpt_state;

/* Primary leases and failure detection (repl_failover.c). */
#define FO_SENT_MAX 8u		/* LEASE requests a member remembers */
#define FO_WAITS_MAX 64u	/* LEASE requests a leader waits to confirm */

struct fo_contact {		/* leader: what it knows of one member */
	uint64_t id;
	uint64_t since;		/* its last LEASE, or when we began to lead */
	uint64_t deadline;	/* failover clock: failed once past this without a LEASE */
	uint64_t failed_at;	/* 0: not failed */
	uint64_t next_try;	/* failed: next batch of proposals */
	bool renewed;		/* since is its LEASE's, not our start of leading */
};

struct fo_wait {		/* leader: a LEASE waiting for its ReadIndex round */
	uint64_t read_ctx;
	uint64_t id;		/* the member (us: granted locally) */
	uint64_t seq;
	uint64_t t_recv;
};

struct cp_failover {
	uint64_t failover_ns, lease_ns;
	/* member */
	uint64_t seq;
	uint64_t next_send;
	struct { uint64_t seq, t_send; } sent[FO_SENT_MAX];
	uint64_t lease_until;	/* what the data plane was told */
	uint64_t grant_until;	/* the latest grant ... */
	uint64_t grant_index;	/* ... in force once we applied the log this far */
	/* leader */
	bool leading;
	uint64_t last_leader;	/* the last other member seen leading (0: none) */
	uint64_t won_at;
	uint64_t last_duty;	/* real boottime when the duties last ran (loop stalls) */
	struct fo_contact contact[RPS__SMAP_MAX_MEMBERS];
	uint32_t ncontact;
	struct fo_wait waits[FO_WAITS_MAX];
	uint32_t nwaits;
	uint64_t next_ctx;
	/* no majority: what workers are told (rps__cp_quorum_note) */
	uint64_t noq_since;	/* since when (0: a majority is reachable) */
	uint64_t noq_member;	/* the member last said to be lost (0: none said) */
	/* members connected to us since we started (only they can be failed) */
	uint64_t heard[RPS__SMAP_MAX_MEMBERS];
	uint32_t nheard;
};

struct rps__cplane {
	const struct rps__dp_ops *dp;	/* the data plane, and ... */
	struct rps__server *srv;	/* ... the handle its ops take */
	struct rps__server_config cfg;
	struct rps__uri *cluster;
	int ncluster;
	int index;
	uint64_t my_id;
	struct rps__smap map;		/* applied state of the shard map */
	struct part_local parts[RPS__SMAP_MAX_PART];
	char *mapbuf;			/* the encoded map, READ by workers */
	bool mapbuf_registered;
	struct rps__rnode *rnode;
	char *data_dir;			/* ours to remove at exit when temporary */
	bool data_dir_temp;
	struct peer peers[RPS__SMAP_MAX_MEMBERS];
	uint32_t npeers;
	struct cp_read *reads;		/* READs of partition images in flight */
	uint32_t nreads, reads_cap;
	struct admin_wait *admin;
	uint32_t nadmin, admin_cap;
	uint64_t next_tick;		/* ns */
	uint64_t next_duty;		/* ns */
	uint64_t read_ctx;
	uint64_t removed_at;		/* we left the map: stop at this time (ns) */
	bool restarted;			/* started from a --data-dir that held state */
	uint64_t replay_to;		/* the last index our log held at start: entries up
					 * to it are a previous life's (replayed, applied at
					 * open or once the leader says they committed) */
	uint64_t incarnation;		/* this start's nonce (never 0): the CLEAR_LOST we
					 * propose carry it, so a later start that replays
					 * them knows they restored another life's memory */
	uint64_t seed_next[RPS__SMAP_MAX_MEMBERS];	/* --join: next dial of each --cluster address */
	bool seed_dialing[RPS__SMAP_MAX_MEMBERS];	/* ... under way */
	/* --join, until our own map arrives: the members a seed's map names
	 * (its STATUS_REP), dialed as our map will have us dial them (the
	 * lower ids: the leader among them, when no seed is the leader) */
	struct rps__smap_member learned[RPS__SMAP_MAX_MEMBERS];
	uint32_t nlearned;
	uint64_t learn_next;		/* ns: next STATUS to a seed while nothing is learned */
	struct ckpt_state *ckpt;	/* ckpt_srv.c */
	struct cp_failover fo;		/* repl_failover.c */
	/* repl_place.c */
	uint64_t replica_next[RPS__SMAP_MAX_PART];	/* leader: next proposal for the partition (ns) */
	uint64_t diverged_next[RPS__SMAP_MAX_PART];	/* primary: next DROP of a diverged replica (ns) */
	uint64_t seed_src_next[RPS__SMAP_MAX_MEMBERS];	/* leader: member slot i's back-off after an abort (ns) */
	uint64_t seed_pending[RPS__SMAP_MAX_PART];	/* leader: a BEGIN proposed, not applied yet: it
							 * counts toward its primary's bound until then (ns) */
	bool replica_kick;		/* a seeding ended or an image arrived: run the
					 * seeding and placement duties this turn */
	bool balance_due;		/* a failover, a member back, a witness made or a
					 * member removed by force: the leader spreads the
					 * primaries again (--rebalance auto) */
	uint64_t balance_next;		/* leader: no balancing move before (ns) */
	uint64_t config_next;		/* next SET_REPLICAS / SET_ZONE proposal (ns) */
	bool replicas_settled;		/* --replicas is in the map (once per start) */
	bool zone_settled;		/* --zone is in the map */
	bool witness_said;		/* --witness refused by the map: said once */
	uint32_t voters_warned;		/* the voter count last warned of (2: cannot fail over) */
	uint64_t removing;		/* leader: psctl remove-server of this member waits for
					 * its backup roles to move elsewhere (0: none) */
	uint64_t removing_next;		/* its REMOVE_MEMBER proposed again no sooner (ns) */
};

static inline uint64_t ms_ns(uint64_t ms)
{
	return ms * 1000000ull;
}

/* Is the partition served here under this epoch right now? */
static inline bool rps__cp_serving(const struct rps__cplane *cp, uint32_t part)
{
	return cp->parts[part].st == PART_ACTIVE;
}

/* Are the partition's contents lost (restarted owner, or the map says so)? */
static inline bool rps__cp_lost(const struct rps__cplane *cp, uint32_t part)
{
	return cp->map.parts[part].lost || cp->parts[part].gone;
}

/* Tell the data plane what it serves partition p by (after any change of
 * the map or of cp->parts[p]). */
void rps__cp_part_sync(struct rps__cplane *cp, uint32_t p);

/* cp_peers.c */
struct peer *rps__cp_peer_get(struct rps__cplane *cp, uint64_t id, bool add);
void rps__cp_peer_send(struct rps__cplane *cp, uint64_t to, unsigned type, uint64_t req_id, int32_t status,
		       const void *body, size_t len);
int rps__cp_accept_peer(void *ctx, uint64_t from_id, uint64_t to_id, const char *addr, const char **why);
void rps__cp_peer_attached(void *ctx, struct srv_conn *c);
void rps__cp_peer_dialed(void *ctx, const char *uri, uint64_t to_id, struct srv_conn *c);
void rps__cp_on_send_done(void *ctx, struct srv_conn *c);
void rps__cp_peers_gone(struct rps__cplane *cp, struct srv_conn *c);
void rps__cp_peers_connect(struct rps__cplane *cp, uint64_t now);
void rps__cp_on_seed_status(struct rps__cplane *cp, struct srv_conn *c, int32_t status, const void *body, size_t len);

/* cp_moves.c */
void rps__cp_blob_free(struct rps__cplane *cp, struct part_local *pl);
int rps__cp_blob_make(struct rps__cplane *cp, uint32_t part);
int rps__cp_blob_offer(const struct rps__cplane *cp, uint32_t part, struct srv_conn *c, struct rps__migrate *m);
void rps__cp_read_start(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__migrate *m,
			bool seed, uint64_t seq);
void rps__cp_on_read_done(void *ctx, struct srv_conn *c, bool ok, const void *buf);
void rps__cp_on_migrate(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__migrate *m,
			uint64_t seq);
void rps__cp_on_migrate_rep(struct rps__cplane *cp, struct srv_conn *c, uint32_t part, int32_t status);
void rps__cp_reads_gone(struct rps__cplane *cp, struct srv_conn *c);
void rps__cp_move_duties(struct rps__cplane *cp, uint64_t now);

/* repl_place.c: placement (leader), seeding backups, --replicas and --zone */
bool rps__cp_replica_reconcile(struct rps__cplane *cp, uint32_t p, uint64_t now);
void rps__cp_replica_duties(struct rps__cplane *cp, uint64_t now);
/* The leader, --rebalance auto: one balancing move when balance_due and
 * nothing else moves or seeds (repl_place.c). */
void rps__cp_balance_duty(struct rps__cplane *cp, uint64_t now);
void rps__cp_seed_duties(struct rps__cplane *cp, uint64_t now);
void rps__cp_replica_applied(struct rps__cplane *cp, const struct rps__smap_cmd *cmd, int ret, uint64_t now);
void rps__cp_config_duties(struct rps__cplane *cp, uint64_t now);
void rps__cp_on_seed(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__seed *s);
void rps__cp_seed_read_done(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__migrate *m,
			    uint64_t seq, const void *buf);

/* cp_map.c */
void rps__cp_map_publish(struct rps__cplane *cp);
void rps__cp_reconcile(struct rps__cplane *cp);
/* A new cluster's shard map, from --cluster, into *m. */
int rps__cp_bootstrap_map(struct rps__cplane *cp, struct rps__smap *m);
void rps__cp_propose_cmd(struct rps__cplane *cp, const struct rps__smap_cmd *cmd);
int rps__cp_propose_here(struct rps__cplane *cp, const struct rps__smap_cmd *cmd, uint64_t *index,
			 uint64_t *term);
void rps__cp_on_propose(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const void *body, size_t len);
extern const struct rps__rnode_callbacks rps__cp_rnode_callbacks;	/* (ctx: the cplane) */

/* cp_admin.c */
void rps__cp_on_admin(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__admin *a);
void rps__cp_on_status(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id);
void rps__cp_on_rank(struct rps__cplane *cp, struct srv_conn *c, uint64_t req_id, const struct rps__rank_req *req);
void rps__cp_admin_map_changed(struct rps__cplane *cp);
void rps__cp_admin_conn_gone(struct rps__cplane *cp, struct srv_conn *c);
void rps__cp_admin_timeouts(struct rps__cplane *cp, uint64_t now);
void rps__cp_leader_membership(struct rps__cplane *cp);

/* repl_failover.c: primary leases, failure detection, FAILOVER proposals */
uint64_t rps__cp_failover_now(void);
void rps__cp_failover_init(struct rps__cplane *cp);
void rps__cp_lease_send(struct rps__cplane *cp, uint64_t now);
void rps__cp_failover_duties(struct rps__cplane *cp, uint64_t now);
/* Every tick: say in the map buffer's note (proto.h) whether this server
 * has lost the Raft majority, and which voter it lost. */
void rps__cp_quorum_note(struct rps__cplane *cp, uint64_t now);
bool rps__cp_on_lease(struct rps__cplane *cp, struct srv_conn *c, const struct rps__lease *l);
void rps__cp_on_lease_rep(struct rps__cplane *cp, int32_t status, const struct rps__lease_rep *r);
void rps__cp_failover_read_ready(struct rps__cplane *cp, uint64_t read_ctx, uint64_t index);
void rps__cp_failover_heard(struct rps__cplane *cp, uint64_t id);
/* leader: id is this server, or was heard from and is not failed */
bool rps__cp_member_live(const struct rps__cplane *cp, uint64_t id);

/* ckpt_srv.c: checkpoints and restores.  rps__ck_init opens --checkpoint-dir
 * (rps__ck_fini closes it). */
int rps__ck_init(struct rps__cplane *cp);
void rps__ck_on_message(struct rps__cplane *cp, struct srv_conn *c, const struct rps__msg_hdr *h,
			const void *body, uint32_t body_len);
void rps__ck_timers(struct rps__cplane *cp, uint64_t now);
void rps__ck_conn_gone(struct rps__cplane *cp, struct srv_conn *c);
void rps__ck_fini(struct rps__cplane *cp);

#endif
