/*
 * dataplane.h - the seam between the data plane (src/server) and the layer
 * above it (src/control): what the control plane may ask of the server, and
 * how the server loop calls up.
 *
 * The data plane owns descriptors, timers, connections, tensors, shards,
 * held and parked pushes, waiters and memory accounting; it knows nothing
 * of Raft, the map's log or admin requests.  Per partition it keeps the few
 * facts it serves by (struct rps__dp_part), which the control plane sets.
 *
 * Down: the control plane calls the data plane only through the ops table
 * it is given (rps__dataplane_ops(), or a fake in tests/test_cplane.c).
 * Up: the loop calls the hooks registered with rps__dp_set_hooks (as Redis
 * ae.c calls its file and timer events): control-plane messages, lost
 * connections, finished READs, peers, timers, and fini at destroy.
 * Threads: one data plane runs on one thread, its loop's.  With serving
 * threads (rdmapsd --threads N, threads.c) there are N data planes; the
 * control plane and the hooks run on the first one's thread, and an op of
 * another one runs on that one's thread, between two turns of its loop
 * (its mailbox), while the caller waits: no op ever runs beside the loop
 * of the data plane it touches.
 */
#ifndef RPS_DATAPLANE_H
#define RPS_DATAPLANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "proto/proto.h"

struct rps__server;
struct rps__mr;
struct srv_conn;	/* a connection of the data plane (opaque above it) */
struct srv_tensor;	/* a tensor of the data plane (opaque above it) */

enum conn_role_kind { CONN_WORKER = 1, CONN_PEER = 2, CONN_ADMIN = 3, CONN_REPL = 4 };

/* What the data plane serves a partition by (set by the control plane). */
struct rps__dp_part {
	uint64_t epoch;		/* serving: the epoch pushes must name and regions are announced with */
	uint64_t map_epoch;	/* the map's epoch: headers of new regions carry it */
	bool serving;		/* ours, served now */
	bool lost;		/* its contents are lost: refused (-ENODATA), never zeros */
	bool owned_lost;	/* ... and it is ours: creates with shards in it are refused */
	bool incoming;		/* on its way here: new tensors get regions for it too */
	/* the replica set (all 0 without backups: nothing is replicated) */
	uint64_t primary;	/* the map's owner */
	uint64_t backups[2];	/* ordered */
	uint32_t nbackups;
	uint64_t joining;	/* a backup being seeded, already in the ack rule */
	bool backup;		/* we are a backup (or the joiner): regions kept, the stream applied */
	bool seeded;		/* we are the joiner and its image is installed here */
};

/* A shard as a checkpoint holds it (copied out, or to restore). */
struct rps__dp_shard {
	uint32_t index;		/* global shard index */
	uint32_t elems;
	uint64_t version;	/* updates applied */
	uint64_t min_clock;
	bool ready;		/* initial values were in place */
	uint32_t nclocks;	/* bounded: num_workers, else 0 */
	const uint64_t *clocks;
	const float *params;
	uint32_t nstate;	/* optimizer state floats */
	const float *state;
};

/* The shards served here, copied at a checkpoint's cut (rps__dp_ops.take). */
struct rps__dp_copy {
	struct {
		char name[RPS__NAME_MAX];
		struct rps__tensor_spec spec;
	} *tensors;
	uint32_t ntensors;
	struct rps__dp_shard_copy {
		uint32_t tensor;	/* index in tensors */
		struct rps__dp_shard meta;
		float *params;
		float *state;
		uint64_t *clocks;
	} *shards;
	uint32_t nshards;
	uint64_t raw_bytes;	/* parameters and state copied */
};

/* psctl status: what this server serves. */
struct rps__dp_stats {
	uint32_t n_conns;	/* worker connections */
	uint64_t tensors;
	uint64_t shards;	/* of partitions served */
	uint64_t shard_bytes;
};

/* The loop calls up through these (any may be NULL). */
struct rps__dp_hooks {
	/* A message of a peer or admin connection (workers' are the data plane's). */
	void (*on_message)(void *ctx, struct srv_conn *c, const struct rps__msg_hdr *h, void *body, uint32_t len);
	/* The connection is about to be freed. */
	void (*on_conn_gone)(void *ctx, struct srv_conn *c);
	/* A READ posted with rps__dp_ops.conn_read finished (buf: what it read). */
	void (*on_read_done)(void *ctx, struct srv_conn *c, bool ok, const void *buf);
	void (*on_send_done)(void *ctx, struct srv_conn *c);
	/* May this peer connect?  0, or a negative errno and *why. */
	int (*accept_peer)(void *ctx, uint64_t from_id, uint64_t to_id, const char *addr, const char **why);
	void (*peer_attached)(void *ctx, struct srv_conn *c);
	/* A peer_dial is over: c the connection (attached, its peer id
	 * set), or NULL: it failed. */
	void (*peer_dialed)(void *ctx, const char *uri, uint64_t to_id, struct srv_conn *c);
	/* Every turn of the loop: ms until due, or a negative errno to stop
	 * with it; *stop set: stop cleanly (0). */
	int (*run_timers)(void *ctx, uint64_t now, bool *stop);
	/* rps__server_destroy, after the connections went, before the fabric */
	void (*fini)(void *ctx);
	void *ctx;
};

/*
 * The data plane as the control plane sees it: every op, once.
 *
 * RPS__DP_OPS(X) calls X(class, return type, name, (type, param)...) for
 * each op, in the order of struct rps__dp_ops, which it generates (so the
 * two cannot differ); threads.c generates the table over its serving
 * threads from it the same way, so that a new op is one line here.  The
 * class says where an op runs when the server has several instances
 * (threads.c), and is part of the line so that none can be left out:
 *   FIRST        the first instance alone, in place: the caller's thread is
 *                its own (its connections, memory, port: peers and psctl
 *                connect to it only)
 *   PART         per partition: on the instance that serves its `part`
 *   PART_CUSTOM  the same, the instance found by threads.c's own g_<name>
 *   ALL          the whole server: on every instance in turn, nothing to
 *                combine (returns void)
 *   ALL_CUSTOM   the same, the results combined by threads.c's own g_<name>
 * A class not among these does not compile (RPS__DP_CLASS_*).  PART and
 * ALL ops take the server first, as `srv`.
 */
#define RPS__DP_OPS(X) \
	/* ---- the server as a whole */ \
	X(ALL, void, set_member_id, (struct rps__server *, srv), (uint64_t, id)) \
	/* the map's partition count and applied index (CREATE replies carry it) */ \
	X(ALL, void, set_map, (struct rps__server *, srv), (uint32_t, npart), (uint64_t, applied)) \
	/* workers READ the encoded map here (HELLO tells them where) */ \
	X(FIRST, int, map_register, (struct rps__server *, srv), (void *, buf), (size_t, len)) \
	X(FIRST, void, map_deregister, (struct rps__server *, srv)) \
	/* memory the other servers READ (a shipped partition): register, give up */ \
	X(FIRST, int, mem_register, (struct rps__server *, srv), (void *, buf), (size_t, len), \
	  (struct rps__mr **, mr)) \
	X(FIRST, void, mem_deregister, (struct rps__mr *, mr)) \
	/* the key by which c's peer READs mr: a window of c alone (-EAGAIN: \
	 * no room to bind one now; try again later) */ \
	X(FIRST, int, mem_window, (struct srv_conn *, c), (struct rps__mr *, mr), (uint32_t *, rkey)) \
	X(FIRST, uint16_t, port, (const struct rps__server *, srv)) \
	X(FIRST, uint32_t, shard_elems, (const struct rps__server *, srv)) \
	X(ALL_CUSTOM, void, stats, (struct rps__server *, srv), (struct rps__dp_stats *, st)) \
	\
	/* ---- connections of peers and psctl */ \
	X(FIRST, void, conn_reply, (struct srv_conn *, c), (unsigned, type), (uint64_t, req_id), (int32_t, status), \
	  (const void *, body), (size_t, len)) \
	X(FIRST, void, conn_fail, (struct srv_conn *, c), (const char *, why)) \
	X(FIRST, enum conn_role_kind, conn_role, (const struct srv_conn *, c)) \
	X(FIRST, uint64_t, conn_peer_id, (const struct srv_conn *, c)) \
	X(FIRST, bool, conn_dead, (const struct srv_conn *, c)) \
	X(FIRST, const char *, conn_name, (const struct srv_conn *, c))	/* the other end's address */ \
	X(FIRST, size_t, conn_msg_max, (const struct srv_conn *, c)) \
	/* READ len bytes at (raddr, rkey) of the other end into a buffer of the \
	 * connection; on_read_done follows.  0 or a negative errno. */ \
	X(FIRST, int, conn_read, (struct srv_conn *, c), (uint64_t, raddr), (uint32_t, rkey), (uint64_t, len)) \
	/* Put on the wire now what the transport holds back until the loop \
	 * polls again (rps__cq_flush): before blocking for long, an fsync. \
	 * May be NULL (nothing held back). */ \
	X(FIRST, void, flush, (struct rps__server *, srv)) \
	/* Start connecting to the server at uri (to_id: the member expected, \
	 * 0: any).  The loop goes on meanwhile; hooks.peer_dialed says how it \
	 * went.  0, or a negative errno (logged): no peer_dialed then. */ \
	X(FIRST, int, peer_dial, (struct rps__server *, srv), (const char *, uri), (uint64_t, to_id)) \
	/* where member id is reached, for the replication stream (NULL uri: forget it) */ \
	X(ALL_CUSTOM, int, repl_peer, (struct rps__server *, srv), (uint64_t, id), (const char *, uri)) \
	\
	/* ---- partitions */ \
	/* the partition's view; served from now on: parked pushes in their turn are taken */ \
	X(PART, void, part_set, (struct rps__server *, srv), (uint32_t, part), (const struct rps__dp_part *, view)) \
	/* empty regions of every tensor known (a new cluster, a loss accepted) */ \
	X(PART, void, part_create, (struct rps__server *, srv), (uint32_t, part)) \
	/* publish this epoch in every header (RPS__EPOCH_MOVED: it moved) */ \
	X(PART, void, part_publish, (struct rps__server *, srv), (uint32_t, part), (uint64_t, epoch)) \
	/* refuse what waits for the partition (held pushes, WAITs) */ \
	X(PART, void, part_refuse, (struct rps__server *, srv), (uint32_t, part)) \
	/* seal every lock word: true when all are sealed */ \
	X(PART, bool, part_fence, (struct rps__server *, srv), (uint32_t, part)) \
	X(PART, void, part_unfence, (struct rps__server *, srv), (uint32_t, part), (uint64_t, epoch)) \
	/* the image a move ships (malloc'ed), then forget the parked pushes it carries */ \
	X(PART, int, part_serialize, (struct rps__server *, srv), (uint32_t, part), (uint64_t, epoch), \
	  (void **, img), (size_t *, len)) \
	X(PART, void, part_forget_parked, (struct rps__server *, srv), (uint32_t, part)) \
	/* validate then install an image as a move's destination: nothing changes if refused */ \
	X(PART, int, part_install, (struct rps__server *, srv), (uint32_t, part), (uint64_t, epoch), \
	  (const void *, img), (size_t, len)) \
	/* free the partition's regions (revokes remote access) and forget \
	 * its parked pushes */ \
	X(PART, void, part_drop, (struct rps__server *, srv), (uint32_t, part)) \
	/* seeding a backup (control/repl_place.c): the primary's replication \
	 * seq of the partition (at the cut), and, on the joiner, validate and \
	 * install the image as a backup (regions kept, not served; a sync \
	 * step in progress and its parked pushes kept, taken on only once \
	 * promoted) whose stream goes on after seq: nothing changes if refused */ \
	X(PART, uint64_t, repl_seq, (struct rps__server *, srv), (uint32_t, part)) \
	/* a move's new owner: the stream goes on after seq (the old owner's \
	 * at the fence), which the partition's backups applied last */ \
	X(PART, void, part_repl_seq_set, (struct rps__server *, srv), (uint32_t, part), (uint64_t, seq)) \
	X(PART, int, part_install_backup, (struct rps__server *, srv), (uint32_t, part), (uint64_t, epoch), \
	  (const void *, img), (size_t, len), (uint64_t, seq)) \
	/* the primary: a replica (backup or joiner) of the partition whose \
	 * replication stream broke before it confirmed an update, so that it \
	 * no longer holds what the partition holds; 0 if none (or the map \
	 * dropped it already) */ \
	X(PART, uint64_t, part_diverged, (struct rps__server *, srv), (uint32_t, part)) \
	/* the primary: is its replication stream to member id up (dialed, \
	 * paired, not broken)?  If not, it is dialed.  A planned switch \
	 * hands over only once it is up */ \
	X(PART, bool, part_stream_up, (struct rps__server *, srv), (uint32_t, part), (uint64_t, id)) \
	/* tests: a crc32c of what this server holds of tensor name's partition \
	 * (versions, parameters, optimizer state, clocks, applied push ids): \
	 * 0, or -ENOENT if nothing */ \
	X(PART, int, part_digest, (struct rps__server *, srv), (const char *, name), (uint32_t, part), \
	  (uint32_t *, crc), (uint64_t *, versions), (uint32_t *, nshards)) \
	/* a FAILOVER made us its primary: serve what we backed up, under epoch \
	 * (lock words unlocked anew, a sync step in progress a seeding brought \
	 * kept, the stream's seq continued; partition.c) */ \
	X(PART, void, part_promote, (struct rps__server *, srv), (uint32_t, part), (uint64_t, epoch)) \
	\
	/* ---- workers */ \
	/* psctl remove-rank: rank leaves tensor name ("": every sync and \
	 * bounded one) for good; tensors it was removed from now, or a \
	 * negative errno (message in rps__errbuf) */ \
	X(ALL_CUSTOM, int, rank_remove, (struct rps__server *, srv), (const char *, name), (int, rank)) \
	\
	/* ---- checkpoints */ \
	/* the highest step of each sync tensor served here (malloc'ed); with \
	 * serving threads (threads.c) each thread is held at its own at once, \
	 * so none moves past what it answered before hold_tensor */ \
	X(ALL_CUSTOM, uint32_t, hold_steps, (struct rps__server *, srv), (struct rps__ckpt_target **, out)) \
	/* apply no step of this sync tensor past step */ \
	X(ALL, void, hold_tensor, (struct rps__server *, srv), (const char *, name), (uint64_t, step)) \
	X(ALL, void, hold_release, (struct rps__server *, srv)) \
	X(ALL_CUSTOM, bool, hold_reached, (struct rps__server *, srv)) \
	/* consume what waited and may go on now */ \
	X(ALL, void, drain, (struct rps__server *, srv)) \
	X(ALL_CUSTOM, int, take, (struct rps__server *, srv), (struct rps__dp_copy *, copy)) \
	X(FIRST, void, copy_free, (struct rps__dp_copy *, copy)) \
	/* restore: the tensor (created if unknown; -EEXIST with other options) */ \
	X(ALL_CUSTOM, int, restore_tensor, (struct rps__server *, srv), (const char *, file), (const char *, name), \
	  (const struct rps__tensor_spec *, spec), (struct srv_tensor **, t)) \
	/* 1 installed, 0 not served here, or a negative errno */ \
	X(PART_CUSTOM, int, restore_shard, (struct rps__server *, srv), (const char *, file), \
	  (struct srv_tensor *, t), (const struct rps__dp_shard *, cs)) \
	\
	/* ---- primary lease (control/repl_failover.c) */ \
	/* this server may acknowledge pushes of partitions with backups until \
	 * until_ns on rps__dp_boottime_ns()'s clock, not after */ \
	X(ALL, void, set_lease, (struct rps__server *, srv), (uint64_t, until_ns))

/* The classes: each expands to nothing, an unknown one to an error. */
#define RPS__DP_CLASS_FIRST
#define RPS__DP_CLASS_PART
#define RPS__DP_CLASS_PART_CUSTOM
#define RPS__DP_CLASS_ALL
#define RPS__DP_CLASS_ALL_CUSTOM

/* M applied to each (type, param) pair of an op (at most 8), the results
 * separated by commas (RPS__DP_LIST) or not (RPS__DP_SEQ). */
#define RPS__DP_CAT(a, b) RPS__DP_CAT_(a, b)
#define RPS__DP_CAT_(a, b) a##b
#define RPS__DP_NARGS(...) RPS__DP_NARGS_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, ~)
#define RPS__DP_NARGS_(a1, a2, a3, a4, a5, a6, a7, a8, n, ...) n
#define RPS__DP_LIST(M, ...) RPS__DP_CAT(RPS__DP_LIST_, RPS__DP_NARGS(__VA_ARGS__))(M, __VA_ARGS__)
#define RPS__DP_LIST_1(M, p) M p
#define RPS__DP_LIST_2(M, p, ...) M p, RPS__DP_LIST_1(M, __VA_ARGS__)
#define RPS__DP_LIST_3(M, p, ...) M p, RPS__DP_LIST_2(M, __VA_ARGS__)
#define RPS__DP_LIST_4(M, p, ...) M p, RPS__DP_LIST_3(M, __VA_ARGS__)
#define RPS__DP_LIST_5(M, p, ...) M p, RPS__DP_LIST_4(M, __VA_ARGS__)
#define RPS__DP_LIST_6(M, p, ...) M p, RPS__DP_LIST_5(M, __VA_ARGS__)
#define RPS__DP_LIST_7(M, p, ...) M p, RPS__DP_LIST_6(M, __VA_ARGS__)
#define RPS__DP_LIST_8(M, p, ...) M p, RPS__DP_LIST_7(M, __VA_ARGS__)
#define RPS__DP_SEQ(M, ...) RPS__DP_CAT(RPS__DP_SEQ_, RPS__DP_NARGS(__VA_ARGS__))(M, __VA_ARGS__)
#define RPS__DP_SEQ_1(M, p) M p
#define RPS__DP_SEQ_2(M, p, ...) M p RPS__DP_SEQ_1(M, __VA_ARGS__)
#define RPS__DP_SEQ_3(M, p, ...) M p RPS__DP_SEQ_2(M, __VA_ARGS__)
#define RPS__DP_SEQ_4(M, p, ...) M p RPS__DP_SEQ_3(M, __VA_ARGS__)
#define RPS__DP_SEQ_5(M, p, ...) M p RPS__DP_SEQ_4(M, __VA_ARGS__)
#define RPS__DP_SEQ_6(M, p, ...) M p RPS__DP_SEQ_5(M, __VA_ARGS__)
#define RPS__DP_SEQ_7(M, p, ...) M p RPS__DP_SEQ_6(M, __VA_ARGS__)
#define RPS__DP_SEQ_8(M, p, ...) M p RPS__DP_SEQ_7(M, __VA_ARGS__)
/* an op's parameters as a prototype has them */
#define RPS__DP_DECL(type, param) type param
#define RPS__DP_PARAMS(...) RPS__DP_LIST(RPS__DP_DECL, __VA_ARGS__)

#define RPS__DP_MEMBER(class, ret, name, ...) RPS__DP_CLASS_##class ret (*name)(RPS__DP_PARAMS(__VA_ARGS__));

struct rps__dp_ops {
	RPS__DP_OPS(RPS__DP_MEMBER)
};

/* The clock of primary leases: CLOCK_BOOTTIME, which keeps counting while
 * the machine is suspended, so a frozen server does not wake up believing
 * its lease still holds. */
static inline uint64_t rps__dp_boottime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The real data plane. */
const struct rps__dp_ops *rps__dataplane_ops(void);
/* The same over the instances of rps__server_group_create (threads.c):
 * the srv it takes is the first instance. */
const struct rps__dp_ops *rps__dataplane_ops_group(void);
/* Register the layer above (once, before rps__server_run). */
void rps__dp_set_hooks(struct rps__server *srv, const struct rps__dp_hooks *hooks);

#endif
