/*
 * client_int.h - what the files of the client library share: the client,
 * its connections, requests and shard ops (client.c has the overview).
 *
 *   client.c    the API: options, connect/close, push/pull/wait, barrier,
 *               retries after a shard moved
 *   tensor_handle.c
 *               tensors (rps_tensor_t): create/open (where their shards
 *               live), info, close
 *   ops.c       the shard op state machines and the resources they hold
 *   progress.c  the progress engine, request completion and control calls
 *   connect.c   connection setup (HELLO, the handshake), the shard map, its
 *               members
 *   dialer.c    many connections made at once (every member's, in parallel)
 *   buffer.c    user memory registered for zero-copy pushes and pulls
 *   group.c     small tensors pushed and pulled as one (rps_group_*)
 *   launch.c    rps_client_opts_from_env: servers, rank and world size from
 *               the launcher's variables
 *   ctl.c       psctl's admin channel to one rdmapsd (ctl.h)
 * (tests/filemaps.sh checks that this names every file of src/client/.)
 */
#ifndef RPS_CLIENT_INT_H
#define RPS_CLIENT_INT_H

#include "proto/auth.h"
#include "proto/proto.h"
#include "proto/shard.h"
#include "proto/smap.h"
#include "common/topo.h"
#include "transport/transport.h"
#include "transport/uri.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include "rdmaps.h"

#define RPS_EXPORT __attribute__((visibility("default")))

#define CTRL_CREDITS 32u	/* must not exceed the server's */
#define NBOUNCE 4u		/* pull bounce buffers per server, at most */
#define STAGING_DEFAULT (256ull << 20)	/* opts.staging_bytes unset */
#define TORN_RETRIES 8		/* torn reads before asking the server to wait */
#define MAX_SLOTS 64u	/* we use at most this many of a server's slots */
/* Connections at most: one per member and serving thread of it (rdmapsd
 * --threads), for the largest cluster a map holds.  cl->conns reserves
 * address space for them all and touches what is used; the completion
 * queue grows to twice CONN_CQ_SHARE per endpoint as endpoints are added,
 * once where the device allows no more (verbs: within its max_cqe, 93
 * endpoints on rxe, thousands on an HCA; rps__conn_begin). */
#define MAX_CONNS (RPS__SMAP_MAX_MEMBERS * RPS__PROTO_THREADS_MAX)
/* A connection's queues: every slot's WRITE, atomic and READ, every
 * bounce buffer's READs, the control sends (sq); every receive the server's
 * send window may fill (rq).  The shared CQ holds both for every endpoint. */
#define CONN_SQ_DEPTH (MAX_SLOTS * 3 + NBOUNCE * 2 + CTRL_CREDITS + 16)
#define CONN_RQ_DEPTH (CTRL_CREDITS + MAX_SLOTS + 4 + RPS__STEP_DONE_WINDOW)
#define CONN_CQ_SHARE (CONN_SQ_DEPTH + CONN_RQ_DEPTH)
#define CQ_INITIAL_CONNS 2u	/* the CQ is first sized for this many (then grown) */
#define PROBE_MS 500	/* a connection waited on this long without a completion is probed */
#define PROBE_LEN 64
/* A probe unanswered this long: the connection is lost.  Verbs gives up
 * by itself after its retries (about 2 s); TCP to a host that died
 * silently (or to a stopped process) never does: the kernel keeps the
 * connection open and acknowledges nothing.  A server that was only slow
 * is dialed again and its ops resent (ride-through, client.c). */
#define PROBE_DEAD_MS 4000

enum wr_tag {
	TAG_CAS_ACQ = 1,
	TAG_WRITE = 2,
	TAG_CAS_REL = 3,
	TAG_READ = 4,
	TAG_RECV = 5,
	TAG_SEND = 6,
	TAG_PROBE = 7,		/* liveness probe (progress.c), no op */
};

enum op_kind { OP_PUSH, OP_INIT, OP_PULL, OP_LOCK, OP_UNLOCK };

enum op_state {
	ST_QUEUED,	/* waiting for a slot / bounce buffer */
	ST_LOCKING,	/* CAS acquire in flight */
	ST_BACKOFF,	/* lock busy, retry at retry_at */
	ST_WRITING,	/* WRITE_IMM posted, PUSH_ACK awaited */
	ST_RELEASING,	/* CAS release in flight */
	ST_READING,	/* READs in flight */
	ST_WAITING,	/* WAIT message sent, reply awaited */
	ST_WAIT_QUEUED,	/* a WAIT needs a control credit */
	ST_TAKEN,	/* sync, replicated: PUSH_ACK TAKEN came, slot given back, STEP_DONE awaited */
};

struct conn;
struct rps_request;

struct shard_op {
	struct rps_request *req;	/* NULL once its part is reported */
	struct rps_request *owner;	/* the request whose memory holds this op */
	struct rps_tensor *t;
	struct conn *c;
	enum op_kind kind;
	enum op_state state;
	uint32_t shard;
	uint32_t res;		/* slot or bounce buffer index */
	bool has_res;
	uint64_t expected;	/* CAS acquire: the unlocked word we bet on */
	uint64_t held;		/* the locked word we hold */
	uint64_t written_ns;	/* ST_WRITING since (its push posted) */
	uint64_t clock;
	uint64_t push_id;
	uint64_t min_version, min_clock;
	uint64_t seen_min_clock;	/* pull: what the read before its WAIT found */
	const void *src;	/* push: this shard's part of the user buffer */
	float *dst;		/* pull: where the parameters go */
	struct rps_buffer *buf;	/* the registered buffer src/dst lies in (NULL: none) */
	struct rps__mr *src_mr;	/* push: src's region when its WRITE_IMM sends the
				 * gradient from src (zero-copy); NULL: copied to the slot */
	bool zc_dst;		/* pull: the READ scatters the parameters into dst */
	int torn;
	bool cas_done, cas_ok;	/* speculative push: the acquire CAS came back */
	bool in_slot;		/* push: its gradient is in the server's slot */
	bool ack_done;		/* ... and the server's PUSH_ACK */
	bool die_mid_write;	/* test hook: kill-mid-push chose this op */
	bool shard_turn;	/* counted in t->shard_busy: one of the shard's pushes out */
	bool chained;		/* posted under the word of the push before it, no CAS */
	bool retried;		/* refused, and sent again by a retry (client.c): its fate is the resend's */
	uint64_t epoch;		/* its partition's epoch in the route it was sent by */
	uint64_t incarnation;	/* its server's (hello), when it was routed */
	int result;		/* what rps__op_report() said */
	int ack_status;
	uint64_t ack_lock;	/* the lock word the server left */
	uint32_t backoff_us;
	uint64_t retry_at;
	uint32_t ctrl;		/* control entry of a WAIT */
	struct shard_op *next;	/* queue link */
	struct shard_op *anext, *aprev;	/* the connection's active list */
};

enum req_kind { REQ_SHARDS, REQ_CTRL };

/* A moved shard, or the old owner's memory already deregistered (the
 * remote access error took the connection with it: the refresh connects
 * again), or a connection lost: worth a look at the map and a resend. */
static inline bool rps__retryable(int status)
{
	return status == RPS_ESTALE_EPOCH || status == -EFAULT || status == -ECONNRESET;
}

/*
 * Does a part's failure `status` take the place of the request's status
 * `cur` so far?  The first failure does, unless it is one a retry may mend
 * (rps__retryable) and this one is not: a request whose status were the
 * mendable one is retried (client.c, retry_stale), only its mendable parts
 * are sent again, and it ends with their outcome, the other part's failure
 * dropped: a pull would return 0 with that shard of its output never
 * written.  (-EALREADY: a resent push the server had, counted as done.)
 */
static inline bool rps__status_overrides(int cur, int status)
{
	return status && (!cur || (rps__retryable(cur) && !rps__retryable(status) && status != -EALREADY));
}

struct rps_request {
	struct rps_client *cl;
	enum req_kind kind;
	int remaining;
	int status;
	bool done;
	bool waited;		/* the caller has its status: free when no op is live */
	int live_ops;		/* ops still in a connection's active list */
	int ntaken;		/* of `remaining`: sync pushes TAKEN, waiting for their steps */
	uint64_t deadline;
	uint64_t min_version_seen;
	uint64_t *version_out;
	struct rps_request *dnext, *dprev;	/* deadline list */
	/* control requests: one reply per server */
	void *replies;		/* nservers reply bodies */
	int32_t *rstatus;
	size_t reply_len;
	char msg[512];		/* one line for rps_last_error() of the waiter */
	uint32_t nops;
	struct shard_op ops[];
};

/*
 * Settled: everything of r not answered yet is a sync push TAKEN into its
 * step, and something was refused or lost (retryable).  Its waiter resends
 * what was refused now rather than after those steps: a TAKEN push
 * completes only with its step, which may wait for another rank's push
 * that was refused too, and that rank's resend for this rank's steps (a
 * primary's lease lapsing mid-step refuses one rank's push of a shard
 * whose step took the other rank's already: a deadlock of the job).
 */
static inline bool rps__req_settled(const struct rps_request *r)
{
	return r->done || (r->ntaken > 0 && r->remaining == r->ntaken && rps__retryable(r->status));
}

struct ctrl_entry {
	bool busy;
	bool prompt;			/* a live server answers it by itself (not a BARRIER) */
	struct rps_request *req;	/* control request ... */
	struct shard_op *op;		/* ... or a pull's WAIT */
	int server;
	uint64_t sent_ns;		/* (prompt ones) */
};

/* How long an op whose server was lost waits for its partition to fail
 * over to a backup (ride-through, client.c). */
#define FAILOVER_WAIT_MS 10000

/* A quorum note (proto.h) at the end of c's server's map buffer, READ
 * into buf (the map buffer, or a probe of its last RPS__PROBE_AREA
 * bytes): notes in c->noq whether it says the server lost the Raft
 * majority (then the line for the user is in cl->noq_text), and returns
 * rps__noq_final(cl).  Lock held. */
bool rps__note_take(struct rps_client *cl, struct conn *c, const void *buf);
/* Can nothing fail over, as far as we can tell: a server said it lost the
 * majority and no other member's connection is alive?  (A server cut off
 * alone says so too, while the others fail its partitions over: a worker
 * that reaches one of them rides through.)  Lock held. */
bool rps__noq_final(const struct rps_client *cl);

struct conn {
	struct rps_client *cl;
	int index;
	uint64_t member_id;	/* the server's id in the shard map */
	uint32_t thread;	/* which of its serving threads (its port + thread) */
	struct rps__uri uri;
	char name[300];
	struct rps__ep *ep;
	bool dead;
	int err;
	/* which connection this is (rps_client.conn_gen when it was made):
	 * the memory keys a server hands out work on that connection only
	 * (its memory windows), so a tensor's keys name the one they came on */
	uint64_t gen;
	char refused[256];	/* err -ECONNREFUSED: the line saying why ("server full: ..."), for its ops */
	uint64_t lost_ns;	/* when an established connection was lost, or a member
				 * whose partitions have backups could not be reached
				 * (0: never) */
	int dial_err;		/* that member: why it could not be reached (0: it was) */
	/* the epoch of each partition its member owned in our map when we
	 * lost it (0: not its; NULL: not lost, or no memory): one it owns
	 * under another epoch since was given to it after that, which the
	 * control plane does only to a member that lives (a move's
	 * destination installed it, a switch's backup confirmed, a failover
	 * picked one in contact): dial it again now (redial_wanted) */
	uint64_t *lost_epochs;
	uint32_t nlost_epochs;
	bool answered;		/* rps__conn_setup: the server answered (it lives), if only to refuse */
	/* lost to a flush: the peer's host closed it (a process that exits,
	 * or a live server that let it go), not silence: dialing it again
	 * costs one connect, refused at once if the process is gone, so it
	 * is dialed again at once (redial_wanted), once */
	bool peer_closed;
	bool noq;		/* its server's quorum note says it lost the majority */
	uint64_t busy_ns;	/* when its active list last became non-empty */
	uint64_t wc_ns;		/* its last successful completion */
	uint64_t rx_ns;		/* its last message from the server (a SEND: the process, not its NIC) */
	uint64_t probe_ns;	/* its last liveness probe */
	bool probing;		/* a probe is outstanding */
	struct rps__hello_rep hello;
	/* staging slots: ours mirror the server's */
	char *pbufs;
	struct rps__mr *pbufs_mr;
	uint32_t nslots;
	uint32_t *free_slots, nfree_slots;
	/* pull bounce buffers + their trailing seq words */
	char *bbufs;
	size_t bsize;
	struct rps__mr *bbufs_mr;
	uint32_t nbounce;	/* NBOUNCE, or fewer: the staging budget's share */
	uint64_t staged;	/* bytes of slots and bounce buffers, in cl->staging_used */
	uint32_t *free_bounce, nfree_bounce;
	/* 8-byte atomic results, one per slot */
	uint64_t *atomics;
	struct rps__mr *atomics_mr;
	/* control messages */
	char *rbufs, *sbufs;
	struct rps__mr *rbufs_mr, *sbufs_mr;
	uint32_t nrecv;
	struct ctrl_entry ctrl[CTRL_CREDITS];
	uint32_t nfree_ctrl;
	struct shard_op *slot_op[MAX_SLOTS];	/* slot -> op awaiting its ack */
	struct shard_op *qhead, *qtail;	/* waiting for a slot/bounce buffer */
	struct shard_op *wqhead, *wqtail;	/* waiting for a control credit */
	struct shard_op *shhead, *shtail;	/* locked pushes waiting for their shard */
	struct shard_op *taken;	/* ST_TAKEN pushes (linked by next) */
	struct shard_op *active;
};

/* User memory registered with the client's fabric (buffer.c). */
struct rps_buffer {
	struct rps_client *cl;
	char *addr;
	size_t len;
	struct rps__mr *mr;
	uint32_t users;		/* live shard ops reading or writing it */
	struct rps_buffer *next, *prev;
};

struct rps_client {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct rps__fabric *fab;
	struct rps__topo *topo;		/* verbs only: buffers near the HCA; NULL: plain memory */
	struct rps__placement place;
	struct rps__cq *cq;
	uint64_t pushes_fenced;	/* rps__client_pushes_fenced (atomic) */
	uint64_t pushes_chained;	/* rps__client_pushes_chained (atomic) */
	uint64_t pushes_requeued;	/* ... and those of them requeued */
	uint64_t zc_pushes, zc_pulls;	/* rps__client_zcopy (atomic) */
	struct conn *conns;	/* MAX_CONNS reserved (rps__conns_reserve), nservers in use */
	int nservers;
	uint64_t conn_gen;	/* connections made so far (conn.gen) */
	struct rps__smap map;	/* the shard map as last read */
	int map_from;		/* the connection that answered the last map read (-1: none) */
	char *mapbuf;		/* registered: READ target for the map */
	struct rps__mr *mapbuf_mr;
	char *probebuf;		/* registered: READ target for liveness probes */
	struct rps__mr *probebuf_mr;
	/* a server's quorum note (proto.h), from the last map read or probe
	 * that carried one: "" while none says the cluster lost its majority */
	char noq_text[480];
	uint64_t client_id;	/* names our pushes to every server */
	int rank, num_workers, timeout_ms;
	uint32_t shard_elems;
	uint64_t next_push_id;
	pthread_t thread;
	bool thread_started;
	bool stopping;
	bool polling;		/* a thread is in progress_once() */
	bool progress_polling;	/* ... and it is the progress thread */
	int nactive;		/* ops in the connections' active lists */
	pthread_cond_t pcond;	/* the progress thread sleeps here when idle */
	uint64_t spin_ns;	/* busy-poll this long before sleeping */
	uint64_t idle_since;
	int waiters;		/* callers blocked in a wait */
	int wake_fd;
	struct rps_request *deadlines;
	struct shard_op *backoff;	/* ops in ST_BACKOFF (linked by next) */
	struct rps_buffer *buffers;	/* registered by the user (buffer.c) */
	struct rps__mr *implicit_mr;	/* tcp: any memory is a send source (zero-copy
					 * pushes from unregistered memory); NULL: none */
	bool copy_always;	/* rps__client_set_copy: no zero-copy */
	bool verify;		/* crc32c on every push */
	uint64_t staging_bytes;	/* opts.staging_bytes: local staging over all endpoints */
	int dial_ms;		/* a dial's and its handshake's timeout: timeout_ms, or during
				 * rps_client_connect what is left of it (client.c) */
	uint64_t staging_used;	/* registered for staging now (slots and bounce buffers) */
	bool takeover;		/* replaces a dead process of its rank */
	bool taken_over;	/* a server refused us: a newer process has our rank */
	struct rps__keyring *keys;	/* opts.key_file / $RDMAPS_KEY_FILE (NULL: none) */
	bool insecure;		/* no key, yet servers beyond loopback */
	bool keys_local;	/* keys: this user's loopback key (loopback servers only) */
	int fault_kill_mid_push;	/* test hooks (common/fault.h, see rdmaps(3)) */
	int fault_efault_all;		/* every connection lost to a remote access error at once */
	int fault_reset_all;		/* ... to a reset (a network blip), the servers alive */
	int fault_stop_after_lock;
	int fault_corrupt_push;
};

struct rps_tensor {
	struct rps_client *cl;
	char name[RPS__NAME_MAX];
	struct rps__tensor_spec spec;
	struct rps__layout layout;
	struct {
		uint32_t id;	/* the tensor's id at that server */
		bool known;
	} *at;			/* per connection (MAX_CONNS) */
	struct {
		int conn;	/* who serves the partition (-1: nobody we know) */
		uint64_t addr;	/* its region of this tensor's shards */
		uint32_t rkey;
		uint64_t epoch;
		uint64_t gen;	/* conn.gen of the connection addr and rkey came on */
	} *part;		/* per partition */
	uint64_t stride;
	uint64_t *lock_guess;	/* per shard: last unlocked lock word seen */
	uint64_t *lock_held;	/* per shard: word held via rps__tensor_lock() */
	uint32_t *shard_busy;	/* per shard: our locked pushes out (a chain) */
	uint64_t clock;		/* pushes issued by this worker */
	/* sync, taking over a rank: pushes of a clock below this may find the
	 * predecessor's contribution already counted (-EALREADY: success) */
	uint64_t resume_until;
	int live_ops;		/* ops still running (one may outlive a timed-out request) */
	bool closing;		/* closed by the user: the last op frees it */
};

/* ---- small helpers --------------------------------------------------- */

static inline uint64_t wrid(void *p, enum wr_tag tag)
{
	return (uint64_t)(uintptr_t)p | (uint64_t)tag;
}

static inline uint64_t wrid_idx(uint32_t idx, enum wr_tag tag)
{
	return ((uint64_t)idx << 3) | (uint64_t)tag;
}

static inline char *slot_buf(struct conn *c, uint32_t s)
{
	return c->pbufs + (size_t)s * c->hello.slot_size;
}

static inline char *bounce_buf(struct conn *c, uint32_t b)
{
	return c->bbufs + (size_t)b * c->bsize;
}

static inline uint64_t *bounce_seq(struct conn *c, uint32_t b)
{
	return (uint64_t *)(bounce_buf(c, b) + c->bsize - 64);
}

static inline void wake_progress(struct rps_client *cl)
{
	uint64_t one = 1;
	ssize_t r = write(cl->wake_fd, &one, sizeof(one));

	(void)r;
}

/* ---- shared between the files ------------------------------------------ */

/* progress.c: requests, their completion, the progress engine */
struct rps_request *rps__req_new(struct rps_client *cl, uint32_t nops);
void rps__req_arm_deadline(struct rps_client *cl, struct rps_request *r);
int rps__req_wait_locked(struct rps_client *cl, struct rps_request *r);
/* ... or until it is settled (rps__req_settled) */
int rps__req_wait_settled_locked(struct rps_client *cl, struct rps_request *r);
void rps__req_collect(struct rps_request *r);
void rps__req_maybe_free(struct rps_request *r);
void rps__req_finish(struct rps_request *r);
void rps__req_part_done_at(struct rps_request *r, int status, const struct conn *c);
void rps__op_report(struct shard_op *op, int status);
const char *rps__status_text(int status);
int rps__ctrl_call(struct rps_client *cl, unsigned type, const void *body, size_t len,
		   const bool *to, size_t reply_len, void *replies, int32_t *rstatus);
void rps__conn_kill(struct rps_client *cl, struct conn *c);
void *rps__progress_main(void *arg);

/* ops.c: shard ops and the resources they hold */
struct shard_op *rps__op_init(struct shard_op *op, struct rps_request *r, struct rps_tensor *t,
			      enum op_kind kind, uint32_t s);
void rps__op_submit(struct shard_op *op);
void rps__active_del(struct conn *c, struct shard_op *op);
void rps__lock_retry(struct shard_op *op);
int rps__ctrl_take(struct conn *c);
int rps__send_ctrl(struct conn *c, uint32_t entry, unsigned type, const void *body, size_t len);
void rps__on_completion(struct rps_client *cl, const struct rps__wc *wc);

/* connect.c: connections and the shard map */
int rps__alloc_reg(struct rps_client *cl, size_t len, int access, char **buf, struct rps__mr **mr);
void rps__free_reg(struct rps_client *cl, char **buf, struct rps__mr **mr, size_t len);
/* One connection made in turn (the seed list's): the parts below, with
 * AUTH and HELLO answered before it returns. */
int rps__conn_setup(struct rps_client *cl, struct conn *c, const struct rps__uri *u, int index);
/* Its parts, for the batch that makes many at once (dialer.c):
 * begin: names c, registers its receive and send buffers; *priv: the
 * connect's private data (with the key's id), *attr: its queue sizes;
 * dialed: the dial over with ret and the server's private data: the
 * refusal as one line, or c's receives posted (*rp: that private data);
 * auth_msg: the AUTH proving we hold the key (*t, *proven: what checks the
 * answer, rps__auth_connect_check); hello_msg: the HELLO; finish: HELLO
 * answered (c->hello), the slots, bounce buffers and atomics it sizes. */
int rps__conn_begin(struct rps_client *cl, struct conn *c, const struct rps__uri *u, int index,
		    struct rps__conn_priv *priv, struct rps__ep_attr *attr);
int rps__conn_dialed(struct rps_client *cl, struct conn *c, int ret, const char *reply, size_t reply_len,
		     struct rps__conn_priv *rp);
int rps__conn_auth_msg(struct rps_client *cl, struct conn *c, const struct rps__conn_priv *req,
		       const struct rps__conn_priv *rep, struct rps__auth *msg, struct rps__auth_transcript *t,
		       struct rps__key *proven);
void rps__conn_hello_msg(const struct rps_client *cl, struct rps__hello *h);
int rps__conn_finish(struct rps_client *cl, struct conn *c);
/* Size c's staging again for the map we hold now (the seed's was sized
 * before the map named the other endpoints).  Only while nothing of ours
 * uses it.  0 or -errno. */
int rps__conn_restage(struct rps_client *cl, struct conn *c);
void rps__conn_free(struct conn *c);
/* c's member could not be reached (its connection lost, or a dial in
 * vain): remember the epochs of the partitions it owns in our map now. */
void rps__conn_note_lost(struct rps_client *cl, struct conn *c);
int rps__map_read_sync(struct rps_client *cl, struct conn *c);
int rps__connect_members(struct rps_client *cl);
int rps__map_refresh(struct rps_client *cl);
/* Does some partition of the map we hold have a backup (a lost server's
 * partitions fail over, so what needs them may wait for that)? */
static inline bool rps__replicated(const struct rps_client *cl)
{
	for (uint32_t p = 0; p < cl->map.npart; p++)
		if (cl->map.parts[p].backups[0])
			return true;
	return false;
}

/* dialer.c: many connections made at once.  A job names its slot in
 * cl->conns (zeroed) and the address; rps__dial_batch() dials them all,
 * then runs their AUTH and HELLO side by side, each within timeout_ms a
 * phase.  On return each job has its outcome: ret 0 (the connection is
 * ready), or the error with its line in err (c->answered says whether
 * the server answered).  A server that closed a connection before its
 * AUTH to make room for others (-EBUSY: a burst of handshakes) is dialed
 * again after a short random wait, within timeout_ms of the batch's
 * start.  Lock held with the poller role (or no progress thread yet). */
struct rps__dial_job {
	int k;			/* the slot */
	struct rps__uri u;
	int ret;
	char err[256];
	/* the batch's own */
	int state;
	struct rps__dial *d;
	uint64_t deadline;
	uint64_t end;		/* the batch's time: dialing again stops here */
	uint32_t busy_tries;	/* dialed again after a server's "busy" (RPS__BUSY_REFUSAL) */
	bool drop;		/* its connection to close, the CQ drained */
	struct rps__conn_priv priv, rp;
	struct rps__auth_transcript t;
	struct rps__key proven;
};
void rps__dial_batch(struct rps_client *cl, struct rps__dial_job *jobs, uint32_t n);

/* tensor.c */
void rps__tensor_opts_defaults(struct rps_tensor_opts *d);
int rps__tensor_refresh(struct rps_client *cl, struct rps_tensor *t);
void rps__tensor_free(struct rps_tensor *t);

/* buffer.c */
struct rps_buffer *rps__buffer_find(struct rps_client *cl, const void *addr, size_t len);
void rps__buffers_free(struct rps_client *cl);

/* client.c */
int rps__submit_and_wait(struct rps_client *cl, struct rps_request *r, rps_request_t **async_out);

#endif
