/*
 * fuzz_tcp.c - libFuzzer harness for the TCP provider's wire decoding
 * (src/transport/tcp/tcp_*.c): the 72-byte handshake hello and the frame stream.
 *
 * The provider's glue (tcp.c) and connection set-up (tcp_conn.c) are
 * included whole, for the static functions the harness drives (the
 * endpoint's close, ep_sizes_resolve, reply_copy); the codec and the engine
 * (rps__tcp_hello_get/check, rx_parse and the rx_* handlers behind ep_rx)
 * come from the product's objects through tcp_int.h.  So the harness runs
 * exactly the code the provider runs, without an entry point that would
 * exist only for tests.
 *
 * First byte even: the rest (zero-padded to 72 bytes) is a hello, checked
 * as the listener does; one that passes is turned into an endpoint the way
 * tcp_accept sizes it (its announced sq_depth sizes the response pool).
 * First byte odd: the rest is what the peer of an established endpoint
 * sends.  The endpoint (sq 16, rq 4) has two receives posted and a WRITE,
 * a READ and a CAS of its own outstanding (seq 1..3), so responses have
 * something to match; a region of 4 KiB is registered with every remote
 * right at a fixed address (FUZZ_REGION) under rkey 0x40000, so requests
 * in the seeds hit it.  The bytes are written to a socketpair, the write
 * side is shut down, and the CQ is polled until the endpoint closes.
 *
 * RPS_FUZZ_WRITE_SEEDS=DIR: write seed inputs made with the provider's
 * own encoders (rps__tcp_hello_put, rps__tcp_hdr_put) to DIR and exit.
 */
#include "../../src/transport/tcp/tcp.c"
#include "../../src/transport/tcp/tcp_conn.c"
#include "proto/proto.h"
#include "fuzz_common.h"

#include <fcntl.h>
#include <sys/mman.h>

#ifndef MAP_FIXED_NOREPLACE	/* older headers: the address is only a hint then */
#define MAP_FIXED_NOREPLACE 0
#endif

#define FUZZ_REGION 0x500000000000ull
#define FUZZ_REGION_LEN 4096u

static struct rps__fabric *fab;
static struct rps__cq *cq;
static uint8_t *region, *local;
static struct rps__mr *region_mr, *local_mr;

static void write_seeds(const char *dir);

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const struct rps__fabric_attr fa = { .kind = RPS__KIND_TCP };
	const char *seeds = getenv("RPS_FUZZ_WRITE_SEEDS");

	FUZZ_CHECK(rps__fabric_open(&fa, &fab) == 0);
	FUZZ_CHECK(rps__cq_create(fab, 256, &cq) == 0);
	region = mmap((void *)(uintptr_t)FUZZ_REGION, FUZZ_REGION_LEN, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (region == MAP_FAILED)	/* the fuzzer still runs, the seeds miss the region */
		region = mmap(NULL, FUZZ_REGION_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	FUZZ_CHECK(region != MAP_FAILED);
	local = calloc(1, 4096);
	FUZZ_CHECK(local);
	FUZZ_CHECK(rps__mr_reg(fab, region, FUZZ_REGION_LEN,
			       RPS__ACCESS_REMOTE_READ | RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_ATOMIC,
			       &region_mr) == 0);
	FUZZ_CHECK(rps__mr_reg(fab, local, 4096, RPS__ACCESS_LOCAL, &local_mr) == 0);
	if (seeds) {
		write_seeds(seeds);
		exit(0);
	}
	return 0;
}

static void fuzz_hello(const uint8_t *data, size_t size)
{
	uint8_t raw[TCP_HELLO_SIZE] = { 0 };
	struct wire_hello h;
	struct ep_sizes sz;
	struct tcp_ep *ep = NULL;
	uint8_t priv[RPS__PRIVDATA_MAX];
	size_t plen = 0;

	memcpy(raw, data, RPS__MIN(size, sizeof(raw)));
	rps__tcp_hello_get(&h, raw);
	if (rps__tcp_hello_check(&h, "fuzz") != 0)
		return;
	FUZZ_CHECK(h.data_len <= RPS__PRIVDATA_MAX);
	reply_copy(priv, &plen, &h);	/* the connector's view of an ACCEPT / REJECT */
	if (h.type != HELLO_CONNECT)
		return;
	/* the listener's: an endpoint sized by what the hello announced */
	FUZZ_CHECK(ep_sizes_resolve(NULL, &sz, "fuzz") == 0);
	if (rps__tcp_ep_create((struct tcp_fabric *)(void *)fab, (struct tcp_cq *)(void *)cq, -1, &sz, h.sq_depth,
		      "fuzz", &ep) == 0)
		rps__tcp_ep_free(ep);
}

static void drain_fd(int fd)
{
	static uint8_t sink[65536];
	while (read(fd, sink, sizeof(sink)) > 0)
		;
}

static void fuzz_frames(const uint8_t *data, size_t size)
{
	const struct ep_sizes sz = { .sq_depth = 16, .rq_depth = 4, .max_inline = 64 };
	struct tcp_ep *ep = NULL;
	struct rps__wc wc[16];
	int fds[2], i;
	size_t off = 0;

	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
	FUZZ_CHECK(fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0 && fcntl(fds[1], F_SETFL, O_NONBLOCK) == 0);
	FUZZ_CHECK(rps__tcp_ep_create((struct tcp_fabric *)(void *)fab, (struct tcp_cq *)(void *)cq, fds[0], &sz, 16,
			     "fuzz", &ep) == 0);
	FUZZ_CHECK(rps__tcp_ep_bind(ep) == 0);
	for (i = 0; i < 2; i++) {
		struct rps__sge sge = { .addr = local + 256 * i, .len = 256, .mr = local_mr };
		FUZZ_CHECK(rps__post_recv(&ep->base, &sge, 100 + i) == 0);
	}
	{
		struct rps__wr wr[3] = {
			{ .wr_id = 1, .op = RPS__OP_WRITE, .flags = RPS__WR_SIGNALED,
			  .sge = { local + 1024, 16, local_mr }, .raddr = 0x1000, .rkey = 0x40000 },
			{ .wr_id = 2, .op = RPS__OP_READ, .flags = RPS__WR_SIGNALED,
			  .sge = { local + 2048, 64, local_mr }, .raddr = 0x1000, .rkey = 0x40000 },
			{ .wr_id = 3, .op = RPS__OP_CAS, .flags = RPS__WR_SIGNALED,
			  .sge = { local + 3072, 8, local_mr }, .raddr = 0x1000, .rkey = 0x40000,
			  .compare_add = 0, .swap = 1 },
		};
		FUZZ_CHECK(rps__post(&ep->base, wr, 3) == 0);
	}
	/* the peer's bytes, then its FIN; the endpoint answers into fds[1] */
	while (off < size) {
		ssize_t n = write(fds[1], data + off, size - off);
		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		FUZZ_CHECK(n < 0 && errno == EAGAIN);
		(void)rps__cq_poll(cq, wc, 16);
		drain_fd(fds[1]);
	}
	shutdown(fds[1], SHUT_WR);
	for (i = 0; i < 64 && ep->conn != CONN_CLOSED; i++) {
		(void)rps__cq_poll(cq, wc, 16);
		drain_fd(fds[1]);
	}
	FUZZ_CHECK(ep->conn == CONN_CLOSED);	/* EOF must end it */
	while (rps__cq_poll(cq, wc, 16) > 0)
		;
	tcp_ep_close(&ep->base);
	close(fds[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (data[0] & 1)
		fuzz_frames(data + 1, size - 1);
	else
		fuzz_hello(data + 1, size - 1);
	return 0;
}

/* ---- seeds, made with the provider's encoders ---------------------------- */

static void seed(const char *dir, const char *name, uint8_t mode, const uint8_t *p, size_t n)
{
	char path[512];
	uint8_t *buf = malloc(n + 1);

	FUZZ_CHECK(buf);
	buf[0] = mode;
	memcpy(buf + 1, p, n);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fuzz_write_file(path, buf, n + 1);
	free(buf);
}

static size_t frame(uint8_t *out, uint8_t type, uint8_t status, uint32_t len, uint32_t seq, uint32_t rkey,
		    uint64_t raddr, uint64_t arg0, uint64_t arg1, uint32_t imm, const void *payload, uint32_t plen)
{
	struct wire_hdr h = { .type = type, .status = status, .len = len, .seq = seq, .rkey = rkey,
			      .raddr = raddr, .arg0 = arg0, .arg1 = arg1, .imm = imm };
	rps__tcp_hdr_put(out, &h);
	if (plen)
		memcpy(out + TCP_HDR_SIZE, payload, plen);
	return TCP_HDR_SIZE + plen;
}

static void write_seeds(const char *dir)
{
	static const char msg[] = "hello, target";
	const uint64_t ra = (uintptr_t)region;
	const uint32_t rk = region_mr->rkey;
	uint8_t buf[4096], data[64];
	size_t n;

	memset(data, 0xab, sizeof(data));
	/* hellos */
	{
		struct wire_hello h = { .magic = TCP_MAGIC, .version = TCP_VERSION, .type = HELLO_CONNECT,
					.data_len = 24, .sq_depth = 128, .rq_depth = 128 };
		struct rps__conn_priv priv = { .magic = RPS__DESC_MAGIC, .version = RPS__PROTO_VERSION,
					       .role = RPS__ROLE_WORKER };
		memcpy(h.data, &priv, sizeof(priv));
		rps__tcp_hello_put(buf, &h);
		seed(dir, "hello-connect", 0, buf, TCP_HELLO_SIZE);
		/* the largest depths a hello may announce */
		h.sq_depth = h.rq_depth = TCP_MAX_DEPTH;
		rps__tcp_hello_put(buf, &h);
		seed(dir, "issue10-item9-hello-max-depth", 0, buf, TCP_HELLO_SIZE);
		h.sq_depth = h.rq_depth = 128;
		h.type = HELLO_ACCEPT;
		rps__tcp_hello_put(buf, &h);
		seed(dir, "hello-accept", 0, buf, TCP_HELLO_SIZE);
		h.type = HELLO_REJECT;
		h.data_len = 5;
		memcpy(h.data, "nope", 5);
		rps__tcp_hello_put(buf, &h);
		seed(dir, "hello-reject", 0, buf, TCP_HELLO_SIZE);
	}
	/* requests as a peer sends them: one of each kind, in order */
	n = 0;
	n += frame(buf + n, F_SEND, 0, sizeof(msg), 1, 0, 0, 0, 0, 0, msg, sizeof(msg));
	n += frame(buf + n, F_WRITE, 0, 16, 2, rk, ra + 64, 0, 0, 0, data, 16);
	n += frame(buf + n, F_WRITE_IMM, 0, 8, 3, rk, ra + 128, 0, 0, 77, data, 8);
	n += frame(buf + n, F_READ, 0, 32, 4, rk, ra, 0, 0, 0, NULL, 0);
	n += frame(buf + n, F_CAS, 0, 8, 5, rk, ra + 8, 0, 5, 0, NULL, 0);
	n += frame(buf + n, F_FADD, 0, 8, 6, rk, ra + 16, 3, 0, 0, NULL, 0);
	seed(dir, "requests", 1, buf, n);
	/* a SEND beyond the posted receives (buffered as unexpected) */
	n = 0;
	n += frame(buf + n, F_SEND, 0, 4, 1, 0, 0, 0, 0, 0, "abc", 4);
	n += frame(buf + n, F_SEND, 0, 4, 2, 0, 0, 0, 0, 0, "def", 4);
	n += frame(buf + n, F_SEND, 0, 4, 3, 0, 0, 0, 0, 0, "ghi", 4);
	n += frame(buf + n, F_WRITE_IMM, 0, 4, 4, rk, ra, 0, 0, 1, data, 4);
	seed(dir, "sends-unexpected", 1, buf, n);
	/* responses to the endpoint's own WRITE (1), READ (2), CAS (3) */
	n = 0;
	n += frame(buf + n, F_ACK, 0, 0, 1, 0, 0, 0, 0, 0, NULL, 0);
	n += frame(buf + n, F_READ_RESP, 0, 64, 2, 0, 0, 0, 0, 0, data, 64);
	n += frame(buf + n, F_ATOMIC_RESP, 0, 0, 3, 0, 0, 42, 0, 0, NULL, 0);
	n += frame(buf + n, F_ACK, 0, 0, 3, 0, 0, 0, 0, 0, NULL, 0);
	seed(dir, "responses", 1, buf, n);
	/* a NAK of the READ */
	n = frame(buf, F_NAK, RPS__WC_REM_ACCESS_ERR, 0, 2, 0, 0, 1, 0, 0, NULL, 0);
	seed(dir, "nak", 1, buf, n);
	/* a refused access: bad key, then out of bounds */
	n = 0;
	n += frame(buf + n, F_WRITE, 0, 8, 1, rk ^ 1, ra, 0, 0, 0, data, 8);
	seed(dir, "bad-rkey", 1, buf, n);
	n = frame(buf, F_READ, 0, 64, 1, rk, ra + FUZZ_REGION_LEN - 8, 0, 0, 0, NULL, 0);
	seed(dir, "read-out-of-bounds", 1, buf, n);
}
