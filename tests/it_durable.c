/*
 * it_durable.c - what a restart of rdmapsd keeps and what it says it lost
 * (doc/operations.md "Server death, without replicas", "The whole cluster
 * stopped and started again"), with real rdmapsd processes on loopback TCP,
 * each with its --data-dir kept across restarts.
 *
 *  - R = 1: a server stopped with SIGTERM, killed with SIGKILL, and stopped
 *    with SIGTERM again after a restore (psctl restore), each time started
 *    again with the same --data-dir: every partition it owned is LOST in
 *    the map, and a pull, an open or a create touching it fails with
 *    -ENODATA, never zeros; the checkpoint restores it exactly.  (On the
 *    base, the log replayed after a restore had the restore's CLEAR_LOST:
 *    the restarted server took it for a restore of its own and served
 *    zeros.)  One-shard tensors outside the lost partitions open and pull
 *    exactly meanwhile.
 *  - R = 2, the whole cluster stopped with SIGTERM and started again: no
 *    copy survived, so every partition is LOST (not failed over from one
 *    empty server to the other, nor served from zeros); the worker is told
 *    in one line that the parameters are gone and how to get them back;
 *    the checkpoint restores them exactly.
 *  - R = 2: a checkpoint restored into a new cluster, then a primary
 *    killed and restarted: its partitions fail over to backups that hold
 *    the restore (on the base they had no copy of the restored tensor).
 *  - Rolling restarts (three servers, R = 2): under a worker pushing +1
 *    asynchronously, servers are killed with SIGKILL and restarted, one at
 *    a time, on a fixed schedule; no partition is ever lost and at the end
 *    every element equals the pushes acknowledged.
 */
#include "config.h"
#include "cluster.h"
#include "proto/shard.h"
#include "proto/smap.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"

#define NPART 4
#define COUNT 65536u	/* fp32: 64 shards of 4 KiB, 16 per partition */
#define PUSHES 5
#define ARGS "--partitions 4 --shard-size 4096 --slots 4 --tick-ms 20 --fsync none --failover-ms 1000"
#define PSCTL_MS 40000
#define SETTLE_MS 30000

static struct it_cluster clu;
static bool clu_up;
static char out[65536], err[8192];

/* ---- workers ---------------------------------------------------------------- */

static void opts_async(struct rps_tensor_opts *o, uint32_t count)
{
	rps_tensor_opts_init(o);
	o->count = count;
	o->mode = RPS_MODE_ASYNC;
	o->optimizer = RPS_OPT_SGD;
	o->lr = 1.0f;	/* gradient -1: every push adds exactly 1 */
}

/* Create "w" and push -1 `*(int *)arg` times. */
static int pusher(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float *g = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	int ret, k;

	(void)out_fd;
	if (!g)
		return 1;
	for (uint32_t i = 0; i < COUNT; i++)
		g[i] = -1.0f;
	if ((ret = it_client_connect(servers, rank, nworkers, 20000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	opts_async(&o, COUNT);
	if ((ret = rps_tensor_create(cl, "w", &o, &t)))
		return it_worker_fail(rank, "create", ret);
	for (k = 0; k < *(int *)arg; k++)
		if ((ret = rps_push(t, g, COUNT * sizeof(float))))
			return it_worker_fail(rank, "push", ret);
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	return 0;
}

/* What a fresh worker sees of "w": open (then pull), and create (then
 * pull): each call's result, the elements equal to `want`, to 0, and
 * neither; the first error's text. */
struct probe {
	int open_ret, open_pull_ret, create_ret, create_pull_ret;
	uint32_t n_want, n_zero, n_other;
	char why[512];
};

static void probe_pull(rps_tensor_t *t, float want, float *buf, int *ret, struct probe *r)
{
	*ret = rps_pull(t, buf, COUNT * sizeof(float), NULL);
	if (*ret) {
		if (!r->why[0])
			snprintf(r->why, sizeof(r->why), "%s", rps_last_error());
		return;
	}
	for (uint32_t i = 0; i < COUNT; i++) {
		if (buf[i] == want)
			r->n_want++;
		else if (buf[i] == 0.0f)
			r->n_zero++;
		else
			r->n_other++;
	}
}

static int prober(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float want = *(float *)arg;
	float *buf = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	struct probe r;
	rps_client_t *cl;
	rps_tensor_t *t = NULL;
	int ret;

	memset(&r, 0, sizeof(r));
	r.open_pull_ret = r.create_pull_ret = 1;	/* (not tried) */
	if (!buf)
		return 1;
	if ((ret = it_client_connect(servers, rank, nworkers, 5000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	r.open_ret = rps_tensor_open(cl, "w", &t);
	if (r.open_ret && !r.why[0])
		snprintf(r.why, sizeof(r.why), "%s", rps_last_error());
	if (!r.open_ret) {
		probe_pull(t, want, buf, &r.open_pull_ret, &r);
		rps_tensor_close(t);
		t = NULL;
	}
	opts_async(&o, COUNT);
	r.create_ret = rps_tensor_create(cl, "w", &o, &t);
	if (r.create_ret && !r.why[0])
		snprintf(r.why, sizeof(r.why), "%s", rps_last_error());
	if (!r.create_ret) {
		probe_pull(t, want, buf, &r.create_pull_ret, &r);
		rps_tensor_close(t);
	}
	rps_client_close(cl);
	free(buf);
	return it_write_all(out_fd, &r, sizeof(r)) ? 1 : 0;
}

static void run_pushes(int n)
{
	struct it_workers w;

	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, pusher, clu.servers, &n, -1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(it_worker_wait(&w, 0), 0);
}

static void probe(float want, struct probe *r)
{
	struct it_workers w;

	memset(r, 0, sizeof(*r));
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, prober, clu.servers, &want, -1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(it_worker_read(&w, 0, r, sizeof(*r)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	fprintf(stderr, "[probe: open %d pull %d, create %d pull %d: %u = %g, %u zeros, %u other%s%s] ", r->open_ret,
		r->open_pull_ret, r->create_ret, r->create_pull_ret, r->n_want, want, r->n_zero, r->n_other,
		r->why[0] ? ": " : "", r->why);
}

/* Every element is `want`, through an open and through a create. */
static void expect_exact(float want)
{
	struct probe r;

	probe(want, &r);
	CU_ASSERT_EQUAL(r.open_ret, 0);
	CU_ASSERT_EQUAL(r.open_pull_ret, 0);
	CU_ASSERT_EQUAL(r.create_ret, 0);
	CU_ASSERT_EQUAL(r.create_pull_ret, 0);
	CU_ASSERT_EQUAL(r.n_want, 2 * COUNT);
	CU_ASSERT_EQUAL(r.n_zero, 0);
	CU_ASSERT_EQUAL(r.n_other, 0);
}

/* Nothing of "w" is served: every way in fails with -ENODATA and says how
 * to get it back, never a value. */
static void expect_lost(void)
{
	struct probe r;

	probe(1.0f, &r);
	CU_ASSERT_EQUAL(r.n_want + r.n_zero + r.n_other, 0);	/* never zeros */
	CU_ASSERT(r.open_ret == -ENODATA || (r.open_ret == 0 && r.open_pull_ret == -ENODATA));
	CU_ASSERT(r.create_ret == -ENODATA || (r.create_ret == 0 && r.create_pull_ret == -ENODATA));
	CU_ASSERT_PTR_NOT_NULL(strstr(r.why, "psctl restore"));
	CU_ASSERT_PTR_NOT_NULL(strstr(r.why, "forget-lost"));
}

/* Small tensors (one shard each), "small-0".."small-<NSMALL-1>": created
 * with PUSHES pushes each; then, in a fresh worker, each opened and pulled:
 * its result (0 or the error) and whether it pulled exactly PUSHES. */
#define NSMALL 8
#define SMALL_COUNT 1024u	/* one 4 KiB shard */

struct small_rep {
	int ret[NSMALL];
	int exact[NSMALL];
};

static int smaller(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	bool create = *(int *)arg;
	float g[SMALL_COUNT], buf[SMALL_COUNT];
	struct rps_tensor_opts o;
	struct small_rep r;
	rps_client_t *cl;
	int ret;

	memset(&r, 0, sizeof(r));
	for (uint32_t i = 0; i < SMALL_COUNT; i++)
		g[i] = -1.0f;
	if ((ret = it_client_connect(servers, rank, nworkers, 5000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	opts_async(&o, SMALL_COUNT);
	for (int k = 0; k < NSMALL; k++) {
		char name[32];
		rps_tensor_t *t;

		snprintf(name, sizeof(name), "small-%d", k);
		r.ret[k] = create ? rps_tensor_create(cl, name, &o, &t) : rps_tensor_open(cl, name, &t);
		if (r.ret[k])
			continue;
		for (int s = 0; create && !r.ret[k] && s < PUSHES; s++)
			r.ret[k] = rps_push(t, g, sizeof(g));
		if (!r.ret[k])
			r.ret[k] = rps_pull(t, buf, sizeof(buf), NULL);
		r.exact[k] = !r.ret[k];
		for (uint32_t i = 0; !r.ret[k] && i < SMALL_COUNT; i++)
			r.exact[k] &= buf[i] == (float)PUSHES;
		rps_tensor_close(t);
	}
	rps_client_close(cl);
	return it_write_all(out_fd, &r, sizeof(r)) ? 1 : 0;
}

static void run_small(bool create, struct small_rep *r)
{
	struct it_workers w;
	int c = create;

	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, smaller, clu.servers, &c, -1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(it_worker_read(&w, 0, r, sizeof(*r)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
}

/* ---- the cluster ------------------------------------------------------------------ */

static void start(int n, const char *args)
{
	struct it_server_opts o = { .extra_args = args, .data_dir = 1 };

	it_test_setup();
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, n, &o), 0);
	clu_up = true;
}

static void test_teardown(void)
{
	it_test_teardown();
	if (clu_up)
		CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* SIGTERM server i and wait: it exits 0. */
static void term(int i)
{
	CU_ASSERT_EQUAL_FATAL(kill(clu.pid[i], SIGTERM), 0);
	CU_ASSERT_EQUAL_FATAL(it_server_wait_exit(&clu, i, 30000), 0);
}

/* Wait until server `at`'s map, at an index every running server applied,
 * marks lost exactly the partitions in `mask` (bit p), with member `with`
 * named (0: any).  0, or -ETIMEDOUT (the map printed). */
static int wait_lost(int at, uint32_t mask, uint64_t with)
{
	static struct rps__smap m;
	struct it_member st;

	for (double t0 = it_now_s(); it_now_s() - t0 < SETTLE_MS / 1000.0; it_sleep_ms(50)) {
		uint32_t got = 0;
		bool named = true;

		if (it_member_status(&clu, at, &st, &m) || !st.leader)
			continue;
		for (uint32_t p = 0; p < m.npart; p++)
			if (m.parts[p].lost) {
				got |= 1u << p;
				named &= !with || m.parts[p].lost == with;
			}
		if (got == mask && named)
			return 0;
	}
	for (uint32_t p = 0; p < m.npart; p++)
		fprintf(stderr, "partition %u: owner %llu, lost %llu, backup %llu\n", p,
			(unsigned long long)m.parts[p].owner, (unsigned long long)m.parts[p].lost,
			(unsigned long long)m.parts[p].backups[0]);
	return -ETIMEDOUT;
}

static uint32_t owned_mask(const struct rps__smap *m, uint64_t id)
{
	uint32_t mask = 0;

	for (uint32_t p = 0; p < m->npart; p++)
		if (m->parts[p].owner == id)
			mask |= 1u << p;
	return mask;
}

static void psctl_ok(const char *cmd)
{
	int rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "%s", cmd);

	if (rc)
		fprintf(stderr, "psctl %s: exit %d: %s%s", cmd, rc, out, err);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
}

/* ---- item 1: a clean stop, a restart after a restore --------------------------------- */

/*
 * R = 1, two servers.  Server 2 is stopped three times and started again
 * with the same --data-dir: by SIGTERM, by SIGKILL after a restore, and by
 * SIGTERM after another restore.  Each time the partitions it owned are
 * LOST (member 2 named), every way in fails with -ENODATA, and a restore
 * brings back exactly what the checkpoint holds.
 */
static void test_r1_restarts(void)
{
	static struct rps__smap m;
	uint32_t mine;

	start(2, ARGS " --replicas 1");
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 1, SETTLE_MS, &m), 0);
	mine = owned_mask(&m, 2);
	CU_ASSERT_FATAL(mine != 0);
	run_pushes(PUSHES);
	expect_exact(PUSHES);
	{
		struct small_rep sr;

		run_small(true, &sr);
		for (int k = 0; k < NSMALL; k++)
			CU_ASSERT(sr.ret[k] == 0 && sr.exact[k]);
	}
	psctl_ok("checkpoint durable-r1");

	for (int round = 0; round < 3; round++) {
		static const char *how[] = { "SIGTERM", "SIGKILL after a restore", "SIGTERM after a restore" };

		fprintf(stderr, "\n[server 2: %s] ", how[round]);
		if (round == 1)
			it_server_kill(&clu, 1);
		else
			term(1);
		CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, 1), 0);
		CU_ASSERT_EQUAL_FATAL(wait_lost(0, mine, 2), 0);
		CU_ASSERT_EQUAL_FATAL(wait_lost(1, mine, 2), 0);
		expect_lost();
		/* a small tensor outside the lost partitions opens and pulls
		 * exactly; one inside is refused, never zeros */
		{
			struct small_rep sr;
			int opened = 0;

			run_small(false, &sr);
			for (int k = 0; k < NSMALL; k++) {
				struct rps__layout l;
				char name[32];

				snprintf(name, sizeof(name), "small-%d", k);
				CU_ASSERT_EQUAL_FATAL(rps__layout_init(&l, name, SMALL_COUNT, 1024, NPART), 0);
				if (mine & (1u << rps__shard_server(&l, 0))) {
					CU_ASSERT_EQUAL(sr.ret[k], -ENODATA);
				} else {
					CU_ASSERT_EQUAL(sr.ret[k], 0);
					CU_ASSERT(sr.exact[k]);
					opened++;
				}
			}
			CU_ASSERT(opened > 0 && opened < NSMALL);	/* (both kinds, with these names) */
		}
		/* what server 1 owns was never touched */
		psctl_ok("restore durable-r1");
		CU_ASSERT_EQUAL_FATAL(wait_lost(0, 0, 0), 0);
		expect_exact(PUSHES);
	}
	/* and training goes on from there */
	run_pushes(2);
	expect_exact(PUSHES + 2);
}

/*
 * R = 2, two servers, both stopped with SIGTERM and started again: no copy
 * of anything survived.  Every partition is LOST (not failed over from one
 * empty server to the other, not served from zeros), the worker is told
 * how to get them back, and the checkpoint restores them exactly.
 */
static void test_whole_cluster_restart(void)
{
	static struct rps__smap m;

	start(2, ARGS);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	run_pushes(PUSHES);
	expect_exact(PUSHES);
	psctl_ok("checkpoint durable-r2");
	CU_ASSERT_EQUAL_FATAL(kill(clu.pid[0], SIGTERM), 0);
	CU_ASSERT_EQUAL_FATAL(kill(clu.pid[1], SIGTERM), 0);
	CU_ASSERT_EQUAL_FATAL(it_server_wait_exit(&clu, 0, 30000), 0);
	CU_ASSERT_EQUAL_FATAL(it_server_wait_exit(&clu, 1, 30000), 0);
	CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, 0), 0);
	CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, 1), 0);
	CU_ASSERT_EQUAL_FATAL(wait_lost(0, (1u << NPART) - 1, 0), 0);
	CU_ASSERT_EQUAL_FATAL(wait_lost(1, (1u << NPART) - 1, 0), 0);
	expect_lost();
	/* a second look, after every proposal had its time: still lost */
	it_sleep_ms(3000);
	CU_ASSERT_EQUAL_FATAL(wait_lost(1, (1u << NPART) - 1, 0), 0);
	expect_lost();
	psctl_ok("restore durable-r2");
	CU_ASSERT_EQUAL_FATAL(wait_lost(0, 0, 0), 0);
	expect_exact(PUSHES);
	run_pushes(2);
	expect_exact(PUSHES + 2);
}

/*
 * R = 2: a checkpoint restored into a new cluster, then a primary killed
 * and restarted (same --data-dir): its partitions fail over to their
 * backups, which must hold what the restore installed (not what they had
 * before it), exactly.
 */
/* Wait until server `at`'s map names member `id` owner of nothing. */
static int wait_owns_nothing(int at, uint64_t id)
{
	static struct rps__smap m;
	struct it_member st;

	for (double t0 = it_now_s(); it_now_s() - t0 < SETTLE_MS / 1000.0; it_sleep_ms(50))
		if (!it_member_status(&clu, at, &st, &m) && st.leader && !owned_mask(&m, id))
			return 0;
	return -ETIMEDOUT;
}

static void test_restore_then_failover(void)
{
	static struct rps__smap m;

	start(2, ARGS);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	run_pushes(PUSHES);
	psctl_ok("checkpoint durable-fo");
	CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;

	start(2, ARGS);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	psctl_ok("restore durable-fo");
	expect_exact(PUSHES);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	CU_ASSERT_EQUAL(it_replicas_differ(&clu, &m, "w", NULL), 0);
	CU_ASSERT_FATAL(owned_mask(&m, 2) != 0);
	it_server_kill(&clu, 1);
	CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, 1), 0);
	/* its partitions failed over to member 1, which it then backs up */
	CU_ASSERT_EQUAL_FATAL(wait_owns_nothing(0, 2), 0);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	for (uint32_t p = 0; p < m.npart; p++)
		CU_ASSERT_EQUAL(m.parts[p].lost, 0);
	expect_exact(PUSHES);
	CU_ASSERT_EQUAL(it_replicas_differ(&clu, &m, "w", NULL), 0);
	run_pushes(2);
	expect_exact(PUSHES + 2);
}

/* ---- item 3: rolling restarts ---------------------------------------------------------- */

#define ROLL_COUNT 300000u	/* fp32: 19 shards of 64 KiB over 64 partitions */
#define ROLL_ARGS "--shard-size 65536 --fsync none"
#define ROLL_CYCLES 5
#define ROLL_DOWN_MS 3000	/* killed, then restarted this much later */
#define ROLL_UP_MS 5000		/* back this long before the next kill */

struct roll_shared {
	atomic_int acked;	/* pushes acknowledged */
	atomic_int stop;	/* the parent says: enough */
	atomic_int failed;	/* the worker's push failed */
	char why[512];
};
static struct roll_shared *roll;

/* Push +1 into "roll" until told to stop, counting the acknowledgements;
 * the first failure ends it (said in roll->why). */
static int roller(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float *g = malloc(ROLL_COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl;
	rps_tensor_t *t;
	int ret;

	(void)arg;
	(void)out_fd;
	if (!g)
		return 1;
	for (uint32_t i = 0; i < ROLL_COUNT; i++)
		g[i] = -1.0f;
	if ((ret = it_client_connect(servers, rank, nworkers, 60000, &cl)))
		return it_worker_fail(rank, "connect", ret);
	opts_async(&o, ROLL_COUNT);
	if ((ret = rps_tensor_create(cl, "roll", &o, &t)))
		return it_worker_fail(rank, "create", ret);
	while (!atomic_load(&roll->stop)) {
		if ((ret = rps_push(t, g, ROLL_COUNT * sizeof(float)))) {
			snprintf(roll->why, sizeof(roll->why), "push %d: %s: %s", atomic_load(&roll->acked) + 1,
				 rps_strerror(ret), rps_last_error());
			atomic_store(&roll->failed, 1);
			return it_worker_fail(rank, "push", ret);
		}
		atomic_fetch_add(&roll->acked, 1);
	}
	rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	return 0;
}

/*
 * Three servers, R = 2, a worker pushing +1 asynchronously; on a fixed
 * schedule a server is killed with SIGKILL, restarted with the same
 * --data-dir ROLL_DOWN_MS later, and has ROLL_UP_MS before the next one is
 * killed: only one server is ever down.  No partition may be lost (the
 * worker never fails, the map never marks one), and at the end every
 * element and the backups equal the pushes acknowledged.
 */
static void test_rolling_restarts(void)
{
	static const int victims[ROLL_CYCLES] = { 1, 2, 0, 1, 2 };
	static struct rps__smap m;
	static float buf[ROLL_COUNT];
	struct it_workers w;
	struct it_member st;
	uint64_t version = 0;
	uint32_t bad = 0;
	int acked, k;

	memset(roll, 0, sizeof(*roll));
	start(3, ROLL_ARGS);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, roller, clu.servers, NULL, -1, NULL), 0);
	while (atomic_load(&roll->acked) < 20 && !atomic_load(&roll->failed))
		it_sleep_ms(10);
	for (k = 0; k < ROLL_CYCLES && !atomic_load(&roll->failed); k++) {
		int before = atomic_load(&roll->acked);
		double t0 = it_now_s();

		/* one failure at a time: every partition has its backup again
		 * before the next kill (seeding this little data takes well
		 * under ROLL_UP_MS; a loaded machine waits here, it does not
		 * lose a partition that had a single copy left) */
		CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
		fprintf(stderr, "\n[kill %d: server %d, %d pushes so far, settled %.2f s later] ", k + 1, victims[k] + 1,
			before, it_now_s() - t0);
		it_server_kill(&clu, victims[k]);
		it_sleep_ms(ROLL_DOWN_MS);
		CU_ASSERT_EQUAL_FATAL(it_server_restart(&clu, victims[k]), 0);
		it_sleep_ms(ROLL_UP_MS);
		/* no partition lost meanwhile, in the map of a server up all along */
		if (it_member_status(&clu, (victims[k] + 1) % 3, &st, &m) == 0)
			for (uint32_t p = 0; p < m.npart; p++)
				if (m.parts[p].lost) {
					fprintf(stderr, "partition %u lost with member %llu\n", p,
						(unsigned long long)m.parts[p].lost);
					bad++;
				}
	}
	atomic_store(&roll->stop, 1);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	if (atomic_load(&roll->failed))
		fprintf(stderr, "the worker failed: %s\n", roll->why);
	CU_ASSERT_EQUAL(atomic_load(&roll->failed), 0);
	CU_ASSERT_EQUAL(bad, 0);
	acked = atomic_load(&roll->acked);
	fprintf(stderr, "[%d pushes acknowledged across %d kills] ", acked, k);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	for (uint32_t p = 0; p < m.npart; p++)
		CU_ASSERT_EQUAL(m.parts[p].lost, 0);
	CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, "roll", buf, ROLL_COUNT, 20000, &version), 0);
	for (uint32_t i = 0; i < ROLL_COUNT; i++)
		bad += buf[i] != (float)acked;
	if (bad)
		fprintf(stderr, "%u elements differ from %d (element 0: %g)\n", bad, acked, buf[0]);
	CU_ASSERT_EQUAL(bad, 0);
	/* every backup identical to its primary.  A member restarted just
	 * before the end may still be listed as a backup, holding nothing,
	 * until its drop commits and it is seeded again (doc/operations.md "Failures"):
	 * a backup that cannot answer yet is waited for, one that answers
	 * with another digest fails at once */
	for (double until = it_now_s() + SETTLE_MS / 1000.0;;) {
		int differ = it_replicas_differ(&clu, &m, "roll", NULL);

		if (differ >= 0 || it_now_s() > until) {
			CU_ASSERT_EQUAL(differ, 0);
			break;
		}
		it_sleep_ms(500);
		CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	}
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "R = 1: SIGTERM, SIGKILL after a restore, SIGTERM after a restore: LOST, never zeros", test_r1_restarts },
		{ "R = 2: the whole cluster stopped and started again: LOST, then restored", test_whole_cluster_restart },
		{ "R = 2: restored into a new cluster, a primary killed and restarted: its backup holds the restore",
		  test_restore_then_failover },
		{ "R = 2, 3 servers: kill -9 and restart one at a time under a pushing worker: nothing lost",
		  test_rolling_restarts },
	};
	const struct cutest_suite suites[] = {
		{ "restarts with --data-dir", NULL, NULL, NULL, test_teardown, tests, CUTEST_COUNT(tests) },
	};
	int ret;

	if ((ret = it_prog_init("it_durable", 240, NULL, NULL)))
		return ret;
	if (!(roll = it_shared_map("it_durable", sizeof(*roll))))
		return 1;
	if (access(it_psctl_path(), X_OK) != 0) {
		fprintf(stderr, "it_durable: no psctl at %s (set PSCTL)\n", it_psctl_path());
		return 1;
	}
	return cutest_run(suites, CUTEST_COUNT(suites));
}
