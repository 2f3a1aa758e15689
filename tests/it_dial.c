/*
 * it_dial.c - a server's dial to a peer that answers nothing does not stop
 * its loop.  Three rdmapsd processes (members 1..3); member 1 is killed and
 * its address taken by a "black hole" of the test's: a listening socket
 * whose connections are accepted (so the connector's TCP handshake
 * completes, as it does with a SIGSTOPped server's backlog) but never
 * answered, like a member whose host is gone without a reset.  Members 2
 * and 3 dial member 1 (the higher id dials) and each dial waits in the
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
 */
#include "config.h"
#include "cluster.h"

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
			/* at R = 2 (the default) a primary also dials its backup
			 * member 1 to replicate: not the dial under test */
			if (priv.role == RPS__ROLE_REPL || priv.role == RPS__ROLE_REPL_REV) {
				close(h[i].fd);
				h[i--] = h[--nheld];
				continue;
			}
			CU_ASSERT_EQUAL(priv.role, RPS__ROLE_PEER);
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
	const struct cutest_suite suites[] = {
		{ "non-blocking dials, 3 servers", NULL, NULL, test_setup, test_teardown, tests, CUTEST_COUNT(tests) },
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
