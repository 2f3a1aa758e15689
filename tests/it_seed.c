/*
 * it_seed.c - replicas without the test knob: three
 * rdmapsd --replicas 2 on loopback TCP.  The Raft leader places a backup of
 * every partition on another server and seeds it; psctl status shows no
 * under-replication; after training, every backup holds exactly what its
 * primary holds (a crc32c of versions, parameters, Adam state and applied
 * push ids, asked of each server: ADMIN DIGEST).  psctl set-replicas 1
 * drops the backups; pushes go on at R = 1; set-replicas 2, while a worker
 * pushes, seeds them again from the primaries' current state (the image;
 * the worker's pushes refused meanwhile are resent and applied once) and
 * the stream goes on after it: backups equal their primaries again, at
 * exactly the number of pushes made.
 *
 * Sync, a step acknowledged in part before the partition had a backup
 * (doc/operations.md "Server death, with replicas"): at R = 1, four workers, two sync Adam tensors; of
 * one step, ranks 0 and 2 push the first tensor (rank 0's summed, rank
 * 2's parked) and ranks 1 and 3 the second (rank 1's taken early, rank
 * 3's parked), all acknowledged plainly.  Then set-replicas 2 seeds a
 * backup of every partition (the map shows them all in place), a primary
 * is killed with SIGKILL, and only then do the other ranks push that
 * step.  The promoted backups must hold what the seeding image carried of
 * the step, and sum it in rank order: every worker pulls every step, and
 * the parameters end bit-identical (memcmp) to a reference the test
 * computes (each step's gradients summed in rank order, then Adam).
 */
#include "config.h"
#include "cluster.h"
#include "kernels/agg.h"
#include "kernels/optim.h"
#include "proto/smap.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"

#define NSERVERS 3
#define NPART 6
#define COUNT (1024u * 2 * NPART)	/* fp32: 12 shards of 4 KiB */
#define ARGS "--partitions 6 --shard-size 4096 --slots 4 --tick-ms 20 --move-timeout-ms 10000 --fsync none" \
	" --replicas 2 --zone z1"
#define PSCTL_MS 40000
#define SETTLE_MS 30000

static struct it_cluster clu;
static bool clu_up;
static char out[65536], err[8192];

/* Wait until the map has settled at target r (it_wait_settled) with every
 * member and partition in it: the seconds it took, or -1. */
static double wait_settled(uint32_t r, struct rps__smap *m)
{
	double t0 = it_now_s();

	if (it_wait_settled(&clu, r, SETTLE_MS, m))
		return -1;
	CU_ASSERT_EQUAL(m->npart, NPART);
	CU_ASSERT_EQUAL(m->nmembers, NSERVERS);
	return it_now_s() - t0;
}

/* ---- training --------------------------------------------------------------- */

struct train_arg {
	int steps;
	uint64_t seed;
};

/* Open (or create) "w", async Adam, and push `steps` deterministic
 * gradients; writes the seconds its first push took. */
static int train(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	const struct train_arg *a = arg;
	float *g = malloc(COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_client_t *cl = NULL;
	rps_tensor_t *t = NULL;
	uint64_t s = a->seed;
	double first = 0, t0;
	int ret, k;

	(void)rank;
	(void)nworkers;
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_ADAM;
	o.lr = 0.001f;
	ret = g ? it_client_connect(servers, 0, 1, 20000, &cl) : -ENOMEM;
	if (!ret)
		ret = rps_tensor_create(cl, "w", &o, &t);
	for (k = 0; !ret && k < a->steps; k++) {
		for (uint32_t i = 0; i < COUNT; i++)
			g[i] = it_randf(&s);
		t0 = it_now_s();
		ret = rps_push(t, g, COUNT * sizeof(float));
		if (!k)
			first = it_now_s() - t0;
	}
	if (ret)
		fprintf(stderr, "train: step %d: %s: %s\n", k, rps_strerror(ret), rps_last_error());
	it_write_all(out_fd, &first, sizeof(first));
	if (t)
		rps_tensor_close(t);
	rps_client_close(cl);
	free(g);
	return ret ? 1 : 0;
}

static double run_train(int steps, uint64_t seed)
{
	struct train_arg a = { .steps = steps, .seed = seed };
	struct it_workers w;
	double first = -1;

	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, train, clu.servers, &a, -1, NULL), 0);
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &first, sizeof(first)), 0);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	return first;
}

/* Every replica of every partition holds what its primary holds, at
 * `steps` updates per shard. */
static void check_replicas(const struct rps__smap *m, uint64_t steps)
{
	for (uint32_t p = 0; p < NPART; p++) {
		const struct rps__smap_part *mp = &m->parts[p];
		struct it_digest prim;

		CU_ASSERT_EQUAL_FATAL(it_part_digest(&clu, it_member_index(&clu, mp->owner), "w", p, &prim), 0);
		CU_ASSERT(prim.nshards >= 1);
		if (prim.versions != steps * prim.nshards)
			fprintf(stderr, "partition %u: %llu updates over %u shards on its primary, %llu pushes made\n", p,
				(unsigned long long)prim.versions, prim.nshards, (unsigned long long)steps);
		CU_ASSERT_EQUAL(prim.versions, steps * prim.nshards);
	}
	CU_ASSERT_EQUAL(it_replicas_differ(&clu, m, "w", NULL), 0);
}

static void test_setup(void)
{
	struct it_server_opts o = { .extra_args = ARGS };

	it_test_setup();	/* a hung test is stopped by the watchdog */
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, NSERVERS, &o), 0);
	clu_up = true;
}

static void test_teardown(void)
{
	it_test_teardown();	/* (stops nothing: it_prog_init was given no cluster) */
	if (clu_up)
		CU_ASSERT_EQUAL(it_cluster_stop(&clu), 0);
	clu_up = false;
}

/* --replicas 2: a backup per partition on another server, no under-
 * replication in psctl status, zones in the map; after training (and after
 * seeding again from a primary that trained on at R = 1), every backup is
 * byte-identical to its primary. */
static void test_replicas_seeded(void)
{
	static struct rps__smap m;
	double t, first;
	int rc;

	t = wait_settled(2, &m);
	CU_ASSERT_FATAL(t >= 0);
	fprintf(stderr, "[--replicas 2: every partition backed up %.2f s after start] ", t);
	/* each member proposes its own SET_ZONE, on its own schedule: since
	 * seedings no longer wait 0.5 s apart, the backups can all be in place
	 * before the last zone is */
	for (double t0 = it_now_s(); it_now_s() - t0 < SETTLE_MS / 1000.0; it_sleep_ms(50)) {
		uint32_t nz = 0;

		for (uint32_t i = 0; i < NSERVERS; i++)
			nz += !strcmp(m.members[i].zone, "z1");
		if (nz == NSERVERS || wait_settled(2, &m) < 0)
			break;
	}
	for (uint32_t i = 0; i < NSERVERS; i++)
		CU_ASSERT_STRING_EQUAL(m.members[i].zone, "z1");
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "status");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "replication: 2 copies of each partition, 0 under-replicated"));
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--json status");
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"replicas\":2"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"under_replicated\":0"));

	first = run_train(20, 1);
	fprintf(stderr, "[first push with the stream: %.3f s] ", first);
	CU_ASSERT(first >= 0 && first < 10);
	check_replicas(&m, 20);

	/* lowered: the backups go, training goes on at R = 1 */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "set-replicas 1");
	if (rc)
		fprintf(stderr, "psctl set-replicas 1: %s", err);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_FATAL(wait_settled(1, &m) >= 0);
	run_train(10, 2);

	/* raised while a worker trains: seeded again from what the primaries
	 * hold, each partition paused as a move pauses it (its pushes are
	 * refused and resent, applied once) */
	{
		struct train_arg a = { .steps = 1500, .seed = 3 };
		struct it_workers w;
		double t0 = it_now_s();

		/* (psctl answers once the target is applied: the seedings start
		 * as the worker does) */
		rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "set-replicas 2");
		CU_ASSERT_EQUAL(rc, 0);
		CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, train, clu.servers, &a, -1, NULL), 0);
		CU_ASSERT_EQUAL(it_worker_read(&w, 0, &first, sizeof(first)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
		fprintf(stderr, "[1500 pushes across set-replicas 2: %.2f s] ", it_now_s() - t0);
	}
	t = wait_settled(2, &m);
	CU_ASSERT_FATAL(t >= 0);
	check_replicas(&m, 1530);
	/* and the stream goes on after the image */
	run_train(5, 4);
	check_replicas(&m, 1535);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "status");
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "0 under-replicated"));
}

/* A worker pushes `steps` more while psctl runs `cmd`: 0 if both did. */
static int train_across(int steps, uint64_t seed, const char *cmd)
{
	struct train_arg a = { .steps = steps, .seed = seed };
	struct it_workers w;
	double first = -1, t0 = it_now_s();
	int rc;

	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, train, clu.servers, &a, -1, NULL), 0);
	CU_ASSERT_EQUAL(it_worker_read(&w, 0, &first, sizeof(first)), 0);
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "%s", cmd);
	if (rc)
		fprintf(stderr, "psctl %s: exit %d: %s", cmd, rc, err);
	CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
	fprintf(stderr, "[%d pushes across psctl %s: %.2f s] ", steps, cmd, it_now_s() - t0);
	return rc;
}

/* At R = 2, while a worker pushes: psctl move of a partition to its backup
 * (a planned switch: the backup becomes primary under epoch + 1, nothing
 * copied; the leader seeds a new backup), to the member outside its set
 * (the image; its backup follows the new primary's stream), then
 * remove-server of a member that is primary and backup of partitions (its
 * primaries switch to their backups, the leader seeds replacements for its
 * backups before it leaves).  After each: every push applied exactly once
 * (versions) and every backup byte-identical to its primary. */
static void test_moves_replicated(void)
{
	static struct rps__smap m, m2;
	uint64_t b0, e0, o1, b1, e1, out1 = 0;
	char cmd[64];
	uint32_t p;

	CU_ASSERT_FATAL(wait_settled(2, &m) >= 0);
	run_train(20, 1);
	check_replicas(&m, 20);

	/* to its backup */
	b0 = m.parts[0].backups[0];
	e0 = m.parts[0].epoch;
	snprintf(cmd, sizeof(cmd), "move 0 %llu", (unsigned long long)b0);
	CU_ASSERT_EQUAL(train_across(400, 2, cmd), 0);
	CU_ASSERT_FATAL(wait_settled(2, &m) >= 0);
	CU_ASSERT_EQUAL(m.parts[0].owner, b0);
	CU_ASSERT_EQUAL(m.parts[0].epoch, e0 + 1);	/* (seeding keeps the epoch) */
	check_replicas(&m, 420);

	/* outside its set */
	o1 = m.parts[1].owner;
	b1 = m.parts[1].backups[0];
	e1 = m.parts[1].epoch;
	for (uint64_t id = 1; id <= NSERVERS; id++)
		if (id != o1 && id != b1)
			out1 = id;
	snprintf(cmd, sizeof(cmd), "move 1 %llu", (unsigned long long)out1);
	CU_ASSERT_EQUAL(train_across(400, 3, cmd), 0);
	CU_ASSERT_FATAL(wait_settled(2, &m) >= 0);
	CU_ASSERT_EQUAL(m.parts[1].owner, out1);
	CU_ASSERT_EQUAL(m.parts[1].backups[0], b1);
	CU_ASSERT_EQUAL(m.parts[1].epoch, e1 + 1);
	check_replicas(&m, 820);

	/* remove-server 3: primary of some partitions, backup of others */
	CU_ASSERT_FATAL(rps__smap_owned(&m, 3) > 0 && rps__smap_backed(&m, 3) > 0);
	CU_ASSERT_EQUAL(train_across(400, 4, "remove-server 3"), 0);
	CU_ASSERT_EQUAL(it_server_wait_exit(&clu, 2, 30000), 0);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m2), 0);
	CU_ASSERT_EQUAL(m2.nmembers, 2u);
	for (p = 0; p < NPART; p++) {
		CU_ASSERT(m2.parts[p].owner == 1 || m2.parts[p].owner == 2);
		CU_ASSERT_EQUAL(rps__smap_nbackups(&m2, p), 1u);
		CU_ASSERT_EQUAL(rps__smap_role(&m2, p, 3), RPS__SMAP_ROLE_NONE);
	}
	check_replicas(&m2, 1220);
	run_train(5, 5);
	check_replicas(&m2, 1225);
}

/* ---- a worker with several tensors across moves -------------------------------- */

#define MT_N 3			/* tensors per worker */
#define MT_MIN_STEPS 50		/* pushes of each, at least, and before the moves */
#define MT_TIMEOUT_MS 20000

static const char *const mt_names[MT_N] = { "mt-a", "mt-b", "mt-c" };
/* shared with the worker (mapped before it forks) */
struct mt_shared {
	atomic_int done;	/* steps it has done */
	atomic_int stop;	/* the parent's moves are over: stop */
};
static struct mt_shared *mt_sh;

/* One client, MT_N async SUM tensors (each with shards in every
 * partition, so they share every connection), all pushed each step, all
 * ones: writes how many steps were done and the longest push (s). */
static int train_many(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float *g = malloc(COUNT * sizeof(float));
	rps_tensor_t *t[MT_N] = { NULL };
	struct rps_tensor_opts o;
	rps_client_t *cl = NULL;
	double longest = 0;
	int ret, k = 0, j;

	(void)rank;
	(void)nworkers;
	(void)arg;
	for (uint32_t i = 0; g && i < COUNT; i++)
		g[i] = 1.0f;
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SUM;
	o.rescale = 1.0f;
	ret = g ? it_client_connect(servers, 0, 1, MT_TIMEOUT_MS, &cl) : -ENOMEM;
	for (j = 0; !ret && j < MT_N; j++)
		ret = rps_tensor_create(cl, mt_names[j], &o, &t[j]);
	for (k = 0; !ret && (k < MT_MIN_STEPS || !atomic_load(&mt_sh->stop)); k++) {
		for (j = 0; !ret && j < MT_N; j++) {
			double t0 = it_now_s();
			ret = rps_push(t[j], g, COUNT * sizeof(float));
			if (it_now_s() - t0 > longest)
				longest = it_now_s() - t0;
			if (ret)
				fprintf(stderr, "train_many: step %d, %s: %s: %s\n", k, mt_names[j], rps_strerror(ret),
					rps_last_error());
		}
		if (!ret)
			atomic_store(&mt_sh->done, k + 1);
	}
	it_write_all(out_fd, &k, sizeof(k));
	it_write_all(out_fd, &longest, sizeof(longest));
	for (j = 0; j < MT_N; j++)
		if (t[j])
			rps_tensor_close(t[j]);
	rps_client_close(cl);
	free(g);
	return ret ? 1 : 0;
}

/*
 * Moves: a client's memory keys are memory windows bound to its
 * connection, and a remote access error (the old owner's region after a
 * move) closes that connection.  The op that failed refreshes its own
 * tensor's keys on the new connection, but the client's other tensors must
 * not go on with the keys of the lost one: each would fail, close the new
 * connection, and (at R = 2, where a lost server is given the failover
 * wait before it is dialed again) stall the worker past its pushes'
 * timeout.  One worker pushes three tensors while partitions move around
 * the three servers, at R = 2 then at R = 1: every push succeeds within the
 * timeout, every element of every tensor is exactly the number of steps.
 */
static void test_moves_many_tensors(void)
{
	static struct rps__smap m;
	struct it_workers w;
	double longest = -1;
	int steps = -1, total = 0, moves = 0, j;
	float *p = malloc(COUNT * sizeof(float));

	CU_ASSERT_FATAL(p != NULL);
	mt_sh = mmap(NULL, sizeof(*mt_sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CU_ASSERT_FATAL(mt_sh != MAP_FAILED);
	CU_ASSERT_FATAL(wait_settled(2, &m) >= 0);
	for (int r = 2; r >= 1; r--) {
		if (r == 1) {
			CU_ASSERT_EQUAL_FATAL(it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err),
						       "set-replicas 1"), 0);
			CU_ASSERT_FATAL(wait_settled(1, &m) >= 0);
		}
		atomic_store(&mt_sh->done, 0);
		atomic_store(&mt_sh->stop, 0);
		CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, 1, train_many, clu.servers, NULL, -1, NULL), 0);
		for (double t0 = it_now_s(); atomic_load(&mt_sh->done) < MT_MIN_STEPS && it_now_s() - t0 < 60;)
			it_sleep_ms(10);
		/* moves while it pushes: each partition in turn to the next member */
		for (int i = 0; i < 6; i++) {
			uint32_t part = (uint32_t)i % NPART;
			uint64_t to = m.parts[part].owner % NSERVERS + 1;
			int rc;

			it_sleep_ms(200);
			rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "--timeout 20 move %u %llu", part,
				      (unsigned long long)to);
			if (rc)
				fprintf(stderr, "psctl move %u %llu: exit %d: %s", part, (unsigned long long)to, rc, err);
			CU_ASSERT_EQUAL(rc, 0);
			moves += !rc;
			CU_ASSERT_FATAL(wait_settled((uint32_t)r, &m) >= 0);
		}
		atomic_store(&mt_sh->stop, 1);
		CU_ASSERT_EQUAL(it_worker_read(&w, 0, &steps, sizeof(steps)), 0);
		CU_ASSERT_EQUAL(it_worker_read(&w, 0, &longest, sizeof(longest)), 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, 0), 0);
		fprintf(stderr, "[R = %d: %d steps of %d tensors, longest push %.2f s] ", r, steps, MT_N, longest);
		CU_ASSERT_FATAL(steps >= MT_MIN_STEPS);
		total += steps;
		for (j = 0; j < MT_N; j++) {
			uint64_t version = 0;
			uint32_t bad = 0;
			CU_ASSERT_EQUAL_FATAL(it_pull_fresh(clu.servers, mt_names[j], p, COUNT, 20000, &version), 0);
			for (uint32_t i = 0; i < COUNT; i++)
				bad += p[i] != (float)total;
			if (bad)
				fprintf(stderr, "%s: %u elements not %d\n", mt_names[j], bad, total);
			CU_ASSERT_EQUAL(bad, 0);
			CU_ASSERT_EQUAL(version, (uint64_t)total);
		}
	}
	CU_ASSERT_EQUAL(moves, 12);
	munmap(mt_sh, sizeof(*mt_sh));
	free(p);
}

/* ---- sync: a step acknowledged before the seeding, then a failover ----------- */

#define SS_ARGS "--partitions 6 --shard-size 4096 --slots 4 --tick-ms 20 --move-timeout-ms 10000 --fsync none" \
	" --replicas 1 --failover-ms 1000"
#define SS_WORKERS 4
#define SS_COUNT (1024u * NPART)	/* fp32: a 4 KiB shard in each partition */
#define SS_STEPS 5
#define SS_GATE 2		/* the step half pushed before the seeding */
#define SS_TIMEOUT_MS 30000

/* What the workers and the parent tell each other. */
struct ss_shared {
	atomic_int ready[SS_WORKERS];	/* rank pushed its part of SS_GATE, acknowledged */
	atomic_int go;			/* seeded and killed: push the rest */
};
static struct ss_shared *ss;
static const char *const ss_names[2] = { "ss-a", "ss-b" };

/* Does rank push step SS_GATE of tensor k before the seeding?  "ss-a":
 * ranks 0 (summed: its turn) and 2 (parked); "ss-b": ranks 1 (taken early:
 * the turn after the next one, nothing summed) and 3 (parked). */
static bool ss_before(int k, int rank)
{
	return rank % 2 == k;
}

/* Magnitudes 8^rank apart: summed in another order, the bits differ. */
static void ss_grad(int k, int rank, int step, float *g)
{
	uint64_t seed = 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank << 32) ^ ((uint64_t)k << 48) ^ (uint64_t)(step + 1);

	for (uint32_t i = 0; i < SS_COUNT; i++)
		g[i] = it_randf(&seed) * (float)(1u << (3 * rank));
}

static void ss_opts(struct rps_tensor_opts *o, float *init)
{
	uint64_t seed = 42;

	for (uint32_t i = 0; init && i < SS_COUNT; i++)
		init[i] = it_randf(&seed);
	rps_tensor_opts_init(o);
	o->count = SS_COUNT;
	o->mode = RPS_MODE_SYNC;
	o->optimizer = RPS_OPT_ADAM;
	o->lr = 0.01f;
	o->weight_decay = 0.01f;
	o->rescale = 1.0f / SS_WORKERS;
	o->init = init;
}

static int ss_worker(int rank, int nworkers, const char *servers, void *arg, int out_fd)
{
	float *g = malloc(SS_COUNT * sizeof(float)), *p = malloc(2 * SS_COUNT * sizeof(float));
	float *init = malloc(SS_COUNT * sizeof(float));
	struct rps_tensor_opts o;
	rps_tensor_t *t[2] = { NULL, NULL };
	rps_client_t *cl;
	uint64_t version;
	int ret, k, s, pass;

	(void)arg;
	if (!g || !p || !init)
		return it_worker_fail(rank, "malloc", -ENOMEM);
	if ((ret = it_client_connect(servers, rank, nworkers, SS_TIMEOUT_MS, &cl)))
		return it_worker_fail(rank, "connect", ret);
	for (k = 0; k < 2; k++) {
		ss_opts(&o, init);
		if ((ret = rps_tensor_create(cl, ss_names[k], &o, &t[k])))
			return it_worker_fail(rank, "create", ret);
	}
	if ((ret = rps_barrier(cl)))
		return it_worker_fail(rank, "barrier", ret);
	for (s = 0; s < SS_STEPS; s++) {
		for (pass = 0; pass < 1 + (s == SS_GATE); pass++) {
			for (k = 0; k < 2; k++) {
				if (s == SS_GATE && ss_before(k, rank) != (pass == 0))
					continue;
				ss_grad(k, rank, s, g);
				if ((ret = rps_push(t[k], g, SS_COUNT * sizeof(float))))
					return it_worker_fail(rank, "push", ret);
			}
			if (s == SS_GATE && pass == 0) {
				atomic_store(&ss->ready[rank], 1);
				while (!atomic_load(&ss->go))
					usleep(2000);
			}
		}
		for (k = 0; k < 2; k++) {
			if ((ret = rps_pull(t[k], p + k * SS_COUNT, SS_COUNT * sizeof(float), &version)))
				return it_worker_fail(rank, "pull", ret);
			if (version != (uint64_t)s + 1) {
				fprintf(stderr, "worker %d: step %d of '%s' pulled version %llu\n", rank, s, ss_names[k],
					(unsigned long long)version);
				return 1;
			}
		}
	}
	it_write_all(out_fd, p, 2 * SS_COUNT * sizeof(float));
	for (k = 0; k < 2; k++)
		rps_tensor_close(t[k]);
	rps_client_close(cl);
	free(g);
	free(p);
	free(init);
	return 0;
}

/* The reference: one process, each step's gradients summed in rank order,
 * the tensor's optimizer (the servers' own kernels). */
static void ss_reference(int k, float *ref)
{
	float *sum = malloc(SS_COUNT * sizeof(float)), *g = malloc(SS_COUNT * sizeof(float));
	float *state = calloc(rps__optim_state_len(RPS_OPT_ADAM, SS_COUNT) + 1, sizeof(float));
	struct rps_tensor_opts o;
	struct rps__optim opt;

	CU_ASSERT_FATAL(sum && g && state);
	ss_opts(&o, ref);
	opt = (struct rps__optim){ .type = o.optimizer, .lr = o.lr, .momentum = o.momentum, .beta1 = o.beta1,
				   .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
				   .rescale = o.rescale };
	for (int s = 0; s < SS_STEPS; s++) {
		for (int r = 0; r < SS_WORKERS; r++) {
			ss_grad(k, r, s, g);
			if (r == 0)
				rps__agg_copy(sum, g, RPS_DTYPE_F32, SS_COUNT);
			else
				rps__agg_add(sum, g, RPS_DTYPE_F32, SS_COUNT);
		}
		rps__optim_apply(&opt, ref, sum, state, SS_COUNT, (uint64_t)s + 1);
	}
	free(sum);
	free(g);
	free(state);
}

/* A member that does not lead the Raft group, primary of a partition: the
 * victim (a leader's death would add an election to the failover, not
 * change what it tests).  Its index, or -1. */
static int ss_victim(const struct rps__smap *m)
{
	struct it_member st;
	int leader = -1;

	for (double t0 = it_now_s(); leader < 0 && it_now_s() - t0 < SETTLE_MS / 1000.0; it_sleep_ms(20))
		for (int i = 0; i < clu.nservers && leader < 0; i++)
			if (!it_member_status(&clu, i, &st, NULL) && st.leading)
				leader = i;
	for (uint32_t p = 0; p < m->npart; p++) {
		int i = it_member_index(&clu, m->parts[p].owner);
		if (i >= 0 && i != leader && m->parts[p].backups[0])
			return i;
	}
	return -1;
}

static void test_sync_step_seeded_then_failover(void)
{
	static struct rps__smap m;
	static float ref[2][SS_COUNT], got[2 * SS_COUNT];
	struct it_workers w;
	double t0;
	int r, k, rc, victim, ready = 0;

	if (!ss)
		ss = it_shared_map("it_seed", sizeof(*ss));
	CU_ASSERT_PTR_NOT_NULL_FATAL(ss);
	memset(ss, 0, sizeof(*ss));
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 1, SETTLE_MS, &m), 0);
	for (uint32_t p = 0; p < m.npart; p++)
		CU_ASSERT_EQUAL(m.parts[p].backups[0], 0);
	for (k = 0; k < 2; k++)
		ss_reference(k, ref[k]);
	CU_ASSERT_EQUAL_FATAL(it_workers_start(&w, SS_WORKERS, ss_worker, clu.servers, NULL, -1, NULL), 0);
	/* half of step SS_GATE acknowledged, at R = 1 */
	for (t0 = it_now_s(); ready < SS_WORKERS && it_now_s() - t0 < SS_TIMEOUT_MS / 1000.0; it_sleep_ms(20))
		for (r = 0, ready = 0; r < SS_WORKERS; r++)
			ready += atomic_load(&ss->ready[r]);
	CU_ASSERT_EQUAL_FATAL(ready, SS_WORKERS);
	/* every partition seeded a backup: the images cut mid-step */
	rc = it_psctl(&clu, PSCTL_MS, out, sizeof(out), err, sizeof(err), "set-replicas 2");
	if (rc)
		fprintf(stderr, "psctl set-replicas 2: %s", err);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	victim = ss_victim(&m);
	CU_ASSERT_FATAL(victim >= 0);
	fprintf(stderr, "[killing member %d, primary of %u partitions, before the step's other pushes] ",
		victim + 1, rps__smap_owned(&m, (uint64_t)victim + 1));
	it_server_kill(&clu, victim);
	atomic_store(&ss->go, 1);
	for (r = 0; r < SS_WORKERS; r++) {
		rc = it_worker_read(&w, r, got, sizeof(got));
		CU_ASSERT_EQUAL(rc, 0);
		CU_ASSERT_EQUAL(it_worker_wait(&w, r), 0);
		if (rc)
			continue;
		for (k = 0; k < 2; k++) {
			bool same = !memcmp(got + k * SS_COUNT, ref[k], sizeof(ref[k]));
			if (!same)
				fprintf(stderr, "worker %d: '%s' differs from the rank-order reference\n", r, ss_names[k]);
			CU_ASSERT(same);
		}
	}
	/* and the replicas, once placed again, hold what their primaries hold */
	CU_ASSERT_EQUAL_FATAL(it_wait_settled(&clu, 2, SETTLE_MS, &m), 0);
	for (k = 0; k < 2; k++)
		CU_ASSERT_EQUAL(it_replicas_differ(&clu, &m, ss_names[k], NULL), 0);
}

static void ss_setup(void)
{
	struct it_server_opts o = { .extra_args = SS_ARGS };

	it_test_setup();
	CU_ASSERT_EQUAL_FATAL(it_cluster_start_opts(&clu, NSERVERS, &o), 0);
	clu_up = true;
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "--replicas 2: backups placed and seeded, byte-identical; set-replicas 1 then 2", test_replicas_seeded },
		{ "R = 2: move to a backup, move outside the set, remove-server: exact, replicas identical", test_moves_replicated },
		{ "moves under a worker pushing 3 tensors, R = 2 then 1: every push in time, exact", test_moves_many_tensors },
	};
	static const struct cutest ss_tests[] = {
		{ "sync: a step acknowledged at R = 1, a backup seeded, its primary killed: bit-identical",
		  test_sync_step_seeded_then_failover },
	};
	const struct cutest_suite suites[] = {
		{ "replicas, 3 servers", NULL, NULL, test_setup, test_teardown, tests, CUTEST_COUNT(tests) },
		{ "sync step across a seeding, 3 servers", NULL, NULL, ss_setup, test_teardown, ss_tests,
		  CUTEST_COUNT(ss_tests) },
	};
	int ret;

	if ((ret = it_prog_init("it_seed", 300, NULL, NULL)))
		return ret;
	if (access(it_psctl_path(), X_OK) != 0) {
		fprintf(stderr, "it_seed: no psctl at %s (set PSCTL)\n", it_psctl_path());
		return 1;
	}
	return cutest_run(suites, CUTEST_COUNT(suites));
}
