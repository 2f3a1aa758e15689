/*
 * it_scale.c - a cluster of many servers and many workers, emulated on one
 * machine (`make check-scale`; CI runs a smaller one).
 *
 * RPS_SCALE_SERVERS rdmapsd processes (default 64) on loopback form one
 * cluster (5 Raft voters, the rest learners; R = 2, the default from 2
 * servers on) with the most partitions a map holds and 4 KiB shards;
 * RPS_SCALE_PROCS worker processes (default 8) each run RPS_SCALE_THREADS
 * clients (default 8), one thread each, every client its own rps_client_t
 * with a connection to every server: workers = procs x threads ranks.
 *
 *  (1) async (SGD, lr 1): every worker pushes -1s RPS_SCALE_PUSHES times (default
 *      20; 1 measures connects, first pushes and memory at sizes where 20
 *      would take long) into a tensor
 *      with one shard in every partition: every element ends equal to
 *      workers x pushes, the version too.  Printed: the slowest connect,
 *      the slowest first push, every server's RSS (largest and sum).
 *  (2) sync SGD (lr 1) of all ranks, SYNC_STEPS steps of small integer
 *      gradients that depend on rank, step and element: bit-identical to
 *      the reference this file computes (sums of integers are exact in
 *      fp32 in any order).
 *  (3) async again, and a member that is not the Raft leader is killed
 *      with SIGKILL mid-job: its partitions fail over to their backups,
 *      every push of every worker is acknowledged, every element exact.
 *      Printed: how long until the map no longer names the dead member as
 *      any partition's primary.
 *
 * The figures are printed, never asserted (perf/RESULTS.md keeps them).
 */
#include "config.h"
#include "cluster.h"

#include <CUnit/Basic.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"
#include "proto/smap.h"
#include "lib/cutest.h"

#define NPART RPS__SMAP_MAX_PART
#define SHARD_ELEMS 1024u		/* --shard-size 4096, fp32 */
#define COUNT (NPART * SHARD_ELEMS)	/* one shard in every partition */
#define ASYNC_PUSHES 20	/* RPS_SCALE_PUSHES */
#define KILL_PUSHES 60
#define SYNC_STEPS 5
/* A worker's timeout_ms (RPS_SCALE_TIMEOUT_MS): its pushes wait behind
 * every other worker's for each shard's lock, so at a thousand workers on
 * 2 cores the last one waits minutes. */
#define CLIENT_TIMEOUT_MS 120000
static int client_timeout_ms = CLIENT_TIMEOUT_MS;
#define SETTLE_MS 180000
/* Tens of servers share 2 cores here: a member starved for a second is
 * not dead, so the failure detector gets RPS_SCALE_FAILOVER_MS (default
 * 10 s; a cluster of hosts keeps rdmapsd's default, 1 s).  The failover
 * time printed is against that. */
#define SERVER_ARGS "--partitions 256 --shard-size 4096 --slots 2 --fsync none --max-connections 4096 --threads 1"
static int failover_ms;

static struct it_cluster clu;
static bool clu_up;
static int nservers, nprocs, nthreads;

/* What the workers tell the parent while they run (MAP_SHARED). */
struct shared {
	atomic_int acked;		/* pushes acknowledged, all workers */
	atomic_int connected;		/* clients connected, all workers */
};
static struct shared *sh;

static int env_int(const char *name, int dflt, int lo, int hi)
{
	const char *e = getenv(name);
	int v = e && *e ? atoi(e) : dflt;

	return v < lo ? lo : v > hi ? hi : v;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the workers: threads of worker processes ----------------------------------- */

enum job_kind { JOB_ASYNC, JOB_SYNC, JOB_KILL };

struct job {
	enum job_kind kind;
	const char *name;
	int pushes;		/* per client (sync: steps) */
};

/* What one worker process reports: its clients' slowest connect and first
 * push (s), pushes acknowledged, and failures (each printed). */
struct report {
	double connect_s, first_push_s;
	int acked, failed;
};

struct client_thread {
	pthread_t tid;
	const struct job *j;
	const char *servers;
	int rank, nranks;
	struct report rep;
};

/* Sync: rank r's gradient at step s, element i: a small integer. */
static float sync_grad(int r, int s, uint32_t i)
{
	return (float)((int)((r * 7u + s * 13u + i) % 9u) - 4);
}

static void *client_main(void *arg)
{
	struct client_thread *ct = arg;
	const struct job *j = ct->j;
	float *g = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl = NULL;
	rps_tensor_t *t = NULL;
	double t0;
	int s, ret;

	if (!g) {
		ct->rep.failed++;
		return NULL;
	}
	t0 = now_s();
	if ((ret = it_client_connect(ct->servers, ct->rank, ct->nranks, client_timeout_ms, &cl))) {
		it_worker_fail(ct->rank, "connect", ret);
		ct->rep.failed++;
		goto out;
	}
	ct->rep.connect_s = now_s() - t0;
	atomic_fetch_add(&sh->connected, 1);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = j->kind == JOB_SYNC ? RPS_MODE_SYNC : RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SGD;
	o.lr = 1.0f;
	if ((ret = rps_tensor_create(cl, j->name, &o, &t))) {
		it_worker_fail(ct->rank, "create", ret);
		ct->rep.failed++;
		goto out;
	}
	for (s = 0; s < j->pushes; s++) {
		for (uint32_t i = 0; i < COUNT; i++)
			g[i] = j->kind == JOB_SYNC ? sync_grad(ct->rank, s, i) : -1.0f;
		t0 = now_s();
		if ((ret = rps_push(t, g, COUNT * sizeof(float)))) {
			it_worker_fail(ct->rank, "push", ret);
			ct->rep.failed++;
			goto out;
		}
		if (!s)
			ct->rep.first_push_s = now_s() - t0;
		ct->rep.acked++;
		atomic_fetch_add(&sh->acked, 1);
	}
out:
	if (t)
		rps_tensor_close(t);
	if (cl)
		rps_client_close(cl);
	free(g);
	return NULL;
}

/* A worker process: nthreads clients, ranks rank * nthreads + k. */
static int worker_proc(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	struct client_thread *ct = calloc((size_t)nthreads, sizeof(*ct));
	struct report rep = { 0 };
	int k;

	if (!ct)
		return 1;
	for (k = 0; k < nthreads; k++) {
		ct[k].j = arg;
		ct[k].servers = servers;
		ct[k].rank = rank * nthreads + k;
		ct[k].nranks = nworkers * nthreads;
		if (pthread_create(&ct[k].tid, NULL, client_main, &ct[k])) {
			rep.failed++;
			ct[k].tid = 0;
		}
	}
	for (k = 0; k < nthreads; k++) {
		if (!ct[k].tid)
			continue;
		pthread_join(ct[k].tid, NULL);
		rep.connect_s = ct[k].rep.connect_s > rep.connect_s ? ct[k].rep.connect_s : rep.connect_s;
		rep.first_push_s = ct[k].rep.first_push_s > rep.first_push_s ? ct[k].rep.first_push_s
									    : rep.first_push_s;
		rep.acked += ct[k].rep.acked;
		rep.failed += ct[k].rep.failed;
	}
	free(ct);
	it_write_all(out_fd, &rep, sizeof(rep));
	return rep.failed ? 1 : 0;
}

/* Start the worker processes. */
static void workers_start(struct it_workers *w, const struct job *j)
{
	atomic_store(&sh->acked, 0);
	atomic_store(&sh->connected, 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(w, nprocs, worker_proc, clu.servers, (void *)j, -1, NULL), 0);
}

/* Reap them: every client connected and pushed all its pushes.  The
 * pushes acknowledged in all. */
static int workers_collect(struct it_workers *w, const struct job *j, struct report *all)
{
	memset(all, 0, sizeof(*all));
	for (int r = 0; r < nprocs; r++) {
		struct report rep = { 0 };

		CU_ASSERT_EQUAL(it_worker_read(w, r, &rep, sizeof(rep)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(w, r), 0);
		CU_ASSERT_EQUAL(rep.failed, 0);
		CU_ASSERT_EQUAL(rep.acked, nthreads * j->pushes);
		all->connect_s = rep.connect_s > all->connect_s ? rep.connect_s : all->connect_s;
		all->first_push_s = rep.first_push_s > all->first_push_s ? rep.first_push_s : all->first_push_s;
		all->acked += rep.acked;
		all->failed += rep.failed;
	}
	return all->acked;
}

/* ---- what the servers use -------------------------------------------------------- */

/* A running server's resident set (KiB), or 0. */
static long server_rss_kib(int i)
{
	char path[64], line[256];
	long kib = 0;
	FILE *f;

	if (!clu.pid[i])
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)clu.pid[i]);
	if (!(f = fopen(path, "r")))
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			kib = atol(line + 6);
	fclose(f);
	return kib;
}

static void print_rss(const char *when)
{
	long most = 0, sum = 0;

	for (int i = 0; i < nservers; i++) {
		long k = server_rss_kib(i);
		most = k > most ? k : most;
		sum += k;
	}
	fprintf(stderr, "[server RSS %s: largest %.1f MiB, all %d servers %.1f MiB] ", when, most / 1024.0, nservers,
		sum / 1024.0);
}

/* ---- the tests ------------------------------------------------------------------- */

static float *pulled;

static int suite_init(void)
{
	static char args[256];
	struct it_server_opts o = { .extra_args = args };
	double t0 = now_s();
	int ret;

	snprintf(args, sizeof(args), "%s --failover-ms %d --tick-ms %d", SERVER_ARGS, failover_ms,
		 failover_ms >= 10000 ? 100 : 50);

	if (!(pulled = malloc(COUNT * sizeof(float))))
		return -1;
	if ((ret = it_cluster_start_opts(&clu, nservers, &o))) {
		fprintf(stderr, "it_scale: starting %d servers: %d\n", nservers, ret);
		return -1;
	}
	clu_up = true;
	if ((ret = it_wait_settled(&clu, 2, SETTLE_MS, NULL))) {
		fprintf(stderr, "it_scale: the map of %d servers did not settle\n", nservers);
		return -1;
	}
	fprintf(stderr, "\n[%d servers up, one map of %u partitions, every one backed: %.1f s] ", nservers, NPART,
		now_s() - t0);
	return 0;
}

static int suite_clean(void)
{
	if (clu_up)
		it_cluster_stop(&clu);
	clu_up = false;
	free(pulled);
	return 0;
}

/* Pull name fresh, every element equal to want; its version too. */
static void check_all_equal(const char *name, float want, uint64_t version_want)
{
	uint64_t version = 0;
	uint32_t bad = 0;

	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, name, pulled, COUNT, 60000, &version), 0);
	for (uint32_t i = 0; i < COUNT; i++)
		bad += pulled[i] != want;
	if (bad)
		fprintf(stderr, "'%s': %u of %u elements differ from %g (element 0: %g)\n", name, bad, COUNT,
			(double)want, (double)pulled[0]);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(version, version_want);
}

/* psctl status names every member with its Raft role once the leader
 * added them all: 5 voters (one the leader), the rest learners (a reply
 * naming more than 16 was refused before the STATUS reply grew to the
 * largest map).  The map settles first; the learners join the Raft
 * configuration one entry each after it. */
static void test_status(void)
{
	static char out[256 * 1024], copy[sizeof(out)], err[4096];
	int voters = nservers < 5 ? nservers : 5;
	double deadline = now_s() + 60;
	int rc, rows, leaders, followers, learners;

	for (;;) {
		char *line, *save = NULL;

		rc = it_psctl(&clu, 60000, out, sizeof(out), err, sizeof(err), "status");
		if (rc)
			fprintf(stderr, "psctl status: %s\n", err);
		CU_ASSERT_EQUAL_FATAL(rc, 0);
		memcpy(copy, out, sizeof(out));
		rows = leaders = followers = learners = 0;
		for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
			if (!isdigit((unsigned char)line[0]))
				continue;
			rows++;
			leaders += strstr(line, " leader ") != NULL;
			followers += strstr(line, " follower ") != NULL;
			learners += strstr(line, " learner ") != NULL;
		}
		if (rows == nservers && leaders == 1 && followers == voters - 1 && learners == nservers - voters)
			break;
		if (now_s() > deadline) {
			fprintf(stderr, "\n%s\n", out);
			break;
		}
		usleep(500000);
	}
	CU_ASSERT_EQUAL(rows, nservers);
	CU_ASSERT_EQUAL(leaders, 1);
	CU_ASSERT_EQUAL(followers, voters - 1);
	CU_ASSERT_EQUAL(learners, nservers - voters);
}

/* Peers only where needed: a voter holds a connection with every other
 * member (any voter may come to lead, and the leader reaches everyone); a
 * learner with the voters and with the members it shares a partition with
 * (moves, seeds, switches), no other: two learners that share nothing
 * hold no 2 MiB of buffers for each other.  Each member's count of peer
 * connections (psctl status PEERS) equals what its own map and Raft
 * configuration call for, once the dials are done. */
static void test_peers_where_needed(void)
{
	struct it_peers_tally t;

	CU_ASSERT_EQUAL(it_peers_as_wanted(&clu, 60, &t), 0);
	fprintf(stderr, "[peer connections: a voter %u, a learner %.1f on average, of %d members] ", t.voter_max,
		t.nlearners ? (double)t.learner_sum / t.nlearners : 0.0, nservers);
	if (nservers > 5)
		CU_ASSERT(t.nlearners > 0 && t.learner_sum < t.nlearners * (uint32_t)(nservers - 1));
}

static void test_async_exact(void)
{
	const struct job j = { .kind = JOB_ASYNC, .name = "scale-async",
			       .pushes = env_int("RPS_SCALE_PUSHES", ASYNC_PUSHES, 1, 1000) };
	struct it_workers w;
	struct report all;
	double t0 = now_s();
	int acked;

	print_rss("before the workers");
	workers_start(&w, &j);
	acked = workers_collect(&w, &j, &all);
	fprintf(stderr, "[%d workers x %d servers: slowest connect %.2f s, slowest first push %.3f s, "
		"%d pushes of %u KiB in %.1f s] ", nprocs * nthreads, nservers, all.connect_s, all.first_push_s,
		acked, COUNT * 4u / 1024u, now_s() - t0);
	print_rss("after");
	check_all_equal(j.name, (float)acked, (uint64_t)acked);
}

static void test_sync_exact(void)
{
	static const struct job j = { .kind = JOB_SYNC, .name = "scale-sync", .pushes = SYNC_STEPS };
	int nranks = nprocs * nthreads;
	struct it_workers w;
	struct report all;
	uint32_t bad = 0;
	uint64_t version = 0;
	double t0 = now_s();

	workers_start(&w, &j);
	workers_collect(&w, &j, &all);
	fprintf(stderr, "[%d ranks, %d sync steps in %.1f s] ", nranks, SYNC_STEPS, now_s() - t0);
	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, j.name, pulled, COUNT, 60000, &version), 0);
	CU_ASSERT_EQUAL(version, (uint64_t)SYNC_STEPS);
	for (uint32_t i = 0; i < COUNT; i++) {
		/* the reference: SGD at lr 1 from zeros subtracts each step's sum */
		float want = 0.0f;
		for (int s = 0; s < SYNC_STEPS; s++) {
			float sum = 0.0f;
			for (int r = 0; r < nranks; r++)
				sum += sync_grad(r, s, i);
			want -= sum;
		}
		bad += memcmp(&pulled[i], &want, sizeof(want)) != 0;
	}
	if (bad)
		fprintf(stderr, "'%s': %u of %u elements differ from the reference\n", j.name, bad, COUNT);
	CU_ASSERT_EQUAL(bad, 0);
}

/* Does map m name member id as the primary of any partition? */
static bool owns_any(const struct rps__smap *m, uint64_t id)
{
	for (uint32_t p = 0; p < m->npart; p++)
		if (m->parts[p].owner == id)
			return true;
	return false;
}

static void test_member_killed(void)
{
	static const struct job j = { .kind = JOB_KILL, .name = "scale-kill", .pushes = KILL_PUSHES };
	static struct rps__smap m;
	struct it_member st;
	struct it_workers w;
	struct report all;
	double t_kill, failed_over = -1;
	int victim = -1, asker, acked, i;

	/* a member that is not the Raft leader, and owns partitions */
	for (i = nservers - 1; i >= 0 && victim < 0; i--)
		if (it_member_status(&clu, i, &st, &m) == 0 && !st.leading && owns_any(&m, (uint64_t)i + 1))
			victim = i;
	CU_ASSERT_FATAL(victim >= 0);
	asker = (victim + 1) % nservers;
	workers_start(&w, &j);
	while (atomic_load(&sh->acked) < nprocs * nthreads * KILL_PUSHES / 3)
		usleep(2000);
	it_server_kill(&clu, victim);
	t_kill = now_s();
	while (now_s() - t_kill < 120) {
		if (it_member_status(&clu, asker, &st, &m) == 0 && !owns_any(&m, (uint64_t)victim + 1)) {
			failed_over = now_s() - t_kill;
			break;
		}
		usleep(20000);
	}
	acked = workers_collect(&w, &j, &all);
	fprintf(stderr, "[member %d of %d killed after %d pushes: its partitions on their backups %.2f s later "
		"(--failover-ms %d); %d pushes acknowledged] ", victim + 1, nservers,
		nprocs * nthreads * KILL_PUSHES / 3, failed_over, failover_ms, acked);
	CU_ASSERT(failed_over >= 0);
	check_all_equal(j.name, (float)acked, (uint64_t)acked);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "psctl status names every member and its Raft role", test_status },
		{ "peers only where needed: a learner connects to the voters and its partitions' members",
		  test_peers_where_needed },
		{ "async: every worker pushes to every server, exact", test_async_exact },
		{ "sync: every rank's steps, bit-identical to the reference", test_sync_exact },
		{ "async: a member killed mid-job fails over, exact", test_member_killed },
	};
	char name[96];
	struct rlimit rl;
	int ret;

	nservers = env_int("RPS_SCALE_SERVERS", 64, 3, IT_MAX_SERVERS);
	nprocs = env_int("RPS_SCALE_PROCS", 8, 1, IT_MAX_WORKERS);
	nthreads = env_int("RPS_SCALE_THREADS", 8, 1, 256);
	failover_ms = env_int("RPS_SCALE_FAILOVER_MS", 10000, 1000, 600000);
	client_timeout_ms = env_int("RPS_SCALE_TIMEOUT_MS", CLIENT_TIMEOUT_MS, 1000, 3600000);
	/* a server holds a connection per worker and per peer, a worker
	 * process one per server per client: past the usual 1024 */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if ((ret = it_prog_init("it_scale", 1800, &clu, &clu_up)))
		return ret;
	if (!(sh = it_shared_map("it_scale", sizeof(*sh))))
		return 1;
	snprintf(name, sizeof(name), "%d servers x %d workers (%d processes x %d clients)", nservers,
		 nprocs * nthreads, nprocs, nthreads);
	{
		const struct cutest_suite suites[] = {
			{ name, suite_init, suite_clean, NULL, NULL, tests, CUTEST_COUNT(tests) },
		};

		return cutest_run(suites, CUTEST_COUNT(suites));
	}
}
