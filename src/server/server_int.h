/*
 * server_int.h - what the files of the data plane share.  Private to
 * src/server: the layer above sees struct rps__server only through
 * dataplane.h.
 *
 * The files of src/server/ (tests/filemaps.sh checks that this names each):
 *   server.c       create, destroy, memory accounting and the loop
 *   conn.c         connections and replies; memory windows bound to one
 *                  connection
 *   auth.c         the server's side of the handshake (proto/auth.h)
 *   dial.c         outgoing connections (peers, replication) while they are
 *                  under way
 *   requests.c     workers' control messages (HELLO, CREATE, WAIT, BARRIER)
 *                  and key scopes
 *   push.c         pushes, publishing and lock words
 *   apply.c        applying an update, the same on primary and backups
 *   tensor.c       tensors and their regions
 *   partition.c    the partition API: fences, images, promotion, the read
 *                  fence
 *   hold.c         checkpoints: the hold, the copies, installing a restore
 *   dataplane.c    the ops the control plane calls (dataplane.h)
 *   repl_stream.c  the replication stream, the primary's side, and what
 *                  both sides share: pairing, messages, a broken stream
 *                  (rps__srv_repl_conn_gone, rps__srv_repl_diverged)
 *   repl_backup.c  the replication stream, the backup's side: accepting a
 *                  primary, applying its entries (both: repl.h)
 *   threads.c      serving threads (rdmapsd --threads N): N data planes, one
 *                  ops table over them (generated from dataplane.h's list)
 *   mailbox.c      the calls one serving thread posts to another (mailbox.h)
 * doc/design.md ("Replicated partitions and failover", "Serving threads")
 * has the design of the last three.
 */
#ifndef RPS_SERVER_INT_H
#define RPS_SERVER_INT_H

#include <assert.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/optim.h"
#include "proto/auth.h"
#include "proto/proto.h"
#include "server/dataplane.h"
#include "server/mailbox.h"
#include "server/repl.h"
#include "server/server.h"
#include "proto/shard.h"
#include "proto/smap.h"
#include "common/topo.h"
#include "transport/transport.h"

#define CTRL_CREDITS 32u	/* control requests a worker may have outstanding */
#define PEER_RECV 32u		/* receive buffers of a peer / admin connection */
#define PEER_SEND 32u
#define ADMIN_CONNS_MAX 16u	/* psctl connections at once (rdmapsd(8)) */
/* Accepted connections that have not authenticated yet (with a key): a
 * budget of their own, per port, and per source address within it; past
 * it the oldest waiting one (of that address) is closed if it has had
 * PREAUTH_FAIR_MS to prove itself, and the newcomer is refused at
 * connect (busy: it dials again) if not.  They count against
 * --max-connections and the admin slots only once authenticated, and
 * hold one small buffer each until then (rdmapsd(8), doc/security.md
 * "Connections that have not authenticated"). */
#define PREAUTH_MAX 256u
#define PREAUTH_PER_HOST 64u
#define PREAUTH_FAIR_MS 1000u
#define PREAUTH_MSG_MAX RPS__MSG_MAX	/* AUTH, AUTH_REP and AUTH_DONE fit */
/* The shared CQ's entries beyond twice what its connections' queues are
 * charged (rps__srv_cq_charge): what it is made with. */
#define CQ_SPARE 1024u
/* A connection refused for want of room on that CQ (the device's max_cqe):
 * more serving threads are more CQs. */
#define RPS__SRV_WHY_CQ_FULL "completion queue at max_cqe: raise rdmapsd --threads"
#define ANNOUNCED_SQ_MAX 1024u	/* a connector's send queue depth: ours use < 256 */
#define WRID_RECV 1u
#define WRID_SEND 2u
#define WRID_READ 3u		/* migration: the destination READs the partition */
#define WRID_REPL 4u		/* a replication entry (unsignaled: errors only) */
#define WRID_STEP_DONE 5u	/* a STEP_DONE send (counted in sd.inflight) */
#define REPL_SLOTS 8u		/* slots of a backup per primary server */
/* Send-queue slots every connection has beyond its sends, for the memory
 * windows it is given (a bind is a WR on verbs, retired by the next
 * signaled completion): CREATE pages stop short rather than use them up. */
#define RPS__BIND_RESERVE 32u
#define REPL_MAX 3u		/* replicas a partition waits for: 2 backups + a joiner */

struct srv_conn;
struct srv_tensor;

/* A push that arrived but may not be consumed yet. */
struct held {
	struct srv_conn *conn;
	uint32_t slot;
};

/*
 * A sync push that arrived before its turn (an earlier rank's push of its
 * step, or the step itself, is not in yet), copied out of its slot so the
 * slot can be acknowledged and reused.  Without this, a worker whose slots
 * all hold out-of-turn pushes could wait on another worker that waits on it
 * (two workers pushing tensors in different orders).  Bounded by
 * park_limit (and the memory limit); past that, pushes wait in their slots.
 * Parked pushes were acknowledged, so a move carries them along, and so
 * does a seeding: a backup keeps them (not taken there) until the
 * primary's step covers them or the backup is promoted.
 */
struct parked {
	struct srv_tensor *t;
	uint32_t local;		/* global shard index */
	uint64_t clock;
	int rank;
	void *data;		/* the gradient, in the tensor's dtype (NULL: in_acc) */
	size_t nbytes;
	size_t cap;		/* bytes of data (a pool buffer may be larger) */
	/* taken early (push.c, take_early): the gradient is the shard's
	 * accumulator itself, which holds it alone until next_rank's push
	 * comes; the entry stands for the push (it counts for its step) */
	bool in_acc;
};

struct waiter {
	struct srv_conn *conn;
	uint64_t req_id;
	uint32_t tensor_id;
	uint32_t local;		/* global shard index */
	uint64_t min_version;
	uint64_t min_clock;
	uint64_t since;		/* when it came (rps__now_ns) */
	bool warned;		/* its long wait was logged (rps__srv_waiters_check) */
};

/* The last pushes applied per worker (client id), for idempotent retries.
 * A set, not a high-water mark: a push refused by a moving shard is resent
 * after later pushes of the same worker may have been applied. */
#define DEDUP_IDS 16u
struct dedup {
	uint64_t client;
	uint64_t ids[DEDUP_IDS];
	uint32_t next;
	uint32_t reserved;
};

struct shard {
	struct rps__shard_hdr *hdr;	/* NULL: the shard is not here */
	float *params;
	uint32_t index;		/* global shard index */
	uint32_t part;		/* its partition */
	uint32_t elems;
	bool ready;		/* initial values in place */
	struct srv_conn *init_conn;	/* who must send them */
	float *state;		/* optimizer state */
	float *acc;		/* sync: this step's sum so far */
	float *scratch;		/* gradients converted to fp32 */
	uint64_t step;		/* updates applied == published version */
	int next_rank;		/* sync: whose contribution comes next */
	uint32_t nsummed;	/* sync: contributions in acc (removed ranks are skipped) */
	int early_rank;		/* sync: -1, or the rank after next_rank whose push acc holds
				 * alone (nsummed 0), taken before next_rank's (push.c) */
	uint64_t *clocks;	/* bounded: pushes applied per rank */
	uint64_t lease_word;	/* lock word seen by the lease scan ... */
	uint64_t lease_since;	/* ... since this time (ns) */
	struct dedup *dd;	/* async/bounded: last push id per worker */
	uint32_t ndd;
	uint32_t repl_pending;	/* primary: an update applied, not yet on every replica */
	bool advance_owed;	/* sync, replicated: a step complete (a rank removal) that found no
				 * replication credit; drain_held applies it when they come back */
	/* sync, replicated: the last REPL_PARTIAL shipped (repl_stream.c,
	 * orphans): of step partial_step with partial_rank next; its entry
	 * seq partial_seq (0: none shipped) */
	uint64_t partial_step, partial_seq;
	int partial_rank;
};

/* A tensor's shards of one partition on this server: one registration, so
 * giving the partition away revokes remote access to exactly them. */
struct region {
	void *mem;		/* NULL: none here */
	size_t len;
	struct rps__mr *mr;
	size_t mem_charged;
	uint32_t nsh;
};

struct srv_tensor {
	char name[RPS__NAME_MAX];
	uint32_t id;
	struct rps__tensor_spec spec;
	struct rps__layout layout;	/* "servers" = partitions */
	struct rps__optim optim;
	size_t stride;
	struct shard *shards;		/* every shard of the tensor, hdr NULL if not here */
	struct region *regions;		/* per partition */
	uint64_t hold_limit;		/* sync, checkpoint: no step is applied past this */
	/* sync: per rank, RANK_LIVE once a connection of that rank opened the
	 * tensor here, RANK_GONE once its last connection closed (NULL: none
	 * seen yet), so waiters learn which rank a step waits for in vain;
	 * RANK_REMOVED (psctl remove-rank, sync and bounded) for good: its
	 * turn is skipped from the first step it has not contributed to */
	uint8_t *ranks;
	size_t meta_charged;		/* shard table & co, counted against --memory-limit */
};

enum { RANK_UNSEEN, RANK_LIVE, RANK_GONE, RANK_REMOVED };

static inline bool rps__srv_rank_removed(const struct srv_tensor *t, int rank)
{
	return t->ranks && rank >= 0 && rank < t->spec.num_workers && t->ranks[rank] == RANK_REMOVED;
}

struct conn_window {
	uint64_t serial;	/* rps__mr_serial of the region */
	int access;
	uint32_t rkey;
};

/* A connection's staging and control buffers (conn.c). */
struct srv_conn_bufs {
	size_t msg_max;		/* bytes per control buffer */
	size_t charged;		/* peer/admin message buffers, against --memory-limit */
	/* staging slots (workers) */
	char *slots;
	struct rps__mr *slots_mr;
	uint8_t *slot_state;	/* 0 free, 1 held */
	/* control buffers */
	char *rbufs;
	struct rps__mr *rbufs_mr;
	uint32_t nrecv;
	char *sbufs;
	struct rps__mr *sbufs_mr;
	uint32_t nsend;
	uint32_t *sfree;
	uint32_t nsfree;
	size_t slots_len;
	bool lean;		/* accepted, not authed: one small buffer each way */
	uint32_t gen;		/* bumped when the buffers are replaced (rps__srv_conn_grow) */
	bool recvs_posted;
};

/* A connection's authentication (auth.c): on a server with a key a
 * connection sends nothing but AUTH (AUTH_REP, one we dialed) until it is
 * authed. */
struct srv_conn_auth {
	bool authed;
	uint64_t accepted_ns;	/* when it was accepted (the oldest waiting goes first) */
	bool refused;		/* AUTH failed: closed at deadline_ns, after the refusal left */
	bool proven;		/* a server's AUTH held: AUTH_DONE awaited */
	uint8_t key_role;	/* enum rps__key_role it proved (NONE: no key here) */
	char scope[64];		/* worker/reader: its tensor-name prefix */
	uint64_t deadline_ns;
	bool waiting;		/* in the server's preauth queue (conn.c, preauth_room) */
	char host[48];		/* its address without the port (rps__auth_host), while waiting */
	struct rps__conn_priv req, rep;	/* the connect data, both ways */
	struct srv_auth_dial *dial;	/* we dialed: what checks the answer */
};

/* The memory windows given to a connection (conn.c, rps__srv_conn_window):
 * each region's key is valid on this connection alone. */
struct srv_conn_wins {
	struct conn_window *w;
	uint32_t n, cap;
};

/* A peer's migration READ target (dataplane.c). */
struct srv_conn_read {
	void *buf;
	size_t len;
	struct rps__mr *mr;
};

/* A connection: the core every role has, and each feature's part (embedded:
 * no pointer to chase on the push path). */
struct srv_conn {
	struct rps__server *srv;
	struct rps__ep *ep;
	enum conn_role_kind role;
	uint64_t peer_id;	/* CONN_PEER: the other server */
	uint16_t peer_threads;	/* CONN_PEER accepted: the --threads it said (0: not said) */
	bool hello_done;
	bool dead;
	int rank;
	int num_workers;
	uint64_t client_id;
	uint32_t owner;
	uint64_t last_active_ns;	/* last completion (--idle-timeout-ms) */
	/* entries of the shared CQ this connection's queues hold (conn.c,
	 * rps__srv_cq_charge): a lean one's few until it authenticates */
	uint32_t cq_charged, cq_full;
	struct srv_conn_bufs bufs;	/* conn.c */
	struct srv_conn_repl repl;	/* CONN_REPL (repl.h) */
	struct srv_conn_sd sd;		/* workers, sync with backups (repl.h) */
	struct srv_conn_auth auth;	/* auth.c */
	struct srv_conn_wins wins;	/* conn.c */
	struct srv_conn_read rd;	/* peers: migration (dataplane.c) */
};

/* dial.c: an outgoing connection under way */
enum srv_dial_kind { SRV_DIAL_PEER, SRV_DIAL_REPL, SRV_DIAL_REPL_REV };
struct srv_dial {
	struct rps__dial *d;
	struct srv_conn *c;		/* in no table until its owner attaches it */
	enum srv_dial_kind kind;
	uint64_t to_id;		/* 0: a --join seed, whoever answers */
	char uri[320];		/* (a --cluster address may be longer than a map's) */
	uint64_t deadline;	/* ns: the loop wakes for it */
	struct rps__conn_priv priv;	/* what the connect request carried */
	struct rps__conn_priv rp;	/* the accept's, once connected */
	bool authing;		/* connected, AUTH sent, AUTH_REP awaited (d is NULL) */
};

/* Serving threads (threads.c, rdmapsd --threads): this instance is index
 * of nthreads, each a data plane of its own serving the partitions p with
 * p % nthreads == index; the first runs the control plane and holds the
 * others in group. */
struct srv_threads {
	uint32_t nthreads, index;
	struct rps__server **group;	/* the first: every instance (group[0] == itself) */
	struct rps__server *first;	/* ... and every instance's first */
	struct srv_mbox mbox;		/* mailbox.c: calls of the first's thread */
	pthread_t thread;		/* instances past the first: their serving thread */
	int ret;
};

/* The read fence (partition.c, rps__srv_read_fence). */
struct srv_read_fence {
	bool fenced[RPS__SMAP_MAX_PART];	/* headers show RPS__EPOCH_MOVED for want of the lease */
	bool held;		/* the lease as the last fence turn saw it */
	bool dirty;		/* partitions or headers changed since: look again */
};

/* Pushes waiting for their turn (push.c): held in their slots, or parked. */
struct srv_push {
	struct held *held;
	uint32_t nheld, held_cap;
	struct parked *parked;
	uint32_t nparked, parked_cap;
	size_t parked_bytes;
	/* parking buffers kept for reuse: a steady sync job parks and frees
	 * one shard-sized buffer per out-of-turn push, and a fresh one costs
	 * page faults on every touch */
	struct park_buf {
		void *buf;
		size_t cap;
	} *park_pool;
	uint32_t npark_pool, park_pool_cap;
	size_t park_pool_bytes;		/* counted in mem_used */
	uint64_t sync_early;		/* sync pushes summed at once out of turn (take_early) */
	uint64_t sync_parked;		/* ... and copied aside (park) */
	uint32_t advances_owed;		/* shards with advance_owed (a hint: drain_held recounts) */
};

/* Workers' requests that wait (requests.c): WAITs, and barrier arrivals
 * (one barrier per key scope, each released when as many of its scope
 * arrived as its first said). */
struct srv_requests {
	struct waiter *waiters;
	uint32_t nwaiters, waiters_cap;
	struct srv_arrival {
		struct srv_conn *conn;
		uint64_t req_id;
		int need;
	} *arrivals;
	uint32_t narrivals, arrivals_cap;
	/* ranks whose last connection closed, gone unless one of theirs
	 * comes back by `due` (rps__srv_rank_left) */
	struct srv_departure {
		int rank;
		char scope[64];		/* the departed connection's (auth.scope) */
		uint64_t due;
	} *departures;
	uint32_t ndepartures, departures_cap;
	/* client ids of processes whose rank another one took over (the
	 * last 256): refused should they dial again */
	uint64_t fenced[256];
	uint32_t nfenced;	/* ever added: the next goes at nfenced % 256 */
};

/* Regions given up while workers may still name them (tensor.c,
 * rps__srv_region_retire): registered until free_at. */
struct srv_retired {
	struct retired_region {
		void *mem;
		size_t len;
		struct rps__mr *mr;
		size_t mem_charged;
		uint64_t free_at;
	} *v;
	uint32_t n, cap;
};

/* Outgoing connections under way (dial.c). */
struct srv_dials {
	struct srv_dial *dials;
	uint32_t ndials, dials_cap;
};

/* A data plane: the core, and each feature's part. */
struct rps__server {
	struct {
		uint64_t last_ns;	/* auth.c: when a refusal was last logged */
		uint64_t quiet;		/* ... and how many since went unlogged */
	} auth_log;
	uint64_t threads_log_ns;	/* conn.c: when a --threads mismatch was last logged */
	/* conn.c: the accepted connections still proving their key, oldest
	 * first (preauth_room; a budget's worth at most, so an accept costs
	 * a walk of these, not of every connection) */
	struct {
		struct srv_conn *q[PREAUTH_MAX];
		uint32_t n;
	} preauth;
	struct rps__server_config cfg;
	struct srv_threads thr;		/* threads.c */
	uint64_t my_id;			/* member id (HELLO replies, peer handshakes) */
	uint64_t incarnation;		/* random, this instance's (HELLO replies) */
	uint64_t lease_until;		/* primary lease: rps__dp_boottime_ns() before this (set_lease) */
	struct srv_read_fence rfence;	/* partition.c */
	uint32_t shard_elems;
	size_t slot_size;
	struct rps__fabric *fab;
	struct rps__cq *cq;
	uint64_t cq_charged;		/* entries its connections' queues hold (conn.c) */
	struct rps__listener *listener;
	struct rps__topo *topo;		/* hwloc: where memory and the serving thread go */
	struct rps__placement place;
	int stop_fd;
	volatile sig_atomic_t stopping;	/* rps__server_stop: seen inside the busy-poll too */
	struct srv_conn **conns;
	uint32_t nconns, conns_cap;
	struct srv_tensor **tensors;
	uint32_t ntensors;
	struct srv_push push;		/* push.c */
	struct srv_requests req;	/* requests.c */
	struct srv_retired retired;	/* tensor.c */
	size_t mem_used;
	size_t mem_group;		/* the first instance: every instance's mem_used (threads) */
	uint8_t owner_used[RPS__LOCK_OWNER_MAX + 1];
	uint32_t next_owner;
	uint64_t next_lease_scan;

	/* what the control plane tells (dataplane.h) */
	struct rps__dp_part parts[RPS__SMAP_MAX_PART];
	uint32_t npart;			/* the map's partitions */
	uint64_t map_applied;		/* the map's applied index (CREATE replies) */
	char *mapbuf;			/* the encoded map, READ by workers */
	struct rps__mr *mapbuf_mr;
	struct rps__dp_hooks hooks;	/* the layer above */

	struct srv_dials dial;		/* dial.c */
	struct srv_repl repl;		/* repl_stream.c, repl_backup.c (repl.h) */
	/* messages sent to workers by type, PUSH_ACKs with flags apart (tests:
	 * the acknowledgement sequence) */
	uint64_t worker_msgs[RPS__MSG_TYPE_MAX], worker_acks_flagged;
};

/* mailbox.c: the mailbox of an instance: run what another thread asked
 * (every loop turn: one atomic load when nothing is asked) */
static inline void rps__srv_mbox_poll(struct rps__server *srv)
{
	if (__atomic_load_n(&srv->thr.mbox.pending, __ATOMIC_ACQUIRE))
		rps__srv_mbox_serve(srv);
}

/* server.c: memory accounting */
int rps__srv_mem_take(struct rps__server *srv, size_t bytes, const char *what);
/* The same without the limit (what an image brings must be installed whole). */
void rps__srv_mem_charge(struct rps__server *srv, size_t bytes);
void rps__srv_mem_give(struct rps__server *srv, size_t bytes);

/* conn.c */
void rps__srv_conn_reply(struct srv_conn *c, unsigned type, uint64_t req_id, int32_t status,
			 const void *body, size_t len);
/* The same with header flags (PUSH_ACK: RPS__ACK_TAKEN). */
void rps__srv_conn_reply_flags(struct srv_conn *c, unsigned type, uint8_t flags, uint64_t req_id, int32_t status,
			       const void *body, size_t len);
/* A STEP_DONE, counted in c->sd.inflight until its send completes. */
void rps__srv_conn_send_step_done(struct srv_conn *c, const struct rps__step_done *sd);
void rps__srv_conn_fail(struct srv_conn *c, const char *why);
const char *rps__srv_role_name(const struct srv_conn *c);
int rps__srv_conn_new(struct rps__server *srv, enum conn_role_kind role, struct srv_conn **out);
/* An accepted connection authenticated: its real buffers (staging slots,
 * big message buffers) replace the small one, and its receives are posted.
 * On failure (the memory limit, message set) it keeps the small ones. */
int rps__srv_conn_grow(struct rps__server *srv, struct srv_conn *c);
/* Charge c's queues to the shared CQ: `entries` in all now (its queues'
 * depths, or a lean connection's few), the CQ grown to twice what every
 * connection is charged (a closing one's completions drain while others
 * come).  -ENOSPC past the device's max_cqe, the error says so. */
int rps__srv_cq_charge(struct rps__server *srv, struct srv_conn *c, uint32_t entries);
/* Why an authenticated connection of c's role would be one too many
 * (--max-connections, the admin slots), or NULL. */
const char *rps__srv_conn_over_budget(const struct rps__server *srv, const struct srv_conn *c);
void rps__srv_conn_free(struct rps__server *srv, struct srv_conn *c);
/* The key by which c's peer reaches mr with `access`: a window bound to
 * c's endpoint alone (once per region and rights; the window dies with the
 * connection or the region).  -EAGAIN: c's send queue has no room to bind
 * one now beyond its replies (ask again after the next reply). */
int rps__srv_conn_window(struct srv_conn *c, struct rps__mr *mr, int access, uint32_t *rkey);
/* Close a connection and forget what waits on it (held pushes, waits,
 * barrier, its locks, its rank's sync steps). */
void rps__srv_conn_destroy(struct rps__server *srv, struct srv_conn *c);
/* Post the receives of an outgoing connection and add it to the table. */
int rps__srv_conn_attach(struct rps__server *srv, struct srv_conn *c);
int rps__srv_post_recv(struct srv_conn *c, uint32_t i);
void rps__srv_accept_pending(struct rps__server *srv);
/* auth.c: the handshake on the server's connections */
#define RPS__AUTH_TIMEOUT_MS 10000	/* a connection we dialed not authed by then is dropped */
#define RPS__PREAUTH_TIMEOUT_MS 3000	/* ... one accepted (AUTH, and a peer's AUTH_DONE) */
void rps__srv_auth_accepted(struct rps__server *srv, struct srv_conn *c, const struct rps__conn_priv *req,
			    struct rps__conn_priv *rep);
int rps__srv_auth_dialed(struct rps__server *srv, struct srv_conn *c, const struct rps__conn_priv *req,
			 const struct rps__conn_priv *rep, const char *uri);
void rps__srv_auth_on_message(struct rps__server *srv, struct srv_conn *c, const struct rps__msg_hdr *h,
			      const void *body);
void rps__srv_auth_timers(struct rps__server *srv, uint64_t now);
void rps__srv_auth_dial_free(struct srv_conn *c);
/* Log a refusal, once a second at most (hostile peers must not flood the log). */
void rps__srv_log_refusal(struct rps__server *srv, const struct srv_conn *c, const char *why);
void rps__srv_log_refusal_line(struct rps__server *srv, const char *who, const char *why);
/* Close c, not authenticated yet, to make room: an AUTH_REP of -EBUSY
 * says why (RPS__BUSY_REFUSAL ...) and that it may dial again. */
void rps__srv_auth_busy(struct rps__server *srv, struct srv_conn *c, const char *why);
/* conn.c: what an accepted connection does once authed */
void rps__srv_conn_authed(struct rps__server *srv, struct srv_conn *c);
/* A peer said it runs `theirs` serving threads (0: not said): false, with
 * one line logged (at most every 30 s), if they differ from ours. */
bool rps__srv_peer_threads_ok(struct rps__server *srv, uint64_t peer_id, unsigned theirs);
/* A tensor name a connection's scope covers (every name: no key here). */
bool rps__srv_scope_allows(const struct srv_conn *c, const char *name);
/* The same for a scope kept apart from its connection (a rank's departure). */
bool rps__srv_scope_str_allows(const struct rps__server *srv, const char *scope, size_t len, const char *name);
/* Two connections of the same job: the same key scope (both "": no key). */
bool rps__srv_same_scope(const struct srv_conn *a, const struct srv_conn *b);

/* push.c */
/* A push landed in (c, slot): consume, park or hold it. */
void rps__srv_on_push(struct rps__server *srv, struct srv_conn *c, uint32_t slot);
void rps__srv_drain_held(struct rps__server *srv);
void rps__srv_sync_advance(struct rps__server *srv, struct srv_tensor *t, uint32_t local, bool reserved);
/* A backup applied its primary's step of the shard: the step in progress a
 * seeding image brought, and parked pushes of applied steps, are forgotten. */
void rps__srv_sync_step_replicated(struct rps__server *srv, struct srv_tensor *t, uint32_t local);
/* A backup applied its primary's sum so far of the shard's step
 * (REPL_PARTIAL): parked pushes of that step in the sum are forgotten. */
void rps__srv_sync_partial_replicated(struct rps__server *srv, struct srv_tensor *t, uint32_t local);
/* Keep a copy of a push parked on another server (a partition image's,
 * or one its primary shipped: repl_stream.c, orphans) for step `clock` of
 * shard `local`; one of that rank and step held already stays.  -ENOMEM. */
int rps__srv_parked_keep(struct rps__server *srv, struct srv_tensor *t, uint32_t local, uint64_t clock, int rank,
			 const void *data, size_t nbytes);
bool rps__srv_parked_has(const struct rps__server *srv, const struct srv_tensor *t, uint32_t local, int rank,
			 uint64_t clock);
/* A parked entry's gradient is gone (taken, shipped, dropped): its buffer
 * back to the pool (or freed), its bytes off the budget. */
void rps__srv_parked_release(struct rps__server *srv, struct parked *p);
/* The next entry of the parked list, zeroed (not counted in nparked
 * until the caller fills it and counts it); -ENOMEM. */
int rps__srv_parked_slot(struct rps__server *srv, struct parked **out);
/* A buffer of at least nbytes for a parked push, charged to --memory-limit
 * (from the pool when one fits); NULL when the limit refuses it. */
void *rps__srv_park_buf_get(struct rps__server *srv, size_t nbytes, size_t *cap);
/* Give back up to `bytes` of kept parking buffers (SIZE_MAX: all). */
void rps__srv_park_pool_trim(struct rps__server *srv, size_t bytes);
int rps__srv_rank_remove(struct rps__server *srv, const char *name, int rank);
uint64_t rps__srv_release_lock(struct rps__server *srv, struct srv_tensor *t, struct shard *s, uint64_t w);
/* An async/bounded push applied under lock word w: acknowledged with the
 * word its release leaves, then released (hold: kept for the chain's next
 * push, its lease restarted).  The acknowledgement goes first so that the
 * release (on verbs a CAS through the loopback QP, tens of microseconds on
 * Soft-RoCE) is off the push's round trip: the worker's next CAS needs a
 * whole round trip to come back, and if it ever came first it would lose
 * and be retried, never applied twice. */
void rps__srv_ack_then_release(struct rps__server *srv, struct srv_conn *c, uint32_t slot, int status,
			       struct srv_tensor *t, struct shard *s, uint64_t w, bool hold);
/* Break the locks of dead_owner (a connection's), or with 0 those whose
 * lease expired. */
void rps__srv_scan_locks(struct rps__server *srv, uint32_t dead_owner);
void rps__srv_publish(struct shard *s, uint64_t epoch);
void rps__srv_wake_waiters(struct rps__server *srv, struct srv_tensor *t, uint32_t local);

/* apply.c: the primary and its backups apply with these (same code, same
 * order: bit-identical replicas).  Per push; the per-element work is in
 * src/kernels. */
void rps__srv_shard_apply(struct srv_tensor *t, struct shard *s, const float *g);
void rps__srv_shard_update(struct srv_tensor *t, struct shard *s, const float *g);
bool rps__srv_dedup_seen(const struct shard *s, uint64_t client, uint64_t push_id);
void rps__srv_dedup_note(struct shard *s, uint64_t client, uint64_t push_id);
const float *rps__srv_grad_fp32(struct shard *s, const void *data, uint16_t dtype);
void rps__srv_update_min_clock(struct srv_tensor *t, struct shard *s);
void rps__srv_clock_note(struct srv_tensor *t, struct shard *s, int rank, uint64_t clock);

/* the replication stream: server/repl.h; whether a partition has one */
static inline bool rps__srv_repl_part(const struct rps__server *srv, uint32_t part)
{
	return srv->parts[part].nbackups || srv->parts[part].joining;
}

/* push.c: acknowledge the push in (c, slot) */
void rps__srv_push_ack(struct srv_conn *c, uint32_t slot, int status, uint64_t version, uint64_t lock);

/* requests.c */
bool rps__srv_spec_equal(const struct rps__tensor_spec *a, const struct rps__tensor_spec *b);
void rps__srv_on_message(struct rps__server *srv, struct srv_conn *c, void *buf, uint32_t len);
void rps__srv_rank_left(struct rps__server *srv, struct srv_conn *c);
/* The departures whose grace ran out (all: every one, now): their ranks gone. */
void rps__srv_departures_run(struct rps__server *srv, uint64_t now, bool all);
void rps__srv_waiters_check(struct rps__server *srv, uint64_t now);
/* Sync: the rank that orphaned the current step of shard `local` (gone
 * before its push), or -1. */
int rps__srv_missing_rank(struct rps__server *srv, struct srv_tensor *t, uint32_t local);

/* tensor.c */
struct srv_tensor *rps__srv_tensor_by_name(struct rps__server *srv, const char *name);
int rps__srv_tensor_add(struct rps__server *srv, const char *name, const struct rps__tensor_spec *sp,
			struct srv_tensor **out);
void rps__srv_tensor_free(struct rps__server *srv, struct srv_tensor *t);
int rps__srv_spec_valid(struct rps__server *srv, const char *name, const struct rps__tensor_spec *sp,
			struct rps__layout *l);
int rps__srv_region_alloc(struct rps__server *srv, struct srv_tensor *t, uint32_t part, bool has_init,
			  struct srv_conn *init_conn);
int rps__srv_region_register(struct rps__server *srv, struct srv_tensor *t, uint32_t part);
void rps__srv_region_free(struct rps__server *srv, struct srv_tensor *t, uint32_t part);
void rps__srv_region_retire(struct rps__server *srv, struct srv_tensor *t, uint32_t part);
/* Free the retired regions whose time came (all: every one), 0 if none is left. */
uint32_t rps__srv_retired_reap(struct rps__server *srv, uint64_t now, bool all);

/* partition.c */
void rps__srv_refuse_partition(struct rps__server *srv, uint32_t part);
void rps__srv_regions_free_part(struct rps__server *srv, uint32_t part);
bool rps__srv_part_fence(struct rps__server *srv, uint32_t part);
void rps__srv_part_unfence(struct rps__server *srv, uint32_t part, uint64_t epoch);
void rps__srv_part_publish(struct rps__server *srv, uint32_t part, uint64_t epoch);
/* The read fence: every turn of the loop, and whenever the lease or the
 * partitions change (partition.c). */
void rps__srv_read_fence(struct rps__server *srv);
void rps__srv_part_create(struct rps__server *srv, uint32_t part);
void rps__srv_part_promote(struct rps__server *srv, uint32_t part, uint64_t epoch);
void rps__srv_part_forget_parked(struct rps__server *srv, uint32_t part);
/* A partition image (what a move ships): build one of a partition served
 * here (malloc'ed), and validate then install one as a move's destination
 * does (tests and the fuzz harness drive these). */
int rps__srv_image_build(struct rps__server *srv, uint32_t part, uint64_t epoch, void **img, size_t *len);
int rps__srv_image_install(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img, size_t len);
int rps__srv_image_install_backup(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img,
				  size_t len, uint64_t seq);
uint64_t rps__srv_repl_seq(struct rps__server *srv, uint32_t part);
void rps__srv_repl_seq_set(struct rps__server *srv, uint32_t part, uint64_t seq);
int rps__srv_part_digest(struct rps__server *srv, const char *name, uint32_t part, uint32_t *crc,
			 uint64_t *versions, uint32_t *nshards);

/* hold.c: checkpoints */
uint32_t rps__srv_hold_steps(struct rps__server *srv, struct rps__ckpt_target **out);
void rps__srv_hold_tensor(struct rps__server *srv, const char *name, uint64_t step);
void rps__srv_hold_release(struct rps__server *srv);
bool rps__srv_hold_reached(struct rps__server *srv);
int rps__srv_take(struct rps__server *srv, struct rps__dp_copy *copy);
void rps__srv_copy_free(struct rps__dp_copy *copy);
int rps__srv_restore_tensor(struct rps__server *srv, const char *file, const char *name,
			    const struct rps__tensor_spec *spec, struct srv_tensor **out);
int rps__srv_restore_shard(struct rps__server *srv, const char *file, struct srv_tensor *t,
			   const struct rps__dp_shard *cs);

/* dataplane.c */
/* a PEER dial is over: ret 0 and rp its accept's private data, or why not */
void rps__srv_peer_dialed(struct rps__server *srv, struct srv_conn *c, int ret, uint64_t to_id, const char *uri,
			  const struct rps__conn_priv *rp);

/* repl_stream.c: a REPL dial is over (the same) */
void rps__srv_repl_dialed(struct rps__server *srv, struct srv_conn *c, bool rev, int ret, uint64_t to_id,
			  const char *uri, const struct rps__conn_priv *rp);

/* dial.c: start a dial of c (0: c is the dial's until its owner finishes
 * it; or a negative errno, c still the caller's); is one to to_id under
 * way; step them every turn; their descriptors for poll() (the number put
 * in pfd, *timeout lowered to the nearest deadline); free them at destroy */
int rps__srv_dial(struct rps__server *srv, struct srv_conn *c, enum srv_dial_kind kind, uint64_t to_id,
		  const char *uri, const struct rps__conn_priv *priv, const struct rps__ep_attr *attr,
		  int timeout_ms);
bool rps__srv_dialing(const struct rps__server *srv, enum srv_dial_kind kind, uint64_t to_id);
void rps__srv_dials_turn(struct rps__server *srv);
struct pollfd;
int rps__srv_dials_poll(struct rps__server *srv, struct pollfd *pfd, int max, uint64_t now, int *timeout);
void rps__srv_dials_fini(struct rps__server *srv);

/* Inline: the push path looks a tensor up per push. */
static inline struct srv_tensor *rps__srv_tensor_by_id(struct rps__server *srv, uint32_t id)
{
	return id < srv->ntensors ? srv->tensors[id] : NULL;
}

/* Seqlock writer: readers that see an odd or changed seq retry.  Inline:
 * two stores, on every push.  The header's version (seq / 2) never runs
 * ahead of the shard's step; a write begins on an even seq, unless the
 * shard is not readable yet (no initial values) or a replicated write's
 * end waits for its replicas (repl_pending: repl_stream.c publishes it). */
static inline void rps__srv_publish_begin(struct shard *s)
{
	assert(__atomic_load_n(&s->hdr->seq, __ATOMIC_RELAXED) <= s->step * 2 + 1);
	assert(!(__atomic_load_n(&s->hdr->seq, __ATOMIC_RELAXED) & 1) || !s->ready || s->repl_pending);
	__atomic_store_n(&s->hdr->seq, s->step * 2 + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void rps__srv_publish_end(struct shard *s)
{
	assert(__atomic_load_n(&s->hdr->seq, __ATOMIC_RELAXED) <= s->step * 2 + 1);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&s->hdr->seq, s->step * 2, __ATOMIC_RELEASE);
}

/* Receive buffer i of a connection. */
static inline char *rps__srv_rbuf(struct srv_conn *c, uint32_t i)
{
	return c->bufs.rbufs + (size_t)i * c->bufs.msg_max;
}

/* Are the partition's contents lost (restarted owner, or the map says so)?
 * Then nothing of it is served: -ENODATA, never zeros. */
static inline bool rps__srv_part_lost(const struct rps__server *srv, uint32_t part)
{
	return srv->parts[part].lost;
}
/* Is the partition served here under this epoch right now? */
static inline bool rps__srv_part_serving(const struct rps__server *srv, uint32_t part)
{
	return srv->parts[part].serving;
}

/* Does this server hold its primary lease at now_ns (rps__dp_boottime_ns)?
 * A primary of a partition with backups acknowledges nothing without it
 * (doc/design.md "Failover and leases"; the control plane renews it,
 * control/repl_failover.c). */
static inline bool rps__srv_lease_held(const struct rps__server *srv, uint64_t now_ns)
{
	return now_ns < srv->lease_until;
}
/* Must what this server would acknowledge for the partition be refused
 * (RPS_ESTALE_EPOCH) instead?  Only a partition with backups can be taken
 * over, so only its acknowledgements need the lease: R=1 ignores it. */
static inline bool rps__srv_lease_fenced(const struct rps__server *srv, uint32_t part)
{
	return rps__srv_repl_part(srv, part) && !rps__srv_lease_held(srv, rps__dp_boottime_ns());
}

#endif
