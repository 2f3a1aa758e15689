/*
 * transport.h - the fabric abstraction between the product and the wire.
 *
 * It speaks RDMA semantics, not sockets: a fabric (device + protection
 * domain), registered memory regions (address, length, lkey, rkey),
 * completion queues, and connected reliable endpoints with the ordering
 * guarantees of an RC queue pair.  Operations: one-sided WRITE,
 * WRITE_WITH_IMM, READ, 8-byte atomic CAS and FETCH_ADD, two-sided
 * SEND/RECV.  Two implementations: verbs/ (real RC QPs over rdma_cm) and
 * src/transport/tcp/ (the same semantics over sockets; the target applies one-sided
 * operations on behalf of the initiator with the bounds and key checks an HCA
 * makes).  Everything above this interface is written once.  This header is
 * what the layers above call; what a provider implements (its ops table and
 * the objects' common heads) is in provider.h, which only the providers and
 * the dispatch (transport.c) include.
 *
 * Contract (both implementations):
 *  - Every function returns 0 (or a count) on success, a negative errno on
 *    failure, and leaves a one-line message in rps__errbuf() saying what
 *    failed and what to do.
 *  - Progress: completions are produced when the consumer calls
 *    rps__cq_poll().  The TCP transport makes progress only inside
 *    rps__cq_poll() of the CQ that an endpoint is bound to (manual progress,
 *    like libfabric's FI_PROGRESS_MANUAL): a process that is the target of
 *    one-sided operations must keep polling that CQ.  Verbs progresses in the
 *    HCA.
 *  - Ordering: operations posted on one endpoint are executed at the target
 *    in posting order, except that a READ or atomic may be overtaken by later
 *    WRITEs/SENDs unless RPS__WR_FENCE is set on the later op (IB rules).
 *    A WRITE followed by a WRITE_IMM or SEND on the same endpoint is placed
 *    before the immediate/receive completion is seen.  Completions of one
 *    endpoint's send queue are delivered in posting order.  Across endpoints
 *    there is no order.
 *  - Errors: a remote access error (bad rkey, out of bounds, missing access
 *    right, misaligned atomic) completes that op with
 *    RPS__WC_REM_ACCESS_ERR, writes nothing, and moves the endpoint to the
 *    error state: every later or outstanding op and every posted receive
 *    completes with RPS__WC_FLUSH_ERR.  A peer that disconnects or dies also
 *    flushes every posted receive and outstanding op with RPS__WC_FLUSH_ERR
 *    (or RPS__WC_RETRY_EXC_ERR), so a consumer that keeps receives posted
 *    always learns that a peer is gone.
 *  - Unsignaled ops produce no completion unless they fail.  The transport
 *    keeps the send queue from overflowing on its own (it signals internally
 *    and swallows those completions); rps__post() returns -EAGAIN when the
 *    send queue is full, and the caller polls and retries.
 *  - rps__post() on one endpoint may be called from several threads.
 *    rps__cq_poll() on one CQ is called by one thread at a time.
 *
 * The files of src/transport/ (tests/filemaps.sh checks that this names
 * each): transport.c, the dispatch to the provider; uri.c, endpoint
 * addresses (uri.h).  The TCP provider is in src/transport/tcp/ (its map:
 * the top comment of tcp/tcp.c).
 */
#ifndef RPS_TRANSPORT_H
#define RPS_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

/* What an IB CM REQ/REP/REJ carries for us.  The kernel CM pads a REQ's
 * private data to 56 bytes; verbs recovers the length of shorter payloads,
 * so keep connect data under 56 bytes to read it back exactly. */
#define RPS__PRIVDATA_MAX 56

struct rps__fabric;
struct rps__mr;
struct rps__cq;
struct rps__ep;
struct rps__listener;
struct rps__conn_req;

enum rps__kind {
	RPS__KIND_TCP = 1,
	RPS__KIND_VERBS = 2,
};

struct rps__fabric_attr {
	enum rps__kind kind;
	const char *device;	/* verbs: device name (NULL: the one that routes to host) */
	const char *host;	/* verbs: an address that selects the device (local to
				 * bind, or remote to resolve); tcp: unused */
};

enum rps__access {
	RPS__ACCESS_LOCAL = 0,
	RPS__ACCESS_REMOTE_WRITE = 1 << 0,
	RPS__ACCESS_REMOTE_READ = 1 << 1,
	RPS__ACCESS_REMOTE_ATOMIC = 1 << 2,
	/* The region's own rkey reaches nothing remotely: peers get at it only
	 * through windows bound to one endpoint each (rps__mw_bind), with at
	 * most the REMOTE_* rights given here. */
	RPS__ACCESS_WINDOWED = 1 << 3,
};

enum rps__op {
	RPS__OP_SEND = 1,
	RPS__OP_WRITE,
	RPS__OP_WRITE_IMM,
	RPS__OP_READ,
	RPS__OP_CAS,
	RPS__OP_FADD,
};

enum rps__wr_flags {
	RPS__WR_SIGNALED = 1 << 0,	/* produce a completion on success */
	RPS__WR_INLINE = 1 << 1,	/* copy the payload at post time; mr may be NULL */
	RPS__WR_FENCE = 1 << 2,		/* wait for earlier READs/atomics first */
};

struct rps__sge {
	void *addr;
	uint32_t len;
	struct rps__mr *mr;	/* registered region holding [addr, addr+len) */
};

/* Scatter/gather entries one work request may carry. */
#define RPS__WR_MAX_SGE 4

/* One work request.  Its local memory is sgl[0 .. num_sge-1]; num_sge 0
 * means 1, so a request that fills only `sge` (the same entry as sgl[0])
 * is a one-entry request.  WRITE, WRITE_IMM and SEND gather the entries
 * in order into one message (the target sees one contiguous payload);
 * READ scatters what it reads over them in order.  CAS/FADD: one entry,
 * the 8-byte aligned local word that receives the old value, raddr must
 * be 8-byte aligned.  The memory of every entry is read (or written)
 * until the request completes, not at post time, unless RPS__WR_INLINE. */
struct rps__wr {
	uint64_t wr_id;
	enum rps__op op;
	int flags;
	union {
		struct rps__sge sge;
		struct rps__sge sgl[RPS__WR_MAX_SGE];
	};
	int num_sge;		/* 0 or 1: sge alone; at most RPS__WR_MAX_SGE */
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm;		/* WRITE_IMM (and SEND, if RPS__WR_IMM is ever needed) */
	uint64_t compare_add;	/* CAS: compare; FADD: the addend */
	uint64_t swap;		/* CAS: the new value */
};

enum rps__wc_status {
	RPS__WC_SUCCESS = 0,
	RPS__WC_FLUSH_ERR,		/* endpoint in error / disconnected */
	RPS__WC_REM_ACCESS_ERR,		/* bad rkey, bounds, rights, alignment */
	RPS__WC_REM_OP_ERR,		/* target could not carry out the op */
	RPS__WC_RETRY_EXC_ERR,		/* peer unreachable / dead */
	RPS__WC_RNR_RETRY_EXC_ERR,	/* peer had no receive posted, for too long */
	RPS__WC_LOC_ERR,		/* local protection / length error */
	RPS__WC_GENERAL_ERR,
};

enum rps__wc_opcode {
	RPS__WC_SEND = 1,
	RPS__WC_WRITE,
	RPS__WC_READ,
	RPS__WC_CAS,
	RPS__WC_FADD,
	RPS__WC_RECV,		/* a SEND arrived in a posted receive */
	RPS__WC_RECV_IMM,	/* a WRITE_IMM consumed a posted receive; byte_len = bytes written */
};

struct rps__wc {
	uint64_t wr_id;
	enum rps__wc_status status;
	enum rps__wc_opcode opcode;	/* valid only when status == SUCCESS */
	uint32_t byte_len;		/* RECV: bytes received */
	uint32_t imm;			/* RECV_IMM: the immediate data */
	struct rps__ep *ep;		/* the endpoint it belongs to */
};

struct rps__ep_attr {
	uint32_t sq_depth;	/* outstanding send-queue WRs (0: 128) */
	uint32_t rq_depth;	/* posted receives (0: 128) */
	uint32_t max_inline;	/* bytes a WR may carry inline (0: 64) */
};

/* The entries of wr (num_sge 0 counts as 1), and the bytes they hold. */
static inline int rps__wr_nsge(const struct rps__wr *wr)
{
	return wr->num_sge > 1 ? wr->num_sge : 1;
}

static inline uint64_t rps__wr_len(const struct rps__wr *wr)
{
	uint64_t len = 0;
	int i, n = rps__wr_nsge(wr);

	for (i = 0; i < n && i < RPS__WR_MAX_SGE; i++)
		len += wr->sgl[i].len;
	return len;
}

/* fabric */
int rps__fabric_open(const struct rps__fabric_attr *attr, struct rps__fabric **out);
void rps__fabric_close(struct rps__fabric *fab);
enum rps__kind rps__fabric_kind(const struct rps__fabric *fab);
const char *rps__fabric_name(const struct rps__fabric *fab);	/* "tcp", "rxe0", "mlx5_0" */
/* Payload bytes this fabric's work requests have put on the wire since it
 * was opened: WRITE and SEND data and atomic operands, not transport headers
 * nor what a READ brings back (the peer sends that).  For benchmarks: what a
 * protocol costs in bytes, the same way on every transport. */
uint64_t rps__fabric_tx_bytes(const struct rps__fabric *fab);
/* Which device is present: 1 if verbs finds at least one RDMA device. */
int rps__verbs_available(void);

/* memory registration: pre-register pools, never per message */
int rps__mr_reg(struct rps__fabric *fab, void *addr, size_t len, int access,
		struct rps__mr **out);
int rps__mr_dereg(struct rps__mr *mr);	/* revokes remote access at once */
/* A local-only region spanning the whole address space, for the sources
 * of WRITE, WRITE_IMM and SEND (not for READ targets nor remote access):
 * with it a caller can send from memory it did not register.  TCP has one
 * (its sends read the caller's memory as they go); verbs says -EOPNOTSUPP
 * (that would be implicit on-demand paging, which we do not use).
 * rps__mr_dereg() releases it. */
int rps__mr_reg_implicit(struct rps__fabric *fab, struct rps__mr **out);
uint32_t rps__mr_rkey(const struct rps__mr *mr);
/* A number no other registration of this process ever had (a pointer to a
 * freed region may come back for the next one): for caches keyed by region. */
uint64_t rps__mr_serial(const struct rps__mr *mr);

/*
 * Memory windows: remote access to a region scoped to one connection.
 * rps__mw_bind() gives ep's peer the rights `access` (REMOTE_* bits, a
 * subset of those mr was registered with) to the whole of mr, through an
 * rkey that is valid on ep alone: the same key used on any other endpoint
 * fails with RPS__WC_REM_ACCESS_ERR, as a guessed one does.  The window
 * dies with ep (rps__ep_close) or with mr (rps__mr_dereg), whichever goes
 * first; a key saved from it fails afterwards.  mr must be registered with
 * RPS__ACCESS_WINDOWED.  Verbs binds a type 2 memory window on ep's QP
 * (a work request: it takes a send-queue slot until a later signaled WR
 * completes, and -EAGAIN says the queue is full); the bind is ordered
 * before whatever is posted on ep after it, so a reply that carries the
 * key finds it valid.  TCP keeps a key table entry owned by ep.
 *
 * rps__fabric_windows() is 1 when windows are scoped as above, 0 when the
 * device has no type 2 windows (or RPS_VERBS_NO_WINDOWS=1 is set): then a
 * WINDOWED region is registered with its REMOTE_* rights, and
 * rps__mw_bind() hands out the region's own key, valid on every
 * connection of this process (checked by the rights still).
 */
int rps__mw_bind(struct rps__ep *ep, struct rps__mr *mr, int access, uint32_t *rkey);
int rps__fabric_windows(const struct rps__fabric *fab);
/* Send-queue slots free on ep now (its depth less what is outstanding). */
uint32_t rps__ep_sq_room(struct rps__ep *ep);

/* Atomic compare-and-swap on a word of a local registered region that is
 * atomic with respect to remote atomics on this fabric (verbs: through a
 * loopback QP, since IBV_ATOMIC_HCA does not order CPU stores against HCA
 * atomics).  *old receives the previous value.  Synchronous. */
int rps__local_cas(struct rps__fabric *fab, struct rps__mr *mr, uint64_t *word,
		   uint64_t compare, uint64_t swap, uint64_t *old);

/* completion queues */
int rps__cq_create(struct rps__fabric *fab, uint32_t depth, struct rps__cq **out);
void rps__cq_destroy(struct rps__cq *cq);
/* Make room for depth completions outstanding at once: a CQ shared by
 * endpoints must hold all their queues' work requests (verbs: a CQ that
 * overruns takes every QP on it down), and a client adds endpoints as it
 * learns of servers.  Never shrinks.  0, or -ENOSPC past what the device
 * allows (the error says how many). */
int rps__cq_grow(struct rps__cq *cq, uint32_t depth);
int rps__cq_poll(struct rps__cq *cq, struct rps__wc *wc, int n);	/* >= 0 completions */
int rps__cq_fd(struct rps__cq *cq);	/* readable when rps__cq_poll may have work */
/* Before sleeping on rps__cq_fd(): arm; if it returns 1, poll once more (a
 * completion that raced with arming is found by that poll); 0 means the
 * fd will wake the caller for anything still to come, so it may sleep at
 * once (TCP, when nothing is queued: saves a syscall per round trip). */
int rps__cq_arm(struct rps__cq *cq);
/* Put on the wire now what the CQ's endpoints hold back for the next poll.
 * TCP holds ACKs (and what is posted behind them) until the consumer polls
 * again, so that they leave with its answers in one write; a consumer about
 * to block for long without polling (an fsync) calls this first.  Verbs
 * holds nothing: a no-op. */
int rps__cq_flush(struct rps__cq *cq);
/* Convenience: poll up to n, blocking up to timeout_ms (-1: forever) when none. */
int rps__cq_wait(struct rps__cq *cq, struct rps__wc *wc, int n, int timeout_ms);

/* connections */
int rps__listen(struct rps__fabric *fab, const char *host, uint16_t port,
		struct rps__listener **out);
uint16_t rps__listener_port(const struct rps__listener *l);	/* useful with port 0 */
int rps__listener_fd(struct rps__listener *l);
/* Non-blocking: -EAGAIN when no request is waiting. */
int rps__listener_get_request(struct rps__listener *l, struct rps__conn_req **out);
const void *rps__conn_req_data(const struct rps__conn_req *req, size_t *len);
/* The connector's address, as rps__ep_peer() will say it ("10.0.2.15:41234"). */
const char *rps__conn_req_peer(const struct rps__conn_req *req);
/* The send-queue depth the connector announced (tcp: it sizes our response
 * pool; 0: not known). */
uint32_t rps__conn_req_peer_sq_depth(const struct rps__conn_req *req);
int rps__accept(struct rps__conn_req *req, struct rps__cq *cq,
		const struct rps__ep_attr *attr, const void *data, size_t len,
		struct rps__ep **out);	/* consumes req */
int rps__reject(struct rps__conn_req *req, const void *data, size_t len);	/* consumes req */
void rps__listener_close(struct rps__listener *l);

/* Blocking connect.  -ECONNREFUSED when the peer rejected: its private data
 * (if any) is copied to reply/reply_len.  On success the accept's private
 * data is copied there.  reply may be NULL; otherwise it must hold
 * RPS__PRIVDATA_MAX bytes and *reply_len is set on return.  timeout_ms < 0
 * waits for ever.  rps__accept() may block until the initiator confirms
 * the connection (verbs: at most 250 ms), so nothing is sent to a live peer
 * that is not ready; a peer that did not confirm by then fails later.  On verbs, a peer's disconnect becomes flushed receives
 * inside rps__cq_poll() or rps__listener_get_request(). */
int rps__connect(struct rps__fabric *fab, const char *host, uint16_t port,
		 struct rps__cq *cq, const struct rps__ep_attr *attr,
		 const void *data, size_t len, int timeout_ms,
		 void *reply, size_t *reply_len, struct rps__ep **out);
/*
 * Non-blocking connect, for an event loop that must not stop for a peer
 * whose host died without a reset.  rps__dial_start() begins (its deadline
 * is timeout_ms from now, which must be >= 0); the loop waits on
 * rps__dial_fd() for *events (fd < 0: nothing to wait on, step again at
 * once) or until the deadline, and calls rps__dial_step(): -EINPROGRESS
 * while it is under way, else it is over and the dial is freed: 0 and *out,
 * or a negative errno, with reply/reply_len as rps__connect() sets them.
 * rps__dial_cancel() frees a dial still under way.  A provider without an
 * asynchronous connect completes the dial inside rps__dial_start() (the
 * blocking rps__connect(), reported by the first step).
 */
struct rps__dial;
int rps__dial_start(struct rps__fabric *fab, const char *host, uint16_t port,
		    struct rps__cq *cq, const struct rps__ep_attr *attr,
		    const void *data, size_t len, int timeout_ms, struct rps__dial **out);
int rps__dial_fd(const struct rps__dial *d, short *events);
int rps__dial_step(struct rps__dial *d, void *reply, size_t *reply_len, struct rps__ep **out);
void rps__dial_cancel(struct rps__dial *d);
/* Disconnect and free.  Completions of this endpoint still queued in its CQ
 * are dropped. */
void rps__ep_close(struct rps__ep *ep);
void rps__ep_set_context(struct rps__ep *ep, void *ctx);
void *rps__ep_context(const struct rps__ep *ep);
const char *rps__ep_peer(const struct rps__ep *ep);	/* "10.0.2.15:7000" */
const char *rps__ep_local(const struct rps__ep *ep);	/* our end of it, the same way */
int rps__ep_is_error(const struct rps__ep *ep);
/* Posted sends (WRITE, WRITE_IMM, SEND) whose local memory lies in
 * [from, from + len) and is not written yet read the same offsets of
 * [to, to + len) instead: the caller copied those bytes there first, and
 * may reuse `from` once this returns (tcp, whose implicit region sends from
 * memory the caller did not register).  -EOPNOTSUPP where posted memory
 * must stay registered until the completion (verbs). */
int rps__ep_rebase(struct rps__ep *ep, const void *from, void *to, size_t len);

/* data movement.  rps__post is all-or-nothing: -EAGAIN when the n WRs do
 * not fit the send queue (none posted), -EINVAL when n exceeds its depth or
 * a local buffer lies outside its region.  Posting to an endpoint in the
 * error state succeeds and completes with RPS__WC_FLUSH_ERR, as IB does.
 * A SEND larger than the posted receive fails with RPS__WC_LOC_ERR at the
 * receiver and RPS__WC_REM_OP_ERR at the sender.  rps__ep_close() may be
 * called from any thread. */
int rps__post(struct rps__ep *ep, const struct rps__wr *wr, int n);
int rps__post_recv(struct rps__ep *ep, const struct rps__sge *sge, uint64_t wr_id);

const char *rps__wc_status_str(enum rps__wc_status s);

#endif
