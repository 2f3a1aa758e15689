/*
 * test_verbs.c - verbs-specific tests of the transport (verbs/verbs.c) on a
 * real RDMA device: Soft-RoCE in the rxe VM (tests/../rxe-vm), or hardware.
 *
 * Exits 77 (skipped) when libibverbs finds no device.  RPS_TEST_ADDR picks
 * the address to listen on and connect to (default $RXE_ADDR, else
 * 127.0.0.1).
 *
 * Every test body runs in a forked child, and that child forks its peers
 * before it opens a fabric: librdmacm keeps process-global device contexts,
 * and a peer that inherited them would share them with its parent (its QPs
 * would then outlive it when killed).  The CUnit process itself never opens
 * a device; it only collects exit statuses, and kills a body that hangs.
 */
#include "config.h"
#include "transport/provider.h"	/* white-box: forges a region with a wrong rkey */
#include "common/common.h"
#include "lib/cutest.h"
#include "lib/verbs_peer.h"

#include <CUnit/Basic.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <dirent.h>

#include <errno.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                                        \
	do {                                                                            \
		if (!(c)) {                                                             \
			fprintf(stderr, "    %s:%d: CHECK(%s) failed [last error: %s]\n", \
				__FILE__, __LINE__, #c, rps__errbuf());                 \
			return 1;                                                       \
		}                                                                       \
	} while (0)

#define SEC 1000000000ull

static const char *test_addr(void)
{
	const char *a = getenv("RPS_TEST_ADDR");

	if (!a || !*a)
		a = getenv("RXE_ADDR");
	return a && *a ? a : "127.0.0.1";
}

static double secs_since(uint64_t t0)
{
	return (double)(rps__now_ns() - t0) / 1e9;
}

/* ---- harness ------------------------------------------------------------- */

/* Children leave with exit(), not _exit(): in a coverage build the exit
 * handlers write their counters, or everything the device tests run would go
 * unmeasured.  Nothing else is registered with atexit, and every fork is
 * preceded by fflush(NULL) or happens before anything is buffered. */
static void child_exit(int code)
{
	exit(code);
}

static int wait_child(pid_t pid, int timeout_s, int *status)
{
	uint64_t deadline = rps__now_ns() + (uint64_t)timeout_s * SEC;
	pid_t r;

	for (;;) {
		r = waitpid(pid, status, WNOHANG);
		if (r == pid)
			return 0;
		if (r < 0)
			return -errno;
		if (rps__now_ns() > deadline)
			return -ETIMEDOUT;
		usleep(20000);
	}
}

/* Run body in its own process group; kill the whole group if it hangs. */
static void run_isolated(const char *name, int (*body)(void), int timeout_s)
{
	int status = 0, ret;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		setpgid(0, 0);
		child_exit(body());
	}
	setpgid(pid, pid);
	ret = wait_child(pid, timeout_s, &status);
	if (ret == -ETIMEDOUT) {
		fprintf(stderr, "    %s: no result after %d s: killing it\n", name, timeout_s);
		kill(-pid, SIGKILL);
		waitpid(pid, &status, 0);
		CU_FAIL("test body hung");
		return;
	}
	CU_ASSERT(ret == 0);
	if (WIFSIGNALED(status))
		fprintf(stderr, "    %s: killed by signal %d\n", name, WTERMSIG(status));
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* reap stray grandchildren of a failed body */
	kill(-pid, SIGKILL);
}

static int check_child(pid_t pid, int timeout_s)
{
	int status = 0;

	if (wait_child(pid, timeout_s, &status)) {
		fprintf(stderr, "    child %d hung: killing it\n", (int)pid);
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		return -1;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		fprintf(stderr, "    child %d failed (status 0x%x)\n", (int)pid, status);
		return -1;
	}
	return 0;
}

static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	size_t got = 0;
	ssize_t r;

	while (got < len) {
		if (poll(&pfd, 1, timeout_ms) <= 0)
			return -ETIMEDOUT;
		r = read(fd, (char *)buf + got, len - got);
		if (r <= 0)
			return -EPIPE;
		got += (size_t)r;
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
	return write(fd, buf, len) == (ssize_t)len ? 0 : -EPIPE;
}

static void *shared_alloc(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* ---- transport helpers (the connected pairs: tests/lib/verbs_peer.h) ------ */

/* One side of a pair on the device of test_addr(). */
static int peer_open(struct vpeer *p, const struct vpeer_opts *o)
{
	return vpeer_open(p, RPS__KIND_VERBS, test_addr(), o);
}

/* A fabric on the device of test_addr(), for tests without a peer. */
static struct rps__fabric *open_fab(void)
{
	struct rps__fabric_attr a = { .kind = RPS__KIND_VERBS, .device = NULL, .host = test_addr() };
	struct rps__fabric *f = NULL;

	if (rps__fabric_open(&a, &f)) {
		fprintf(stderr, "    fabric_open(%s): %s\n", test_addr(), rps__errbuf());
		return NULL;
	}
	return f;
}

/* Wait for one completion: 1, 0 on timeout, <0 on error. */
static int wait_one(struct rps__cq *cq, struct rps__wc *wc, int timeout_ms)
{
	uint64_t deadline = rps__now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int n;

	for (;;) {
		n = rps__cq_wait(cq, wc, 1, 100);
		if (n != 0)
			return n;
		if (rps__now_ns() > deadline)
			return 0;
	}
}

/* Post one WR, polling (and discarding nothing: any completion is returned
 * to the caller through *stray) while the send queue is full. */
static int post_retry(struct rps__ep *ep, struct rps__cq *cq, const struct rps__wr *wr, int n, int *stray)
{
	uint64_t deadline = rps__now_ns() + 30 * SEC;
	struct rps__wc wc[16];
	int ret, k;

	for (;;) {
		ret = rps__post(ep, wr, n);
		if (ret != -EAGAIN)
			return ret;
		k = rps__cq_poll(cq, wc, 16);
		if (k < 0)
			return k;
		if (stray)
			*stray += k;
		if (rps__now_ns() > deadline)
			return -ETIMEDOUT;
	}
}

/* ---- memlock -------------------------------------------------------------- */

/* root has CAP_IPC_LOCK, which exempts it from RLIMIT_MEMLOCK: drop it */
static void drop_ipc_lock(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct d[2];

	if (syscall(SYS_capget, &h, d))
		return;
	d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
	d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
	syscall(SYS_capset, &h, d);
}

static int body_memlock(void)
{
	const size_t big = 64u << 20;
	struct rps__fabric *fab;
	struct rps__mr *mr = NULL;
	struct rlimit rl;
	char *buf;
	int ret;

	drop_ipc_lock();
	CHECK((fab = open_fab()) != NULL);
	rl.rlim_cur = rl.rlim_max = 64 * 1024;
	CHECK(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
	CHECK((buf = malloc(big)) != NULL);
	memset(buf, 1, big);
	ret = rps__mr_reg(fab, buf, big, RPS__ACCESS_REMOTE_WRITE, &mr);
	fprintf(stderr, "    mr_reg(64 MiB) under a 64 KiB memlock limit: %d: %s\n", ret, rps__errbuf());
	CHECK(ret < 0);
	CHECK(ret == -ENOMEM || ret == -EPERM || ret == -EFAULT);
	CHECK(strstr(rps__errbuf(), "ulimit -l") != NULL);
	/* a small region still fits under the limit */
	CHECK(rps__mr_reg(fab, buf + 4096, 4096, RPS__ACCESS_LOCAL, &mr) == 0);
	CHECK(rps__mr_dereg(mr) == 0);
	free(buf);
	rps__fabric_close(fab);
	return 0;
}

static void t_memlock(void)
{
	run_isolated("memlock", body_memlock, 120);
}

/* ---- a peer killed mid-operation ------------------------------------------ */

/* Writes into the survivor's region for ever, until SIGKILL. */
static int peer_writer(int port_fd, int ready_fd)
{
	const struct vpeer_opts o = { .cq_depth = 256, .attr = { .sq_depth = 32, .rq_depth = 4, .max_inline = 64 },
				      .mr = { { 65536, RPS__ACCESS_REMOTE_READ } }, .advertise = 1 };
	struct rps__wc wc[16];
	struct vpeer p;
	uint64_t i;

	CHECK(peer_open(&p, &o) == 0);
	memset(p.buf[0], 0x5a, 65536);
	CHECK(vpeer_connect(&p, port_fd, NULL) == 0);
	CHECK(p.theirs_len == sizeof(p.theirs[0]));
	CHECK(write_full(ready_fd, "R", 1) == 0);
	for (i = 0;; i++) {
		struct rps__wr wr = {
			.wr_id = i, .op = RPS__OP_WRITE, .flags = (i % 8 == 7) ? RPS__WR_SIGNALED : 0,
			.sge = { p.buf[0] + (i % 16) * 4096, 4096, p.mr[0] },
			.raddr = p.theirs[0].addr + (i % 16) * 4096, .rkey = p.theirs[0].rkey,
		};
		int ret = rps__post(p.ep, &wr, 1);

		CHECK(ret == 0 || ret == -EAGAIN);
		CHECK(rps__cq_poll(p.cq, wc, 16) >= 0);
	}
	return 0;
}

static int body_peer_killed(void)
{
	/* buf[0]: the region it writes into; buf[1]: our receives and READ */
	const struct vpeer_opts o = { .cq_depth = 1024, .attr = { .sq_depth = 16, .rq_depth = 16, .max_inline = 64 },
				      .mr = { { 65536, RPS__ACCESS_REMOTE_WRITE }, { 16 * 64 + 4096, RPS__ACCESS_LOCAL } },
				      .advertise = 1 };
	int pp[2], rp[2], nrecv = 0, nread = 0, n, i;
	struct rps__wc wc[32];
	struct vpeer p;
	char *local, c;
	uint64_t t0;
	pid_t pid;

	CHECK(pipe(pp) == 0 && pipe(rp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(peer_writer(pp[0], rp[1]));

	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, pp[1]) == 0);
	CHECK(p.port != 0);
	CHECK(vpeer_accept(&p, NULL) == 0);
	CHECK(p.theirs_len == sizeof(p.theirs[0]));
	local = p.buf[1];
	for (i = 0; i < 16; i++) {
		struct rps__sge sge = { local + i * 64, 64, p.mr[1] };

		CHECK(rps__post_recv(p.ep, &sge, 100 + (uint64_t)i) == 0);
	}
	CHECK(read_full(rp[0], &c, 1, 60000) == 0);
	usleep(300000);		/* let its WRITEs stream */
	CHECK(p.buf[0][0] == 0x5a);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	t0 = rps__now_ns();
	{
		/* an op posted after the death must fail too, not hang */
		struct rps__wr wr = {
			.wr_id = 7, .op = RPS__OP_READ, .flags = RPS__WR_SIGNALED,
			.sge = { local + 2048, 64, p.mr[1] }, .raddr = p.theirs[0].addr, .rkey = p.theirs[0].rkey,
		};
		CHECK(rps__post(p.ep, &wr, 1) == 0);
	}
	while ((nrecv < 16 || nread < 1) && secs_since(t0) < 60) {
		n = rps__cq_wait(p.cq, wc, 32, 200);
		CHECK(n >= 0);
		for (i = 0; i < n; i++) {
			CHECK(wc[i].ep == p.ep);
			CHECK(wc[i].status != RPS__WC_SUCCESS);
			if (wc[i].wr_id == 7)
				nread++;
			else {
				CHECK(wc[i].wr_id >= 100 && wc[i].wr_id < 116);
				nrecv++;
			}
		}
	}
	fprintf(stderr, "    peer killed: %d receives and %d READ completed in error after %.2f s\n", nrecv, nread,
		secs_since(t0));
	CHECK(nrecv == 16 && nread == 1);
	CHECK(rps__ep_is_error(p.ep));
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_peer_killed(void)
{
	run_isolated("peer_killed", body_peer_killed, 180);
}

/* ---- a peer that closes its endpoint ------------------------------------ */

static int peer_closer(int port_fd, int go_fd)
{
	const struct vpeer_opts o = { .cq_depth = 64 };
	struct vpeer p;
	char c;

	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_connect(&p, port_fd, NULL) == 0);
	CHECK(read_full(go_fd, &c, 1, 60000) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static int body_graceful_close(void)
{
	const struct vpeer_opts o = { .cq_depth = 64, .attr = { .sq_depth = 8, .rq_depth = 8 },
				      .mr = { { 8 * 64, RPS__ACCESS_LOCAL } } };
	struct rps__wc wc[16];
	int pp[2], gp[2], nflush = 0, n, i;
	struct vpeer p;
	uint64_t t0;
	pid_t pid;

	CHECK(pipe(pp) == 0 && pipe(gp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(peer_closer(pp[0], gp[0]));
	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, pp[1]) == 0);
	CHECK(vpeer_accept(&p, NULL) == 0);
	for (i = 0; i < 8; i++) {
		struct rps__sge sge = { p.buf[0] + i * 64, 64, p.mr[0] };

		CHECK(rps__post_recv(p.ep, &sge, (uint64_t)i) == 0);
	}
	CHECK(write_full(gp[1], "G", 1) == 0);
	t0 = rps__now_ns();
	while (nflush < 8 && secs_since(t0) < 30) {
		n = rps__cq_wait(p.cq, wc, 16, 200);	/* sleeps on cq_fd: the CM event must wake it */
		CHECK(n >= 0);
		for (i = 0; i < n; i++) {
			CHECK(wc[i].status == RPS__WC_FLUSH_ERR);
			nflush++;
		}
	}
	fprintf(stderr, "    peer closed: %d receives flushed after %.2f s\n", nflush, secs_since(t0));
	CHECK(nflush == 8);
	CHECK(rps__ep_is_error(p.ep));
	{
		/* a receive posted after the error flushes too */
		struct rps__sge sge = { p.buf[0], 64, p.mr[0] };

		CHECK(rps__post_recv(p.ep, &sge, 99) == 0);
		CHECK(wait_one(p.cq, wc, 10000) == 1);
		CHECK(wc[0].wr_id == 99 && wc[0].status == RPS__WC_FLUSH_ERR);
	}
	CHECK(check_child(pid, 30) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_graceful_close(void)
{
	run_isolated("graceful_close", body_graceful_close, 120);
}

/* ---- an initiator stopped mid-handshake ---------------------------------- */

static int stalled_initiator(int port_fd)
{
	const struct vpeer_opts o = { .cq_depth = 16 };
	struct vpeer p;

	CHECK(peer_open(&p, &o) == 0);
	/* the parent stops it (SIGSTOP) once its REQ is in, so the REP finds
	 * it unable to answer, and kills it there */
	(void)vpeer_connect(&p, port_fd, NULL);
	return 0;
}

/* A server accepts a peer inside its loop: an initiator that never sends
 * its RTU (stopped, or its host died) must not hold that loop.  The
 * endpoint is handed out after a short wait; once the initiator is gone the
 * CM fails it and the posted receives flush. */
static int body_stalled_initiator(void)
{
	const struct vpeer_opts o = { .cq_depth = 64, .attr = { .sq_depth = 8, .rq_depth = 8 },
				      .mr = { { 8 * 64, RPS__ACCESS_LOCAL } } };
	struct rps__conn_req *req;
	struct rps__ep *ep = NULL;
	struct rps__wc wc[16];
	int pp[2], nflush = 0, n, i, ret;
	struct vpeer p;
	uint64_t t0;
	pid_t pid;

	CHECK(pipe(pp) == 0);
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(stalled_initiator(pp[0]));
	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, pp[1]) == 0);
	CHECK(vpeer_wait_request(p.l, &req) == 0);
	kill(pid, SIGSTOP);
	t0 = rps__now_ns();
	ret = rps__accept(req, p.cq, &o.attr, NULL, 0, &ep);
	fprintf(stderr, "    initiator stopped before its RTU: accept returned %d after %.2f s\n", ret, secs_since(t0));
	CHECK(ret == 0);	/* (it used to wait 20 s for the RTU, then fail) */
	for (i = 0; i < 8; i++) {
		struct rps__sge sge = { p.buf[0] + i * 64, 64, p.mr[0] };

		CHECK(rps__post_recv(ep, &sge, (uint64_t)i) == 0);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	t0 = rps__now_ns();
	while (nflush < 8 && secs_since(t0) < 60) {
		n = rps__cq_wait(p.cq, wc, 16, 200);
		CHECK(n >= 0);
		for (i = 0; i < n; i++) {
			CHECK(wc[i].ep == ep && wc[i].status != RPS__WC_SUCCESS);
			nflush++;
		}
	}
	fprintf(stderr, "    initiator killed: %d receives flushed after %.2f s\n", nflush, secs_since(t0));
	CHECK(nflush == 8);
	CHECK(rps__ep_is_error(ep));
	rps__ep_close(ep);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_stalled_initiator(void)
{
	run_isolated("stalled_initiator", body_stalled_initiator, 180);
}

/* ---- atomics from several processes ------------------------------------- */

struct atom_shared {
	int go;
	uint32_t seen[4096];
};

static int worker_atomic(int port_fd, int fadd, int iters, struct atom_shared *sh)
{
	const struct vpeer_opts o = { .cq_depth = 64, .attr = { .sq_depth = 8, .rq_depth = 1 },
				      .mr = { { 64, RPS__ACCESS_LOCAL } } };
	uint64_t *res, expect = 0, old, t0;
	struct rps__wc wc;
	struct vpeer p;
	int done = 0;

	CHECK(peer_open(&p, &o) == 0);
	res = (uint64_t *)p.buf[0];
	CHECK(vpeer_connect(&p, port_fd, NULL) == 0);
	CHECK(p.theirs_len == sizeof(p.theirs[0]));
	t0 = rps__now_ns();
	while (!__atomic_load_n(&sh->go, __ATOMIC_ACQUIRE)) {
		CHECK(secs_since(t0) < 60);
		usleep(1000);
	}
	while (done < iters) {
		struct rps__wr wr = {
			.wr_id = (uint64_t)done, .op = fadd ? RPS__OP_FADD : RPS__OP_CAS, .flags = RPS__WR_SIGNALED,
			.sge = { res, 8, p.mr[0] }, .raddr = p.theirs[0].addr, .rkey = p.theirs[0].rkey,
			.compare_add = fadd ? 1 : expect, .swap = expect + 1,
		};

		CHECK(post_retry(p.ep, p.cq, &wr, 1, NULL) == 0);
		CHECK(wait_one(p.cq, &wc, 30000) == 1);
		CHECK(wc.status == RPS__WC_SUCCESS);
		CHECK(wc.opcode == (fadd ? RPS__WC_FADD : RPS__WC_CAS));
		CHECK(wc.wr_id == (uint64_t)done);
		old = *(volatile uint64_t *)res;
		if (fadd) {
			CHECK(old < 4096);
			__atomic_fetch_add(&sh->seen[old], 1, __ATOMIC_RELAXED);
			done++;
		} else if (old == expect) {
			done++;
			expect++;
		} else {
			expect = old;	/* lost the race: retry from what is there */
		}
	}
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

/* nworkers processes do iters remote increments each (CAS loops, or FADD);
 * this process does local_iters increments with rps__local_cas meanwhile. */
static int atomics(int fadd, int nworkers, int iters, int local_iters)
{
	const struct vpeer_opts o = { .cq_depth = 64, .mr = { { 4096, RPS__ACCESS_REMOTE_ATOMIC | RPS__ACCESS_REMOTE_READ } },
				      .advertise = 1 };
	struct rps__ep *ep[8];
	struct atom_shared *sh;
	struct vpeer p;
	uint64_t *region, total, expect = 0, old, final, t0;
	pid_t pid[8];
	int pp[2], i, done = 0, ret, fails = 0;

	CHECK((sh = shared_alloc(sizeof(*sh))) != NULL);
	CHECK(pipe(pp) == 0);
	for (i = 0; i < nworkers; i++) {
		pid[i] = fork();
		CHECK(pid[i] >= 0);
		if (pid[i] == 0)
			child_exit(worker_atomic(pp[0], fadd, iters, sh));
	}
	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, -1) == 0);
	for (i = 0; i < nworkers; i++)
		CHECK(write_full(pp[1], &p.port, sizeof(p.port)) == 0);
	region = (uint64_t *)p.buf[0];
	p.mine[0] = (struct vpeer_region){ (uintptr_t)&region[8], rps__mr_rkey(p.mr[0]), 8 };	/* a word not at offset 0 */
	for (i = 0; i < nworkers; i++)
		CHECK(vpeer_accept(&p, &ep[i]) == 0);
	t0 = rps__now_ns();
	__atomic_store_n(&sh->go, 1, __ATOMIC_RELEASE);
	while (done < local_iters) {
		ret = rps__local_cas(p.fab, p.mr[0], &region[8], expect, expect + 1, &old);
		CHECK(ret == 0);
		if (old == expect) {
			done++;
			expect++;
		} else {
			expect = old;
			fails++;
		}
	}
	for (i = 0; i < nworkers; i++)
		CHECK(check_child(pid[i], 240) == 0);
	final = __atomic_load_n(&region[8], __ATOMIC_SEQ_CST);
	total = (uint64_t)nworkers * (uint64_t)iters + (uint64_t)local_iters;
	fprintf(stderr, "    %d x %d remote %s%s: final %llu (want %llu) in %.2f s, %d local CAS retries\n", nworkers, iters,
		fadd ? "FADD" : "CAS increments", local_iters ? " + local CAS increments" : "",
		(unsigned long long)final, (unsigned long long)total, secs_since(t0), fails);
	CHECK(final == total);
	CHECK(region[7] == 0 && region[9] == 0);	/* neighbours untouched */
	if (fadd)
		for (i = 0; i < (int)total; i++)
			CHECK(sh->seen[i] == 1);	/* each old value fetched exactly once */
	for (i = 0; i < nworkers; i++)
		rps__ep_close(ep[i]);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static int body_cas(void)
{
	return atomics(0, 3, 500, 0);
}

static int body_fadd(void)
{
	return atomics(1, 3, 500, 0);
}

static int body_local_cas(void)
{
	return atomics(0, 2, 500, 500);
}

static void t_cas(void)
{
	run_isolated("cas", body_cas, 300);
}

static void t_fadd(void)
{
	run_isolated("fadd", body_fadd, 300);
}

static void t_local_cas(void)
{
	run_isolated("local_cas", body_local_cas, 300);
}

/* ---- SEND burst into few receives ------------------------------------------ */

#define BURST 1000
#define NRECV 16

static int burst_sender(int port_fd, int done_fd)
{
	const struct vpeer_opts o = { .cq_depth = 256, .attr = { .sq_depth = 64, .rq_depth = 1, .max_inline = 64 } };
	struct rps__wc wc;
	struct vpeer p;
	uint32_t i;
	int stray = 0;
	char c;

	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_connect(&p, port_fd, NULL) == 0);
	for (i = 0; i < BURST; i++) {
		uint32_t v = i;
		struct rps__wr wr = {
			.wr_id = i, .op = RPS__OP_SEND,
			.flags = RPS__WR_INLINE | (i == BURST - 1 ? RPS__WR_SIGNALED : 0),
			.sge = { &v, sizeof(v), NULL },	/* inline: copied at post time */
		};

		CHECK(post_retry(p.ep, p.cq, &wr, 1, &stray) == 0);
	}
	CHECK(wait_one(p.cq, &wc, 120000) == 1);
	CHECK(stray == 0);		/* unsignaled SENDs that succeed say nothing */
	CHECK(wc.status == RPS__WC_SUCCESS && wc.wr_id == BURST - 1 && wc.opcode == RPS__WC_SEND);
	CHECK(read_full(done_fd, &c, 1, 120000) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static int body_send_burst(void)
{
	const struct vpeer_opts o = { .cq_depth = 64, .attr = { .sq_depth = 4, .rq_depth = NRECV },
				      .mr = { { NRECV * 64, RPS__ACCESS_LOCAL } } };
	struct rps__wc wc[NRECV];
	int pp[2], dp[2], i, n;
	uint32_t expect = 0;
	struct vpeer p;
	uint64_t t0;
	char *buf;
	pid_t pid;

	CHECK(pipe(pp) == 0 && pipe(dp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(burst_sender(pp[0], dp[0]));
	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, pp[1]) == 0);
	CHECK(vpeer_accept(&p, NULL) == 0);
	buf = p.buf[0];
	for (i = 0; i < NRECV; i++) {
		struct rps__sge sge = { buf + i * 64, 64, p.mr[0] };

		CHECK(rps__post_recv(p.ep, &sge, (uint64_t)i) == 0);
	}
	t0 = rps__now_ns();
	while (expect < BURST) {
		CHECK(secs_since(t0) < 120);
		n = rps__cq_wait(p.cq, wc, NRECV, 200);
		CHECK(n >= 0);
		for (i = 0; i < n; i++) {
			uint64_t slot = wc[i].wr_id;
			struct rps__sge sge = { buf + slot * 64, 64, p.mr[0] };

			CHECK(wc[i].status == RPS__WC_SUCCESS);
			CHECK(wc[i].opcode == RPS__WC_RECV && wc[i].byte_len == 4 && slot < NRECV);
			CHECK(*(uint32_t *)(buf + slot * 64) == expect);	/* in order */
			expect++;
			CHECK(rps__post_recv(p.ep, &sge, slot) == 0);
		}
	}
	fprintf(stderr, "    %d SENDs through %d receives: in order, no error, %.2f s\n", BURST, NRECV, secs_since(t0));
	CHECK(!rps__ep_is_error(p.ep));
	CHECK(write_full(dp[1], "D", 1) == 0);
	CHECK(check_child(pid, 60) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_send_burst(void)
{
	run_isolated("send_burst", body_send_burst, 300);
}

/* ---- a completion queue grown under its endpoints -------------------------- */

#define GROW_SENDS 200u

static int grow_sender(int port_fd, int sent_fd)
{
	const struct vpeer_opts o = { .cq_depth = 256, .attr = { .sq_depth = 64, .rq_depth = 1, .max_inline = 64 } };
	struct rps__wc wc;
	struct vpeer p;
	uint32_t i;
	int stray = 0;

	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_connect(&p, port_fd, NULL) == 0);
	for (i = 0; i < GROW_SENDS; i++) {
		uint32_t v = i;
		struct rps__wr wr = {
			.wr_id = i, .op = RPS__OP_SEND,
			.flags = RPS__WR_INLINE | (i == GROW_SENDS - 1 ? RPS__WR_SIGNALED : 0),
			.sge = { &v, sizeof(v), NULL },
		};

		CHECK(post_retry(p.ep, p.cq, &wr, 1, &stray) == 0);
	}
	/* the last one acknowledged: every receive completed over there */
	CHECK(wait_one(p.cq, &wc, 120000) == 1);
	CHECK(wc.status == RPS__WC_SUCCESS && wc.wr_id == GROW_SENDS - 1);
	CHECK(write_full(sent_fd, "S", 1) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

/* A CQ made for 16 completions, an endpoint on it with 200 receives
 * posted, grown (rps__cq_grow) to hold them: 200 SENDs arrive while
 * nobody polls, and every completion is there afterwards, in order (on a
 * CQ that overruns the QP breaks instead).  A grow past max_cqe is
 * refused naming it; one the device fails says so. */
static int body_cq_grow(void)
{
	const struct vpeer_opts o = { .cq_depth = 16, .attr = { .sq_depth = 4, .rq_depth = GROW_SENDS },
				      .mr = { { GROW_SENDS * 64, RPS__ACCESS_LOCAL } } };
	struct rps__wc wc[GROW_SENDS];
	int pp[2], sp[2], n, got = 0;
	struct vpeer p;
	uint32_t i;
	char c;
	pid_t pid;

	CHECK(pipe(pp) == 0 && pipe(sp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(grow_sender(pp[0], sp[1]));
	CHECK(peer_open(&p, &o) == 0);
	CHECK(rps__cq_grow(p.cq, 2 * GROW_SENDS) == 0);
	CHECK(rps__cq_grow(p.cq, 64) == 0);	/* never shrinks: nothing to do */
	CHECK(vpeer_listen(&p, pp[1]) == 0);
	CHECK(vpeer_accept(&p, NULL) == 0);
	for (i = 0; i < GROW_SENDS; i++) {
		struct rps__sge sge = { p.buf[0] + i * 64, 64, p.mr[0] };

		CHECK(rps__post_recv(p.ep, &sge, i) == 0);
	}
	CHECK(read_full(sp[0], &c, 1, 120000) == 0);
	while (got < (int)GROW_SENDS) {
		n = rps__cq_wait(p.cq, wc + got, (int)GROW_SENDS - got, 5000);
		CHECK(n > 0);
		got += n;
	}
	for (i = 0; i < GROW_SENDS; i++) {
		CHECK(wc[i].status == RPS__WC_SUCCESS && wc[i].opcode == RPS__WC_RECV && wc[i].wr_id == i);
		CHECK(*(uint32_t *)(p.buf[0] + i * 64) == i);
	}
	CHECK(!rps__ep_is_error(p.ep));
	fprintf(stderr, "    %u receives completed unpolled on a CQ made for 16, grown\n", GROW_SENDS);
	CHECK(rps__cq_grow(p.cq, UINT32_MAX) == -ENOSPC);
	CHECK(strstr(rps__errbuf(), "max_cqe") != NULL);
	CHECK(check_child(pid, 60) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_cq_grow(void)
{
	run_isolated("cq_grow", body_cq_grow, 300);
}

/* ---- remote access errors ------------------------------------------------ */

/* One bad op on a fresh connection of p (to the port it connected to
 * first); checks its completion and that the endpoint then flushes the next
 * op. */
static int bad_op(struct vpeer *p, struct rps__wr *wr, const char *what)
{
	struct rps__ep *ep;
	struct rps__wc wc;
	struct rps__wr next;

	CHECK(vpeer_connect(p, -1, &ep) == 0);
	CHECK(p->theirs_len == 2 * sizeof(p->theirs[0]));
	/* a valid WRITE after it must be flushed, not executed */
	next = (struct rps__wr){ .wr_id = 2, .op = RPS__OP_WRITE, .flags = RPS__WR_SIGNALED, .sge = wr->sge,
				 .raddr = p->theirs[0].addr, .rkey = p->theirs[0].rkey };
	next.sge.len = 8;
	CHECK(rps__post(ep, wr, 1) == 0);
	CHECK(wait_one(p->cq, &wc, 60000) == 1);
	fprintf(stderr, "    %s: %s\n", what, rps__wc_status_str(wc.status));
	CHECK(wc.wr_id == 1 && wc.ep == ep);
	CHECK(wc.status == RPS__WC_REM_ACCESS_ERR);
	CHECK(rps__ep_is_error(ep));
	CHECK(rps__post(ep, &next, 1) == 0);
	CHECK(wait_one(p->cq, &wc, 60000) == 1);
	CHECK(wc.wr_id == 2 && wc.status == RPS__WC_FLUSH_ERR);
	rps__ep_close(ep);
	return 0;
}

static int access_initiator(int port_fd, int done_fd)
{
	const struct vpeer_opts o = { .cq_depth = 64, .mr = { { 4096, RPS__ACCESS_LOCAL } } };
	struct vpeer_region *d;
	struct vpeer p;

	CHECK(peer_open(&p, &o) == 0);
	memset(p.buf[0], 0x11, 4096);
	/* learn the regions first (connection 0 stays healthy) */
	CHECK(vpeer_connect(&p, port_fd, NULL) == 0);
	CHECK(p.theirs_len == 2 * sizeof(p.theirs[0]));
	d = p.theirs;
	{
		struct rps__wr wr = {
			.wr_id = 1, .op = RPS__OP_WRITE, .flags = RPS__WR_SIGNALED,
			.sge = { p.buf[0], 64, p.mr[0] }, .raddr = d[0].addr, .rkey = d[0].rkey ^ 0x5a,
		};
		CHECK(bad_op(&p, &wr, "WRITE with a wrong rkey") == 0);
		wr.rkey = d[0].rkey;
		wr.raddr = d[0].addr + d[0].len - 32;	/* 64 bytes, 32 past the end */
		CHECK(bad_op(&p, &wr, "WRITE past the end") == 0);
		wr.raddr = d[1].addr;
		wr.rkey = d[1].rkey;			/* region without REMOTE_WRITE */
		CHECK(bad_op(&p, &wr, "WRITE to a read-only region") == 0);
		wr = (struct rps__wr){
			.wr_id = 1, .op = RPS__OP_CAS, .flags = RPS__WR_SIGNALED, .sge = { p.buf[0], 8, p.mr[0] },
			.raddr = d[0].addr + 4, .rkey = d[0].rkey, .compare_add = 0, .swap = 1,
		};
		CHECK(bad_op(&p, &wr, "misaligned CAS") == 0);
	}
	rps__ep_close(p.ep);
	p.ep = NULL;
	CHECK(write_full(done_fd, "D", 1) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static int body_access_errors(void)
{
	const struct vpeer_opts o = { .cq_depth = 64,
				      .mr = { { 4096, RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_ATOMIC },
					      { 4096, RPS__ACCESS_REMOTE_READ } },
				      .advertise = 2 };
	struct rps__ep *ep[5];
	int pp[2], dp[2], i;
	struct vpeer p;
	char *a, *b, c;
	pid_t pid;

	CHECK(pipe(pp) == 0 && pipe(dp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(access_initiator(pp[0], dp[1]));
	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, pp[1]) == 0);
	a = p.buf[0];
	b = p.buf[1];
	memset(a, 0xab, 4096);
	memset(b, 0xcd, 4096);
	for (i = 0; i < 5; i++)
		CHECK(vpeer_accept(&p, &ep[i]) == 0);
	CHECK(read_full(dp[0], &c, 1, 120000) == 0);
	CHECK(check_child(pid, 60) == 0);
	for (i = 0; i < 4096; i++) {
		CHECK((unsigned char)a[i] == 0xab);
		CHECK((unsigned char)b[i] == 0xcd);
	}
	fprintf(stderr, "    target bytes unchanged\n");
	for (i = 0; i < 5; i++)
		rps__ep_close(ep[i]);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_access_errors(void)
{
	run_isolated("access_errors", body_access_errors, 300);
}

/* ---- private data, reject ------------------------------------------------ */

static int privdata_client(int port_fd)
{
	const struct vpeer_opts o = { .cq_depth = 64 };
	uint8_t req56[RPS__PRIVDATA_MAX], req55[55], rep[RPS__PRIVDATA_MAX];
	struct rps__fabric *fab;
	struct rps__cq *cq;
	struct rps__ep *ep;
	struct vpeer p;
	size_t rlen;
	uint16_t port;
	int i, ret;

	for (i = 0; i < RPS__PRIVDATA_MAX; i++)
		req56[i] = (uint8_t)(i * 7 + 1);
	for (i = 0; i < 55; i++)
		req55[i] = (uint8_t)(200 - i);
	CHECK(read_full(port_fd, &port, sizeof(port), 30000) == 0);
	CHECK(peer_open(&p, &o) == 0);
	fab = p.fab;
	cq = p.cq;

	/* 1: rejected, with a reason */
	rlen = 999;
	memset(rep, 0, sizeof(rep));
	do {
		ret = rps__connect(fab, test_addr(), port, cq, NULL, "hello", 6, 10000, rep, &rlen, &ep);
	} while (ret == -ECONNREFUSED && rlen == 0 && (usleep(50000), 1));	/* not listening yet */
	fprintf(stderr, "    rejected connect: %d: %s\n", ret, rps__errbuf());
	CHECK(ret == -ECONNREFUSED);
	CHECK(rlen == 8 && !memcmp(rep, "go away", 8));
	/* 2: the full 56 bytes each way */
	rlen = 0;
	CHECK(rps__connect(fab, test_addr(), port, cq, NULL, req56, sizeof(req56), 10000, rep, &rlen, &ep) == 0);
	CHECK(rlen == RPS__PRIVDATA_MAX);
	for (i = 0; i < RPS__PRIVDATA_MAX; i++)
		CHECK(rep[i] == (uint8_t)(255 - i));
	rps__ep_close(ep);
	/* 3: 55 bytes, nothing back */
	rlen = 999;
	CHECK(rps__connect(fab, test_addr(), port, cq, NULL, req55, sizeof(req55), 10000, rep, &rlen, &ep) == 0);
	CHECK(rlen == 0);
	rps__ep_close(ep);
	/* 4: nothing, reply NULL */
	CHECK(rps__connect(fab, test_addr(), port, cq, NULL, NULL, 0, 10000, NULL, NULL, &ep) == 0);
	rps__ep_close(ep);
	/* 5: nobody listening on that port any more */
	CHECK(read_full(port_fd, &port, sizeof(port), 60000) == 0);
	ret = rps__connect(fab, test_addr(), port, cq, NULL, NULL, 0, 10000, NULL, NULL, &ep);
	fprintf(stderr, "    connect to a closed port: %d: %s\n", ret, rps__errbuf());
	CHECK(ret == -ECONNREFUSED || ret == -ETIMEDOUT || ret == -EHOSTUNREACH);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static int body_privdata(void)
{
	const struct vpeer_opts o = { .cq_depth = 64 };
	uint8_t data[RPS__PRIVDATA_MAX], rep[RPS__PRIVDATA_MAX];
	struct rps__conn_req *req;
	struct rps__ep *ep;
	struct vpeer p;
	const uint8_t *d;
	size_t len;
	int pp[2], i;
	pid_t pid;

	for (i = 0; i < RPS__PRIVDATA_MAX; i++)
		rep[i] = (uint8_t)(255 - i);
	CHECK(pipe(pp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(privdata_client(pp[0]));
	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, pp[1]) == 0);

	CHECK(vpeer_wait_request(p.l, &req) == 0);
	d = rps__conn_req_data(req, &len);
	CHECK(len == 6 && !memcmp(d, "hello", 6));
	CHECK(rps__reject(req, "go away", 8) == 0);

	CHECK(vpeer_wait_request(p.l, &req) == 0);
	d = rps__conn_req_data(req, &len);
	CHECK(len == RPS__PRIVDATA_MAX);
	memcpy(data, d, len);
	for (i = 0; i < RPS__PRIVDATA_MAX; i++)
		CHECK(data[i] == (uint8_t)(i * 7 + 1));
	CHECK(rps__accept(req, p.cq, NULL, rep, sizeof(rep), &ep) == 0);
	CHECK(strchr(rps__ep_peer(ep), ':') != NULL);
	fprintf(stderr, "    accepted %s\n", rps__ep_peer(ep));
	rps__ep_close(ep);

	CHECK(vpeer_wait_request(p.l, &req) == 0);
	d = rps__conn_req_data(req, &len);
	CHECK(len == 55);
	for (i = 0; i < 55; i++)
		CHECK(d[i] == (uint8_t)(200 - i));
	CHECK(rps__accept(req, p.cq, NULL, NULL, 0, &ep) == 0);
	rps__ep_close(ep);

	CHECK(vpeer_wait_request(p.l, &req) == 0);
	d = rps__conn_req_data(req, &len);
	CHECK(len == 0);
	CHECK(rps__accept(req, p.cq, NULL, NULL, 0, &ep) == 0);
	rps__ep_close(ep);

	rps__listener_close(p.l);	/* the client's last connect finds nobody there */
	p.l = NULL;
	CHECK(write_full(pp[1], &p.port, sizeof(p.port)) == 0);
	CHECK(check_child(pid, 60) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_privdata(void)
{
	run_isolated("privdata", body_privdata, 180);
}

/* ---- a full send queue, inline WRITEs, WRITE_IMM ------------------------- */

static int sq_target(int port_fd, int ready_fd, int done_fd)
{
	const struct vpeer_opts o = { .cq_depth = 64, .mr = { { 65536, RPS__ACCESS_REMOTE_WRITE | RPS__ACCESS_REMOTE_READ } },
				      .advertise = 1 };
	struct rps__wc wc;
	struct vpeer p;
	char c;

	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, port_fd) == 0);
	CHECK(vpeer_accept(&p, NULL) == 0);
	{
		struct rps__sge sge = { NULL, 0, NULL };	/* WRITE_IMM consumes a receive, no bytes */

		CHECK(rps__post_recv(p.ep, &sge, 77) == 0);
	}
	CHECK(write_full(ready_fd, "R", 1) == 0);
	CHECK(wait_one(p.cq, &wc, 120000) == 1);
	CHECK(wc.status == RPS__WC_SUCCESS && wc.wr_id == 77);
	CHECK(wc.opcode == RPS__WC_RECV_IMM && wc.imm == 0xdeadbeef);
	/* the WRITE_IMM's payload is in place when its immediate is seen */
	CHECK(!memcmp(p.buf[0] + 60000, "immediate!", 10));
	CHECK(read_full(done_fd, &c, 1, 120000) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static int body_sq_full(void)
{
	const struct vpeer_opts o = { .cq_depth = 64, .attr = { .sq_depth = 8, .rq_depth = 1, .max_inline = 32 },
				      .mr = { { 8192, RPS__ACCESS_LOCAL } } };
	struct rps__wc wc[8];
	struct rps__wr wr[8];
	struct vpeer_region theirs;
	int pp[2], rp[2], dp[2], i, ret, eagain = 0, stray = 0;
	uint64_t t0, v, *back;
	struct rps__cq *cq;
	struct rps__mr *mr;
	struct rps__ep *ep;
	struct vpeer p;
	char *buf, c;
	pid_t pid;

	CHECK(pipe(pp) == 0 && pipe(rp) == 0 && pipe(dp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(sq_target(pp[1], rp[1], dp[0]));
	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_connect(&p, pp[0], NULL) == 0);
	CHECK(p.theirs_len == sizeof(theirs));
	theirs = p.theirs[0];
	buf = p.buf[0];
	mr = p.mr[0];
	cq = p.cq;
	ep = p.ep;

	/* 3 unsignaled WRITEs, then a batch of 8 that cannot fit: the
	 * transport must make room by itself (no signaled WR was in flight) */
	for (i = 0; i < 8; i++)
		wr[i] = (struct rps__wr){ .wr_id = 1000 + (uint64_t)i, .op = RPS__OP_WRITE, .sge = { buf, 64, mr },
					  .raddr = theirs.addr + (uint64_t)i * 64, .rkey = theirs.rkey };
	CHECK(rps__post(ep, wr, 3) == 0);
	t0 = rps__now_ns();
	while ((ret = rps__post(ep, wr, 8)) == -EAGAIN) {
		eagain++;
		CHECK(secs_since(t0) < 30);
		ret = rps__cq_poll(cq, wc, 8);
		CHECK(ret >= 0);
		stray += ret;
	}
	CHECK(ret == 0);
	CHECK(eagain > 0);
	CHECK(rps__post(ep, wr, 9) == -EINVAL);	/* more than sq_depth at once */

	/* 2000 inline WRITEs (no mr: copied at post time), one at a time */
	for (i = 0; i < 2000; i++) {
		struct rps__wr w = { .wr_id = (uint64_t)i, .op = RPS__OP_WRITE, .flags = RPS__WR_INLINE };

		v = (uint64_t)i;
		w.sge = (struct rps__sge){ &v, 8, NULL };
		w.raddr = theirs.addr + 4096 + (uint64_t)(i % 64) * 8;
		w.rkey = theirs.rkey;
		CHECK(post_retry(ep, cq, &w, 1, &stray) == 0);
		v = 0xffffffff;	/* the transport copied it already */
	}
	CHECK(stray == 0);		/* nothing was signaled, nothing failed */
	/* a READ after them sees them (RC order) */
	back = (uint64_t *)(buf + 4096);
	wr[0] = (struct rps__wr){ .wr_id = 42, .op = RPS__OP_READ, .flags = RPS__WR_SIGNALED,
				  .sge = { back, 512, mr }, .raddr = theirs.addr + 4096, .rkey = theirs.rkey };
	CHECK(post_retry(ep, cq, wr, 1, &stray) == 0);
	CHECK(wait_one(cq, wc, 60000) == 1);
	CHECK(wc[0].status == RPS__WC_SUCCESS && wc[0].wr_id == 42 && wc[0].opcode == RPS__WC_READ);
	for (i = 1936; i < 2000; i++)
		CHECK(back[i % 64] == (uint64_t)i);

	/* WRITE_IMM: payload then immediate */
	CHECK(read_full(rp[0], &c, 1, 60000) == 0);
	memcpy(buf, "immediate!", 10);
	wr[0] = (struct rps__wr){ .wr_id = 43, .op = RPS__OP_WRITE_IMM, .flags = RPS__WR_SIGNALED | RPS__WR_INLINE,
				  .sge = { buf, 10, mr }, .raddr = theirs.addr + 60000, .rkey = theirs.rkey,
				  .imm = 0xdeadbeef };
	CHECK(post_retry(ep, cq, wr, 1, &stray) == 0);
	CHECK(wait_one(cq, wc, 60000) == 1);
	CHECK(wc[0].status == RPS__WC_SUCCESS && wc[0].wr_id == 43 && wc[0].opcode == RPS__WC_WRITE);
	fprintf(stderr, "    full SQ: %d EAGAINs before room was made; 2000 inline WRITEs without a completion\n", eagain);
	CHECK(write_full(dp[1], "D", 1) == 0);
	CHECK(check_child(pid, 60) == 0);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_sq_full(void)
{
	run_isolated("sq_full", body_sq_full, 300);
}

/* ---- device selection, wildcard listen ---------------------------------- */

static int open_client(int port_fd)
{
	const struct vpeer_opts o = { .cq_depth = 16, .data = "x", .data_len = 1 };
	struct vpeer p;

	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_connect(&p, port_fd, NULL) == 0);
	CHECK(strstr(rps__ep_peer(p.ep), test_addr()) != NULL);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static int body_open(void)
{
	struct rps__fabric_attr a = { .kind = RPS__KIND_VERBS };
	struct rps__fabric *def, *byname, *byhost;
	struct rps__listener *l, *l2;
	struct rps__conn_req *req;
	struct rps__cq *cq;
	struct rps__ep *ep;
	char name[64];
	int pp[2], ret;
	uint16_t port;
	pid_t pid;

	CHECK(pipe(pp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(open_client(pp[0]));

	CHECK(rps__fabric_open(&a, &def) == 0);		/* first device */
	snprintf(name, sizeof(name), "%s", rps__fabric_name(def));
	CHECK(rps__fabric_kind(def) == RPS__KIND_VERBS);
	a.device = name;
	CHECK(rps__fabric_open(&a, &byname) == 0);
	CHECK(!strcmp(rps__fabric_name(byname), name));
	a.device = "no_such_hca9";
	ret = rps__fabric_open(&a, &byhost);
	fprintf(stderr, "    unknown device: %d: %s\n", ret, rps__errbuf());
	CHECK(ret == -ENODEV && strstr(rps__errbuf(), "no_such_hca9"));
	a.device = NULL;
	a.host = test_addr();
	CHECK(rps__fabric_open(&a, &byhost) == 0);
	fprintf(stderr, "    default device %s, %s selects %s\n", name, test_addr(), rps__fabric_name(byhost));
	rps__fabric_close(byname);
	rps__fabric_close(def);

	/* every address, port 0: the port chosen is reported */
	CHECK(rps__listen(byhost, NULL, 0, &l) == 0);
	port = rps__listener_port(l);
	CHECK(port != 0);
	ret = rps__listen(byhost, NULL, port, &l2);
	fprintf(stderr, "    port taken: %d: %s\n", ret, rps__errbuf());
	CHECK(ret == -EADDRINUSE);
	CHECK(rps__cq_create(byhost, 16, &cq) == 0);
	CHECK(write_full(pp[1], &port, sizeof(port)) == 0);
	CHECK(vpeer_wait_request(l, &req) == 0);
	CHECK(rps__accept(req, cq, NULL, NULL, 0, &ep) == 0);
	CHECK(check_child(pid, 60) == 0);
	rps__ep_close(ep);
	rps__listener_close(l);
	rps__cq_destroy(cq);
	rps__fabric_close(byhost);
	return 0;
}

static void t_open(void)
{
	run_isolated("open", body_open, 120);
}

/* A process forked after its parent opened the devices inherits
 * librdmacm's handles, which the kernel refuses it: its fabric open says
 * so (-EPERM) instead of failing later, or crashing, in a post. */
static int forked_open(void)
{
	struct rps__fabric_attr a = { .kind = RPS__KIND_VERBS };
	struct rps__fabric *f = NULL;
	int ret = rps__fabric_open(&a, &f);

	fprintf(stderr, "    forked after the parent opened: %d: %s\n", ret, rps__errbuf());
	CHECK(ret == -EPERM && f == NULL);
	CHECK(strstr(rps__errbuf(), "forked") && strstr(rps__errbuf(), "after fork()"));
	return 0;
}

static int body_fork_refused(void)
{
	struct rps__fabric_attr a = { .kind = RPS__KIND_VERBS };
	struct rps__fabric *f;
	pid_t pid;
	int st;

	CHECK(rps__fabric_open(&a, &f) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(forked_open());
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	rps__fabric_close(f);
	CHECK(rps__fabric_open(&a, &f) == 0);	/* this process still may */
	rps__fabric_close(f);
	return 0;
}

static void t_fork_refused(void)
{
	run_isolated("fork", body_fork_refused, 120);
}

/* ---- error cases a device produces on demand ------------------------------- */

/* The first error message of a test must name what failed: exact code and
 * the expected words. */
#define CHECK_ERR(expr, code, words)                                                          \
	do {                                                                                  \
		int r_ = (expr);                                                              \
		fprintf(stderr, "    %s: %d: %s\n", #expr, r_, rps__errbuf());                \
		CHECK(r_ == (code));                                                          \
		CHECK(strstr(rps__errbuf(), (words)) != NULL);                                \
		CHECK(strchr(rps__errbuf(), '\n') == NULL);                                   \
	} while (0)

static int body_local_errors(void)
{
	struct rps__fabric_attr a = { .kind = RPS__KIND_VERBS };
	struct rps__ep_attr huge = { .sq_depth = 1u << 30, .rq_depth = 4 };
	struct rps__fabric *fab, *other;
	struct rps__listener *l, *l2;
	struct rps__conn_req *req;
	struct rps__cq *cq, *ocq;
	struct rps__mr *mr, *lmr, fake;
	struct rps__ep *ep;
	uint64_t *w, old = 0;
	char msg[256];
	uint16_t port;
	void *none;

	CHECK((fab = open_fab()) != NULL);
	CHECK(rps__cq_create(fab, 16, &cq) == 0);

	/* registration */
	CHECK_ERR(rps__mr_reg(fab, NULL, 4096, RPS__ACCESS_LOCAL, &mr), -EINVAL, "empty region");
	CHECK((w = aligned_alloc(4096, 4096)) != NULL);
	CHECK_ERR(rps__mr_reg(fab, w, 0, RPS__ACCESS_LOCAL, &mr), -EINVAL, "empty region");
	none = mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(none != MAP_FAILED);
	CHECK_ERR(rps__mr_reg(fab, none, 8192, RPS__ACCESS_REMOTE_WRITE, &mr), -EFAULT, "ibv_reg_mr(8192 bytes");
	munmap(none, 8192);

	/* CQ deeper than the device allows */
	snprintf(msg, sizeof(msg), "CQ depth 2147483647 exceeds %s's max_cqe", rps__fabric_name(fab));
	CHECK_ERR(rps__cq_create(fab, 0x7fffffff, &ocq), -EINVAL, msg);

	/* local CAS on words it must refuse, and with a bad rkey */
	memset(w, 0, 4096);
	CHECK(rps__mr_reg(fab, w, 4096, RPS__ACCESS_REMOTE_ATOMIC, &mr) == 0);
	CHECK(rps__mr_reg(fab, w, 4096, RPS__ACCESS_REMOTE_WRITE, &lmr) == 0);
	CHECK_ERR(rps__local_cas(fab, mr, (uint64_t *)((char *)w + 4), 0, 1, &old), -EINVAL, "8-byte aligned and inside");
	CHECK_ERR(rps__local_cas(fab, mr, w + 512, 0, 1, &old), -EINVAL, "8-byte aligned and inside");
	CHECK_ERR(rps__local_cas(fab, lmr, w, 0, 1, &old), -EINVAL, "RPS__ACCESS_REMOTE_ATOMIC");
	fake = *mr;
	fake.rkey ^= 0x5a5a00;
	CHECK_ERR(rps__local_cas(fab, &fake, w + 3, 0, 1, &old), -EACCES, "local_cas: loopback CAS failed");
	CHECK(w[3] == 0);
	/* the loopback QP is rebuilt after the error */
	CHECK(rps__local_cas(fab, mr, w + 3, 0, 7, &old) == 0 && old == 0 && w[3] == 7);
	CHECK(rps__mr_dereg(lmr) == 0);
	CHECK(rps__mr_dereg(mr) == 0);
	free(w);

	/* listening where it cannot */
	CHECK_ERR(rps__listen(fab, "192.0.2.1", 7471, &l), -EADDRNOTAVAIL, "not an address of an RDMA-capable interface");
	CHECK(rps__listen(fab, test_addr(), 0, &l) == 0);
	port = rps__listener_port(l);
	CHECK_ERR(rps__listen(fab, test_addr(), port, &l2), -EADDRINUSE, "another listener has that port");
	CHECK_ERR(rps__listener_get_request(l, &req), -EAGAIN, "no connection request waiting");

	/* connecting with what it must refuse before any packet */
	CHECK_ERR(rps__connect(fab, "", port, cq, NULL, NULL, 0, 5000, NULL, NULL, &ep), -EINVAL, "no host given");
	CHECK(rps__fabric_open(&a, &other) == 0);
	CHECK(rps__cq_create(other, 16, &ocq) == 0);
	CHECK_ERR(rps__connect(fab, test_addr(), port, ocq, NULL, NULL, 0, 5000, NULL, NULL, &ep), -EINVAL,
		  "the CQ belongs to another fabric");
	snprintf(msg, sizeof(msg), "exceed %s's max_qp_wr", rps__fabric_name(fab));
	CHECK_ERR(rps__connect(fab, test_addr(), port, cq, &huge, NULL, 0, 5000, NULL, NULL, &ep), -EINVAL, msg);
	/* the request of that refused connect never reached the listener */
	CHECK_ERR(rps__listener_get_request(l, &req), -EAGAIN, "no connection request waiting");
	rps__listener_close(l);
	/* nobody listens there any more */
	CHECK_ERR(rps__connect(fab, test_addr(), port, cq, NULL, NULL, 0, 10000, NULL, NULL, &ep), -ECONNREFUSED,
		  "nobody listens on that port");
	rps__cq_destroy(ocq);
	rps__fabric_close(other);
	rps__cq_destroy(cq);
	rps__fabric_close(fab);
	return 0;
}

static void t_local_errors(void)
{
	run_isolated("local_errors", body_local_errors, 120);
}

/* ---- error cases that need a peer ---------------------------------------- */

static int errors_client(int port_fd, int ready_fd)
{
	const struct vpeer_opts o = { .cq_depth = 64, .attr = { .sq_depth = 4, .rq_depth = 2, .max_inline = 16 },
				      .mr = { { 4096, RPS__ACCESS_LOCAL } } };
	uint8_t rep[RPS__PRIVDATA_MAX];
	struct rps__wc wc;
	struct rps__wr wr;
	struct rps__sge sge;
	struct rps__cq *cq;
	struct rps__mr *mr;
	struct rps__ep *ep;
	struct vpeer p;
	size_t rlen;
	char *buf, c;
	int i;

	memset(&wr, 0, sizeof(wr));
	CHECK(peer_open(&p, &o) == 0);
	CHECK(read_full(port_fd, &p.port, sizeof(p.port), 30000) == 0);
	buf = p.buf[0];
	mr = p.mr[0];
	cq = p.cq;
	/* 1, 2: the server's accept fails before answering: we are rejected,
	 * without private data */
	for (i = 0; i < 2; i++) {
		rlen = 99;
		CHECK_ERR(rps__connect(p.fab, test_addr(), p.port, cq, NULL, "x", 1, 10000, rep, &rlen, &ep), -ECONNREFUSED,
			  "rejected by the peer");
		CHECK(rlen == 0);
	}
	/* 3: a connection to misuse */
	CHECK(vpeer_connect(&p, -1, NULL) == 0);
	ep = p.ep;
	CHECK_ERR(rps__post(ep, &wr, -1), -EINVAL, "negative count -1");
	CHECK(rps__post(ep, &wr, 0) == 0);
	wr = (struct rps__wr){ .wr_id = 1, .op = (enum rps__op)99, .sge = { buf, 8, mr } };
	CHECK_ERR(rps__post(ep, &wr, 1), -EINVAL, "unknown op 99 in WR 0");
	wr = (struct rps__wr){ .wr_id = 1, .op = RPS__OP_CAS, .sge = { buf, 8, NULL }, .raddr = 64, .rkey = 1 };
	CHECK_ERR(rps__post(ep, &wr, 1), -EINVAL, "atomic WR 0 needs an 8-byte aligned result word");
	wr.sge = (struct rps__sge){ buf + 4, 8, mr };
	wr.op = RPS__OP_FADD;
	CHECK_ERR(rps__post(ep, &wr, 1), -EINVAL, "atomic WR 0 needs an 8-byte aligned result word");
	wr = (struct rps__wr){ .wr_id = 1, .op = RPS__OP_WRITE, .sge = { buf, 4096, NULL }, .raddr = 64, .rkey = 1 };
	CHECK_ERR(rps__post(ep, &wr, 1), -EINVAL, "WR 0 has 4096 bytes outside any registered region");
	CHECK(strstr(rps__errbuf(), "inline") == NULL);
	wr.flags = RPS__WR_INLINE;	/* more than max_inline */
	CHECK_ERR(rps__post(ep, &wr, 1), -EINVAL, "and too many to inline (see ep_attr.max_inline)");
	sge = (struct rps__sge){ buf, 64, NULL };
	CHECK_ERR(rps__post_recv(ep, &sge, 1), -EINVAL, "post_recv: the buffer must be in a registered region");
	sge.mr = mr;
	CHECK(rps__post_recv(ep, &sge, 1) == 0);
	CHECK(rps__post_recv(ep, &sge, 2) == 0);
	CHECK_ERR(rps__post_recv(ep, &sge, 3), -EAGAIN, "receive queue of");
	CHECK(strstr(rps__errbuf(), "(2 posted)") != NULL);
	CHECK(!rps__ep_is_error(ep));
	/* a SEND larger than the receive posted for it */
	CHECK(read_full(ready_fd, &c, 1, 60000) == 0);
	memset(buf, 'S', 64);
	wr = (struct rps__wr){ .wr_id = 5, .op = RPS__OP_SEND, .flags = RPS__WR_SIGNALED, .sge = { buf, 64, mr } };
	CHECK(rps__post(ep, &wr, 1) == 0);
	CHECK(wait_one(cq, &wc, 60000) == 1);
	fprintf(stderr, "    oversized SEND at the sender: %s\n", rps__wc_status_str(wc.status));
	CHECK(wc.wr_id == 5 && wc.ep == ep);
	/* the receiver NAKs it, unless its QP went to ERR first (its error
	 * completion moves it there: verbs_fabric.c's ep_set_error), which drops
	 * the packet: then our retries run out (seen on rxe) */
	CHECK(wc.status == RPS__WC_REM_OP_ERR || wc.status == RPS__WC_RETRY_EXC_ERR);
	CHECK(rps__ep_is_error(ep));
	/* our two receives flush */
	for (i = 0; i < 2; i++) {
		CHECK(wait_one(cq, &wc, 60000) == 1);
		CHECK(wc.status == RPS__WC_FLUSH_ERR && wc.opcode == RPS__WC_RECV && wc.wr_id == (uint64_t)i + 1);
	}
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static int body_peer_errors(void)
{
	struct rps__fabric_attr a = { .kind = RPS__KIND_VERBS };
	struct rps__ep_attr huge = { .sq_depth = 4, .rq_depth = 1u << 30 };
	const struct vpeer_opts o = { .cq_depth = 64, .attr = { .sq_depth = 4, .rq_depth = 2 },
				      .mr = { { 4096, RPS__ACCESS_LOCAL } } };
	struct rps__fabric *other;
	struct rps__conn_req *req;
	struct rps__cq *cq, *ocq;
	struct rps__ep *ep;
	struct rps__wc wc;
	struct rps__sge sge;
	struct vpeer p;
	int pp[2], rp[2];
	char msg[128];
	pid_t pid;

	CHECK(pipe(pp) == 0 && pipe(rp) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child_exit(errors_client(pp[0], rp[0]));
	CHECK(peer_open(&p, &o) == 0);
	cq = p.cq;
	CHECK(rps__fabric_open(&a, &other) == 0);
	CHECK(rps__cq_create(other, 16, &ocq) == 0);
	CHECK(vpeer_listen(&p, pp[1]) == 0);
	/* 1: a CQ of another fabric */
	CHECK(vpeer_wait_request(p.l, &req) == 0);
	CHECK_ERR(rps__accept(req, ocq, NULL, NULL, 0, &ep), -EINVAL, "accept: the CQ belongs to another fabric");
	/* 2: more receives than the device allows */
	CHECK(vpeer_wait_request(p.l, &req) == 0);
	snprintf(msg, sizeof(msg), "rq_depth 1073741824 exceed %s's max_qp_wr", rps__fabric_name(p.fab));
	CHECK_ERR(rps__accept(req, cq, &huge, NULL, 0, &ep), -EINVAL, msg);
	/* 3 */
	CHECK(vpeer_accept(&p, NULL) == 0);
	ep = p.ep;
	sge = (struct rps__sge){ p.buf[0], 8, p.mr[0] };
	CHECK(rps__post_recv(ep, &sge, 42) == 0);
	CHECK(write_full(rp[1], "R", 1) == 0);
	CHECK(wait_one(cq, &wc, 60000) == 1);
	fprintf(stderr, "    oversized SEND at the receiver: %s\n", rps__wc_status_str(wc.status));
	CHECK(wc.wr_id == 42 && wc.ep == ep && wc.opcode == RPS__WC_RECV);
	CHECK(wc.status == RPS__WC_LOC_ERR);
	CHECK(rps__ep_is_error(ep));
	CHECK(check_child(pid, 60) == 0);
	rps__cq_destroy(ocq);
	rps__fabric_close(other);
	CHECK(vpeer_close(&p) == 0);
	return 0;
}

static void t_peer_errors(void)
{
	run_isolated("peer_errors", body_peer_errors, 180);
}

/* ---- injected failures (RPS_VERBS_FAULT, see verbs.c) ---------------------- */

/* Descriptors this process holds, other than the device contexts that
 * librdmacm opens once and keeps (uverbs, and their async event fds). */
static int count_fds(void)
{
	char path[300], link[256];
	struct dirent *d;
	DIR *dir;
	ssize_t n;
	int count = 0;

	dir = opendir("/proc/self/fd");
	if (!dir)
		return -1;
	while ((d = readdir(dir)) != NULL) {
		if (d->d_name[0] == '.' || atoi(d->d_name) == dirfd(dir))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", d->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n < 0)
			continue;
		link[n] = 0;
		if (!strncmp(link, "/dev/infiniband/uverbs", 22))
			continue;
		count++;
	}
	closedir(dir);
	return count;
}

enum fscen { F_OPEN, F_CQ, F_LISTEN, F_CONNECT, F_ACCEPT, F_REJECT, F_LCAS, F_LCASW };

struct fault_case {
	const char *spec;	/* RPS_VERBS_FAULT */
	enum fscen scen;
	int ret;		/* the first failing call must return this */
	const char *words;	/* and say this */
	int retry;		/* the same call then succeeds (and undoes) */
};

static const struct fault_case *g_fc;
static int g_fds;

/* Checks the injected failure: code, message, one line, nothing left open;
 * returns 2 when it is as expected. */
static int fault_seen(int r)
{
	int n = count_fds();

	fprintf(stderr, "    %s: %d: %s\n", g_fc->spec, r, rps__errbuf());
	CHECK(r == g_fc->ret);
	CHECK(strstr(rps__errbuf(), g_fc->words) != NULL);
	CHECK(strchr(rps__errbuf(), '\n') == NULL);
	if (n != g_fds)
		fprintf(stderr, "    %d descriptors before, %d after the failure\n", g_fds, n);
	CHECK(n == g_fds);
	return 2;
}

/* Run one call; if it fails, it must be the injected failure. */
#define STEP(expr)                                                              \
	do {                                                                    \
		int r_;                                                         \
		g_fds = count_fds();                                            \
		r_ = (expr);                                                    \
		if (r_ < 0) {                                                   \
			if (fault_seen(r_) != 2)                                \
				return 1;                                       \
			if (g_fc->retry)                                        \
				CHECK((expr) >= 0);                             \
			return 2;                                               \
		}                                                               \
	} while (0)

/* A peer that accepts (and closes) every connection, for ever. */
static int fault_server(int port_fd)
{
	const struct vpeer_opts o = { .cq_depth = 64 };
	struct rps__ep *ep;
	struct vpeer p;

	CHECK(peer_open(&p, &o) == 0);
	CHECK(vpeer_listen(&p, port_fd) == 0);
	for (;;)
		if (vpeer_accept(&p, &ep) == 0)
			rps__ep_close(ep);
	return 0;
}

/* A peer that connects until it is killed. */
static int fault_client(int port_fd)
{
	const struct vpeer_opts o = { .cq_depth = 64 };
	struct rps__ep *ep;
	struct vpeer p;

	CHECK(peer_open(&p, &o) == 0);
	CHECK(read_full(port_fd, &p.port, sizeof(p.port), 30000) == 0);
	for (;;) {
		if (rps__connect(p.fab, test_addr(), p.port, p.cq, NULL, NULL, 0, 10000, NULL, NULL, &ep) == 0)
			rps__ep_close(ep);
		usleep(50000);
	}
	return 0;
}

static int fault_body(const struct fault_case *fc)
{
	struct rps__fabric_attr fa = { .kind = RPS__KIND_VERBS, .host = test_addr() };
	struct rps__fabric *fab;
	struct rps__listener *l;
	struct rps__conn_req *req;
	struct rps__cq *cq;
	struct rps__mr *mr, *wmr = NULL;
	struct rps__ep *ep;
	struct rps__wc wc;
	struct ibv_context **devs;
	uint64_t *buf, old;
	uint16_t port;
	int pp[2], ret;
	pid_t pid;

	g_fc = fc;
	CHECK(pipe(pp) == 0);
	if (fc->scen == F_CONNECT) {
		pid = fork();
		CHECK(pid >= 0);
		if (pid == 0)
			child_exit(fault_server(pp[1]));
		CHECK(read_full(pp[0], &port, sizeof(port), 60000) == 0);
	} else if (fc->scen == F_ACCEPT || fc->scen == F_REJECT) {
		pid = fork();
		CHECK(pid >= 0);
		if (pid == 0)
			child_exit(fault_client(pp[0]));
	}
	/* librdmacm opens the device contexts once and keeps them: do that
	 * before counting descriptors, without going through verbs.c */
	devs = rdma_get_devices(&ret);
	CHECK(devs != NULL);
	rdma_free_devices(devs);
	CHECK(setenv("RPS_VERBS_FAULT", fc->spec, 1) == 0);

	STEP(rps__fabric_open(&fa, &fab));
	if (fc->scen == F_OPEN)
		goto none;
	if ((fc->scen == F_LCASW || !strncmp(fc->spec, "ibv_alloc_mw", 12)) && !rps__fabric_windows(fab)) {
		fprintf(stderr, "    (%s has no memory windows: nothing to fail)\n", rps__fabric_name(fab));
		return 2;
	}
	CHECK((buf = aligned_alloc(4096, 4096)) != NULL);
	memset(buf, 0, 4096);
	if (fc->scen == F_LCAS || fc->scen == F_LCASW) {
		/* (F_LCASW: a windowed region, which the loopback QP reaches
		 * through a window of its own, where the device has them) */
		STEP(rps__mr_reg(fab, buf, 4096, RPS__ACCESS_REMOTE_ATOMIC |
				 (fc->scen == F_LCASW ? RPS__ACCESS_WINDOWED : 0), &mr));
		STEP(rps__local_cas(fab, mr, buf + 1, 0, 1, &old));
		CHECK(buf[1] == 1);
		goto none;
	}
	STEP(rps__cq_create(fab, 64, &cq));
	STEP(rps__cq_arm(cq));
	STEP(rps__cq_poll(cq, &wc, 1));
	STEP(rps__cq_grow(cq, 4096));
	if (fc->scen == F_CQ)
		goto none;
	if (fc->scen == F_CONNECT) {
		struct rps__sge sge = { buf, 8, NULL };
		struct rps__wr wr = { .wr_id = 1, .op = RPS__OP_SEND, .flags = RPS__WR_INLINE, .sge = { buf, 8, NULL } };

		STEP(rps__mr_reg(fab, buf, 4096, RPS__ACCESS_LOCAL, &mr));
		sge.mr = mr;
		STEP(rps__connect(fab, test_addr(), port, cq, NULL, NULL, 0, 10000, NULL, NULL, &ep));
		STEP(rps__post_recv(ep, &sge, 1));
		STEP(rps__post(ep, &wr, 1));
		if (rps__fabric_windows(fab)) {	/* a window bound on the QP */
			uint32_t k;

			STEP(rps__mr_reg(fab, buf + 2048, 2048, RPS__ACCESS_REMOTE_READ | RPS__ACCESS_WINDOWED, &wmr));
			STEP(rps__mw_bind(ep, wmr, RPS__ACCESS_REMOTE_READ, &k));
		}
		rps__ep_close(ep);
		STEP(rps__mr_dereg(mr));
		rps__mr_dereg(wmr);
		goto none;
	}
	STEP(rps__listen(fab, test_addr(), 0, &l));
	ret = rps__listener_get_request(l, &req);
	if (ret != -EAGAIN)
		STEP(ret);
	if (fc->scen == F_LISTEN)
		goto none;
	port = rps__listener_port(l);
	CHECK(write_full(pp[1], &port, sizeof(port)) == 0);
	CHECK(vpeer_wait_request(l, &req) == 0);
	if (fc->scen == F_REJECT)
		STEP(rps__reject(req, "no", 3));
	else
		STEP(rps__accept(req, cq, NULL, NULL, 0, &ep));
none:
	fprintf(stderr, "    %s: no call failed\n", fc->spec);
	return 1;
}

static const struct fault_case fault_cases[] = {
	{ "rdma_get_devices", F_OPEN, -ENODEV, "verbs: no RDMA device found", 1 },
	{ "getaddrinfo", F_OPEN, -EHOSTUNREACH, "verbs: cannot resolve host", 1 },
	{ "rdma_create_id", F_OPEN, -ENOMEM, "verbs: rdma_create_id: Cannot allocate memory: is rdma_ucm loaded?", 1 },
	{ "ibv_query_device", F_OPEN, -ENOMEM, "verbs: ibv_query_device(", 1 },
	{ "ibv_query_port", F_OPEN, -ENOMEM, "verbs: ibv_query_port(", 1 },
	{ "ibv_alloc_pd", F_OPEN, -ENOMEM, "verbs: ibv_alloc_pd(", 1 },
	{ "aligned_alloc", F_OPEN, -ENOMEM, "verbs: out of memory opening the fabric", 1 },
	{ "ibv_reg_mr", F_OPEN, -ENOMEM, "verbs: ibv_reg_mr(64 bytes): Cannot allocate memory", 1 },
	{ "rdma_create_event_channel", F_OPEN, -ENOMEM, "verbs: rdma_create_event_channel: Cannot allocate memory", 1 },
	{ "fcntl", F_OPEN, -ENOMEM, "verbs: rdma_create_event_channel: Cannot allocate memory", 1 },
	{ "ibv_create_comp_channel", F_CQ, -ENOMEM, "ibv_create_comp_channel(", 1 },
	{ "fcntl:2:9", F_CQ, -EBADF, "O_NONBLOCK on the completion channel: Bad file descriptor", 1 },
	{ "ibv_create_cq", F_CQ, -ENOMEM, "entries): Cannot allocate memory", 1 },
	{ "epoll_create1:1:24", F_CQ, -EMFILE, "verbs: epoll_create1: Too many open files", 1 },
	{ "epoll_ctl", F_CQ, -ENOMEM, "verbs: epoll_ctl(completion channel)", 1 },
	{ "epoll_ctl:2", F_CQ, -ENOMEM, "verbs: epoll_ctl(CM channel)", 1 },
	{ "ibv_req_notify_cq:1:22", F_CQ, -EINVAL, "ibv_req_notify_cq: Invalid argument", 1 },
	{ "ibv_poll_cq", F_CQ, -EIO, "ibv_poll_cq failed on", 1 },
	{ "ibv_resize_cq:1:12", F_CQ, -ENOMEM, "ibv_resize_cq(", 1 },
	{ "getaddrinfo:2", F_LISTEN, -EHOSTUNREACH, "verbs: cannot resolve host", 1 },
	{ "rdma_create_event_channel:2", F_LISTEN, -ENOMEM, "verbs: rdma_create_event_channel: Cannot", 1 },
	{ "rdma_create_id:2", F_LISTEN, -ENOMEM, "verbs: rdma_create_id: Cannot allocate memory", 1 },
	{ "rdma_bind_addr", F_LISTEN, -ENOMEM, ":0): Cannot allocate memory", 1 },
	{ "rdma_bind_addr:1:99", F_LISTEN, -EADDRNOTAVAIL, "not an address of an RDMA-capable interface", 1 },
	{ "rdma_listen:1:98", F_LISTEN, -EADDRINUSE, "verbs: rdma_listen(", 1 },
	{ "rdma_get_cm_event@listener:1:5", F_LISTEN, -EIO, "verbs: rdma_get_cm_event(listener): Input/output error", 0 },
	{ "ibv_reg_mr:2", F_LCAS, -ENOMEM, "raise `ulimit -l`", 1 },
	{ "ibv_reg_mr:2:22", F_LCAS, -EINVAL, "bytes at 0x", 1 },
	{ "aligned_alloc:2", F_LCAS, -ENOMEM, "local_cas: out of memory", 1 },
	{ "ibv_create_cq", F_LCAS, -ENOMEM, "local_cas: ibv_create_cq: Cannot allocate memory", 1 },
	{ "ibv_reg_mr:3", F_LCAS, -ENOMEM, "local_cas: ibv_reg_mr(64 bytes): Cannot allocate memory", 1 },
	{ "ibv_create_qp", F_LCAS, -ENOMEM, "local_cas: ibv_create_qp: Cannot allocate memory", 1 },
	{ "ibv_modify_qp:1:22", F_LCAS, -EINVAL, "local_cas: loopback QP to INIT: Invalid argument", 1 },
	{ "ibv_modify_qp:2:22", F_LCAS, -EINVAL, "local_cas: loopback QP to RTR: Invalid argument", 1 },
	{ "ibv_modify_qp:3:22", F_LCAS, -EINVAL, "local_cas: loopback QP to RTS: Invalid argument", 1 },
	{ "ibv_query_gid:0", F_LCAS, -EADDRNOTAVAIL, "has no GID", 0 },
	{ "ibv_post_send:1:12", F_LCAS, -ENOMEM, "local_cas: ibv_post_send: Cannot allocate memory", 1 },
	{ "ibv_poll_cq", F_LCAS, -EIO, "local_cas: loopback CAS failed: ibv_poll_cq error", 1 },
	{ "ibv_alloc_mw", F_CONNECT, -ENOMEM, "Cannot allocate memory: the device's memory windows ran out", 1 },
	{ "ibv_alloc_mw", F_LCASW, -ENOMEM, "local_cas: ibv_alloc_mw: Cannot allocate memory", 1 },
	{ "ibv_post_send:1:12", F_LCASW, -ENOMEM, "local_cas: ibv_post_send: Cannot allocate memory (window bind)", 1 },
	{ "ibv_poll_cq", F_LCASW, -EIO, "local_cas: loopback window bind failed: ibv_poll_cq error", 1 },
	{ "getaddrinfo:2", F_CONNECT, -EHOSTUNREACH, "verbs: cannot resolve host", 0 },
	{ "rdma_create_event_channel:2", F_CONNECT, -ENOMEM, "is rdma_ucm loaded?", 0 },
	{ "rdma_create_id:2", F_CONNECT, -ENOMEM, "verbs: rdma_create_id: Cannot allocate memory", 0 },
	{ "rdma_resolve_addr:1:113", F_CONNECT, -EHOSTUNREACH, "verbs: rdma_resolve_addr(", 0 },
	{ "rdma_get_cm_event:1:5", F_CONNECT, -EIO, "verbs: resolving ", 0 },
	{ "rdma_resolve_route:1:113", F_CONNECT, -EHOSTUNREACH, "verbs: rdma_resolve_route(", 0 },
	{ "rdma_get_cm_event:2:5", F_CONNECT, -EIO, "verbs: route to ", 0 },
	{ "ibv_create_qp", F_CONNECT, -ENOMEM, "ibv_create_qp(", 0 },
	{ "ibv_modify_qp:1:22", F_CONNECT, -EINVAL, "QP to INIT: Invalid argument", 0 },
	{ "rdma_connect:1:5", F_CONNECT, -EIO, "verbs: rdma_connect(", 0 },
	{ "rdma_get_cm_event:3:5", F_CONNECT, -EIO, "Input/output error", 0 },
	{ "ibv_modify_qp:2:22", F_CONNECT, -EINVAL, "QP to RTS: Invalid argument", 0 },
	{ "ibv_modify_qp:3:22", F_CONNECT, -EINVAL, "QP to RTS: Invalid argument", 0 },
	{ "rdma_establish:1:5", F_CONNECT, -EIO, "rdma_establish: Input/output error", 0 },
	{ "rdma_migrate_id:1:5", F_CONNECT, -EIO, "rdma_migrate_id: Input/output error", 0 },
	{ "ibv_post_recv:1:12", F_CONNECT, -ENOMEM, "ibv_post_recv(", 0 },
	{ "ibv_post_send:1:12", F_CONNECT, -ENOMEM, "(0 of 1 WRs posted)", 0 },
	{ "ibv_dereg_mr:1:16", F_CONNECT, -EBUSY, "ibv_dereg_mr(4096 bytes): Device or resource busy", 1 },
	{ "ibv_create_qp", F_ACCEPT, -ENOMEM, "ibv_create_qp(", 0 },
	{ "ibv_modify_qp:1:22", F_ACCEPT, -EINVAL, "QP to RTS: Invalid argument", 0 },
	{ "ibv_modify_qp:2:22", F_ACCEPT, -EINVAL, "QP to RTS: Invalid argument", 0 },
	{ "ibv_modify_qp:3:22", F_ACCEPT, -EINVAL, "QP to RTS: Invalid argument", 0 },
	{ "rdma_create_event_channel:3", F_ACCEPT, -ENOMEM, "rdma_create_event_channel: Cannot allocate memory", 0 },
	{ "rdma_migrate_id:1:5", F_ACCEPT, -EIO, "rdma_migrate_id: Input/output error", 0 },
	{ "rdma_accept:1:5", F_ACCEPT, -EIO, "the peer may have given up", 0 },
	{ "rdma_get_cm_event:1:5", F_ACCEPT, -EIO, "no RTU from the peer: Input/output error", 0 },
	{ "rdma_migrate_id:2:5", F_ACCEPT, -EIO, "rdma_migrate_id: Input/output error", 0 },
	{ "rdma_reject:1:5", F_REJECT, -EIO, "verbs: rdma_reject(", 0 },
};

static void t_faults(void)
{
	static const char *names[] = { "open", "cq", "listen", "connect", "accept", "reject", "lcas", "lcas, windowed" };
	unsigned i;
	int status;
	pid_t pid;

	for (i = 0; i < RPS__ARRAY_SIZE(fault_cases); i++) {
		const struct fault_case *fc = &fault_cases[i];

		fprintf(stderr, "    [%s] RPS_VERBS_FAULT=%s\n", names[fc->scen], fc->spec);
		fflush(NULL);
		pid = fork();
		CU_ASSERT_FATAL(pid >= 0);
		if (pid == 0) {
			setpgid(0, 0);
			child_exit(fault_body(fc) == 2 ? 0 : 1);
		}
		setpgid(pid, pid);
		if (wait_child(pid, 60, &status) == -ETIMEDOUT) {
			fprintf(stderr, "    %s: hung: killing it\n", fc->spec);
			kill(-pid, SIGKILL);
			waitpid(pid, &status, 0);
		}
		kill(-pid, SIGKILL);	/* its peer */
		if (!WIFEXITED(status) || WEXITSTATUS(status))
			fprintf(stderr, "    FAILED: [%s] RPS_VERBS_FAULT=%s\n", names[fc->scen], fc->spec);
		CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
}

/* ---- main ---------------------------------------------------------------- */

int main(void)
{
	static const struct cutest tests[] = {
		{ "device by name / by address, wildcard listen", t_open },
		{ "a child forked after its parent opened the device is refused in one line", t_fork_refused },
		{ "registration fails cleanly under a low memlock limit", t_memlock },
		{ "private data both ways, reject with a reason", t_privdata },
		{ "full send queue, inline writes, WRITE_IMM", t_sq_full },
		{ "SEND burst into 16 receives: no RNR stall", t_send_burst },
		{ "a CQ grown under its endpoint holds what it was grown for", t_cq_grow },
		{ "wrong rkey / out of range / no right / misaligned", t_access_errors },
		{ "peer closes: posted receives flush", t_graceful_close },
		{ "initiator stopped before its RTU: accept does not wait for it, the CM fails it later",
		  t_stalled_initiator },
		{ "peer SIGKILLed mid-operation: no hang", t_peer_killed },
		{ "CAS contention from 3 processes", t_cas },
		{ "FADD from 3 processes", t_fadd },
		{ "local CAS against remote CAS", t_local_cas },
		{ "errors without a peer: exact codes and messages", t_local_errors },
		{ "errors with a peer: bad WRs, full RQ, oversized SEND", t_peer_errors },
		{ "injected errors: codes, messages, nothing leaked", t_faults },
	};

	if (!rps__verbs_available()) {
		printf("test_verbs: no RDMA device (ibv_get_device_list is empty): skipped\n");
		return 77;
	}
	printf("test_verbs: device found, RPS_TEST_ADDR=%s\n", test_addr());
	/* RPS_TEST_ONLY=text runs only the tests whose names contain it (cutest.h) */
	return cutest_run1("verbs", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests));
}
