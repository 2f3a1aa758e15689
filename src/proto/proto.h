/*
 * proto.h - the wire protocol between librdmaps and rdmapsd, above the
 * transport.
 *
 * Two kinds of traffic:
 *  - Control messages travel as SEND/RECV into pre-posted receive buffers of
 *    RPS__MSG_MAX bytes: a 24-byte header, then a type-specific body.  Every
 *    request carries a req_id that the reply echoes.
 *  - Gradients travel one-sided: the worker writes a 64-byte push descriptor
 *    followed by the data into one of the staging slots the server gave its
 *    connection, with a single WRITE_WITH_IMM whose immediate is the slot
 *    number.  The server answers with a PUSH_ACK message.
 *  - Sync pushes to a partition with backups are acknowledged in two
 *    stages: PUSH_ACK with RPS__ACK_TAKEN in the header's flags once the
 *    gradient is summed or parked (the slot is free again, the push is not
 *    complete), then STEP_DONE once its step is on every replica (that
 *    completes it).  Without backups: one PUSH_ACK, no flag, as before.
 *
 * Structures are fixed-layout, host byte order; HELLO carries a magic that
 * reveals a byte-order mismatch.  rps__msg_check() validates everything a
 * peer controls (length, type, terminated strings) before a body is used.
 *
 * The files of src/proto/ (tests/filemaps.sh checks that this names each):
 *   proto.c       building and validating wire messages (this header)
 *   shard.c       tensor placement and shard layout, the lock word (shard.h)
 *   smap.c        the shard map's state machine (smap.h)
 *   smap_codec.c  the shard map's wire formats and printing (smap.h)
 *   auth_keys.c   keys: roles, derivation, key files, the loopback key, key rings (auth.h)
 *   auth_handshake.c  the handshake's transcript, proofs and their checks (auth.h)
 */
#ifndef RPS_PROTO_H
#define RPS_PROTO_H

#include <stdint.h>
#include <stddef.h>

/* 3: WAIT_REP names a missing rank; lost partitions in the map and STATUS_REP
 * 5: PUSH_ACK may carry RPS__ACK_TAKEN, STEP_DONE: a version-4 client would
 *    refuse both as malformed and drop the connection; HELLO refuses it.
 *    Servers: SEED (seeding a backup), ADMIN set-replicas and digest
 * 6: LEASE_REP carries the leader's ReadIndex (24 bytes), and a primary
 *    without its lease shows RPS__EPOCH_MOVED in its headers (the read
 *    fence: a version-5 reader checked the seq first and could stall on a
 *    fenced copy whose version is unconfirmed)
 * 7: a STEP_DONE entry names the rank its step is orphaned by (32 bytes;
 *    a version-6 client would take such an entry for a resend, and loop)
 * 8: the connect data carries a key id and a nonce, and a connection to a
 *    server with a key starts with AUTH / AUTH_REP (proto/auth.h)
 * 9: the shard map holds up to 64 members, and the buffer workers READ it
 *    from (RPS__MAP_BUF, its last bytes the quorum note and the probe
 *    area) is 32 KiB: a version-8 client would look for the note at 20 KiB
 * 10: STATUS_REP names up to 64 Raft nodes (RPS__STATUS_MAX_NODES), not 16:
 *    psctl refused the reply of a cluster of more than 16 members
 * 11: HELLO_REP carries the server's incarnation (96 bytes): a version-10
 *    client refused it as malformed; a HELLO may be refused with -ESTALE
 *    (a process whose rank another took over)
 * 12: STATUS_REP says how many peer connections the server holds
 *    (n_peers): a version-11 psctl would read the map 8 bytes off */
#define RPS__PROTO_VERSION 12u
#define RPS__MSG_MAGIC 0x5053u		/* "SP" */
#define RPS__DESC_MAGIC 0x48535550u	/* "PUSH" */
#define RPS__HELLO_MAGIC 0x0102030405060708ull
/* How a witness (rdmapsd --witness) begins its refusal of a worker's
 * connection: a client takes it for a member whose partitions are on their
 * way to their backups (the map names a witness owner until its SET_WITNESS
 * commits), not for a live data server refusing it. */
#define RPS__WITNESS_REFUSAL "a witness holds no data"
/* How a server's AUTH_REP of -EBUSY begins: too many handshakes at once
 * (from the connector's address), this one closed to make room.  Nothing
 * is wrong with it: librdmaps dials again (client/dialer.c). */
#define RPS__BUSY_REFUSAL "busy:"
#define RPS__MSG_MAX 512u		/* worker connections */
#define RPS__BIG_MSG_MAX (32u << 10)	/* peer (Raft, migration) and admin connections */
#define RPS__NAME_MAX 64u		/* including the terminating NUL */
#define RPS__PUSH_DESC_SIZE 64u

enum rps__msg_type {
	RPS__MSG_HELLO = 1,
	RPS__MSG_HELLO_REP,
	RPS__MSG_CREATE,
	RPS__MSG_CREATE_REP,
	RPS__MSG_PUSH_ACK,
	RPS__MSG_WAIT,
	RPS__MSG_WAIT_REP,
	RPS__MSG_BARRIER,
	RPS__MSG_BARRIER_REP,
	/* server <-> server (role PEER) */
	RPS__MSG_RAFT,		/* body: an encoded rps__raft_msg (variable) */
	RPS__MSG_PROPOSE,	/* body: an encoded rps__smap_cmd (variable); to the leader */
	RPS__MSG_PROPOSE_REP,	/* struct rps__propose_rep, once applied (or refused) */
	RPS__MSG_MIGRATE,	/* struct rps__migrate, or struct rps__seed (the stream's seq
				 * at the fence, which the new owner numbers after, so the
				 * partition's backups follow it): a fenced partition is
				 * ready to READ */
	RPS__MSG_MIGRATE_REP,	/* no body: the destination installed it (status) */
	/* psctl -> server (role ADMIN); also accepted from peers */
	RPS__MSG_STATUS,	/* no body */
	RPS__MSG_STATUS_REP,	/* struct rps__status_rep + encoded map (variable) */
	RPS__MSG_ADMIN,		/* struct rps__admin */
	RPS__MSG_ADMIN_REP,	/* struct rps__admin_rep */
	RPS__MSG_CKPT,		/* struct rps__ckpt_req + targets (variable); to every server */
	RPS__MSG_CKPT_REP,	/* struct rps__ckpt_rep + targets (variable) */
	RPS__MSG_RANK,		/* struct rps__rank_req (psctl remove-rank); to every server */
	RPS__MSG_RANK_REP,	/* struct rps__rank_rep */
	/* primary leases (control/repl_failover.c): member -> leader, role PEER */
	RPS__MSG_LEASE,		/* struct rps__lease: every failover_ms / 10 */
	RPS__MSG_LEASE_REP,	/* struct rps__lease_rep: after a ReadIndex round */
	/* primary -> backup server (role REPL): the replication stream */
	RPS__MSG_REPL_HELLO,	/* struct rps__repl_hello */
	RPS__MSG_REPL_HELLO_REP,	/* struct rps__repl_hello_rep: the backup's slots */
	RPS__MSG_REPL_ACK,	/* struct rps__repl_ack: entries applied, credits back */
	RPS__MSG_REPL_NACK,	/* struct rps__repl_ack, status: the entry after seq is refused */
	/* server -> worker: sync steps replicated (after PUSH_ACK TAKEN) */
	RPS__MSG_STEP_DONE,	/* struct rps__step_done */
	/* primary -> joiner (role PEER): seeding a new backup (control/repl_place.c) */
	RPS__MSG_SEED,		/* struct rps__seed: a fenced partition's image to READ as a backup */
	/* the first messages of a connection to a server with a key (auth.h) */
	RPS__MSG_AUTH,		/* struct rps__auth: the connector's proof */
	RPS__MSG_AUTH_REP,	/* struct rps__auth_rep: the server's proof, or why not */
	RPS__MSG_AUTH_DONE,	/* no body: a server that dialed checked AUTH_REP and is ready
				 * (until then the accepting server sends nothing more) */
	RPS__MSG_TYPE_MAX
};

struct rps__msg_hdr {
	uint16_t magic;
	uint8_t type;
	uint8_t flags;
	uint32_t len;		/* header + body */
	uint64_t req_id;
	int32_t status;		/* replies: 0 or a negative errno / RPS_E* */
	uint32_t reserved;
};

enum rps__conn_role {
	RPS__ROLE_WORKER = 1,
	RPS__ROLE_PEER = 2,	/* another rdmapsd: Raft, proposals, migration */
	RPS__ROLE_ADMIN = 3,	/* psctl */
	RPS__ROLE_REPL = 4,	/* a primary's replication stream to a backup server */
	/* the same stream, dialed by the backup: the server with the higher
	 * member id dials (as for PEER), so two loops never wait on each
	 * other's accept, whichever way the stream runs */
	RPS__ROLE_REPL_REV = 5,
};

/* Private data of the transport-level connect request, and of its accept
 * (role 0, from_id: the server's member id). */
struct rps__conn_priv {
	uint32_t magic;		/* RPS__DESC_MAGIC */
	uint16_t version;
	uint16_t role;		/* enum rps__conn_role */
	uint64_t from_id;	/* PEER: the connecting server's member id */
	uint64_t to_id;		/* PEER: the id it expects to reach */
	uint64_t key_id;	/* the cluster key's id (auth.h); 0: no key, no AUTH */
	uint8_t nonce[16];	/* fresh: the connector's, then the server's */
	/* PEER, both ways: the server's --threads (each thread's replication
	 * streams go to the same thread of the other member, so members must
	 * agree); 0: not said (a worker, psctl, or an older server) */
	uint16_t nthreads;
	uint16_t reserved16;
	uint32_t reserved;
};

/* AUTH: the first message on a connection to a server with a key. */
struct rps__auth {
	uint32_t key_role;	/* enum rps__key_role proven */
	uint32_t reserved;
	uint64_t key_id;	/* the cluster key it derives from */
	char scope[RPS__NAME_MAX];	/* worker/reader: tensor-name prefix */
	uint8_t mac[32];	/* MAC_C of the transcript (auth.h) */
};

struct rps__auth_rep {
	uint8_t mac[32];	/* status 0: MAC_S of the transcript */
	char why[64];		/* status < 0: what was refused */
};

/* A member asks the Raft leader for a primary lease (repl_failover.c). */
struct rps__lease {
	uint64_t seq;		/* the member's counter, echoed in the reply */
	uint64_t t_send;	/* the member's CLOCK_BOOTTIME at sending, ns (for its logs) */
};

struct rps__lease_rep {
	uint64_t seq;		/* the request's */
	uint32_t granted;	/* 1: a quorum confirmed the leader after the request arrived */
	uint32_t reserved;
	uint64_t index;		/* the leader's commit index then: the lease holds once
				 * the member applied the log that far (protocol 6) */
};

struct rps__hello {
	uint64_t magic;		/* RPS__HELLO_MAGIC */
	uint32_t version;
	int32_t rank;
	int32_t num_workers;
	uint32_t flags;		/* enum rps__hello_flags */
	uint64_t client_id;	/* random per client: names its pushes across servers */
};

enum rps__hello_flags {
	/* a replacement process of this rank: the server closes the rank's
	 * other connections (a predecessor that died without a reset) */
	RPS__HELLO_TAKEOVER = 1u << 0,
};

/* Serving threads a server may announce: a worker holds a connection to
 * each thread of each member (RPS__SMAP_MAX_MEMBERS x this at most). */
#define RPS__PROTO_THREADS_MAX 16u

struct rps__hello_rep {
	uint64_t magic;
	uint32_t version;
	uint32_t nthreads;	/* serving threads (rdmapsd --threads; 0: one; at most
				 * RPS__PROTO_THREADS_MAX): the k-th
				 * listens on this port + k and serves the partitions
				 * p with p % nthreads == k */
	uint64_t member_id;	/* this server's id in the shard map */
	uint64_t map_addr;	/* the encoded shard map, for one-sided READs ... */
	uint32_t map_rkey;
	uint32_t map_len;	/* ... of this many bytes (RPS__MAP_BUF) */
	uint32_t shard_elems;	/* cluster-wide shard size */
	uint32_t nslots;	/* staging slots of this connection */
	uint32_t slot_size;	/* bytes per slot, descriptor included */
	uint64_t slot_addr;
	uint32_t slot_rkey;
	uint32_t owner;		/* this connection's lock owner id */
	uint32_t lease_ms;
	uint32_t thread_index;	/* which of nthreads this port serves */
	/* rdmapsd --failover-ms (0 from a server before it was sent): a
	 * worker waits this long on a silent server (at least its own 4 s)
	 * before it calls the connection lost, since no partition of a
	 * server silent for less can have failed over anyway */
	uint32_t failover_ms;
	/* random per server instance (a restart draws another): a worker
	 * that dials a server again after losing its connection learns
	 * whether the process it lost is the one that answers */
	uint64_t incarnation;
};

enum rps__create_flags {
	RPS__CREATE_OPEN_ONLY = 1u << 0,	/* fail with -ENOENT instead of creating */
	RPS__CREATE_HAS_INIT = 1u << 1,		/* initial values follow via INIT pushes */
};

struct rps__tensor_spec {
	uint64_t count;
	uint32_t dtype;
	uint32_t mode;
	uint32_t staleness;
	uint32_t optimizer;
	float lr, momentum, beta1, beta2, eps, weight_decay, rescale;
	int32_t num_workers;
	uint32_t flags;		/* RPS__CREATE_HAS_INIT is part of the identity */
	uint32_t reserved;
};

struct rps__create {
	char name[RPS__NAME_MAX];
	struct rps__tensor_spec spec;
	uint32_t flags;		/* rps__create_flags */
	uint32_t first;		/* first region wanted in the reply (paging) */
};

/*
 * Where a server keeps a tensor's shards of one partition it owns: shard i
 * (in partition p = (seed + i) mod npart) is at addr + (i / npart) * stride.
 */
struct rps__region_ref {
	uint64_t addr;
	uint32_t rkey;
	uint16_t part;
	uint16_t reserved;
	uint64_t epoch;		/* the partition's epoch this region serves */
};

#define RPS__CREATE_MAX_REGIONS 15u	/* a reply fits RPS__MSG_MAX; more come in pages */

struct rps__create_rep {
	struct rps__tensor_spec spec;	/* the tensor as it exists */
	uint32_t tensor_id;
	uint32_t created;	/* 1 if this request created it (send INIT if HAS_INIT) */
	uint64_t stride;
	uint64_t map_applied;	/* the map version the regions were decided by */
	uint32_t nregions;	/* regions below (this server's partitions of the tensor) */
	uint32_t first;		/* index of regions[0] among them (paging: CREATE.first) */
	uint32_t total;		/* regions in all */
	uint32_t reserved;
	/* sync and bounded, for the asking connection's rank, over the shards
	 * served here: the lowest and highest first clock that rank has not
	 * contributed yet (sync: summed or parked; bounded: pushes applied).
	 * A new worker process of a rank resumes its clock there. */
	uint64_t resume_clock;
	uint64_t resume_until;
	struct rps__region_ref regions[RPS__CREATE_MAX_REGIONS];
};

struct rps__wait {
	uint32_t tensor_id;
	uint32_t shard;
	uint64_t min_version;	/* reply once version >= this */
	uint64_t min_clock;	/* and min_clock >= this */
};

struct rps__wait_rep {
	uint64_t version;
	uint64_t min_clock;
	int32_t missing_rank;	/* -EPIPE: the sync rank that left before its push for step `version` */
	uint32_t reserved;
};

struct rps__barrier {
	uint64_t generation;
};

struct rps__push_ack {
	uint32_t slot;
	uint32_t shard;
	uint64_t version;	/* the shard's version after this push was taken */
	uint64_t lock;		/* async/bounded: the lock word the push ran under */
};

/* rps__msg_hdr.flags of a PUSH_ACK (every other message: 0) */
enum rps__ack_flags {
	/* sync, partition with backups: the gradient is summed or parked here,
	 * the slot is free; the push completes at STEP_DONE */
	RPS__ACK_TAKEN = 1u << 0,
};

/*
 * STEP_DONE: steps of sync shards that are on every replica now.  Each
 * entry completes every TAKEN push of this connection to that shard with a
 * clock <= step (cumulative: a later entry covers earlier steps).  The
 * server batches what completed for a connection into one message per loop
 * turn, and keeps at most RPS__STEP_DONE_WINDOW of them in the
 * connection's send queue (the rest wait for the next turn); the worker
 * posts that many receive buffers more for them.
 *
 * An entry with missing_rank >= 0 completes the TAKEN pushes of exactly
 * step `step` (not the earlier ones) as taken, not replicated: that rank's
 * last connection closed before its push for the step, which cannot
 * complete (nor be replicated) until a new process of the rank pushes or
 * psctl remove-rank drops it.  The sum so far stays; the worker's pull
 * then fails, its WAIT_REP naming the rank, as without backups.
 */
#define RPS__STEP_DONE_MAX 15u
#define RPS__STEP_DONE_WINDOW 4u

struct rps__step_done_ent {
	uint32_t tensor_id;	/* the server's id */
	uint32_t shard;		/* global shard index */
	uint64_t step;		/* the step completed (the pushes' clock) */
	uint64_t version;	/* the shard's version with it applied (step + 1); 0: the
				 * step will not complete here (the partition left this
				 * server, or paused for a move or a seeding): resend the
				 * pushes it covers, where the map says */
	int32_t missing_rank;	/* >= 0: the step is orphaned by that rank (version 0); -1 */
	uint32_t reserved;
};

struct rps__step_done {
	uint32_t n;		/* entries used, 1..RPS__STEP_DONE_MAX */
	uint32_t reserved;
	struct rps__step_done_ent e[RPS__STEP_DONE_MAX];
};

/* Checkpoints (psctl checkpoint / restore), to every server. */
enum rps__ckpt_op {
	RPS__CKPT_PREPARE = 1,	/* hold sync tensors at their current step; reply: tensor -> step */
	RPS__CKPT_TAKE = 2,	/* bring sync tensors to the targets, copy, release; a thread writes */
	RPS__CKPT_ABORT = 3,	/* release a hold */
	RPS__CKPT_RESTORE = 4,	/* install what the files of name hold for partitions served here */
	RPS__CKPT_FINISH = 5,	/* answer once the file of the last TAKE is written */
};

struct rps__ckpt_target {
	char name[RPS__NAME_MAX];
	uint64_t step;
};

struct rps__ckpt_req {
	uint32_t op;		/* enum rps__ckpt_op */
	uint32_t ntargets;	/* TAKE: targets that follow */
	uint64_t ckpt_id;
	uint32_t timeout_ms;	/* PREPARE: release the hold by itself after this (0: 30 s) */
	uint32_t level;		/* igzip level 0..3 */
	char name[256];		/* the checkpoint: a directory under the server's
				 * --checkpoint-dir (never a path: rps__ckpt_name_check) */
};

struct rps__ckpt_rep {
	uint64_t pause_ns;	/* TAKE: from the hold to the end of the copy */
	uint64_t bytes;		/* TAKE: file size; RESTORE: bytes read */
	uint64_t raw_bytes;	/* TAKE: parameters + state copied */
	uint32_t nshards;	/* TAKE: shards written; RESTORE: shards installed here */
	uint32_t ntargets;	/* PREPARE: targets that follow (tensor -> this server's step) */
	uint64_t seen_shards;	/* RESTORE: shards in all the files */
	char msg[256];		/* failure: one line */
};

/* psctl remove-rank: a dead worker's rank leaves sync and bounded tensors
 * for good, so the others go on without it. */
struct rps__rank_req {
	char name[RPS__NAME_MAX];	/* one tensor; "": every sync and bounded tensor */
	int32_t rank;
	uint32_t reserved;
};

struct rps__rank_rep {
	uint32_t tensors;	/* tensors here the rank was removed from now */
	uint32_t reserved;
	char msg[256];		/* failure: one line */
};

/* Bytes of the registered buffer holding a server's encoded shard map. */
#define RPS__MAP_BUF 32768u
/* A serving thread's port past the first has no map: its HELLO names 64
 * readable bytes instead, which a worker's liveness probe READs. */
#define RPS__PROBE_AREA 64u

/*
 * The last RPS__PROBE_AREA bytes of the map buffer (after the longest
 * encoded map): what a server that can no longer reach a Raft majority
 * tells workers, which read it with the map and with their liveness
 * probes (doc/design.md "Small clusters: the witness").  A worker blocked by a dead member that cannot
 * be failed over (two voters, one dead) gets this, not a timeout.
 * All zero while the server has a majority (or knows of nothing wrong).
 */
#define RPS__NOTE_MAGIC 0x4d4a524eu	/* "NRJM" */
struct rps__quorum_note {
	uint32_t magic;		/* RPS__NOTE_MAGIC */
	uint32_t crc;		/* rps__crc32c_noinv of the bytes after it (a torn READ) */
	uint64_t member;	/* a voter this server has lost its connection to */
	uint64_t reporter;	/* this server's member id */
	uint32_t voters;	/* Raft voters */
	uint32_t reachable;	/* ... this server is connected to, itself included */
	uint32_t since_ms;	/* no lease (no majority) for this long */
	uint32_t failover_ms;
	uint8_t reserved[RPS__PROBE_AREA - 40];
};

struct rps__propose_rep {
	uint64_t index;		/* where the command was applied */
	uint64_t leader;	/* -EPERM: who to ask instead (0: unknown) */
};

struct rps__migrate {
	uint32_t part;
	uint32_t reserved;
	uint64_t epoch;		/* the epoch MOVE_BEGIN named */
	uint64_t from;		/* source member id */
	uint64_t addr;		/* the partition's state, registered for READ */
	uint32_t rkey;
	uint32_t crc;		/* rps__crc32c_noinv (crc.h) of the len bytes */
	uint64_t len;
};

/* SEED: a move's offer, and where the joiner's stream position starts (the
 * primary's replication seq of the partition at the cut).  The answer is a
 * MIGRATE_REP, as for a move. */
struct rps__seed {
	struct rps__migrate mig;	/* epoch: the one REPLICA_BEGIN named */
	uint64_t seq;
};

/* STATUS_REP body: this fixed part, then the encoded shard map.  It
 * names every Raft node of the largest map (RPS__SMAP_MAX_MEMBERS, smap.h:
 * control/cp_admin.c checks they agree). */
#define RPS__STATUS_MAX_NODES 64u
/* rps__status_rep.flags */
#define RPS__STATUS_BALANCING 1u	/* the leader will move primaries yet (repl_place.c balancing) */
struct rps__status_rep {
	uint64_t id;
	uint64_t term;
	uint64_t vote;
	uint64_t leader;
	uint64_t commit;
	uint64_t applied;
	uint64_t last_index;
	uint64_t snapshot_index;
	uint32_t role;		/* enum rps__raft_role */
	uint32_t n_voters;
	uint32_t n_learners;
	uint32_t n_conns;	/* worker connections */
	uint32_t n_peers;	/* connections with other members (cp_peers.c peers_needed) */
	uint32_t flags;		/* RPS__STATUS_* (0 from a server before them) */
	uint64_t voters[RPS__STATUS_MAX_NODES];
	uint64_t learners[RPS__STATUS_MAX_NODES];
	uint64_t match[RPS__STATUS_MAX_NODES];	/* leader only: match index of voters[], then learners[] */
	uint64_t tensors;
	uint64_t shards;	/* shards held here */
	uint64_t shard_bytes;	/* their parameter bytes */
	uint64_t fsync;		/* 1 = durable */
};

enum rps__admin_op {
	RPS__ADMIN_MOVE = 1,		/* part -> id */
	RPS__ADMIN_ADD_SERVER = 2,	/* id at uri: a member, then a learner, a voter if short */
	RPS__ADMIN_REMOVE_SERVER = 3,	/* id: must own nothing (psctl moves it out first) */
	RPS__ADMIN_TRANSFER_LEADER = 4,	/* to id (0: the most caught-up voter) */
	RPS__ADMIN_NOP = 5,		/* commit a no-op entry and answer once applied here */
	RPS__ADMIN_FORGET_LOST = 6,	/* part (UINT32_MAX: every one): accept a lost partition empty */
	RPS__ADMIN_FORCE_REMOVE = 7,	/* id: a dead member goes, its partitions lost (smap FORCE_REMOVE) */
	RPS__ADMIN_SET_REPLICAS = 8,	/* id: the replication target R (smap SET_REPLICAS) */
	RPS__ADMIN_DIGEST = 9,		/* tests, any server: uri = a tensor's name, part; the answer's
					 * index = crc32c of what this server holds of it, epoch = the
					 * sum of its shards' versions, leader = its shard count */
};

struct rps__admin {
	uint32_t op;		/* enum rps__admin_op */
	uint32_t part;
	uint64_t id;
	uint32_t timeout_ms;	/* how long the server may take (0: 30 s) */
	uint32_t reserved;
	char uri[128];
};

struct rps__admin_rep {
	uint64_t leader;	/* -EPERM: send it there */
	uint64_t index;		/* log index that carried it out */
	uint64_t epoch;		/* MOVE: the partition's new epoch */
	char msg[256];		/* failure: one line, what failed and what to do */
};

/*
 * The replication stream (src/server/repl_stream.c): the primary writes an entry
 * (this descriptor, then the payload) into the backup's slot k with one
 * WRITE_WITH_IMM, imm = k; slots are used in turn, one credit each.
 */
#define RPS__REPL_DESC_SIZE 128u
#define RPS__REPL_MAGIC 0x4c504552u	/* "REPL" */
#define RPS__REPL_FP_MAX 48u

enum rps__repl_kind {
	RPS__REPL_TENSOR = 1,	/* payload struct rps__repl_tensor: bind tensor id to name + spec */
	RPS__REPL_INIT = 2,	/* the creator's initial values (fp32) */
	RPS__REPL_PUSH = 3,	/* async/bounded: an applied push, the gradient as pushed */
	RPS__REPL_STEP = 4,	/* sync: a completed step, its fp32 sum */
	/* sync, a step a rank left before its push for (repl_stream.c,
	 * orphans): what the primary acknowledged of it, so that a promoted
	 * backup completes it with the rank's replacement alone */
	RPS__REPL_PARTIAL = 5,	/* the fp32 sum so far of step `clock`: rank = next_rank,
				 * reserved = contributions in it */
	RPS__REPL_PARKED = 6,	/* a push parked for step `clock` (rank), as pushed */
};

struct rps__repl_desc {
	uint32_t magic;		/* RPS__REPL_MAGIC */
	uint16_t kind;		/* enum rps__repl_kind */
	uint16_t dtype;		/* of the payload */
	uint32_t tensor_id;	/* the primary's id (bound by REPL_TENSOR) */
	uint32_t shard;		/* global shard index */
	uint32_t part;
	int32_t rank;		/* PUSH, PARKED: the pusher's rank (bounded clocks); PARTIAL: next_rank */
	uint32_t nbytes;	/* payload bytes after the descriptor */
	uint32_t nsummed;	/* PARTIAL: contributions in the sum (removed ranks are skipped) */
	uint64_t epoch;		/* the partition's epoch on the primary */
	uint64_t seq;		/* per partition, from 1 */
	uint64_t cseq;		/* per connection, from 1: continuity of the stream */
	uint64_t version;	/* the shard's step after applying: the backup checks it */
	uint64_t push_id;	/* PUSH */
	uint64_t client_id;	/* PUSH */
	uint64_t clock;		/* PUSH, PARKED: the push's clock; STEP, PARTIAL: the step */
	uint8_t pad[RPS__REPL_DESC_SIZE - 92];
};

struct rps__repl_tensor {
	char name[RPS__NAME_MAX];
	struct rps__tensor_spec spec;
};

/* What must match for two servers to replicate to each other: the same
 * build and the kernel variants chosen at run time, or backups would not
 * be bit-identical. */
struct rps__repl_hello {
	uint64_t from_id;
	char fingerprint[RPS__REPL_FP_MAX];
};

struct rps__repl_hello_rep {
	uint64_t slot_addr;
	uint32_t slot_rkey;
	uint32_t nslots;
	uint32_t slot_size;	/* descriptor included */
	uint32_t reserved;
	char fingerprint[RPS__REPL_FP_MAX];
};

struct rps__repl_ack {
	uint64_t cseq;		/* entries applied, cumulative */
	uint32_t credits;	/* slots freed since the last ack */
	uint32_t part;		/* NACK: the partition refused */
};

enum rps__push_kind {
	RPS__PUSH_GRAD = 1,
	RPS__PUSH_INIT = 2,	/* initial values (fp32), from the creator */
};

/* At the start of a staging slot, written with the data in one WRITE_IMM. */
struct rps__push_desc {
	uint32_t magic;		/* RPS__DESC_MAGIC */
	uint16_t kind;		/* rps__push_kind */
	uint16_t dtype;
	uint32_t tensor_id;
	uint32_t shard;		/* global shard index */
	uint32_t nbytes;	/* data bytes after the descriptor */
	int32_t rank;
	uint64_t clock;		/* the worker's pushes to this tensor before this one */
	uint64_t lock;		/* async/bounded: the lock word the worker holds */
	uint64_t push_id;	/* unique per worker: duplicates are refused */
	uint64_t epoch;
	uint32_t crc;		/* RPS__DESC_CRC: rps__crc32c_noinv (crc.h) of the data */
	uint32_t flags;
};

enum rps__desc_flags {
	RPS__DESC_CRC = 1u << 0,	/* crc is set: verify before applying */
	/* async/bounded: applied, the lock stays held: the next push of the
	 * worker's chain follows under the same word (client ops.c) */
	RPS__DESC_HOLD = 1u << 1,
};

/* rps__crc32c_noinv (crc.h) of the data after a descriptor, as --verify uses it. */
uint32_t rps__push_crc(const struct rps__push_desc *d);

/* Validate a received message: length, magic, type, body size for its
 * type, NUL-terminated strings.  Returns 0 or -EBADMSG with a message. */
int rps__msg_check(const void *buf, size_t len);
/* Body size expected for a type (0 if none, -1 unknown, RPS__BODY_VAR:
 * any length up to the connection's buffer; the type's decoder checks it;
 * RPS__BODY_VAR_MIN(n): at least n bytes, the rest variable). */
#define RPS__BODY_VAR (-2)
long rps__msg_body_size(unsigned type);
/* Fixed-part size of a type whose body is variable (STATUS_REP). */
size_t rps__msg_body_min(unsigned type);
/* Build header+body into buf (large enough); returns total length. */
size_t rps__msg_build(void *buf, unsigned type, uint64_t req_id, int32_t status,
		      const void *body, size_t body_len);
/* Set the header's flags of a message built in buf (PUSH_ACK: TAKEN). */
void rps__msg_set_flags(void *buf, uint8_t flags);
static inline void *rps__msg_body(void *buf)
{
	return (char *)buf + sizeof(struct rps__msg_hdr);
}
const char *rps__msg_type_name(unsigned type);

/* Tensor names: 1 to RPS__NAME_MAX-1 bytes of printable ASCII without
 * space (0x21-0x7e), so a name can never break or forge a log line.
 * 0, -ENAMETOOLONG (empty or too long) or -EINVAL, with a message. */
int rps__name_check(const char *name);

/* Validate a push descriptor found in a slot of slot_size bytes. */
int rps__desc_check(const struct rps__push_desc *d, size_t slot_size);

#endif
