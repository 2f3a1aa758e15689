/*
 * it_witness.c - who may form a cluster with whom (doc/operations.md
 * "Two servers: add a witness").
 *
 * A witness (item 5): two data servers and rdmapsd --witness, the third
 * address of --cluster, R = 2.  The witness proposes that it is one; the
 * map then gives it no partition (its bootstrap ones pass to their
 * backups), and psctl status says it is a witness.  Two async workers,
 * listing only the data servers, push +1 per element; a data server is
 * killed with SIGKILL.  The other data server and the witness are a Raft
 * majority: the dead one's partitions fail over, every worker finishes,
 * every element and the version equal the pushes acknowledged; the
 * witness held no partition, no shard, no tensor and stayed small (RSS).
 * A worker given only the witness's address is refused with one line
 * saying so.
 *
 * Without a witness (item 5 too): two servers, R = 2.  Both say at start
 * that 2 voters cannot fail over and what to add.  One is killed under an
 * async worker whose timeout is 60 s: the survivor has no majority, so
 * nothing fails over; the worker's push fails with -EHOSTDOWN and one line
 * naming the dead member, the cause (no Raft majority) and what to do, in
 * --failover-ms + 2 s (asserted below 20 s: generous on a loaded machine,
 * far below the 60 s the worker would have waited), not -ECONNRESET after
 * its timeout.
 *
 * Members that disagree on --threads (item 8): partition p's replication
 * stream runs between the two members' serving threads p % --threads, so
 * with different counts a thread's stream has nobody to dial.  The peer
 * handshake refuses it: both sides log one line naming who runs how many
 * threads and what to do, and neither hangs (each still answers psctl).
 */
#include "config.h"
#include "cluster.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdmaps.h"
#include "proto/smap.h"
#include "lib/cutest.h"

#define PSCTL_MS 20000

static struct it_cluster clu;
static bool clu_up;
static char out[65536], err[8192];

static void test_setup(void)
{
	it_test_setup();
}

static void test_teardown(void)
{
	it_test_teardown();
}

/* The first line of a file that contains needle (in line, of len), or NULL. */
static const char *file_line(const char *path, const char *needle, char *line, size_t len)
{
	FILE *f = fopen(path, "r");
	const char *found = NULL;

	if (!f)
		return NULL;
	while (!found && fgets(line, (int)len, f))
		if (strstr(line, needle))
			found = line;
	fclose(f);
	return found;
}

/* ---- item 8: --threads differs ------------------------------------------------ */

static void test_threads_mismatch_refused(void)
{
	struct it_server_opts o = { .extra_args = "--partitions 4 --shard-size 4096 --slots 4 --fsync none", .threads = 2 };
	char logs[2][300], line[2][1024], want[2][200];
	double t0;
	int i;

	CU_ASSERT_FATAL(it_cluster_start_opts(&clu, 2, &o) == 0);
	clu_up = true;
	/* start both again from nothing, member 2 with one thread fewer and
	 * each with its log in a file of its own */
	for (i = 0; i < 2; i++)
		it_server_kill(&clu, i);
	for (i = 0; i < 2; i++) {
		char *th = strstr(clu.cmd[i], " --threads 2 ");
		size_t len = strlen(clu.cmd[i]);

		CU_ASSERT_FATAL(th != NULL);
		if (i == 1)
			th[11] = '1';
		snprintf(logs[i], sizeof(logs[i]), "%s/log.%d", clu.dir, i);
		/* (info: the log would say a peer connected) */
		snprintf(clu.cmd[i] + len, sizeof(clu.cmd[i]) - len, " --log-level info 2>%s", logs[i]);
		CU_ASSERT_FATAL(it_server_restart(&clu, i) == 0);
	}
	snprintf(want[0], sizeof(want[0]), "member 2 runs --threads 1, this member (1) --threads 2");
	snprintf(want[1], sizeof(want[1]), "member 1 runs --threads 2, this member (2) --threads 1");
	t0 = it_now_s();
	for (;;) {
		bool both = true;
		for (i = 0; i < 2; i++)
			both &= file_line(logs[i], want[i], line[i], sizeof(line[i])) != NULL;
		if (both || it_now_s() - t0 > 20)
			break;
		it_sleep_ms(100);
	}
	for (i = 0; i < 2; i++) {
		if (!file_line(logs[i], want[i], line[i], sizeof(line[i]))) {
			fprintf(stderr, "server %d did not log \"%s\"\n", i, want[i]);
			CU_FAIL("no --threads line");
			continue;
		}
		CU_ASSERT_PTR_NOT_NULL(strstr(line[i], "start every member with the same --threads"));
	}
	/* refused, not hung: both still serve psctl, and neither connected to the other */
	for (i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL(it_server_alive(&clu, i), 1);
		int st = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s status", clu.uri[i]);
		CU_ASSERT(st >= 0 && st < 128);
		CU_ASSERT_PTR_NULL(file_line(logs[i], "connected to peer", line[i], sizeof(line[i])));
		CU_ASSERT_PTR_NULL(file_line(logs[i], " connected from ", line[i], sizeof(line[i])));
	}
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* ---- item 5: a witness ------------------------------------------------------- */

#define W_ARGS "--partitions 6 --shard-size 4096 --slots 4 --tick-ms 20 --fsync none --failover-ms 1000" \
	" --move-timeout-ms 10000"
#define W_COUNT (2u * 6u * 4096u / 4u)	/* fp32: 12 shards, 2 per partition */
#define W_WORKERS 2
#define W_PUSHES 200
#define SETTLE_MS 60000

struct shared {
	atomic_int acked[W_WORKERS];
	/* the no-witness worker's failure */
	int ret;
	double t_fail;		/* it_now_s() when the push failed */
	char msg[600];
};
static struct shared *sh;

static int async_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const char *name = arg;
	float *g = malloc(W_COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	int n = 0, ret;

	for (size_t i = 0; i < W_COUNT; i++)
		g[i] = -1.0f;
	if ((ret = it_client_connect(servers, rank, nworkers, 30000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = W_COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SGD;
	o.lr = 1.0f;
	if ((ret = rps_tensor_create(cl, name, &o, &t)))
		return it_worker_fail(rank, "create", ret);
	while (n < W_PUSHES) {
		if ((ret = rps_push(t, g, W_COUNT * sizeof(float))))
			return it_worker_fail(rank, "push", ret);
		n++;
		atomic_fetch_add(&sh->acked[rank], 1);
		usleep(500);	/* leave the servers some of the 2 cores */
	}
	it_write_all(out_fd, &n, sizeof(n));
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	return 0;
}

static int acked_total(void)
{
	int k = 0;

	for (int r = 0; r < W_WORKERS; r++)
		k += atomic_load(&sh->acked[r]);
	return k;
}

/* Wait until server i's map says: member `witness` is a witness and
 * holds nothing, and (if `gone`) member `gone` owns nothing either.  0 or
 * -ETIMEDOUT; the map in *m. */
static int wait_map(int i, uint64_t witness, uint64_t gone, struct rps__smap *m)
{
	struct it_member st;
	double t0 = it_now_s();

	while (it_now_s() - t0 < SETTLE_MS / 1000.0) {
		if (!it_member_status(&clu, i, &st, m) && m->npart && rps__smap_is_witness(m, witness) &&
		    !rps__smap_owned(m, witness) && !rps__smap_backed(m, witness) &&
		    (!gone || !rps__smap_owned(m, gone))) {
			bool busy = false;
			for (uint32_t p = 0; p < m->npart; p++)
				busy |= m->parts[p].joining || m->parts[p].moving_to;
			if (!busy)
				return 0;
		}
		it_sleep_ms(50);
	}
	return -ETIMEDOUT;
}

/*
 * 2 data servers + a witness: a worker loses every connection at once, to
 * a remote access error on each (as when moves freed what its keys named
 * on both data servers; RPS_FAULT=efault-all:N, at its N-th shard push),
 * or to a reset (a network blip; reset-all:N), both servers alive.
 * Nobody is left to read the map from but the witness, which takes no
 * worker, and both data servers own partitions: the worker must dial them
 * again itself.  It did not (efault: every push failed after timeout_ms
 * with "remote access error" while it dialed the witness ~50 times a
 * second; reset: it waited its whole timeout_ms for a map, owners being
 * dialed again only once a map shows their partitions not failed over in
 * time, 10 s; it dials one at once now, and the other by that rule).
 * Each worker's timeout_ms is 30 s.
 */
static void every_connection_lost(const char *name, const char *fault)
{
	struct it_server_opts o = { .extra_args = W_ARGS " --replicas 2", .witness_last = 1 };
	static struct rps__smap m0;
	char servers[sizeof(clu.servers)];
	struct it_workers w;
	uint64_t version;
	float *p = malloc(W_COUNT * sizeof(float));
	size_t bad = 0;
	int r, n, total = 0;
	double t0;

	CU_ASSERT_FATAL(p != NULL);
	memset(sh, 0, sizeof(*sh));
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, 3, &o), 0);
	clu_up = true;
	CU_ASSERT_EQUAL_FATAL(wait_map(0, 3, 0, &m0), 0);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m0), 0);
	snprintf(servers, sizeof(servers), "%s,%s", clu.uri[0], clu.uri[1]);
	t0 = it_now_s();
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, W_WORKERS, async_worker, servers, (void *)name, 0, fault), 0);
	for (r = 0; r < W_WORKERS; r++) {
		n = 0;
		CU_ASSERT_EQUAL(it_worker_read(&w, r, &n, sizeof(n)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, r), 0);
		total += n;
	}
	fprintf(stderr, "[%d pushes acknowledged in %.1f s] ", total, it_now_s() - t0);
	CU_ASSERT_EQUAL(total, W_WORKERS * W_PUSHES);
	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.uri[1], name, p, W_COUNT, 30000, &version), 0);
	for (size_t i = 0; i < W_COUNT; i++)
		if (p[i] != (float)total && bad++ < 4)
			fprintf(stderr, "%s[%zu] = %g, %d pushes acknowledged\n", name, i, (double)p[i], total);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, (uint64_t)total);
	free(p);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* worker 0 loses them all at its 12 x 50th shard push */
static void test_every_connection_lost(void)
{
	every_connection_lost("lost-all", "RPS_FAULT=efault-all:600");
}

static void test_every_connection_reset(void)
{
	every_connection_lost("reset-all", "RPS_FAULT=reset-all:600");
}

static void test_witness_failover(void)
{
	struct it_server_opts o = { .extra_args = W_ARGS " --replicas 2", .witness_last = 1 };
	static struct rps__smap m0, m1;
	char servers[sizeof(clu.servers)];
	struct it_workers w;
	uint64_t version;
	float *p;
	size_t bad = 0;
	long rss;
	int r, n, total = 0, at_kill;

	memset(sh, 0, sizeof(*sh));
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, 3, &o), 0);
	clu_up = true;
	/* member 3 is the witness: it holds nothing, every partition has
	 * its backup on the other data server */
	CU_ASSERT_EQUAL_FATAL(wait_map(0, 3, 0, &m0), 0);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m0), 0);
	CU_ASSERT_TRUE(rps__smap_is_witness(&m0, 3));
	CU_ASSERT_FALSE(rps__smap_is_witness(&m0, 1) || rps__smap_is_witness(&m0, 2));
	for (uint32_t q = 0; q < m0.npart; q++) {
		CU_ASSERT(m0.parts[q].owner == 1 || m0.parts[q].owner == 2);
		CU_ASSERT_EQUAL(rps__smap_nbackups(&m0, q), 1);
		CU_ASSERT_EQUAL(m0.parts[q].backups[0], 3 - m0.parts[q].owner);
	}
	CU_ASSERT(rps__smap_owned(&m0, 1) > 0);
	CU_ASSERT_EQUAL(it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "status"), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "witness: votes, holds no data"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "witness (votes, holds no partitions)"));

	/* a worker given the witness alone is told what it is */
	{
		rps_client_t *cl = NULL;
		int ret = it_client_connect(clu.uri[2], 0, 1, 10000, &cl);
		CU_ASSERT_EQUAL(ret, -ECONNREFUSED);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps_last_error(), "a witness holds no data"));
		if (!ret)
			rps_client_close(cl);
	}

	/* workers list the data servers only */
	snprintf(servers, sizeof(servers), "%s,%s", clu.uri[0], clu.uri[1]);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, W_WORKERS, async_worker, servers, (void *)"w", -1, NULL), 0);
	while (acked_total() < W_WORKERS * W_PUSHES / 3)
		it_sleep_ms(2);
	at_kill = acked_total();
	it_server_kill(&clu, 0);	/* member 1, a primary */
	for (r = 0; r < W_WORKERS; r++) {
		n = 0;
		CU_ASSERT_EQUAL(it_worker_read(&w, r, &n, sizeof(n)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, r), 0);
		total += n;
	}
	fprintf(stderr, "[member 1 killed after %d pushes; %d acknowledged] ", at_kill, total);
	CU_ASSERT_EQUAL(total, W_WORKERS * W_PUSHES);
	CU_ASSERT_EQUAL(acked_total(), total);
	/* member 2 and the witness failed member 1 over: 2 owns everything */
	CU_ASSERT_EQUAL(wait_map(1, 3, 1, &m1), 0);
	CU_ASSERT_EQUAL(rps__smap_owned(&m1, 2), m1.npart);
	p = malloc(W_COUNT * sizeof(float));
	CU_ASSERT_FATAL(p != NULL);
	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.uri[1], "w", p, W_COUNT, 30000, &version), 0);
	for (size_t i = 0; i < W_COUNT; i++)
		if (p[i] != (float)total && bad++ < 4)
			fprintf(stderr, "w[%zu] = %g, %d pushes acknowledged\n", i, (double)p[i], total);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, (uint64_t)total);
	free(p);
	/* the witness served nothing and stayed small */
	CU_ASSERT_EQUAL(it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "-s %s --json status",
				 clu.uri[1]), 0);
	{
		const char *me = strstr(out, "{\"id\":3,");
		CU_ASSERT_PTR_NOT_NULL_FATAL(me);
		CU_ASSERT_PTR_NOT_NULL(strstr(me, "\"shards\":0,\"shard_bytes\":0,\"tensors\":0,\"partitions\":0,"
						  "\"witness\":true}"));
	}
	rss = it_proc_kib(clu.pid[2], "VmRSS");
	fprintf(stderr, "[witness RSS %ld KiB, member 2's %ld KiB] ", rss, it_proc_kib(clu.pid[1], "VmRSS"));
	CU_ASSERT(rss > 0 && rss < 32 * 1024);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* Push until a push fails; say how and when in sh. */
static int doomed_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float *g = malloc(W_COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	int ret;

	(void)arg;
	for (size_t i = 0; i < W_COUNT; i++)
		g[i] = -1.0f;
	if ((ret = it_client_connect(servers, rank, nworkers, 60000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = W_COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SGD;
	o.lr = 1.0f;
	if ((ret = rps_tensor_create(cl, "nw", &o, &t)))
		return it_worker_fail(rank, "create", ret);
	while (!(ret = rps_push(t, g, W_COUNT * sizeof(float)))) {
		atomic_fetch_add(&sh->acked[rank], 1);
		usleep(500);
	}
	sh->t_fail = it_now_s();
	sh->ret = ret;
	snprintf(sh->msg, sizeof(sh->msg), "%s", rps_last_error());
	it_write_all(out_fd, &ret, sizeof(ret));
	_exit(0);	/* (the client's close would wait on the dead server) */
}

/* ... and while the cluster comes up (one server alone for 1.5 s), none
 * says it has no majority: the other is not up yet, not unreachable. */
static void test_two_voters_told(void)
{
	struct it_server_opts o = { .extra_args = W_ARGS };
	char logs[2][300], line[1024];
	struct it_workers w;
	double t_kill;
	int i, ret = 0;

	memset(sh, 0, sizeof(*sh));
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, 2, &o), 0);
	clu_up = true;
	/* again from nothing, each logging to a file of its own */
	for (i = 0; i < 2; i++)
		it_server_kill(&clu, i);
	for (i = 0; i < 2; i++) {
		size_t len = strlen(clu.cmd[i]);

		snprintf(logs[i], sizeof(logs[i]), "%s/log.%d", clu.dir, i);
		snprintf(clu.cmd[i] + len, sizeof(clu.cmd[i]) - len, " 2>%s", logs[i]);
		CU_ASSERT_FATAL(it_server_restart(&clu, i) == 0);
		if (i == 0)	/* the other comes up later than the note's lease_ms */
			it_sleep_ms(1500);
	}
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, NULL), 0);
	/* a member not up yet is not "unreachable": nobody was told to restart it */
	for (i = 0; i < 2; i++)
		CU_ASSERT_PTR_NULL(file_line(logs[i], "no Raft majority", line, sizeof(line)));
	for (i = 0; i < 2; i++) {
		const char *l = file_line(logs[i], "this cluster has 2 Raft voters", line, sizeof(line));
		CU_ASSERT_PTR_NOT_NULL(l);
		if (l) {
			CU_ASSERT_PTR_NOT_NULL(strstr(l, "nothing fails over"));
			CU_ASSERT_PTR_NOT_NULL(strstr(l, "rdmapsd --witness"));
		}
	}
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, doomed_worker, clu.servers, NULL, -1, NULL), 0);
	while (acked_total() < 50)
		it_sleep_ms(2);
	t_kill = it_now_s();
	it_server_kill(&clu, 1);	/* member 2 */
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &ret, sizeof(ret)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	fprintf(stderr, "[push failed %.2f s after the kill: %d: %s] ", sh->t_fail - t_kill, sh->ret, sh->msg);
	CU_ASSERT_EQUAL(sh->ret, -EHOSTDOWN);
	CU_ASSERT(sh->t_fail - t_kill < 20.0);
	CU_ASSERT_PTR_NOT_NULL(strstr(sh->msg, "member 2 ("));
	CU_ASSERT_PTR_NOT_NULL(strstr(sh->msg, "cannot be failed over"));
	CU_ASSERT_PTR_NOT_NULL(strstr(sh->msg, "reaches 1 of 2 Raft voters, no majority"));
	CU_ASSERT_PTR_NOT_NULL(strstr(sh->msg, "add a witness (rdmapsd --witness)"));
	CU_ASSERT_PTR_NULL(strchr(sh->msg, '\n'));
	/* the survivor said it once, too */
	if (!file_line(logs[0], "no Raft majority: member 2 is unreachable", line, sizeof(line))) {
		char cmd[400];
		snprintf(cmd, sizeof(cmd), "grep -v flushed %s | tail -20 >&2", logs[0]);
		CU_FAIL("the survivor did not say it has no majority");
		CU_ASSERT(system(cmd) >= 0);
	}
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "--threads differs between members: refused at the handshake, said on both sides", test_threads_mismatch_refused },
		{ "2 data servers + a witness, R = 2: a data server killed, failed over, exact; the witness held nothing", test_witness_failover },
		{ "2 servers, no witness: warned at start; a worker blocked by a dead one is told why, in time", test_two_voters_told },
		{ "2 data servers + a witness: a worker that loses every connection at once dials them again, exact",
		  test_every_connection_lost },
		{ "... every connection reset, both servers alive: dialed again, not left waiting for a map, exact",
		  test_every_connection_reset },
	};
	int ret;

	if ((ret = it_prog_init("it_witness", 300, &clu, &clu_up)))
		return ret;
	if (!(sh = it_shared_map("it_witness", sizeof(*sh))))
		return 1;
	if (access(it_psctl_path(), X_OK) != 0) {
		fprintf(stderr, "it_witness: no psctl at %s (set PSCTL)\n", it_psctl_path());
		return 1;
	}
	return cutest_run1("cluster membership", NULL, NULL, test_setup, test_teardown, tests, CUTEST_COUNT(tests));
}
