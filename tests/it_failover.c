/*
 * it_failover.c - servers killed at awkward moments in a replicated cluster
 * (tests a, d, e and g below; doc/operations.md "Failures"): rdmapsd processes with --replicas on
 * loopback TCP, the leader placing and seeding the backups itself, workers
 * in forked processes, a server killed with SIGKILL.
 *
 *  (a) sync Adam, 4 workers: a primary killed mid-step (three ranks' pushes
 *      of a step taken there, the fourth held back until after the kill).
 *      Gradients are multiples of 1/4 small enough that every sum is exact
 *      in any order, so the job must end bit-identical (memcmp) to the same
 *      job run before on the same cluster without a kill, at the same
 *      versions.
 *  (d) async, every push +1 per element: the Raft leader, a primary too, is
 *      killed.  Every element and version equals the pushes acknowledged
 *      (every worker rides through, so all of them); another member leads;
 *      the old leader's partitions belong to their former backups, at a
 *      later epoch.
 *  (d2, d3) the same, the victim (the leader, d2; another primary, d3)
 *      stopped with SIGSTOP instead: a host that dies silently, its
 *      connections left open.  Every push acknowledged within the
 *      workers' 30 s timeout, exact; SIGKILLed once they are done.
 *  (d4) the whole cluster stopped 6 s then continued (--failover-ms 4000:
 *      nobody is failed over, since nobody was listening): the workers'
 *      connections are declared lost meanwhile; dialed again, every push
 *      resent there once, exact, nothing moved.
 *  (d4b) a primary stopped 6 s at --failover-ms 60000: the workers wait
 *      for it (no partition of it can fail over sooner), no redial.
 *  (d5) a member stopped for 3 s, the backup of the partition that holds
 *      a one-shard tensor's pushes: that primary warns of the updates
 *      waiting for it, one line a check at most, naming it and the
 *      stream's position; exact, nothing moved.
 *  (d6) a member stopped that holds no copy of a one-shard tensor's
 *      partition, beside workers of a whole-cluster tensor stalled on it:
 *      the one-shard tensor's pushes go on being acknowledged meanwhile
 *      (a path shared with the stopped member's streams would stall them
 *      for as long as the stop); exact, nothing moved.
 *  (e) --replicas 3: a server restarted (same --data-dir) is seeded again
 *      as a backup; a watcher kills the seed's source, the partition's
 *      primary, the moment the map shows the joiner.  The partition goes to
 *      the surviving full replica, not the joiner; values exact; an 8 MiB
 *      tensor never pushed reads back as created and is equal everywhere.
 *  (g) after each, once the map settles: every backup's digest (crc32c of
 *      versions, parameters, optimizer state and applied push ids; sum of
 *      versions; shard count) equals its primary's, for every tensor.
 */
#include "config.h"
#include "cluster.h"
#include "client/ctl.h"
#include "proto/proto.h"
#include "proto/shard.h"
#include "proto/smap.h"
#include "transport/uri.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"
#include "lib/tmpdir.h"

#define NSERVERS 3
#define NPART 6
#define SHARD 4096u
#define COUNT (2u * NPART * SHARD / 4u)	/* fp32: 12 shards, 2 per partition */
/* --rebalance off: the tests check where a failover puts each partition
 * (on its first backup); the leader's own balancing afterwards is
 * it_replica's to test */
#define ARGS "--partitions 6 --shard-size 4096 --slots 4 --tick-ms 20 --fsync none --failover-ms 1000" \
	" --move-timeout-ms 10000 --rebalance off"
#define SETTLE_MS 60000
#define TEST_WATCHDOG_S 150

static struct it_cluster clu;
static bool clu_up;
static struct rps__smap map0, map1;

/* What the workers and the parent tell each other while they run. */
struct shared {
	atomic_int acked[IT_MAX_WORKERS];	/* pushes acknowledged so far */
	atomic_int at_gate[IT_MAX_WORKERS];	/* pushing the gate step now */
	atomic_int gate;			/* the last rank may push the gate step */
	atomic_int stop;			/* (e): stop pushing */
};
static struct shared *sh;

static int acked_total(int n)
{
	int r, k = 0;

	for (r = 0; r < n; r++)
		k += atomic_load(&sh->acked[r]);
	return k;
}

static uint32_t replicas;	/* the test's --replicas */
static const char *more_args = "";	/* (d4, d5): after ARGS, the last word on a flag */

static void start(int n, uint32_t r, bool data_dir)
{
	char args[1024];
	struct it_server_opts o = { .extra_args = args, .data_dir = data_dir };

	snprintf(args, sizeof(args), "%s --replicas %u%s", ARGS, r, more_args);
	replicas = r;
	memset(sh, 0, sizeof(*sh));
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, n, &o), 0);
	clu_up = true;
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, r, SETTLE_MS, &map0), 0);
}

/* The index of the Raft leader (asked of every running server until one
 * leads), or -1. */
static int leader_index(void)
{
	struct it_member st;
	double t0 = it_now_s();

	while (it_now_s() - t0 < SETTLE_MS / 1000.0) {
		for (int i = 0; i < clu.nservers; i++)
			if (it_server_alive(&clu, i) && !it_member_status(&clu, i, &st, NULL) && st.leading)
				return i;
		it_sleep_ms(20);
	}
	return -1;
}

static uint32_t owned(const struct rps__smap *m, uint64_t id)
{
	uint32_t n = 0;

	for (uint32_t p = 0; p < m->npart; p++)
		n += m->parts[p].owner == id;
	return n;
}

/* (g): once settled, every backup equals its primary, for every tensor
 * named; the sum of the primaries' versions for each in versions[]. */
static void check_replicas(const char *const *tensors, int n, uint64_t *versions)
{
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, replicas, SETTLE_MS, &map1), 0);
	for (int k = 0; k < n; k++)
		CU_ASSERT_EQUAL(it_replicas_differ(&clu, &map1, tensors[k], &versions[k]), 0);
}

/* Pull `name` (count floats) with a fresh client into a fresh buffer
 * (free it); its version. */
static float *pull(const char *name, size_t count, uint64_t *version)
{
	float *p = malloc(count * sizeof(float));

	CU_ASSERT_FATAL(p != NULL);
	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, name, p, count, 30000, version), 0);
	return p;
}

/* A primary that is not the Raft leader: the first member after the
 * leader that owns a partition in map0 (under load a member can be
 * declared failed while the cluster settles, and own none there); the
 * leader's index in *leader. */
static int primary_not_leader(int *leader)
{
	int victim;

	*leader = leader_index();
	CU_ASSERT_FATAL(*leader >= 0);
	victim = *leader;
	for (int i = 1; i < NSERVERS && victim == *leader; i++)
		if (owned(&map0, (uint64_t)((*leader + i) % NSERVERS) + 1) > 0)
			victim = (*leader + i) % NSERVERS;
	CU_ASSERT_FATAL(victim != *leader);
	return victim;
}

/* ---- (a) sync Adam, a primary killed mid-step -------------------------------- */

#define SYNC_WORKERS 4
#define SYNC_STEPS 120
#define GATE_STEP 40

struct sync_job {
	const char *name;
	int gate_step;		/* the last rank holds this step until sh->gate (0: none) */
};

/* Rank r's gradient of step s: multiples of 1/4 in [-1, 1], so that a
 * step's sum of four is exact whatever the order it is added in. */
static void sync_grad(float *g, int rank, int step)
{
	uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1) + (uint64_t)step * 0x2545f4914f6cdd1dull + 1;

	for (unsigned i = 0; i < COUNT; i++)
		g[i] = 0.25f * (float)((int)(it_rand(&s) % 9u) - 4);
}

static int sync_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct sync_job *j = arg;
	float *g = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	int s, ret;

	if ((ret = it_client_connect(servers, rank, nworkers, 30000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = RPS_MODE_SYNC;
	o.optimizer = RPS_OPT_ADAM;
	o.lr = 0.01f;
	if ((ret = rps_tensor_create(cl, j->name, &o, &t)))
		return it_worker_fail(rank, "create", ret);
	if ((ret = rps_barrier(cl)))
		return it_worker_fail(rank, "barrier", ret);
	for (s = 0; s < SYNC_STEPS; s++) {
		sync_grad(g, rank, s);
		if (j->gate_step && s == j->gate_step && rank == nworkers - 1) {
			while (!atomic_load(&sh->gate))
				usleep(1000);
		} else if (j->gate_step && s == j->gate_step) {
			/* at the gate once taken on every primary, the step
			 * waiting there for the last rank */
			rps_request_t *req;

			if ((ret = it_push_taken(t, g, COUNT * sizeof(float), 60000, &req)))
				return it_worker_fail(rank, "push (taken)", ret);
			atomic_store(&sh->at_gate[rank], 1);
			if ((ret = rps_wait(req)))
				return it_worker_fail(rank, "push", ret);
			atomic_fetch_add(&sh->acked[rank], 1);
			continue;
		}
		if ((ret = rps_push(t, g, COUNT * sizeof(float))))
			return it_worker_fail(rank, "push", ret);
		atomic_fetch_add(&sh->acked[rank], 1);
	}
	it_write_all(out_fd, &s, sizeof(s));
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	return 0;
}

/* Run a sync job to its end; with a gate, SIGKILL member `victim` once the
 * other ranks' pushes of the gate step are taken on the primaries (waiting
 * there for the last rank) and only then let the last rank push it. */
static void run_sync(const struct sync_job *j, int victim)
{
	struct it_workers w;
	int r, steps;

	memset(sh, 0, sizeof(*sh));
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, SYNC_WORKERS, sync_worker, clu.servers, (void *)j, -1, NULL), 0);
	if (j->gate_step) {
		bool all;
		do {
			it_sleep_ms(2);
			all = true;
			for (r = 0; r < SYNC_WORKERS - 1; r++)
				all = all && atomic_load(&sh->at_gate[r]);
		} while (!all);
		CU_ASSERT_EQUAL(acked_total(SYNC_WORKERS), SYNC_WORKERS * j->gate_step);
		it_server_kill(&clu, victim);
		atomic_store(&sh->gate, 1);
	}
	for (r = 0; r < SYNC_WORKERS; r++) {
		steps = -1;
		CU_ASSERT_EQUAL(it_worker_read(&w, r, &steps, sizeof(steps)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, r), 0);
		CU_ASSERT_EQUAL(steps, SYNC_STEPS);
	}
}

static void test_sync_adam_primary_killed(void)
{
	static const struct sync_job ref = { .name = "ref" }, run = { .name = "run", .gate_step = GATE_STEP };
	static const char *const tensors[] = { "ref", "run" };
	uint64_t vref = 0, vrun = 0, versions[2];
	float *pref, *prun;
	int victim, leader, diff = 0;
	double t0;

	start(NSERVERS, 2, false);
	run_sync(&ref, -1);
	/* a primary that is not the leader ((d) kills the leader) */
	victim = primary_not_leader(&leader);
	t0 = it_now_s();
	run_sync(&run, victim);
	fprintf(stderr, "[member %d killed at step %d of %d; the job ended %.2f s later] ", victim + 1, GATE_STEP,
		SYNC_STEPS, it_now_s() - t0);

	pref = pull("ref", COUNT, &vref);
	prun = pull("run", COUNT, &vrun);
	CU_ASSERT_EQUAL(vref, SYNC_STEPS);
	CU_ASSERT_EQUAL(vrun, vref);
	for (unsigned i = 0; i < COUNT; i++)
		if (memcmp(&pref[i], &prun[i], sizeof(float)) && diff++ < 4)
			fprintf(stderr, "run[%u] = %.9g, without the kill %.9g\n", i, (double)prun[i], (double)pref[i]);
	CU_ASSERT_EQUAL(memcmp(pref, prun, COUNT * sizeof(float)), 0);
	free(pref);
	free(prun);

	/* (g), and every shard at the same version in both */
	check_replicas(tensors, 2, versions);
	CU_ASSERT_EQUAL(versions[0], (uint64_t)SYNC_STEPS * 2 * NPART);
	CU_ASSERT_EQUAL(versions[1], versions[0]);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* ---- (h) sync: a rank gone mid-step, then a primary killed ------------------ */

/*
 * Rank 2 dies before its push of step OR_STEP; ranks 0 and 1 push theirs,
 * which their primaries end as taken (the step is orphaned: the workers
 * forget those gradients) once the backups hold them.  Then a primary is
 * killed before rank 2's replacement comes: the promoted backups must
 * complete the step with the replacement's push alone.  Every gradient is
 * a constant (ranks 0 and 1: 1, the first rank-2 process 1000, its
 * replacement 100000): each shard's final value says whose pushes counted.
 */
#define OR_WORKERS 3
#define OR_STEPS 5
#define OR_STEP 2

struct orphan_job {
	float grad;
	bool alone;		/* started on its own: rank 2 */
	bool dies;		/* SIGKILL itself before its push of OR_STEP */
};

static int orphan_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct orphan_job *j = arg;
	float *g = malloc(COUNT * sizeof(float)), *p = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	uint64_t version = 0, first = 0;
	rps_client_t *cl;
	rps_tensor_t *t;
	int s, ret;

	(void)nworkers;
	if (j->alone)
		rank = 2;
	for (unsigned i = 0; i < COUNT; i++)
		g[i] = rank < 2 ? 1.0f : j->grad;
	if ((ret = it_client_connect(servers, rank, OR_WORKERS, 30000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = RPS_MODE_SYNC;
	o.optimizer = RPS_OPT_SUM;
	if ((ret = rps_tensor_create(cl, "orphaned", &o, &t)))
		return it_worker_fail(rank, "create", ret);
	/* the replacement learns where to resume from its first pull */
	if (j->alone && !j->dies && (ret = it_pull_while_gone(t, p, COUNT * sizeof(float), &first, 60000)))
		return it_worker_fail(rank, "first pull", ret);
	for (s = (int)first; s < OR_STEPS; s++) {
		if (j->dies && s == OR_STEP)
			raise(SIGKILL);
		if ((ret = rps_push(t, g, COUNT * sizeof(float))))
			return it_worker_fail(rank, "push", ret);
		if (s == OR_STEP && rank < 2)
			atomic_store(&sh->at_gate[rank], 1);	/* acknowledged: forgotten here */
		if ((ret = it_pull_while_gone(t, p, COUNT * sizeof(float), &version, 60000)))
			return it_worker_fail(rank, "pull", ret);
		if (version != (uint64_t)s + 1) {
			fprintf(stderr, "worker %d: step %d pulled version %llu\n", rank, s, (unsigned long long)version);
			return 1;
		}
	}
	it_write_all(out_fd, &first, sizeof(first));
	it_write_all(out_fd, p, COUNT * sizeof(float));
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	free(p);
	return 0;
}

static void test_sync_orphan_then_primary_killed(void)
{
	static const struct orphan_job others = { .grad = 1.0f },
				       dying = { .grad = 1000.0f, .alone = true, .dies = true },
				       repl = { .grad = 100000.0f, .alone = true };
	const float want = 2.0f * OR_STEPS + 1000.0f * OR_STEP + 100000.0f * (OR_STEPS - OR_STEP);
	float *p = malloc(COUNT * sizeof(float)), *q = malloc(COUNT * sizeof(float));
	struct it_workers w, wd, wr;
	uint64_t first = 99;
	int r, leader, victim, bad = 0;

	CU_ASSERT_FATAL(p && q);
	start(NSERVERS, 2, false);
	victim = primary_not_leader(&leader);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 2, orphan_worker, clu.servers, (void *)&others, -1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&wd, 1, orphan_worker, clu.servers, (void *)&dying, -1, NULL), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&wd, 0), 128 + SIGKILL);
	while (!atomic_load(&sh->at_gate[0]) || !atomic_load(&sh->at_gate[1]))
		it_sleep_ms(5);
	it_server_kill(&clu, victim);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&wr, 1, orphan_worker, clu.servers, (void *)&repl, -1, NULL), 0);
	CU_ASSERT_EQUAL(it_worker_read(&wr, 0, &first, sizeof(first)), 0);
	CU_ASSERT_EQUAL(it_worker_read(&wr, 0, q, COUNT * sizeof(float)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&wr, 0), 0);
	CU_ASSERT_EQUAL(first, (uint64_t)OR_STEP);
	for (unsigned i = 0; i < COUNT; i++)
		if (q[i] != want && bad++ < 4)
			fprintf(stderr, "element %u: %.1f, want %.1f\n", i, (double)q[i], (double)want);
	CU_ASSERT_EQUAL(bad, 0);
	for (r = 0; r < 2; r++) {
		first = 99;
		CU_ASSERT_EQUAL(it_worker_read(&w, r, &first, sizeof(first)), 0);
		CU_ASSERT_EQUAL(it_worker_read(&w, r, p, COUNT * sizeof(float)), 0);
		CU_ASSERT_EQUAL(first, 0u);
		CU_ASSERT_EQUAL(memcmp(p, q, COUNT * sizeof(float)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, r), 0);
	}
	free(p);
	free(q);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* ---- async, +1 per push -------------------------------------------------------- */

struct async_job {
	const char *name;
	size_t count;
	int pushes;		/* per worker; 0: until sh->stop */
};

static int async_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct async_job *j = arg;
	float *g = malloc(j->count * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	int n = 0, ret;

	for (size_t i = 0; i < j->count; i++)
		g[i] = -1.0f;
	if ((ret = it_client_connect(servers, rank, nworkers, 30000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = j->count;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SGD;
	o.lr = 1.0f;
	if ((ret = rps_tensor_create(cl, j->name, &o, &t)))
		return it_worker_fail(rank, "create", ret);
	while (j->pushes ? n < j->pushes : !atomic_load(&sh->stop)) {
		if ((ret = rps_push(t, g, j->count * sizeof(float))))
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

/* Every worker's count of acknowledged pushes, added up. */
static int async_wait(struct it_workers *w)
{
	int r, n, total = 0;

	for (r = 0; r < w->n; r++) {
		n = 0;
		CU_ASSERT_EQUAL(it_worker_read(w, r, &n, sizeof(n)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(w, r), 0);
		total += n;
	}
	CU_ASSERT_EQUAL(acked_total(w->n), total);
	return total;
}

/* Every element and the version equal `acked`. */
static void check_exact(const char *name, size_t count, int acked)
{
	uint64_t version;
	float *p = pull(name, count, &version);
	size_t bad = 0;

	for (size_t i = 0; i < count; i++)
		if (p[i] != (float)acked && bad++ < 4)
			fprintf(stderr, "%s[%zu] = %g, %d pushes acknowledged\n", name, i, (double)p[i], acked);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, (uint64_t)acked);
	free(p);
}

/* ---- (j) a planned switch to a backup killed a moment before --------------- */

/*
 * psctl move of a partition to its backup is a planned switch: nothing is
 * shipped, the backup takes over and the old primary leaves the set (it
 * is seeded again).  Made to a backup killed a moment before (not yet
 * declared failed), it would leave the partition's only copy on the dead
 * member.  The switch waits for the backup's stream, finds it down and is
 * aborted: the partition stays where it was, exact.  (The soak found it:
 * the leader's own balancing picked a member stopped with SIGTERM.)
 */
static void test_switch_to_killed_backup(void)
{
	static const struct async_job j = { .name = "sw", .count = COUNT, .pushes = 40 };
	struct it_workers w;
	struct rps__smap m;
	char out[1024], err[1024];
	int leader, b = -1, acked, rc;
	uint32_t part;

	start(NSERVERS, 2, false);
	leader = leader_index();
	CU_ASSERT_FATAL(leader >= 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 2, async_worker, clu.servers, (void *)&j, -1, NULL), 0);
	acked = async_wait(&w);
	/* a partition whose first backup is not the leader */
	for (part = 0; part < map0.npart && b < 0; part++)
		if (map0.parts[part].backups[0] && map0.parts[part].backups[0] != (uint64_t)leader + 1)
			b = (int)map0.parts[part].backups[0] - 1;
	part--;
	CU_ASSERT_FATAL(b >= 0);
	it_server_kill(&clu, b);
	rc = it_psctl(&clu, 60000, out, sizeof(out), err, sizeof(err), "--timeout 20 move %u %d", part, b + 1);
	fprintf(stderr, "[psctl move %u %d, that member killed before: exit %d: %s%s] ", part, b + 1, rc, out, err);
	CU_ASSERT_NOT_EQUAL(rc, 0);
	CU_ASSERT(strstr(err, "was aborted") != NULL || strstr(out, "was aborted") != NULL);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	CU_ASSERT_EQUAL(m.parts[part].lost, 0u);
	CU_ASSERT_NOT_EQUAL(m.parts[part].owner, (uint64_t)b + 1);
	check_exact("sw", COUNT, acked);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* ---- (d) the Raft leader, a primary, killed ------------------------------------ */

#define D_WORKERS 3
#define D_PUSHES 200

static void test_leader_primary_killed(void)
{
	static const struct async_job j = { .name = "d", .count = COUNT, .pushes = D_PUSHES };
	static const char *const tensors[] = { "d" };
	struct it_workers w;
	struct it_member st;
	uint64_t old, versions[1];
	int leader, acked, at_kill;
	double t0;

	start(NSERVERS, 2, false);
	leader = leader_index();
	CU_ASSERT_FATAL(leader >= 0);
	old = (uint64_t)leader + 1;
	CU_ASSERT_FATAL(owned(&map0, old) > 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, D_WORKERS, async_worker, clu.servers, (void *)&j, -1, NULL), 0);
	while (acked_total(D_WORKERS) < D_WORKERS * D_PUSHES / 3)
		it_sleep_ms(2);
	at_kill = acked_total(D_WORKERS);
	t0 = it_now_s();
	it_server_kill(&clu, leader);
	acked = async_wait(&w);
	fprintf(stderr, "[leader %llu killed after %d pushes; %d acknowledged, the last %.2f s after the kill] ",
		(unsigned long long)old, at_kill, acked, it_now_s() - t0);
	CU_ASSERT_EQUAL(acked, D_WORKERS * D_PUSHES);
	check_exact("d", COUNT, acked);

	check_replicas(tensors, 1, versions);
	CU_ASSERT_EQUAL(versions[0], (uint64_t)acked * 2 * NPART);
	/* another member leads; the old leader's partitions went to their
	 * first backups, at a later epoch */
	leader = leader_index();
	CU_ASSERT(leader >= 0 && (uint64_t)leader + 1 != old);
	for (int i = 0; i < NSERVERS; i++)
		if (it_server_alive(&clu, i) && !it_member_status(&clu, i, &st, NULL))
			CU_ASSERT(st.leader != old);
	for (uint32_t p = 0; p < NPART; p++) {
		if (map0.parts[p].owner != old)
			continue;
		CU_ASSERT_EQUAL(map1.parts[p].owner, map0.parts[p].backups[0]);
		CU_ASSERT(map1.parts[p].epoch > map0.parts[p].epoch);
	}
	CU_ASSERT_EQUAL(owned(&map1, old), 0);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* ---- (d2, d3) a primary stopped: the Raft leader, or not ----------------------- */

/* A host that dies silently (power, kernel panic) resets nothing: its
 * peers' connections stay open and only go quiet.  SIGSTOP is that on
 * loopback: the process's sockets stay open, nothing answers.  The same
 * job as (d), the victim the Raft leader (d2) or another primary (d3);
 * every push must be acknowledged long before the workers' 30 s timeout,
 * and the stopped member is SIGKILLed only once they are done. */
static void run_primary_stopped(bool leader_too)
{
	static const struct async_job j = { .name = "d2", .count = COUNT, .pushes = D_PUSHES };
	static const char *const tensors[] = { "d2" };
	static char servers[sizeof(clu.servers)];
	struct it_workers w;
	uint64_t old, versions[1];
	int leader, victim, acked, at_stop;
	double t0, took;

	start(NSERVERS, 2, false);
	leader = leader_index();
	CU_ASSERT_FATAL(leader >= 0);
	/* the leader, or a member after it that owns a partition */
	victim = leader;
	for (int i = 1; !leader_too && i < NSERVERS && victim == leader; i++)
		if (owned(&map0, (uint64_t)((leader + i) % NSERVERS) + 1) > 0)
			victim = (leader + i) % NSERVERS;
	CU_ASSERT_FATAL(leader_too ? victim == leader : victim != leader);
	old = (uint64_t)victim + 1;
	CU_ASSERT_FATAL(owned(&map0, old) > 0);
	/* the victim first in the workers' list: their first connection,
	 * whose map they read first and which a refresh would ask first */
	it_servers_first(&clu, victim, servers, sizeof(servers));
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, D_WORKERS, async_worker, servers, (void *)&j, -1, NULL), 0);
	while (acked_total(D_WORKERS) < D_WORKERS * D_PUSHES / 3)
		it_sleep_ms(2);
	at_stop = acked_total(D_WORKERS);
	t0 = it_now_s();
	CU_ASSERT_EQUAL_FATAL(kill(clu.pid[victim], SIGSTOP), 0);
	acked = async_wait(&w);
	took = it_now_s() - t0;
	fprintf(stderr, "[%s %llu stopped after %d pushes; %d acknowledged, the last %.2f s after the stop] ",
		leader_too ? "leader" : "primary", (unsigned long long)old, at_stop, acked, took);
	CU_ASSERT_EQUAL(acked, D_WORKERS * D_PUSHES);
	it_server_kill(&clu, victim);
	check_exact("d2", COUNT, acked);

	check_replicas(tensors, 1, versions);
	CU_ASSERT_EQUAL(versions[0], (uint64_t)acked * 2 * NPART);
	for (uint32_t p = 0; p < NPART; p++) {
		if (map0.parts[p].owner != old)
			continue;
		CU_ASSERT_EQUAL(map1.parts[p].owner, map0.parts[p].backups[0]);
		CU_ASSERT(map1.parts[p].epoch > map0.parts[p].epoch);
	}
	CU_ASSERT_EQUAL(owned(&map1, old), 0);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

static void test_leader_primary_stopped(void)
{
	run_primary_stopped(true);
}

static void test_primary_stopped(void)
{
	run_primary_stopped(false);
}

/* ---- (d7) a tensor opened while a primary is stopped ----------------------------- */

#define D7_TIMEOUT_MS 20000

/* Rank 0 opens 'd7' (made by the parent) once the parent has stopped a
 * primary: the open asks every server it holds a connection to, the
 * stopped one too.  Over verbs the kernel (an HCA) answers that server's
 * liveness probes for it, so only the open's unanswered CREATE can tell it
 * is gone; the open must then ride through the failover, and a push
 * through it be acknowledged, within the client's timeout_ms (before: the
 * CREATE waited all of it and the open failed). */
static int d7_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	bool connect_late = arg != NULL;	/* (d8): the connect too after the stop */
	float g[COUNT];
	rps_client_t *cl = NULL;
	rps_tensor_t *t;
	int ret, n = 0;
	double t0;

	for (size_t i = 0; i < COUNT; i++)
		g[i] = -1.0f;
	if (!connect_late && (ret = it_client_connect(servers, rank, nworkers, D7_TIMEOUT_MS, &cl)))
		return it_worker_fail(rank, "connect", ret);
	atomic_store(&sh->at_gate[rank], 1);	/* connected to every member */
	while (!atomic_load(&sh->gate))
		usleep(1000);
	t0 = it_now_s();
	if (connect_late) {
		if ((ret = it_client_connect(servers, rank, nworkers, D7_TIMEOUT_MS, &cl)))
			return it_worker_fail(rank, "connect", ret);
		/* the connect keeps to its timeout_ms, a stopped first seed
		 * and a stopped member with it (before: each cost all of it) */
		if (it_now_s() - t0 > D7_TIMEOUT_MS / 1000.0 + 2.0) {
			fprintf(stderr, "worker %d: connect took %.1f s with a timeout of %d ms\n", rank,
				it_now_s() - t0, D7_TIMEOUT_MS);
			return 1;
		}
	}
	if ((ret = rps_tensor_open(cl, "d7", &t)))
		return it_worker_fail(rank, "open", ret);
	if ((ret = rps_push(t, g, sizeof(g))))
		return it_worker_fail(rank, "push", ret);
	n = 1;
	it_write_all(out_fd, &n, sizeof(n));
	rps_tensor_close(t);
	rps_client_close(cl);
	return 0;
}

static void run_open_while_primary_stopped(bool connect_late)
{
	static char servers[sizeof(clu.servers)];
	struct rps_tensor_opts o;
	struct it_workers w;
	rps_client_t *cl;
	rps_tensor_t *t;
	int leader, victim = -1, n = 0;
	double t0;

	start(NSERVERS, 2, false);
	leader = leader_index();
	CU_ASSERT_FATAL(leader >= 0);
	for (int i = 1; i < NSERVERS && victim < 0; i++)
		if (owned(&map0, (uint64_t)((leader + i) % NSERVERS) + 1) > 0)
			victim = (leader + i) % NSERVERS;
	CU_ASSERT_FATAL(victim >= 0);
	/* A member the leader never heard from is never failed over (it
	 * held no lease: repl_failover.c): the victim must have reached the
	 * others first.  Right after the start it may not yet have (its
	 * first dials refused, the next a second later). */
	{
		struct it_member st = { 0 };
		double t1 = it_now_s();
		while ((it_member_status(&clu, victim, &st, NULL) || st.leader != (uint64_t)leader + 1) &&
		       it_now_s() - t1 < SETTLE_MS / 1000.0)
			it_sleep_ms(20);
		CU_ASSERT_EQUAL_FATAL(st.leader, (uint64_t)leader + 1);
	}
	/* the tensor made in a child of ours: no RDMA device opened here */
	{
		pid_t pid = fork();
		CU_ASSERT_FATAL(pid >= 0);
		if (pid == 0) {
			int ret = it_client_connect(clu.servers, 0, 1, 10000, &cl);
			rps_tensor_opts_init(&o);
			o.count = COUNT;
			o.mode = RPS_MODE_ASYNC;
			o.optimizer = RPS_OPT_SGD;
			o.lr = 1.0f;
			if (!ret)
				ret = rps_tensor_create(cl, "d7", &o, &t);
			_exit(ret ? it_worker_fail(0, "create", ret) : 0);
		}
		int st = 0;
		CU_ASSERT_FATAL(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	/* the victim first: the map the worker holds is the one it gave */
	it_servers_first(&clu, victim, servers, sizeof(servers));
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, d7_worker, servers, connect_late ? (void *)&w : NULL, -1, NULL),
			      0);
	while (!atomic_load(&sh->at_gate[0]))
		it_sleep_ms(2);
	CU_ASSERT_EQUAL_FATAL(kill(clu.pid[victim], SIGSTOP), 0);
	t0 = it_now_s();
	atomic_store(&sh->gate, 1);
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &n, sizeof(n)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	CU_ASSERT_EQUAL(n, 1);
	fprintf(stderr, "[member %d stopped; the %sopen and a push through it done %.2f s later] ", victim + 1,
		connect_late ? "connect, the " : "", it_now_s() - t0);
	it_server_kill(&clu, victim);
	check_exact("d7", COUNT, 1);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

static void test_open_while_primary_stopped(void)
{
	run_open_while_primary_stopped(false);
}

/* (d8) A client that starts while a primary is stopped (a replacement
 * rank, a late worker), that primary first in its list: its connect keeps
 * to timeout_ms, then the open and a push ride through the failover. */
static void test_connect_while_primary_stopped(void)
{
	run_open_while_primary_stopped(true);
}

/* ---- (d4, d5) a member stalled, not dead --------------------------------------- */

#define D4_STALL_MS 6000
#define D5_STALL_MS 3000

/* The job of (d) on a cluster that fails nobody over (--failover-ms 60000,
 * then `args`): the first member after the leader that owns a partition is
 * stopped once a third of the pushes are acknowledged and continued
 * stall_ms later.  Every push acknowledged, exact, every backup equal to
 * its primary, nothing moved: the same owners at the same epochs.  The
 * stalled member's index; *t_done: when the last push was acknowledged, in
 * seconds from the stall's start. */
/* (d5) A one-shard tensor (its name: prefix-N for the first N that
 * does it) in a partition whose backup is the first member after the
 * leader that backs one: every push waits for that member, so a stall of
 * it is sure to hold an update.  (With the job's 12 shards the stalled
 * member is also a primary of some: when it stops just after confirming
 * every update of the others, the workers wait on its own shards alone,
 * and no update ever waits for it as a backup.)  That member's index. */
static int place_on_backup(struct async_job *j, const char *prefix, char *name, size_t len, int leader)
{
	for (int i = 1; i < NSERVERS; i++) {
		uint64_t id = (uint64_t)((leader + i) % NSERVERS) + 1;

		for (int n = 0; n < 1000; n++) {
			struct rps__layout l;

			snprintf(name, len, "%s-%d", prefix, n);
			CU_ASSERT_EQUAL_FATAL(rps__layout_init(&l, name, SHARD / 4, SHARD / 4, NPART), 0);
			if (rps__smap_role(&map0, rps__shard_server(&l, 0), id) == RPS__SMAP_ROLE_BACKUP) {
				j->name = name;
				j->count = SHARD / 4;
				return (int)id - 1;
			}
		}
	}
	return -1;
}

/* Lines of the servers' log (at info) that say a worker connected. */
static int count_connected(const char *logpath)
{
	char line[1024];
	int n = 0;
	FILE *f = fopen(logpath, "r");

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "worker connected from") != NULL;
	fclose(f);
	return n;
}

/* (d4) the servers' log, and its count of those lines when the members
 * were stopped and when the last push was acknowledged */
static const char *stall_log;
static int stall_connected[2];

/* backup_only: the victim is found, and the job placed, by place_on_backup;
 * whole: every member is stopped, not the victim alone */
static int run_stalled(struct async_job *j, int stall_ms, const char *args, bool backup_only, bool whole,
		       double *t_done)
{
	static char placed[32];
	const char *tensors[1];
	char extra[512];
	struct it_workers w;
	uint64_t versions[1];
	int leader, victim = -1, acked, at_stop;
	double t0;

	snprintf(extra, sizeof(extra), " --failover-ms 60000%s", args);
	more_args = extra;
	start(NSERVERS, 2, false);
	more_args = "";
	leader = leader_index();
	CU_ASSERT_FATAL(leader >= 0);
	if (backup_only)
		victim = place_on_backup(j, j->name, placed, sizeof(placed), leader);
	for (int i = 1; i < NSERVERS && victim < 0 && !backup_only; i++)
		if (owned(&map0, (uint64_t)((leader + i) % NSERVERS) + 1) > 0)
			victim = (leader + i) % NSERVERS;
	CU_ASSERT_FATAL(victim >= 0);
	tensors[0] = j->name;
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, D_WORKERS, async_worker, clu.servers, (void *)j, -1, NULL), 0);
	for (int r = 0; r < D_WORKERS; r++)	/* (every worker connected) */
		while (atomic_load(&sh->acked[r]) < 1)
			it_sleep_ms(2);
	for (int r = 0; r < D_WORKERS; r++)	/* (every worker connected) */
		while (atomic_load(&sh->acked[r]) < 1)
			it_sleep_ms(2);
	while (acked_total(D_WORKERS) < D_WORKERS * D_PUSHES / 3)
		it_sleep_ms(2);
	at_stop = acked_total(D_WORKERS);
	if (stall_log)
		stall_connected[0] = count_connected(stall_log);
	if (stall_log)
		stall_connected[0] = count_connected(stall_log);
	t0 = it_now_s();
	for (int i = 0; i < NSERVERS; i++)
		if (whole || i == victim)
			CU_ASSERT_EQUAL_FATAL(kill(clu.pid[i], SIGSTOP), 0);
	it_sleep_ms(stall_ms);	/* the stall itself: what the test is about */
	for (int i = 0; i < NSERVERS; i++)
		if (whole || i == victim)
			CU_ASSERT_EQUAL_FATAL(kill(clu.pid[i], SIGCONT), 0);
	acked = async_wait(&w);
	*t_done = it_now_s() - t0;
	if (stall_log)
		stall_connected[1] = count_connected(stall_log);
	if (whole)
		fprintf(stderr, "[every member stalled %d ms after %d pushes; %d acknowledged, the last %.2f s after the "
			"stall began] ", stall_ms, at_stop, acked, *t_done);
	else
		fprintf(stderr, "[member %d stalled %d ms after %d pushes; %d acknowledged, the last %.2f s after the stall "
			"began] ", victim + 1, stall_ms, at_stop, acked, *t_done);
	CU_ASSERT_EQUAL(acked, D_WORKERS * D_PUSHES);
	check_exact(j->name, j->count, acked);
	check_replicas(tensors, 1, versions);
	CU_ASSERT_EQUAL(versions[0], (uint64_t)acked * (j->count / (SHARD / 4)));
	for (uint32_t p = 0; p < NPART; p++) {
		CU_ASSERT_EQUAL(map1.parts[p].owner, map0.parts[p].owner);
		CU_ASSERT_EQUAL(map1.parts[p].epoch, map0.parts[p].epoch);
	}
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
	return victim;
}

/* (d4, d4b) run_stalled with the servers' log (at info) in a file, after
 * `flags`: stall_connected[] holds its count of workers' connections when
 * the stall began and when the last push was acknowledged. */
static void run_stalled_logged(struct async_job *j, const char *flags, bool whole)
{
	char logpath[256], args[300];
	double t_done;
	int fd;

	snprintf(logpath, sizeof(logpath), "%s/rps-it-log.XXXXXX", test_tmpdir());
	fd = mkstemp(logpath);
	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
	snprintf(args, sizeof(args), "%s --log-level info 2>>%s", flags, logpath);
	stall_log = logpath;
	run_stalled(j, D4_STALL_MS, args, false, whole, &t_done);
	stall_log = NULL;
	unlink(logpath);
	fprintf(stderr, "[workers' connections logged: %d before the stall, %d after it] ", stall_connected[0],
		stall_connected[1]);
	CU_ASSERT(stall_connected[0] >= NSERVERS * D_WORKERS);	/* (every worker to every member) */
}

/* The whole cluster stopped longer than the workers wait on a silent
 * server (the longer of 4 s and --failover-ms, here 4 s) and continued:
 * a paused VM, a frozen host of every member.  The workers declare their
 * connections lost, as for a dead host, but the control plane fails
 * nobody over (the leader was not listening either: its failure detector
 * moves every deadline on by its stall), so the partitions are still
 * where they were when the ride-through's wait is over: the workers must
 * dial the same servers again and resend, push ids unchanged.  Every push
 * acknowledged, exact: none lost, none applied twice; the servers' logs
 * show the workers connecting again.  (A lone member stopped that long,
 * with the others listening, is failed over: d3.) */
static void test_cluster_stalled(void)
{
	struct async_job j = { .name = "d4", .count = COUNT, .pushes = D_PUSHES };

	run_stalled_logged(&j, " --failover-ms 4000", true);
	CU_ASSERT(stall_connected[1] > stall_connected[0]);
}

/* A primary stopped 6 s (longer than PROBE_DEAD_MS, 4 s) at --failover-ms
 * 60000, then continued: the workers wait on it, since none of its
 * partitions can fail over before 60 s of silence; they neither call
 * their connections lost nor dial it again (each such redial, at a
 * thousand workers on a starved cluster, cost a connection's handshake
 * and a resend that stale epochs refused).  Exact, nothing moved, no
 * worker connected again. */
static void test_primary_stalled_waited(void)
{
	struct async_job j = { .name = "d4b", .count = COUNT, .pushes = D_PUSHES };

	run_stalled_logged(&j, "", false);
	CU_ASSERT_EQUAL(stall_connected[1], stall_connected[0]);
}

/* A member stalled 3 s, the backup of the partition of a one-shard
 * tensor (place_on_backup): the updates of that primary wait for it.
 * Past 2 s the primary says so at warn level (the servers' stderr, in a
 * file), naming the partition, the tensor and shard, the member, the
 * entry waited for and the one it confirmed; one line a check (every 1 s)
 * at most, not one per update waiting.  Checks run 1 s apart,
 * and none warns once every update is confirmed, before the last push is
 * acknowledged (t_done): each primary of a partition the member backs says
 * at most 1 + (t_done - 2 s) lines.  No stream broke. */
static void test_backup_stalled_warned(void)
{
	struct async_job j = { .name = "d5", .count = COUNT, .pushes = D_PUSHES };
	char logpath[256], args[300], line[1024], tensor[32];
	unsigned long long member, entry, confirmed;
	unsigned part, shard, nwarn = 0, nparsed = 0, nvictim = 0;
	struct rps__layout l;
	unsigned nprimaries = 0, bound;
	uint64_t primaries[NSERVERS];
	double waited, t_done;
	int victim, fd;
	FILE *f;

	snprintf(logpath, sizeof(logpath), "%s/rps-it-log.XXXXXX", test_tmpdir());
	fd = mkstemp(logpath);
	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
	snprintf(args, sizeof(args), " 2>>%s", logpath);	/* (appended: the 3 servers write it) */
	victim = run_stalled(&j, D5_STALL_MS, args, true, false, &t_done);
	for (uint32_t p = 0; p < NPART; p++) {
		unsigned k = 0;

		if (rps__smap_role(&map0, p, (uint64_t)victim + 1) != RPS__SMAP_ROLE_BACKUP)
			continue;
		while (k < nprimaries && primaries[k] != map0.parts[p].owner)
			k++;
		if (k == nprimaries)
			primaries[nprimaries++] = map0.parts[p].owner;
	}
	CU_ASSERT_EQUAL_FATAL(rps__layout_init(&l, j.name, j.count, SHARD / 4, NPART), 0);
	f = fopen(logpath, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, "an update waits"))
			continue;
		nwarn++;
		fprintf(stderr, "[%.*s] ", (int)strcspn(line, "\n"), line);
		if (sscanf(line, "warn: partition %u: tensor '%31[^']' shard %u: an update waits %lf s for member %llu to "
			   "confirm replication entry %llu (it confirmed %llu)", &part, tensor, &shard, &waited, &member,
			   &entry, &confirmed) != 7)
			continue;
		nparsed++;
		/* (over verbs a backup other than the stopped one was seen
		 * confirming late too, for as long as the stall: its lines
		 * are as exact, and not counted against the bound below) */
		nvictim += member == (unsigned long long)victim + 1;
		CU_ASSERT_STRING_EQUAL(tensor, j.name);
		CU_ASSERT(part < NPART && map0.parts[part].owner != member &&
			  rps__smap_role(&map0, part, member) == RPS__SMAP_ROLE_BACKUP);
		CU_ASSERT(shard < l.nshards && rps__shard_server(&l, shard) == part);
		CU_ASSERT(waited >= 2.0 && waited < 30.0);
		CU_ASSERT(entry > confirmed);
	}
	fclose(f);
	unlink(logpath);
	CU_ASSERT_EQUAL(nparsed, nwarn);
	bound = nprimaries * (1 + (unsigned)(t_done > 2.0 ? t_done - 2.0 : 0.0));
	fprintf(stderr, "[%u warning lines, %u naming member %d (at most %u: %u primaries), the last push %.2f s "
		"after the stall began] ", nwarn, nvictim, victim + 1, bound, nprimaries, t_done);
	CU_ASSERT(nvictim >= 1 && nvictim <= bound);
}

/* ---- (d6) a member stopped that a tensor does not use -------------------------- */

#define D6_WORKERS 4		/* ranks 0, 1 push the one-shard tensor; 2, 3 the whole job's */
#define D6_BEFORE 40		/* pushes of the one-shard tensor acknowledged before the stop */
#define D6_DURING 100		/* ... and while the member is stopped */
#define D6_WAIT_S 30.0

static int d6_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct async_job *jobs = arg;

	return async_worker(rank, nworkers, servers, (void *)&jobs[rank < 2 ? 0 : 1], out_fd);
}

/*
 * A member stopped (SIGSTOP, and --failover-ms 60000: never failed over)
 * holds no copy of a one-shard tensor's partition: its primary and its
 * backup are the two others.  Two workers push that tensor, two others a
 * tensor of every partition (whose pushes stall on the stopped member, and
 * whose entries wait for it).  Nothing of the one-shard tensor waits for
 * it, so its pushes go on being acknowledged while it is stopped: D6_DURING
 * of them before it is continued (a path shared with the stopped member's
 * streams, or a loop held up by what waits for it, would stall them for as
 * long as the stop lasts).  Then both exact, nothing moved.  The member is
 * not the Raft leader (whose silence ends every lease).
 */
static void test_other_member_stopped(void)
{
	static char name[32];
	static const char *tensors[2];
	struct async_job jobs[2] = { { .name = name, .count = SHARD / 4 }, { .name = "d6all", .count = COUNT } };
	struct it_workers w;
	uint64_t versions[2];
	int leader, victim, n, acked[2] = { 0, 0 }, at_stop, during;
	double t0;

	more_args = " --failover-ms 60000";
	start(NSERVERS, 2, false);
	more_args = "";
	leader = leader_index();
	CU_ASSERT_FATAL(leader >= 0);
	victim = (leader + 1) % NSERVERS;
	name[0] = 0;
	for (int k = 0; k < 1000 && !name[0]; k++) {
		struct rps__layout l;

		snprintf(name, sizeof(name), "d6-%d", k);
		CU_ASSERT_EQUAL_FATAL(rps__layout_init(&l, name, SHARD / 4, SHARD / 4, NPART), 0);
		if (rps__smap_role(&map0, rps__shard_server(&l, 0), (uint64_t)victim + 1) != RPS__SMAP_ROLE_NONE)
			name[0] = 0;
	}
	CU_ASSERT_FATAL(name[0] != 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, D6_WORKERS, d6_worker, clu.servers, jobs, -1, NULL), 0);
	while (acked_total(2) < D6_BEFORE || atomic_load(&sh->acked[2]) < 5 || atomic_load(&sh->acked[3]) < 5)
		it_sleep_ms(2);
	at_stop = acked_total(2);
	CU_ASSERT_EQUAL_FATAL(kill(clu.pid[victim], SIGSTOP), 0);
	t0 = it_now_s();
	while (acked_total(2) - at_stop < D6_DURING && it_now_s() - t0 < D6_WAIT_S)
		it_sleep_ms(10);
	during = acked_total(2) - at_stop;
	CU_ASSERT_EQUAL(kill(clu.pid[victim], SIGCONT), 0);
	fprintf(stderr, "[member %d stopped after %d pushes of '%s': %d acknowledged in the %.1f s it stayed stopped] ",
		victim + 1, at_stop, name, during, it_now_s() - t0);
	CU_ASSERT(during >= D6_DURING);
	atomic_store(&sh->stop, 1);
	for (int r = 0; r < D6_WORKERS; r++) {
		n = 0;
		CU_ASSERT_EQUAL(it_worker_read(&w, r, &n, sizeof(n)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, r), 0);
		CU_ASSERT_EQUAL(n, atomic_load(&sh->acked[r]));
		acked[r >= 2] += n;
	}
	check_exact(name, SHARD / 4, acked[0]);
	check_exact("d6all", COUNT, acked[1]);
	tensors[0] = name;
	tensors[1] = "d6all";
	check_replicas(tensors, 2, versions);
	CU_ASSERT_EQUAL(versions[0], (uint64_t)acked[0]);
	CU_ASSERT_EQUAL(versions[1], (uint64_t)acked[1] * 2 * NPART);
	for (uint32_t p = 0; p < NPART; p++) {
		CU_ASSERT_EQUAL(map1.parts[p].owner, map0.parts[p].owner);
		CU_ASSERT_EQUAL(map1.parts[p].epoch, map0.parts[p].epoch);
	}
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* ---- (e) a kill during re-replication ------------------------------------------ */

#define E_WORKERS 2
#define BIG_COUNT (2u * 1024 * 1024)	/* fp32: 8 MiB */

static float big_init(size_t i)
{
	return (float)(i % 4093) * 0.5f - 1000.0f;
}

static int create_big(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float *init = malloc(BIG_COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	int ret;

	(void)nworkers;
	(void)arg;
	for (size_t i = 0; i < BIG_COUNT; i++)
		init[i] = big_init(i);
	if ((ret = it_client_connect(servers, 0, 1, 30000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	rps_tensor_opts_init(&o);
	o.count = BIG_COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SGD;
	o.init = init;
	if ((ret = rps_tensor_create(cl, "big", &o, &t)))
		return it_worker_fail(rank, "create big", ret);
	rps_tensor_close(t);
	rps_client_close(cl);
	it_write_all(out_fd, &ret, sizeof(ret));
	free(init);
	return 0;
}

/* What the watcher saw and did. */
struct watch {
	uint64_t joiner;	/* in: the member to watch for */
	pid_t pids[IT_MAX_SERVERS];	/* in: the servers' processes */
	int ret;		/* out: 0, or -ETIMEDOUT */
	uint32_t part;		/* the partition it was being seeded with */
	struct rps__smap_part seen;	/* ... as the map stood then */
	double after;		/* seconds after the watch began */
};

/* Poll every server but the joiner for its map (one channel each) until
 * one shows the joiner being seeded with a partition; SIGKILL that
 * partition's primary, the seed's source, at once. */
static int watcher(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	static char buf[sizeof(struct rps__status_rep) + RPS__SMAP_ENC_MAX + 64];
	static struct rps__smap m;
	struct watch *wt = arg;
	struct rps__ctl *ctl[IT_MAX_SERVERS] = { 0 };
	double t0 = it_now_s();

	(void)rank;
	(void)nworkers;
	(void)servers;
	wt->ret = -ETIMEDOUT;
	while (it_now_s() - t0 < 60) {
		for (int i = 0; i < clu.nservers; i++) {
			struct rps__uri u;
			size_t len = 0;
			int32_t status = 0;

			if ((uint64_t)i + 1 == wt->joiner)
				continue;
			if (!ctl[i] && (rps__uri_parse(clu.uri[i], &u) || rps__ctl_open(&u, 1000, &ctl[i]))) {
				ctl[i] = NULL;
				continue;
			}
			if (rps__ctl_call(ctl[i], RPS__MSG_STATUS, NULL, 0, buf, sizeof(buf), &len, &status, 1000) ||
			    status || len < sizeof(struct rps__status_rep)) {
				rps__ctl_close(ctl[i]);
				ctl[i] = NULL;
				continue;
			}
			if (rps__smap_decode(buf + sizeof(struct rps__status_rep), len - sizeof(struct rps__status_rep),
					     &m))
				continue;
			for (uint32_t p = 0; p < m.npart; p++) {
				uint64_t owner = m.parts[p].owner;

				if (m.parts[p].joining != wt->joiner || owner < 1 || owner > (uint64_t)clu.nservers)
					continue;
				kill(wt->pids[owner - 1], SIGKILL);
				wt->ret = 0;
				wt->part = p;
				wt->seen = m.parts[p];
				wt->after = it_now_s() - t0;
				goto out;
			}
		}
	}
out:
	for (int i = 0; i < clu.nservers; i++)
		rps__ctl_close(ctl[i]);
	it_write_all(out_fd, wt, sizeof(*wt));
	return 0;
}

static void test_kill_during_reseeding(void)
{
	static const struct async_job j = { .name = "w", .count = COUNT };
	static const char *const tensors[] = { "w", "big" };
	struct it_workers cw, w, ww;
	struct watch wt;
	struct rps__smap_part seen;
	uint64_t version, versions[2];
	int joiner, ret = -1, acked, victim, survivor, at;
	float *p;
	size_t bad = 0;

	start(NSERVERS, 3, true);
	for (uint32_t q = 0; q < NPART; q++)
		CU_ASSERT_EQUAL_FATAL(rps__smap_nbackups(&map0, q), 2);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&cw, 1, create_big, clu.servers, NULL, -1, NULL), 0);
	CU_ASSERT_EQUAL(it_worker_read(&cw, 0, &ret, sizeof(ret)), 0);
	CU_ASSERT_EQUAL_FATAL(it_worker_wait(&cw, 0), 0);
	CU_ASSERT_EQUAL_FATAL(ret, 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, E_WORKERS, async_worker, clu.servers, (void *)&j, -1, NULL), 0);
	while (acked_total(E_WORKERS) < 40)
		it_sleep_ms(2);

	/* a member that is not the leader goes and comes back without its
	 * shards; the watcher waits for it to be seeded again */
	joiner = (leader_index() + 1) % NSERVERS;
	memset(&wt, 0, sizeof(wt));
	wt.joiner = (uint64_t)joiner + 1;
	it_server_kill(&clu, joiner);
	for (int i = 0; i < NSERVERS; i++)
		wt.pids[i] = clu.pid[i];
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&ww, 1, watcher, NULL, &wt, -1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, joiner), 0);
	CU_ASSERT_EQUAL(it_worker_read(&ww, 0, &wt, sizeof(wt)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&ww, 0), 0);
	CU_ASSERT_EQUAL_FATAL(wt.ret, 0);
	seen = wt.seen;
	victim = it_member_index(&clu, seen.owner);
	CU_ASSERT_FATAL(victim >= 0 && victim != joiner);
	it_server_kill(&clu, victim);	/* (killed by the watcher: reaped here) */
	/* the partition's other replica: a full one (the joiner had left
	 * every set when it came back) */
	CU_ASSERT_EQUAL(rps__smap_nbackups(&map0, wt.part), 2);
	CU_ASSERT_EQUAL_FATAL(seen.backups[0] != 0 && seen.backups[1] == 0, true);
	survivor = it_member_index(&clu, seen.backups[0]);
	CU_ASSERT_FATAL(survivor >= 0 && survivor != joiner && survivor != victim);
	fprintf(stderr, "[member %d restarted; seeded with partition %u from member %llu (epoch %llu), killed %.3f s "
		"into the watch] ", joiner + 1, wt.part, (unsigned long long)seen.owner,
		(unsigned long long)seen.epoch, wt.after);

	/* training goes on through it */
	at = acked_total(E_WORKERS);
	while (acked_total(E_WORKERS) < at + 40)
		it_sleep_ms(2);
	atomic_store(&sh->stop, 1);
	acked = async_wait(&w);
	check_exact("w", COUNT, acked);
	p = pull("big", BIG_COUNT, &version);
	for (size_t i = 0; i < BIG_COUNT; i++)
		if (p[i] != big_init(i) && bad++ < 4)
			fprintf(stderr, "big[%zu] = %g, created as %g\n", i, (double)p[i], (double)big_init(i));
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, 0);
	free(p);

	check_replicas(tensors, 2, versions);
	CU_ASSERT_EQUAL(versions[0], (uint64_t)acked * 2 * NPART);
	CU_ASSERT_EQUAL(versions[1], 0);
	/* the surviving full replica has it, not the joiner: one FAILOVER
	 * (seeding the joiner again keeps the epoch; had the joiner been
	 * promoted, it would have had to fail over once more) */
	CU_ASSERT_EQUAL(map1.parts[wt.part].owner, seen.backups[0]);
	CU_ASSERT_EQUAL(map1.parts[wt.part].epoch, seen.epoch + 1);
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* ---- the replica set shrinks under the stream ---------------------------------- */

/* psctl set-replicas 2 while workers push at R = 3: every partition's epoch
 * moves on (REPLICA_DROP) with its primary unchanged, and entries the
 * primary stamped with the epoch before reach the remaining backup after
 * it applied the drop: they are the same primary's, to be applied, not
 * refused.  Every push completes, values exact, replicas equal. */
static void test_set_shrinks_under_stream(void)
{
	static const struct async_job j = { .name = "s", .count = COUNT };
	static const char *const tensors[] = { "s" };
	char out[4096], err[4096];
	struct it_workers w;
	uint64_t versions[1];
	int acked, at, rc;

	start(NSERVERS, 3, false);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, E_WORKERS, async_worker, clu.servers, (void *)&j, -1, NULL), 0);
	while (acked_total(E_WORKERS) < 40)
		it_sleep_ms(2);
	rc = it_psctl(&clu, 40000, out, sizeof(out), err, sizeof(err), "set-replicas 2");
	if (rc)
		fprintf(stderr, "psctl set-replicas 2: %s%s", out, err);
	CU_ASSERT_EQUAL(rc, 0);
	replicas = 2;
	CU_ASSERT_EQUAL(it_wait_settled(&clu, 2, SETTLE_MS, &map1), 0);
	at = acked_total(E_WORKERS);
	while (acked_total(E_WORKERS) < at + 40)
		it_sleep_ms(2);
	atomic_store(&sh->stop, 1);
	acked = async_wait(&w);
	check_exact("s", COUNT, acked);
	check_replicas(tensors, 1, versions);
	CU_ASSERT_EQUAL(versions[0], (uint64_t)acked * 2 * NPART);
	for (uint32_t p = 0; p < NPART; p++) {
		CU_ASSERT_EQUAL(map1.parts[p].owner, map0.parts[p].owner);
		CU_ASSERT_EQUAL(map1.parts[p].epoch, map0.parts[p].epoch + 1);
	}
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "(a) sync Adam: a primary killed mid-step: bit-identical to the job without the kill",
		  test_sync_adam_primary_killed },
		{ "(h) sync: a rank gone mid-step, then a primary killed before its replacement: the step completes, exact",
		  test_sync_orphan_then_primary_killed },
		{ "(j) a planned switch (psctl move) to a backup killed a moment before: aborted, nothing lost, exact",
		  test_switch_to_killed_backup },
		{ "(d) async: the Raft leader, a primary, killed: exact, its partitions on their backups",
		  test_leader_primary_killed },
		{ "(d2) async: the Raft leader, a primary, stopped (SIGSTOP), not killed: exact, its partitions on their backups",
		  test_leader_primary_stopped },
		{ "(d3) async: a primary, not the leader, stopped (SIGSTOP): exact, its partitions on their backups",
		  test_primary_stopped },
		{ "(d7) a tensor opened while a primary is stopped (SIGSTOP): rides through its failover, exact",
		  test_open_while_primary_stopped },
		{ "(d8) a client connecting while a primary is stopped, it first in its list: within its timeout_ms, "
		  "then rides through, exact", test_connect_while_primary_stopped },
		{ "(d4) async: the whole cluster stalled 6 s (SIGSTOP, SIGCONT), nobody failed over: dialed again, exact",
		  test_cluster_stalled },
		{ "(d4b) async: a primary stalled 6 s at --failover-ms 60000: waited on, not dialed again, exact",
		  test_primary_stalled_waited },
		{ "(d5) async: a backup stalled 3 s: its primary warns, one line a check, naming it; exact",
		  test_backup_stalled_warned },
		{ "(d6) async: a member stopped that holds no copy of a tensor: its pushes go on meanwhile; exact",
		  test_other_member_stopped },
		{ "(e) --replicas 3: the seed's source killed while a restarted server is seeded",
		  test_kill_during_reseeding },
		{ "(g) set-replicas 3 -> 2 under the stream: the same primary's entries applied, exact",
		  test_set_shrinks_under_stream },
	};
	const struct cutest_suite suites[] = {
		{ "failover, 3 servers", NULL, NULL, it_test_setup, it_test_teardown, tests, CUTEST_COUNT(tests) },
	};
	int ret;

	if ((ret = it_prog_init("it_failover", TEST_WATCHDOG_S, &clu, &clu_up)))
		return ret;
	if (!(sh = it_shared_map("it_failover", sizeof(*sh))))
		return 1;
	return cutest_run(suites, CUTEST_COUNT(suites));
}
