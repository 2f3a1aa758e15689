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
struct conn;		/* a connection of the data plane (opaque above it) */
struct tensor;		/* a tensor of the data plane (opaque above it) */

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
	void (*on_message)(void *ctx, struct conn *c, const struct rps__msg_hdr *h, void *body, uint32_t len);
	/* The connection is about to be freed. */
	void (*on_conn_gone)(void *ctx, struct conn *c);
	/* A READ posted with rps__dp_ops.conn_read finished (buf: what it read). */
	void (*on_read_done)(void *ctx, struct conn *c, bool ok, const void *buf);
	void (*on_send_done)(void *ctx, struct conn *c);
	/* May this peer connect?  0, or a negative errno and *why. */
	int (*accept_peer)(void *ctx, uint64_t from_id, uint64_t to_id, const char *addr, const char **why);
	void (*peer_attached)(void *ctx, struct conn *c);
	/* A peer_dial is over: c the connection (attached, its peer id
	 * set), or NULL: it failed. */
	void (*peer_dialed)(void *ctx, const char *uri, uint64_t to_id, struct conn *c);
	/* Every turn of the loop: ms until due, or a negative errno to stop
	 * with it; *stop set: stop cleanly (0). */
	int (*run_timers)(void *ctx, uint64_t now, bool *stop);
	/* rps__server_destroy, after the connections went, before the fabric */
	void (*fini)(void *ctx);
	void *ctx;
};

/* The data plane as the control plane sees it. */
struct rps__dp_ops {
	/* ---- the server as a whole */
	void (*set_member_id)(struct rps__server *srv, uint64_t id);
	/* the map's partition count and applied index (CREATE replies carry it) */
	void (*set_map)(struct rps__server *srv, uint32_t npart, uint64_t applied);
	/* workers READ the encoded map here (HELLO tells them where) */
	int (*map_register)(struct rps__server *srv, void *buf, size_t len);
	void (*map_deregister)(struct rps__server *srv);
	/* memory the other servers READ (a shipped partition): register, give up */
	int (*mem_register)(struct rps__server *srv, void *buf, size_t len, struct rps__mr **mr);
	void (*mem_deregister)(struct rps__mr *mr);
	/* the key by which c's peer READs mr: a window of c alone (-EAGAIN:
	 * no room to bind one now; try again later) */
	int (*mem_window)(struct conn *c, struct rps__mr *mr, uint32_t *rkey);
	uint16_t (*port)(const struct rps__server *srv);
	uint32_t (*shard_elems)(const struct rps__server *srv);
	void (*stats)(struct rps__server *srv, struct rps__dp_stats *st);

	/* ---- connections of peers and psctl */
	void (*conn_reply)(struct conn *c, unsigned type, uint64_t req_id, int32_t status, const void *body,
			   size_t len);
	void (*conn_fail)(struct conn *c, const char *why);
	enum conn_role_kind (*conn_role)(const struct conn *c);
	uint64_t (*conn_peer_id)(const struct conn *c);
	bool (*conn_dead)(const struct conn *c);
	const char *(*conn_name)(const struct conn *c);	/* the other end's address */
	size_t (*conn_msg_max)(const struct conn *c);
	/* READ len bytes at (raddr, rkey) of the other end into a buffer of the
	 * connection; on_read_done follows.  0 or a negative errno. */
	int (*conn_read)(struct conn *c, uint64_t raddr, uint32_t rkey, uint64_t len);
	/* Put on the wire now what the transport holds back until the loop
	 * polls again (rps__cq_flush): before blocking for long, an fsync.
	 * May be NULL (nothing held back). */
	void (*flush)(struct rps__server *srv);
	/* Start connecting to the server at uri (to_id: the member expected,
	 * 0: any).  The loop goes on meanwhile; hooks.peer_dialed says how it
	 * went.  0, or a negative errno (logged): no peer_dialed then. */
	int (*peer_dial)(struct rps__server *srv, const char *uri, uint64_t to_id);
	/* where member id is reached, for the replication stream (NULL uri: forget it) */
	int (*repl_peer)(struct rps__server *srv, uint64_t id, const char *uri);

	/* ---- partitions */
	/* the partition's view; served from now on: parked pushes in their turn are taken */
	void (*part_set)(struct rps__server *srv, uint32_t part, const struct rps__dp_part *view);
	/* empty regions of every tensor known (a new cluster, a loss accepted) */
	void (*part_create)(struct rps__server *srv, uint32_t part);
	/* publish this epoch in every header (RPS__EPOCH_MOVED: it moved) */
	void (*part_publish)(struct rps__server *srv, uint32_t part, uint64_t epoch);
	/* refuse what waits for the partition (held pushes, WAITs) */
	void (*part_refuse)(struct rps__server *srv, uint32_t part);
	/* seal every lock word: true when all are sealed */
	bool (*part_fence)(struct rps__server *srv, uint32_t part);
	void (*part_unfence)(struct rps__server *srv, uint32_t part, uint64_t epoch);
	/* the image a move ships (malloc'ed), then forget the parked pushes it carries */
	int (*part_serialize)(struct rps__server *srv, uint32_t part, uint64_t epoch, void **img, size_t *len);
	void (*part_forget_parked)(struct rps__server *srv, uint32_t part);
	/* validate then install an image as a move's destination: nothing changes if refused */
	int (*part_install)(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img, size_t len);
	/* free the partition's regions (revokes remote access) and forget
	 * its parked pushes */
	void (*part_drop)(struct rps__server *srv, uint32_t part);
	/* seeding a backup (control/cp_replicas.c): the primary's replication
	 * seq of the partition (at the cut), and, on the joiner, validate and
	 * install the image as a backup (regions kept, not served; a sync
	 * step in progress and its parked pushes kept, taken on only once
	 * promoted) whose stream goes on after seq: nothing changes if refused */
	uint64_t (*repl_seq)(struct rps__server *srv, uint32_t part);
	/* a move's new owner: the stream goes on after seq (the old owner's
	 * at the fence), which the partition's backups applied last */
	void (*part_repl_seq_set)(struct rps__server *srv, uint32_t part, uint64_t seq);
	int (*part_install_backup)(struct rps__server *srv, uint32_t part, uint64_t epoch, const void *img,
				   size_t len, uint64_t seq);
	/* the primary: a replica (backup or joiner) of the partition whose
	 * replication stream broke before it confirmed an update, so that it
	 * no longer holds what the partition holds; 0 if none (or the map
	 * dropped it already) */
	uint64_t (*part_diverged)(struct rps__server *srv, uint32_t part);
	/* tests: a crc32c of what this server holds of tensor name's partition
	 * (versions, parameters, optimizer state, clocks, applied push ids):
	 * 0, or -ENOENT if nothing */
	int (*part_digest)(struct rps__server *srv, const char *name, uint32_t part, uint32_t *crc,
			   uint64_t *versions, uint32_t *nshards);
	/* a FAILOVER made us its primary: serve what we backed up, under epoch
	 * (lock words unlocked anew, a sync step in progress a seeding brought
	 * kept, the stream's seq continued; partition.c) */
	void (*part_promote)(struct rps__server *srv, uint32_t part, uint64_t epoch);

	/* ---- workers */
	/* psctl remove-rank: rank leaves tensor name ("": every sync and
	 * bounded one) for good; tensors it was removed from now, or a
	 * negative errno (message in rps__errbuf) */
	int (*rank_remove)(struct rps__server *srv, const char *name, int rank);

	/* ---- checkpoints */
	/* the highest step of each sync tensor served here (malloc'ed); with
	 * serving threads (threads.c) each thread is held at its own at once,
	 * so none moves past what it answered before hold_tensor */
	uint32_t (*hold_steps)(struct rps__server *srv, struct rps__ckpt_target **out);
	/* apply no step of this sync tensor past step */
	void (*hold_tensor)(struct rps__server *srv, const char *name, uint64_t step);
	void (*hold_release)(struct rps__server *srv);
	bool (*hold_reached)(struct rps__server *srv);
	/* consume what waited and may go on now */
	void (*drain)(struct rps__server *srv);
	int (*take)(struct rps__server *srv, struct rps__dp_copy *copy);
	void (*copy_free)(struct rps__dp_copy *copy);
	/* restore: the tensor (created if unknown; -EEXIST with other options) */
	int (*restore_tensor)(struct rps__server *srv, const char *file, const char *name,
			      const struct rps__tensor_spec *spec, struct tensor **t);
	/* 1 installed, 0 not served here, or a negative errno */
	int (*restore_shard)(struct rps__server *srv, const char *file, struct tensor *t,
			     const struct rps__dp_shard *cs);

	/* ---- primary lease (control/cp_failover.c) */
	/* this server may acknowledge pushes of partitions with backups until
	 * until_ns on rps__dp_boottime_ns()'s clock, not after */
	void (*set_lease)(struct rps__server *srv, uint64_t until_ns);
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
