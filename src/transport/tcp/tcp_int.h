/*
 * tcp_int.h - what the files of the TCP provider share (tcp.c has the
 * overview, tcp_codec.c the wire format).
 */
#ifndef RPS_TCP_INT_H
#define RPS_TCP_INT_H

#include "transport/provider.h"

#include <endian.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#define TCP_MAGIC		0x74535052u	/* the bytes "RPSt" read as a LE u32 */
#define TCP_VERSION		1
#define TCP_HDR_SIZE		48
#define TCP_RXBUF_SIZE		(128u * 1024)	/* one recv() takes this much (the CQ's buffer) */
#define TCP_DIRECT_MIN		(16u * 1024)	/* payload left to read straight into its destination */
#define TCP_RX_BUDGET		(1u << 20)	/* bytes read from one endpoint per poll, for fairness */
#define TCP_IOV_BATCH		64
#define TCP_EPOLL_BATCH		64
#define TCP_MAX_DEPTH		(1u << 16)
#define TCP_MAX_INLINE		(1u << 16)
#define TCP_UNEXPECTED_BYTES	(64u << 20)	/* early SENDs buffered per endpoint */
#define TCP_MAX_PENDING		1024		/* accepted sockets still sending their hello */
#define TCP_HELLO_TIMEOUT_NS	(10ull * 1000000000ull)
#define TCP_ACCEPT_TIMEOUT_NS	(5ull * 1000000000ull)

/* rkey = generation << MR_INDEX_BITS | slot index.  The generation never is
 * 0, so 0 is never a valid key, and a slot is reused oldest-freed first, so a
 * stale key would only alias after 2^14 reuses of that very slot. */
#define MR_INDEX_BITS		18
#define MR_INDEX_MASK		((1u << MR_INDEX_BITS) - 1)
#define MR_GEN_MAX		((1u << (32 - MR_INDEX_BITS)) - 1)
#define MR_NONE			UINT32_MAX

enum hello_type {
	HELLO_CONNECT = 1,
	HELLO_ACCEPT = 2,
	HELLO_REJECT = 3,
	HELLO_BAD_PROTOCOL = 4,	/* the listener did not understand our hello */
};

enum frame_type {
	F_SEND = 1,
	F_WRITE = 2,
	F_WRITE_IMM = 3,
	F_READ = 4,
	F_CAS = 5,
	F_FADD = 6,
	F_ACK = 16,
	F_NAK = 17,
	F_READ_RESP = 18,
	F_ATOMIC_RESP = 19,
};

/* Host-order images of the wire structures; rps__tcp_hello_put/rps__tcp_hdr_put convert. */
struct wire_hello {
	uint32_t magic;
	uint16_t version;
	uint8_t type;
	uint8_t data_len;
	uint32_t sq_depth;
	uint32_t rq_depth;
	uint8_t data[RPS__PRIVDATA_MAX];
};
#define TCP_HELLO_SIZE ((uint32_t)sizeof(struct wire_hello))
_Static_assert(sizeof(struct wire_hello) == 72, "hello is 72 bytes on the wire");

struct wire_hdr {
	uint8_t type;
	uint8_t status;
	uint16_t flags;
	uint32_t len;
	uint32_t seq;
	uint32_t rkey;
	uint64_t raddr;
	uint64_t arg0;
	uint64_t arg1;
	uint32_t imm;
	uint32_t reserved;
};
_Static_assert(sizeof(struct wire_hdr) == TCP_HDR_SIZE, "frame header is 48 bytes on the wire");
#define HDR_SEQ_OFFSET 8

/* ------------------------------------------------------------------------ */
/* objects                                                                  */

/* A slot names a registered region, or a window on one: a window copies
 * its region's bounds, grants its own rights, and answers only on the
 * endpoint that owns it (memory windows, IB type 2: bound to one QP). */
struct tcp_mr_slot {
	void *addr;
	size_t len;
	int access;		/* remote rights through this key (0: local use only) */
	bool in_use;
	uint32_t gen;
	uint32_t next_free;
	struct tcp_mr *mr;	/* regions */
	uint64_t owner;		/* windows: the endpoint's id (0: a region, any endpoint) */
	uint32_t parent;	/* windows: the region's slot (MR_NONE: a region) */
};

struct tcp_fabric {
	struct rps__fabric base;
	pthread_rwlock_t mr_lock;	/* writers: reg/dereg; readers: every remote access */
	struct tcp_mr_slot *slots;
	uint32_t nslots;
	uint32_t cap;
	uint32_t free_head;		/* FIFO of freed slots */
	uint32_t free_tail;
	uint32_t nwindows;		/* slots that are windows (mr_lock) */
	_Atomic uint64_t next_ep_id;	/* window owners: never reused, unlike pointers */
};

struct tcp_mr {
	struct rps__mr base;
	uint32_t index;
};

struct tcp_cq {
	struct rps__cq base;
	int epfd;			/* endpoint sockets + evfd: what rps__cq_fd() hands out */
	int evfd;			/* completions queued outside the engine while armed */
	pthread_mutex_t poll_lock;	/* engine runs vs endpoint close */
	pthread_mutex_t lock;		/* the completion ring */
	struct rps__wc *ring;
	uint32_t cap;			/* power of two; grows, never loses a completion */
	uint32_t head;
	uint32_t count;
	bool armed;
	/* Endpoints whose target responses wait to be flushed (poll_lock):
	 * the application usually answers a push within the same round of
	 * polling, and its SEND then leaves in the same write as the ACK and
	 * atomic response, so the initiator wakes once, not twice. */
	struct tcp_ep **deferred;
	uint32_t ndeferred, deferred_cap;
	uint8_t *rxbuf;			/* TCP_RXBUF_SIZE: the endpoints' reads, in turn (poll_lock) */
};

enum txe_kind {
	TXE_OP,		/* one of our requests: lives in struct tcp_op */
	TXE_RESP,	/* ACK / READ_RESP / ATOMIC_RESP from the response pool */
	TXE_NAK,	/* the endpoint's single NAK */
};

/* A run of memory: a frame's payload or a READ's destination is up to
 * RPS__WR_MAX_SGE of them. */
struct tcp_seg {
	uint8_t *addr;
	uint32_t len;
};

/* One outgoing frame: header, and a payload that is written straight from
 * the caller's (or the target region's) memory: the segments of a work
 * request go to the socket as iovecs of one sendmsg, never copied. */
struct tcp_txe {
	struct tcp_txe *next;
	struct tcp_seg seg[RPS__WR_MAX_SGE];	/* the payload, in order */
	uint8_t nseg;
	uint32_t payload_len;	/* of every segment */
	uint32_t sent;		/* bytes of header + payload already written */
	uint32_t src_rkey;	/* READ_RESP: revalidated before every write; 0: none */
	uint8_t kind;
	uint8_t hdr[TCP_HDR_SIZE];
};

struct tcp_op {
	struct tcp_txe txe;	/* first: a TXE_OP is container_of'd back to its op */
	uint64_t wr_id;
	void *local;		/* CAS/FADD: word for the old value */
	struct tcp_seg dst[RPS__WR_MAX_SGE];	/* READ: where the response goes, in order */
	uint8_t ndst;
	uint32_t len;
	uint32_t seq;
	uint8_t op;		/* enum rps__op */
	bool signaled;
	bool fence;
	bool responded;		/* READ/atomic: the response has been placed */
};

struct tcp_recv {
	uint64_t wr_id;
	uint8_t *addr;
	uint32_t len;
};

/* A SEND or WRITE_IMM that arrived before a receive was posted for it. */
struct tcp_unexpected {
	struct tcp_unexpected *next;
	uint32_t seq;
	uint32_t len;		/* SEND: payload bytes; WRITE_IMM: bytes written */
	uint32_t imm;
	bool is_imm;
	uint8_t data[];
};

enum rx_sink {
	SINK_TARGET_MEM,	/* WRITE / WRITE_IMM payload into a registered region */
	SINK_RECV,		/* SEND payload into the posted receive at the ring head */
	SINK_UNEXPECTED,	/* SEND payload into a buffer until a receive is posted */
	SINK_READ_RESP,		/* READ response into the initiator's local buffer */
};

/* An endpoint reads into its CQ's buffer (one per CQ, not per endpoint:
 * a server of thousands of connections holds one), and keeps of it only
 * what parsing leaves, at most a partial header, until its next read. */
struct tcp_rx {
	uint8_t *buf;		/* the CQ's rxbuf while ep_rx runs, else NULL */
	uint32_t start;		/* unparsed bytes are buf[start, end) */
	uint32_t end;
	uint8_t carry[TCP_HDR_SIZE];	/* a header's first bytes, between reads */
	uint32_t ncarry;
	bool in_payload;
	struct wire_hdr hdr;	/* the frame being received */
	enum rx_sink sink;
	uint8_t *dst;
	uint32_t remaining;		/* bytes left for dst (SINK_READ_RESP: in op->dst[seg]) */
	struct tcp_op *op;		/* SINK_READ_RESP */
	uint8_t seg;			/* SINK_READ_RESP: the segment being filled */
	struct tcp_unexpected *unx;	/* SINK_UNEXPECTED */
};

enum tcp_conn_state {
	CONN_OPEN,
	CONN_DRAINING,	/* a NAK is queued: write what is queued, then shut down */
	CONN_CLOSED,	/* out of epoll, nothing more is read or written */
};

#define TCP_RESP_CHUNK 16u	/* responses made at a time */
struct tcp_resp_chunk {
	struct tcp_resp_chunk *next;
	struct tcp_txe e[];
};

struct tcp_ep {
	struct rps__ep base;
	struct tcp_fabric *fab;
	struct tcp_cq *cq;
	uint64_t id;			/* owns the windows bound to it (never 0) */
	int fd;
	pthread_mutex_t lock;
	enum tcp_conn_state conn;
	uint32_t epoll_events;
	bool deferred;			/* in cq->deferred (poll_lock) */

	/* initiator: ops[seq & sq_mask], outstanding seqs are [sq_head, sq_next) */
	struct tcp_op *ops;
	uint32_t sq_depth;
	uint32_t sq_mask;
	uint32_t sq_head;
	uint32_t sq_next;
	uint32_t sq_sent;	/* last op whose frame is fully written */
	uint32_t peer_acked;	/* cumulative ACK from the peer */
	uint32_t rd_unanswered;	/* READ/atomics sent or queued, not answered: FENCE waits */
	struct tcp_txe *held_head;	/* ops waiting behind a FENCE */
	struct tcp_txe *held_tail;
	uint8_t *inline_buf;
	uint32_t max_inline;

	/* outgoing frames, FIFO */
	struct tcp_txe *tx_head;
	struct tcp_txe *tx_tail;
	/* responses: entries made as the peer's requests in flight reach a
	 * new high (most peers keep a few in flight of the hundreds their
	 * sq_depth allows), up to nresp_max; kept until the endpoint goes */
	struct tcp_resp_chunk *resp_chunks;
	uint32_t nresp_made, nresp_max;
	struct tcp_txe *resp_free;
	struct tcp_txe *ack_tail;	/* queued ACK that is the unsent tail: coalesce into it */
	uint32_t ack_queued;		/* watermark carried by the last ACK queued */
	struct tcp_txe nak;

	/* target */
	uint32_t peer_seq;		/* last request executed */
	uint32_t peer_sq_depth;
	struct tcp_rx rx;

	/* receive queue: recvs[i & rq_mask], posted are [rq_head, rq_tail) */
	struct tcp_recv *recvs;
	uint32_t rq_depth;
	uint32_t rq_mask;
	uint32_t rq_head;
	uint32_t rq_tail;
	struct tcp_unexpected *unx_head;
	struct tcp_unexpected *unx_tail;
	uint32_t unx_count;
	uint64_t unx_bytes;
};

struct tcp_pending {
	struct tcp_pending *next;
	struct tcp_pending *prev;
	int fd;
	uint32_t got;
	uint64_t since_ns;
	uint8_t hello[TCP_HELLO_SIZE];
	char peer[64];
};

struct tcp_listener {
	struct rps__listener base;
	struct tcp_fabric *fab;
	int fd;
	int epfd;			/* listening socket + pending sockets */
	struct tcp_pending *pending;	/* newest first */
	struct tcp_pending *pending_tail;	/* the oldest: evicted first when full */
	uint32_t npending;
	uint64_t hello_timeout_ns;
	/* /dev/null, held back: out of descriptors (EMFILE), it is closed to
	 * accept one connection and close it at once, so the backlog drains
	 * and the listener stops reporting work it cannot take (tcp_conn.c) */
	int reserve_fd;
	uint64_t shed, shed_said, shed_said_ns;
};

struct tcp_conn_req {
	struct rps__conn_req base;
	struct tcp_fabric *fab;
	int fd;
	uint32_t peer_sq_depth;
	char peer[64];
};

struct ep_sizes {
	uint32_t sq_depth;
	uint32_t rq_depth;
	uint32_t max_inline;
};

/* ------------------------------------------------------------------------ */
/* small helpers                                                            */

static inline bool seq_le(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) <= 0;
}


/* ------------------------------------------------------------------------ */
/* shared between the files                                                 */

/* tcp_codec.c */
void rps__tcp_hello_put(uint8_t *out, const struct wire_hello *h);
void rps__tcp_hello_get(struct wire_hello *h, const uint8_t *in);
int rps__tcp_hello_check(const struct wire_hello *h, const char *peer);

/* tcp.c */
void rps__tcp_cq_push(struct tcp_cq *cq, struct tcp_ep *ep, uint64_t wr_id, enum rps__wc_status status,
		      enum rps__wc_opcode opcode, uint32_t byte_len, uint32_t imm);
int rps__tcp_cq_pop(struct tcp_cq *cq, struct rps__wc *wc, int n);
void rps__tcp_ep_free(struct tcp_ep *ep);
/* "10.0.0.1:7000" / "[fe80::1]:7000" */
void rps__tcp_sockaddr_str(const struct sockaddr *sa, socklen_t salen, char *buf, size_t len);
int rps__tcp_ep_create(struct tcp_fabric *fab, struct tcp_cq *cq, int fd, const struct ep_sizes *sz,
		       uint32_t peer_sq_depth, const char *peer, struct tcp_ep **out);
int rps__tcp_ep_bind(struct tcp_ep *ep);

/* tcp_send.c */
void rps__tcp_ep_abort(struct tcp_ep *ep);
void rps__tcp_unexpected_free_all(struct tcp_ep *ep);
bool rps__tcp_tx_purge_ops(struct tcp_ep *ep);
void rps__tcp_ep_flush(struct tcp_ep *ep, bool has_fail, uint32_t fail_seq, enum rps__wc_status fail_status);
void rps__tcp_ep_fail(struct tcp_ep *ep);
void rps__tcp_target_nak(struct tcp_ep *ep, uint32_t seq, enum rps__wc_status status);
void rps__tcp_ep_tx_flush(struct tcp_ep *ep);
void rps__tcp_queue_ack(struct tcp_ep *ep);
void rps__tcp_sq_release_held(struct tcp_ep *ep);
void rps__tcp_sq_complete_done(struct tcp_ep *ep);
int rps__tcp_post(struct rps__ep *base, const struct rps__wr *wr, int n);
int rps__tcp_ep_rebase(struct rps__ep *base, const void *from, void *to, size_t len);
void rps__tcp_rq_match(struct tcp_ep *ep);
bool rps__tcp_unexpected_room(const struct tcp_ep *ep, uint32_t len);
void rps__tcp_unexpected_append(struct tcp_ep *ep, struct tcp_unexpected *u);
int rps__tcp_post_recv(struct rps__ep *base, const struct rps__sge *sge, uint64_t wr_id);

/* tcp_engine.c */
void rps__tcp_flush_deferred(struct tcp_cq *cq);
int rps__tcp_cq_poll(struct rps__cq *base, struct rps__wc *wc, int n);

/* tcp_conn.c */
int rps__tcp_listen(struct rps__fabric *base, const char *host, uint16_t port, struct rps__listener **out);
int rps__tcp_listener_fd(struct rps__listener *base);
int rps__tcp_listener_get_request(struct rps__listener *base, struct rps__conn_req **out);
void rps__tcp_listener_close(struct rps__listener *base);
int rps__tcp_accept(struct rps__conn_req *base, struct rps__cq *cq_base, const struct rps__ep_attr *attr,
		    const void *data, size_t len, struct rps__ep **out);
int rps__tcp_reject(struct rps__conn_req *base, const void *data, size_t len);
int rps__tcp_dial_start(struct rps__fabric *base, const char *host, uint16_t port, struct rps__cq *cq_base,
			const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
			struct rps__dial **out);
int rps__tcp_dial_fd(const struct rps__dial *base, short *events);
int rps__tcp_dial_step(struct rps__dial *base, void *reply, size_t *reply_len, struct rps__ep **out);
void rps__tcp_dial_cancel(struct rps__dial *base);
int rps__tcp_connect(struct rps__fabric *base, const char *host, uint16_t port, struct rps__cq *cq_base,
		     const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		     void *reply, size_t *reply_len, struct rps__ep **out);

/* Small helpers of the per-frame path, inline in every file that uses them. */
static inline void rps__tcp_hdr_put(uint8_t *out, const struct wire_hdr *h)
{
	struct wire_hdr w = *h;

	w.flags = htole16(h->flags);
	w.len = htole32(h->len);
	w.seq = htole32(h->seq);
	w.rkey = htole32(h->rkey);
	w.raddr = htole64(h->raddr);
	w.arg0 = htole64(h->arg0);
	w.arg1 = htole64(h->arg1);
	w.imm = htole32(h->imm);
	w.reserved = 0;
	memcpy(out, &w, sizeof(w));
}

static inline void rps__tcp_hdr_get(struct wire_hdr *h, const uint8_t *in)
{
	memcpy(h, in, sizeof(*h));
	h->flags = le16toh(h->flags);
	h->len = le32toh(h->len);
	h->seq = le32toh(h->seq);
	h->rkey = le32toh(h->rkey);
	h->raddr = le64toh(h->raddr);
	h->arg0 = le64toh(h->arg0);
	h->arg1 = le64toh(h->arg1);
	h->imm = le32toh(h->imm);
}

/* The HCA's checks for a remote access: the key names a live region or a
 * window that endpoint ep_id owns, [raddr, raddr + len) lies inside it and
 * the key grants the right
 * (RPS__ACCESS_LOCAL: no right needed).  Returns the local address, or
 * NULL.  mr_lock held for reading, and kept held while the memory is used. */
static inline uint8_t *rps__tcp_mr_target(struct tcp_fabric *fab, uint64_t ep_id, uint32_t rkey, uint64_t raddr,
					  uint64_t len, int access)
{
	uint32_t index = rkey & MR_INDEX_MASK;
	const struct tcp_mr_slot *slot;
	uint64_t start;

	if (index >= fab->nslots)
		return NULL;
	slot = &fab->slots[index];
	if (!slot->in_use || slot->gen != rkey >> MR_INDEX_BITS || (access && !(slot->access & access)) ||
	    (slot->owner && slot->owner != ep_id))
		return NULL;
	start = (uintptr_t)slot->addr;
	if (raddr < start || len > slot->len || raddr - start > slot->len - len)
		return NULL;
	return (uint8_t *)(uintptr_t)raddr;
}

static inline bool rps__tcp_op_wants_response(uint8_t op)
{
	return op == RPS__OP_READ || op == RPS__OP_CAS || op == RPS__OP_FADD;
}

static inline void rps__tcp_tx_append(struct tcp_ep *ep, struct tcp_txe *txe)
{
	txe->next = NULL;
	txe->sent = 0;
	if (ep->tx_tail)
		ep->tx_tail->next = txe;
	else
		ep->tx_head = txe;
	ep->tx_tail = txe;
	ep->ack_tail = NULL;
}

static inline void rps__tcp_ep_complete(struct tcp_ep *ep, uint64_t wr_id, enum rps__wc_status status,
			  enum rps__wc_opcode opcode, uint32_t byte_len, uint32_t imm)
{
	rps__tcp_cq_push(ep->cq, ep, wr_id, status, opcode, byte_len, imm);
}

bool rps__tcp_resp_grow(struct tcp_ep *ep);

static inline struct tcp_txe *rps__tcp_resp_alloc(struct tcp_ep *ep)
{
	struct tcp_txe *txe = ep->resp_free;

	if (!txe && rps__tcp_resp_grow(ep))
		txe = ep->resp_free;
	if (txe)
		ep->resp_free = txe->next;
	return txe;
}

static inline void rps__tcp_resp_free(struct tcp_ep *ep, struct tcp_txe *txe)
{
	txe->next = ep->resp_free;
	ep->resp_free = txe;
}

/* Queue a response (READ_RESP, ATOMIC_RESP, ACK) from the response pool:
 * header h, then len bytes at src of region rkey (none: 0, NULL, 0).  NULL
 * when the pool is empty: the peer exceeded the sq_depth it announced, and
 * the endpoint is failed here. */
static inline struct tcp_txe *rps__tcp_resp_queue(struct tcp_ep *ep, const struct wire_hdr *h, uint8_t *src,
						  uint32_t len, uint32_t rkey)
{
	struct tcp_txe *txe = rps__tcp_resp_alloc(ep);

	if (!txe) {
		rps__tcp_ep_fail(ep);
		return NULL;
	}
	rps__tcp_hdr_put(txe->hdr, h);
	txe->kind = TXE_RESP;
	txe->seg[0] = (struct tcp_seg){ src, len };
	txe->nseg = len ? 1 : 0;
	txe->payload_len = len;
	txe->src_rkey = len ? rkey : 0;
	rps__tcp_tx_append(ep, txe);
	return txe;
}


#endif
