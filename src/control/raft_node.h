/*
 * raft_node.h - a Raft node (an rps__rnode): the I/O-free core (raft.h)
 * joined to its durable storage (wal.h) and to the application through
 * callbacks.
 *
 * The server's event loop owns one rnode.  It calls rps__rnode_tick() every
 * tick_ms, hands it every RAFT message a peer sent (rps__rnode_recv), and
 * calls rps__rnode_process() after either (once after a batch of them: the
 * proposals and messages of one batch then share one WAL write and sync);
 * process runs the ready/advance loop: persist (WAL, per the fsync policy),
 * then send through the send callback, then apply committed entries through
 * apply, serve reads, and compact the log every compact_every applied
 * entries with a snapshot taken through the snapshot callback.  A leader
 * sends before it persists, and a commit index alone is never synced (see
 * raft_node.c): one fdatasync per node per batch of entries.
 *
 * Opening recovers what the WAL holds: a snapshot goes to restore, the
 * committed entries after it to apply, before open returns; so the state
 * machine is current before the node talks to anyone.
 *
 * Callbacks run inside rnode calls (never concurrently); they must not call
 * back into the rnode, except that apply may queue proposals for later.
 * Not thread-safe.
 */
#ifndef RPS_RAFT_NODE_H
#define RPS_RAFT_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/raft.h"
#include "control/wal.h"

struct rps__rnode;

struct rps__rnode_callbacks {
	/* Send an encoded Raft message to node `to`.  Best effort: a message
	 * that cannot be sent is dropped (Raft retries); return value ignored
	 * except for logging. */
	int (*send)(void *ctx, uint64_t to, const void *buf, size_t len);
	/* A committed NORMAL entry with data (the leader's empty no-op entries
	 * are not passed), in log order, exactly once per process lifetime
	 * after the snapshot it follows. */
	void (*apply)(void *ctx, uint64_t index, uint64_t term, const void *data, size_t len);
	/* A committed membership change (after the core took it into effect). */
	void (*conf_change)(void *ctx, uint64_t index, enum rps__raft_conf_op op, uint64_t node);
	/* Reset the state machine to a snapshot (len 0: the initial state of a
	 * cluster bootstrapped without boot_state; the application then builds
	 * it itself). */
	int (*restore)(void *ctx, uint64_t index, const void *data, size_t len);
	/* Serialize the state machine as of the last applied entry into a
	 * malloc'ed buffer (the rnode frees it).  0 or a negative errno. */
	int (*snapshot)(void *ctx, void **data, size_t *len);
	/* A ReadIndex read (ctx as given to rps__rnode_read) is linearisable
	 * now: the state machine has applied everything up to index. */
	void (*read_ready)(void *ctx, uint64_t read_ctx, uint64_t index);
	/* Role or leader changed (for logging and for the server's duties). */
	void (*role_change)(void *ctx, enum rps__raft_role role, uint64_t leader, uint64_t term);
	/* Optional: what send handed over may wait in the transport until the
	 * caller polls again; called after a leader's messages went to send and
	 * before the WAL sync that follows them, so that they travel while
	 * this node syncs. */
	void (*flush)(void *ctx);
	void *ctx;
};

struct rps__rnode_config {
	uint64_t id;			/* this node, nonzero */
	const uint64_t *peers;		/* bootstrap voters (including id); ignored */
	size_t n_peers;			/*   when the WAL holds state; 0 to join */
	const void *boot_state;		/* a new cluster's initial state machine: the */
	size_t boot_state_len;		/*   bootstrap snapshot's data (copied; optional) */
	const char *dir;		/* WAL + snapshots (created if absent) */
	enum rps__wal_fsync fsync;	/* default durable */
	unsigned election_ticks;	/* 0 = 10 */
	unsigned heartbeat_ticks;	/* 0 = 1 */
	unsigned compact_every;		/* applied entries between snapshots; 0 = 1024 */
	uint64_t seed;			/* randomised timeouts (0: from id and time) */
	struct rps__rnode_callbacks cb;
	/* Test hook, handed to the WAL (rps__wal_opts.sync_fn): called
	 * instead of every sync fsync always asks for.  NULL: the real one. */
	int (*sync_fn)(int fd, bool data_only, void *ctx);
	void *sync_ctx;
};

/* Open the WAL in cfg->dir, recover, create the core.  Errors: those of
 * rps__wal_open (-EBADMSG damaged log, -EBUSY dir in use), -EINVAL, -ENOMEM,
 * or what restore returned; message in rps__errbuf(). */
int rps__rnode_open(const struct rps__rnode_config *cfg, struct rps__rnode **out);
void rps__rnode_close(struct rps__rnode *n);

int rps__rnode_tick(struct rps__rnode *n);
/* An encoded message from a peer: decoded and stepped; -EBADMSG if it
 * does not decode (the caller drops it; nothing changed). */
int rps__rnode_recv(struct rps__rnode *n, const void *buf, size_t len);
/* The same from a connection known to be member peer: a message claiming
 * another sender is dropped (-EPROTO).  The core drops what no peer may send
 * (see rps__raft_step) with -EPROTO too; nothing changes either way. */
int rps__rnode_recv_from(struct rps__rnode *n, uint64_t peer, const void *buf, size_t len);
/* Run ready/advance until the core has nothing more.  A failed WAL write is
 * fatal for the node (-EIO; the process should exit and restart). */
int rps__rnode_process(struct rps__rnode *n);

/* Passthroughs to the core (see raft.h for their errors). */
int rps__rnode_propose(struct rps__rnode *n, const void *data, size_t len, uint64_t *index,
		       uint64_t *term);
int rps__rnode_conf_change(struct rps__rnode *n, enum rps__raft_conf_op op, uint64_t node,
			   uint64_t *index);
int rps__rnode_transfer_leader(struct rps__rnode *n, uint64_t to);
int rps__rnode_read(struct rps__rnode *n, uint64_t read_ctx);
int rps__rnode_campaign(struct rps__rnode *n);
/* Snapshot and compact now (up to the applied index), whatever
 * compact_every says: a leader about to add a learner makes sure the
 * snapshot it will send carries the state machine. */
int rps__rnode_compact(struct rps__rnode *n);

void rps__rnode_status(const struct rps__rnode *n, struct rps__raft_status *st);
int rps__rnode_progress(const struct rps__rnode *n, uint64_t id, struct rps__raft_progress_info *pi);
uint64_t rps__rnode_leader(const struct rps__rnode *n);
/* The last index handed to the state machine. */
uint64_t rps__rnode_applied(const struct rps__rnode *n);
bool rps__rnode_is_leader(const struct rps__rnode *n);
/* The term of the entry applied at index, if the log still has it (so a
 * proposer can tell whether its proposal is the entry that committed there);
 * 0 if not known. */
uint64_t rps__rnode_term_at(const struct rps__rnode *n, uint64_t index);
/* What recovery reported (torn tail cut, snapshots skipped), "" if nothing. */
const char *rps__rnode_recovery_note(const struct rps__rnode *n);

#endif
