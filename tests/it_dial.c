/*
 * it_dial.c - a server's dial to a peer that answers nothing does not stop
 * its loop.  Three rdmapsd processes (members 1..3); member 1 is killed and
 * its address taken by a "black hole" of the test's: a listening socket
 * whose connections are accepted (so the connector's TCP handshake
 * completes, as it does with a SIGSTOPped server's backlog) but never
 * answered, like a member whose host is gone without a reset.  Members 2
 * and 3 dial member 1 (the higher id dials for Raft; a primary dials its
 * backups for the replication stream) and each dial waits in the
 * black hole until its 2 s timeout.
 *
 * For every dial that reaches the black hole (its hello names the dialing
 * member), the test asks that member for its STATUS at once, while the
 * dial is still held open, and checks:
 *  (1) STATUS is answered, and the dial is still open afterwards: the
 *      member served the request while its dial was pending (a connect that
 *      blocks the loop answers only once the dial gave up: the black hole
 *      then sees the dialer's FIN first);
 *  (2) every dial is given up by its dialer in the end (the black hole sees
 *      its FIN): the dial's timeout, a timer of the loop now;
 *  (3) each of members 2 and 3 dials again after that (at least 2 dials
 *      each, every one of them passing (1)).
 * (A dial the dialer gave up before the test read its hello, the test busy
 * asking the other member, is not asked about.)
 * The time STATUS took is printed, not asserted.
 *
 * A second suite does the same to a worker (test_worker_dials_at_once);
 * the last checks that members close the peer connections their map no
 * longer calls for (test_peers_closed_when_unneeded).
 */
#include "config.h"
#include "cluster.h"
#include "client/client.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"
#include "proto/proto.h"
#include "proto/smap.h"
#include "lib/cutest.h"
#include "lib/watchdog.h"

#define NSERVERS 3
#define SERVER_ARGS "--partitions 6 --shard-size 4096 --slots 4 --fsync none"
#define TEST_WATCHDOG_S 300
#define DIALS_EACH 2		/* dials of each of members 2 and 3 to check */
#define WAIT_S 60.0		/* for all of them (a dial every ~3 s) */
#define MAX_HELD 64
#define HELLO_SIZE 72		/* the tcp transport's hello: the connect data from byte 16 */
#define HELLO_DATA 16

static struct it_cluster clu;
static bool clu_up;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A listening socket on member 1's address, which accepts nothing itself. */
static int black_hole(uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd, one = 1;

	if (inet_pton(AF_INET, clu.addr, &sa.sin_addr) != 1)
		return -1;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 64)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Has the other end closed fd (FIN or reset)?  Reads nothing it sent
 * after its hello (there is nothing). */
static bool closed_by_peer(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
	char b;

	if (poll(&p, 1, 0) <= 0)
		return false;
	return recv(fd, &b, 1, MSG_DONTWAIT | MSG_PEEK) <= 0;
}

struct held {
	int fd;
	uint8_t hello[HELLO_SIZE];
	uint32_t got;
	uint64_t from_id;	/* 0: hello not complete yet */
};

static void test_dial_black_hole(void)
{
	struct held h[MAX_HELD];
	int nheld = 0, lfd, dials[NSERVERS + 1] = { 0 }, gave_up = 0, served_while_open = 0, probes = 0;
	double slowest = 0, end;
	struct rps__smap m;

	CU_ASSERT_EQUAL_FATAL(it_cluster_start(&clu, NSERVERS, SERVER_ARGS), 0);
	clu_up = true;
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 0, 60000, &m), 0);

	it_server_kill(&clu, 0);	/* member 1 */
	lfd = black_hole(clu.port[0]);
	CU_ASSERT_FATAL(lfd >= 0);

	end = now_s() + WAIT_S;
	while (now_s() < end && (dials[2] < DIALS_EACH || dials[3] < DIALS_EACH || gave_up < 2 * DIALS_EACH)) {
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		int i, fd;

		if (poll(&p, 1, 20) > 0 && nheld < MAX_HELD) {
			fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
			if (fd >= 0)
				h[nheld++] = (struct held){ .fd = fd };
		}
		for (i = 0; i < nheld; i++) {
			struct rps__conn_priv priv;
			struct it_member st;
			ssize_t n;
			double t0, dt;
			int ret, k;

			if (h[i].from_id && closed_by_peer(h[i].fd)) {
				gave_up++;	/* (2) */
				close(h[i].fd);
				h[i--] = h[--nheld];
				continue;
			}
			if (h[i].from_id)
				continue;
			n = recv(h[i].fd, h[i].hello + h[i].got, HELLO_SIZE - h[i].got, MSG_DONTWAIT);
			if (n == 0) {	/* gone before its hello */
				close(h[i].fd);
				h[i--] = h[--nheld];
				continue;
			}
			if (n < 0 || (h[i].got += (uint32_t)n) < HELLO_SIZE)
				continue;
			memcpy(&priv, h[i].hello + HELLO_DATA, sizeof(priv));
			CU_ASSERT_EQUAL(priv.magic, RPS__DESC_MAGIC);
			/* Raft's dial, or a primary's replication stream to a
			 * backup on member 1 (R = 2 by default): neither may
			 * stop the dialer's loop */
			CU_ASSERT(priv.role == RPS__ROLE_PEER || priv.role == RPS__ROLE_REPL ||
				  priv.role == RPS__ROLE_REPL_REV);
			CU_ASSERT_EQUAL(priv.to_id, 1u);
			CU_ASSERT(priv.from_id == 2 || priv.from_id == 3);
			if (priv.from_id != 2 && priv.from_id != 3) {
				h[i].from_id = 99;
				continue;
			}
			h[i].from_id = priv.from_id;
			/* given up already (we were busy with another): not asked */
			if (closed_by_peer(h[i].fd))
				continue;
			dials[priv.from_id]++;
			/* (1) its dial to us is pending: does it serve? */
			k = it_member_index(&clu, priv.from_id);
			t0 = now_s();
			ret = it_member_status(&clu, k, &st, NULL);
			dt = now_s() - t0;
			probes++;
			CU_ASSERT_EQUAL(ret, 0);
			CU_ASSERT_EQUAL(st.id, priv.from_id);
			if (closed_by_peer(h[i].fd))
				fprintf(stderr, "it_dial: member %llu answered STATUS only after its dial gave up "
					"(%.0f ms)\n", (unsigned long long)priv.from_id, dt * 1e3);
			else
				served_while_open++;
			if (dt > slowest)
				slowest = dt;
		}
	}
	fprintf(stderr, "it_dial: dials from member 2: %d, member 3: %d; given up: %d; STATUS served while "
		"the dial was pending: %d of %d (slowest %.0f ms)\n", dials[2], dials[3], gave_up,
		served_while_open, probes, slowest * 1e3);
	CU_ASSERT(dials[2] >= DIALS_EACH);	/* (3) */
	CU_ASSERT(dials[3] >= DIALS_EACH);
	CU_ASSERT(gave_up >= 2 * DIALS_EACH);	/* (2) */
	CU_ASSERT_EQUAL(served_while_open, probes);	/* (1) */
	while (nheld)
		close(h[--nheld].fd);
	close(lfd);
}

/*
 * A worker dials every member at once.  Two servers, and HOLES members
 * added to the map at black holes of the test's (psctl add-server
 * --no-rebalance: members that own nothing, whose hosts answer nothing).
 * A worker connects with a HOLE_TIMEOUT_MS timeout: it must dial every
 * hole before it gives up on any of them (made in turn, the first dial
 * times out before the second starts), go on with the members that
 * answer (a push and a pull, exact), and give each hole up in the end.
 * Its connect time is printed, not asserted.
 */
#define HOLES 6
#define HOLE_TIMEOUT_MS 4000
#define HOLE_COUNT 1024u

/* A black hole on an ephemeral port of the cluster's address: *port. */
static int black_hole_any(uint16_t *port)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int fd = black_hole(0);

	if (fd >= 0 && getsockname(fd, (struct sockaddr *)&sa, &len)) {
		close(fd);
		return -1;
	}
	*port = ntohs(sa.sin_port);
	return fd;
}

static int hole_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	static float v[HOLE_COUNT];
	struct rps_tensor_opts o;
	struct rps_client *cl;
	rps_tensor_t *t = NULL;
	double t0 = it_now_s(), dt;
	int ret;

	(void)arg;
	ret = it_client_connect(servers, rank, nworkers, HOLE_TIMEOUT_MS, &cl);
	dt = it_now_s() - t0;
	it_write_all(out_fd, &dt, sizeof(dt));
	if (ret)
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = HOLE_COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SUM;
	o.rescale = 1.0f;
	if ((ret = rps_tensor_create(cl, "holes", &o, &t)))
		return it_worker_fail(rank, "create", ret);
	for (uint32_t i = 0; i < HOLE_COUNT; i++)
		v[i] = (float)(i % 7);
	if ((ret = rps_push(t, v, sizeof(v))))
		return it_worker_fail(rank, "push", ret);
	memset(v, 0, sizeof(v));
	if ((ret = rps_pull(t, v, sizeof(v), NULL)))
		return it_worker_fail(rank, "pull", ret);
	for (uint32_t i = 0; i < HOLE_COUNT; i++)
		if (v[i] != (float)(i % 7))
			return it_worker_fail(rank, "pulled values", -EIO);
	rps_tensor_close(t);
	rps_client_close(cl);
	return 0;
}

static void test_worker_dials_at_once(void)
{
	struct held h[HOLES][MAX_HELD];
	int lfd[HOLES], nheld[HOLES] = { 0 }, hellos = 0, gave_up = 0, open_at_last = -1, i, k;
	uint16_t port = 0;
	struct it_workers w;
	double connect_s = -1, end;
	char out[512], err[512];
	struct rps__smap m;

	CU_ASSERT_EQUAL_FATAL(it_cluster_start(&clu, 2, SERVER_ARGS), 0);
	clu_up = true;
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 0, 60000, &m), 0);
	for (i = 0; i < HOLES; i++) {
		lfd[i] = black_hole_any(&port);
		CU_ASSERT_FATAL(lfd[i] >= 0);
		CU_ASSERT_EQUAL_FATAL(it_psctl(&clu, 30000, out, sizeof(out), err, sizeof(err),
					       "add-server %d tcp://%s:%u --no-rebalance", 10 + i, clu.addr, port),
				      0);
	}
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, hole_worker, clu.servers, NULL, -1, NULL), 0);
	/* every hole's worker connection, and whether the others were still
	 * open when the last of them came */
	end = it_now_s() + 60;
	while (it_now_s() < end && gave_up < HOLES) {
		for (i = 0; i < HOLES; i++) {
			struct pollfd p = { .fd = lfd[i], .events = POLLIN };
			int fd;

			if (poll(&p, 1, 2) > 0 && nheld[i] < MAX_HELD &&
			    (fd = accept4(lfd[i], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0)
				h[i][nheld[i]++] = (struct held){ .fd = fd };
			for (k = 0; k < nheld[i]; k++) {
				struct held *x = &h[i][k];
				struct rps__conn_priv priv;
				ssize_t n;

				if (x->fd < 0)
					continue;
				if (x->from_id) {	/* the worker's, held */
					if (closed_by_peer(x->fd)) {
						gave_up++;
						close(x->fd);
						x->fd = -1;
					}
					continue;
				}
				n = recv(x->fd, x->hello + x->got, HELLO_SIZE - x->got, MSG_DONTWAIT);
				if (n == 0 || (n > 0 && (x->got += (uint32_t)n) == HELLO_SIZE)) {
					memcpy(&priv, x->hello + HELLO_DATA, sizeof(priv));
					if (n > 0 && priv.magic == RPS__DESC_MAGIC && priv.role == RPS__ROLE_WORKER) {
						x->from_id = 1;
						if (++hellos == HOLES) {
							/* the last one: how many of the
							 * others are still waiting? */
							open_at_last = 0;
							for (int a = 0; a < HOLES; a++)
								for (int b = 0; b < nheld[a]; b++)
									open_at_last += h[a][b].from_id &&
											h[a][b].fd >= 0 &&
											!closed_by_peer(h[a][b].fd);
						}
						continue;
					}
					/* a server's dial (Raft, to a learner that
					 * never answers), or gone: not ours */
					close(x->fd);
					x->fd = -1;
				}
			}
		}
	}
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &connect_s, sizeof(connect_s)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	fprintf(stderr, "[%d holes: dialed %d, all %d open at once: %s; connect %.2f s with a %d ms timeout] ", HOLES,
		hellos, HOLES, open_at_last == HOLES ? "yes" : "no", connect_s, HOLE_TIMEOUT_MS);
	CU_ASSERT_EQUAL(hellos, HOLES);
	CU_ASSERT_EQUAL(open_at_last, HOLES);
	CU_ASSERT_EQUAL(gave_up, HOLES);
	for (i = 0; i < HOLES; i++) {
		for (k = 0; k < nheld[i]; k++)
			if (h[i][k].fd >= 0)
				close(h[i][k].fd);
		close(lfd[i]);
	}
}

/* ---- a worker's staging budget ------------------------------------------------ */

#define STAGE_SERVERS 4
#define STAGE_COUNT (STAGE_SERVERS * 4 * 16384)	/* 4 shards of 64K per server */

/* A client with opts.staging_bytes = budget (0: the default): the bytes
 * it stages in, once connected to every endpoint, and 10 pushes of +1 and
 * a pull through them, exact.  -errno if the connect failed. */
static long long staged_with(size_t budget, const char *name)
{
	static float g[STAGE_COUNT], v[STAGE_COUNT];
	struct rps_client_opts co;
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	uint64_t used, version = 0;
	int ret, bad = 0;

	rps_client_opts_init(&co);
	co.servers = clu.servers;
	co.staging_bytes = budget;
	if ((ret = rps_client_connect(&co, &cl)))
		return ret;
	used = rps__client_staging_bytes(cl, NULL);
	rps_tensor_opts_init(&o);
	o.count = STAGE_COUNT;
	o.mode = RPS_MODE_ASYNC;
	CU_ASSERT_EQUAL_FATAL(rps_tensor_create(cl, name, &o, &t), 0);
	for (int i = 0; i < STAGE_COUNT; i++)
		g[i] = 1.0f;
	for (int k = 0; k < 10; k++)
		CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), 0);
	CU_ASSERT_EQUAL(rps_pull(t, v, sizeof(v), &version), 0);
	for (int i = 0; i < STAGE_COUNT; i++)
		bad += v[i] != 10.0f;
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, 10);
	rps_tensor_close(t);
	rps_client_close(cl);
	return (long long)used;
}

/* The default budget gives every endpoint all 4 of its server's slots and
 * 4 pull buffers; half of that gives each half (2 and 2, the seed's
 * too: it is sized again once the map names the others); a budget of
 * one byte gives each the floor, one of each.  Every one exact.  A bad
 * RDMAPS_STAGING is refused with one line. */
static void test_staging_budget(void)
{
	long long full, half, floor1;
	rps_client_t *cl;
	struct rps_client_opts co;

	CU_ASSERT_EQUAL_FATAL(it_cluster_start(&clu, STAGE_SERVERS, "--shard-size 64K --slots 4 --replicas 1"), 0);
	clu_up = true;
	full = staged_with(0, "stage-full");
	CU_ASSERT_FATAL(full > 0);
	half = staged_with((size_t)full / 2, "stage-half");
	floor1 = staged_with(1, "stage-floor");
	fprintf(stderr, "[staged: %lld bytes by default, %lld with half of that as the budget, %lld at the floor] ",
		full, half, floor1);
	CU_ASSERT_EQUAL(half * 2, full);
	CU_ASSERT_EQUAL(floor1 * 4, full);

	setenv("RDMAPS_STAGING", "12Q", 1);
	rps_client_opts_init(&co);
	co.servers = clu.servers;
	CU_ASSERT_EQUAL(rps_client_connect(&co, &cl), -EINVAL);
	CU_ASSERT(strstr(rps_last_error(), "RDMAPS_STAGING=12Q") != NULL);
	setenv("RDMAPS_STAGING", "1", 1);	/* the env's budget when opts gives none */
	CU_ASSERT_EQUAL(staged_with(0, "stage-env"), floor1);
	unsetenv("RDMAPS_STAGING");
}

/*
 * Peer connections closed once not needed.  Seven servers: five Raft
 * voters, two learners.  A voter keeps a connection with every member; a
 * learner with the voters and with the members it shares a partition with
 * (cp_peers.c peers_needed).  At R = 2 the two learners share partitions
 * (one backs the other's), so they are connected; psctl set-replicas 1
 * drops every backup, they share nothing, and the one that dialed closes
 * the connection once it has not been needed for a while (30 s; 1 s here,
 * RPS_FAULT=peer-unneeded-ms-1000): every member's count of connections
 * (STATUS, psctl status PEERS) comes down to what its map calls for,
 * computed apart (it_peers_wanted), within a deadline well short of 30 s.
 * Then an eighth member joins (--no-rebalance: it owns nothing): knowing
 * no roles before the log reaches it, it dials everyone, and keeps the
 * voters only.  The data stays exact through it.
 */
#define PEERS_SERVERS 7
#define PEERS_DEADLINE_S 20.0
#define PEERS_COUNT 16384	/* 16 shards of 4 KiB over the 14 partitions */

/* Push +1 n times into t: the pulled value, or -1 on an error. */
static float push_pull(rps_tensor_t *t, int n)
{
	static float g[PEERS_COUNT], v[PEERS_COUNT];
	uint64_t version = 0;

	for (int i = 0; i < PEERS_COUNT; i++)
		g[i] = 1.0f;
	for (int k = 0; k < n; k++)
		if (rps_push(t, g, sizeof(g)))
			return -1.0f;
	if (rps_pull(t, v, sizeof(v), &version))
		return -1.0f;
	for (int i = 1; i < PEERS_COUNT; i++)
		if (v[i] != v[0])
			return -1.0f;
	return v[0];
}


static void test_peers_closed_when_unneeded(void)
{
	struct it_server_opts so = { .extra_args = "--partitions 14 --shard-size 4096 --slots 2 --tick-ms 20 --fsync none",
				     .env = "RPS_FAULT=peer-unneeded-ms-1000" };
	static struct rps__smap m;
	static char out[4096], err[4096];
	uint64_t learners[2] = { 0 };
	struct rps_tensor_opts o;
	struct it_member st;
	rps_client_t *cl;
	rps_tensor_t *t;
	struct it_peers_tally t2, t1;
	uint32_t nl = 0, shared = 0;
	double t0;

	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, PEERS_SERVERS, &so), 0);
	clu_up = true;
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 60000, &m), 0);
	CU_ASSERT_EQUAL_FATAL(it_member_status(&clu, 0, &st, NULL), 0);
	for (uint64_t id = 1; id <= PEERS_SERVERS; id++) {
		bool voter = false;

		for (uint32_t v = 0; v < st.n_voters; v++)
			voter |= st.voters[v] == id;
		if (!voter && nl < 2)
			learners[nl] = id;
		nl += !voter;
	}
	CU_ASSERT_EQUAL_FATAL(st.n_voters, 5);
	CU_ASSERT_EQUAL_FATAL(nl, 2);
	for (uint32_t p = 0; p < m.npart; p++)
		shared += rps__smap_role(&m, p, learners[0]) != RPS__SMAP_ROLE_NONE &&
			  rps__smap_role(&m, p, learners[1]) != RPS__SMAP_ROLE_NONE;
	/* (what the test is about: placement at R = 2 has them share) */
	CU_ASSERT_FATAL(shared > 0);
	CU_ASSERT_EQUAL_FATAL(it_client_connect(clu.servers, 0, 1, 30000, &cl), 0);
	rps_tensor_opts_init(&o);
	o.count = PEERS_COUNT;
	o.mode = RPS_MODE_ASYNC;
	CU_ASSERT_EQUAL_FATAL(rps_tensor_create(cl, "peers", &o, &t), 0);
	CU_ASSERT_EQUAL(push_pull(t, 3), 3.0f);
	CU_ASSERT_EQUAL(it_peers_as_wanted(&clu, PEERS_DEADLINE_S, &t2), 0);
	/* each learner: the 5 voters and the other learner */
	CU_ASSERT_EQUAL(t2.learner_sum, 2 * 6);

	CU_ASSERT_EQUAL_FATAL(it_psctl(&clu, 60000, out, sizeof(out), err, sizeof(err), "set-replicas 1"), 0);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 1, 60000, &m), 0);
	t0 = now_s();
	CU_ASSERT_EQUAL(it_peers_as_wanted(&clu, PEERS_DEADLINE_S, &t1), 0);
	fprintf(stderr, "[learners' peer connections: %u at R = 2, %u at R = 1, %.1f s after the map settled] ",
		t2.learner_sum, t1.learner_sum, now_s() - t0);
	CU_ASSERT_EQUAL(t1.learner_sum, 2 * 5);	/* the voters only */
	CU_ASSERT_EQUAL(push_pull(t, 2), 5.0f);

	/* a member that joins knows nobody's role until the log reaches it:
	 * it dials every member it is given, then keeps the voters only (a
	 * learner that owns nothing, --no-rebalance) */
	so.extra_args = "--partitions 14 --shard-size 4096 --slots 2 --tick-ms 20 --fsync none";
	CU_ASSERT_EQUAL_FATAL(it_server_join(&clu, 8, &so), PEERS_SERVERS);
	CU_ASSERT_EQUAL_FATAL(it_psctl(&clu, 60000, out, sizeof(out), err, sizeof(err),
				       "--timeout 30 add-server 8 %s --no-rebalance", clu.uri[PEERS_SERVERS]), 0);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 1, 60000, &m), 0);
	CU_ASSERT_EQUAL(rps__smap_owned(&m, 8), 0);
	t0 = now_s();
	CU_ASSERT_EQUAL(it_peers_as_wanted(&clu, PEERS_DEADLINE_S, &t1), 0);
	fprintf(stderr, "[with a learner joined: %u, %.1f s after the map settled] ", t1.learner_sum, now_s() - t0);
	CU_ASSERT_EQUAL(t1.learner_sum, 3 * 5);
	CU_ASSERT_EQUAL(push_pull(t, 1), 6.0f);
	rps_tensor_close(t);
	rps_client_close(cl);
}

static void test_setup(void)
{
	watchdog_arm();
}

static void test_teardown(void)
{
	watchdog_disarm();
	if (clu_up) {
		it_cluster_stop(&clu);
		clu_up = false;
	}
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "dials to a peer that accepts and never answers: the dialers serve meanwhile, time out, redial",
		  test_dial_black_hole },
	};
	static const struct cutest worker_tests[] = {
		{ "a worker dials every member at once: holes in the map cost one timeout, not one each",
		  test_worker_dials_at_once },
	};
	static const struct cutest staging_tests[] = {
		{ "a worker's staging: all of it by default, its budget's share past that, one slot and one buffer "
		  "at least; exact", test_staging_budget },
	};
	static const struct cutest peers_tests[] = {
		{ "two learners that stop sharing partitions close their connection; every member holds what "
		  "its map calls for", test_peers_closed_when_unneeded },
	};
	const struct cutest_suite suites[] = {
		{ "non-blocking dials, 3 servers", NULL, NULL, test_setup, test_teardown, tests, CUTEST_COUNT(tests) },
		{ "a worker's dials, 2 servers", NULL, NULL, test_setup, test_teardown, worker_tests,
		  CUTEST_COUNT(worker_tests) },
		{ "a worker's staging budget, 4 servers", NULL, NULL, test_setup, test_teardown, staging_tests,
		  CUTEST_COUNT(staging_tests) },
		{ "peer connections where needed, 7 servers", NULL, NULL, test_setup, test_teardown, peers_tests,
		  CUTEST_COUNT(peers_tests) },
	};

	/* the black hole speaks tcp */
	if (!strcmp(getenv("RPS_IT_TRANSPORT") ? getenv("RPS_IT_TRANSPORT") : "tcp", "verbs") ||
	    getenv("RPS_IT_ATTACH")) {
		fprintf(stderr, "it_dial: tcp, local servers only\n");
		return 77;
	}
	signal(SIGPIPE, SIG_IGN);
	watchdog_init("it_dial", TEST_WATCHDOG_S, it_kill_all);
	return cutest_run(suites, CUTEST_COUNT(suites));
}
