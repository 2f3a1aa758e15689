/*
 * it_replica.c - multi-process integration tests of replicated partitions
 * (doc/operations.md "Server death, with replicas"): three rdmapsd processes whose map gives every partition one
 * backup (RPS_FAULT=bootstrap-replicas-2: partition p is owned by member
 * p%3+1 and backed by (p+1)%3+1), workers in forked processes pushing to
 * them over TCP on loopback, and a server killed with SIGKILL while pushes
 * are in flight.
 *
 * Every worker pulls after each push, and one more worker only pulls
 * (its reads of the dead server fail before the failover is committed,
 * so it must ride through: see rdmaps(3), ECONNRESET).  Every push adds exactly 1 to every element (SGD, lr 1, gradient -1: exact
 * in fp32 up to 2^24), so after the run every element and every shard's
 * version must equal the number of pushes acknowledged to the workers: an
 * acknowledged push lost, or one applied twice (a resend the new primary
 * did not recognise), shows as a difference.  Every worker must finish
 * without an error: its operations on the dead server's partitions wait
 * for the failover and are resent to the new primary.
 *  - async: exact sums and versions;
 *  - bounded (staleness 2): the same, and no pull ever misses an update
 *    older than clock - staleness, through the failover.
 * After each, once the map settles, every backup's digest (crc32c of the
 * shards' versions, parameters, state, clocks and applied push ids; their
 * versions; the shard count) equals its primary's.
 * A client that connects during a failover (a server killed, its
 * partitions not failed over yet) connects to the others and its pull
 * waits for the failover: exact values, not a refusal.
 * Every run also measures kill-to-first-ack: the first push started after
 * the kill and acknowledged (the new primary took it), asserted < 20 s.
 * With $RPS_IT_ATTACH (cluster.h) the servers are already running, one per
 * VM, and the kill takes a whole VM down: `make check-rxe-cluster`
 * (tests/rxe/cluster-failover.sh) runs the async test so.
 */
#include "config.h"
#include "cluster.h"
#include "proto/smap.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"

#define NSERVERS 3
#define NWORKERS 3
#define NPART 8
#define COUNT 16384u		/* fp32: 16 shards of 4 KiB, 2 per partition */
#define PUSHES 300		/* per worker */
#define KILL_AFTER 150		/* pushes acknowledged in all before the kill */
#define FAILOVER_MS 300
#define SERVER_ARGS "--partitions 8 --shard-size 4096 --slots 4 --tick-ms 20 --fsync none --failover-ms 300"
/* restarted at once: back before the leader could declare it failed */
#define RESTART_ARGS "--partitions 8 --shard-size 4096 --slots 4 --tick-ms 20 --fsync none --failover-ms 4000"
#define TEST_WATCHDOG_S 240	/* a hang guard, as it_cluster's: over Soft-RoCE on a busy host
				 * a kill test ran 54 s after its kill, progressing, past 90 */

static struct it_cluster clu;
static bool clu_up;

/* What the workers tell the parent while they run. */
struct shared {
	atomic_int acked[IT_MAX_WORKERS];	/* pushes acknowledged so far */
	atomic_int killed;			/* the parent killed the server */
	atomic_int stop;			/* the reader stops */
	atomic_int gate;			/* the last rank may push its gate_step */
	atomic_int at_gate[IT_MAX_WORKERS];	/* the other ranks' gate_step pushes: taken */
	atomic_llong kill_ns;			/* when the victim was dead (monotonic ns) */
	atomic_llong first_ack_ns;		/* the first push started after it, acknowledged */
};
static struct shared *sh;

struct job {
	const char *name;
	enum rps_mode mode;
	int gate_step;		/* sync: the last rank holds this step until the kill */
	int pushes;		/* per worker (0: PUSHES; OPEN_ENDED: until sh->stop) */
};
#define OPEN_ENDED (-1)

static int job_pushes(const struct job *j)
{
	return j->pushes ? j->pushes : PUSHES;
}

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* What a worker reports: pushes acknowledged, pulls that saw too little
 * (bounded), the longest push (s), the first push (s: connecting, the
 * lease, the replication stream's dial). */
struct report {
	int acked;
	int bad;
	double longest;
	double first;
};

static int push_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct job *j = arg;
	float *g = malloc(COUNT * sizeof(float)), *p = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	struct report rep = { 0 };
	rps_client_t *cl;
	rps_tensor_t *t;
	uint64_t version;
	int s, ret;
	unsigned i;

	for (i = 0; i < COUNT; i++)
		g[i] = -1.0f;
	if ((ret = it_client_connect(servers, rank, nworkers, 30000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = j->mode;
	o.staleness = 2;
	o.optimizer = RPS_OPT_SGD;
	o.lr = 1.0f;
	if ((ret = rps_tensor_create(cl, j->name, &o, &t)))
		return it_worker_fail(rank, "create", ret);
	if ((ret = rps_barrier(cl)))
		return it_worker_fail(rank, "barrier", ret);
	for (s = 0; j->pushes == OPEN_ENDED ? !atomic_load(&sh->stop) : s < job_pushes(j); s++) {
		double t0, took;
		long long start_ns, killed_ns, ack_ns, first;

		while (j->gate_step && s == j->gate_step && rank == nworkers - 1 && !atomic_load(&sh->gate))
			usleep(1000);
		killed_ns = atomic_load(&sh->kill_ns);
		start_ns = now_ns();
		t0 = it_now_s();
		if (j->gate_step && s == j->gate_step && rank < nworkers - 1) {
			/* at the gate once taken on every primary, the step
			 * waiting there for the last rank */
			rps_request_t *req;

			ret = it_push_taken(t, g, COUNT * sizeof(float), 120000, &req);
			if (!ret) {
				atomic_store(&sh->at_gate[rank], 1);
				ret = rps_wait(req);
			}
		} else {
			ret = rps_push(t, g, COUNT * sizeof(float));
		}
		if (ret)
			return it_worker_fail(rank, "push", ret);
		took = it_now_s() - t0;
		/* started once the victim was dead: every partition, the
		 * victim's too, acknowledged it, so its new primary did */
		ack_ns = now_ns();
		first = atomic_load(&sh->first_ack_ns);
		while (killed_ns && start_ns > killed_ns && (!first || ack_ns < first) &&
		       !atomic_compare_exchange_weak(&sh->first_ack_ns, &first, ack_ns))
			;
		if (!s)
			rep.first = took;
		else if (took > rep.longest)
			rep.longest = took;
		rep.acked++;
		atomic_fetch_add(&sh->acked[rank], 1);
		/* a pull too: its reads of the dead server's shards fail with
		 * the connection and must ride through the failover */
		if ((ret = rps_pull(t, p, COUNT * sizeof(float), &version)))
			return it_worker_fail(rank, "pull", ret);
		for (i = 0; i < COUNT; i++) {
			/* whole numbers, my pushes so far at least; bounded:
			 * and everyone's up to s - staleness */
			rep.bad += p[i] < (float)(s + 1) || p[i] != (float)(int)p[i];
			if (j->mode == RPS_MODE_BOUNDED)
				rep.bad += p[i] < (float)((s + 1 - 2) * nworkers);
		}
		usleep(300);	/* leave the servers some of the 2 cores */
	}
	it_write_all(out_fd, &rep, sizeof(rep));
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	free(p);
	return 0;
}

/* What the reader reports: pulls done, pulls done after the kill, bad
 * values or versions seen, the longest pull (s). */
struct reader_report {
	int pulls, after_kill, bad;
	double longest;
};

/* A worker that only pulls, as fast as it can, until told to stop: its
 * reads of the dead server's shards fail with the connection before the
 * failover is committed (nothing else it does waits for the failover), so
 * it must ride through it.  Every value is a whole number and no version
 * goes back. */
static int reader_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct job *j = arg;
	float *p = malloc(COUNT * sizeof(float));
	struct reader_report rep = { 0 };
	uint64_t version, last = 0;
	rps_client_t *cl;
	rps_tensor_t *t = NULL;
	int ret;
	unsigned i;

	(void)nworkers;
	if ((ret = it_client_connect(servers, 0, 1, 30000, &cl)))
		return it_worker_fail(rank, "reader connect", ret);
	while ((ret = rps_tensor_open(cl, j->name, &t)) == -ENOENT)
		usleep(10000);
	if (ret)
		return it_worker_fail(rank, "reader open", ret);
	while (!atomic_load(&sh->stop)) {
		int killed = atomic_load(&sh->killed);
		double t0 = it_now_s();
		if ((ret = rps_pull(t, p, COUNT * sizeof(float), &version)))
			return it_worker_fail(rank, "reader pull", ret);
		if (it_now_s() - t0 > rep.longest)
			rep.longest = it_now_s() - t0;
		rep.pulls++;
		rep.after_kill += killed;
		rep.bad += version < last;
		last = version;
		for (i = 0; i < COUNT; i++)
			rep.bad += p[i] != (float)(int)p[i];
	}
	it_write_all(out_fd, &rep, sizeof(rep));
	rps_tensor_close(t);
	rps_client_close(cl);
	free(p);
	return 0;
}

/* Attached to servers started elsewhere (one per VM: tests/rxe/cluster-failover.sh):
 * wait until a leader is elected and every member reachable. */
static int wait_attached(void)
{
	char out[65536] = "";
	double until = it_now_s() + 300;

	while (it_now_s() < until) {
		const char *p = out;
		int reachable = 0;

		if (it_psctl(&clu, 10000, out, sizeof(out), NULL, 0, "--json status") == 0 &&
		    !strstr(out, "\"leader\":0,")) {
			while ((p = strstr(p, "\"reachable\":true")))
				reachable++, p++;
			if (reachable == NSERVERS)
				return 0;
		}
		it_sleep_ms(200);
	}
	fprintf(stderr, "it_replica: the attached servers not all up after 300 s: %s\n", out);
	return -ETIMEDOUT;
}

/* Attached: which member to kill.  Never member 1 (its VM runs the
 * workers); by default not the Raft leader either ($RPS_IT_VICTIM=leader:
 * the leader; if that is member 1, it hands the leadership to member
 * dflt + 1 first).  A server index, or dflt. */
static int attached_victim(int dflt)
{
	const char *want = getenv("RPS_IT_VICTIM");
	char out[65536] = "", *p;
	int leader;

	if (it_psctl(&clu, 10000, out, sizeof(out), NULL, 0, "--json status") != 0 ||
	    !(p = strstr(out, "\"leader\":")))
		return dflt;
	leader = atoi(p + 9);
	if (want && !strcmp(want, "leader")) {
		double until = it_now_s() + 60;

		if (leader > 1)
			return leader - 1;
		/* member 1's VM runs the workers: hand the leadership to
		 * member dflt + 1 first, and kill that leader */
		if (it_psctl(&clu, 30000, out, sizeof(out), NULL, 0, "--json --timeout 20 transfer-leader %d", dflt + 1))
			fprintf(stderr, "[psctl transfer-leader %d failed] ", dflt + 1);
		while (it_now_s() < until) {
			if (it_psctl(&clu, 10000, out, sizeof(out), NULL, 0, "--json status") == 0 &&
			    (p = strstr(out, "\"leader\":")) && atoi(p + 9) == dflt + 1) {
				fprintf(stderr, "[the leader was member 1, whose VM runs the workers: "
					"leadership handed to member %d] ", dflt + 1);
				return dflt;
			}
			it_sleep_ms(200);
		}
		fprintf(stderr, "[the leader is member 1, whose VM runs the workers: member %d killed instead] ", dflt + 1);
		return dflt;
	}
	if (want && (!strcmp(want, "2") || !strcmp(want, "3")))
		return atoi(want) - 1;	/* that member, leader or not */
	return leader == 2 ? 2 : 1;	/* members 2 and 3: indexes 1 and 2 */
}

static int acked_total(void)
{
	int r, n = 0;

	for (r = 0; r < NWORKERS; r++)
		n += atomic_load(&sh->acked[r]);
	return n;
}

/* Read every push worker's report and reap it: each finished all its
 * pushes without a bad pull.  The pushes acknowledged in all. */
static int collect_reports_of(struct it_workers *w, struct report rep[NWORKERS], int pushes)
{
	int r, acked = 0;

	for (r = 0; r < NWORKERS; r++) {
		memset(&rep[r], 0, sizeof(rep[r]));
		CU_ASSERT_EQUAL(it_worker_read(w, r, &rep[r], sizeof(rep[r])), 0);
		CU_ASSERT_EQUAL(it_worker_wait(w, r), 0);
		if (pushes == OPEN_ENDED) {
			CU_ASSERT(rep[r].acked > 0);
		} else {
			CU_ASSERT_EQUAL(rep[r].acked, pushes);
		}
		CU_ASSERT_EQUAL(rep[r].bad, 0);
		acked += rep[r].acked;
	}
	return acked;
}

static int collect_reports(struct it_workers *w, struct report rep[NWORKERS])
{
	return collect_reports_of(w, rep, PUSHES);
}

/*
 * Start 3 servers with one backup per partition, NWORKERS workers pushing
 * PUSHES times each; once KILL_AFTER pushes are acknowledged, SIGKILL
 * member `victim + 1` (the primary of partitions victim, victim+3, ...).
 * Every worker finishes without an error; then every element == the number
 * of acknowledged pushes == the version a pull reports (every shard's
 * version is that number: the pull's version is the lowest of them).
 */
static void failover_run(const struct job *j, int victim, bool restart)
{
	struct it_server_opts so = { .extra_args = restart ? RESTART_ARGS : SERVER_ARGS,
				     .env = "RPS_FAULT=bootstrap-replicas-2", .data_dir = 1 };
	char out[65536], err[4096];
	struct it_workers w, rw;
	struct reader_report rr = { 0 };
	struct report rep[NWORKERS];
	double t_kill, first = 0, longest = 0;
	uint64_t version = 0;
	int r, acked = 0, bad = 0, at_kill;
	float *p = malloc(COUNT * sizeof(float));
	unsigned i;

	memset(sh, 0, sizeof(*sh));
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, NSERVERS, &so), 0);
	clu_up = true;
	if (clu.attached) {
		CU_ASSERT_EQUAL_FATAL(wait_attached(), 0);
		victim = attached_victim(victim);
	}
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, NWORKERS, push_worker, clu.servers, (void *)j, -1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&rw, 1, reader_worker, clu.servers, (void *)j, -1, NULL), 0);
	while (acked_total() < (j->gate_step ? NWORKERS * j->gate_step : KILL_AFTER))
		it_sleep_ms(2);
	/* sync: the other ranks' pushes of the gate step taken, waiting for the last one */
	for (r = 0; j->gate_step && r < NWORKERS - 1; r++)
		while (!atomic_load(&sh->at_gate[r]))
			it_sleep_ms(2);
	at_kill = acked_total();
	it_server_kill(&clu, victim);
	t_kill = it_now_s();
	atomic_store(&sh->kill_ns, now_ns());
	atomic_store(&sh->killed, 1);
	if (restart)	/* same --data-dir: the map comes back, the shards do not */
		CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, victim), 0);
	atomic_store(&sh->gate, 1);
	acked = collect_reports(&w, rep);
	for (r = 0; r < NWORKERS; r++) {
		first = rep[r].first > first ? rep[r].first : first;
		longest = rep[r].longest > longest ? rep[r].longest : longest;
	}
	fprintf(stderr, "[%d pushes acknowledged; member %d killed after %d; workers done %.2f s after the kill; "
		"first push acknowledged by the new primary %.2f s after the kill; "
		"longest push %.3f s; first push %.3f s] ", acked, victim + 1, at_kill, it_now_s() - t_kill,
		(double)(atomic_load(&sh->first_ack_ns) - atomic_load(&sh->kill_ns)) * 1e-9, longest, first);
	/* the failover (--failover-ms 300 here, 1000 in the VM cluster) and,
	 * a whole host killed, the transport's ~2 s to notice it: far less
	 * than a client's 30 s timeout, which a stalled op would wait out */
	CU_ASSERT(atomic_load(&sh->first_ack_ns) > atomic_load(&sh->kill_ns));
	CU_ASSERT(atomic_load(&sh->first_ack_ns) - atomic_load(&sh->kill_ns) < 20000000000LL);
	CU_ASSERT_EQUAL(acked_total(), acked);
	atomic_store(&sh->stop, 1);
	CU_ASSERT_EQUAL(it_worker_read(&rw, 0, &rr, sizeof(rr)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&rw, 0), 0);
	CU_ASSERT(rr.after_kill > 0);
	CU_ASSERT_EQUAL(rr.bad, 0);
	fprintf(stderr, "[reader: %d pulls, %d after the kill, longest %.3f s] ", rr.pulls, rr.after_kill, rr.longest);

	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, j->name, p, COUNT, 20000, &version), 0);
	bad = 0;
	for (i = 0; i < COUNT; i++)
		if (p[i] != (float)acked) {
			if (bad < 4)
				fprintf(stderr, "%s[%u] (shard %u) = %g, expected %d\n", j->name, i, i / 1024, (double)p[i],
					acked);
			bad++;
		}
	CU_ASSERT_EQUAL(bad, 0);
	/* sync: one version per step of NWORKERS pushes */
	CU_ASSERT_EQUAL(version, j->mode == RPS_MODE_SYNC ? (uint64_t)acked / NWORKERS : (uint64_t)acked);
	free(p);
	if (restart) {
		/* it failed its partitions over and left the sets it backed
		 * (nothing empty promoted); the leader seeds it again: two
		 * copies of every partition, some of them on it */
		double until = it_now_s() + 30;
		char want[64];
		bool done = false;

		/* (a backup, or already a primary again: with --rebalance
		 * auto the leader may have switched a partition it backs to
		 * it by the time psctl looks; a psctl round over verbs in
		 * the VM took long enough to miss the backup) */
		char owner[64];

		snprintf(want, sizeof(want), "\"backups\":[%d]", victim + 1);
		snprintf(owner, sizeof(owner), "\"owner\":%d,", victim + 1);
		while (!done && it_now_s() < until) {
			done = it_psctl(&clu, 10000, out, sizeof(out), err, sizeof(err), "--json status") == 0 &&
			       strstr(out, "\"under_replicated\":0,") && (strstr(out, want) || strstr(out, owner));
			if (!done)
				it_sleep_ms(100);
		}
		if (!done)
			fprintf(stderr, "psctl status: %s%s\n", out, err);
		CU_ASSERT(done);
	}
	/* every backup holds what its primary holds, once the map settles
	 * (the dead member's places re-seeded on the others) */
	{
		static struct rps__smap m;
		uint64_t versions = 0;

		CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 60000, &m), 0);
		CU_ASSERT_EQUAL(it_replicas_differ(&clu, &m, j->name, &versions), 0);
		CU_ASSERT_EQUAL(versions, (COUNT / 1024u) * (j->mode == RPS_MODE_SYNC ? (uint64_t)acked / NWORKERS :
										 (uint64_t)acked));
	}
	/* the dead server (or, restarted, all three) stop cleanly */
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/*
 * A replication stream broken with every server alive: each server, as a
 * backup, breaks the stream it applies entries from once, after BREAK_AT
 * entries (RPS_FAULT=repl-break-at-N), as a network fault would.  The
 * entries it had not confirmed are gone with the stream, so its primary
 * has the map drop it (REPLICA_DROP: the partition's epoch moves on), or
 * every update waiting for it, and every worker, would wait for ever; the
 * leader seeds a backup again.  Every push completes, exact; once the map
 * settles every partition has its two copies again, identical.
 */
#define BREAK_AT 150
static void stream_broken_run(const struct job *j)
{
	char env[128];
	struct it_server_opts so = { .extra_args = SERVER_ARGS, .env = env };
	static struct rps__smap m;
	struct it_workers w;
	struct report rep[NWORKERS];
	float *p = malloc(COUNT * sizeof(float));
	uint64_t version = 0, versions = 0;
	int acked = 0, bad = 0, moved = 0;
	unsigned i;

	snprintf(env, sizeof(env), "RPS_FAULT=bootstrap-replicas-2,repl-break-at-%d", BREAK_AT);
	memset(sh, 0, sizeof(*sh));
	atomic_store(&sh->gate, 1);
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, NSERVERS, &so), 0);
	clu_up = true;
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, NWORKERS, push_worker, clu.servers, (void *)j, -1, NULL), 0);
	acked = collect_reports(&w, rep);
	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, j->name, p, COUNT, 20000, &version), 0);
	for (i = 0; i < COUNT; i++)
		if (p[i] != (float)acked) {
			if (bad < 4)
				fprintf(stderr, "%s[%u] = %g, expected %d\n", j->name, i, (double)p[i], acked);
			bad++;
		}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, j->mode == RPS_MODE_SYNC ? (uint64_t)acked / NWORKERS : (uint64_t)acked);
	free(p);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 60000, &m), 0);
	for (i = 0; i < m.npart; i++)
		moved += m.parts[i].epoch > 1;	/* a backup dropped there (and seeded again) */
	fprintf(stderr, "[%d pushes acknowledged; %d of %u partitions dropped a backup and seeded one again] ", acked,
		moved, m.npart);
	CU_ASSERT(moved > 0);
	CU_ASSERT_EQUAL(it_replicas_differ(&clu, &m, j->name, &versions), 0);
	CU_ASSERT_EQUAL(versions, (COUNT / 1024u) * (j->mode == RPS_MODE_SYNC ? (uint64_t)acked / NWORKERS :
									 (uint64_t)acked));
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

static void test_async_stream_broken(void)
{
	static const struct job j = { .name = "async-broken", .mode = RPS_MODE_ASYNC };

	stream_broken_run(&j);
}

static void test_sync_stream_broken(void)
{
	static const struct job j = { .name = "sync-broken", .mode = RPS_MODE_SYNC };

	stream_broken_run(&j);
}

static void test_async_primary_killed(void)
{
	static const struct job j = { .name = "async-failover", .mode = RPS_MODE_ASYNC };

	failover_run(&j, 1, false);
}

static void test_bounded_primary_killed(void)
{
	static const struct job j = { .name = "bounded-failover", .mode = RPS_MODE_BOUNDED };

	failover_run(&j, 2, false);
}

/* Sync (two-stage acknowledgement: a push completes once its step is on
 * every replica): the primary killed mid-step, with two ranks' pushes of
 * step 50 taken there and the third rank's held back until after the kill;
 * the taken contributions are resent to the new primary, which counts each
 * once, and every step completes: 300 steps of 3 pushes, every element
 * 900.  (A push completed when merely taken would be lost with the primary:
 * its step could never complete.) */
static void test_sync_primary_killed(void)
{
	static const struct job j = { .name = "sync-failover", .mode = RPS_MODE_SYNC, .gate_step = 50 };

	failover_run(&j, 0, false);
}

/* The primary restarted at once (same --data-dir) before anyone declared
 * it failed: it comes back without its shards, fails its partitions over
 * to their backups itself, leaves the sets it backed, and is seeded again;
 * nothing acknowledged is lost or doubled. */
static void test_async_primary_restarted(void)
{
	static const struct job j = { .name = "async-restarted", .mode = RPS_MODE_ASYNC };

	failover_run(&j, 1, true);
}

/*
 * Rebalancing: a member restarted at once (same --data-dir) comes back
 * empty, fails its partitions over to their backups and owns none; the
 * leader seeds backups on it again.  The workers push throughout, so each
 * holds the connection it lost to that member.
 *  - --rebalance off: it stays so until psctl rebalance moves primaries to
 *    it (planned switches: it backs them);
 *  - --rebalance auto (the default): the leader does so itself once its
 *    partitions failed over and the seeding is done.
 * Either way every member ends with its share (8 partitions over 3
 * members: 3, 3 and 2): a worker's push to a partition given back to it
 * must reach it again, not fail on the dead connection.  Every push
 * acknowledged, exact, the versions right, the replicas identical, and
 * psctl rebalance then finds nothing to do.
 */
#define REBALANCE_OFF_ARGS RESTART_ARGS " --rebalance off"

/* Every partition member 2 owned in `before` has failed over since (its
 * epoch moved on). */
static bool failed_over(const struct rps__smap *now, const struct rps__smap *before)
{
	for (uint32_t p = 0; p < before->npart; p++)
		if (before->parts[p].owner == 2 && now->parts[p].epoch <= before->parts[p].epoch)
			return false;
	return true;
}

/* Every member owns its share of the primaries, NPART / NSERVERS or one
 * more: what balancing (automatic or psctl rebalance) ends with. */
static bool balanced(const struct rps__smap *m)
{
	for (uint64_t id = 1; id <= NSERVERS; id++) {
		uint32_t n = rps__smap_owned(m, id);

		if (n != NPART / NSERVERS && n != NPART / NSERVERS + 1)
			return false;
	}
	return true;
}

/* Member 2 restarted empty: its partitions failed over, backups seeded on
 * it again, it owns none (--rebalance off).  *m: that map. */
static void wait_restarted_empty(struct rps__smap *m)
{
	for (double until = it_now_s() + 60; it_now_s() < until; it_sleep_ms(100))
		if (it_wait_settled(&clu, 2, 20000, m) == 0 && m->nmembers == NSERVERS && !rps__smap_owned(m, 2) &&
		    rps__smap_backed(m, 2))
			break;
	CU_ASSERT_EQUAL_FATAL(rps__smap_owned(m, 2), 0);
}

static void rebalance_run(bool automatic)
{
	/* the workers push until the test stops them, some pushes after the
	 * last move: as long as it takes, on any transport (a fixed count
	 * was 3 minutes of pushes over Soft-RoCE, or done before the moves on
	 * a fast host) */
	static const struct job j = { .name = "rebalanced", .mode = RPS_MODE_ASYNC, .pushes = OPEN_ENDED };
	struct it_server_opts so = { .extra_args = automatic ? RESTART_ARGS : REBALANCE_OFF_ARGS,
				     .env = "RPS_FAULT=bootstrap-replicas-2", .data_dir = 1 };
	static struct rps__smap m, before_kill;
	static char out[65536], err[4096];
	struct report rep[NWORKERS];
	struct it_workers w;
	uint64_t version = 0, versions = 0;
	float *p = malloc(COUNT * sizeof(float));
	double until, t0;
	int acked, before, bad = 0, id, rc;
	unsigned i;

	memset(sh, 0, sizeof(*sh));
	CU_ASSERT_FATAL(p != NULL);
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, NSERVERS, &so), 0);
	clu_up = true;
	if (clu.attached) {
		fprintf(stderr, "[not with attached servers: it restarts one] ");
		free(p);
		return;
	}
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 60000, &m), 0);
	memcpy(&before_kill, &m, sizeof(m));
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, NWORKERS, push_worker, clu.servers, (void *)&j, -1, NULL), 0);
	while (acked_total() < KILL_AFTER / 3)
		it_sleep_ms(2);
	it_server_kill(&clu, 1);
	CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, 1), 0);
	t0 = it_now_s();
	if (automatic) {
		/* the leader gives it its share back by itself, after its
		 * partitions failed over (their epochs moved on), one move at
		 * a time until every member owns its share: the map settles
		 * between two moves, so member 2's share alone is not the end
		 * (the last move may still be to come between the others) */
		for (until = it_now_s() + 60; it_now_s() < until; it_sleep_ms(100))
			if (it_wait_settled(&clu, 2, 20000, &m) == 0 && failed_over(&m, &before_kill) && balanced(&m))
				break;
		CU_ASSERT(failed_over(&m, &before_kill));
		CU_ASSERT(balanced(&m));
		fprintf(stderr, "[member 2 owns %u of %u partitions again %.2f s after its restart, %d pushes "
			"acknowledged by then] ", rps__smap_owned(&m, 2), NPART, it_now_s() - t0, acked_total());
	} else {
		/* empty: its partitions failed over, backups seeded on it again */
		wait_restarted_empty(&m);
		it_sleep_ms(1000);	/* --rebalance off: it stays so */
		CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 20000, &m), 0);
		CU_ASSERT_EQUAL_FATAL(rps__smap_owned(&m, 2), 0);
		t0 = it_now_s();
		before = acked_total();
		rc = it_psctl(&clu, 120000, out, sizeof(out), err, sizeof(err), "--timeout 60 rebalance");
		if (rc)
			fprintf(stderr, "psctl rebalance: exit %d: %s%s\n", rc, out, err);
		CU_ASSERT_EQUAL(rc, 0);
		fprintf(stderr, "[rebalance: %.2f s, %d pushes acknowledged when it started, %d when it ended; %s] ",
			it_now_s() - t0, before, acked_total(),
			strstr(out, "balanced") ? strtok(strstr(out, "balanced"), "\n") : "");
	}
	/* pushes after the moves too, then stop */
	for (before = acked_total(), until = it_now_s() + 120; acked_total() < before + 30 * NWORKERS &&
							       it_now_s() < until;)
		it_sleep_ms(2);
	atomic_store(&sh->stop, 1);
	acked = collect_reports_of(&w, rep, OPEN_ENDED);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 60000, &m), 0);
	for (id = 1; id <= NSERVERS; id++)
		fprintf(stderr, "%smember %d owns %u", id > 1 ? ", " : "[", id, rps__smap_owned(&m, (uint64_t)id));
	fprintf(stderr, "] ");
	CU_ASSERT(balanced(&m));
	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, j.name, p, COUNT, 20000, &version), 0);
	for (i = 0; i < COUNT; i++)
		bad += p[i] != (float)acked;
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, (uint64_t)acked);
	CU_ASSERT_EQUAL(it_replicas_differ(&clu, &m, j.name, &versions), 0);
	CU_ASSERT_EQUAL(versions, (COUNT / 1024u) * (uint64_t)acked);
	/* balanced: the leader says it is done, and nothing more to move */
	CU_ASSERT_EQUAL(it_psctl(&clu, 60000, out, sizeof(out), err, sizeof(err), "--json status"), 0);
	CU_ASSERT(strstr(out, "\"rebalancing\":false") != NULL);
	CU_ASSERT_EQUAL(it_psctl(&clu, 60000, out, sizeof(out), err, sizeof(err), "--json rebalance"), 0);
	CU_ASSERT(strstr(out, "\"moves\":[]") != NULL);
	free(p);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

static void test_rebalance_by_psctl(void)
{
	rebalance_run(false);
}

static void test_rebalance_by_leader(void)
{
	rebalance_run(true);
}

/*
 * A worker idle through a member's death and return.  It pushed once,
 * then waits while member 2 is killed and restarted (its partitions fail
 * over, it is seeded as a backup again) and psctl rebalance gives it
 * partitions back, each seeded a backup again before the worker pushes:
 * its connection to member 2 is lost, and the map shows member 2 owning
 * partitions that have backups, which is what a member being failed over
 * looks like too.  But each was given to it after the loss (another
 * epoch), which the control plane does only to a member that lives: the
 * worker dials it at once (--rebalance off: psctl rebalance gives them
 * back, when the test says).  Its client's timeout (GIVEN_TIMEOUT_MS) is
 * below the FAILOVER_WAIT_MS (10 s) a worker otherwise waits before
 * dialing a member it lost again: every push completes, exact.
 */
#define GIVEN_TIMEOUT_MS 5000
#define GIVEN_PUSHES 20

static int given_back_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float *g = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	struct report rep = { 0 };
	rps_client_t *cl;
	rps_tensor_t *t;
	int s, ret;
	unsigned i;

	(void)arg;
	for (i = 0; i < COUNT; i++)
		g[i] = -1.0f;
	if ((ret = it_client_connect(servers, rank, nworkers, GIVEN_TIMEOUT_MS, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.optimizer = RPS_OPT_SGD;
	o.lr = 1.0f;
	if ((ret = rps_tensor_create(cl, "given-back", &o, &t)))
		return it_worker_fail(rank, "create", ret);
	for (s = 0; s < GIVEN_PUSHES; s++) {
		double t0;

		if (s == 1) {
			atomic_fetch_add(&sh->acked[rank], 1);	/* (the first one) */
			while (!atomic_load(&sh->gate))
				usleep(1000);
		}
		t0 = it_now_s();
		if ((ret = rps_push(t, g, COUNT * sizeof(float))))
			return it_worker_fail(rank, s ? "push after the rebalance" : "push", ret);
		if (it_now_s() - t0 > rep.longest)
			rep.longest = it_now_s() - t0;
		rep.acked++;
	}
	it_write_all(out_fd, &rep, sizeof(rep));
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	return 0;
}

static void test_given_back_to_idle_worker(void)
{
	struct it_server_opts so = { .extra_args = REBALANCE_OFF_ARGS, .env = "RPS_FAULT=bootstrap-replicas-2",
				     .data_dir = 1 };
	static struct rps__smap m;
	static char out[65536], err[4096];
	struct report rep = { 0 };
	struct it_workers w;
	uint64_t version = 0;
	float *p = malloc(COUNT * sizeof(float));
	double t0;
	int bad = 0, rc;
	unsigned i;

	memset(sh, 0, sizeof(*sh));
	CU_ASSERT_FATAL(p != NULL);
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, NSERVERS, &so), 0);
	clu_up = true;
	if (clu.attached) {
		fprintf(stderr, "[not with attached servers: it restarts one] ");
		free(p);
		return;
	}
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 60000, &m), 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, given_back_worker, clu.servers, NULL, -1, NULL), 0);
	while (!atomic_load(&sh->acked[0]))
		it_sleep_ms(2);
	t0 = it_now_s();
	it_server_kill(&clu, 1);
	CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, 1), 0);
	wait_restarted_empty(&m);
	rc = it_psctl(&clu, 120000, out, sizeof(out), err, sizeof(err), "--timeout 60 rebalance");
	if (rc)
		fprintf(stderr, "psctl rebalance: exit %d: %s%s\n", rc, out, err);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	/* every partition it got back has a backup again: what the worker
	 * sees is a backed partition owned by the member it lost */
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 60000, &m), 0);
	CU_ASSERT_FATAL(rps__smap_owned(&m, 2) > 0);
	fprintf(stderr, "[member 2 killed, back, given %u partitions, each backed again: %.2f s] ",
		rps__smap_owned(&m, 2), it_now_s() - t0);
	atomic_store(&sh->gate, 1);
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &rep, sizeof(rep)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	CU_ASSERT_EQUAL(rep.acked, GIVEN_PUSHES);
	fprintf(stderr, "[longest push %.3f s] ", rep.longest);
	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, "given-back", p, COUNT, 20000, &version), 0);
	for (i = 0; i < COUNT; i++)
		bad += p[i] != (float)GIVEN_PUSHES;
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, (uint64_t)GIVEN_PUSHES);
	free(p);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/*
 * A client that arrives during a failover (doc/operations.md "Nobody
 * listening"): three servers, R=2,
 * a tensor with data; a follower is killed with SIGKILL and at once, well
 * inside --failover-ms, a fresh client connects, opens the tensor and pulls.
 * The dead member refuses its connection, but its partitions have backups:
 * the client connects to the others and its pull of the dead member's
 * shards waits for the failover, as an established client's does, then
 * returns every value exact (not -ECONNREFUSED at once).
 */
#define LATE_FAILOVER_MS 3000
#define LATE_ARGS "--partitions 8 --shard-size 4096 --slots 4 --tick-ms 20 --fsync none --failover-ms 3000"

static float late_value(unsigned i)
{
	return (float)(i % 1000u) + 1.0f;	/* init i % 1000, then one push of -1 at lr 1 */
}

static int late_seed_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float *init = malloc(COUNT * sizeof(float)), *g = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	unsigned i;
	int ret;

	(void)nworkers;
	(void)arg;
	(void)out_fd;
	for (i = 0; i < COUNT; i++) {
		init[i] = (float)(i % 1000u);
		g[i] = -1.0f;
	}
	if ((ret = it_client_connect(servers, rank, 1, 30000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SGD;
	o.lr = 1.0f;
	o.init = init;
	if ((ret = rps_tensor_create(cl, "late", &o, &t)))
		return it_worker_fail(rank, "create", ret);
	if ((ret = rps_push(t, g, COUNT * sizeof(float))))
		return it_worker_fail(rank, "push", ret);
	rps_tensor_close(t);
	rps_client_close(cl);
	free(init);
	free(g);
	return 0;
}

/* A fresh client's connect, open and pull of "late", in a child: what it
 * returned, its message, the version and the values. */
struct late_res {
	int ret;
	char msg[512];
	uint64_t version;
	float p[COUNT];
};

static int late_pull_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	static struct late_res res;
	static float g[COUNT];
	const bool *push = arg;
	rps_client_t *cl;
	rps_tensor_t *t;
	unsigned i;

	(void)rank;
	(void)nworkers;
	for (i = 0; i < COUNT; i++)
		g[i] = -1.0f;
	memset(&res, 0, sizeof(res));
	res.ret = it_client_connect(servers, 0, 1, 30000, &cl);
	if (!res.ret) {
		res.ret = rps_tensor_open(cl, "late", &t);
		if (!res.ret && push && *push)
			res.ret = rps_push(t, g, sizeof(g));
		if (!res.ret) {
			res.ret = rps_pull(t, res.p, sizeof(res.p), &res.version);
			if (res.ret)
				snprintf(res.msg, sizeof(res.msg), "%s", rps_last_error());
			rps_tensor_close(t);
		}
		if (res.ret && !res.msg[0])
			snprintf(res.msg, sizeof(res.msg), "%s", rps_last_error());
		rps_client_close(cl);
	} else {
		snprintf(res.msg, sizeof(res.msg), "%s", rps_last_error());
	}
	it_write_all(out_fd, &res, sizeof(res));
	return 0;
}

/* (push: the fresh client pushes -1 once before it pulls, so the push is
 * what waits for the failover: a late worker) */
static void late_run(bool push)
{
	struct it_server_opts so = { .extra_args = LATE_ARGS, .env = "RPS_FAULT=bootstrap-replicas-2" };
	static struct late_res res;
	static struct rps__smap m;
	struct it_member st;
	struct it_workers w;
	int i, victim = -1, bad = 0;
	double t_kill, took;

	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, NSERVERS, &so), 0);
	clu_up = true;
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 30000, &m), 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, late_seed_worker, clu.servers, NULL, -1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(it_worker_wait(&w, 0), 0);
	/* a follower (the leader's death would add an election); each member owns partitions */
	for (i = 0; i < NSERVERS && victim < 0; i++)
		if (!it_member_status(&clu, i, &st, NULL) && !st.leading)
			victim = i;
	CU_ASSERT_FATAL(victim >= 0);
	it_server_kill(&clu, victim);
	t_kill = it_now_s();
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, late_pull_worker, clu.servers, &push, -1, NULL), 0);
	memset(&res, 0, sizeof(res));
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &res, sizeof(res)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	took = it_now_s() - t_kill;
	fprintf(stderr, "[member %d killed; a fresh client's connect, open, %spull: %d after %.2f s "
		"(--failover-ms %d)%s%s] ", victim + 1, push ? "push, " : "", res.ret, took, LATE_FAILOVER_MS,
		res.ret ? ": " : "", res.msg);
	CU_ASSERT_EQUAL_FATAL(res.ret, 0);
	for (i = 0; i < (int)COUNT; i++)
		if (res.p[i] != late_value((unsigned)i) + (push ? 1.0f : 0.0f)) {
			if (bad < 4)
				fprintf(stderr, "late[%d] = %g, expected %g\n", i, (double)res.p[i],
					(double)late_value((unsigned)i) + (push ? 1.0 : 0.0));
			bad++;
		}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(res.version, push ? 2u : 1u);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

static void test_client_arrives_during_failover(void)
{
	late_run(false);
}

static void test_worker_arrives_during_failover(void)
{
	late_run(true);
}

/*
 * The same arrival when no failover comes (--failover-ms 60000: the dead
 * member is not declared failed within the client's ride-through wait):
 * the pull waits that long (10 s) for the map to move on, then fails with
 * the refusal, naming the dead member's address and saying its partitions
 * were not failed over; the connect and open succeeded.
 */
#define NOFO_ARGS "--partitions 8 --shard-size 4096 --slots 4 --tick-ms 20 --fsync none --failover-ms 60000"

static void test_client_arrives_no_failover(void)
{
	struct it_server_opts so = { .extra_args = NOFO_ARGS, .env = "RPS_FAULT=bootstrap-replicas-2" };
	static struct late_res res;
	static struct rps__smap m;
	struct it_member st;
	struct it_workers w;
	int i, victim = -1;
	double t_kill, took;

	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, NSERVERS, &so), 0);
	clu_up = true;
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, 30000, &m), 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, late_seed_worker, clu.servers, NULL, -1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(it_worker_wait(&w, 0), 0);
	for (i = 0; i < NSERVERS && victim < 0; i++)
		if (!it_member_status(&clu, i, &st, NULL) && !st.leading)
			victim = i;
	CU_ASSERT_FATAL(victim >= 0);
	it_server_kill(&clu, victim);
	t_kill = it_now_s();
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, late_pull_worker, clu.servers, NULL, -1, NULL), 0);
	memset(&res, 0, sizeof(res));
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &res, sizeof(res)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	took = it_now_s() - t_kill;
	fprintf(stderr, "[member %d killed, never failed over: a fresh client's pull: %d after %.2f s: %s] ",
		victim + 1, res.ret, took, res.msg);
	CU_ASSERT_EQUAL(res.ret, -ECONNREFUSED);
	CU_ASSERT(strstr(res.msg, clu.uri[victim]) != NULL);
	CU_ASSERT(strstr(res.msg, "not failed over") != NULL);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "async: a primary killed mid-push: nothing acknowledged lost or doubled", test_async_primary_killed },
		{ "bounded: a primary killed mid-push: exact, staleness kept", test_bounded_primary_killed },
		{ "sync: a primary killed mid-step: every step completes, exact", test_sync_primary_killed },
		{ "async: a primary restarted at once: fails over, rejoins as a backup", test_async_primary_restarted },
		{ "--rebalance off, then psctl rebalance under pushes: the restarted member owns its share again, exact",
		  test_rebalance_by_psctl },
		{ "--rebalance auto: the leader gives the restarted member its share back under pushes, exact",
		  test_rebalance_by_leader },
		{ "a worker idle while a member died and was given partitions back: it dials it at once, exact",
		  test_given_back_to_idle_worker },
		{ "async: a backup's stream broken, every server alive: dropped, seeded again, exact", test_async_stream_broken },
		{ "sync: a backup's stream broken, every server alive: every step completes, exact", test_sync_stream_broken },
		{ "a client that connects during a failover rides through it: exact pull", test_client_arrives_during_failover },
		{ "a worker that connects during a failover pushes through it: exact", test_worker_arrives_during_failover },
		{ "a client that connects while a dead member is not failed over: refused after the wait, named", test_client_arrives_no_failover },
	};
	const struct cutest_suite suites[] = {
		{ "replicated partitions, 3 servers", NULL, NULL, it_test_setup, it_test_teardown, tests,
		  CUTEST_COUNT(tests) },
	};
	/* attached (servers in VMs, software RoCE): much slower */
	unsigned watchdog_s = getenv("RPS_IT_ATTACH") ? 10 * TEST_WATCHDOG_S : TEST_WATCHDOG_S;
	int ret;

	if ((ret = cutest_require_faults("it_replica")))	/* (every test: RPS_FAULT) */
		return ret;
	if ((ret = it_prog_init("it_replica", watchdog_s, &clu, &clu_up)))
		return ret;
	if (!(sh = it_shared_map("it_replica", sizeof(*sh))))
		return 1;
	return cutest_run(suites, CUTEST_COUNT(suites));
}
