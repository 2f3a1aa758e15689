/*
 * test_transport.c - the transport contract (src/transport/transport.h) as one CUnit
 * suite that runs unchanged on every provider.
 *
 *   RPS_TEST_TRANSPORT  tcp (default) | verbs
 *   RPS_TEST_ADDR       address to listen on and connect to (127.0.0.1)
 *
 * Exits 77 (automake's SKIP) when verbs is asked for and no RDMA device is
 * present.  The "server" is two helper threads, like rdmapsd's loops: each
 * polls its own CQ (on TCP progress is manual, so the target of one-sided
 * operations must be polled for them to happen), thread 0 also accepts, and
 * accepted endpoints alternate between the two CQs - so that on TCP remote
 * atomics from different endpoints really are applied concurrently.  Server
 * completions land in a mailbox that the tests read.
 */
#include "config.h"
#include "transport/transport.h"
#include "common/common.h"
#include "lib/cutest.h"
#include "lib/verbs_peer.h"

#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS		5000		/* a completion that takes longer is lost */
#define TCP_HDR_BYTES	48		/* the tcp provider's frame header (tcp_codec.c) */
#define SRV_LEN		(8u << 20)	/* main server region */
#define SRV_RO_LEN	(64u << 10)	/* server region without REMOTE_WRITE */
#define SRV_RECV_LEN	(64u << 10)	/* server receive buffers (local access) */
#define CLI_LEN		(16u << 20)
#define GUARD		4096u		/* unregistered bytes around the bounds-test region */
#define MAILBOX_CAP	16384
#define RACE_THREADS	4
#define RACE_LOOPS	2000

static enum rps__kind g_kind;
static const char *g_addr;
static struct rps__fabric *srv_fab;
static struct rps__fabric *cli_fab;

static uint8_t *srv_mem;
static struct rps__mr *srv_mr;
static uint8_t *srv_ro_mem;
static struct rps__mr *srv_ro_mr;
static uint8_t *srv_recv_mem;
static struct rps__mr *srv_recv_mr;
static uint8_t *srv_bounds_mem;		/* GUARD | 4096 registered | GUARD */
static struct rps__mr *srv_bounds_mr;
static uint8_t *cli_mem;
static struct rps__mr *cli_mr;

/* ------------------------------------------------------------------------ */
/* the server thread                                                        */

#define SRV_THREADS 2

static struct server {
	struct rps__listener *listener;
	struct rps__cq *cq[SRV_THREADS];
	pthread_t thread[SRV_THREADS];
	unsigned next_cq;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;
	/* policy for the next requests */
	bool reject;
	uint8_t reply[RPS__PRIVDATA_MAX];
	size_t reply_len;
	/* what it saw */
	uint8_t req_data[RPS__PRIVDATA_MAX];
	size_t req_len;
	int nreq;
	struct rps__ep *accepted[16];
	int naccepted;
	struct rps__wc mailbox[MAILBOX_CAP];
	int nmail;
	bool overflow;
} srv = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
};

static void server_handle_request(struct rps__conn_req *req)
{
	const void *data;
	size_t len;
	struct rps__ep *ep;
	bool reject;
	uint8_t reply[RPS__PRIVDATA_MAX];
	size_t reply_len;

	data = rps__conn_req_data(req, &len);
	pthread_mutex_lock(&srv.lock);
	memcpy(srv.req_data, data, len);
	srv.req_len = len;
	srv.nreq++;
	reject = srv.reject;
	if (srv.reply_len)
		memcpy(reply, srv.reply, srv.reply_len);
	reply_len = srv.reply_len;
	pthread_mutex_unlock(&srv.lock);

	if (reject) {
		rps__reject(req, reply, reply_len);
		return;
	}
	if (rps__accept(req, srv.cq[srv.next_cq++ % SRV_THREADS], NULL, reply, reply_len, &ep)) {
		fprintf(stderr, "server: accept failed: %s\n", rps__errbuf());
		return;
	}
	pthread_mutex_lock(&srv.lock);
	if (srv.naccepted < (int)RPS__ARRAY_SIZE(srv.accepted))
		srv.accepted[srv.naccepted++] = ep;
	pthread_cond_broadcast(&srv.cond);
	pthread_mutex_unlock(&srv.lock);
}

/* Poll cq into the mailbox: the poll and the store under one hold of
 * srv.lock, so that conn_close (its endpoints closed, then the mailbox
 * emptied under the lock) never leaves a completion of a closed endpoint
 * behind: one polled before the close is stored before the reset, and a
 * close drops what it had queued.  A completion polled, then stored after
 * the reset, could be taken for the next connection's, whose endpoint may
 * get the freed one's address (test_send_too_large failed so once, in a
 * distcheck).  The number polled. */
static int server_poll_store(struct rps__cq *cq)
{
	struct rps__wc wc[32];
	int i, n;

	pthread_mutex_lock(&srv.lock);
	n = rps__cq_poll(cq, wc, 32);
	for (i = 0; i < n; i++) {
		if (srv.nmail == MAILBOX_CAP) {
			srv.overflow = true;
			break;
		}
		srv.mailbox[srv.nmail++] = wc[i];
	}
	if (n > 0)
		pthread_cond_broadcast(&srv.cond);
	pthread_mutex_unlock(&srv.lock);
	return n;
}

static void *server_main(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg;
	struct rps__cq *cq = srv.cq[id];
	struct rps__conn_req *req;
	struct pollfd pfd[2];

	for (;;) {
		pthread_mutex_lock(&srv.lock);
		if (srv.stop) {
			pthread_mutex_unlock(&srv.lock);
			return NULL;
		}
		pthread_mutex_unlock(&srv.lock);

		while (id == 0 && rps__listener_get_request(srv.listener, &req) == 0)
			server_handle_request(req);
		if (server_poll_store(cq) > 0)
			continue;
		rps__cq_arm(cq);
		if (server_poll_store(cq) > 0)
			continue;
		pfd[0] = (struct pollfd){ .fd = rps__cq_fd(cq), .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = rps__listener_fd(srv.listener), .events = POLLIN };
		poll(pfd, id == 0 ? 2 : 1, 10);
	}
}

static void server_policy(bool reject, const void *reply, size_t len)
{
	pthread_mutex_lock(&srv.lock);
	srv.reject = reject;
	if (len)
		memcpy(srv.reply, reply, len);
	srv.reply_len = len;
	pthread_mutex_unlock(&srv.lock);
}

static struct rps__ep *server_take_ep(void)
{
	struct rps__ep *ep = NULL;
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += WAIT_MS / 1000;
	pthread_mutex_lock(&srv.lock);
	while (!srv.naccepted)
		if (pthread_cond_timedwait(&srv.cond, &srv.lock, &ts))
			break;
	if (srv.naccepted) {
		ep = srv.accepted[0];
		memmove(srv.accepted, srv.accepted + 1, --srv.naccepted * sizeof(srv.accepted[0]));
	}
	pthread_mutex_unlock(&srv.lock);
	return ep;
}

/* Take the first server completion of ep from the mailbox; 0 on timeout. */
static int server_wait_wc(struct rps__ep *ep, struct rps__wc *out)
{
	struct timespec ts;
	int i, found = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += WAIT_MS / 1000;
	pthread_mutex_lock(&srv.lock);
	for (;;) {
		for (i = 0; i < srv.nmail; i++)
			if (srv.mailbox[i].ep == ep)
				break;
		if (i < srv.nmail) {
			*out = srv.mailbox[i];
			memmove(srv.mailbox + i, srv.mailbox + i + 1, (size_t)(srv.nmail - i - 1) * sizeof(*out));
			srv.nmail--;
			found = 1;
			break;
		}
		if (pthread_cond_timedwait(&srv.cond, &srv.lock, &ts))
			break;
	}
	pthread_mutex_unlock(&srv.lock);
	return found;
}

static void server_mailbox_reset(void)
{
	pthread_mutex_lock(&srv.lock);
	srv.nmail = 0;
	pthread_mutex_unlock(&srv.lock);
}

/* The server endpoint has entered the error state (the server thread may
 * still be processing the NAK when the client sees its completion). */
static bool server_ep_error_soon(struct rps__ep *ep)
{
	uint64_t deadline = rps__now_ns() + WAIT_MS * 1000000ull;

	while (!rps__ep_is_error(ep) && rps__now_ns() < deadline) {
		struct timespec ts = { 0, 1000000 };

		nanosleep(&ts, NULL);
	}
	return rps__ep_is_error(ep);
}

/* ------------------------------------------------------------------------ */
/* helpers                                                                  */

struct conn {
	struct rps__cq *cq;
	struct rps__ep *ep;	/* client side */
	struct rps__ep *sep;	/* server side */
};

static int conn_open_attr(struct conn *c, const struct rps__ep_attr *attr)
{
	int ret;

	memset(c, 0, sizeof(*c));
	ret = rps__cq_create(cli_fab, 1024, &c->cq);
	if (ret) {
		fprintf(stderr, "cq_create: %s\n", rps__errbuf());
		return ret;
	}
	ret = rps__connect(cli_fab, g_addr, rps__listener_port(srv.listener), c->cq, attr,
			   NULL, 0, WAIT_MS, NULL, NULL, &c->ep);
	if (ret) {
		fprintf(stderr, "connect: %s\n", rps__errbuf());
		rps__cq_destroy(c->cq);
		c->cq = NULL;
		return ret;
	}
	c->sep = server_take_ep();
	return c->sep ? 0 : -ETIMEDOUT;
}

static int conn_open(struct conn *c)
{
	return conn_open_attr(c, NULL);
}

static void conn_close(struct conn *c)
{
	rps__ep_close(c->ep);
	rps__ep_close(c->sep);
	rps__cq_destroy(c->cq);
	memset(c, 0, sizeof(*c));
	server_mailbox_reset();
}

/* Wait for one client completion; 0 on timeout. */
static int cli_wait(struct rps__cq *cq, struct rps__wc *wc)
{
	uint64_t deadline = rps__now_ns() + WAIT_MS * 1000000ull;
	int n;

	do {
		n = rps__cq_wait(cq, wc, 1, 100);
		if (n < 0) {
			fprintf(stderr, "cq_wait: %s\n", rps__errbuf());
			return 0;
		}
		if (n)
			return 1;
	} while (rps__now_ns() < deadline);
	return 0;
}

/* No completion shows up within ms (while progress is being made). */
static bool cli_quiet(struct rps__cq *cq, int ms)
{
	uint64_t deadline = rps__now_ns() + (uint64_t)ms * 1000000ull;
	struct rps__wc wc;

	while (rps__now_ns() < deadline)
		if (rps__cq_wait(cq, &wc, 1, 5) != 0)
			return false;
	return true;
}

static struct rps__wr wr_make(enum rps__op op, int flags, uint64_t wr_id, void *laddr, uint32_t len,
			      struct rps__mr *lmr, const void *raddr, uint32_t rkey)
{
	struct rps__wr wr = {
		.wr_id = wr_id,
		.op = op,
		.flags = flags,
		.sge = { .addr = laddr, .len = len, .mr = lmr },
		.raddr = (uint64_t)(uintptr_t)raddr,
		.rkey = rkey,
	};
	return wr;
}

static int post1(struct rps__ep *ep, struct rps__wr wr)
{
	int ret = rps__post(ep, &wr, 1);

	if (ret)
		fprintf(stderr, "post: %s\n", rps__errbuf());
	return ret;
}

/* Post one signaled op and wait for its completion: its status, or -1. */
static int run1(struct conn *c, struct rps__wr wr, struct rps__wc *wc)
{
	struct rps__wc local;

	wc = wc ? wc : &local;
	memset(wc, 0, sizeof(*wc));
	wr.flags |= RPS__WR_SIGNALED;
	if (post1(c->ep, wr))
		return -1;
	if (!cli_wait(c->cq, wc))
		return -1;
	CU_ASSERT_EQUAL(wc->wr_id, wr.wr_id);
	CU_ASSERT_PTR_EQUAL(wc->ep, c->ep);
	return (int)wc->status;
}

static void fill(uint8_t *p, size_t len, unsigned seed)
{
	size_t i;

	for (i = 0; i < len; i++)
		p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 9));
}

static bool all_bytes(const uint8_t *p, size_t len, uint8_t v)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i] != v)
			return false;
	return true;
}

static uint32_t bad_rkey(void)
{
	return rps__mr_rkey(srv_mr) ^ 0x40000000u;
}

/* ------------------------------------------------------------------------ */
/* connection management                                                    */

static void test_connect_private_data(void)
{
	static const char hello[] = "worker 3 of 8, epoch 12";
	static const char welcome[] = "shard map v42";
	uint8_t full[RPS__PRIVDATA_MAX], reply[RPS__PRIVDATA_MAX];
	struct rps__ep *ep, *sep;
	struct rps__cq *cq;
	size_t reply_len = sizeof(reply);
	int ret;

	CU_ASSERT_NOT_EQUAL(rps__listener_port(srv.listener), 0);
	CU_ASSERT_FATAL(rps__cq_create(cli_fab, 64, &cq) == 0);

	server_policy(false, welcome, sizeof(welcome));
	ret = rps__connect(cli_fab, g_addr, rps__listener_port(srv.listener), cq, NULL,
			   hello, sizeof(hello), WAIT_MS, reply, &reply_len, &ep);
	CU_ASSERT_EQUAL_FATAL(ret, 0);
	CU_ASSERT_EQUAL(reply_len, sizeof(welcome));
	CU_ASSERT(memcmp(reply, welcome, sizeof(welcome)) == 0);
	sep = server_take_ep();
	CU_ASSERT_PTR_NOT_NULL_FATAL(sep);
	pthread_mutex_lock(&srv.lock);
	CU_ASSERT_EQUAL(srv.req_len, sizeof(hello));
	CU_ASSERT(memcmp(srv.req_data, hello, sizeof(hello)) == 0);
	pthread_mutex_unlock(&srv.lock);
	CU_ASSERT(strlen(rps__ep_peer(ep)) > 0);
	CU_ASSERT(strlen(rps__ep_peer(sep)) > 0);
	CU_ASSERT_EQUAL(rps__ep_is_error(ep), 0);
	rps__ep_set_context(ep, &ret);
	CU_ASSERT_PTR_EQUAL(rps__ep_context(ep), &ret);
	rps__ep_close(ep);
	rps__ep_close(sep);

	/* the full 56 bytes both ways */
	fill(full, sizeof(full), 9);
	server_policy(false, full, sizeof(full));
	memset(reply, 0, sizeof(reply));
	reply_len = sizeof(reply);
	ret = rps__connect(cli_fab, g_addr, rps__listener_port(srv.listener), cq, NULL,
			   full, sizeof(full), WAIT_MS, reply, &reply_len, &ep);
	CU_ASSERT_EQUAL_FATAL(ret, 0);
	CU_ASSERT_EQUAL(reply_len, RPS__PRIVDATA_MAX);
	CU_ASSERT(memcmp(reply, full, sizeof(full)) == 0);
	sep = server_take_ep();
	CU_ASSERT_PTR_NOT_NULL_FATAL(sep);
	pthread_mutex_lock(&srv.lock);
	CU_ASSERT_EQUAL(srv.req_len, RPS__PRIVDATA_MAX);
	CU_ASSERT(memcmp(srv.req_data, full, sizeof(full)) == 0);
	pthread_mutex_unlock(&srv.lock);
	rps__ep_close(ep);
	rps__ep_close(sep);

	/* no data either way */
	server_policy(false, NULL, 0);
	reply_len = sizeof(reply);
	ret = rps__connect(cli_fab, g_addr, rps__listener_port(srv.listener), cq, NULL,
			   NULL, 0, WAIT_MS, reply, &reply_len, &ep);
	CU_ASSERT_EQUAL_FATAL(ret, 0);
	CU_ASSERT_EQUAL(reply_len, 0);
	sep = server_take_ep();
	CU_ASSERT_PTR_NOT_NULL_FATAL(sep);
	pthread_mutex_lock(&srv.lock);
	CU_ASSERT_EQUAL(srv.req_len, 0);
	pthread_mutex_unlock(&srv.lock);
	rps__ep_close(ep);
	rps__ep_close(sep);

	/* private data over the limit is refused before anything is sent */
	CU_ASSERT_EQUAL(rps__connect(cli_fab, g_addr, rps__listener_port(srv.listener), cq, NULL,
				     full, RPS__PRIVDATA_MAX + 1, WAIT_MS, NULL, NULL, &ep), -EINVAL);
	rps__cq_destroy(cq);
	server_mailbox_reset();
}

/* Step d until it is over, sleeping on its descriptor in between. */
static int dial_finish(struct rps__dial *d, void *reply, size_t *reply_len, struct rps__ep **out)
{
	for (;;) {
		struct pollfd p = { .fd = -1 };
		int ret = rps__dial_step(d, reply, reply_len, out);

		if (ret != -EINPROGRESS)
			return ret;
		p.fd = rps__dial_fd(d, &p.events);
		if (p.fd >= 0)
			poll(&p, 1, 50);
	}
}

/* The non-blocking connect: it completes as rps__connect does; to a
 * listener whose owner never answers (a peer whose host is gone without a
 * reset, or whose loop is stuck), each step returns at once (-EINPROGRESS)
 * until the deadline, then -ETIMEDOUT; a dial under way can be cancelled. */
static void test_dial(void)
{
	static const char hello[] = "dialing member 1";
	static const char welcome[] = "member 1 here";
	uint8_t reply[RPS__PRIVDATA_MAX];
	size_t reply_len = sizeof(reply);
	struct rps__listener *hole;
	struct rps__conn_req *req;
	struct rps__dial *d;
	struct rps__ep *ep, *sep;
	struct rps__cq *cq;
	uint16_t port;
	int ret, steps = 0;
	short events;

	CU_ASSERT_FATAL(rps__cq_create(cli_fab, 64, &cq) == 0);
	server_policy(false, welcome, sizeof(welcome));
	CU_ASSERT_EQUAL_FATAL(rps__dial_start(cli_fab, g_addr, rps__listener_port(srv.listener), cq, NULL,
					      hello, sizeof(hello), WAIT_MS, &d), 0);
	ret = dial_finish(d, reply, &reply_len, &ep);
	CU_ASSERT_EQUAL_FATAL(ret, 0);
	CU_ASSERT_EQUAL(reply_len, sizeof(welcome));
	CU_ASSERT(memcmp(reply, welcome, sizeof(welcome)) == 0);
	sep = server_take_ep();
	CU_ASSERT_PTR_NOT_NULL_FATAL(sep);
	pthread_mutex_lock(&srv.lock);
	CU_ASSERT_EQUAL(srv.req_len, sizeof(hello));
	CU_ASSERT(memcmp(srv.req_data, hello, sizeof(hello)) == 0);
	pthread_mutex_unlock(&srv.lock);
	rps__ep_close(ep);
	rps__ep_close(sep);
	server_mailbox_reset();
	CU_ASSERT_EQUAL(rps__dial_start(cli_fab, g_addr, 1, cq, NULL, hello, RPS__PRIVDATA_MAX + 1, WAIT_MS, &d),
			-EINVAL);
	CU_ASSERT_EQUAL(rps__dial_start(cli_fab, g_addr, 1, cq, NULL, hello, sizeof(hello), -1, &d), -EINVAL);

	/* a black hole: a listener nobody serves (tcp: the kernel completes
	 * the socket's handshake; verbs: the REQ waits at the listener's CM
	 * channel), so nothing ever answers */
	CU_ASSERT_EQUAL_FATAL(rps__listen(srv_fab, g_addr, 0, &hole), 0);
	port = rps__listener_port(hole);
	CU_ASSERT_EQUAL_FATAL(rps__dial_start(cli_fab, g_addr, port, cq, NULL, hello, sizeof(hello), 300, &d), 0);
	do {
		struct pollfd p = { .fd = -1 };
		ret = rps__dial_step(d, reply, &reply_len, &ep);
		if (ret != -EINPROGRESS)
			break;
		steps++;
		p.fd = rps__dial_fd(d, &p.events);
		CU_ASSERT(p.fd >= 0);
		poll(&p, 1, 20);
	} while (steps < 10000);
	CU_ASSERT_EQUAL(ret, -ETIMEDOUT);
	CU_ASSERT(steps >= 2);	/* the steps before the deadline did not wait for it */
	CU_ASSERT_EQUAL(reply_len, 0);
	/* it did reach the listener, with its private data */
	req = NULL;
	CU_ASSERT_EQUAL(vpeer_wait_request(hole, &req), 0);
	if (req) {
		size_t len;
		const void *data = rps__conn_req_data(req, &len);

		CU_ASSERT(len == sizeof(hello) && memcmp(data, hello, len) == 0);
		rps__reject(req, NULL, 0);
	}

	/* cancelled while it waits for the answer */
	CU_ASSERT_EQUAL_FATAL(rps__dial_start(cli_fab, g_addr, port, cq, NULL, hello, sizeof(hello), WAIT_MS, &d), 0);
	ret = rps__dial_step(d, reply, &reply_len, &ep);
	CU_ASSERT_EQUAL(ret, -EINPROGRESS);
	if (ret == -EINPROGRESS) {	/* (else it is over, and freed) */
		CU_ASSERT(rps__dial_fd(d, &events) >= 0);
		rps__dial_cancel(d);
	}
	rps__listener_close(hole);
	rps__cq_destroy(cq);
}

static void test_reject_private_data(void)
{
	static const char why[] = "shard 7 moved to server 2";
	uint8_t reply[RPS__PRIVDATA_MAX];
	size_t reply_len = sizeof(reply);
	struct rps__ep *ep = NULL;
	struct rps__cq *cq;
	int ret, nreq;

	CU_ASSERT_FATAL(rps__cq_create(cli_fab, 64, &cq) == 0);
	pthread_mutex_lock(&srv.lock);
	nreq = srv.nreq;
	pthread_mutex_unlock(&srv.lock);
	server_policy(true, why, sizeof(why));
	ret = rps__connect(cli_fab, g_addr, rps__listener_port(srv.listener), cq, NULL,
			   "let me in", 9, WAIT_MS, reply, &reply_len, &ep);
	server_policy(false, NULL, 0);
	CU_ASSERT_EQUAL(ret, -ECONNREFUSED);
	CU_ASSERT_EQUAL(reply_len, sizeof(why));
	CU_ASSERT(memcmp(reply, why, sizeof(why)) == 0);
	CU_ASSERT(strlen(rps__errbuf()) > 0);
	pthread_mutex_lock(&srv.lock);
	CU_ASSERT_EQUAL(srv.nreq, nreq + 1);
	CU_ASSERT_EQUAL(srv.req_len, 9);
	CU_ASSERT(memcmp(srv.req_data, "let me in", 9) == 0);
	CU_ASSERT_EQUAL(srv.naccepted, 0);
	pthread_mutex_unlock(&srv.lock);

	if (g_kind == RPS__KIND_TCP) {
		/* nobody listening: refused too, with no data */
		struct rps__listener *l;
		uint16_t port;

		CU_ASSERT_FATAL(rps__listen(srv_fab, g_addr, 0, &l) == 0);
		port = rps__listener_port(l);
		rps__listener_close(l);
		reply_len = sizeof(reply);
		ret = rps__connect(cli_fab, g_addr, port, cq, NULL, NULL, 0, WAIT_MS, reply, &reply_len, &ep);
		CU_ASSERT_EQUAL(ret, -ECONNREFUSED);
		CU_ASSERT_EQUAL(reply_len, 0);
	}
	rps__cq_destroy(cq);
}

/* TCP only: the 72-byte hello of the tcp provider, as a foreign or broken
 * peer would send it (little-endian magic "RPSt", version, type, data_len,
 * sq_depth, rq_depth, 56 bytes of data). */
static void put_le(uint8_t *p, uint64_t v, int bytes)
{
	int i;

	for (i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void raw_hello(uint8_t *h, uint32_t magic, uint16_t version, uint8_t type)
{
	memset(h, 0, 72);
	put_le(h, magic, 4);
	put_le(h + 4, version, 2);
	h[6] = type;
	put_le(h + 8, 16, 4);	/* sq_depth */
	put_le(h + 12, 16, 4);	/* rq_depth */
}

static bool raw_read(int fd, uint8_t *buf, size_t len)
{
	ssize_t n;

	while (len) {
		n = recv(fd, buf, len, 0);
		if (n <= 0)
			return false;
		buf += n;
		len -= (size_t)n;
	}
	return true;
}

struct fake_server {
	int lfd;
	uint8_t reply[72];
};

/* Accept one connection, read its hello, answer with a crafted reply. */
static void *fake_server_main(void *arg)
{
	struct fake_server *fs = arg;
	uint8_t hello[72];
	int fd = accept(fs->lfd, NULL, NULL);

	if (fd >= 0) {
		if (raw_read(fd, hello, sizeof(hello)))
			send(fd, fs->reply, sizeof(fs->reply), MSG_NOSIGNAL);
		close(fd);
	}
	return NULL;
}

static int connect_to_fake(uint32_t magic, uint16_t version, uint8_t type)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t slen = sizeof(sin);
	struct fake_server fs;
	struct rps__ep *ep = NULL;
	struct rps__cq *cq;
	pthread_t tid;
	int ret;

	fs.lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (fs.lfd < 0 || bind(fs.lfd, (struct sockaddr *)&sin, sizeof(sin)) || listen(fs.lfd, 1) ||
	    getsockname(fs.lfd, (struct sockaddr *)&sin, &slen))
		return -1000;
	raw_hello(fs.reply, magic, version, type);
	if (rps__cq_create(cli_fab, 64, &cq))
		return -1001;
	pthread_create(&tid, NULL, fake_server_main, &fs);
	ret = rps__connect(cli_fab, "127.0.0.1", ntohs(sin.sin_port), cq, NULL, NULL, 0, WAIT_MS,
			   NULL, NULL, &ep);
	pthread_join(tid, NULL);
	close(fs.lfd);
	if (ret == 0)
		rps__ep_close(ep);
	rps__cq_destroy(cq);
	return ret;
}

static void test_handshake_checks(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	uint8_t hello[72], reply[72];
	struct conn c;
	int fd;

	if (g_kind != RPS__KIND_TCP || strcmp(g_addr, "127.0.0.1") != 0)
		return;
	/* a listener that speaks something else, or speaks it big-endian, or
	 * another version: the connector says so */
	CU_ASSERT_EQUAL(connect_to_fake(0x50545448u /* "HTTP" */, 1, 2), -EPROTO);
	CU_ASSERT_EQUAL(connect_to_fake(__builtin_bswap32(0x74535052u), 1, 2), -EPROTO);
	CU_ASSERT(strstr(rps__errbuf(), "big-endian") != NULL);
	CU_ASSERT_EQUAL(connect_to_fake(0x74535052u, 2, 2), -EPROTO);
	CU_ASSERT(strstr(rps__errbuf(), "version") != NULL);
	/* sanity of the fake: a well-formed ACCEPT is taken */
	CU_ASSERT_EQUAL(connect_to_fake(0x74535052u, 1, 2), 0);

	/* a connector of another version: our listener answers BAD_PROTOCOL
	 * (with its own version) and hangs up, and keeps serving others */
	sin.sin_port = htons(rps__listener_port(srv.listener));
	fd = socket(AF_INET, SOCK_STREAM, 0);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0);
	raw_hello(hello, 0x74535052u, 99, 1);
	CU_ASSERT(send(fd, hello, sizeof(hello), MSG_NOSIGNAL) == (ssize_t)sizeof(hello));
	CU_ASSERT(raw_read(fd, reply, sizeof(reply)));
	CU_ASSERT(memcmp(reply, hello, 4) == 0);
	CU_ASSERT(reply[4] == 1 && reply[5] == 0);	/* its version, 1 */
	CU_ASSERT_EQUAL(reply[6], 4);
	CU_ASSERT(recv(fd, reply, 1, 0) == 0);	/* then EOF */
	close(fd);
	/* garbage that never completes a hello does not block other connectors */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0);
	CU_ASSERT(send(fd, "GET /", 5, MSG_NOSIGNAL) == 5);
	CU_ASSERT_FATAL(conn_open(&c) == 0);
	conn_close(&c);
	close(fd);
}

/* tcp: WRITE frames that arrive a few bytes at a time on two connections
 * at once, so that the listener's reads end inside headers and payloads of
 * both in turn (its endpoints read into their CQ's one buffer, each keeping
 * the start of a header it has not all of yet): every byte lands where its
 * frame said, and neither endpoint errs. */
static void test_dribbled_frames(void)
{
	enum { NC = 2, NF = 40, FRAME_MAX = TCP_HDR_BYTES + 64, REGION = 32768 };
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	static uint8_t stream[NC][NF * FRAME_MAX], expect[NC][REGION];
	size_t len[NC] = { 0 }, sent[NC] = { 0 };
	struct rps__ep *sep[NC];
	uint32_t k, f, i, off, step = 0;
	uint8_t hello[72];
	int fd[NC];
	bool all;

	if (g_kind != RPS__KIND_TCP || strcmp(g_addr, "127.0.0.1") != 0)
		return;
	memset(srv_mem, 0, NC * REGION);
	memset(expect, 0, sizeof(expect));
	sin.sin_port = htons(rps__listener_port(srv.listener));
	for (k = 0; k < NC; k++) {
		fd[k] = socket(AF_INET, SOCK_STREAM, 0);
		CU_ASSERT_FATAL(fd[k] >= 0);
		CU_ASSERT_FATAL(connect(fd[k], (struct sockaddr *)&sin, sizeof(sin)) == 0);
		raw_hello(hello, 0x74535052u, 1, 1);	/* CONNECT */
		CU_ASSERT_FATAL(send(fd[k], hello, sizeof(hello), MSG_NOSIGNAL) == (ssize_t)sizeof(hello));
		CU_ASSERT_FATAL(raw_read(fd[k], hello, sizeof(hello)));
		CU_ASSERT_EQUAL_FATAL(hello[6], 2);	/* ACCEPT */
		sep[k] = server_take_ep();
		CU_ASSERT_FATAL(sep[k] != NULL);
		{	/* for the last frame's immediate */
			struct rps__sge sge = { srv_recv_mem + k * 64, 64, srv_recv_mr };
			CU_ASSERT_EQUAL_FATAL(rps__post_recv(sep[k], &sge, k), 0);
		}
		/* NF WRITEs of 1..60 bytes, one after the other in k's region,
		 * the last a WRITE_IMM: its completion, taken from the server
		 * thread's mailbox under its lock, says (and orders) that every
		 * byte before it is in place */
		for (f = 0, off = 0; f < NF; f++) {
			uint32_t plen = 1 + (f * 13 + k * 5) % 60;
			uint8_t *h = stream[k] + len[k];

			memset(h, 0, TCP_HDR_BYTES);
			h[0] = f == NF - 1 ? 3 : 2;	/* WRITE_IMM, WRITE */
			put_le(h + 40, k + 1, 4);	/* imm */
			put_le(h + 4, plen, 4);
			put_le(h + 8, f + 1, 4);	/* seq */
			put_le(h + 12, rps__mr_rkey(srv_mr), 4);
			put_le(h + 16, (uint64_t)(uintptr_t)(srv_mem + k * REGION + off), 8);
			for (i = 0; i < plen; i++)
				h[TCP_HDR_BYTES + i] = expect[k][off + i] = (uint8_t)(k * 97 + f * 31 + i + 1);
			len[k] += TCP_HDR_BYTES + plen;
			off += plen;
		}
	}
	/* pieces of 1..23 bytes, the connections in turn, a pause between */
	do {
		all = true;
		for (k = 0; k < NC; k++) {
			size_t piece = RPS__MIN((size_t)(1 + (step * 7 + k * 3) % 23), len[k] - sent[k]);

			if (piece) {
				CU_ASSERT_FATAL(send(fd[k], stream[k] + sent[k], piece, MSG_NOSIGNAL) == (ssize_t)piece);
				sent[k] += piece;
			}
			all &= sent[k] == len[k];
		}
		step++;
		usleep(200);
	} while (!all);
	for (k = 0; k < NC; k++) {
		struct rps__wc wc;

		CU_ASSERT_FATAL(server_wait_wc(sep[k], &wc));
		CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
		CU_ASSERT_EQUAL(wc.imm, k + 1);
		CU_ASSERT(memcmp(srv_mem + k * REGION, expect[k], REGION) == 0);
		CU_ASSERT_EQUAL(rps__ep_is_error(sep[k]), 0);
		close(fd[k]);
		rps__ep_close(sep[k]);
	}
	server_mailbox_reset();
}

/* tcp: a listener out of file descriptors (EMFILE).  A child process
 * listens with no descriptor left to take, and 8 connections wait in its
 * backlog: its get_request must come back (before, it looped on the
 * readable backlog forever, and a server so stuck never ran its loop
 * again, nor stopped), and the connections are closed unread, so that
 * they do not wait on a server that cannot take them. */
static void test_listener_out_of_fds(void)
{
	enum { NCONN = 8 };
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int pp[2], gp[2], fds[NCONN], status = -1, k, closed = 0;
	uint16_t port = 0;
	char c;
	pid_t pid;

	if (g_kind != RPS__KIND_TCP || strcmp(g_addr, "127.0.0.1") != 0)
		return;
	CU_ASSERT_FATAL(pipe(pp) == 0 && pipe(gp) == 0);	/* (port out, go in) */
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		struct rps__fabric_attr fattr = { .kind = RPS__KIND_TCP, .host = "127.0.0.1" };
		struct rps__fabric *fab;
		struct rps__listener *l;
		struct rps__conn_req *req;
		struct rlimit rl;
		uint64_t end;
		int fd, calls = 0;

		alarm(20);	/* a get_request that never returns fails the test */
		if (rps__fabric_open(&fattr, &fab) || rps__listen(fab, "127.0.0.1", 0, &l))
			_exit(2);
		port = rps__listener_port(l);
		/* no descriptor left: the lowest free one is the limit */
		fd = dup(0);
		close(fd);
		if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
			_exit(3);
		rl.rlim_cur = (rlim_t)fd;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			_exit(3);
		if (write(pp[1], &port, sizeof(port)) != (ssize_t)sizeof(port) || read(gp[0], &c, 1) != 1)
			_exit(4);
		for (end = rps__now_ns() + 1500000000ull; rps__now_ns() < end; calls++)
			if (rps__listener_get_request(l, &req) == 0)
				_exit(5);	/* (nothing can be accepted) */
		_exit(calls > 1 ? 0 : 6);
	}
	CU_ASSERT_FATAL(read(pp[0], &port, sizeof(port)) == (ssize_t)sizeof(port));
	sin.sin_port = htons(port);
	for (k = 0; k < NCONN; k++) {
		fds[k] = socket(AF_INET, SOCK_STREAM, 0);
		CU_ASSERT_FATAL(fds[k] >= 0);
		CU_ASSERT_FATAL(connect(fds[k], (struct sockaddr *)&sin, sizeof(sin)) == 0);
	}
	CU_ASSERT_FATAL(write(gp[1], "g", 1) == 1);
	for (k = 0; k < NCONN; k++) {
		struct timeval tv = { 5, 0 };
		ssize_t n;

		setsockopt(fds[k], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		n = recv(fds[k], &c, 1, 0);
		closed += n == 0 || (n < 0 && errno == ECONNRESET);
		close(fds[k]);
	}
	CU_ASSERT_EQUAL(closed, NCONN);
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(pp[0]);
	close(pp[1]);
	close(gp[0]);
	close(gp[1]);
}

/* ------------------------------------------------------------------------ */
/* one-sided operations                                                     */

static void test_write_read_back(void)
{
	const uint32_t big = 4u << 20;
	struct rps__wc wc;
	struct conn c;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	memset(srv_mem, 0, SRV_LEN);

	/* small, unaligned */
	fill(cli_mem, 100, 1);
	CU_ASSERT_EQUAL(run1(&c, wr_make(RPS__OP_WRITE, 0, 1, cli_mem, 100, cli_mr, srv_mem + 3,
					 rps__mr_rkey(srv_mr)), &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_WRITE);
	CU_ASSERT(memcmp(srv_mem + 3, cli_mem, 100) == 0);
	CU_ASSERT(all_bytes(srv_mem, 3, 0));
	CU_ASSERT(all_bytes(srv_mem + 103, 64, 0));

	/* large: several socket buffers' worth, straight from/to registered memory */
	fill(cli_mem, big, 2);
	CU_ASSERT_EQUAL(run1(&c, wr_make(RPS__OP_WRITE, 0, 2, cli_mem, big, cli_mr, srv_mem,
					 rps__mr_rkey(srv_mr)), NULL), RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(srv_mem, cli_mem, big) == 0);
	memset(cli_mem + big, 0, big);
	CU_ASSERT_EQUAL(run1(&c, wr_make(RPS__OP_READ, 0, 3, cli_mem + big, big, cli_mr, srv_mem,
					 rps__mr_rkey(srv_mr)), &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_READ);
	CU_ASSERT(memcmp(cli_mem + big, cli_mem, big) == 0);

	/* inline: the source may change right after post */
	fill(cli_mem, 48, 3);
	CU_ASSERT_EQUAL(post1(c.ep, wr_make(RPS__OP_WRITE, RPS__WR_SIGNALED | RPS__WR_INLINE, 4,
					    cli_mem, 48, NULL, srv_mem + 4096, rps__mr_rkey(srv_mr))), 0);
	memcpy(cli_mem + 64, cli_mem, 48);
	memset(cli_mem, 0xEE, 48);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(srv_mem + 4096, cli_mem + 64, 48) == 0);
	CU_ASSERT_EQUAL(rps__ep_is_error(c.ep), 0);
	conn_close(&c);
}

/* RC ordering: WRITEs posted before a WRITE_IMM are in memory when the
 * immediate's receive completion is seen. */
static void test_writes_then_write_imm(void)
{
	enum { NW = 16, CHUNK = 64 << 10, TAIL = 256 };
	struct rps__wr wr[NW + 1];
	struct rps__sge rsge = { srv_recv_mem, 64, srv_recv_mr };
	struct rps__wc wc;
	struct conn c;
	int i;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	memset(srv_mem, 0, (NW + 1) * CHUNK);
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &rsge, 900), 0);
	for (i = 0; i < NW; i++) {
		fill(cli_mem + (size_t)i * CHUNK, CHUNK, 10 + i);
		wr[i] = wr_make(RPS__OP_WRITE, 0, 100 + i, cli_mem + (size_t)i * CHUNK, CHUNK, cli_mr,
				srv_mem + (size_t)i * CHUNK, rps__mr_rkey(srv_mr));
	}
	fill(cli_mem + (size_t)NW * CHUNK, TAIL, 99);
	wr[NW] = wr_make(RPS__OP_WRITE_IMM, RPS__WR_SIGNALED, 200, cli_mem + (size_t)NW * CHUNK, TAIL, cli_mr,
			 srv_mem + (size_t)NW * CHUNK, rps__mr_rkey(srv_mr));
	wr[NW].imm = 0xC0FFEE01;
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, NW + 1), 0);

	CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_RECV_IMM);
	CU_ASSERT_EQUAL(wc.wr_id, 900);
	CU_ASSERT_EQUAL(wc.imm, 0xC0FFEE01);
	CU_ASSERT_EQUAL(wc.byte_len, TAIL);
	CU_ASSERT(memcmp(srv_mem, cli_mem, (size_t)NW * CHUNK + TAIL) == 0);

	/* exactly one send completion: the signaled WRITE_IMM */
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 200);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_WRITE);
	CU_ASSERT(cli_quiet(c.cq, 30));
	conn_close(&c);
}

static void test_read(void)
{
	static const struct { uint32_t off, len; } cases[] = {
		{ 0, 1 }, { 4095, 3 }, { 8, 8 }, { (1u << 20) + 7, 100000 }, { SRV_LEN - 65536, 65536 },
	};
	struct rps__wr wr[RPS__ARRAY_SIZE(cases)];
	uint8_t *dst = cli_mem;
	struct rps__wc wc;
	struct conn c;
	size_t i, off = 0;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	fill(srv_mem, SRV_LEN, 77);
	memset(cli_mem, 0, 1u << 20);
	for (i = 0; i < RPS__ARRAY_SIZE(cases); i++) {
		wr[i] = wr_make(RPS__OP_READ, RPS__WR_SIGNALED, 10 + i, dst + off, cases[i].len, cli_mr,
				srv_mem + cases[i].off, rps__mr_rkey(srv_mr));
		off += cases[i].len + 16;
	}
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, (int)RPS__ARRAY_SIZE(cases)), 0);
	off = 0;
	for (i = 0; i < RPS__ARRAY_SIZE(cases); i++) {
		CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
		CU_ASSERT_EQUAL(wc.wr_id, 10 + i);	/* posting order */
		CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
		CU_ASSERT_EQUAL(wc.opcode, RPS__WC_READ);
		CU_ASSERT(memcmp(dst + off, srv_mem + cases[i].off, cases[i].len) == 0);
		CU_ASSERT(all_bytes(dst + off + cases[i].len, 16, 0));
		off += cases[i].len + 16;
	}
	conn_close(&c);
}

static void test_cas(void)
{
	uint64_t *word = (uint64_t *)(srv_mem + 0x1000);
	uint64_t *old = (uint64_t *)cli_mem;
	struct rps__wr wr;
	struct rps__wc wc;
	struct conn c;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	memset(srv_mem + 0x1000 - 64, 0xAA, 64);
	memset(srv_mem + 0x1008, 0xAA, 64);
	*word = 42;

	wr = wr_make(RPS__OP_CAS, 0, 1, old, 8, cli_mr, word, rps__mr_rkey(srv_mr));
	wr.compare_add = 42;
	wr.swap = 7;
	*old = 0;
	CU_ASSERT_EQUAL(run1(&c, wr, &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_CAS);
	CU_ASSERT_EQUAL(*old, 42);
	CU_ASSERT_EQUAL(*word, 7);

	/* compare fails: old value returned, memory untouched */
	wr.wr_id = 2;
	wr.swap = 9;
	*old = 0;
	CU_ASSERT_EQUAL(run1(&c, wr, &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(*old, 7);
	CU_ASSERT_EQUAL(*word, 7);

	/* full 64-bit values */
	*word = 0xFEDCBA9876543210ull;
	wr.wr_id = 3;
	wr.compare_add = 0xFEDCBA9876543210ull;
	wr.swap = 0x0123456789ABCDEFull;
	CU_ASSERT_EQUAL(run1(&c, wr, &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(*old, 0xFEDCBA9876543210ull);
	CU_ASSERT_EQUAL(*word, 0x0123456789ABCDEFull);

	CU_ASSERT(all_bytes(srv_mem + 0x1000 - 64, 64, 0xAA));
	CU_ASSERT(all_bytes(srv_mem + 0x1008, 64, 0xAA));
	conn_close(&c);
}

static void test_fadd(void)
{
	uint64_t *word = (uint64_t *)(srv_mem + 0x2000);
	uint64_t *old = (uint64_t *)cli_mem;
	struct rps__wr wr;
	struct rps__wc wc;
	struct conn c;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	memset(srv_mem + 0x2008, 0xAA, 64);
	*word = 100;
	wr = wr_make(RPS__OP_FADD, 0, 1, old, 8, cli_mr, word, rps__mr_rkey(srv_mr));
	wr.compare_add = 5;
	CU_ASSERT_EQUAL(run1(&c, wr, &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_FADD);
	CU_ASSERT_EQUAL(*old, 100);
	CU_ASSERT_EQUAL(*word, 105);

	wr.wr_id = 2;
	wr.compare_add = UINT64_MAX;	/* -1, wrapping */
	CU_ASSERT_EQUAL(run1(&c, wr, &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(*old, 105);
	CU_ASSERT_EQUAL(*word, 104);
	CU_ASSERT(all_bytes(srv_mem + 0x2008, 64, 0xAA));
	conn_close(&c);
}

/* ------------------------------------------------------------------------ */
/* two-sided                                                                */

static uint32_t burst_len(uint32_t k)
{
	return 8 + k % 57;	/* 8..64 bytes */
}

static void burst_fill(uint8_t *p, uint32_t k)
{
	uint32_t i, len = burst_len(k);

	memcpy(p, &k, 4);
	for (i = 4; i < len; i++)
		p[i] = (uint8_t)(k * 7 + i);
}

/* More SENDs than posted receives; the receiver reposts each buffer as it
 * completes.  Nothing lost, nothing reordered, every byte right. */
static void test_send_recv_burst(void)
{
	enum { NRECV = 8, SLOT = 64, NMSG = 1000 };
	struct rps__ep_attr attr = { .sq_depth = 64 };
	uint8_t expect[SLOT];
	struct rps__wc wc;
	struct conn c;
	uint32_t posted = 0, sent_done = 0, received = 0, i;
	uint64_t deadline;

	CU_ASSERT_FATAL(conn_open_attr(&c, &attr) == 0);
	for (i = 0; i < NRECV; i++) {
		struct rps__sge sge = { srv_recv_mem + i * SLOT, SLOT, srv_recv_mr };

		CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &sge, i), 0);
	}
	deadline = rps__now_ns() + 4 * WAIT_MS * 1000000ull;
	while ((received < NMSG || sent_done < NMSG) && rps__now_ns() < deadline) {
		/* sender: post until the send queue is full */
		while (posted < NMSG) {
			/* two buffers per send-queue slot: a refused post must not
			 * overwrite the buffer of a SEND still in flight (verbs is
			 * zero-copy) */
			uint8_t *buf = cli_mem + (posted % 128) * SLOT;
			int flags = RPS__WR_SIGNALED | (posted % 3 == 0 ? RPS__WR_INLINE : 0);
			struct rps__wr wr = wr_make(RPS__OP_SEND, flags, posted, buf, burst_len(posted),
						    flags & RPS__WR_INLINE ? NULL : cli_mr, NULL, 0);
			int ret;

			burst_fill(buf, posted);
			ret = rps__post(c.ep, &wr, 1);
			if (ret == -EAGAIN)
				break;
			CU_ASSERT_EQUAL_FATAL(ret, 0);
			posted++;
		}
		/* sender: completions, in posting order */
		while (rps__cq_poll(c.cq, &wc, 1) == 1) {
			CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
			CU_ASSERT_EQUAL(wc.opcode, RPS__WC_SEND);
			CU_ASSERT_EQUAL(wc.wr_id, sent_done);
			sent_done++;
		}
		/* receiver: check, repost */
		pthread_mutex_lock(&srv.lock);
		i = srv.nmail > 0;
		pthread_mutex_unlock(&srv.lock);
		while (i && received < NMSG && server_wait_wc(c.sep, &wc)) {
			struct rps__sge sge = { srv_recv_mem + wc.wr_id * SLOT, SLOT, srv_recv_mr };

			CU_ASSERT_EQUAL_FATAL(wc.status, RPS__WC_SUCCESS);
			CU_ASSERT_EQUAL(wc.opcode, RPS__WC_RECV);
			CU_ASSERT_EQUAL(wc.wr_id, received % NRECV);	/* receives consumed in posting order */
			CU_ASSERT_EQUAL(wc.byte_len, burst_len(received));
			burst_fill(expect, received);
			CU_ASSERT(memcmp(sge.addr, expect, burst_len(received)) == 0);
			received++;
			CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &sge, wc.wr_id), 0);
			pthread_mutex_lock(&srv.lock);
			i = srv.nmail > 0;
			pthread_mutex_unlock(&srv.lock);
		}
		if (sent_done < posted)
			rps__cq_wait(c.cq, &wc, 0, 1);
	}
	CU_ASSERT_EQUAL(received, NMSG);
	CU_ASSERT_EQUAL(sent_done, NMSG);
	CU_ASSERT_EQUAL(rps__ep_is_error(c.ep), 0);
	CU_ASSERT_EQUAL(rps__ep_is_error(c.sep), 0);
	conn_close(&c);
}

/* Two connections' WRITE streams into one server CQ at once (tcp: its
 * endpoints read into one buffer in turn): hundreds of KiB in flight of
 * odd-sized frames small enough to go through that buffer; every byte
 * lands where its WRITE said.  (Reads that end inside a header:
 * test_dribbled_frames.) */
static void test_write_two_streams(void)
{
	enum { NW = 3000, NC = 2, SPAN = 4u << 20 };
	struct rps__ep_attr attr = { .sq_depth = 512 };
	uint32_t posted[NC] = { 0 }, done[NC] = { 0 }, off[NC] = { 0 }, i, k;
	struct rps__wc wc[64];
	struct conn c[NC];
	uint64_t deadline;
	bool more = true;
	int n;

	for (k = 0; k < NC; k++) {
		CU_ASSERT_FATAL(conn_open_attr(&c[k], &attr) == 0);
		for (i = 0; i < SPAN; i++)
			cli_mem[k * SPAN + i] = (uint8_t)(i * 131 + k * 17 + (i >> 12));
		memset(srv_mem + k * SPAN, 0, SPAN);
	}
	deadline = rps__now_ns() + 8 * WAIT_MS * 1000000ull;
	while (more && rps__now_ns() < deadline) {
		more = false;
		for (k = 0; k < NC; k++) {
			while (posted[k] < NW) {
				/* 1..1,999 bytes: below the direct-read size, through the buffer */
				uint32_t len = 1 + (posted[k] * 7919u + k * 101u) % 1999u;
				struct rps__wr wr = wr_make(RPS__OP_WRITE, RPS__WR_SIGNALED, posted[k],
							    cli_mem + k * SPAN + off[k], len, cli_mr,
							    srv_mem + k * SPAN + off[k], rps__mr_rkey(srv_mr));
				int ret = rps__post(c[k].ep, &wr, 1);

				if (ret == -EAGAIN)
					break;
				CU_ASSERT_EQUAL_FATAL(ret, 0);
				off[k] += len;
				posted[k]++;
			}
			while ((n = rps__cq_poll(c[k].cq, wc, 64)) > 0)
				for (i = 0; i < (uint32_t)n; i++) {
					CU_ASSERT_EQUAL(wc[i].status, RPS__WC_SUCCESS);
					CU_ASSERT_EQUAL(wc[i].wr_id, done[k]);
					done[k]++;
				}
			more |= done[k] < NW;
		}
	}
	for (k = 0; k < NC; k++) {
		CU_ASSERT_EQUAL(done[k], NW);
		CU_ASSERT(off[k] < SPAN);
		CU_ASSERT(memcmp(srv_mem + k * SPAN, cli_mem + k * SPAN, off[k]) == 0);
		CU_ASSERT_EQUAL(rps__ep_is_error(c[k].ep), 0);
		CU_ASSERT_EQUAL(rps__ep_is_error(c[k].sep), 0);
	}
	for (k = 0; k < NC; k++)
		conn_close(&c[k]);
}

static void test_send_too_large(void)
{
	struct rps__sge small = { srv_recv_mem, 16, srv_recv_mr };
	struct rps__sge next = { srv_recv_mem + 64, 64, srv_recv_mr };
	struct rps__wc wc;
	struct conn c;
	int st;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &small, 77), 0);
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &next, 78), 0);
	fill(cli_mem, 64, 5);
	/* The receiver NAKs it (remote invalid request: REM_OP_ERR here) and
	 * moves its endpoint to the error state.  Over a fabric that can
	 * drop that NAK (rxe under load did, once in a CI run), the sender's
	 * retries then meet an endpoint in error and end in RETRY_EXC_ERR
	 * (transport.h: a peer in error or gone).  Either is a failed SEND;
	 * anything else is not. */
	st = run1(&c, wr_make(RPS__OP_SEND, 0, 1, cli_mem, 64, cli_mr, NULL, 0), &wc);
	if (st != RPS__WC_REM_OP_ERR && st != RPS__WC_RETRY_EXC_ERR)
		fprintf(stderr, "\n  the SEND completed with status %d\n", st);
	CU_ASSERT(st == RPS__WC_REM_OP_ERR || st == RPS__WC_RETRY_EXC_ERR);
	CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 77);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_LOC_ERR);
	CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 78);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_FLUSH_ERR);
	CU_ASSERT(rps__ep_is_error(c.ep));
	CU_ASSERT(server_ep_error_soon(c.sep));
	conn_close(&c);
}

/* ------------------------------------------------------------------------ */
/* errors                                                                   */

static void test_unsignaled_with_failure(void)
{
	struct rps__wr wr[21];
	struct rps__wc wc;
	struct conn c;
	int i;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	memset(srv_mem, 0, 1 << 16);
	fill(cli_mem, 1 << 16, 21);

	/* 20 unsignaled + 1 signaled: exactly one completion */
	for (i = 0; i < 21; i++)
		wr[i] = wr_make(RPS__OP_WRITE, i == 20 ? RPS__WR_SIGNALED : 0, 1000 + i, cli_mem + i * 1024, 1024,
				cli_mr, srv_mem + i * 1024, rps__mr_rkey(srv_mr));
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, 21), 0);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 1020);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	CU_ASSERT(cli_quiet(c.cq, 30));
	CU_ASSERT(memcmp(srv_mem, cli_mem, 21 * 1024) == 0);

	/* good, good, bad (all unsignaled), then a signaled good one */
	memset(srv_mem + 0x8000, 0, 0x4000);
	wr[0] = wr_make(RPS__OP_WRITE, 0, 1, cli_mem, 512, cli_mr, srv_mem + 0x8000, rps__mr_rkey(srv_mr));
	wr[1] = wr_make(RPS__OP_WRITE, 0, 2, cli_mem + 512, 512, cli_mr, srv_mem + 0x9000, rps__mr_rkey(srv_mr));
	wr[2] = wr_make(RPS__OP_WRITE, 0, 3, cli_mem + 1024, 512, cli_mr, srv_mem + 0xA000, bad_rkey());
	wr[3] = wr_make(RPS__OP_WRITE, RPS__WR_SIGNALED, 4, cli_mem + 1536, 512, cli_mr, srv_mem + 0xB000,
			rps__mr_rkey(srv_mr));
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, 4), 0);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 3);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 4);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_FLUSH_ERR);
	CU_ASSERT(cli_quiet(c.cq, 30));
	CU_ASSERT(memcmp(srv_mem + 0x8000, cli_mem, 512) == 0);
	CU_ASSERT(memcmp(srv_mem + 0x9000, cli_mem + 512, 512) == 0);
	CU_ASSERT(all_bytes(srv_mem + 0xA000, 512, 0));
	CU_ASSERT(all_bytes(srv_mem + 0xB000, 512, 0));
	conn_close(&c);
}

static void test_wrong_rkey(void)
{
	struct rps__sge rsge[2] = { { srv_recv_mem, 64, srv_recv_mr }, { srv_recv_mem + 64, 64, srv_recv_mr } };
	struct rps__wr wr[3];
	struct rps__wc wc;
	struct conn c;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &rsge[0], 100), 0);
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &rsge[1], 101), 0);
	memset(srv_mem, 0, 0x10000);
	fill(cli_mem, 0x2000, 31);
	memset(cli_mem + 0x4000, 0xEE, 256);
	wr[0] = wr_make(RPS__OP_WRITE, RPS__WR_SIGNALED, 1, cli_mem, 0x1000, cli_mr, srv_mem, bad_rkey());
	wr[1] = wr_make(RPS__OP_WRITE, RPS__WR_SIGNALED, 2, cli_mem + 0x1000, 0x1000, cli_mr, srv_mem + 0x4000,
			rps__mr_rkey(srv_mr));
	wr[2] = wr_make(RPS__OP_READ, RPS__WR_SIGNALED, 3, cli_mem + 0x4000, 256, cli_mr, srv_mem + 0x8000,
			rps__mr_rkey(srv_mr));
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, 3), 0);

	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 1);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 2);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_FLUSH_ERR);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 3);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_FLUSH_ERR);
	CU_ASSERT(rps__ep_is_error(c.ep));
	CU_ASSERT(all_bytes(srv_mem, 0x10000, 0));		/* nothing written */
	CU_ASSERT(all_bytes(cli_mem + 0x4000, 256, 0xEE));	/* nothing read */

	/* the target went to the error state too: its receives are flushed */
	CU_ASSERT(server_ep_error_soon(c.sep));
	CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 100);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_FLUSH_ERR);
	CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 101);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_FLUSH_ERR);

	/* posting to an endpoint in error flushes */
	CU_ASSERT_EQUAL(run1(&c, wr_make(RPS__OP_WRITE, 0, 9, cli_mem, 8, cli_mr, srv_mem,
					 rps__mr_rkey(srv_mr)), NULL), RPS__WC_FLUSH_ERR);
	CU_ASSERT(all_bytes(srv_mem, 8, 0));
	conn_close(&c);
}

/* One op on a fresh connection; returns its status. */
static int run_fresh(struct rps__wr wr)
{
	struct conn c;
	int status;

	if (conn_open(&c))
		return -1;
	status = run1(&c, wr, NULL);
	if (status != RPS__WC_SUCCESS && !rps__ep_is_error(c.ep))
		status = -2;	/* a failed op must leave the endpoint in error */
	conn_close(&c);
	return status;
}

static void test_out_of_bounds(void)
{
	uint8_t *region = srv_bounds_mem + GUARD;
	uint32_t rkey = rps__mr_rkey(srv_bounds_mr);

	memset(srv_bounds_mem, 0x11, GUARD + 4096 + GUARD);
	fill(cli_mem, 64, 41);

	/* WRITE straddling the end: nothing written, neither inside nor past */
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 1, cli_mem, 16, cli_mr, region + 4096 - 8, rkey)),
			RPS__WC_REM_ACCESS_ERR);
	/* WRITE starting before the region */
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 2, cli_mem, 16, cli_mr, region - 8, rkey)),
			RPS__WC_REM_ACCESS_ERR);
	/* WRITE entirely past the end */
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 3, cli_mem, 16, cli_mr, region + 4096, rkey)),
			RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT(all_bytes(srv_bounds_mem, GUARD + 4096 + GUARD, 0x11));

	/* READ straddling the end / starting before: the local buffer keeps its bytes */
	memset(cli_mem + 4096, 0xEE, 64);
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_READ, 0, 4, cli_mem + 4096, 16, cli_mr, region + 4096 - 8, rkey)),
			RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_READ, 0, 5, cli_mem + 4096, 16, cli_mr, region - 1, rkey)),
			RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT(all_bytes(cli_mem + 4096, 64, 0xEE));

	/* the exact region works */
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 6, cli_mem, 16, cli_mr, region + 4096 - 16, rkey)),
			RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(region + 4096 - 16, cli_mem, 16) == 0);
	CU_ASSERT(all_bytes(region + 4096, GUARD, 0x11));
}

static void test_misaligned_atomic(void)
{
	uint64_t *aligned = (uint64_t *)(srv_mem + 0x3000);
	struct rps__wr wr;

	memset(srv_mem + 0x3000, 0, 32);
	wr = wr_make(RPS__OP_CAS, 0, 1, cli_mem, 8, cli_mr, srv_mem + 0x3004, rps__mr_rkey(srv_mr));
	wr.compare_add = 0;
	wr.swap = UINT64_MAX;
	CU_ASSERT_EQUAL(run_fresh(wr), RPS__WC_REM_ACCESS_ERR);
	wr = wr_make(RPS__OP_FADD, 0, 2, cli_mem, 8, cli_mr, srv_mem + 0x3002, rps__mr_rkey(srv_mr));
	wr.compare_add = 1;
	CU_ASSERT_EQUAL(run_fresh(wr), RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT(all_bytes(srv_mem + 0x3000, 32, 0));
	(void)aligned;
}

static void test_missing_rights(void)
{
	uint32_t rkey = rps__mr_rkey(srv_ro_mr);
	struct rps__wr wr;

	fill(srv_ro_mem, 4096, 51);
	memcpy(cli_mem + 8192, srv_ro_mem, 4096);
	fill(cli_mem, 4096, 52);
	/* no REMOTE_WRITE: WRITE refused, nothing written */
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 1, cli_mem, 4096, cli_mr, srv_ro_mem, rkey)),
			RPS__WC_REM_ACCESS_ERR);
	/* no REMOTE_ATOMIC either */
	wr = wr_make(RPS__OP_FADD, 0, 2, cli_mem, 8, cli_mr, srv_ro_mem, rkey);
	wr.compare_add = 1;
	CU_ASSERT_EQUAL(run_fresh(wr), RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT(memcmp(srv_ro_mem, cli_mem + 8192, 4096) == 0);
	/* REMOTE_READ is granted */
	memset(cli_mem + 4096, 0, 4096);
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_READ, 0, 3, cli_mem + 4096, 4096, cli_mr, srv_ro_mem, rkey)),
			RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(cli_mem + 4096, srv_ro_mem, 4096) == 0);
}

static void test_dereg_revokes(void)
{
	uint8_t *mem = srv_mem + (4u << 20);
	struct rps__mr *mr, *mr2;
	uint32_t old_rkey;

	memset(mem, 0, 8192);
	CU_ASSERT_EQUAL_FATAL(rps__mr_reg(srv_fab, mem, 8192, RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ,
					  &mr), 0);
	old_rkey = rps__mr_rkey(mr);
	fill(cli_mem, 64, 61);
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 1, cli_mem, 64, cli_mr, mem, old_rkey)),
			RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(mem, cli_mem, 64) == 0);
	CU_ASSERT_EQUAL(rps__mr_dereg(mr), 0);

	fill(cli_mem + 64, 64, 62);
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 2, cli_mem + 64, 64, cli_mr, mem, old_rkey)),
			RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT(memcmp(mem, cli_mem, 64) == 0);	/* still the first write */

	/* the same memory registered again: a new key, and the old one stays dead */
	CU_ASSERT_EQUAL_FATAL(rps__mr_reg(srv_fab, mem, 8192, RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ,
					  &mr2), 0);
	CU_ASSERT_NOT_EQUAL(rps__mr_rkey(mr2), old_rkey);
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_READ, 0, 3, cli_mem + 128, 64, cli_mr, mem, old_rkey)),
			RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 4, cli_mem + 64, 64, cli_mr, mem, rps__mr_rkey(mr2))),
			RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(mem, cli_mem + 64, 64) == 0);
	CU_ASSERT_EQUAL(rps__mr_dereg(mr2), 0);
}

/* ---- memory windows ------------------------------------------------------ */

#define WIN_LEN 8192
#define WIN_ALL (RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC)

static uint8_t *win_mem(void)
{
	return srv_mem + (6u << 20);
}

static struct rps__mr *win_reg(void)
{
	struct rps__mr *mr = NULL;

	CU_ASSERT_EQUAL(rps__mr_reg(srv_fab, win_mem(), WIN_LEN, WIN_ALL | RPS__ACCESS_WINDOWED, &mr), 0);
	return mr;
}

/* The server binds a window on c's server side and tells the client its key
 * in a SEND, as rdmapsd does: the bind is ordered before the SEND, so the
 * key is valid by the time the client has it.  0, or -1. */
static int window_give(struct conn *c, struct rps__mr *mr, int access, uint32_t *rkey)
{
	struct rps__sge rsge = { .addr = cli_mem + CLI_LEN - 64, .len = 64, .mr = cli_mr };
	struct rps__wr wr;
	struct rps__wc wc = { .status = RPS__WC_GENERAL_ERR };
	uint32_t key;

	if (rps__post_recv(c->ep, &rsge, 77))
		return -1;
	if (rps__mw_bind(c->sep, mr, access, &key)) {
		fprintf(stderr, "mw_bind: %s\n", rps__errbuf());
		return -1;
	}
	wr = wr_make(RPS__OP_SEND, RPS__WR_SIGNALED | RPS__WR_INLINE, 78, &key, sizeof(key), NULL, NULL, 0);
	server_mailbox_reset();	/* (a closed endpoint's flushes may share c->sep's address) */
	if (post1(c->sep, wr))
		return -1;
	if (!cli_wait(c->cq, &wc) || wc.status != RPS__WC_SUCCESS || wc.opcode != RPS__WC_RECV) {
		fprintf(stderr, "window_give: no RECV at the client (%s)\n", rps__wc_status_str(wc.status));
		return -1;
	}
	rps__cq_flush(c->cq);	/* (tcp holds the ACK for the next poll) */
	/* The server's SEND, posted from this thread while a server thread
	 * polls its CQ, completes there too (verbs once lost such a completion
	 * when it came before the post had filled its ring slot). */
	if (!server_wait_wc(c->sep, &wc) || wc.status != RPS__WC_SUCCESS || wc.wr_id != 78) {
		fprintf(stderr, "window_give: the server's SEND did not complete\n");
		return -1;
	}
	memcpy(rkey, cli_mem + CLI_LEN - 64, sizeof(*rkey));
	return 0;
}

/* A window's key works on its connection and nowhere else; the region's own
 * key reaches nothing remotely. */
static void test_window_scoped(void)
{
	struct rps__mr *mr = win_reg();
	uint8_t *mem = win_mem();
	struct rps__wr wr;
	struct conn a;
	uint32_t key;
	int scoped = rps__fabric_windows(srv_fab);

	CU_ASSERT_FATAL(mr != NULL);
	if (g_kind == RPS__KIND_TCP)
		CU_ASSERT_EQUAL(scoped, 1);
	memset(mem, 0, WIN_LEN);
	CU_ASSERT_EQUAL_FATAL(conn_open(&a), 0);
	CU_ASSERT_EQUAL_FATAL(window_give(&a, mr, WIN_ALL, &key), 0);

	/* on its own connection: every right it was given */
	fill(cli_mem, 4096, 71);
	CU_ASSERT_EQUAL(run1(&a, wr_make(RPS__OP_WRITE, 0, 1, cli_mem, 4096, cli_mr, mem, key), NULL),
			RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(mem, cli_mem, 4096) == 0);
	memset(cli_mem + 4096, 0, 4096);
	CU_ASSERT_EQUAL(run1(&a, wr_make(RPS__OP_READ, 0, 2, cli_mem + 4096, 4096, cli_mr, mem, key), NULL),
			RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(cli_mem + 4096, mem, 4096) == 0);
	memset(mem + 4096, 0, 8);
	wr = wr_make(RPS__OP_CAS, 0, 3, cli_mem + 8192, 8, cli_mr, mem + 4096, key);
	wr.compare_add = 0;
	wr.swap = 0x1234;
	CU_ASSERT_EQUAL(run1(&a, wr, NULL), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(*(uint64_t *)(mem + 4096), 0x1234u);

	/* the same key on another connection: refused, nothing written */
	memcpy(cli_mem + 12288, mem, 4096);
	fill(cli_mem, 64, 72);
	if (scoped) {
		CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 4, cli_mem, 64, cli_mr, mem, key)),
				RPS__WC_REM_ACCESS_ERR);
		wr = wr_make(RPS__OP_CAS, 0, 5, cli_mem + 8192, 8, cli_mr, mem + 4096, key);
		wr.compare_add = 0x1234;
		wr.swap = 1;
		CU_ASSERT_EQUAL(run_fresh(wr), RPS__WC_REM_ACCESS_ERR);
		CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_READ, 0, 6, cli_mem + 4096, 64, cli_mr, mem, key)),
				RPS__WC_REM_ACCESS_ERR);
		/* nor does the region's own key (a guessed one) */
		CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_WRITE, 0, 7, cli_mem, 64, cli_mr, mem, rps__mr_rkey(mr))),
				RPS__WC_REM_ACCESS_ERR);
		CU_ASSERT(memcmp(mem, cli_mem + 12288, 4096) == 0);
		CU_ASSERT_EQUAL(*(uint64_t *)(mem + 4096), 0x1234u);
	} else {
		/* no type 2 windows: the region's key, on every connection */
		CU_ASSERT_EQUAL(key, rps__mr_rkey(mr));
		CU_ASSERT_EQUAL(run_fresh(wr_make(RPS__OP_READ, 0, 6, cli_mem + 4096, 64, cli_mr, mem, key)),
				RPS__WC_SUCCESS);
	}
	conn_close(&a);
	CU_ASSERT_EQUAL(rps__mr_dereg(mr), 0);
}

/* A window grants what it was bound with, not what the region has. */
static void test_window_rights(void)
{
	struct rps__mr *mr = win_reg();
	uint8_t *mem = win_mem();
	struct rps__wr wr;
	struct conn a;
	uint32_t key;

	CU_ASSERT_FATAL(mr != NULL);
	if (!rps__fabric_windows(srv_fab)) {
		/* no windows: a key has the region's rights (test_missing_rights) */
		CU_ASSERT_EQUAL(rps__mr_dereg(mr), 0);
		return;
	}
	fill(mem, WIN_LEN, 73);
	memcpy(cli_mem + 12288, mem, 4096);
	/* read-only (a reader's tensor): READ works, CAS and WRITE do not */
	CU_ASSERT_EQUAL_FATAL(conn_open(&a), 0);
	CU_ASSERT_EQUAL_FATAL(window_give(&a, mr, RPS__ACCESS_REMOTE_READ, &key), 0);
	memset(cli_mem, 0, 4096);
	CU_ASSERT_EQUAL(run1(&a, wr_make(RPS__OP_READ, 0, 1, cli_mem, 4096, cli_mr, mem, key), NULL),
			RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(cli_mem, mem, 4096) == 0);
	wr = wr_make(RPS__OP_CAS, 0, 2, cli_mem + 8192, 8, cli_mr, mem, key);
	wr.compare_add = *(uint64_t *)mem;
	wr.swap = 0;
	CU_ASSERT_EQUAL(run1(&a, wr, NULL), RPS__WC_REM_ACCESS_ERR);
	conn_close(&a);
	CU_ASSERT_EQUAL_FATAL(conn_open(&a), 0);
	CU_ASSERT_EQUAL_FATAL(window_give(&a, mr, RPS__ACCESS_REMOTE_READ, &key), 0);
	fill(cli_mem, 64, 74);
	CU_ASSERT_EQUAL(run1(&a, wr_make(RPS__OP_WRITE, 0, 3, cli_mem, 64, cli_mr, mem, key), NULL),
			RPS__WC_REM_ACCESS_ERR);
	conn_close(&a);
	CU_ASSERT(memcmp(mem, cli_mem + 12288, 4096) == 0);

	/* the contract's refusals, at bind time */
	CU_ASSERT_EQUAL_FATAL(conn_open(&a), 0);
	{
		uint32_t k2;
		CU_ASSERT_EQUAL(rps__mw_bind(a.sep, srv_ro_mr, RPS__ACCESS_REMOTE_READ, &k2), -EINVAL);
		CU_ASSERT_EQUAL(rps__mw_bind(a.sep, mr, 0, &k2), -EINVAL);
		CU_ASSERT_EQUAL(rps__mw_bind(a.sep, mr, RPS__ACCESS_WINDOWED, &k2), -EINVAL);
	}
	conn_close(&a);
	CU_ASSERT_EQUAL(rps__mr_dereg(mr), 0);
	{	/* rights the region does not have */
		struct rps__mr *ro = NULL;
		uint32_t k3;
		CU_ASSERT_EQUAL_FATAL(rps__mr_reg(srv_fab, mem, WIN_LEN, RPS__ACCESS_REMOTE_READ | RPS__ACCESS_WINDOWED,
						  &ro), 0);
		CU_ASSERT_EQUAL_FATAL(conn_open(&a), 0);
		CU_ASSERT_EQUAL(rps__mw_bind(a.sep, ro, RPS__ACCESS_REMOTE_WRITE, &k3), -EINVAL);
		conn_close(&a);
		CU_ASSERT_EQUAL(rps__mr_dereg(ro), 0);
	}
}

/* Deregistering the region takes its windows along (a saved key fails
 * afterwards, even on its own live connection); closing a connection takes
 * its windows, and the region stays usable through new ones. */
static void test_window_revoked(void)
{
	struct rps__mr *mr = win_reg();
	uint8_t *mem = win_mem();
	struct conn a, b;
	uint32_t ka, kb;
	uint64_t old = 0;
	int i;

	CU_ASSERT_FATAL(mr != NULL);
	memset(mem, 0, WIN_LEN);
	/* many connections come and go, each with its window */
	for (i = 0; i < 20; i++) {
		CU_ASSERT_EQUAL_FATAL(conn_open(&a), 0);
		CU_ASSERT_EQUAL_FATAL(window_give(&a, mr, WIN_ALL, &ka), 0);
		fill(cli_mem, 64, 80 + (unsigned)i);
		CU_ASSERT_EQUAL(run1(&a, wr_make(RPS__OP_WRITE, 0, 1, cli_mem, 64, cli_mr, mem, ka), NULL),
				RPS__WC_SUCCESS);
		CU_ASSERT(memcmp(mem, cli_mem, 64) == 0);
		conn_close(&a);
	}
	/* the local CAS reaches a windowed region (verbs: its own window on
	 * the loopback QP) */
	*(uint64_t *)(mem + 64) = 5;
	CU_ASSERT_EQUAL(rps__local_cas(srv_fab, mr, (uint64_t *)(void *)(mem + 64), 5, 6, &old), 0);
	CU_ASSERT_EQUAL(old, 5u);
	CU_ASSERT_EQUAL(*(uint64_t *)(mem + 64), 6u);

	CU_ASSERT_EQUAL_FATAL(conn_open(&a), 0);
	CU_ASSERT_EQUAL_FATAL(conn_open(&b), 0);
	CU_ASSERT_EQUAL_FATAL(window_give(&a, mr, WIN_ALL, &ka), 0);
	CU_ASSERT_EQUAL_FATAL(window_give(&b, mr, WIN_ALL, &kb), 0);
	if (rps__fabric_windows(srv_fab))
		CU_ASSERT_NOT_EQUAL(ka, kb);
	memcpy(cli_mem + 12288, mem, 4096);
	CU_ASSERT_EQUAL(rps__mr_dereg(mr), 0);
	fill(cli_mem, 64, 99);
	CU_ASSERT_EQUAL(run1(&a, wr_make(RPS__OP_WRITE, 0, 2, cli_mem, 64, cli_mr, mem, ka), NULL),
			RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT_EQUAL(run1(&b, wr_make(RPS__OP_READ, 0, 3, cli_mem + 4096, 64, cli_mr, mem, kb), NULL),
			RPS__WC_REM_ACCESS_ERR);
	CU_ASSERT(memcmp(mem, cli_mem + 12288, 4096) == 0);
	conn_close(&a);
	conn_close(&b);
}

static void test_peer_close_flushes(void)
{
	struct rps__sge sge;
	struct rps__wc wc;
	struct conn c;
	int i;

	/* the server closes: the client's posted receives flush, in order */
	CU_ASSERT_FATAL(conn_open(&c) == 0);
	for (i = 0; i < 4; i++) {
		sge = (struct rps__sge){ cli_mem + i * 64, 64, cli_mr };
		CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.ep, &sge, 50 + i), 0);
	}
	rps__ep_close(c.sep);
	c.sep = NULL;
	for (i = 0; i < 4; i++) {
		CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
		CU_ASSERT_EQUAL(wc.wr_id, (uint64_t)(50 + i));
		CU_ASSERT_EQUAL(wc.status, RPS__WC_FLUSH_ERR);
		CU_ASSERT_PTR_EQUAL(wc.ep, c.ep);
	}
	CU_ASSERT(rps__ep_is_error(c.ep));
	/* and anything posted afterwards flushes as well */
	CU_ASSERT_EQUAL(run1(&c, wr_make(RPS__OP_READ, 0, 60, cli_mem, 8, cli_mr, srv_mem,
					 rps__mr_rkey(srv_mr)), NULL), RPS__WC_FLUSH_ERR);
	/* closing drops the endpoint's completions still queued in its CQ */
	for (i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(post1(c.ep, wr_make(RPS__OP_WRITE, RPS__WR_SIGNALED, 61 + i, cli_mem, 8, cli_mr,
						    srv_mem, rps__mr_rkey(srv_mr))), 0);
	rps__ep_close(c.ep);
	c.ep = NULL;
	CU_ASSERT(cli_quiet(c.cq, 20));
	conn_close(&c);

	/* the client closes: the server's posted receives flush */
	CU_ASSERT_FATAL(conn_open(&c) == 0);
	for (i = 0; i < 3; i++) {
		sge = (struct rps__sge){ srv_recv_mem + i * 64, 64, srv_recv_mr };
		CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &sge, 70 + i), 0);
	}
	rps__ep_close(c.ep);
	c.ep = NULL;
	for (i = 0; i < 3; i++) {
		CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
		CU_ASSERT_EQUAL(wc.wr_id, (uint64_t)(70 + i));
		CU_ASSERT_EQUAL(wc.status, RPS__WC_FLUSH_ERR);
	}
	CU_ASSERT(rps__ep_is_error(c.sep));
	conn_close(&c);
}

static void test_sq_full(void)
{
	struct rps__ep_attr attr = { .sq_depth = 4 };
	struct rps__wr wr[4];
	struct rps__wc wc;
	struct conn c;
	int i;

	CU_ASSERT_FATAL(conn_open_attr(&c, &attr) == 0);
	for (i = 0; i < 4; i++)
		wr[i] = wr_make(RPS__OP_READ, RPS__WR_SIGNALED, i, cli_mem + i * 8, 8, cli_mr, srv_mem,
				rps__mr_rkey(srv_mr));
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, 4), 0);
	/* nobody polled the client CQ: the four are still outstanding */
	CU_ASSERT_EQUAL(rps__post(c.ep, wr, 1), -EAGAIN);
	for (i = 0; i < 4; i++) {
		CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
		CU_ASSERT_EQUAL(wc.wr_id, (uint64_t)i);
		CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	}
	CU_ASSERT_EQUAL(rps__post(c.ep, wr, 1), 0);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	conn_close(&c);
}

/* A READ may be overtaken by a later WRITE to the same place unless that
 * WRITE carries RPS__WR_FENCE: with the fence the READ sees the old value. */
static void test_fence(void)
{
	uint64_t *word = (uint64_t *)(srv_mem + 0x6000);
	uint64_t *got = (uint64_t *)cli_mem, *src = (uint64_t *)(cli_mem + 64);
	struct rps__wr wr[2];
	struct rps__wc wc;
	struct conn c;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	*word = 0x1111111111111111ull;
	*src = 0x2222222222222222ull;
	*got = 0;
	wr[0] = wr_make(RPS__OP_READ, RPS__WR_SIGNALED, 1, got, 8, cli_mr, word, rps__mr_rkey(srv_mr));
	wr[1] = wr_make(RPS__OP_WRITE, RPS__WR_SIGNALED | RPS__WR_FENCE, 2, src, 8, cli_mr, word,
			rps__mr_rkey(srv_mr));
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, 2), 0);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 1);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 2);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(*got, 0x1111111111111111ull);
	CU_ASSERT_EQUAL(*word, 0x2222222222222222ull);
	conn_close(&c);
}

/* A SEND that finds no receive posted is not complete until one is: RC
 * completion means the data sits in a receive buffer. */
static void test_send_before_recv(void)
{
	struct rps__sge rsge = { srv_recv_mem, 64, srv_recv_mr };
	struct rps__wr wr[2];
	struct rps__wc wc;
	struct conn c;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	memset(srv_mem + 0x7000, 0, 64);
	memset(srv_recv_mem, 0, 64);
	fill(cli_mem, 64, 81);
	wr[0] = wr_make(RPS__OP_SEND, RPS__WR_SIGNALED, 1, cli_mem, 40, cli_mr, NULL, 0);
	wr[1] = wr_make(RPS__OP_WRITE_IMM, RPS__WR_SIGNALED, 2, cli_mem + 40, 24, cli_mr, srv_mem + 0x7000,
			rps__mr_rkey(srv_mr));
	wr[1].imm = 0xABCD;
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, 2), 0);
	CU_ASSERT(cli_quiet(c.cq, 50));
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &rsge, 5), 0);
	CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 5);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_RECV);
	CU_ASSERT_EQUAL(wc.byte_len, 40);
	CU_ASSERT(memcmp(srv_recv_mem, cli_mem, 40) == 0);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 1);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_SEND);
	/* the WRITE_IMM waits for its receive the same way */
	CU_ASSERT(cli_quiet(c.cq, 30));
	rsge.addr = srv_recv_mem + 64;
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &rsge, 6), 0);
	CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 6);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_RECV_IMM);
	CU_ASSERT_EQUAL(wc.imm, 0xABCD);
	CU_ASSERT_EQUAL(wc.byte_len, 24);
	CU_ASSERT(memcmp(srv_mem + 0x7000, cli_mem + 40, 24) == 0);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 2);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	conn_close(&c);
}

/* A SEND posted while the TCP provider holds an ACK for the consumer's next
 * poll waits behind it; rps__cq_flush puts both on the wire without that
 * poll (a server about to fsync calls it).  Verbs holds nothing. */
static void test_flush_sends_held(void)
{
	struct rps__sge csge = { cli_mem + 0x1000, 64, cli_mr };
	struct rps__sge ssge = { srv_recv_mem, 64, srv_recv_mr };
	struct rps__wr wr;
	struct rps__wc wc;
	struct conn c;
	bool got = false;

	CU_ASSERT_FATAL(conn_open(&c) == 0);
	/* the server sends; the client's poll takes it and holds its ACK */
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.ep, &csge, 7), 0);
	fill(srv_recv_mem + 0x1000, 32, 5);
	wr = wr_make(RPS__OP_SEND, RPS__WR_SIGNALED, 8, srv_recv_mem + 0x1000, 32, srv_recv_mr, NULL, 0);
	CU_ASSERT_EQUAL_FATAL(post1(c.sep, wr), 0);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 7);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_RECV);
	/* the client answers and flushes, and does not poll */
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &ssge, 9), 0);
	fill(cli_mem, 40, 6);
	wr = wr_make(RPS__OP_SEND, RPS__WR_SIGNALED, 10, cli_mem, 40, cli_mr, NULL, 0);
	CU_ASSERT_EQUAL_FATAL(post1(c.ep, wr), 0);
	CU_ASSERT_EQUAL(rps__cq_flush(c.cq), 0);
	while (!got && server_wait_wc(c.sep, &wc)) {
		if (wc.wr_id == 8) {	/* the server's SEND, acknowledged by the same write */
			CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
			continue;
		}
		got = wc.wr_id == 9;
		CU_ASSERT_EQUAL(wc.opcode, RPS__WC_RECV);
		CU_ASSERT_EQUAL(wc.byte_len, 40);
		CU_ASSERT(memcmp(srv_recv_mem, cli_mem, 40) == 0);
	}
	CU_ASSERT(got);
	CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
	CU_ASSERT_EQUAL(wc.wr_id, 10);
	CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
	conn_close(&c);
}

/* TCP: the target buffers at most rq_depth (128 by default) early SENDs;
 * the next one fails with RNR_RETRY_EXC_ERR, everything else flushes.
 * (Verbs retries RNR per its rnr_retry setting, so this is TCP only.) */
static void test_rnr_bound(void)
{
	enum { N = 140, BOUND = 128 };
	struct rps__ep_attr attr = { .sq_depth = 256 };
	struct rps__wr wr[N];
	struct rps__wc wc;
	struct conn c;
	int i;

	if (g_kind != RPS__KIND_TCP)
		return;
	CU_ASSERT_FATAL(conn_open_attr(&c, &attr) == 0);
	for (i = 0; i < N; i++)
		wr[i] = wr_make(RPS__OP_SEND, RPS__WR_SIGNALED, (uint64_t)i, cli_mem, 16, cli_mr, NULL, 0);
	CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, wr, N), 0);
	for (i = 0; i < N; i++) {
		CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
		CU_ASSERT_EQUAL(wc.wr_id, (uint64_t)i);
		CU_ASSERT_EQUAL(wc.status, i == BOUND ? RPS__WC_RNR_RETRY_EXC_ERR : RPS__WC_FLUSH_ERR);
	}
	CU_ASSERT(rps__ep_is_error(c.ep));
	CU_ASSERT(server_ep_error_soon(c.sep));
	conn_close(&c);
}

/* ------------------------------------------------------------------------ */
/* atomicity under contention                                               */

struct racer {
	struct conn c;
	enum rps__op op;
	uint64_t *word;		/* remote */
	uint64_t *old;		/* local result word */
	int loops;
	uint64_t *seen;		/* old values of successful increments */
	int nseen;
	int failures;
};

static void *racer_main(void *arg)
{
	struct racer *r = arg;
	uint64_t expect = 0;
	struct rps__wr wr;
	struct rps__wc wc;
	int done = 0;

	while (done < r->loops) {
		wr = wr_make(r->op, RPS__WR_SIGNALED, (uint64_t)done, r->old, 8, cli_mr, r->word,
			     rps__mr_rkey(srv_mr));
		wr.compare_add = r->op == RPS__OP_CAS ? expect : 1;
		wr.swap = expect + 1;
		if (rps__post(r->c.ep, &wr, 1) || !cli_wait(r->c.cq, &wc) || wc.status != RPS__WC_SUCCESS) {
			r->failures++;
			return NULL;
		}
		if (r->op == RPS__OP_FADD || *r->old == expect) {
			r->seen[r->nseen++] = *r->old;
			done++;
			expect = *r->old + 1;
		} else {
			expect = *r->old;	/* lost the race: retry from what is there */
		}
	}
	return NULL;
}

/* Every increment applied once: the final value is exact, and no two
 * successful increments saw the same old value. */
static void check_race(struct racer *r, int n, uint64_t total, uint64_t final)
{
	uint8_t *hit = calloc((size_t)total, 1);
	uint64_t sum = 0;
	bool dup = false, range = true;
	int i, j;

	CU_ASSERT_FATAL(hit != NULL);
	for (i = 0; i < n; i++) {
		CU_ASSERT_EQUAL(r[i].failures, 0);
		CU_ASSERT_EQUAL(r[i].nseen, r[i].loops);
		sum += (uint64_t)r[i].nseen;
		for (j = 0; j < r[i].nseen; j++) {
			if (r[i].seen[j] >= total) {
				range = false;
				continue;
			}
			dup |= hit[r[i].seen[j]]++ != 0;
		}
	}
	CU_ASSERT_EQUAL(final, total);
	CU_ASSERT(!dup);
	CU_ASSERT(range);
	CU_ASSERT(sum <= total);
	free(hit);
}

/* nthreads clients, each on its own endpoint and CQ, increment one remote
 * word loops times each with op; with local_loops, this thread increments
 * the same word meanwhile with rps__local_cas on the server side. */
static void race(enum rps__op op, int nthreads, int loops, int local_loops)
{
	struct racer r[RACE_THREADS + 1];
	pthread_t tid[RACE_THREADS];
	uint64_t *word = (uint64_t *)(srv_mem + 0x5000);
	uint64_t expect = 0, old, total = 0;
	int i, n = nthreads, started = 0;

	*word = 0;
	memset(r, 0, sizeof(r));
	for (i = 0; i < nthreads; i++) {
		CU_ASSERT_FATAL(conn_open(&r[i].c) == 0);
		r[i].op = op;
		r[i].word = word;
		r[i].old = (uint64_t *)(cli_mem + i * 64);
		r[i].loops = loops;
		r[i].seen = calloc((size_t)loops, sizeof(uint64_t));
		CU_ASSERT_FATAL(r[i].seen != NULL);
		total += (uint64_t)loops;
	}
	if (local_loops) {
		r[n].loops = local_loops;
		r[n].seen = calloc((size_t)local_loops, sizeof(uint64_t));
		CU_ASSERT_FATAL(r[n].seen != NULL);
		total += (uint64_t)local_loops;
	}
	for (i = 0; i < nthreads; i++)
		if (pthread_create(&tid[i], NULL, racer_main, &r[i]) == 0)
			started++;
	CU_ASSERT_EQUAL(started, nthreads);

	while (r[n].nseen < local_loops) {
		if (rps__local_cas(srv_fab, srv_mr, word, expect, expect + 1, &old)) {
			fprintf(stderr, "local_cas: %s\n", rps__errbuf());
			r[n].failures++;
			break;
		}
		if (old == expect)
			r[n].seen[r[n].nseen++] = old;
		expect = old == expect ? old + 1 : old;
	}

	for (i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	check_race(r, n + (local_loops ? 1 : 0), total, __atomic_load_n(word, __ATOMIC_SEQ_CST));
	for (i = 0; i <= n; i++) {
		if (i < n)
			conn_close(&r[i].c);
		free(r[i].seen);
	}
}

static void test_cas_race(void)
{
	race(RPS__OP_CAS, RACE_THREADS, RACE_LOOPS, 0);
}

static void test_fadd_race(void)
{
	race(RPS__OP_FADD, RACE_THREADS, RACE_LOOPS, 0);
}

static void test_local_cas_mixed(void)
{
	race(RPS__OP_CAS, 2, RACE_LOOPS, RACE_LOOPS);
}

/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* scatter/gather                                                           */

/* WRITE and WRITE_IMM gather their entries, in order, into one contiguous
 * payload at the target; the entries come from two regions (a staging
 * buffer and "user" memory) and may be empty; the fabric counts the sum. */
static void test_gather_write(void)
{
	const uint32_t big = 3u << 20;
	uint8_t *user = malloc(big + 8);
	struct rps__sge rsge = { srv_recv_mem, 64, srv_recv_mr };
	struct rps__mr *user_mr = NULL;
	struct rps__wc wc;
	struct rps__wr wr;
	struct conn c;
	uint64_t tx0;

	CU_ASSERT_FATAL(user != NULL);
	CU_ASSERT_FATAL(conn_open(&c) == 0);
	CU_ASSERT_FATAL(rps__mr_reg(cli_fab, user, big + 8, RPS__ACCESS_LOCAL, &user_mr) == 0);
	memset(srv_mem, 0, 2 * big);

	/* a 64-byte "descriptor" from cli_mem, then 3 MiB from user memory,
	 * then an empty entry and 5 odd bytes: one WRITE_IMM */
	fill(cli_mem, 64, 21);
	fill(user, big + 8, 22);
	wr = wr_make(RPS__OP_WRITE_IMM, 0, 7, cli_mem, 64, cli_mr, srv_mem + 1, rps__mr_rkey(srv_mr));
	wr.sgl[1] = (struct rps__sge){ user + 3, big, user_mr };
	wr.sgl[2] = (struct rps__sge){ user, 0, user_mr };
	wr.sgl[3] = (struct rps__sge){ cli_mem + 100, 5, cli_mr };
	wr.num_sge = 4;
	wr.imm = 0xAB;
	fill(cli_mem + 100, 5, 23);
	CU_ASSERT_EQUAL_FATAL(rps__post_recv(c.sep, &rsge, 901), 0);
	tx0 = rps__fabric_tx_bytes(cli_fab);
	CU_ASSERT_EQUAL(run1(&c, wr, &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(rps__fabric_tx_bytes(cli_fab) - tx0, 64u + big + 5u);
	CU_ASSERT_FATAL(server_wait_wc(c.sep, &wc));
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_RECV_IMM);
	CU_ASSERT_EQUAL(wc.byte_len, 64u + big + 5u);
	CU_ASSERT_EQUAL(wc.imm, 0xAB);
	CU_ASSERT(all_bytes(srv_mem, 1, 0));
	CU_ASSERT(memcmp(srv_mem + 1, cli_mem, 64) == 0);
	CU_ASSERT(memcmp(srv_mem + 1 + 64, user + 3, big) == 0);
	CU_ASSERT(memcmp(srv_mem + 1 + 64 + big, cli_mem + 100, 5) == 0);
	CU_ASSERT(all_bytes(srv_mem + 1 + 64 + big + 5, 64, 0));

	/* inline with two entries: both copied at post time */
	wr = wr_make(RPS__OP_WRITE, RPS__WR_INLINE, 8, cli_mem + 200, 10, NULL, srv_mem + 8192,
		     rps__mr_rkey(srv_mr));
	wr.sgl[1] = (struct rps__sge){ cli_mem + 300, 20, NULL };
	wr.num_sge = 2;
	fill(cli_mem + 200, 200, 24);
	memcpy(cli_mem + 4096, cli_mem + 200, 10);
	memcpy(cli_mem + 4096 + 10, cli_mem + 300, 20);
	CU_ASSERT_EQUAL(run1(&c, wr, NULL), RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(srv_mem + 8192, cli_mem + 4096, 30) == 0);

	/* too many entries, or one outside its region: refused at post */
	wr = wr_make(RPS__OP_WRITE, 0, 9, cli_mem, 64, cli_mr, srv_mem, rps__mr_rkey(srv_mr));
	wr.num_sge = RPS__WR_MAX_SGE + 1;
	CU_ASSERT_EQUAL(rps__post(c.ep, &wr, 1), -EINVAL);
	wr.num_sge = 2;
	wr.sgl[1] = (struct rps__sge){ user, 64, cli_mr };
	CU_ASSERT_EQUAL(rps__post(c.ep, &wr, 1), -EINVAL);
	CU_ASSERT_EQUAL(rps__ep_is_error(c.ep), 0);

	rps__mr_dereg(user_mr);
	conn_close(&c);
	free(user);
}

/* A READ scatters in order over its entries: a header into one buffer,
 * the rest into another region, with an odd split. */
static void test_scatter_read(void)
{
	const uint32_t hdr = 64, body = (2u << 20) + 13;
	float *user = malloc(body + 64);
	struct rps__mr *user_mr = NULL;
	struct rps__wc wc;
	struct rps__wr wr;
	struct conn c;

	CU_ASSERT_FATAL(user != NULL);
	CU_ASSERT_FATAL(conn_open(&c) == 0);
	CU_ASSERT_FATAL(rps__mr_reg(cli_fab, user, body + 64, RPS__ACCESS_LOCAL, &user_mr) == 0);
	fill(srv_mem, hdr + body, 31);
	memset(cli_mem, 0, hdr + 16);
	memset(user, 0, body + 64);
	wr = wr_make(RPS__OP_READ, 0, 11, cli_mem, hdr, cli_mr, srv_mem + 5, rps__mr_rkey(srv_mr));
	wr.sgl[1] = (struct rps__sge){ (uint8_t *)user + 7, body, user_mr };
	wr.num_sge = 2;
	CU_ASSERT_EQUAL(run1(&c, wr, &wc), RPS__WC_SUCCESS);
	CU_ASSERT_EQUAL(wc.opcode, RPS__WC_READ);
	CU_ASSERT(memcmp(cli_mem, srv_mem + 5, hdr) == 0);
	CU_ASSERT(all_bytes(cli_mem + hdr, 16, 0));
	CU_ASSERT(all_bytes((uint8_t *)user, 7, 0));
	CU_ASSERT(memcmp((uint8_t *)user + 7, srv_mem + 5 + hdr, body) == 0);
	CU_ASSERT(all_bytes((uint8_t *)user + 7 + body, 64 - 7, 0));

	/* small ones, an empty first entry, three pieces, several in one post */
	{
		struct rps__wr w[2];
		memset(cli_mem, 0, 4096);
		w[0] = wr_make(RPS__OP_READ, 0, 12, cli_mem, 0, cli_mr, srv_mem + 100, rps__mr_rkey(srv_mr));
		w[0].sgl[1] = (struct rps__sge){ cli_mem + 10, 3, cli_mr };
		w[0].sgl[2] = (struct rps__sge){ cli_mem + 20, 1, cli_mr };
		w[0].sgl[3] = (struct rps__sge){ cli_mem + 30, 40, cli_mr };
		w[0].num_sge = 4;
		w[1] = wr_make(RPS__OP_READ, RPS__WR_SIGNALED, 13, cli_mem + 200, 8, cli_mr, srv_mem + 100,
			       rps__mr_rkey(srv_mr));
		CU_ASSERT_EQUAL_FATAL(rps__post(c.ep, w, 2), 0);
		CU_ASSERT_FATAL(cli_wait(c.cq, &wc));
		CU_ASSERT_EQUAL(wc.wr_id, 13);
		CU_ASSERT_EQUAL(wc.status, RPS__WC_SUCCESS);
		CU_ASSERT(memcmp(cli_mem + 10, srv_mem + 100, 3) == 0);
		CU_ASSERT(memcmp(cli_mem + 20, srv_mem + 103, 1) == 0);
		CU_ASSERT(memcmp(cli_mem + 30, srv_mem + 104, 40) == 0);
		CU_ASSERT(all_bytes(cli_mem + 13, 7, 0) && all_bytes(cli_mem + 21, 9, 0));
		CU_ASSERT(memcmp(cli_mem + 200, srv_mem + 100, 8) == 0);
	}
	rps__mr_dereg(user_mr);
	conn_close(&c);
	free(user);
}

/* tcp sends from memory it never registered (the implicit region);
 * verbs has none. */
static void test_implicit_region(void)
{
	static uint8_t stack_like[1000];
	struct rps__mr *imr = NULL;
	struct rps__wr wr;
	struct conn c;
	int ret = rps__mr_reg_implicit(cli_fab, &imr);

	if (g_kind != RPS__KIND_TCP) {
		CU_ASSERT_EQUAL(ret, -EOPNOTSUPP);
		return;
	}
	CU_ASSERT_EQUAL_FATAL(ret, 0);
	CU_ASSERT_FATAL(conn_open(&c) == 0);
	fill(stack_like, sizeof(stack_like), 41);
	fill(cli_mem, 64, 42);
	memset(srv_mem, 0, 2048);
	wr = wr_make(RPS__OP_WRITE, 0, 14, cli_mem, 64, cli_mr, srv_mem, rps__mr_rkey(srv_mr));
	wr.sgl[1] = (struct rps__sge){ stack_like, sizeof(stack_like), imr };
	wr.num_sge = 2;
	CU_ASSERT_EQUAL(run1(&c, wr, NULL), RPS__WC_SUCCESS);
	CU_ASSERT(memcmp(srv_mem, cli_mem, 64) == 0);
	CU_ASSERT(memcmp(srv_mem + 64, stack_like, sizeof(stack_like)) == 0);
	/* no key names it: a peer cannot reach it */
	CU_ASSERT_EQUAL(run1(&c, wr_make(RPS__OP_WRITE, 0, 15, cli_mem, 8, cli_mr, stack_like,
					 rps__mr_rkey(imr)), NULL), RPS__WC_REM_ACCESS_ERR);
	conn_close(&c);
	rps__mr_dereg(imr);
}

static int suite_init(void)
{
	struct rps__fabric_attr fattr = { .kind = g_kind, .host = g_addr };
	int i, ret;

	if (rps__fabric_open(&fattr, &srv_fab) || rps__fabric_open(&fattr, &cli_fab)) {
		fprintf(stderr, "fabric_open: %s\n", rps__errbuf());
		return -1;
	}
	srv_mem = aligned_alloc(4096, SRV_LEN);
	srv_ro_mem = aligned_alloc(4096, SRV_RO_LEN);
	srv_recv_mem = aligned_alloc(4096, SRV_RECV_LEN);
	srv_bounds_mem = aligned_alloc(4096, GUARD + 4096 + GUARD);
	cli_mem = aligned_alloc(4096, CLI_LEN);
	if (!srv_mem || !srv_ro_mem || !srv_recv_mem || !srv_bounds_mem || !cli_mem)
		return -1;
	memset(srv_mem, 0, SRV_LEN);
	memset(cli_mem, 0, CLI_LEN);
	ret = rps__mr_reg(srv_fab, srv_mem, SRV_LEN,
			  RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_ATOMIC, &srv_mr);
	ret = ret ? ret : rps__mr_reg(srv_fab, srv_ro_mem, SRV_RO_LEN, RPS__ACCESS_REMOTE_READ, &srv_ro_mr);
	ret = ret ? ret : rps__mr_reg(srv_fab, srv_recv_mem, SRV_RECV_LEN, RPS__ACCESS_LOCAL, &srv_recv_mr);
	ret = ret ? ret : rps__mr_reg(srv_fab, srv_bounds_mem + GUARD, 4096,
				      RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ, &srv_bounds_mr);
	ret = ret ? ret : rps__mr_reg(cli_fab, cli_mem, CLI_LEN, RPS__ACCESS_LOCAL, &cli_mr);
	for (i = 0; i < SRV_THREADS; i++)
		ret = ret ? ret : rps__cq_create(srv_fab, 4096, &srv.cq[i]);
	ret = ret ? ret : rps__listen(srv_fab, g_addr, 0, &srv.listener);
	if (ret) {
		fprintf(stderr, "suite setup: %s\n", rps__errbuf());
		return -1;
	}
	for (i = 0; i < SRV_THREADS; i++)
		if (pthread_create(&srv.thread[i], NULL, server_main, (void *)(uintptr_t)i))
			return -1;
	return 0;
}

static int suite_clean(void)
{
	int i;

	pthread_mutex_lock(&srv.lock);
	srv.stop = true;
	pthread_mutex_unlock(&srv.lock);
	for (i = 0; i < SRV_THREADS; i++)
		pthread_join(srv.thread[i], NULL);
	while (srv.naccepted)
		rps__ep_close(srv.accepted[--srv.naccepted]);
	rps__listener_close(srv.listener);
	for (i = 0; i < SRV_THREADS; i++)
		rps__cq_destroy(srv.cq[i]);
	rps__mr_dereg(cli_mr);
	rps__mr_dereg(srv_bounds_mr);
	rps__mr_dereg(srv_recv_mr);
	rps__mr_dereg(srv_ro_mr);
	rps__mr_dereg(srv_mr);
	rps__fabric_close(cli_fab);
	rps__fabric_close(srv_fab);
	free(cli_mem);
	free(srv_bounds_mem);
	free(srv_recv_mem);
	free(srv_ro_mem);
	free(srv_mem);
	return 0;
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "connect and accept with private data", test_connect_private_data },
		{ "reject with private data", test_reject_private_data },
		{ "non-blocking dial: connects, times out on a silent listener, cancels", test_dial },
		{ "handshake checks magic, byte order, version (tcp)", test_handshake_checks },
		{ "frames a few bytes at a time on two connections at once (tcp)", test_dribbled_frames },
		{ "a listener out of file descriptors sheds its backlog and returns (tcp)", test_listener_out_of_fds },
		{ "WRITE then READ back", test_write_read_back },
		{ "WRITEs then WRITE_IMM: data placed before the immediate", test_writes_then_write_imm },
		{ "READ", test_read },
		{ "WRITE/WRITE_IMM gather several entries", test_gather_write },
		{ "READ scatters over several entries", test_scatter_read },
		{ "implicit region: send from unregistered memory (tcp)", test_implicit_region },
		{ "CAS success and failure", test_cas },
		{ "FADD", test_fadd },
		{ "SEND/RECV burst beyond the posted receives", test_send_recv_burst },
		{ "two connections' WRITE streams into one CQ: every byte where it was written", test_write_two_streams },
		{ "SEND larger than the posted receive", test_send_too_large },
		{ "unsignaled ops, a failing one still reported", test_unsignaled_with_failure },
		{ "wrong rkey: nothing written, later ops flushed", test_wrong_rkey },
		{ "out-of-bounds WRITE and READ", test_out_of_bounds },
		{ "misaligned atomic", test_misaligned_atomic },
		{ "region without the right", test_missing_rights },
		{ "dereg revokes remote access", test_dereg_revokes },
		{ "a memory window works on its connection alone", test_window_scoped },
		{ "a memory window grants the rights it was bound with", test_window_rights },
		{ "windows die with their region and their connection", test_window_revoked },
		{ "peer close flushes posted receives", test_peer_close_flushes },
		{ "send queue full gives -EAGAIN", test_sq_full },
		{ "FENCE: a READ is not overtaken by a fenced WRITE", test_fence },
		{ "SEND before any receive completes only once received", test_send_before_recv },
		{ "a SEND held behind an ACK leaves on cq_flush, without a poll", test_flush_sends_held },
		{ "early SENDs beyond the bound: RNR_RETRY_EXC_ERR (tcp)", test_rnr_bound },
		{ "CAS race: no lost increment", test_cas_race },
		{ "FADD race: no lost increment", test_fadd_race },
		{ "local CAS mixed with remote CAS", test_local_cas_mixed },
	};
	const char *kind = getenv("RPS_TEST_TRANSPORT");

	g_addr = getenv("RPS_TEST_ADDR");
	if (!g_addr || !*g_addr)
		g_addr = getenv("RXE_ADDR");	/* RoCE cannot route 127.0.0.1 */
	if (!g_addr || !*g_addr)
		g_addr = "127.0.0.1";
	if (!kind || !*kind || strcmp(kind, "tcp") == 0) {
		g_kind = RPS__KIND_TCP;
	} else if (strcmp(kind, "verbs") == 0) {
		g_kind = RPS__KIND_VERBS;
		if (!rps__verbs_available()) {
			fprintf(stderr, "test_transport: no RDMA device, verbs suite skipped\n");
			return 77;
		}
	} else {
		fprintf(stderr, "test_transport: RPS_TEST_TRANSPORT=%s: expected tcp or verbs\n", kind);
		return 2;
	}

	return cutest_run1(g_kind == RPS__KIND_TCP ? "transport (tcp)" : "transport (verbs)", suite_init,
			   suite_clean, NULL, NULL, tests, CUTEST_COUNT(tests));
}
