/*
 * tcp.c - the TCP provider of the transport interface (transport.h).
 *
 * Gives the product RC queue-pair semantics over stream sockets, for machines
 * with no RDMA device (CI, laptops, plain Ethernet).  The initiator turns each
 * work request into a frame; the target executes one-sided WRITE, READ and
 * atomics on behalf of the initiator, with the key, bounds, rights and
 * alignment checks an HCA makes, and answers with acks and responses.
 *
 * Progress is manual (libfabric's FI_PROGRESS_MANUAL): every piece of engine
 * work - reading sockets, executing requests as target, completing ops as
 * initiator, finishing half-written frames - happens inside rps__cq_poll() of
 * the CQ the endpoint is bound to.  rps__post() only tries one non-blocking
 * writev and never waits for the socket.
 *
 * Wire format.  Every integer is little-endian, whatever the host.
 *
 *   Handshake: the connector sends a 72-byte hello, the listener answers with
 *   one of the same size:
 *     u32 magic "RPSt" | u16 version | u8 type (CONNECT, ACCEPT, REJECT,
 *     BAD_PROTOCOL) | u8 data_len | u32 sq_depth | u32 rq_depth |
 *     u8 private_data[56]
 *   sq_depth is how many requests the sender may have outstanding: the peer
 *   sizes its pool of responses by it.  A listener that cannot parse a hello
 *   answers BAD_PROTOCOL (with its own version) and hangs up.
 *
 *   Then each direction carries frames: a 48-byte header, followed by len
 *   payload bytes for SEND, WRITE, WRITE_IMM and READ_RESP only:
 *     u8 type | u8 status | u16 flags (0) | u32 len | u32 seq | u32 rkey |
 *     u64 raddr | u64 arg0 | u64 arg1 | u32 imm | u32 reserved (0)
 *
 *   Requests (initiator -> target).  seq numbers the initiator's ops, 1, 2,
 *   3...; the target executes them in that order.
 *     SEND        len, payload
 *     WRITE       rkey, raddr, len, payload          (WRITE_IMM: + imm)
 *     READ        rkey, raddr, len = bytes asked
 *     CAS         rkey, raddr, arg0 = compare, arg1 = swap  (8 bytes)
 *     FADD        rkey, raddr, arg0 = addend                (8 bytes)
 *   Responses (target -> initiator), in the order the target executed the
 *   requests they answer:
 *     ACK         seq = W: every request up to W is executed (cumulative,
 *                 one per batch read; a SEND or WRITE_IMM counts once it has
 *                 a posted receive - at most rq_depth wait for one)
 *     READ_RESP   seq, len, payload
 *     ATOMIC_RESP seq, arg0 = the old value
 *     NAK         seq = the refused request, status = enum rps__wc_status,
 *                 arg0 = W as in ACK.  The target's last frame: both
 *                 endpoints are in the error state afterwards.
 *   FENCE never reaches the wire: the initiator holds a fenced request
 *   until its earlier READs and atomics are answered.
 */
#include "config.h"
#include "transport/transport.h"
#include "common/common.h"
#include "common/parse.h"

#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define TCP_MAGIC		0x74535052u	/* the bytes "RPSt" read as a LE u32 */
#define TCP_VERSION		1
#define TCP_HDR_SIZE		48
#define TCP_RXBUF_SIZE		(128u * 1024)	/* one recv() takes this much */
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

/* Host-order images of the wire structures; hello_put/hdr_put convert. */
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

struct tcp_mr_slot {
	void *addr;
	size_t len;
	int access;
	bool in_use;
	uint32_t gen;
	uint32_t next_free;
	struct tcp_mr *mr;
};

struct tcp_fabric {
	struct rps__fabric base;
	pthread_rwlock_t mr_lock;	/* writers: reg/dereg; readers: every remote access */
	struct tcp_mr_slot *slots;
	uint32_t nslots;
	uint32_t cap;
	uint32_t free_head;		/* FIFO of freed slots */
	uint32_t free_tail;
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
};

enum txe_kind {
	TXE_OP,		/* one of our requests: lives in struct tcp_op */
	TXE_RESP,	/* ACK / READ_RESP / ATOMIC_RESP from the response pool */
	TXE_NAK,	/* the endpoint's single NAK */
};

/* One outgoing frame: header, and a payload that is written straight from
 * the caller's (or the target region's) memory. */
struct tcp_txe {
	struct tcp_txe *next;
	const uint8_t *payload;
	uint32_t payload_len;
	uint32_t sent;		/* bytes of header + payload already written */
	uint32_t src_rkey;	/* READ_RESP: revalidated before every write; 0: none */
	uint8_t kind;
	uint8_t hdr[TCP_HDR_SIZE];
};

struct tcp_op {
	struct tcp_txe txe;	/* first: a TXE_OP is container_of'd back to its op */
	uint64_t wr_id;
	void *local;		/* READ: destination; CAS/FADD: word for the old value */
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

struct tcp_rx {
	uint8_t *buf;
	uint32_t start;		/* unparsed bytes are buf[start, end) */
	uint32_t end;
	bool in_payload;
	struct wire_hdr hdr;	/* the frame being received */
	enum rx_sink sink;
	uint8_t *dst;
	uint32_t remaining;
	struct tcp_op *op;		/* SINK_READ_RESP */
	struct tcp_unexpected *unx;	/* SINK_UNEXPECTED */
};

enum tcp_conn_state {
	CONN_OPEN,
	CONN_DRAINING,	/* a NAK is queued: write what is queued, then shut down */
	CONN_CLOSED,	/* out of epoll, nothing more is read or written */
};

struct tcp_ep {
	struct rps__ep base;
	struct tcp_fabric *fab;
	struct tcp_cq *cq;
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
	struct tcp_txe *resp_pool;
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

static uint32_t pow2_at_least(uint32_t v)
{
	uint32_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

static void hello_put(uint8_t *out, const struct wire_hello *h)
{
	struct wire_hello w = *h;

	w.magic = htole32(h->magic);
	w.version = htole16(h->version);
	w.sq_depth = htole32(h->sq_depth);
	w.rq_depth = htole32(h->rq_depth);
	memcpy(out, &w, sizeof(w));
}

static void hello_get(struct wire_hello *h, const uint8_t *in)
{
	memcpy(h, in, sizeof(*h));
	h->magic = le32toh(h->magic);
	h->version = le16toh(h->version);
	h->sq_depth = le32toh(h->sq_depth);
	h->rq_depth = le32toh(h->rq_depth);
}

static void hdr_put(uint8_t *out, const struct wire_hdr *h)
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

static void hdr_get(struct wire_hdr *h, const uint8_t *in)
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

/* Check a received hello: ours, same version, sane sizes.  0 or -EPROTO. */
static int hello_check(const struct wire_hello *h, const char *peer)
{
	if (h->magic != TCP_MAGIC) {
		if (__builtin_bswap32(h->magic) == TCP_MAGIC)
			return rps__seterr(-EPROTO, "tcp handshake with %s: peer encodes its integers big-endian, "
					   "not the little-endian this protocol requires: upgrade its rdmaps", peer);
		return rps__seterr(-EPROTO, "tcp handshake with %s: not an rdmaps tcp transport (magic 0x%08x): "
				   "check the host and port", peer, h->magic);
	}
	if (h->version != TCP_VERSION)
		return rps__seterr(-EPROTO, "tcp handshake with %s: peer speaks protocol version %u, we speak %u: "
				   "run the same rdmaps release on both sides", peer, h->version, TCP_VERSION);
	if (h->data_len > RPS__PRIVDATA_MAX || h->sq_depth == 0 || h->sq_depth > TCP_MAX_DEPTH)
		return rps__seterr(-EPROTO, "tcp handshake with %s: malformed hello (data_len %u, sq_depth %u): "
				   "the peer is broken or not rdmaps", peer, h->data_len, h->sq_depth);
	return 0;
}

static void sockaddr_str(const struct sockaddr *sa, socklen_t salen, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN], serv[8];

	if (getnameinfo(sa, salen, host, sizeof(host), serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(buf, len, "?");
		return;
	}
	if (sa->sa_family == AF_INET6)
		snprintf(buf, len, "[%s]:%s", host, serv);
	else
		snprintf(buf, len, "%s:%s", host, serv);
}

/* Options of a data socket: no Nagle (acks and small ops must leave at
 * once), keepalive so that a peer that vanished without FIN is noticed. */
static void sock_tune(int fd)
{
	int one = 1, idle = 10, intvl = 5, cnt = 3;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

/* Wait for events on a non-blocking socket until deadline (0: forever). */
static int fd_wait(int fd, short events, uint64_t deadline)
{
	struct pollfd pfd = { .fd = fd, .events = events };
	int timeout, ret;

	for (;;) {
		timeout = -1;
		if (deadline) {
			uint64_t now = rps__now_ns();

			if (now >= deadline)
				return -ETIMEDOUT;
			timeout = (int)RPS__MIN((deadline - now + 999999) / 1000000, (uint64_t)INT32_MAX);
		}
		ret = poll(&pfd, 1, timeout);
		if (ret > 0)
			return 0;
		if (ret < 0 && errno != EINTR)
			return -errno;
	}
}

static int fd_write_all(int fd, const void *buf, size_t len, uint64_t deadline)
{
	const uint8_t *p = buf;
	ssize_t n;
	int ret;

	while (len) {
		n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		ret = fd_wait(fd, POLLOUT, deadline);
		if (ret < 0)
			return ret;
	}
	return 0;
}

/* Read exactly len bytes: never more, the bytes after belong to the engine. */
static int fd_read_all(int fd, void *buf, size_t len, uint64_t deadline)
{
	uint8_t *p = buf;
	ssize_t n;
	int ret;

	while (len) {
		n = recv(fd, p, len, MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		ret = fd_wait(fd, POLLIN, deadline);
		if (ret < 0)
			return ret;
	}
	return 0;
}

static int hello_send(int fd, enum hello_type type, const struct ep_sizes *sz,
		      const void *data, size_t len, uint64_t deadline)
{
	struct wire_hello h = {
		.magic = TCP_MAGIC,
		.version = TCP_VERSION,
		.type = (uint8_t)type,
		.data_len = (uint8_t)len,
		.sq_depth = sz ? sz->sq_depth : 1,
		.rq_depth = sz ? sz->rq_depth : 1,
	};
	uint8_t raw[TCP_HELLO_SIZE];

	if (len)
		memcpy(h.data, data, len);
	hello_put(raw, &h);
	return fd_write_all(fd, raw, sizeof(raw), deadline);
}

static int ep_sizes_resolve(const struct rps__ep_attr *attr, struct ep_sizes *sz, const char *what)
{
	sz->sq_depth = attr && attr->sq_depth ? attr->sq_depth : 128;
	sz->rq_depth = attr && attr->rq_depth ? attr->rq_depth : 128;
	sz->max_inline = attr && attr->max_inline ? attr->max_inline : 64;
	if (sz->sq_depth > TCP_MAX_DEPTH || sz->rq_depth > TCP_MAX_DEPTH)
		return rps__seterr(-EINVAL, "%s: sq_depth %u / rq_depth %u exceed the tcp limit of %u: ask for less",
				   what, sz->sq_depth, sz->rq_depth, TCP_MAX_DEPTH);
	if (sz->max_inline > TCP_MAX_INLINE)
		return rps__seterr(-EINVAL, "%s: max_inline %u exceeds the tcp limit of %u: register the buffer instead",
				   what, sz->max_inline, TCP_MAX_INLINE);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* fabric and memory registration                                           */

static int tcp_fabric_open(const struct rps__fabric_attr *attr, struct rps__fabric **out)
{
	struct tcp_fabric *fab;
	int ret;

	fab = calloc(1, sizeof(*fab));
	if (!fab)
		return rps__seterr(-ENOMEM, "tcp fabric: out of memory");
	ret = pthread_rwlock_init(&fab->mr_lock, NULL);
	if (ret) {
		ret = rps__seterr(-ret, "tcp fabric: pthread_rwlock_init: %s", strerror(ret));
		goto err_free;
	}
	fab->base.ops = &rps__tcp_ops;
	fab->base.kind = RPS__KIND_TCP;
	fab->free_head = MR_NONE;
	fab->free_tail = MR_NONE;
	*out = &fab->base;
	return 0;

err_free:
	free(fab);
	return ret;
}

static void tcp_fabric_close(struct rps__fabric *base)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	uint32_t i;

	/* regions the caller forgot: free their handles, nothing else owns them */
	for (i = 0; i < fab->nslots; i++)
		if (fab->slots[i].in_use)
			free(fab->slots[i].mr);
	free(fab->slots);
	pthread_rwlock_destroy(&fab->mr_lock);
	free(fab);
}

static const char *tcp_fabric_name(const struct rps__fabric *fab)
{
	return "tcp";
}

/* Take a slot, oldest freed first; grows the table.  mr_lock held for writing. */
static int mr_slot_alloc(struct tcp_fabric *fab, uint32_t *index)
{
	struct tcp_mr_slot *slots;
	uint32_t cap;

	if (fab->free_head != MR_NONE) {
		*index = fab->free_head;
		fab->free_head = fab->slots[*index].next_free;
		if (fab->free_head == MR_NONE)
			fab->free_tail = MR_NONE;
		return 0;
	}
	if (fab->nslots == fab->cap) {
		if (fab->cap > MR_INDEX_MASK)
			return rps__seterr(-ENOSPC, "mr_reg: %u regions registered, the tcp limit: "
					   "register fewer, larger pools", fab->cap);
		cap = fab->cap ? fab->cap * 2 : 64;
		slots = realloc(fab->slots, cap * sizeof(*slots));
		if (!slots)
			return rps__seterr(-ENOMEM, "mr_reg: out of memory for the region table");
		fab->slots = slots;
		fab->cap = cap;
	}
	*index = fab->nslots++;
	fab->slots[*index].gen = 0;
	return 0;
}

static int tcp_mr_reg(struct rps__fabric *base, void *addr, size_t len, int access, struct rps__mr **out)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	struct tcp_mr_slot *slot;
	struct tcp_mr *mr;
	uint32_t slot_index = 0;
	int ret;

	if (!addr || !len)
		return rps__seterr(-EINVAL, "mr_reg: empty region (addr %p, len %zu): register a real buffer", addr, len);
	if (access & ~(RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC))
		return rps__seterr(-EINVAL, "mr_reg: unknown access bits 0x%x", access);
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return rps__seterr(-ENOMEM, "mr_reg: out of memory");

	pthread_rwlock_wrlock(&fab->mr_lock);
	ret = mr_slot_alloc(fab, &slot_index);
	if (ret)
		goto err_unlock;
	slot = &fab->slots[slot_index];
	slot->gen = slot->gen % MR_GEN_MAX + 1;
	slot->addr = addr;
	slot->len = len;
	slot->access = access;
	slot->in_use = true;
	slot->next_free = MR_NONE;
	slot->mr = mr;
	mr->index = slot_index;
	mr->base.fab = base;
	mr->base.addr = addr;
	mr->base.len = len;
	mr->base.access = access;
	mr->base.rkey = slot->gen << MR_INDEX_BITS | slot_index;
	mr->base.lkey = mr->base.rkey;
	pthread_rwlock_unlock(&fab->mr_lock);
	*out = &mr->base;
	return 0;

err_unlock:
	pthread_rwlock_unlock(&fab->mr_lock);
	free(mr);
	return ret;
}

static int tcp_mr_dereg(struct rps__mr *base)
{
	struct tcp_mr *mr = rps__container_of(base, struct tcp_mr, base);
	struct tcp_fabric *fab = rps__container_of(base->fab, struct tcp_fabric, base);
	struct tcp_mr_slot *slot;

	/* Taking the lock for writing waits out every remote access in flight
	 * (they hold it for reading): once we return, no byte of the region is
	 * touched on behalf of a peer again. */
	pthread_rwlock_wrlock(&fab->mr_lock);
	slot = &fab->slots[mr->index];
	slot->in_use = false;
	slot->mr = NULL;
	slot->next_free = MR_NONE;
	if (fab->free_tail == MR_NONE)
		fab->free_head = mr->index;
	else
		fab->slots[fab->free_tail].next_free = mr->index;
	fab->free_tail = mr->index;
	pthread_rwlock_unlock(&fab->mr_lock);
	free(mr);
	return 0;
}

/* The HCA's checks for a remote access: the key names a live region,
 * [raddr, raddr + len) lies inside it and the region grants the right
 * (RPS__ACCESS_LOCAL: no right needed).  Returns the local address, or
 * NULL.  mr_lock held for reading, and kept held while the memory is used. */
static uint8_t *mr_target(struct tcp_fabric *fab, uint32_t rkey, uint64_t raddr, uint64_t len, int access)
{
	uint32_t index = rkey & MR_INDEX_MASK;
	const struct tcp_mr_slot *slot;
	uint64_t start;

	if (index >= fab->nslots)
		return NULL;
	slot = &fab->slots[index];
	if (!slot->in_use || slot->gen != rkey >> MR_INDEX_BITS || (access && !(slot->access & access)))
		return NULL;
	start = (uintptr_t)slot->addr;
	if (raddr < start || len > slot->len || raddr - start > slot->len - len)
		return NULL;
	return (uint8_t *)(uintptr_t)raddr;
}

static int tcp_local_cas(struct rps__fabric *base, struct rps__mr *mr, uint64_t *word,
			 uint64_t compare, uint64_t swap, uint64_t *old)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	uint64_t expected = compare;

	if ((uintptr_t)word & 7)
		return rps__seterr(-EINVAL, "local_cas: word %p is not 8-byte aligned", (void *)word);
	/* Same lock and same __atomic builtins as the engine uses for remote
	 * CAS/FADD, so the two are atomic with respect to each other. */
	pthread_rwlock_rdlock(&fab->mr_lock);
	if (mr->fab != base || !mr_target(fab, mr->rkey, (uintptr_t)word, 8, RPS__ACCESS_LOCAL)) {
		pthread_rwlock_unlock(&fab->mr_lock);
		return rps__seterr(-EINVAL, "local_cas: word %p is not inside registered region %p+%zu: "
				   "pass the region that holds it", (void *)word, mr->addr, mr->len);
	}
	__atomic_compare_exchange_n(word, &expected, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	pthread_rwlock_unlock(&fab->mr_lock);
	*old = expected;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* completion queues                                                        */

static int tcp_cq_create(struct rps__fabric *base, uint32_t depth, struct rps__cq **out)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	struct tcp_cq *cq;
	int ret;

	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return rps__seterr(-ENOMEM, "cq_create: out of memory");
	cq->base.fab = base;
	cq->cap = pow2_at_least(RPS__MAX(depth, 64u));
	cq->ring = calloc(cq->cap, sizeof(*cq->ring));
	if (!cq->ring) {
		ret = rps__seterr(-ENOMEM, "cq_create: out of memory for %u completions", cq->cap);
		goto err_free_cq;
	}
	cq->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (cq->epfd < 0) {
		ret = rps__seterr(-errno, "cq_create: epoll_create1: %s: raise the open file limit (ulimit -n)",
				  strerror(errno));
		goto err_free_ring;
	}
	cq->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (cq->evfd < 0) {
		ret = rps__seterr(-errno, "cq_create: eventfd: %s: raise the open file limit (ulimit -n)",
				  strerror(errno));
		goto err_close_ep;
	}
	if (epoll_ctl(cq->epfd, EPOLL_CTL_ADD, cq->evfd, &ev)) {
		ret = rps__seterr(-errno, "cq_create: epoll_ctl: %s", strerror(errno));
		goto err_close_ev;
	}
	ret = pthread_mutex_init(&cq->poll_lock, NULL);
	if (ret) {
		ret = rps__seterr(-ret, "cq_create: pthread_mutex_init: %s", strerror(ret));
		goto err_close_ev;
	}
	ret = pthread_mutex_init(&cq->lock, NULL);
	if (ret) {
		ret = rps__seterr(-ret, "cq_create: pthread_mutex_init: %s", strerror(ret));
		goto err_destroy_poll_lock;
	}
	*out = &cq->base;
	return 0;

err_destroy_poll_lock:
	pthread_mutex_destroy(&cq->poll_lock);
err_close_ev:
	close(cq->evfd);
err_close_ep:
	close(cq->epfd);
err_free_ring:
	free(cq->ring);
err_free_cq:
	free(cq);
	return ret;
}

static void tcp_cq_destroy(struct rps__cq *base)
{
	struct tcp_cq *cq = rps__container_of(base, struct tcp_cq, base);

	pthread_mutex_destroy(&cq->lock);
	pthread_mutex_destroy(&cq->poll_lock);
	close(cq->evfd);
	close(cq->epfd);
	free(cq->deferred);
	free(cq->ring);
	free(cq);
}

/* Double the ring, unwrapping it.  cq->lock held. */
static bool cq_grow(struct tcp_cq *cq)
{
	struct rps__wc *ring;
	uint32_t i;

	ring = malloc(2 * (size_t)cq->cap * sizeof(*ring));
	if (!ring)
		return false;
	for (i = 0; i < cq->count; i++)
		ring[i] = cq->ring[(cq->head + i) & (cq->cap - 1)];
	free(cq->ring);
	cq->ring = ring;
	cq->head = 0;
	cq->cap *= 2;
	return true;
}

/* Queue one completion.  A consumer that armed and went to sleep is woken
 * through the eventfd; inside the engine nobody is armed, so the hot path
 * makes no syscall here. */
static void cq_push(struct tcp_cq *cq, struct tcp_ep *ep, uint64_t wr_id, enum rps__wc_status status,
		    enum rps__wc_opcode opcode, uint32_t byte_len, uint32_t imm)
{
	struct rps__wc *wc;
	bool wake = false;
	uint64_t one = 1;

	pthread_mutex_lock(&cq->lock);
	if (cq->count == cq->cap && !cq_grow(cq)) {
		/* out of memory: a lost completion is the least bad outcome */
		pthread_mutex_unlock(&cq->lock);
		return;
	}
	wc = &cq->ring[(cq->head + cq->count) & (cq->cap - 1)];
	wc->wr_id = wr_id;
	wc->status = status;
	wc->opcode = opcode;
	wc->byte_len = byte_len;
	wc->imm = imm;
	wc->ep = &ep->base;
	cq->count++;
	if (cq->armed) {
		cq->armed = false;
		wake = true;
	}
	pthread_mutex_unlock(&cq->lock);
	if (wake && write(cq->evfd, &one, sizeof(one)) < 0) {
		/* the counter cannot overflow at our rate: nothing to do */
	}
}

static int cq_pop(struct tcp_cq *cq, struct rps__wc *wc, int n)
{
	int got = 0;

	pthread_mutex_lock(&cq->lock);
	while (got < n && cq->count) {
		wc[got++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) & (cq->cap - 1);
		cq->count--;
	}
	pthread_mutex_unlock(&cq->lock);
	return got;
}

/* Remove every queued completion of ep, keeping the order of the others. */
static void cq_drop_ep(struct tcp_cq *cq, struct tcp_ep *ep)
{
	uint32_t i, kept = 0, mask;

	pthread_mutex_lock(&cq->lock);
	mask = cq->cap - 1;
	for (i = 0; i < cq->count; i++) {
		struct rps__wc *wc = &cq->ring[(cq->head + i) & mask];

		if (wc->ep != &ep->base)
			cq->ring[(cq->head + kept++) & mask] = *wc;
	}
	cq->count = kept;
	pthread_mutex_unlock(&cq->lock);
}

static int tcp_cq_fd(struct rps__cq *base)
{
	return rps__container_of(base, struct tcp_cq, base)->epfd;
}

static void flush_deferred(struct tcp_cq *cq);

static int tcp_cq_arm(struct rps__cq *base)
{
	struct tcp_cq *cq = rps__container_of(base, struct tcp_cq, base);
	bool wake;
	uint64_t one = 1;

	/* Sockets are level-triggered in the epoll set and need no arming; only
	 * completions already queued (or queued later by another thread) must
	 * make the fd readable.  Nothing may stay held back while the caller
	 * sleeps. */
	pthread_mutex_lock(&cq->poll_lock);
	flush_deferred(cq);
	pthread_mutex_unlock(&cq->poll_lock);
	pthread_mutex_lock(&cq->lock);
	wake = cq->count > 0;
	cq->armed = !wake;
	pthread_mutex_unlock(&cq->lock);
	if (wake && write(cq->evfd, &one, sizeof(one)) < 0)
		return rps__seterr(-errno, "cq_arm: eventfd write: %s", strerror(errno));
	/* Sockets are level-triggered and later completions write the eventfd:
	 * unless something is queued already, the caller may sleep at once. */
	return wake ? 1 : 0;
}

/* ------------------------------------------------------------------------ */
/* endpoint state                                                           */

static void ep_complete(struct tcp_ep *ep, uint64_t wr_id, enum rps__wc_status status,
			enum rps__wc_opcode opcode, uint32_t byte_len, uint32_t imm)
{
	cq_push(ep->cq, ep, wr_id, status, opcode, byte_len, imm);
}

static enum rps__wc_opcode op_wc_opcode(uint8_t op)
{
	switch (op) {
	case RPS__OP_SEND: return RPS__WC_SEND;
	case RPS__OP_WRITE:
	case RPS__OP_WRITE_IMM: return RPS__WC_WRITE;
	case RPS__OP_READ: return RPS__WC_READ;
	case RPS__OP_CAS: return RPS__WC_CAS;
	default: return RPS__WC_FADD;
	}
}

static bool op_wants_response(uint8_t op)
{
	return op == RPS__OP_READ || op == RPS__OP_CAS || op == RPS__OP_FADD;
}

static void ep_set_events(struct tcp_ep *ep)
{
	struct epoll_event ev = { .data.ptr = ep };

	if (ep->conn == CONN_CLOSED)
		return;
	if (ep->conn == CONN_OPEN)
		ev.events = EPOLLIN | (ep->tx_head ? EPOLLOUT : 0);
	else
		ev.events = EPOLLOUT;
	if (ev.events == ep->epoll_events)
		return;
	if (epoll_ctl(ep->cq->epfd, EPOLL_CTL_MOD, ep->fd, &ev) == 0)
		ep->epoll_events = ev.events;
}

static void tx_append(struct tcp_ep *ep, struct tcp_txe *txe)
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

static struct tcp_txe *resp_alloc(struct tcp_ep *ep)
{
	struct tcp_txe *txe = ep->resp_free;

	if (txe)
		ep->resp_free = txe->next;
	return txe;
}

static void resp_free(struct tcp_ep *ep, struct tcp_txe *txe)
{
	txe->next = ep->resp_free;
	ep->resp_free = txe;
}

/* Stop all traffic: out of epoll, socket shut so the peer sees EOF and flushes. */
static void ep_abort(struct tcp_ep *ep)
{
	struct tcp_txe *txe, *next;

	if (ep->conn == CONN_CLOSED)
		return;
	ep->conn = CONN_CLOSED;
	epoll_ctl(ep->cq->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
	shutdown(ep->fd, SHUT_RDWR);
	for (txe = ep->tx_head; txe; txe = next) {
		next = txe->next;
		if (txe->kind == TXE_RESP)
			resp_free(ep, txe);
	}
	ep->tx_head = ep->tx_tail = ep->ack_tail = NULL;
}

static void unexpected_free_all(struct tcp_ep *ep)
{
	struct tcp_unexpected *u, *next;

	for (u = ep->unx_head; u; u = next) {
		next = u->next;
		free(u);
	}
	ep->unx_head = ep->unx_tail = NULL;
	ep->unx_count = 0;
	ep->unx_bytes = 0;
	free(ep->rx.unx);
	ep->rx.unx = NULL;
}

/* Remove our own requests from the outgoing queue: their ops are being
 * flushed and the caller may reuse their buffers at once.  Returns false when
 * the head is one of them half written: the stream cannot carry another
 * frame, the connection must be aborted. */
static bool tx_purge_ops(struct tcp_ep *ep)
{
	struct tcp_txe **link = &ep->tx_head, *txe;
	bool clean = true;

	ep->tx_tail = NULL;
	while ((txe = *link)) {
		if (txe->kind == TXE_OP) {
			if (txe == ep->tx_head && txe->sent)
				clean = false;
			*link = txe->next;
			continue;
		}
		ep->tx_tail = txe;
		link = &txe->next;
	}
	ep->ack_tail = NULL;
	return clean;
}

/* The error state: every outstanding op and posted receive completes, in
 * order, with FLUSH_ERR - except the op numbered fail_seq when has_fail,
 * which gets fail_status.  Unsignaled ops complete too: they failed. */
static void ep_flush(struct tcp_ep *ep, bool has_fail, uint32_t fail_seq, enum rps__wc_status fail_status)
{
	struct tcp_op *op;
	struct tcp_recv *r;

	__atomic_store_n(&ep->base.error, 1, __ATOMIC_RELEASE);
	for (; ep->sq_head != ep->sq_next; ep->sq_head++) {
		op = &ep->ops[ep->sq_head & ep->sq_mask];
		ep_complete(ep, op->wr_id, has_fail && op->seq == fail_seq ? fail_status : RPS__WC_FLUSH_ERR,
			    op_wc_opcode(op->op), 0, 0);
	}
	ep->held_head = ep->held_tail = NULL;
	ep->rd_unanswered = 0;
	for (; ep->rq_head != ep->rq_tail; ep->rq_head++) {
		r = &ep->recvs[ep->rq_head & ep->rq_mask];
		ep_complete(ep, r->wr_id, RPS__WC_FLUSH_ERR, RPS__WC_RECV, 0, 0);
	}
	unexpected_free_all(ep);
}

/* Peer gone, protocol violated, or revoked memory mid-stream: flush and abort. */
static void ep_fail(struct tcp_ep *ep)
{
	tx_purge_ops(ep);
	ep_abort(ep);
	if (!ep->base.error)
		ep_flush(ep, false, 0, RPS__WC_FLUSH_ERR);
}

/* What the target has executed, for ACK and NAK: everything up to peer_seq,
 * but a SEND or WRITE_IMM still waiting for a receive holds the line. */
static uint32_t target_watermark(const struct tcp_ep *ep)
{
	return ep->unx_head ? ep->unx_head->seq - 1 : ep->peer_seq;
}

/* The target refuses request seq: the peer's op gets status, both endpoints
 * go to the error state.  The NAK goes after the responses already queued
 * (they answer earlier requests), then the socket is shut down. */
static void target_nak(struct tcp_ep *ep, uint32_t seq, enum rps__wc_status status)
{
	struct wire_hdr h = { .type = F_NAK, .status = (uint8_t)status, .seq = seq };

	if (ep->conn != CONN_OPEN)
		return;
	h.arg0 = target_watermark(ep);
	if (!tx_purge_ops(ep)) {
		ep_fail(ep);
		return;
	}
	ep_flush(ep, false, 0, RPS__WC_FLUSH_ERR);
	hdr_put(ep->nak.hdr, &h);
	ep->nak.kind = TXE_NAK;
	ep->nak.payload = NULL;
	ep->nak.payload_len = 0;
	ep->nak.src_rkey = 0;
	tx_append(ep, &ep->nak);
	ep->conn = CONN_DRAINING;
	ep_set_events(ep);
}

/* ------------------------------------------------------------------------ */
/* sending                                                                  */

static void tx_release(struct tcp_ep *ep, struct tcp_txe *txe)
{
	if (txe->kind == TXE_OP)
		ep->sq_sent = rps__container_of(txe, struct tcp_op, txe)->seq;
	else if (txe->kind == TXE_RESP)
		resp_free(ep, txe);
}

static void tx_advance(struct tcp_ep *ep, size_t n)
{
	struct tcp_txe *txe;
	uint32_t total, take;

	while (n && (txe = ep->tx_head)) {
		total = TCP_HDR_SIZE + txe->payload_len;
		take = (uint32_t)RPS__MIN((size_t)(total - txe->sent), n);
		txe->sent += take;
		n -= take;
		if (txe == ep->ack_tail)
			ep->ack_tail = NULL;	/* partly on the wire: no longer rewritable */
		if (txe->sent < total)
			break;
		ep->tx_head = txe->next;
		if (!ep->tx_head)
			ep->tx_tail = NULL;
		tx_release(ep, txe);
	}
}

/* A READ response is read from the target region when it is written to the
 * socket, not when the request was executed: check that the region was not
 * deregistered meanwhile.  mr_lock held for reading. */
static bool tx_sources_valid(struct tcp_ep *ep, struct tcp_txe *first, int count)
{
	struct tcp_txe *txe;
	uint32_t done;
	int i;

	for (txe = first, i = 0; txe && i < count; txe = txe->next, i++) {
		if (!txe->src_rkey)
			continue;
		done = txe->sent > TCP_HDR_SIZE ? txe->sent - TCP_HDR_SIZE : 0;
		if (!mr_target(ep->fab, txe->src_rkey, (uintptr_t)(txe->payload + done),
			       txe->payload_len - done, RPS__ACCESS_REMOTE_READ))
			return false;
	}
	return true;
}

/* Write as much of the outgoing queue as the socket takes, without waiting.
 * What is left is finished from cq_poll when EPOLLOUT fires. */
static void ep_tx_flush(struct tcp_ep *ep)
{
	struct iovec iov[TCP_IOV_BATCH];
	struct msghdr msg = { .msg_iov = iov };
	struct tcp_txe *txe;
	int cnt, nframes;
	bool need_lock;
	ssize_t n;

	while (ep->tx_head && ep->conn != CONN_CLOSED) {
		cnt = 0;
		nframes = 0;
		need_lock = false;
		for (txe = ep->tx_head; txe && cnt + 2 <= TCP_IOV_BATCH; txe = txe->next, nframes++) {
			uint32_t off = txe->sent;

			if (off < TCP_HDR_SIZE) {
				iov[cnt].iov_base = txe->hdr + off;
				iov[cnt++].iov_len = TCP_HDR_SIZE - off;
				off = 0;
			} else {
				off -= TCP_HDR_SIZE;
			}
			if (txe->payload_len > off) {
				iov[cnt].iov_base = (void *)(uintptr_t)(txe->payload + off);
				iov[cnt++].iov_len = txe->payload_len - off;
				need_lock |= txe->src_rkey != 0;
			}
		}
		msg.msg_iovlen = (size_t)cnt;
		if (need_lock) {
			pthread_rwlock_rdlock(&ep->fab->mr_lock);
			if (!tx_sources_valid(ep, ep->tx_head, nframes)) {
				pthread_rwlock_unlock(&ep->fab->mr_lock);
				ep_fail(ep);
				return;
			}
		}
		n = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (need_lock)
			pthread_rwlock_unlock(&ep->fab->mr_lock);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			ep_fail(ep);	/* EPIPE, ECONNRESET: the peer is gone */
			return;
		}
		tx_advance(ep, (size_t)n);
	}
	if (!ep->tx_head && ep->conn == CONN_DRAINING) {
		/* the NAK is out: FIN after it, and nothing more from this socket */
		shutdown(ep->fd, SHUT_WR);
		epoll_ctl(ep->cq->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
		ep->conn = CONN_CLOSED;
		return;
	}
	ep_set_events(ep);
}

/* Queue one cumulative ACK for what the target executed since the last one;
 * folded into the previous ACK while that one is still the unsent tail. */
static void queue_ack(struct tcp_ep *ep)
{
	struct wire_hdr h = { .type = F_ACK };
	struct tcp_txe *txe;
	uint32_t w;
	uint8_t le[4];

	if (ep->conn != CONN_OPEN)
		return;
	w = target_watermark(ep);
	if (w == ep->ack_queued)
		return;
	ep->ack_queued = w;
	if (ep->ack_tail) {
		uint32_t v = htole32(w);

		memcpy(le, &v, sizeof(le));
		memcpy(ep->ack_tail->hdr + HDR_SEQ_OFFSET, le, sizeof(le));
		return;
	}
	txe = resp_alloc(ep);
	if (!txe) {
		ep_fail(ep);	/* the peer exceeded the sq_depth it announced */
		return;
	}
	h.seq = w;
	hdr_put(txe->hdr, &h);
	txe->kind = TXE_RESP;
	txe->payload = NULL;
	txe->payload_len = 0;
	txe->src_rkey = 0;
	tx_append(ep, txe);
	ep->ack_tail = txe;
}

/* Move ops from the held queue to the wire queue; a FENCE op waits until
 * every earlier READ and atomic is answered. */
static void sq_release_held(struct tcp_ep *ep)
{
	struct tcp_txe *txe;
	struct tcp_op *op;

	while ((txe = ep->held_head)) {
		op = rps__container_of(txe, struct tcp_op, txe);
		if (op->fence && ep->rd_unanswered)
			break;
		ep->held_head = txe->next;
		if (!ep->held_head)
			ep->held_tail = NULL;
		tx_append(ep, txe);
		if (op_wants_response(op->op))
			ep->rd_unanswered++;
	}
}

/* Deliver send-queue completions in posting order: stop at the first op the
 * target has not executed (WRITE/SEND: acked; READ/atomic: answered). */
static void sq_complete_done(struct tcp_ep *ep)
{
	struct tcp_op *op;

	while (ep->sq_head != ep->sq_next) {
		op = &ep->ops[ep->sq_head & ep->sq_mask];
		if (op_wants_response(op->op) ? !op->responded : !seq_le(op->seq, ep->peer_acked))
			break;
		if (op->signaled)
			ep_complete(ep, op->wr_id, RPS__WC_SUCCESS, op_wc_opcode(op->op),
				    op->op == RPS__OP_CAS || op->op == RPS__OP_FADD ? 8 : op->len, 0);
		ep->sq_head++;
	}
}

static int sge_check(const struct tcp_ep *ep, const struct rps__sge *sge, const char *what)
{
	const struct rps__mr *mr = sge->mr;
	uintptr_t start, addr = (uintptr_t)sge->addr;

	if (!sge->len)
		return 0;
	if (!mr)
		return rps__seterr(-EINVAL, "%s: buffer %p+%u has no memory region: register it with rps__mr_reg "
				   "(or use RPS__WR_INLINE for a small payload)", what, sge->addr, sge->len);
	if (mr->fab != &ep->fab->base)
		return rps__seterr(-EINVAL, "%s: buffer %p+%u is registered with another fabric: "
				   "register it with the endpoint's fabric", what, sge->addr, sge->len);
	start = (uintptr_t)mr->addr;
	if (addr < start || sge->len > mr->len || addr - start > mr->len - sge->len)
		return rps__seterr(-EINVAL, "%s: buffer %p+%u lies outside its region %p+%zu: "
				   "pass the region that holds it", what, sge->addr, sge->len, mr->addr, mr->len);
	return 0;
}

static int wr_check(const struct tcp_ep *ep, const struct rps__wr *wr)
{
	bool inl = wr->flags & RPS__WR_INLINE;

	switch (wr->op) {
	case RPS__OP_SEND:
	case RPS__OP_WRITE:
	case RPS__OP_WRITE_IMM:
		if (!inl)
			return sge_check(ep, &wr->sge, "post");
		if (wr->sge.len > ep->max_inline)
			return rps__seterr(-EINVAL, "post: inline payload of %u bytes exceeds max_inline %u: "
					   "raise rps__ep_attr.max_inline or register the buffer",
					   wr->sge.len, ep->max_inline);
		if (wr->sge.len && !wr->sge.addr)
			return rps__seterr(-EINVAL, "post: inline payload of %u bytes at NULL", wr->sge.len);
		return 0;
	case RPS__OP_READ:
		if (inl)
			return rps__seterr(-EINVAL, "post: a READ cannot be inline: drop RPS__WR_INLINE");
		return sge_check(ep, &wr->sge, "post");
	case RPS__OP_CAS:
	case RPS__OP_FADD:
		if (inl || wr->sge.len != 8 || ((uintptr_t)wr->sge.addr & 7))
			return rps__seterr(-EINVAL, "post: an atomic needs one 8-byte aligned registered local word "
					   "for the old value (got %p+%u%s)", wr->sge.addr, wr->sge.len,
					   inl ? ", inline" : "");
		return sge_check(ep, &wr->sge, "post");
	}
	return rps__seterr(-EINVAL, "post: unknown operation %d", (int)wr->op);
}

static void op_prepare(struct tcp_ep *ep, const struct rps__wr *wr)
{
	uint32_t slot = ep->sq_next & ep->sq_mask;
	struct tcp_op *op = &ep->ops[slot];
	struct wire_hdr h = {
		.seq = ep->sq_next,
		.rkey = wr->rkey,
		.raddr = wr->raddr,
		.len = wr->sge.len,
	};

	op->wr_id = wr->wr_id;
	op->op = (uint8_t)wr->op;
	op->signaled = wr->flags & RPS__WR_SIGNALED;
	op->fence = wr->flags & RPS__WR_FENCE;
	op->responded = false;
	op->seq = ep->sq_next;
	op->len = wr->sge.len;
	op->local = NULL;
	op->txe.kind = TXE_OP;
	op->txe.src_rkey = 0;
	op->txe.payload = NULL;
	op->txe.payload_len = 0;

	switch (wr->op) {
	case RPS__OP_SEND:
	case RPS__OP_WRITE:
	case RPS__OP_WRITE_IMM:
		h.type = wr->op == RPS__OP_SEND ? F_SEND : wr->op == RPS__OP_WRITE ? F_WRITE : F_WRITE_IMM;
		h.imm = wr->op == RPS__OP_WRITE_IMM ? wr->imm : 0;
		op->txe.payload_len = wr->sge.len;
		if ((wr->flags & RPS__WR_INLINE) && wr->sge.len) {
			uint8_t *copy = ep->inline_buf + (size_t)slot * ep->max_inline;

			memcpy(copy, wr->sge.addr, wr->sge.len);
			op->txe.payload = copy;
		} else {
			op->txe.payload = wr->sge.addr;
		}
		break;
	case RPS__OP_READ:
		h.type = F_READ;
		op->local = wr->sge.addr;
		break;
	case RPS__OP_CAS:
	case RPS__OP_FADD:
		h.type = wr->op == RPS__OP_CAS ? F_CAS : F_FADD;
		h.len = 8;
		h.arg0 = wr->compare_add;
		h.arg1 = wr->op == RPS__OP_CAS ? wr->swap : 0;
		op->local = wr->sge.addr;
		break;
	}
	hdr_put(op->txe.hdr, &h);

	op->txe.next = NULL;
	if (ep->held_tail)
		ep->held_tail->next = &op->txe;
	else
		ep->held_head = &op->txe;
	ep->held_tail = &op->txe;
	ep->sq_next++;
}

static int tcp_post(struct rps__ep *base, const struct rps__wr *wr, int n)
{
	struct tcp_ep *ep = rps__container_of(base, struct tcp_ep, base);
	bool queue_was_empty;
	uint32_t room;
	int i, ret;

	if (n < 0)
		return rps__seterr(-EINVAL, "post: negative count %d", n);
	/* all or nothing: check every request before queueing any */
	for (i = 0; i < n; i++) {
		ret = wr_check(ep, &wr[i]);
		if (ret)
			return ret;
	}
	if ((uint32_t)n > ep->sq_depth)
		return rps__seterr(-EINVAL, "post: %d requests exceed sq_depth %u: post fewer at a time",
				   n, ep->sq_depth);

	pthread_mutex_lock(&ep->lock);
	if (ep->base.error) {
		/* IB rules: posting to a QP in error succeeds and flushes */
		for (i = 0; i < n; i++)
			ep_complete(ep, wr[i].wr_id, RPS__WC_FLUSH_ERR, op_wc_opcode((uint8_t)wr[i].op), 0, 0);
		pthread_mutex_unlock(&ep->lock);
		return 0;
	}
	room = ep->sq_depth - (ep->sq_next - ep->sq_head);
	if ((uint32_t)n > room) {
		pthread_mutex_unlock(&ep->lock);
		return rps__seterr(-EAGAIN, "post: send queue full (%u of %u outstanding): "
				   "poll the completion queue, then retry", ep->sq_depth - room, ep->sq_depth);
	}
	queue_was_empty = !ep->tx_head;
	for (i = 0; i < n; i++)
		op_prepare(ep, &wr[i]);
	sq_release_held(ep);
	/* An empty queue means the socket may take it all now; a non-empty one
	 * means it said EAGAIN and EPOLLOUT is armed: cq_poll will write. */
	if (queue_was_empty)
		ep_tx_flush(ep);
	pthread_mutex_unlock(&ep->lock);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* receiving: posted receives and early arrivals                            */

/* Hand early SENDs / WRITE_IMMs to receives posted since, in order. */
static void rq_match(struct tcp_ep *ep)
{
	struct tcp_unexpected *u;
	struct tcp_recv *r;

	while ((u = ep->unx_head) && ep->rq_head != ep->rq_tail) {
		r = &ep->recvs[ep->rq_head & ep->rq_mask];
		if (!u->is_imm && u->len > r->len) {
			ep->rq_head++;
			ep_complete(ep, r->wr_id, RPS__WC_LOC_ERR, RPS__WC_RECV, u->len, 0);
			target_nak(ep, u->seq, RPS__WC_REM_OP_ERR);
			return;
		}
		if (!u->is_imm && u->len)
			memcpy(r->addr, u->data, u->len);
		ep->rq_head++;
		ep_complete(ep, r->wr_id, RPS__WC_SUCCESS, u->is_imm ? RPS__WC_RECV_IMM : RPS__WC_RECV,
			    u->len, u->imm);
		ep->unx_head = u->next;
		if (!ep->unx_head)
			ep->unx_tail = NULL;
		ep->unx_count--;
		ep->unx_bytes -= u->len * !u->is_imm;
		free(u);
	}
}

static bool unexpected_room(const struct tcp_ep *ep, uint32_t len)
{
	return ep->unx_count < ep->rq_depth && ep->unx_bytes + len <= TCP_UNEXPECTED_BYTES;
}

static void unexpected_append(struct tcp_ep *ep, struct tcp_unexpected *u)
{
	u->next = NULL;
	if (ep->unx_tail)
		ep->unx_tail->next = u;
	else
		ep->unx_head = u;
	ep->unx_tail = u;
	ep->unx_count++;
	ep->unx_bytes += u->is_imm ? 0 : u->len;
}

static int tcp_post_recv(struct rps__ep *base, const struct rps__sge *sge, uint64_t wr_id)
{
	struct tcp_ep *ep = rps__container_of(base, struct tcp_ep, base);
	struct tcp_recv *r;
	int ret;

	ret = sge_check(ep, sge, "post_recv");
	if (ret)
		return ret;
	pthread_mutex_lock(&ep->lock);
	if (ep->base.error) {
		ep_complete(ep, wr_id, RPS__WC_FLUSH_ERR, RPS__WC_RECV, 0, 0);
		pthread_mutex_unlock(&ep->lock);
		return 0;
	}
	if (ep->rq_tail - ep->rq_head == ep->rq_depth) {
		pthread_mutex_unlock(&ep->lock);
		return rps__seterr(-EAGAIN, "post_recv: receive queue full (%u posted): "
				   "raise rps__ep_attr.rq_depth or wait for receives to complete", ep->rq_depth);
	}
	r = &ep->recvs[ep->rq_tail++ & ep->rq_mask];
	r->wr_id = wr_id;
	r->addr = sge->addr;
	r->len = sge->len;
	if (ep->unx_head) {
		/* a held SEND now has its receive: it counts as executed, ack it */
		rq_match(ep);
		queue_ack(ep);
		ep_tx_flush(ep);
	}
	pthread_mutex_unlock(&ep->lock);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* the engine: frames in                                                    */

static void rx_payload_done(struct tcp_ep *ep);

static void rx_begin_payload(struct tcp_ep *ep, enum rx_sink sink, uint8_t *dst, uint32_t len)
{
	ep->rx.sink = sink;
	ep->rx.dst = dst;
	ep->rx.remaining = len;
	ep->rx.in_payload = true;
	if (!len)
		rx_payload_done(ep);
}

/* A request must be the next one: the peer numbers them 1, 2, 3... */
static bool rx_request_in_order(struct tcp_ep *ep)
{
	if (ep->rx.hdr.seq == ep->peer_seq + 1)
		return true;
	ep_fail(ep);
	return false;
}

/* A WRITE_IMM was placed: its immediate consumes a receive, or waits for one. */
static void rx_deliver_imm(struct tcp_ep *ep, const struct wire_hdr *h)
{
	struct tcp_unexpected *u;
	struct tcp_recv *r;

	if (!ep->unx_head && ep->rq_head != ep->rq_tail) {
		r = &ep->recvs[ep->rq_head++ & ep->rq_mask];
		ep_complete(ep, r->wr_id, RPS__WC_SUCCESS, RPS__WC_RECV_IMM, h->len, h->imm);
		ep->peer_seq = h->seq;
		return;
	}
	if (!unexpected_room(ep, 0)) {
		target_nak(ep, h->seq, RPS__WC_RNR_RETRY_EXC_ERR);
		return;
	}
	u = malloc(sizeof(*u));
	if (!u) {
		target_nak(ep, h->seq, RPS__WC_REM_OP_ERR);
		return;
	}
	u->seq = h->seq;
	u->len = h->len;
	u->imm = h->imm;
	u->is_imm = true;
	unexpected_append(ep, u);
	ep->peer_seq = h->seq;
}

static void rx_payload_done(struct tcp_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	struct tcp_recv *r;
	struct tcp_op *op;

	rx->in_payload = false;
	switch (rx->sink) {
	case SINK_TARGET_MEM:
		if (rx->hdr.type == F_WRITE_IMM)
			rx_deliver_imm(ep, &rx->hdr);
		else
			ep->peer_seq = rx->hdr.seq;
		break;
	case SINK_RECV:
		r = &ep->recvs[ep->rq_head++ & ep->rq_mask];
		ep_complete(ep, r->wr_id, RPS__WC_SUCCESS, RPS__WC_RECV, rx->hdr.len, 0);
		ep->peer_seq = rx->hdr.seq;
		break;
	case SINK_UNEXPECTED:
		unexpected_append(ep, rx->unx);
		rx->unx = NULL;
		ep->peer_seq = rx->hdr.seq;
		rq_match(ep);	/* a receive may have been posted while it streamed in */
		break;
	case SINK_READ_RESP:
		op = rx->op;
		op->responded = true;
		ep->rd_unanswered--;
		sq_complete_done(ep);
		sq_release_held(ep);
		break;
	}
}

static void rx_send(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct tcp_unexpected *u;
	struct tcp_recv *r;

	if (!rx_request_in_order(ep))
		return;
	if (!ep->unx_head && ep->rq_head != ep->rq_tail) {
		r = &ep->recvs[ep->rq_head & ep->rq_mask];
		if (h->len > r->len) {
			ep->rq_head++;
			ep_complete(ep, r->wr_id, RPS__WC_LOC_ERR, RPS__WC_RECV, h->len, 0);
			target_nak(ep, h->seq, RPS__WC_REM_OP_ERR);
			return;
		}
		/* the receive stays at the ring head until the payload is in */
		rx_begin_payload(ep, SINK_RECV, r->addr, h->len);
		return;
	}
	if (!unexpected_room(ep, h->len)) {
		target_nak(ep, h->seq, RPS__WC_RNR_RETRY_EXC_ERR);
		return;
	}
	u = malloc(sizeof(*u) + h->len);
	if (!u) {
		target_nak(ep, h->seq, RPS__WC_REM_OP_ERR);
		return;
	}
	u->seq = h->seq;
	u->len = h->len;
	u->imm = 0;
	u->is_imm = false;
	ep->rx.unx = u;
	rx_begin_payload(ep, SINK_UNEXPECTED, u->data, h->len);
}

static void rx_write(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	uint8_t *dst = NULL;

	if (!rx_request_in_order(ep))
		return;
	if (h->len) {	/* IB: a zero-length WRITE checks no key */
		pthread_rwlock_rdlock(&ep->fab->mr_lock);
		dst = mr_target(ep->fab, h->rkey, h->raddr, h->len, RPS__ACCESS_REMOTE_WRITE);
		pthread_rwlock_unlock(&ep->fab->mr_lock);
		if (!dst) {
			target_nak(ep, h->seq, RPS__WC_REM_ACCESS_ERR);
			return;
		}
	}
	rx_begin_payload(ep, SINK_TARGET_MEM, dst, h->len);
}

static void rx_read(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct wire_hdr resp = { .type = F_READ_RESP, .seq = h->seq, .len = h->len };
	uint8_t *src = NULL;
	struct tcp_txe *txe;

	if (!rx_request_in_order(ep))
		return;
	if (h->len) {
		pthread_rwlock_rdlock(&ep->fab->mr_lock);
		src = mr_target(ep->fab, h->rkey, h->raddr, h->len, RPS__ACCESS_REMOTE_READ);
		pthread_rwlock_unlock(&ep->fab->mr_lock);
		if (!src) {
			target_nak(ep, h->seq, RPS__WC_REM_ACCESS_ERR);
			return;
		}
	}
	txe = resp_alloc(ep);
	if (!txe) {
		ep_fail(ep);	/* the peer exceeded the sq_depth it announced */
		return;
	}
	/* The payload is taken from the region when it goes to the socket, so
	 * a later WRITE of the same initiator may overtake this READ - as IB
	 * allows; RPS__WR_FENCE on the WRITE prevents it. */
	hdr_put(txe->hdr, &resp);
	txe->kind = TXE_RESP;
	txe->payload = src;
	txe->payload_len = h->len;
	txe->src_rkey = h->len ? h->rkey : 0;
	tx_append(ep, txe);
	ep->peer_seq = h->seq;
}

static void rx_atomic(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct wire_hdr resp = { .type = F_ATOMIC_RESP, .seq = h->seq, .len = 8 };
	struct tcp_txe *txe;
	uint64_t *word;
	uint64_t old;

	if (!rx_request_in_order(ep))
		return;
	pthread_rwlock_rdlock(&ep->fab->mr_lock);
	word = (uint64_t *)(void *)mr_target(ep->fab, h->rkey, h->raddr, 8, RPS__ACCESS_REMOTE_ATOMIC);
	if (!word || (h->raddr & 7)) {
		pthread_rwlock_unlock(&ep->fab->mr_lock);
		target_nak(ep, h->seq, RPS__WC_REM_ACCESS_ERR);
		return;
	}
	if (h->type == F_CAS) {
		old = h->arg0;
		__atomic_compare_exchange_n(word, &old, h->arg1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	} else {
		old = __atomic_fetch_add(word, h->arg0, __ATOMIC_SEQ_CST);
	}
	pthread_rwlock_unlock(&ep->fab->mr_lock);

	txe = resp_alloc(ep);
	if (!txe) {
		ep_fail(ep);
		return;
	}
	resp.arg0 = old;
	hdr_put(txe->hdr, &resp);
	txe->kind = TXE_RESP;
	txe->payload = NULL;
	txe->payload_len = 0;
	txe->src_rkey = 0;
	tx_append(ep, txe);
	ep->peer_seq = h->seq;
}

/* The op a response answers: sent, not yet answered, of the right kind. */
static struct tcp_op *rx_answered_op(struct tcp_ep *ep, uint32_t seq, bool read)
{
	struct tcp_op *op;

	if (!seq_le(ep->sq_head, seq) || !seq_le(seq, ep->sq_sent))
		return NULL;
	op = &ep->ops[seq & ep->sq_mask];
	if (op->responded || !op_wants_response(op->op) || (op->op == RPS__OP_READ) != read)
		return NULL;
	return op;
}

static void rx_ack(struct tcp_ep *ep)
{
	uint32_t w = ep->rx.hdr.seq;

	if (!seq_le(ep->peer_acked, w) || !seq_le(w, ep->sq_sent)) {
		ep_fail(ep);
		return;
	}
	ep->peer_acked = w;
	sq_complete_done(ep);
}

static void rx_nak(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	enum rps__wc_status status = (enum rps__wc_status)h->status;
	uint32_t w = (uint32_t)h->arg0;

	if (status != RPS__WC_REM_ACCESS_ERR && status != RPS__WC_REM_OP_ERR &&
	    status != RPS__WC_RNR_RETRY_EXC_ERR)
		status = RPS__WC_REM_OP_ERR;
	/* what the target executed before refusing completes normally */
	if (seq_le(ep->peer_acked, w) && seq_le(w, ep->sq_sent)) {
		ep->peer_acked = w;
		sq_complete_done(ep);
	}
	tx_purge_ops(ep);
	ep_abort(ep);
	ep_flush(ep, true, h->seq, status);
}

static void rx_read_resp(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct tcp_op *op = rx_answered_op(ep, h->seq, true);

	if (!op || h->len != op->len) {
		ep_fail(ep);
		return;
	}
	ep->rx.op = op;
	rx_begin_payload(ep, SINK_READ_RESP, op->local, h->len);
}

static void rx_atomic_resp(struct tcp_ep *ep)
{
	const struct wire_hdr *h = &ep->rx.hdr;
	struct tcp_op *op = rx_answered_op(ep, h->seq, false);

	if (!op) {
		ep_fail(ep);
		return;
	}
	memcpy(op->local, &h->arg0, sizeof(h->arg0));
	op->responded = true;
	ep->rd_unanswered--;
	sq_complete_done(ep);
	sq_release_held(ep);
}

static void rx_frame(struct tcp_ep *ep)
{
	switch (ep->rx.hdr.type) {
	case F_SEND: rx_send(ep); break;
	case F_WRITE:
	case F_WRITE_IMM: rx_write(ep); break;
	case F_READ: rx_read(ep); break;
	case F_CAS:
	case F_FADD: rx_atomic(ep); break;
	case F_ACK: rx_ack(ep); break;
	case F_NAK: rx_nak(ep); break;
	case F_READ_RESP: rx_read_resp(ep); break;
	case F_ATOMIC_RESP: rx_atomic_resp(ep); break;
	default: ep_fail(ep); break;
	}
}

/* Copy payload bytes that arrived in the receive buffer to their sink.
 * Target memory is rechecked under the lock on every chunk: a region
 * deregistered while a large WRITE streams in takes no further byte. */
static void rx_sink_copy(struct tcp_ep *ep, const uint8_t *src, uint32_t k)
{
	struct tcp_rx *rx = &ep->rx;

	if (rx->sink == SINK_TARGET_MEM) {
		pthread_rwlock_rdlock(&ep->fab->mr_lock);
		if (!mr_target(ep->fab, rx->hdr.rkey, (uintptr_t)rx->dst, rx->remaining, RPS__ACCESS_REMOTE_WRITE)) {
			pthread_rwlock_unlock(&ep->fab->mr_lock);
			target_nak(ep, rx->hdr.seq, RPS__WC_REM_ACCESS_ERR);
			return;
		}
		memcpy(rx->dst, src, k);
		pthread_rwlock_unlock(&ep->fab->mr_lock);
	} else {
		memcpy(rx->dst, src, k);
	}
	rx->dst += k;
	rx->remaining -= k;
	if (!rx->remaining)
		rx_payload_done(ep);
}

static void rx_parse(struct tcp_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	uint32_t k;

	while (ep->conn == CONN_OPEN) {
		if (!rx->in_payload) {
			if (rx->end - rx->start < TCP_HDR_SIZE)
				break;
			hdr_get(&rx->hdr, rx->buf + rx->start);
			rx->start += TCP_HDR_SIZE;
			rx_frame(ep);
		} else {
			k = RPS__MIN(rx->end - rx->start, rx->remaining);
			if (!k)
				break;
			rx->start += k;
			rx_sink_copy(ep, rx->buf + rx->start - k, k);
		}
	}
	if (rx->start == rx->end)
		rx->start = rx->end = 0;
}

/* Large payload with nothing buffered: recv straight into its destination. */
static ssize_t rx_read_direct(struct tcp_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	bool locked = rx->sink == SINK_TARGET_MEM;
	ssize_t n;

	if (locked) {
		pthread_rwlock_rdlock(&ep->fab->mr_lock);
		if (!mr_target(ep->fab, rx->hdr.rkey, (uintptr_t)rx->dst, rx->remaining, RPS__ACCESS_REMOTE_WRITE)) {
			pthread_rwlock_unlock(&ep->fab->mr_lock);
			target_nak(ep, rx->hdr.seq, RPS__WC_REM_ACCESS_ERR);
			return -1;
		}
	}
	n = recv(ep->fd, rx->dst, rx->remaining, MSG_DONTWAIT);
	if (locked)
		pthread_rwlock_unlock(&ep->fab->mr_lock);
	if (n > 0) {
		rx->dst += n;
		rx->remaining -= (uint32_t)n;
		if (!rx->remaining)
			rx_payload_done(ep);
	}
	return n;
}

static void ep_rx(struct tcp_ep *ep)
{
	struct tcp_rx *rx = &ep->rx;
	size_t budget = TCP_RX_BUDGET, want;
	ssize_t n;

	while (ep->conn == CONN_OPEN && budget) {
		if (rx->in_payload && rx->start == rx->end && rx->remaining >= TCP_DIRECT_MIN) {
			want = rx->remaining;
			n = rx_read_direct(ep);
			if (ep->conn != CONN_OPEN)
				break;
		} else {
			if (rx->start) {	/* at most a partial header is left */
				memmove(rx->buf, rx->buf + rx->start, rx->end - rx->start);
				rx->end -= rx->start;
				rx->start = 0;
			}
			want = TCP_RXBUF_SIZE - rx->end;
			n = recv(ep->fd, rx->buf + rx->end, want, MSG_DONTWAIT);
			if (n > 0) {
				rx->end += (uint32_t)n;
				rx_parse(ep);
			}
		}
		if (n == 0) {
			ep_fail(ep);	/* EOF: the peer closed */
			break;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				ep_fail(ep);	/* ECONNRESET and friends */
			break;
		}
		budget -= RPS__MIN((size_t)n, budget);
		queue_ack(ep);	/* one cumulative ACK for what this read brought */
		if ((size_t)n < want)
			break;	/* drained: spare the recv that would say EAGAIN, epoll is level-triggered */
	}
}

/* Remember ep for a later flush (caller holds poll_lock); false if the
 * list cannot grow, and the caller flushes now. */
static bool defer_flush(struct tcp_cq *cq, struct tcp_ep *ep)
{
	if (ep->deferred)
		return true;
	if (cq->ndeferred == cq->deferred_cap) {
		uint32_t cap = cq->deferred_cap ? cq->deferred_cap * 2 : 16;
		struct tcp_ep **grown = realloc(cq->deferred, cap * sizeof(*grown));
		if (!grown)
			return false;
		cq->deferred = grown;
		cq->deferred_cap = cap;
	}
	cq->deferred[cq->ndeferred++] = ep;
	ep->deferred = true;
	return true;
}

/* Flush what defer_flush() held back (caller holds poll_lock). */
static void flush_deferred(struct tcp_cq *cq)
{
	uint32_t i;

	for (i = 0; i < cq->ndeferred; i++) {
		struct tcp_ep *ep = cq->deferred[i];
		pthread_mutex_lock(&ep->lock);
		ep->deferred = false;
		if (ep->conn != CONN_CLOSED)
			ep_tx_flush(ep);
		pthread_mutex_unlock(&ep->lock);
	}
	cq->ndeferred = 0;
}

static void ep_progress(struct tcp_ep *ep, uint32_t events)
{
	bool defer = false;

	pthread_mutex_lock(&ep->lock);
	if (ep->conn == CONN_OPEN && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		ep_rx(ep);
	/* Responses produced by what we just read may wait for the end of
	 * this poll (see tcp_cq.deferred); a socket that has room again, or a
	 * closing endpoint, is flushed now. */
	if (ep->conn == CONN_OPEN && !(events & EPOLLOUT) && ep->tx_head)
		defer = defer_flush(ep->cq, ep);
	if (!defer && ep->conn != CONN_CLOSED)
		ep_tx_flush(ep);
	pthread_mutex_unlock(&ep->lock);
}

static void cq_progress(struct tcp_cq *cq)
{
	struct epoll_event evs[TCP_EPOLL_BATCH];
	uint64_t counter;
	int i, n;

	n = epoll_wait(cq->epfd, evs, TCP_EPOLL_BATCH, 0);
	for (i = 0; i < n; i++) {
		if (!evs[i].data.ptr) {
			if (read(cq->evfd, &counter, sizeof(counter)) < 0) {
				/* already drained: nothing to do */
			}
			continue;
		}
		ep_progress(evs[i].data.ptr, evs[i].events);
	}
}

static int tcp_cq_poll(struct rps__cq *base, struct rps__wc *wc, int n)
{
	struct tcp_cq *cq = rps__container_of(base, struct tcp_cq, base);
	uint32_t queued;
	int got;

	if (n <= 0)
		return 0;
	pthread_mutex_lock(&cq->poll_lock);
	/* The caller handled what the last poll returned, and posted its
	 * answers: what is still held back goes now. */
	flush_deferred(cq);
	pthread_mutex_lock(&cq->lock);
	/* The caller is awake: completions the engine queues now need no
	 * eventfd wake-up (cq_arm re-checks before it sleeps again). */
	cq->armed = false;
	queued = cq->count;
	pthread_mutex_unlock(&cq->lock);
	if (queued < (uint32_t)n)
		cq_progress(cq);
	got = cq_pop(cq, wc, n);
	if (!got)
		flush_deferred(cq);	/* no completion to act on: nothing to wait for */
	pthread_mutex_unlock(&cq->poll_lock);
	return got;
}

/* ------------------------------------------------------------------------ */
/* endpoints                                                                */

static void ep_free(struct tcp_ep *ep)
{
	unexpected_free_all(ep);
	pthread_mutex_destroy(&ep->lock);
	free(ep->rx.buf);
	free(ep->recvs);
	free(ep->resp_pool);
	free(ep->inline_buf);
	free(ep->ops);
	free(ep);
}

/* Everything an endpoint will ever need is allocated here: the hot path
 * does not allocate (early SENDs aside). */
static int ep_create(struct tcp_fabric *fab, struct tcp_cq *cq, int fd, const struct ep_sizes *sz,
		     uint32_t peer_sq_depth, const char *peer, struct tcp_ep **out)
{
	uint32_t sq_ring = pow2_at_least(sz->sq_depth);
	uint32_t rq_ring = pow2_at_least(sz->rq_depth);
	uint32_t nresp = 2 * peer_sq_depth + 1;	/* an answer + an ACK per peer op, at most */
	struct tcp_ep *ep = NULL;
	uint32_t i;
	int ret;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return rps__seterr(-ENOMEM, "endpoint to %s: out of memory", peer);
	ep->ops = calloc(sq_ring, sizeof(*ep->ops));
	ep->inline_buf = malloc((size_t)sq_ring * sz->max_inline);
	ep->resp_pool = calloc(nresp, sizeof(*ep->resp_pool));
	ep->recvs = calloc(rq_ring, sizeof(*ep->recvs));
	ep->rx.buf = malloc(TCP_RXBUF_SIZE);
	if (!ep->ops || !ep->inline_buf || !ep->resp_pool || !ep->recvs || !ep->rx.buf) {
		ret = rps__seterr(-ENOMEM, "endpoint to %s: out of memory for queues (sq %u, rq %u, inline %u): "
				  "ask for smaller depths", peer, sz->sq_depth, sz->rq_depth, sz->max_inline);
		goto err_free_queues;
	}
	ret = pthread_mutex_init(&ep->lock, NULL);
	if (ret) {
		ret = rps__seterr(-ret, "endpoint: pthread_mutex_init: %s", strerror(ret));
		goto err_free_queues;
	}
	for (i = 0; i < nresp; i++)
		resp_free(ep, &ep->resp_pool[i]);

	ep->base.fab = &fab->base;
	ep->base.cq = &cq->base;
	snprintf(ep->base.peer, sizeof(ep->base.peer), "%s", peer);
	ep->fab = fab;
	ep->cq = cq;
	ep->fd = fd;
	ep->conn = CONN_OPEN;
	ep->sq_depth = sz->sq_depth;
	ep->sq_mask = sq_ring - 1;
	ep->sq_head = ep->sq_next = 1;	/* seq 0 means "nothing yet" */
	ep->max_inline = sz->max_inline;
	ep->rq_depth = sz->rq_depth;
	ep->rq_mask = rq_ring - 1;
	ep->peer_sq_depth = peer_sq_depth;
	*out = ep;
	return 0;

err_free_queues:
	free(ep->rx.buf);
	free(ep->recvs);
	free(ep->resp_pool);
	free(ep->inline_buf);
	free(ep->ops);
	free(ep);
	return ret;
}

/* Put the socket in the CQ's epoll set: from here on cq_poll drives it. */
static int ep_bind(struct tcp_ep *ep)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = ep };

	if (epoll_ctl(ep->cq->epfd, EPOLL_CTL_ADD, ep->fd, &ev))
		return rps__seterr(-errno, "endpoint to %s: epoll_ctl: %s", ep->base.peer, strerror(errno));
	ep->epoll_events = EPOLLIN;
	return 0;
}

static void tcp_ep_close(struct rps__ep *base)
{
	struct tcp_ep *ep = rps__container_of(base, struct tcp_ep, base);
	struct tcp_cq *cq = ep->cq;

	/* poll_lock: no engine pass of this CQ is inside the endpoint, and
	 * none will find it in its epoll set afterwards */
	pthread_mutex_lock(&cq->poll_lock);
	if (ep->deferred) {
		uint32_t i;
		for (i = 0; i < cq->ndeferred; i++)
			if (cq->deferred[i] == ep)
				cq->deferred[i] = cq->deferred[--cq->ndeferred];
		ep->deferred = false;
	}
	pthread_mutex_lock(&ep->lock);
	if (ep->conn != CONN_CLOSED)
		epoll_ctl(cq->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
	ep->conn = CONN_CLOSED;
	close(ep->fd);
	pthread_mutex_unlock(&ep->lock);
	cq_drop_ep(cq, ep);
	pthread_mutex_unlock(&cq->poll_lock);
	ep_free(ep);
}

/* ------------------------------------------------------------------------ */
/* connections                                                              */

/* RPS_TCP_HELLO_TIMEOUT_MS: tests shorten the 10 s a connection may take
 * to send its hello (rdmapsd(8) ENVIRONMENT). */
static uint64_t hello_timeout_ns(void)
{
	const char *e = getenv("RPS_TCP_HELLO_TIMEOUT_MS");
	uint64_t ms;

	if (!e || rps__parse_u64("RPS_TCP_HELLO_TIMEOUT_MS", e, 1, 3600000, &ms))
		return TCP_HELLO_TIMEOUT_NS;
	return ms * 1000000ull;
}

static int tcp_listen(struct rps__fabric *base, const char *host, uint16_t port, struct rps__listener **out)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	struct sockaddr_storage ss = { 0 };
	socklen_t slen = sizeof(ss);
	struct addrinfo *res, *ai;
	struct tcp_listener *l;
	char portstr[8];
	int fd = -1, ret, gai, one = 1, last_errno = 0;

	if (!host || !*host)
		host = "0.0.0.0";
	snprintf(portstr, sizeof(portstr), "%u", port);
	gai = getaddrinfo(host, portstr, &hints, &res);
	if (gai)
		return rps__seterr(-EADDRNOTAVAIL, "listen on %s:%u: cannot resolve: %s: check the address",
				   host, port, gai_strerror(gai));
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			last_errno = errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
			break;
		last_errno = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return rps__seterr(-last_errno, "listen on %s:%u: %s: %s", host, port, strerror(last_errno),
				   last_errno == EADDRINUSE ? "another process holds the port, pick another (or 0)"
							    : "check that the address is local to this machine");

	l = calloc(1, sizeof(*l));
	if (!l) {
		ret = rps__seterr(-ENOMEM, "listen: out of memory");
		goto err_close_fd;
	}
	if (getsockname(fd, (struct sockaddr *)&ss, &slen)) {
		ret = rps__seterr(-errno, "listen on %s:%u: getsockname: %s", host, port, strerror(errno));
		goto err_free;
	}
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		ret = rps__seterr(-errno, "listen: epoll_create1: %s: raise the open file limit (ulimit -n)",
				  strerror(errno));
		goto err_free;
	}
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev)) {
		ret = rps__seterr(-errno, "listen: epoll_ctl: %s", strerror(errno));
		goto err_close_ep;
	}
	l->base.fab = base;
	l->base.port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						      : ((struct sockaddr_in *)&ss)->sin_port);
	l->fab = fab;
	l->fd = fd;
	l->hello_timeout_ns = hello_timeout_ns();
	*out = &l->base;
	return 0;

err_close_ep:
	close(l->epfd);
err_free:
	free(l);
err_close_fd:
	close(fd);
	return ret;
}

static int tcp_listener_fd(struct rps__listener *base)
{
	return rps__container_of(base, struct tcp_listener, base)->epfd;
}

static void pending_unlink(struct tcp_listener *l, struct tcp_pending *p)
{
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, p->fd, NULL);
	if (l->pending == p)
		l->pending = p->next;
	if (p->prev)
		p->prev->next = p->next;
	if (p->next)
		p->next->prev = p->prev;
	if (l->pending_tail == p)
		l->pending_tail = p->prev;
	l->npending--;
}

static void pending_drop(struct tcp_listener *l, struct tcp_pending *p)
{
	pending_unlink(l, p);
	close(p->fd);
	free(p);
}

/* Connections that never finished their hello are dropped, so that a port
 * scanner cannot pin file descriptors forever. */
static void listener_reap_stale(struct tcp_listener *l)
{
	struct tcp_pending *p, *next;
	uint64_t now;

	if (!l->pending)
		return;
	now = rps__now_ns();
	for (p = l->pending; p; p = next) {
		next = p->next;
		if (now - p->since_ns > l->hello_timeout_ns)
			pending_drop(l, p);
	}
}

static void listener_accept_all(struct tcp_listener *l)
{
	struct sockaddr_storage ss = { 0 };
	struct tcp_pending *p;
	struct epoll_event ev = { .events = EPOLLIN };
	socklen_t slen;
	int fd;

	for (;;) {
		slen = sizeof(ss);
		fd = accept4(l->fd, (struct sockaddr *)&ss, &slen, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return;	/* EAGAIN, or EMFILE & co: retried at the next call */
		}
		/* full: the oldest silent connection goes, not the newcomer,
		 * or a thousand idle sockets would lock every client out */
		if (l->npending >= TCP_MAX_PENDING)
			pending_drop(l, l->pending_tail);
		p = calloc(1, sizeof(*p));
		if (!p) {
			close(fd);
			continue;
		}
		p->fd = fd;
		p->since_ns = rps__now_ns();
		sockaddr_str((struct sockaddr *)&ss, slen, p->peer, sizeof(p->peer));
		ev.data.ptr = p;
		if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev)) {
			close(fd);
			free(p);
			continue;
		}
		p->next = l->pending;
		if (l->pending)
			l->pending->prev = p;
		else
			l->pending_tail = p;
		l->pending = p;
		l->npending++;
	}
}

/* Read what arrived of p's hello.  1 and *out when it is complete and valid. */
static int pending_progress(struct tcp_listener *l, struct tcp_pending *p, struct rps__conn_req **out)
{
	struct tcp_conn_req *req;
	struct wire_hello h;
	ssize_t n;

	n = recv(p->fd, p->hello + p->got, TCP_HELLO_SIZE - p->got, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	if (n <= 0) {
		pending_drop(l, p);
		return 0;
	}
	p->got += (uint32_t)n;
	if (p->got < TCP_HELLO_SIZE)
		return 0;
	hello_get(&h, p->hello);
	if (hello_check(&h, p->peer) || h.type != HELLO_CONNECT) {
		/* tell a real rdmaps peer why, then hang up; the listener goes on */
		hello_send(p->fd, HELLO_BAD_PROTOCOL, NULL, NULL, 0, rps__now_ns() + 1000000);
		pending_drop(l, p);
		return 0;
	}
	req = calloc(1, sizeof(*req));
	if (!req) {
		pending_drop(l, p);
		return 0;
	}
	req->base.fab = &l->fab->base;
	req->base.len = h.data_len;
	memcpy(req->base.data, h.data, h.data_len);
	req->fab = l->fab;
	req->fd = p->fd;
	req->peer_sq_depth = h.sq_depth;
	req->base.peer_sq_depth = h.sq_depth;
	snprintf(req->peer, sizeof(req->peer), "%s", p->peer);
	pending_unlink(l, p);
	free(p);
	*out = &req->base;
	return 1;
}

static int tcp_listener_get_request(struct rps__listener *base, struct rps__conn_req **out)
{
	struct tcp_listener *l = rps__container_of(base, struct tcp_listener, base);
	struct epoll_event evs[16];
	int i, n;

	listener_reap_stale(l);
	for (;;) {
		n = epoll_wait(l->epfd, evs, RPS__ARRAY_SIZE(evs), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return rps__seterr(-errno, "listener: epoll_wait: %s", strerror(errno));
		if (n == 0)
			return rps__seterr(-EAGAIN, "listener: no connection request waiting: poll rps__listener_fd()");
		/* level-triggered: events not looked at now are reported again */
		for (i = 0; i < n; i++) {
			if (!evs[i].data.ptr)
				listener_accept_all(l);
			else if (pending_progress(l, evs[i].data.ptr, out))
				return 0;
		}
	}
}

static void tcp_listener_close(struct rps__listener *base)
{
	struct tcp_listener *l = rps__container_of(base, struct tcp_listener, base);

	while (l->pending)
		pending_drop(l, l->pending);
	close(l->epfd);
	close(l->fd);
	free(l);
}

static int tcp_accept(struct rps__conn_req *base, struct rps__cq *cq_base, const struct rps__ep_attr *attr,
		      const void *data, size_t len, struct rps__ep **out)
{
	struct tcp_conn_req *req = rps__container_of(base, struct tcp_conn_req, base);
	struct tcp_cq *cq = rps__container_of(cq_base, struct tcp_cq, base);
	struct ep_sizes sz;
	struct tcp_ep *ep = NULL;
	int ret;

	ret = ep_sizes_resolve(attr, &sz, "accept");
	if (ret)
		goto err_refuse;
	ret = ep_create(req->fab, cq, req->fd, &sz, req->peer_sq_depth, req->peer, &ep);
	if (ret)
		goto err_refuse;
	sock_tune(req->fd);
	ret = hello_send(req->fd, HELLO_ACCEPT, &sz, data, len, rps__now_ns() + TCP_ACCEPT_TIMEOUT_NS);
	if (ret) {
		ret = rps__seterr(ret, "accept from %s: sending the reply failed: %s: the peer gave up, "
				  "it may retry", req->peer, strerror(-ret));
		goto err_free_ep;
	}
	ret = ep_bind(ep);
	if (ret)
		goto err_free_ep;
	free(req);
	*out = &ep->base;
	return 0;

err_free_ep:
	ep_free(ep);
	close(req->fd);
	free(req);
	return ret;
err_refuse:
	/* the connector must not wait for a reply that never comes */
	hello_send(req->fd, HELLO_REJECT, NULL, NULL, 0, rps__now_ns() + 1000000);
	close(req->fd);
	free(req);
	return ret;
}

static int tcp_reject(struct rps__conn_req *base, const void *data, size_t len)
{
	struct tcp_conn_req *req = rps__container_of(base, struct tcp_conn_req, base);
	int ret;

	ret = hello_send(req->fd, HELLO_REJECT, NULL, data, len, rps__now_ns() + TCP_ACCEPT_TIMEOUT_NS);
	if (ret)
		ret = rps__seterr(ret, "reject %s: sending the reply failed: %s: the peer gave up already",
				  req->peer, strerror(-ret));
	/* FIN after the reply: we read the whole hello, so close() sends no RST */
	shutdown(req->fd, SHUT_WR);
	close(req->fd);
	free(req);
	return ret;
}

/* Try each address of host in turn until one connects (non-blocking connect
 * bounded by the deadline).  Returns the socket or a negative errno. */
static int connect_socket(const char *host, uint16_t port, uint64_t deadline, char *peer, size_t peerlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
	struct addrinfo *res, *ai;
	char portstr[8];
	int fd = -1, gai, err = ECONNREFUSED, ret;
	socklen_t elen;

	snprintf(portstr, sizeof(portstr), "%u", port);
	gai = getaddrinfo(host, portstr, &hints, &res);
	if (gai)
		return rps__seterr(-EHOSTUNREACH, "connect to %s:%u: cannot resolve: %s: check the host name",
				   host, port, gai_strerror(gai));
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		if (errno == EINPROGRESS) {
			ret = fd_wait(fd, POLLOUT, deadline);
			elen = sizeof(err);
			if (ret == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0)
				break;
			if (ret)
				err = -ret;
		} else {
			err = errno;
		}
		close(fd);
		fd = -1;
		if (err == ETIMEDOUT)
			break;
	}
	if (fd >= 0)
		sockaddr_str(ai->ai_addr, ai->ai_addrlen, peer, peerlen);
	freeaddrinfo(res);
	if (fd < 0)
		return rps__seterr(-err, "connect to %s:%u: %s: %s", host, port, strerror(err),
				   err == ECONNREFUSED ? "is the server listening there?"
				   : err == ETIMEDOUT ? "the host does not answer, check the address and firewall"
				   : "check the address and the network");
	return fd;
}

/* reply holds RPS__PRIVDATA_MAX bytes; reply_len is set to what came. */
static void reply_copy(void *reply, size_t *reply_len, const struct wire_hello *h)
{
	if (reply)
		memcpy(reply, h->data, h->data_len);
	if (reply_len)
		*reply_len = h->data_len;
}

static int tcp_connect(struct rps__fabric *base, const char *host, uint16_t port, struct rps__cq *cq_base,
		       const struct rps__ep_attr *attr, const void *data, size_t len, int timeout_ms,
		       void *reply, size_t *reply_len, struct rps__ep **out)
{
	struct tcp_fabric *fab = rps__container_of(base, struct tcp_fabric, base);
	struct tcp_cq *cq = rps__container_of(cq_base, struct tcp_cq, base);
	uint64_t deadline = timeout_ms < 0 ? 0 : rps__now_ns() + (uint64_t)timeout_ms * 1000000 + 1;
	uint8_t raw[TCP_HELLO_SIZE];
	struct wire_hello h;
	struct ep_sizes sz;
	struct tcp_ep *ep = NULL;
	char peer[64];
	int fd, ret;

	ret = ep_sizes_resolve(attr, &sz, "connect");
	if (ret)
		return ret;
	if (!host || !*host)
		host = "127.0.0.1";
	fd = connect_socket(host, port, deadline, peer, sizeof(peer));
	if (fd < 0) {
		if (reply_len)
			*reply_len = 0;
		return fd;
	}
	sock_tune(fd);
	ret = hello_send(fd, HELLO_CONNECT, &sz, data, len, deadline);
	if (!ret)
		ret = fd_read_all(fd, raw, sizeof(raw), deadline);
	if (ret) {
		ret = rps__seterr(ret, "connect to %s: handshake: %s: %s", peer, strerror(-ret),
				  ret == -ETIMEDOUT ? "the server does not accept, is it polling its listener?"
						    : "is that an rdmaps tcp endpoint?");
		goto err_close;
	}
	hello_get(&h, raw);
	ret = hello_check(&h, peer);
	if (ret)
		goto err_close;
	switch (h.type) {
	case HELLO_ACCEPT:
		break;
	case HELLO_REJECT:
		reply_copy(reply, reply_len, &h);
		ret = rps__seterr(-ECONNREFUSED, "connect to %s: rejected by the server (%u bytes of reason)",
				  peer, h.data_len);
		goto err_close_noreply;
	case HELLO_BAD_PROTOCOL:
		ret = rps__seterr(-EPROTO, "connect to %s: the server refused our hello (protocol version %u, "
				  "it speaks %u): run the same rdmaps release on both sides", peer,
				  TCP_VERSION, h.version);
		goto err_close;
	default:
		ret = rps__seterr(-EPROTO, "connect to %s: unexpected handshake reply type %u: "
				  "is that an rdmaps tcp endpoint?", peer, h.type);
		goto err_close;
	}
	ret = ep_create(fab, cq, fd, &sz, h.sq_depth, peer, &ep);
	if (ret)
		goto err_close;
	ret = ep_bind(ep);
	if (ret)
		goto err_free_ep;
	reply_copy(reply, reply_len, &h);
	*out = &ep->base;
	return 0;

err_free_ep:
	ep_free(ep);
err_close:
	if (reply_len)
		*reply_len = 0;
err_close_noreply:
	close(fd);
	return ret;
}

const struct rps__transport_ops rps__tcp_ops = {
	.name = "tcp",
	.fabric_open = tcp_fabric_open,
	.fabric_close = tcp_fabric_close,
	.fabric_name = tcp_fabric_name,
	.mr_reg = tcp_mr_reg,
	.mr_dereg = tcp_mr_dereg,
	.local_cas = tcp_local_cas,
	.cq_create = tcp_cq_create,
	.cq_destroy = tcp_cq_destroy,
	.cq_poll = tcp_cq_poll,
	.cq_fd = tcp_cq_fd,
	.cq_arm = tcp_cq_arm,
	.listen = tcp_listen,
	.listener_fd = tcp_listener_fd,
	.listener_get_request = tcp_listener_get_request,
	.accept = tcp_accept,
	.reject = tcp_reject,
	.listener_close = tcp_listener_close,
	.connect = tcp_connect,
	.ep_close = tcp_ep_close,
	.post = tcp_post,
	.post_recv = tcp_post_recv,
};
