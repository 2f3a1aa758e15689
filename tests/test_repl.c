/*
 * test_repl.c - the replication stream (src/server/repl_stream.c) between two
 * real data planes in one process over TCP, each driven by a fake control
 * plane as in test_dataplane.c: A (member 1) owns every partition, B
 * (member 2) is the backup of each.  Real workers (librdmaps) push to A.
 * The tests compare the two servers' shards byte for byte (parameters,
 * optimizer state, versions, applied push ids, clocks), stall B's loop to
 * show that no push is acknowledged before B applied it (sync: TAKEN at
 * once, complete at STEP_DONE), exhaust B's credits, refuse an entry of an
 * old epoch, and check that without backups nothing of the stream runs and
 * the acknowledgements are today's.
 */
#include "config.h"
#include "common/common.h"
#include "kernels/agg.h"
#include "kernels/optim.h"
#include "proto/shard.h"
#include "proto/smap.h"
#include "server/dataplane.h"
#include "server/server.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"

#define NPART 4u
#define SHARD_BYTES 64u		/* 16 floats */
#define COUNT 64u		/* 4 shards: one per partition */
#define TIMER_MS 2
#define QUICK_MS 400

/* ---- the fake control planes ---------------------------------------------- */

struct fake;
typedef void (*fake_fn)(struct fake *f, void *arg);

struct fake {
	struct rps__server *srv;
	const struct rps__dp_ops *dp;
	uint64_t id;
	pthread_t thread;
	int run_ret;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	fake_fn todo;
	void *todo_arg;
	bool todo_done;
	bool stall, stalled;	/* run_timers blocks the loop while stall */
	struct rps__smap *map;
	char *mapbuf;
};

static struct fake A, B;
static struct rps__smap map;
static char uri_a[300], uri_b[300], uri_c[300];
/* TCP on loopback, or verbs with RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=...
 * (make check-rxe) */
static const char *scheme = "tcp", *addr = "127.0.0.1";

static void uri_of(char *uri, size_t len, const struct fake *f);

static int h_run_timers(void *ctx, uint64_t now, bool *stop)
{
	struct fake *f = ctx;
	fake_fn fn;
	void *arg;

	(void)now;
	(void)stop;
	pthread_mutex_lock(&f->lock);
	while (f->stall) {
		f->stalled = true;
		pthread_cond_broadcast(&f->cond);
		pthread_cond_wait(&f->cond, &f->lock);
	}
	f->stalled = false;
	fn = f->todo;
	arg = f->todo_arg;
	f->todo = NULL;
	pthread_mutex_unlock(&f->lock);
	if (fn) {
		fn(f, arg);
		pthread_mutex_lock(&f->lock);
		f->todo_done = true;
		pthread_cond_broadcast(&f->cond);
		pthread_mutex_unlock(&f->lock);
	}
	return TIMER_MS;
}

static void fake_do(struct fake *f, fake_fn fn, void *arg)
{
	pthread_mutex_lock(&f->lock);
	f->todo = fn;
	f->todo_arg = arg;
	f->todo_done = false;
	while (!f->todo_done)
		pthread_cond_wait(&f->cond, &f->lock);
	pthread_mutex_unlock(&f->lock);
}

/* Block f's loop (in run_timers) until fake_resume: it polls nothing. */
static void fake_stall(struct fake *f)
{
	pthread_mutex_lock(&f->lock);
	f->stall = true;
	while (!f->stalled)
		pthread_cond_wait(&f->cond, &f->lock);
	pthread_mutex_unlock(&f->lock);
}

static void fake_resume(struct fake *f)
{
	pthread_mutex_lock(&f->lock);
	f->stall = false;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
}

static void *loop_main(void *arg)
{
	struct fake *f = arg;

	f->run_ret = rps__server_run(f->srv);
	return NULL;
}

static struct rps__keyring *keys;	/* (shared by both servers; freed at exit) */

static int fake_server(struct fake *f, uint64_t id)
{
	const struct rps__dp_hooks hooks = { .run_timers = h_run_timers, .ctx = f };
	struct rps__server_config cfg;
	int ret;

	memset(f, 0, sizeof(*f));
	f->dp = rps__dataplane_ops();
	f->id = id;
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
	rps__server_config_init(&cfg);
	cfg.listen.kind = strcmp(scheme, "verbs") ? RPS__KIND_TCP : RPS__KIND_VERBS;
	snprintf(cfg.listen.host, sizeof(cfg.listen.host), "%s", addr);
	cfg.listen.port = 0;
	cfg.shard_bytes = SHARD_BYTES;
	cfg.nslots = 16;	/* more pushes in flight than B has credits */
	cfg.no_pin = 1;
	/* with RDMAPS_KEY_FILE (the verbs tests set it) the servers authenticate
	 * their streams and the library's workers as a deployment's do */
	if (rps__key_path(NULL) && !keys && rps__keyring_open(rps__key_path(NULL), true, &keys))
		return -EINVAL;
	cfg.keys = keys;
	ret = rps__server_create(&cfg, &f->srv);
	if (ret)
		return ret;
	rps__dp_set_hooks(f->srv, &hooks);
	f->dp->set_member_id(f->srv, id);
	return 0;
}

static void uri_of(char *uri, size_t len, const struct fake *f)
{
	snprintf(uri, len, "%s://%s:%u", scheme, addr, (unsigned)rps__server_port(f->srv));
}

static int map_publish(struct fake *f)
{
	char tmp[RPS__MAP_BUF];
	size_t len = 0;
	uint32_t len32;
	int ret;

	f->dp->set_map(f->srv, map.npart, map.applied);
	ret = rps__smap_encode(&map, tmp + 4, sizeof(tmp) - 4, &len);
	if (ret)
		return ret;
	len32 = (uint32_t)len;
	memcpy(tmp, &len32, 4);
	memset(tmp + 4 + len, 0, sizeof(tmp) - 4 - len);
	memcpy(f->mapbuf, tmp, sizeof(tmp));
	return 0;
}

/* What cp_map.c's rps__cp_part_sync tells f of partition p: A serves it,
 * B backs it up (when the map has backups). */
static void part_view(struct fake *f, uint32_t p, uint64_t map_epoch, bool with_backups)
{
	const struct rps__smap_part *mp = &map.parts[p];
	struct rps__dp_part v = {
		.epoch = mp->epoch, .map_epoch = map_epoch, .serving = mp->owner == f->id,
		.primary = mp->owner,
	};

	if (with_backups && mp->backups[0]) {
		v.backups[0] = mp->backups[0];
		v.nbackups = 1;
		v.backup = mp->backups[0] == f->id;
	}
	f->dp->part_set(f->srv, p, &v);
}

static int bootstrap(struct fake *f)
{
	uint32_t p;
	int ret;

	f->mapbuf = calloc(1, RPS__MAP_BUF);
	if (!f->mapbuf)
		return -ENOMEM;
	ret = f->dp->map_register(f->srv, f->mapbuf, RPS__MAP_BUF);
	if (!ret)
		ret = map_publish(f);
	if (ret)
		return ret;
	f->dp->repl_peer(f->srv, 1, uri_a);
	f->dp->repl_peer(f->srv, 2, uri_b);
	f->dp->set_lease(f->srv, UINT64_MAX);	/* (test_lease_fence lets it run out) */
	/* R=1 views first (test_r1_unchanged): the backup, B, dials its
	 * primary as soon as its views say it backs one */
	for (p = 0; p < NPART; p++) {
		part_view(f, p, map.parts[p].epoch, false);
		if (map.parts[p].owner == f->id)
			f->dp->part_create(f->srv, p);
	}
	return 0;
}

/* ---- workers ----------------------------------------------------------------- */

static rps_client_t *w0, *w1, *quick;

static int connect_worker(int rank, int timeout_ms, rps_client_t **out)
{
	struct rps_client_opts o;

	rps_client_opts_init(&o);
	o.servers = uri_a;
	o.rank = rank;
	o.num_workers = 2;
	o.timeout_ms = timeout_ms;
	return rps_client_connect(&o, out);
}

static int suite_init(void)
{
	const char *uris[2] = { uri_a, uri_b };
	uint32_t p;

	rps__log_level = RPS__LOG_ERROR;
	if (fake_server(&A, 1) || fake_server(&B, 2))
		goto err;
	uri_of(uri_a, sizeof(uri_a), &A);
	uri_of(uri_b, sizeof(uri_b), &B);
	/* every partition: A primary, B its backup */
	if (rps__smap_init_replicated(&map, uris, 2, NPART, 2))
		goto err;
	for (p = 0; p < NPART; p++) {
		map.parts[p].owner = 1;
		map.parts[p].backups[0] = 2;
	}
	map.applied = 1;
	if (bootstrap(&A) || bootstrap(&B))
		goto err;
	if (-pthread_create(&A.thread, NULL, loop_main, &A) || -pthread_create(&B.thread, NULL, loop_main, &B))
		goto err;
	if (connect_worker(0, 10000, &w0) || connect_worker(1, 10000, &w1) || connect_worker(0, QUICK_MS, &quick)) {
		fprintf(stderr, "test_repl: %s\n", rps_last_error());
		return -1;
	}
	return 0;
err:
	fprintf(stderr, "test_repl: %s\n", rps__errbuf());
	return -1;
}

static void fake_fini(struct fake *f)
{
	rps__server_stop(f->srv);
	pthread_join(f->thread, NULL);
	f->dp->map_deregister(f->srv);
	rps__server_destroy(f->srv);
	free(f->mapbuf);
}

static int suite_fini(void)
{
	rps_client_close(quick);
	rps_client_close(w1);
	rps_client_close(w0);
	fake_fini(&A);
	fake_fini(&B);
	return A.run_ret == 0 && B.run_ret == 0 ? 0 : -1;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static float init[COUNT];

static int tensor(rps_client_t *c, const char *name, enum rps_mode mode, enum rps_dtype dt,
		  enum rps_optimizer opt, rps_tensor_t **t)
{
	struct rps_tensor_opts o;
	unsigned i;

	for (i = 0; i < COUNT; i++)
		init[i] = (float)i * 0.125f - 3.0f;
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.dtype = dt;
	o.mode = mode;
	o.staleness = 2;
	o.optimizer = opt;
	o.lr = 0.05f;
	o.init = init;
	return rps_tensor_create(c, name, &o, t);
}

/* A random gradient in dtype dt (fp32 values rounded by the library's
 * own conversion when dt is narrower). */
static void random_grad(void *g, enum rps_dtype dt, unsigned *seed)
{
	float f[COUNT];
	unsigned i;

	for (i = 0; i < COUNT; i++)
		f[i] = (float)(rand_r(seed) % 2001 - 1000) / 256.0f;
	if (dt == RPS_DTYPE_F32)
		memcpy(g, f, sizeof(f));
	else
		rps__f32_to_dtype(g, f, dt, COUNT);
}

/* ---- comparing the replicas ----------------------------------------------------- */

static struct srv_tensor *find(struct fake *f, const char *name)
{
	return rps__srv_tensor_by_name(f->srv, name);
}

/* Shards of `name` that differ between A and B (every byte of state a
 * failover would promote), or -1 if B lacks them.  Called while both are
 * quiet (every push acknowledged, so B applied it). */
static int differing_shards(const char *name)
{
	struct srv_tensor *ta = find(&A, name), *tb = find(&B, name);
	uint32_t j;
	int n = 0;

	if (!ta || !tb || ta->layout.nshards != tb->layout.nshards)
		return -1;
	for (j = 0; j < ta->layout.nshards; j++) {
		struct shard *a = &ta->shards[j], *b = &tb->shards[j];
		size_t st = rps__optim_state_len(ta->optim.type, a->elems) * sizeof(float);
		bool same;
		if (!a->hdr || !b->hdr)
			return -1;
		same = a->step == b->step && a->ready == b->ready && a->hdr->seq == b->hdr->seq &&
		       !(a->hdr->seq & 1) && a->hdr->min_clock == b->hdr->min_clock &&
		       !memcmp(a->params, b->params, a->elems * sizeof(float)) &&
		       (!st || !memcmp(a->state, b->state, st)) && a->ndd == b->ndd &&
		       (!a->ndd || !memcmp(a->dd, b->dd, a->ndd * sizeof(*a->dd))) &&
		       (!a->clocks || !memcmp(a->clocks, b->clocks, (size_t)ta->spec.num_workers * 8));
		n += !same;
	}
	return n;
}

static uint64_t version_of(struct fake *f, const char *name, uint32_t shard)
{
	struct srv_tensor *t = find(f, name);

	return t ? t->shards[shard].step : UINT64_MAX;
}

static uint32_t repl_conns(struct fake *f)
{
	uint32_t i, n = 0;

	for (i = 0; i < f->srv->nconns; i++)
		n += f->srv->conns[i]->role == CONN_REPL;
	return n;
}

/* ---- the tests --------------------------------------------------------------------- */

static void do_views_r1(struct fake *f, void *arg)
{
	uint32_t p;

	(void)arg;
	for (p = 0; p < NPART; p++)
		part_view(f, p, map.parts[p].epoch, false);
}

static void do_views_replicated(struct fake *f, void *arg)
{
	uint32_t p;

	(void)arg;
	for (p = 0; p < NPART; p++)
		part_view(f, p, map.parts[p].epoch, true);
}

/* Without backups in the views (R=1) nothing of the stream runs: no
 * connection dialed, no entry, no deferred ack, no wait; every mode's
 * pushes are acknowledged as today, with the versions today's code gives,
 * even with B's loop stalled (nothing waits for another server). */
static void test_r1_unchanged(void)
{
	static const enum rps_mode modes[3] = { RPS_MODE_ASYNC, RPS_MODE_BOUNDED, RPS_MODE_SYNC };
	static const char *names[3] = { "r1-async", "r1-bounded", "r1-sync" };
	float g[COUNT], out[COUNT];
	rps_tensor_t *t0[3], *t1[3];
	rps_request_t *r0, *r1;
	uint64_t version;
	unsigned seed = 7;
	int m, i;

	uint64_t acks = 0, flagged = 0, step_done = 0;

	fake_do(&A, do_views_r1, NULL);
	fake_do(&B, do_views_r1, NULL);
	for (m = 0; m < 3; m++) {
		CU_ASSERT_EQUAL_FATAL(tensor(w0, names[m], modes[m], RPS_DTYPE_F32, RPS_OPT_SUM, &t0[m]), 0);
		CU_ASSERT_EQUAL_FATAL(tensor(w1, names[m], modes[m], RPS_DTYPE_F32, RPS_OPT_SUM, &t1[m]), 0);
	}
	fake_stall(&B);
	for (m = 0; m < 3; m++) {
		if (modes[m] == RPS_MODE_SYNC) {	/* (async: lock retries ack too) */
			acks = A.srv->worker_msgs[RPS__MSG_PUSH_ACK];
			flagged = A.srv->worker_acks_flagged;
			step_done = A.srv->worker_msgs[RPS__MSG_STEP_DONE];
		}
		random_grad(g, RPS_DTYPE_F32, &seed);
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t0[m], g, sizeof(g), &r0), 0);
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t1[m], g, sizeof(g), &r1), 0);
		CU_ASSERT_EQUAL(rps_wait(r0), 0);
		CU_ASSERT_EQUAL(rps_wait(r1), 0);
		CU_ASSERT_EQUAL(rps_pull(t0[m], out, sizeof(out), &version), 0);
		/* async, bounded: two updates; sync: one step of the two */
		CU_ASSERT_EQUAL(version, modes[m] == RPS_MODE_SYNC ? 1u : 2u);
	}
	/* sync, rank 1 out of turn: parked and acknowledged at once, complete
	 * before rank 0 pushed (one ack, no TAKEN, no STEP_DONE) */
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t1[2], g, sizeof(g), &r1), 0);
	CU_ASSERT_EQUAL(rps_wait(r1), 0);
	CU_ASSERT_EQUAL(A.srv->push.nparked, 4u);
	CU_ASSERT_EQUAL(rps_push(t0[2], g, sizeof(g)), 0);
	/* rank 0's acknowledgement goes out before A drains the parked
	 * pushes in the same turn (push.c, on_push): a client may see it
	 * first (over verbs it did) */
	for (i = 0; i < 300 && __atomic_load_n(&A.srv->push.nparked, __ATOMIC_RELAXED); i++)
		sleep_ms(10);
	CU_ASSERT_EQUAL(A.srv->push.nparked, 0u);
	CU_ASSERT_EQUAL(version_of(&A, names[2], 3), 2u);
	/* sync: one plain PUSH_ACK per shard push (2 steps x 2 ranks x 4), nothing else */
	CU_ASSERT_EQUAL(A.srv->worker_msgs[RPS__MSG_PUSH_ACK] - acks, 16u);
	CU_ASSERT_EQUAL(A.srv->worker_acks_flagged - flagged, 0u);
	CU_ASSERT_EQUAL(A.srv->worker_msgs[RPS__MSG_STEP_DONE] - step_done, 0u);
	CU_ASSERT_EQUAL(A.srv->repl.stats.taken_acks, 0u);
	fake_resume(&B);
	for (m = 0; m < 3; m++) {
		rps_tensor_close(t1[m]);
		rps_tensor_close(t0[m]);
	}
	CU_ASSERT_EQUAL(repl_conns(&A), 0u);
	CU_ASSERT_EQUAL(repl_conns(&B), 0u);
	CU_ASSERT_FALSE(A.srv->repl.active);
	CU_ASSERT_EQUAL(A.srv->repl.stats.entries_sent, 0u);
	CU_ASSERT_EQUAL(A.srv->repl.stats.deferred, 0u);
	CU_ASSERT_EQUAL(A.srv->repl.nrwaits, 0u);
	CU_ASSERT_EQUAL(B.srv->repl.stats.entries_applied, 0u);
	CU_ASSERT_EQUAL(version_of(&B, "r1-async", 0), 0u);	/* B holds it, nothing replicated */
}

/* Every test but test_r1_unchanged runs with the replicated views (A
 * primary, B backup of every partition); servers start with R=1 views, so
 * that one sees no stream ever dialed. */
static void test_setup(void)
{
	CU_pTest t = CU_get_current_test();

	if (t && t->pName && !strncmp(t->pName, "R=1:", 4))
		return;
	fake_do(&B, do_views_replicated, NULL);
	fake_do(&A, do_views_replicated, NULL);
}

/* Async, two workers pushing random gradients at once (fp32 Adam, and
 * bf16 momentum: the conversion runs on both sides): every shard of B is
 * byte-identical to A's, push-id sets included. */
static void test_async_identical(void)
{
	static const char *names[2] = { "async-adam", "async-bf16" };
	uint16_t g16[2][COUNT];
	float g[2][COUNT];
	rps_tensor_t *t0, *t1;
	rps_request_t *r0, *r1;
	unsigned seed = 1, i;
	int k;

	for (k = 0; k < 2; k++) {
		enum rps_dtype dt = k ? RPS_DTYPE_BF16 : RPS_DTYPE_F32;
		enum rps_optimizer opt = k ? RPS_OPT_MOMENTUM : RPS_OPT_ADAM;
		CU_ASSERT_EQUAL_FATAL(tensor(w0, names[k], RPS_MODE_ASYNC, dt, opt, &t0), 0);
		CU_ASSERT_EQUAL_FATAL(tensor(w1, names[k], RPS_MODE_ASYNC, dt, opt, &t1), 0);
		for (i = 0; i < 20; i++) {
			void *a = k ? (void *)g16[0] : (void *)g[0], *b = k ? (void *)g16[1] : (void *)g[1];
			size_t len = k ? sizeof(g16[0]) : sizeof(g[0]);
			random_grad(a, dt, &seed);
			random_grad(b, dt, &seed);
			CU_ASSERT_EQUAL_FATAL(rps_push_start(t0, a, len, &r0), 0);
			CU_ASSERT_EQUAL_FATAL(rps_push_start(t1, b, len, &r1), 0);
			CU_ASSERT_EQUAL(rps_wait(r0), 0);
			CU_ASSERT_EQUAL(rps_wait(r1), 0);
		}
		CU_ASSERT_EQUAL(version_of(&A, names[k], 0), 40u);
		CU_ASSERT_EQUAL(differing_shards(names[k]), 0);
		CU_ASSERT_EQUAL(find(&B, names[k])->shards[0].ndd, 2u);
		rps_tensor_close(t1);
		rps_tensor_close(t0);
	}
	CU_ASSERT(A.srv->repl.stats.entries_sent > 0);
	CU_ASSERT_EQUAL(A.srv->repl.nrwaits, 0u);
}

/* A tensor created while its partitions had no backup (no regions on
 * B), the partitions then backed (a running cluster seeds such a backup first; here
 * the tensor has no initial values, so zeros are its state everywhere):
 * the binding entry makes B allocate the regions it now backs, and the
 * pushes land there. */
static void test_binding_allocates_regions(void)
{
	struct rps_tensor_opts o;
	float g[COUNT];
	rps_tensor_t *t;
	unsigned seed = 10, i;

	fake_do(&A, do_views_r1, NULL);
	fake_do(&B, do_views_r1, NULL);
	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.mode = RPS_MODE_ASYNC;
	o.optimizer = RPS_OPT_SUM;
	CU_ASSERT_EQUAL_FATAL(rps_tensor_create(w0, "late-backup", &o, &t), 0);
	CU_ASSERT_PTR_NULL(find(&B, "late-backup")->regions[0].mem);
	fake_do(&B, do_views_replicated, NULL);
	fake_do(&A, do_views_replicated, NULL);
	for (i = 0; i < 3; i++) {
		random_grad(g, RPS_DTYPE_F32, &seed);
		CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), 0);
	}
	CU_ASSERT_PTR_NOT_NULL(find(&B, "late-backup")->regions[0].mem);
	CU_ASSERT_EQUAL(version_of(&B, "late-backup", 0), 3u);
	CU_ASSERT_EQUAL(differing_shards("late-backup"), 0);
	rps_tensor_close(t);
}

/* Bounded (staleness 2), the two ranks at different paces: clocks and
 * min_clock replicated exactly. */
static void test_bounded_identical(void)
{
	float g[COUNT];
	rps_tensor_t *t0, *t1;
	unsigned seed = 2, i;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "bounded", RPS_MODE_BOUNDED, RPS_DTYPE_F32, RPS_OPT_SGD, &t0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "bounded", RPS_MODE_BOUNDED, RPS_DTYPE_F32, RPS_OPT_SGD, &t1), 0);
	for (i = 0; i < 12; i++) {
		random_grad(g, RPS_DTYPE_F32, &seed);
		CU_ASSERT_EQUAL(rps_push(t0, g, sizeof(g)), 0);
		if (i % 3 == 0) {
			random_grad(g, RPS_DTYPE_F32, &seed);
			CU_ASSERT_EQUAL(rps_push(t1, g, sizeof(g)), 0);
		}
	}
	CU_ASSERT_EQUAL(version_of(&A, "bounded", 1), 16u);
	CU_ASSERT_EQUAL(find(&B, "bounded")->shards[1].clocks[0], 12u);
	CU_ASSERT_EQUAL(find(&B, "bounded")->shards[1].clocks[1], 4u);
	CU_ASSERT_EQUAL(differing_shards("bounded"), 0);
	rps_tensor_close(t1);
	rps_tensor_close(t0);
}

/* Sync, two ranks, momentum: each step shipped once, as its sum. */
static void test_sync_identical(void)
{
	float g0[COUNT], g1[COUNT], out[COUNT];
	rps_tensor_t *t0, *t1;
	rps_request_t *r0, *r1;
	uint64_t sent = A.srv->repl.stats.entries_sent, version;
	unsigned seed = 3, i;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "sync", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_MOMENTUM, &t0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "sync", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_MOMENTUM, &t1), 0);
	for (i = 0; i < 10; i++) {
		random_grad(g0, RPS_DTYPE_F32, &seed);
		random_grad(g1, RPS_DTYPE_F32, &seed);
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t0, g0, sizeof(g0), &r0), 0);
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t1, g1, sizeof(g1), &r1), 0);
		CU_ASSERT_EQUAL(rps_wait(r0), 0);
		CU_ASSERT_EQUAL(rps_wait(r1), 0);
	}
	CU_ASSERT_EQUAL(rps_pull(t1, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 10u);
	CU_ASSERT_EQUAL(differing_shards("sync"), 0);
	/* the tensor's binding, then per shard 1 INIT and 10 steps -- not 20 pushes */
	CU_ASSERT_EQUAL(A.srv->repl.stats.entries_sent - sent, 1u + 4u * (1 + 10));
	rps_tensor_close(t1);
	rps_tensor_close(t0);
}

/* Shards of a and b on A whose parameters or optimizer state differ. */
static int differing_tensors(const char *a, const char *b)
{
	struct srv_tensor *ta = find(&A, a), *tb = find(&A, b);
	uint32_t j;
	int n = 0;

	if (!ta || !tb || ta->layout.nshards != tb->layout.nshards)
		return -1;
	for (j = 0; j < ta->layout.nshards; j++) {
		struct shard *x = &ta->shards[j], *y = &tb->shards[j];
		size_t st = rps__optim_state_len(ta->optim.type, x->elems) * sizeof(float);
		n += x->step != y->step || memcmp(x->params, y->params, x->elems * sizeof(float)) ||
		     (st && memcmp(x->state, y->state, st));
	}
	return n;
}

static uint64_t await_delta(const uint64_t *v, uint64_t base, uint64_t want);

struct remove_arg {
	const char *name;
	int rank, ret;
};

static void do_remove_rank(struct fake *f, void *arg)
{
	struct remove_arg *r = arg;

	r->ret = rps__srv_rank_remove(f->srv, r->name, r->rank);
}

/* Sync without backups: rank 1's push coming before rank 0's is summed at
 * once (taken early, never copied aside), and rank 0's is added to it when
 * it comes; the parameters and Adam state are bit-identical to the same
 * pushes in rank order, fp32 and bf16.  If rank 0 is removed meanwhile the
 * step is rank 1's alone, as if rank 1 had pushed after the removal.  With
 * backups the same push is parked instead (its step is acknowledged in two
 * stages). */
static void test_sync_early(void)
{
	static const enum rps_dtype dts[2] = { RPS_DTYPE_F32, RPS_DTYPE_BF16 };
	float g0[COUNT], g1[COUNT];
	char early[32], inorder[32];
	rps_tensor_t *e0, *e1, *o0, *o1;
	struct remove_arg rm;
	rps_request_t *r1;
	unsigned seed = 21, d, i;
	uint64_t taken, parked;

	fake_do(&A, do_views_r1, NULL);
	fake_do(&B, do_views_r1, NULL);
	for (d = 0; d < 2; d++) {
		size_t nb = COUNT * rps__dtype_size(dts[d]);
		snprintf(early, sizeof(early), "early-%u", d);
		snprintf(inorder, sizeof(inorder), "inorder-%u", d);
		CU_ASSERT_EQUAL_FATAL(tensor(w0, early, RPS_MODE_SYNC, dts[d], RPS_OPT_ADAM, &e0), 0);
		CU_ASSERT_EQUAL_FATAL(tensor(w1, early, RPS_MODE_SYNC, dts[d], RPS_OPT_ADAM, &e1), 0);
		CU_ASSERT_EQUAL_FATAL(tensor(w0, inorder, RPS_MODE_SYNC, dts[d], RPS_OPT_ADAM, &o0), 0);
		CU_ASSERT_EQUAL_FATAL(tensor(w1, inorder, RPS_MODE_SYNC, dts[d], RPS_OPT_ADAM, &o1), 0);
		for (i = 0; i < 5; i++) {
			random_grad(g0, dts[d], &seed);
			random_grad(g1, dts[d], &seed);
			taken = A.srv->push.sync_early;
			parked = A.srv->push.sync_parked;
			/* rank 1 first: acknowledged before rank 0 pushed */
			CU_ASSERT_EQUAL(rps_push(e1, g1, nb), 0);
			CU_ASSERT_EQUAL(A.srv->push.sync_early - taken, 4u);	/* every shard */
			CU_ASSERT_EQUAL(A.srv->push.sync_parked, parked);
			CU_ASSERT_EQUAL(A.srv->push.parked_bytes, 0u);
			CU_ASSERT_EQUAL(version_of(&A, early, 0), i);	/* not applied yet */
			CU_ASSERT_EQUAL(find(&A, early)->shards[0].early_rank, 1);
			CU_ASSERT_EQUAL(rps_push(e0, g0, nb), 0);
			CU_ASSERT_EQUAL(version_of(&A, early, 0), i + 1);
			CU_ASSERT_EQUAL(find(&A, early)->shards[0].early_rank, -1);
			/* the reference: the same pushes in rank order */
			CU_ASSERT_EQUAL(rps_push(o0, g0, nb), 0);
			CU_ASSERT_EQUAL(rps_push(o1, g1, nb), 0);
			CU_ASSERT_EQUAL(A.srv->push.sync_early - taken, 4u);
			CU_ASSERT_EQUAL(differing_tensors(early, inorder), 0);
		}
		CU_ASSERT_EQUAL(A.srv->push.nparked, 0u);
		/* rank 0 removed while rank 1's push is in the sum */
		random_grad(g1, dts[d], &seed);
		CU_ASSERT_EQUAL(rps_push(e1, g1, nb), 0);
		CU_ASSERT_EQUAL(version_of(&A, early, 0), 5u);
		rm = (struct remove_arg){ .name = early, .rank = 0 };
		fake_do(&A, do_remove_rank, &rm);
		CU_ASSERT_EQUAL(rm.ret, 1);
		CU_ASSERT_EQUAL(version_of(&A, early, 0), 6u);
		rm = (struct remove_arg){ .name = inorder, .rank = 0 };
		fake_do(&A, do_remove_rank, &rm);
		CU_ASSERT_EQUAL(rm.ret, 1);
		CU_ASSERT_EQUAL(rps_push(o1, g1, nb), 0);
		CU_ASSERT_EQUAL(differing_tensors(early, inorder), 0);
		CU_ASSERT_EQUAL(A.srv->push.nparked, 0u);
		rps_tensor_close(o1);
		rps_tensor_close(o0);
		rps_tensor_close(e1);
		rps_tensor_close(e0);
	}
	/* with backups: parked, not taken early */
	fake_do(&B, do_views_replicated, NULL);
	fake_do(&A, do_views_replicated, NULL);
	CU_ASSERT_EQUAL_FATAL(tensor(w0, "early-r2", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &e0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "early-r2", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &e1), 0);
	random_grad(g0, RPS_DTYPE_F32, &seed);
	random_grad(g1, RPS_DTYPE_F32, &seed);
	taken = A.srv->push.sync_early;
	parked = A.srv->push.sync_parked;
	/* (complete once the step is on B: after rank 0's push) */
	CU_ASSERT_EQUAL_FATAL(rps_push_start(e1, g1, sizeof(g1), &r1), 0);
	CU_ASSERT_EQUAL(await_delta(&A.srv->push.sync_parked, parked, 4), 4u);
	CU_ASSERT_EQUAL(A.srv->push.sync_early, taken);
	CU_ASSERT_EQUAL(rps_push(e0, g0, sizeof(g0)), 0);
	CU_ASSERT_EQUAL(rps_wait(r1), 0);
	CU_ASSERT_EQUAL(version_of(&A, "early-r2", 0), 1u);
	CU_ASSERT_EQUAL(differing_shards("early-r2"), 0);
	rps_tensor_close(e1);
	rps_tensor_close(e0);
}

/* B's loop stalled: an async push is applied on A but neither published
 * (odd seqlock) nor acknowledged; B resumed: acknowledged, identical. */
/* The data plane's part_publish of shard 0's partition, its epoch as is
 * (what a replica set change does: cp_map.c). */
static void do_republish(struct fake *f, void *arg)
{
	struct srv_tensor *t = arg;

	f->dp->part_publish(f->srv, t->shards[0].part, f->srv->parts[t->shards[0].part].epoch);
}

static void test_ack_waits_for_backup(void)
{
	float g[COUNT];
	rps_tensor_t *t;
	rps_request_t *r;
	unsigned seed = 4;
	int res = 1, done;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "stalled", RPS_MODE_ASYNC, RPS_DTYPE_F32, RPS_OPT_SUM, &t), 0);
	CU_ASSERT_EQUAL(differing_shards("stalled"), 0);
	random_grad(g, RPS_DTYPE_F32, &seed);
	fake_stall(&B);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t, g, sizeof(g), &r), 0);
	sleep_ms(300);
	done = rps_test(r, &res);
	CU_ASSERT_EQUAL(done, 0);		/* not complete */
	CU_ASSERT_EQUAL(version_of(&A, "stalled", 0), 1u);	/* applied on A ... */
	CU_ASSERT_EQUAL(find(&A, "stalled")->shards[0].hdr->seq & 1, 1u);	/* ... not published */
	CU_ASSERT_EQUAL(version_of(&B, "stalled", 0), 0u);
	/* nor by an epoch published meanwhile (a replica set change) */
	fake_do(&A, do_republish, find(&A, "stalled"));
	CU_ASSERT_EQUAL(find(&A, "stalled")->shards[0].hdr->seq & 1, 1u);
	fake_resume(&B);
	CU_ASSERT_EQUAL(done ? res : rps_wait(r), 0);
	CU_ASSERT_EQUAL(version_of(&B, "stalled", 0), 1u);
	CU_ASSERT_EQUAL(differing_shards("stalled"), 0);
	rps_tensor_close(t);
}

/* Sync, B stalled: both ranks' pushes of a step are in, the step is
 * applied on A but not published, no push completes and a pull waiting for
 * the step waits; B resumed: all complete, the pull reads the step. */
static void test_sync_ack_waits_for_backup(void)
{
	float g0[COUNT], g1[COUNT], out[COUNT];
	rps_tensor_t *t0, *t1;
	rps_request_t *r0, *r1, *rp;
	uint64_t version = 0;
	unsigned seed = 8;
	int res, d0, d1, dp;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "sync-stalled", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &t0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "sync-stalled", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &t1), 0);
	CU_ASSERT_EQUAL(differing_shards("sync-stalled"), 0);
	random_grad(g0, RPS_DTYPE_F32, &seed);
	random_grad(g1, RPS_DTYPE_F32, &seed);
	fake_stall(&B);
	/* rank 0 first, so neither push is parked (parked ones are acked at once) */
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t0, g0, sizeof(g0), &r0), 0);
	sleep_ms(50);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t1, g1, sizeof(g1), &r1), 0);
	sleep_ms(50);
	CU_ASSERT_EQUAL_FATAL(rps_pull_start(t0, out, sizeof(out), &version, &rp), 0);
	sleep_ms(300);
	d0 = rps_test(r0, &res);
	d1 = rps_test(r1, &res);
	dp = rps_test(rp, &res);
	CU_ASSERT_EQUAL(d0, 0);
	CU_ASSERT_EQUAL(d1, 0);
	CU_ASSERT_EQUAL(dp, 0);
	CU_ASSERT_EQUAL(version_of(&A, "sync-stalled", 2), 1u);	/* applied on A ... */
	CU_ASSERT_EQUAL(find(&A, "sync-stalled")->shards[2].hdr->seq & 1, 1u);	/* ... not published */
	CU_ASSERT_EQUAL(version_of(&B, "sync-stalled", 2), 0u);
	fake_resume(&B);
	if (!d0)
		CU_ASSERT_EQUAL(rps_wait(r0), 0);
	if (!d1)
		CU_ASSERT_EQUAL(rps_wait(r1), 0);
	if (!dp)
		CU_ASSERT_EQUAL(rps_wait(rp), 0);
	CU_ASSERT_EQUAL(version, 1u);
	CU_ASSERT_EQUAL(differing_shards("sync-stalled"), 0);
	rps_tensor_close(t1);
	rps_tensor_close(t0);
}

/* B stalled with more shard pushes in flight (4 tensors x 4 shards) than
 * it has slots (8): exactly 8 entries go, the rest wait held on A; B
 * resumed, every push is applied once, on both. */
static void test_credit_exhaustion(void)
{
	static const char *names[4] = { "credit-0", "credit-1", "credit-2", "credit-3" };
	float g[COUNT], out[COUNT];
	rps_tensor_t *t[4];
	rps_request_t *r[4];
	uint64_t sent, version;
	unsigned seed = 5;
	int k;

	for (k = 0; k < 4; k++) {
		CU_ASSERT_EQUAL_FATAL(tensor(w0, names[k], RPS_MODE_ASYNC, RPS_DTYPE_F32, RPS_OPT_SUM, &t[k]), 0);
		/* bound on the stream first: bindings take credits too */
		random_grad(g, RPS_DTYPE_F32, &seed);
		CU_ASSERT_EQUAL(rps_push(t[k], g, sizeof(g)), 0);
	}
	fake_stall(&B);
	sent = A.srv->repl.stats.entries_sent;
	for (k = 0; k < 4; k++)
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t[k], g, sizeof(g), &r[k]), 0);
	sleep_ms(300);
	CU_ASSERT_EQUAL(A.srv->repl.stats.entries_sent - sent, REPL_SLOTS);
	CU_ASSERT(A.srv->push.nheld >= 16u - REPL_SLOTS);
	fake_resume(&B);
	for (k = 0; k < 4; k++) {
		CU_ASSERT_EQUAL(rps_wait(r[k]), 0);
		CU_ASSERT_EQUAL(rps_pull(t[k], out, sizeof(out), &version), 0);
		CU_ASSERT_EQUAL(version, 2u);
		CU_ASSERT_EQUAL(differing_shards(names[k]), 0);
		rps_tensor_close(t[k]);
	}
	CU_ASSERT_EQUAL(A.srv->repl.stats.entries_sent - sent, 16u);
}

/* Sync with B stalled and more steps (3 tensors x 4 shards) than B has
 * slots: 8 steps go; the last contributions of the others wait in their
 * slots (in turn, waiting only for credits: not parked, which would
 * acknowledge them); no push completes before B resumed. */
static void test_sync_credit_exhaustion(void)
{
	static const char *names[3] = { "sync-credit-0", "sync-credit-1", "sync-credit-2" };
	float g[COUNT];
	rps_tensor_t *t0[3], *t1[3];
	rps_request_t *r[6];
	uint64_t sent;
	unsigned seed = 9;
	int k, res, done = 0, d[6];

	for (k = 0; k < 3; k++) {
		CU_ASSERT_EQUAL_FATAL(tensor(w0, names[k], RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t0[k]), 0);
		CU_ASSERT_EQUAL_FATAL(tensor(w1, names[k], RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t1[k]), 0);
		CU_ASSERT_EQUAL(differing_shards(names[k]), 0);	/* bound and initialised on B */
	}
	random_grad(g, RPS_DTYPE_F32, &seed);
	fake_stall(&B);
	sent = A.srv->repl.stats.entries_sent;
	for (k = 0; k < 3; k++)
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t0[k], g, sizeof(g), &r[k]), 0);
	sleep_ms(50);
	for (k = 0; k < 3; k++)
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t1[k], g, sizeof(g), &r[3 + k]), 0);
	sleep_ms(300);
	CU_ASSERT_EQUAL(A.srv->repl.stats.entries_sent - sent, REPL_SLOTS);
	CU_ASSERT_EQUAL(A.srv->push.nparked, 0u);
	for (k = 0; k < 6; k++)
		done += d[k] = rps_test(r[k], &res);
	CU_ASSERT_EQUAL(done, 0);
	fake_resume(&B);
	for (k = 0; k < 6; k++)
		if (!d[k])
			CU_ASSERT_EQUAL(rps_wait(r[k]), 0);
	CU_ASSERT_EQUAL(A.srv->repl.stats.entries_sent - sent, 12u);
	for (k = 0; k < 3; k++) {
		CU_ASSERT_EQUAL(version_of(&B, names[k], 3), 1u);
		CU_ASSERT_EQUAL(differing_shards(names[k]), 0);
		rps_tensor_close(t1[k]);
		rps_tensor_close(t0[k]);
	}
}

/*
 * Sync with backups: a rank removal (psctl remove-rank) completes a step
 * while B has no credit left (stalled, its slots full of another tensor's
 * entries).  The step is owed, not applied, and is applied once B's
 * acknowledgements bring the credits back.  Before, nothing tried it again
 * when the credits came back (push.c's "Not handled"): rank 0's push
 * waited for its step until its timeout.
 */
static void test_sync_removal_without_credit(void)
{
	float g[COUNT], f[COUNT];
	static const char *fills[4] = { "owed-fill-0", "owed-fill-1", "owed-fill-2", "owed-fill-3" };
	rps_tensor_t *s0, *s1, *fill[4];
	rps_request_t *r0, *rf[4];
	struct remove_arg rm;
	uint64_t sent, taken;
	unsigned seed = 31, sh;
	int k;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "owed", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &s0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "owed", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &s1), 0);
	random_grad(g, RPS_DTYPE_F32, &seed);
	random_grad(f, RPS_DTYPE_F32, &seed);
	for (k = 0; k < 4; k++) {
		CU_ASSERT_EQUAL_FATAL(tensor(w0, fills[k], RPS_MODE_ASYNC, RPS_DTYPE_F32, RPS_OPT_SUM, &fill[k]), 0);
		CU_ASSERT_EQUAL(rps_push(fill[k], f, sizeof(f)), 0);	/* bound on the stream first */
	}
	CU_ASSERT_EQUAL(differing_shards("owed"), 0);		/* bound and initialised on B */
	/* rank 0's push of step 0: in turn, TAKEN, the step waits for rank 1 */
	taken = A.srv->repl.stats.taken_acks;
	CU_ASSERT_EQUAL_FATAL(rps_push_start(s0, g, sizeof(g), &r0), 0);
	CU_ASSERT_EQUAL(await_delta(&A.srv->repl.stats.taken_acks, taken, 4), 4u);
	fake_stall(&B);
	sent = A.srv->repl.stats.entries_sent;
	for (k = 0; k < 4; k++)		/* 16 entries for B's 8 slots */
		CU_ASSERT_EQUAL_FATAL(rps_push_start(fill[k], f, sizeof(f), &rf[k]), 0);
	CU_ASSERT_EQUAL(await_delta(&A.srv->repl.stats.entries_sent, sent, REPL_SLOTS), REPL_SLOTS);
	rm = (struct remove_arg){ .name = "owed", .rank = 1 };
	fake_do(&A, do_remove_rank, &rm);
	CU_ASSERT_EQUAL(rm.ret, 1);
	for (sh = 0; sh < 4; sh++)
		CU_ASSERT_EQUAL(version_of(&A, "owed", sh), 0u);	/* owed: no credit */
	fake_resume(&B);
	CU_ASSERT_EQUAL(rps_wait(r0), 0);
	for (k = 0; k < 4; k++)
		CU_ASSERT_EQUAL(rps_wait(rf[k]), 0);
	for (sh = 0; sh < 4; sh++) {
		CU_ASSERT_EQUAL(version_of(&A, "owed", sh), 1u);
		CU_ASSERT_EQUAL(version_of(&B, "owed", sh), 1u);
	}
	CU_ASSERT_EQUAL(differing_shards("owed"), 0);
	CU_ASSERT_EQUAL(A.srv->push.advances_owed, 0u);
	for (k = 0; k < 4; k++)
		rps_tensor_close(fill[k]);
	rps_tensor_close(s1);
	rps_tensor_close(s0);
}

/* Poll until *v - base == want (at most 3 s); returns the difference. */
static uint64_t await_delta(const uint64_t *v, uint64_t base, uint64_t want)
{
	int i;

	for (i = 0; i < 300 && __atomic_load_n(v, __ATOMIC_RELAXED) - base != want; i++)
		sleep_ms(10);
	return __atomic_load_n(v, __ATOMIC_RELAXED) - base;
}

/*
 * The two-stage sync acknowledgement, B stalled.  Rank 1 pushes step 0 of
 * 5 tensors x 4 shards (20 shard pushes, more than its 16 slots) first:
 * out of turn, every one is parked and acknowledged TAKEN at once, so all
 * 20 reach A through 16 slots; none completes.  Rank 0's 20 are summed in
 * turn, TAKEN at once too; 8 steps fit B's credits, 12 stay parked; no
 * STEP_DONE goes out.  B resumed: every push completes, with one STEP_DONE
 * entry per (connection, shard), and no second PUSH_ACK; replicas
 * identical.  Step 1, rank 0 first, completes too: the last entry names
 * step 1, version 2.
 */
static void do_refuse_all(struct fake *f, void *arg)
{
	uint32_t p;

	(void)arg;
	for (p = 0; p < NPART; p++)
		f->dp->part_refuse(f->srv, p);
}

/* A partition refused (moved away, or paused for a move or a seeding)
 * while sync pushes are TAKEN there and their step is not replicated: the
 * waits are not left to time out; each connection is told to resend
 * (STEP_DONE entries of version 0), the resends come back (here, to the
 * same server: TAKEN again, the step already has them), and once the step
 * is replicated they complete, counted once. */
static void test_sync_refused_resend(void)
{
	struct rps__server *a = A.srv;
	float g[COUNT];
	rps_tensor_t *t0, *t1;
	rps_request_t *r0, *r1;
	uint64_t taken, resend, acks;
	unsigned seed = 12;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "refused-resend", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "refused-resend", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t1), 0);
	CU_ASSERT_EQUAL(differing_shards("refused-resend"), 0);
	random_grad(g, RPS_DTYPE_F32, &seed);
	fake_stall(&B);
	taken = a->repl.stats.taken_acks;
	resend = a->repl.stats.step_done_resend;
	acks = a->worker_msgs[RPS__MSG_PUSH_ACK];
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t0, g, sizeof(g), &r0), 0);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t1, g, sizeof(g), &r1), 0);
	CU_ASSERT_EQUAL(await_delta(&a->repl.stats.taken_acks, taken, 8), 8u);	/* 4 shards x 2 ranks */
	fake_do(&A, do_refuse_all, NULL);
	CU_ASSERT_EQUAL(a->repl.stats.step_done_resend - resend, 8u);
	fake_resume(&B);
	/* rps_wait resends them (the map still names A): the step has them,
	 * answered TAKEN again or, once replicated, -EALREADY (counted) */
	CU_ASSERT_EQUAL(rps_wait(r0), 0);
	CU_ASSERT_EQUAL(rps_wait(r1), 0);
	CU_ASSERT_EQUAL(a->worker_msgs[RPS__MSG_PUSH_ACK] - acks, 16u);
	CU_ASSERT_EQUAL(version_of(&A, "refused-resend", 0), 1u);
	CU_ASSERT_EQUAL(differing_shards("refused-resend"), 0);
	rps_tensor_close(t0);
	rps_tensor_close(t1);
}

static void test_sync_two_stage_ack(void)
{
	static const char *names[5] = { "two-stage-0", "two-stage-1", "two-stage-2", "two-stage-3", "two-stage-4" };
	struct rps__server *a = A.srv;
	float g[COUNT];
	rps_tensor_t *t0[5], *t1[5];
	rps_request_t *r0[5], *r1[5];
	uint64_t taken, sent, sd, sde, acks, flagged;
	unsigned seed = 11;
	int k, res, done = 0, d0[5] = { 0 }, d1[5] = { 0 };
	uint32_t sh;

	for (k = 0; k < 5; k++) {
		CU_ASSERT_EQUAL_FATAL(tensor(w0, names[k], RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &t0[k]), 0);
		CU_ASSERT_EQUAL_FATAL(tensor(w1, names[k], RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &t1[k]), 0);
		CU_ASSERT_EQUAL(differing_shards(names[k]), 0);	/* bound and initialised on B */
	}
	random_grad(g, RPS_DTYPE_F32, &seed);
	fake_stall(&B);
	taken = a->repl.stats.taken_acks;
	sent = a->repl.stats.entries_sent;
	sd = a->repl.stats.step_done_sent;
	sde = a->repl.stats.step_done_entries;
	acks = a->worker_msgs[RPS__MSG_PUSH_ACK];
	flagged = a->worker_acks_flagged;
	for (k = 0; k < 5; k++)
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t1[k], g, sizeof(g), &r1[k]), 0);
	CU_ASSERT_EQUAL(await_delta(&a->repl.stats.taken_acks, taken, 20), 20u);
	sleep_ms(50);
	CU_ASSERT_EQUAL(a->push.nparked, 20u);
	CU_ASSERT_EQUAL(a->push.nheld, 0u);
	for (k = 0; k < 5; k++)
		done += d1[k] = rps_test(r1[k], &res);	/* (a done request is collected: not waited below) */
	CU_ASSERT_EQUAL(done, 0);
	for (k = 0; k < 5; k++)
		CU_ASSERT_EQUAL_FATAL(rps_push_start(t0[k], g, sizeof(g), &r0[k]), 0);
	CU_ASSERT_EQUAL(await_delta(&a->repl.stats.taken_acks, taken, 40), 40u);
	sleep_ms(100);
	CU_ASSERT_EQUAL(a->repl.stats.entries_sent - sent, REPL_SLOTS);
	CU_ASSERT_EQUAL(a->push.nparked, 20u - REPL_SLOTS);
	CU_ASSERT_EQUAL(a->push.nheld, 0u);
	CU_ASSERT_EQUAL(a->repl.stats.step_done_sent - sd, 0u);
	CU_ASSERT_EQUAL(a->worker_msgs[RPS__MSG_PUSH_ACK] - acks, 40u);
	CU_ASSERT_EQUAL(a->worker_acks_flagged - flagged, 40u);
	for (k = 0; k < 5; k++) {
		done += d0[k] = rps_test(r0[k], &res);
		if (!d1[k])
			done += d1[k] = rps_test(r1[k], &res);
	}
	CU_ASSERT_EQUAL(done, 0);
	CU_ASSERT_EQUAL(version_of(&B, names[0], 0), 0u);
	fake_resume(&B);
	for (k = 0; k < 5; k++) {
		if (!d0[k])
			CU_ASSERT_EQUAL(rps_wait(r0[k]), 0);
		if (!d1[k])
			CU_ASSERT_EQUAL(rps_wait(r1[k]), 0);
	}
	CU_ASSERT_EQUAL(a->repl.stats.step_done_entries - sde, 40u);
	CU_ASSERT(a->repl.stats.step_done_sent - sd >= 2u);	/* batched: at least one per connection */
	CU_ASSERT(a->repl.stats.step_done_sent - sd <= 40u);
	CU_ASSERT_EQUAL(a->worker_msgs[RPS__MSG_PUSH_ACK] - acks, 40u);	/* no second ack */
	CU_ASSERT_EQUAL(a->repl.stats.taken_acks - taken, 40u);
	for (k = 0; k < 5; k++) {
		for (sh = 0; sh < 4; sh++) {
			CU_ASSERT_EQUAL(version_of(&A, names[k], sh), 1u);
			CU_ASSERT_EQUAL(version_of(&B, names[k], sh), 1u);
		}
		CU_ASSERT_EQUAL(differing_shards(names[k]), 0);
	}
	/* step 1 of one tensor, rank 0 in turn first */
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t0[0], g, sizeof(g), &r0[0]), 0);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t1[0], g, sizeof(g), &r1[0]), 0);
	CU_ASSERT_EQUAL(rps_wait(r0[0]), 0);
	CU_ASSERT_EQUAL(rps_wait(r1[0]), 0);
	CU_ASSERT_EQUAL(a->repl.stats.last_step_done.step, 1u);
	CU_ASSERT_EQUAL(a->repl.stats.last_step_done.version, 2u);
	CU_ASSERT_EQUAL(a->repl.stats.last_step_done.tensor_id, find(&A, names[0])->id);
	CU_ASSERT_EQUAL(differing_shards(names[0]), 0);
	CU_ASSERT_EQUAL(a->repl.nrwaits, 0u);
	for (k = 0; k < 5; k++) {
		rps_tensor_close(t1[k]);
		rps_tensor_close(t0[k]);
	}
}

/* A worker of rank 1 resending its push of step 0 to shard 0, fed to A's
 * push path on A's loop thread.  The connection is marked dead, so A
 * sends it nothing: what A decided shows in its counters and waits. */
static struct srv_conn resender;

static void do_resend(struct fake *f, void *arg)
{
	struct srv_tensor *t = arg;
	struct rps__push_desc *d;

	if (!resender.bufs.slots) {
		resender.srv = f->srv;
		resender.role = CONN_WORKER;
		resender.hello_done = true;
		resender.dead = true;
		resender.rank = 1;
		resender.client_id = 0x5e5e;
		resender.bufs.slots = calloc(1, f->srv->slot_size);
		resender.bufs.slot_state = calloc(f->srv->cfg.nslots, 1);
		if (!resender.bufs.slots || !resender.bufs.slot_state)
			return;
	}
	d = (struct rps__push_desc *)resender.bufs.slots;
	memset(d, 0, RPS__PUSH_DESC_SIZE);
	d->magic = RPS__DESC_MAGIC;
	d->kind = RPS__PUSH_GRAD;
	d->dtype = RPS_DTYPE_F32;
	d->tensor_id = t->id;
	d->shard = 0;
	d->nbytes = t->shards[0].elems * 4u;
	d->rank = 1;
	d->clock = 0;
	d->push_id = 77;
	d->epoch = f->srv->parts[t->shards[0].part].epoch;
	rps__srv_on_push(f->srv, &resender, 0);
}

static void do_resender_gone(struct fake *f, void *arg)
{
	(void)arg;
	rps__srv_repl_conn_gone(f->srv, &resender);
	free(resender.sd.ent);
	free(resender.bufs.slots);
	free(resender.bufs.slot_state);
	memset(&resender, 0, sizeof(resender));
}

/* A resend of a contribution its step already has: while the step is not
 * on B (stalled), TAKEN again and a STEP_DONE owed (the worker must not
 * count it done before the step is replicated); once it is, -EALREADY
 * (the worker counts that as done for a resend), nothing owed. */
static void test_sync_resend(void)
{
	float g[COUNT];
	rps_tensor_t *t0, *t1;
	rps_request_t *r0, *r1;
	uint64_t taken;
	unsigned seed = 12;
	uint32_t waits;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "resend", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "resend", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t1), 0);
	CU_ASSERT_EQUAL(differing_shards("resend"), 0);
	random_grad(g, RPS_DTYPE_F32, &seed);
	fake_stall(&B);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t0, g, sizeof(g), &r0), 0);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t1, g, sizeof(g), &r1), 0);
	CU_ASSERT_EQUAL(await_delta(&find(&A, "resend")->shards[0].step, 0, 1), 1u);	/* applied on A */
	sleep_ms(50);
	taken = A.srv->repl.stats.taken_acks;
	waits = A.srv->repl.nrwaits;
	fake_do(&A, do_resend, find(&A, "resend"));
	CU_ASSERT_EQUAL(A.srv->repl.stats.taken_acks - taken, 1u);
	CU_ASSERT_EQUAL(A.srv->repl.nrwaits, waits + 1u);
	CU_ASSERT_EQUAL(resender.bufs.slot_state[0], 0);	/* the slot is free */
	fake_resume(&B);
	CU_ASSERT_EQUAL(rps_wait(r0), 0);
	CU_ASSERT_EQUAL(rps_wait(r1), 0);
	for (waits = 0; waits < 300 && __atomic_load_n(&A.srv->repl.nrwaits, __ATOMIC_RELAXED); waits++)
		sleep_ms(10);
	CU_ASSERT_EQUAL(A.srv->repl.nrwaits, 0u);
	CU_ASSERT_EQUAL(resender.sd.n, 1u);	/* owed (dead: never sent) */
	if (resender.sd.n) {
		CU_ASSERT_EQUAL(resender.sd.ent[0].step, 0u);
		CU_ASSERT_EQUAL(resender.sd.ent[0].version, 1u);
	}
	taken = A.srv->repl.stats.taken_acks;
	fake_do(&A, do_resend, find(&A, "resend"));
	CU_ASSERT_EQUAL(A.srv->repl.stats.taken_acks - taken, 0u);	/* -EALREADY, nothing owed */
	CU_ASSERT_EQUAL(A.srv->repl.nrwaits, 0u);
	CU_ASSERT_EQUAL(resender.bufs.slot_state[0], 0);
	CU_ASSERT_EQUAL(version_of(&A, "resend", 0), 1u);	/* counted once */
	CU_ASSERT_EQUAL(differing_shards("resend"), 0);
	fake_do(&A, do_resender_gone, NULL);
	rps_tensor_close(t1);
	rps_tensor_close(t0);
}

struct orphan_arg {
	const char *name;
	int rank;
};

/* As requests.c does when a rank's last connection leaves before its push
 * for the step (rps__srv_rank_left). */
static void do_orphan(struct fake *f, void *arg)
{
	struct orphan_arg *o = arg;
	struct srv_tensor *t = find(f, o->name);

	for (uint32_t j = 0; t && j < t->layout.nshards; j++)
		rps__srv_repl_step_orphaned(f->srv, &t->shards[j], o->rank);
}

/* Does f hold rank's push of `clock` to shard j of `name`, parked, these bytes? */
static bool parked_on(struct fake *f, const char *name, uint32_t j, int rank, uint64_t clock, const void *data,
		      size_t nbytes)
{
	struct srv_tensor *t = find(f, name);

	for (uint32_t i = 0; t && i < f->srv->push.nparked; i++) {
		const struct parked *pk = &f->srv->push.parked[i];
		if (pk->t == t && pk->local == j && pk->rank == rank && pk->clock == clock)
			return pk->data && pk->nbytes == nbytes && !memcmp(pk->data, data, nbytes);
	}
	return false;
}

static uint32_t parked_of(struct fake *f, const char *name)
{
	struct srv_tensor *t = find(f, name);
	uint32_t i, n = 0;

	for (i = 0; t && i < f->srv->push.nparked; i++)
		n += f->srv->push.parked[i].t == t;
	return n;
}

/* Sync with a backup, rank 1 gone before its push of step 0: rank 0's
 * pushes of step 0 (in the sum) and step 1 (parked) are ended as taken
 * (the worker forgets them) only once B holds them: the sum so far, the
 * parked push.  B, were it promoted, completes the step with rank 1's
 * replacement alone.  Then rank 1 pushes after all: both steps apply, the
 * replicas are identical and B keeps nothing parked. */
static void test_sync_orphan_replicated(void)
{
	struct orphan_arg o = { "orphan", 1 };
	float g0[COUNT], h0[COUNT], g1[COUNT], h1[COUNT];
	rps_tensor_t *t0, *t1;
	rps_request_t *r0, *r1;
	struct srv_tensor *ta, *tb;
	uint64_t taken, ent, orph;
	unsigned seed = 31;
	int res, done = 0;
	uint32_t j;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "orphan", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "orphan", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t1), 0);
	CU_ASSERT_EQUAL(differing_shards("orphan"), 0);
	random_grad(g0, RPS_DTYPE_F32, &seed);
	random_grad(h0, RPS_DTYPE_F32, &seed);
	random_grad(g1, RPS_DTYPE_F32, &seed);
	random_grad(h1, RPS_DTYPE_F32, &seed);
	fake_stall(&B);
	taken = A.srv->repl.stats.taken_acks;
	ent = A.srv->repl.stats.orphan_entries;
	orph = A.srv->repl.stats.step_done_orphaned;
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t0, g0, sizeof(g0), &r0), 0);
	CU_ASSERT_EQUAL(await_delta(&A.srv->repl.stats.taken_acks, taken, 4), 4u);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t0, h0, sizeof(h0), &r1), 0);
	CU_ASSERT_EQUAL(await_delta(&A.srv->repl.stats.taken_acks, taken, 8), 8u);
	fake_do(&A, do_orphan, &o);
	CU_ASSERT_EQUAL(await_delta(&A.srv->repl.stats.orphan_entries, ent, 8), 8u);	/* 4 sums, 4 parked */
	sleep_ms(100);
	CU_ASSERT_EQUAL(A.srv->repl.stats.step_done_orphaned - orph, 0u);	/* not on B yet */
	done += rps_test(r0, &res);
	done += rps_test(r1, &res);
	CU_ASSERT_EQUAL(done, 0);
	fake_resume(&B);
	CU_ASSERT_EQUAL(rps_wait(r0), 0);
	CU_ASSERT_EQUAL(rps_wait(r1), 0);
	CU_ASSERT_EQUAL(A.srv->repl.stats.step_done_orphaned - orph, 8u);
	CU_ASSERT_EQUAL(A.srv->repl.stats.orphan_entries - ent, 8u);
	ta = find(&A, "orphan");
	tb = find(&B, "orphan");
	CU_ASSERT_FATAL(ta && tb);
	for (j = 0; j < tb->layout.nshards; j++) {
		const struct shard *b = &tb->shards[j];
		size_t first = rps__shard_first(&tb->layout, j), nb = (size_t)b->elems * 4u;
		CU_ASSERT_EQUAL(b->step, 0u);
		CU_ASSERT_EQUAL(b->next_rank, 1);
		CU_ASSERT_EQUAL(b->nsummed, 1u);
		CU_ASSERT_EQUAL(memcmp(b->acc, g0 + first, nb), 0);
		CU_ASSERT_EQUAL(memcmp(b->acc, ta->shards[j].acc, nb), 0);
		CU_ASSERT(parked_on(&B, "orphan", j, 0, 1, h0 + first, nb));
	}
	CU_ASSERT_EQUAL(parked_of(&B, "orphan"), tb->layout.nshards);
	/* rank 1 after all: both steps complete, as without the orphaning */
	CU_ASSERT_EQUAL(rps_push(t1, g1, sizeof(g1)), 0);
	CU_ASSERT_EQUAL(rps_push(t1, h1, sizeof(h1)), 0);
	for (j = 0; j < ta->layout.nshards; j++) {
		CU_ASSERT_EQUAL(version_of(&A, "orphan", j), 2u);
		CU_ASSERT_EQUAL(version_of(&B, "orphan", j), 2u);
	}
	CU_ASSERT_EQUAL(differing_shards("orphan"), 0);
	CU_ASSERT_EQUAL(parked_of(&A, "orphan"), 0u);
	CU_ASSERT_EQUAL(parked_of(&B, "orphan"), 0u);
	rps_tensor_close(t1);
	rps_tensor_close(t0);
}

static struct repl_peer *peer_of(struct fake *f, uint64_t id)
{
	uint32_t i;

	for (i = 0; i < f->srv->repl.npeers; i++)
		if (f->srv->repl.peers[i].id == id)
			return &f->srv->repl.peers[i];
	return NULL;
}

static struct fake C;

static void do_want_c(struct fake *f, void *arg)
{
	f->dp->repl_peer(f->srv, 3, uri_c);
	peer_of(f, 3)->wanted = *(bool *)arg;
}

/* C (member 3) backs partition 0 of A, or not: it dials A for the stream
 * (the higher member id dials). */
static void do_c_backs_a(struct fake *f, void *arg)
{
	struct rps__dp_part v = { .epoch = map.parts[0].epoch, .map_epoch = map.parts[0].epoch, .primary = 1 };

	if (*(bool *)arg) {
		v.backups[0] = 3;
		v.nbackups = 1;
		v.backup = true;
	}
	f->dp->set_map(f->srv, NPART, 1);
	f->dp->repl_peer(f->srv, 1, uri_a);
	f->dp->part_set(f->srv, 0, &v);
}

/* A server whose kernel fingerprint differs (another build, or another
 * aggregation/optimizer variant chosen at run time) refuses to pair: both
 * sides count the refusal, nothing is ever ready to carry entries. */
static void test_fingerprint_mismatch(void)
{
	struct repl_peer *p;
	bool want = true;

	CU_ASSERT_EQUAL_FATAL(fake_server(&C, 3), 0);
	uri_of(uri_c, sizeof(uri_c), &C);
	snprintf(C.srv->repl.fp, sizeof(C.srv->repl.fp), "rdmaps 0.0.0 agg=other optim=9");
	CU_ASSERT_EQUAL_FATAL(-pthread_create(&C.thread, NULL, loop_main, &C), 0);
	fake_do(&A, do_want_c, &want);
	fake_do(&C, do_c_backs_a, &want);
	sleep_ms(300);
	want = false;
	fake_do(&C, do_c_backs_a, &want);
	fake_do(&A, do_want_c, &want);
	p = peer_of(&A, 3);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT(!p->conn || !p->conn->repl.ready);
	CU_ASSERT(C.srv->repl.stats.pairings_refused >= 1u);
	CU_ASSERT(A.srv->repl.stats.pairings_refused >= 1u);
	CU_ASSERT_EQUAL(C.srv->repl.stats.entries_applied, 0u);
	fake_fini(&C);
}

static uint32_t job_part;

/* B's map is one epoch ahead for a partition: A deposed (member 3 made
 * primary, A not told yet), or (arg) the same primary with its replica
 * set changed (A has not applied it yet). */
static void do_epoch_ahead(struct fake *f, void *arg)
{
	const struct rps__smap_part *mp = &map.parts[job_part];
	struct rps__dp_part v = {
		.epoch = mp->epoch + 1, .map_epoch = mp->epoch + 1, .primary = arg ? mp->owner : 3,
		.backups = { f->id }, .nbackups = 1, .backup = true,
	};

	f->dp->part_set(f->srv, job_part, &v);
}

static void do_drop_backup(struct fake *f, void *arg)
{
	(void)arg;
	part_view(f, job_part, map.parts[job_part].epoch, false);
}

/* Partition job_part: B joins it (being seeded, arg: its image not in
 * yet) instead of backing it up, or (NULL) backs it up again. */
static void do_joining(struct fake *f, void *arg)
{
	const struct rps__smap_part *mp = &map.parts[job_part];
	struct rps__dp_part v = { .epoch = mp->epoch, .map_epoch = mp->epoch, .serving = mp->owner == f->id,
				  .primary = mp->owner };

	if (!arg) {
		part_view(f, job_part, mp->epoch, true);
		return;
	}
	v.joining = 2;
	v.backup = f->id == 2;
	f->dp->part_set(f->srv, job_part, &v);
}

static void do_seq_set(struct fake *f, void *arg)
{
	f->dp->part_repl_seq_set(f->srv, job_part, *(const uint64_t *)arg);
}

/* A joiner whose image is not in yet takes the entries its primary ships
 * before fencing the partition (the image, cut after them, holds them):
 * acknowledged, not applied, the stream kept.  Breaking it instead would
 * stall every partition the stream carries. */
static void test_joiner_before_image(void)
{
	float g[COUNT];
	rps_tensor_t *t;
	unsigned seed = 8;
	uint64_t refused = B.srv->repl.stats.refused, seq;
	int joining = 1;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "joining", RPS_MODE_ASYNC, RPS_DTYPE_F32, RPS_OPT_SUM, &t), 0);
	job_part = find(&A, "joining")->shards[0].part;
	fake_do(&B, do_joining, &joining);
	fake_do(&A, do_joining, &joining);
	random_grad(g, RPS_DTYPE_F32, &seed);
	CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), 0);
	CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), 0);
	CU_ASSERT_EQUAL(version_of(&A, "joining", 0), 2u);
	CU_ASSERT_EQUAL(version_of(&B, "joining", 0), 0u);	/* skipped: the image brings it */
	CU_ASSERT_EQUAL(B.srv->repl.stats.refused, refused);
	CU_ASSERT_PTR_NOT_NULL(peer_of(&A, 2)->conn);
	CU_ASSERT_EQUAL(A.srv->repl.diverged[job_part], 0u);
	/* B a backup again, its stream position as an installed image's */
	seq = A.srv->repl.seq[job_part];
	fake_do(&B, do_seq_set, &seq);
	fake_do(&B, do_joining, NULL);
	fake_do(&A, do_joining, NULL);
	rps_tensor_close(t);
}

/* Seeding B again from A's image of a partition B backs (as when a
 * member is seeded as a backup of a partition it served or backed until
 * then: a planned switch's old primary).  Workers may still name B's
 * old copy by an older map: it is not deregistered at once (their CAS or
 * READ would be a remote access error, taking their whole connection
 * down), but sealed, marked moved, and kept --drain-ms. */
struct reseed {
	const char *name;
	uint32_t part, drain_ms, regions, retired_before, retired_after;
	void *img;
	size_t len;
	int ret;
	uint64_t seq;		/* A's stream position at the image */
	const struct rps__shard_hdr *old_hdr;
	uint64_t old_epoch, old_lock;
	const void *old_mem, *new_mem;
};

static void do_image_build(struct fake *f, void *arg)
{
	struct reseed *a = arg;

	a->ret = rps__srv_image_build(f->srv, a->part, f->srv->parts[a->part].epoch, &a->img, &a->len);
	a->seq = f->srv->repl.seq[a->part];
}

static void do_image_install_backup(struct fake *f, void *arg)
{
	struct reseed *a = arg;
	struct srv_tensor *t = find(f, a->name);
	uint32_t i;

	a->regions = 0;
	for (i = 0; i < f->srv->ntensors; i++)
		a->regions += f->srv->tensors[i] && f->srv->tensors[i]->regions[a->part].mem != NULL;
	a->old_mem = t->regions[a->part].mem;
	a->old_hdr = t->shards[rps__part_shard(&t->layout, a->part, 0)].hdr;
	a->retired_before = f->srv->retired.n;
	f->srv->cfg.drain_ms = a->drain_ms;
	a->ret = rps__srv_image_install_backup(f->srv, a->part, f->srv->parts[a->part].epoch, a->img, a->len,
						a->seq);
	a->retired_after = f->srv->retired.n;
	a->new_mem = t->regions[a->part].mem;
	a->old_epoch = __atomic_load_n(&a->old_hdr->epoch, __ATOMIC_ACQUIRE);	/* (still mapped) */
	a->old_lock = __atomic_load_n(&a->old_hdr->lock, __ATOMIC_ACQUIRE);
}

static void do_retired_count(struct fake *f, void *arg)
{
	*(uint32_t *)arg = f->srv->retired.n;
}

static void test_reseed_retires_region(void)
{
	struct reseed a = { .name = "reseed", .drain_ms = 300 };
	float g[COUNT];
	rps_tensor_t *t;
	unsigned seed = 12;
	uint32_t left = 0;
	int i;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "reseed", RPS_MODE_ASYNC, RPS_DTYPE_F32, RPS_OPT_SGD, &t), 0);
	random_grad(g, RPS_DTYPE_F32, &seed);
	CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), 0);
	a.part = find(&A, "reseed")->shards[0].part;
	fake_do(&A, do_image_build, &a);
	CU_ASSERT_EQUAL_FATAL(a.ret, 0);
	fake_do(&B, do_image_install_backup, &a);
	CU_ASSERT_EQUAL(a.ret, 0);
	CU_ASSERT(a.regions >= 1);
	CU_ASSERT_EQUAL(a.retired_after, a.retired_before + a.regions);	/* every region the image replaced */
	CU_ASSERT_PTR_NOT_NULL(a.new_mem);
	CU_ASSERT(a.new_mem != a.old_mem);
	CU_ASSERT_EQUAL(a.old_epoch, RPS__EPOCH_MOVED);
	CU_ASSERT(rps__lock_is_locked(a.old_lock) && rps__lock_owner(a.old_lock) == RPS__LOCK_OWNER_FENCE);
	CU_ASSERT_EQUAL(differing_shards("reseed"), 0);	/* what was installed is A's */
	/* gone once --drain-ms passed (the loop's timer: every 250 ms) */
	for (i = 0; i < 200; i++) {
		fake_do(&B, do_retired_count, &left);
		if (left == a.retired_before)
			break;
		sleep_ms(10);
	}
	CU_ASSERT_EQUAL(left, a.retired_before);
	free(a.img);
	rps_tensor_close(t);
}

/* An entry under an epoch older than B's map is refused (REPL_NACK): B
 * applies nothing, A breaks the stream, the worker gets no ack.  Once A's
 * view of that partition drops B (the map's REPLICA_DROP), its update is
 * no longer waited for: published; the other partitions' still wait. */
static void test_old_epoch_refused(void)
{
	float g[COUNT];
	rps_tensor_t *t;
	unsigned seed = 6;
	uint32_t nwaits;

	CU_ASSERT_EQUAL_FATAL(tensor(quick, "old-epoch", RPS_MODE_ASYNC, RPS_DTYPE_F32, RPS_OPT_SUM, &t), 0);
	CU_ASSERT_EQUAL(differing_shards("old-epoch"), 0);
	job_part = find(&A, "old-epoch")->shards[0].part;
	fake_do(&B, do_epoch_ahead, NULL);
	random_grad(g, RPS_DTYPE_F32, &seed);
	CU_ASSERT_NOT_EQUAL(rps_push(t, g, sizeof(g)), 0);	/* never acknowledged */
	CU_ASSERT_EQUAL(B.srv->repl.stats.refused, 1u);
	CU_ASSERT_EQUAL(version_of(&B, "old-epoch", 0), 0u);
	CU_ASSERT_EQUAL(find(&A, "old-epoch")->shards[0].hdr->seq & 1, 1u);	/* not published */
	/* the push's shards (4 partitions) went on the one stream that broke:
	 * the refused one and those A applied before the NACK came back (all
	 * 4 over TCP, where they arrive in one turn; over verbs maybe fewer) */
	nwaits = A.srv->repl.nrwaits;
	CU_ASSERT(nwaits >= 1u && nwaits <= 4u);
	/* the stream broke with updates unconfirmed: A asks to drop B */
	CU_ASSERT_EQUAL(A.srv->repl.diverged[job_part], B.id);
	fake_do(&A, do_drop_backup, NULL);
	CU_ASSERT_EQUAL(A.srv->repl.nrwaits, nwaits - 1u);
	CU_ASSERT_EQUAL(find(&A, "old-epoch")->shards[0].hdr->seq, 2u);	/* version 1, published */
	CU_ASSERT_EQUAL(find(&A, "old-epoch")->shards[0].repl_pending, 0u);
	rps_tensor_close(t);
}

/* The epoch moved on with the primary unchanged (a REPLICA_DROP of another
 * backup) and B applied it before A: A's entries, stamped with the epoch
 * before, are the same primary's and B applies them: acknowledged, equal. */
static void test_old_epoch_same_primary(void)
{
	static int same = 1;
	float g[COUNT];
	rps_tensor_t *t;
	unsigned seed = 7;
	uint64_t refused = B.srv->repl.stats.refused;

	CU_ASSERT_EQUAL_FATAL(tensor(quick, "old-epoch-same", RPS_MODE_ASYNC, RPS_DTYPE_F32, RPS_OPT_SUM, &t), 0);
	job_part = find(&A, "old-epoch-same")->shards[0].part;
	fake_do(&B, do_epoch_ahead, &same);
	random_grad(g, RPS_DTYPE_F32, &seed);
	CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), 0);
	CU_ASSERT_EQUAL(B.srv->repl.stats.refused, refused);
	CU_ASSERT_EQUAL(version_of(&B, "old-epoch-same", 0), 1u);
	CU_ASSERT_EQUAL(differing_shards("old-epoch-same"), 0);
	rps_tensor_close(t);
}

static void do_lease(struct fake *f, void *arg)
{
	f->dp->set_lease(f->srv, *(const uint64_t *)arg);
}

/* A's lease runs out while its push waits for B (stalled): once B applied
 * it, A publishes it but refuses the ack (RPS_ESTALE_EPOCH), and refuses
 * the worker's resends on arrival: no push of a partition with backups is
 * acknowledged without the lease; its headers say the partition moved
 * meanwhile (the read fence).  Lease back: acknowledged again, the epoch
 * back in the headers.  Views without backups (R=1): the lease does not
 * matter. */
static void test_lease_fence(void)
{
	const uint64_t expired = 0, forever = UINT64_MAX;
	float g[COUNT], out[COUNT];
	uint64_t refused, version, epoch;
	rps_tensor_t *t;
	rps_request_t *r;
	unsigned seed = 8;

	CU_ASSERT_EQUAL_FATAL(tensor(quick, "lease", RPS_MODE_ASYNC, RPS_DTYPE_F32, RPS_OPT_SUM, &t), 0);
	random_grad(g, RPS_DTYPE_F32, &seed);
	refused = A.srv->repl.stats.lease_refused;
	epoch = find(&A, "lease")->shards[0].hdr->epoch;
	CU_ASSERT(epoch != RPS__EPOCH_MOVED);
	fake_stall(&B);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t, g, sizeof(g), &r), 0);
	sleep_ms(100);
	CU_ASSERT_EQUAL(version_of(&A, "lease", 0), 1u);	/* applied, waiting for B */
	fake_do(&A, do_lease, (void *)&expired);
	/* the read fence: workers' READs of A's copy fail the epoch check */
	CU_ASSERT_EQUAL(find(&A, "lease")->shards[0].hdr->epoch, RPS__EPOCH_MOVED);
	fake_resume(&B);
	CU_ASSERT_EQUAL(rps_wait(r), RPS_ESTALE_EPOCH);
	CU_ASSERT(A.srv->repl.stats.lease_refused >= refused + 4);	/* the push's 4 shards */
	CU_ASSERT_EQUAL(version_of(&A, "lease", 0), 1u);	/* the resends: refused, not applied */
	CU_ASSERT_EQUAL(version_of(&B, "lease", 0), 1u);
	CU_ASSERT_EQUAL(find(&A, "lease")->shards[0].hdr->seq, 2u);	/* on B: published */
	CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), RPS_ESTALE_EPOCH);	/* refused on arrival */
	CU_ASSERT_EQUAL(version_of(&A, "lease", 0), 1u);

	fake_do(&A, do_lease, (void *)&forever);
	CU_ASSERT_EQUAL(find(&A, "lease")->shards[0].hdr->epoch, epoch);	/* still primary: unfenced */
	CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), 0);
	CU_ASSERT_EQUAL(version_of(&A, "lease", 0), 2u);
	CU_ASSERT_EQUAL(differing_shards("lease"), 0);

	/* R=1 views: acknowledged without a lease, as today */
	fake_do(&A, do_views_r1, NULL);
	fake_do(&A, do_lease, (void *)&expired);
	CU_ASSERT_EQUAL(find(&A, "lease")->shards[0].hdr->epoch, epoch);	/* nothing to fence */
	refused = A.srv->repl.stats.lease_refused;
	CU_ASSERT_EQUAL(rps_push(t, g, sizeof(g)), 0);
	CU_ASSERT_EQUAL(rps_pull(t, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 3u);
	CU_ASSERT_EQUAL(A.srv->repl.stats.lease_refused, refused);
	fake_do(&A, do_lease, (void *)&forever);
	fake_do(&A, do_views_replicated, NULL);
	rps_tensor_close(t);
}

/* Partition *arg's epoch moved on with A still its primary (its replica
 * set changed): f applies the map; workers that have not read it since
 * push under the epoch before, and are refused. */
static void do_bump_epoch(struct fake *f, void *arg)
{
	uint32_t p = *(const uint32_t *)arg;

	part_view(f, p, map.parts[p].epoch, true);
	if (map.parts[p].owner == f->id)	/* (as cp_map.c: READs of it check the epoch) */
		f->dp->part_publish(f->srv, p, map.parts[p].epoch);
	CU_ASSERT_EQUAL(map_publish(f), 0);
}

static void bump_epoch(uint32_t p)
{
	map.parts[p].epoch++;
	map.applied++;
	fake_do(&A, do_bump_epoch, &p);
	fake_do(&B, do_bump_epoch, &p);
}

struct req_waiter {
	rps_request_t *r;
	int ret;
};

static void *wait_main(void *arg)
{
	struct req_waiter *w = arg;

	w->ret = rps_wait(w->r);
	return NULL;
}

/*
 * Sync, two ranks refused crosswise: rank 0's push of shard 1 refused (its
 * map older than the partition's epoch) while its shards 0, 2, 3 were
 * TAKEN; then rank 1's push of shard 0 refused while its shard 1 was TAKEN
 * (out of turn) and its shards 2 and 3 completed their steps.  Each rank's
 * TAKEN shard completes only once the other resends what was refused.  A
 * worker that resent refused shards only once the rest of its push
 * completed waited for the other's resend until its timeout (seen over
 * Soft-RoCE under load, where leases lapse mid-step: a deadlock of the
 * job); a refused shard is resent once the rest of its push is TAKEN.
 * Both complete, exactly as without the refusals.
 */
static void test_sync_refused_crosswise(void)
{
	struct req_waiter w = { 0 };
	float g0[COUNT], g1[COUNT], out[COUNT], ref[COUNT];
	rps_tensor_t *t0, *t1, *r0t, *r1t;
	rps_request_t *r1;
	pthread_t th;
	uint32_t pa, pb, sh;
	uint64_t taken;
	unsigned seed = 14;
	int i;

	CU_ASSERT_EQUAL_FATAL(tensor(w0, "crosswise", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &t0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "crosswise", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &t1), 0);
	random_grad(g0, RPS_DTYPE_F32, &seed);
	random_grad(g1, RPS_DTYPE_F32, &seed);
	pa = find(&A, "crosswise")->shards[0].part;
	pb = find(&A, "crosswise")->shards[1].part;
	CU_ASSERT_NOT_EQUAL_FATAL(pa, pb);

	/* shard 1's partition moves on; rank 1 learns it (its pull READs the
	 * new epoch in the header, refreshes), rank 0 does not */
	bump_epoch(pb);
	CU_ASSERT_EQUAL(rps_pull(t1, out, sizeof(out), NULL), 0);
	taken = A.srv->repl.stats.taken_acks;
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t0, g0, sizeof(g0), &w.r), 0);
	CU_ASSERT_EQUAL_FATAL(-pthread_create(&th, NULL, wait_main, &w), 0);
	for (i = 0; i < 300 && A.srv->repl.stats.taken_acks - taken < 3; i++)
		sleep_ms(10);
	CU_ASSERT(A.srv->repl.stats.taken_acks - taken >= 3);	/* shards 0, 2, 3 */
	/* shard 0's moves on, rank 1 not told */
	bump_epoch(pa);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t1, g1, sizeof(g1), &r1), 0);
	CU_ASSERT_EQUAL(rps_wait(r1), 0);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(w.ret, 0);
	for (sh = 0; sh < 4; sh++) {
		CU_ASSERT_EQUAL(version_of(&A, "crosswise", sh), 1u);
		CU_ASSERT_EQUAL(version_of(&B, "crosswise", sh), 1u);
	}
	CU_ASSERT_EQUAL(differing_shards("crosswise"), 0);

	/* the same step without refusals: the same bits */
	CU_ASSERT_EQUAL_FATAL(tensor(w0, "crosswise-ref", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &r0t), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "crosswise-ref", RPS_MODE_SYNC, RPS_DTYPE_F32, RPS_OPT_ADAM, &r1t), 0);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(r0t, g0, sizeof(g0), &w.r), 0);
	CU_ASSERT_EQUAL(rps_push(r1t, g1, sizeof(g1)), 0);
	CU_ASSERT_EQUAL(rps_wait(w.r), 0);
	CU_ASSERT_EQUAL(rps_pull(r0t, ref, sizeof(ref), NULL), 0);
	CU_ASSERT_EQUAL(rps_pull(t0, out, sizeof(out), NULL), 0);
	CU_ASSERT_EQUAL(memcmp(out, ref, sizeof(out)), 0);
	CU_ASSERT_EQUAL(rps_pull(t1, out, sizeof(out), NULL), 0);
	CU_ASSERT_EQUAL(memcmp(out, ref, sizeof(out)), 0);
	rps_tensor_close(r1t);
	rps_tensor_close(r0t);
	rps_tensor_close(t1);
	rps_tensor_close(t0);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "R=1: no stream, no deferral, acks as today", test_r1_unchanged },
		{ "async: backup byte-identical (fp32 Adam, bf16 momentum)", test_async_identical },
		{ "binding: the backup allocates the regions it backs", test_binding_allocates_regions },
		{ "re-seeded: the copy replaced stays registered, sealed and moved, for --drain-ms",
		  test_reseed_retires_region },
		{ "bounded: backup byte-identical, clocks included", test_bounded_identical },
		{ "sync: one entry per step, backup byte-identical", test_sync_identical },
		{ "sync: the second rank first is summed at once, not parked; bit-identical", test_sync_early },
		{ "ack: not before the backup applied", test_ack_waits_for_backup },
		{ "sync ack and pull: not before the backup applied the step", test_sync_ack_waits_for_backup },
		{ "credits: exhausted, pushes held, none lost", test_credit_exhaustion },
		{ "sync credits: exhausted, last contributions held, not parked", test_sync_credit_exhaustion },
		{ "sync credits: a rank removal with none left owes the step, applied when they return",
		  test_sync_removal_without_credit },
		{ "sync two-stage ack: TAKEN at once (in turn and parked), STEP_DONE once replicated", test_sync_two_stage_ack },
		{ "sync resend: TAKEN while its step is unreplicated, -EALREADY after", test_sync_resend },
		{ "sync, a rank gone mid-step: the others' pushes ended only once the backup holds them",
		  test_sync_orphan_replicated },
		{ "sync, partition refused: taken pushes told to resend, counted once", test_sync_refused_resend },
		{ "fingerprint: a server with other kernels refuses to pair", test_fingerprint_mismatch },
		{ "lease: no ack without it on a partition with backups; R=1 ignores it", test_lease_fence },
		{ "sync, two ranks refused crosswise mid-step: each resends beside its TAKEN shards, no deadlock",
		  test_sync_refused_crosswise },
		{ "joining: entries before the image acknowledged, not applied, the stream kept", test_joiner_before_image },
		{ "epoch: the same primary's entry of the epoch before applied", test_old_epoch_same_primary },
		{ "epoch: an entry of an old epoch refused", test_old_epoch_refused },
	};

	if (getenv("RPS_IT_TRANSPORT") && !strcmp(getenv("RPS_IT_TRANSPORT"), "verbs")) {
		if (!getenv("RPS_IT_ADDR")) {
			fprintf(stderr, "test_repl: verbs needs RPS_IT_ADDR (an address of an RDMA device)\n");
			return 77;
		}
		scheme = "verbs";
		addr = getenv("RPS_IT_ADDR");
	}
	return cutest_run1("repl", suite_init, suite_fini, test_setup, NULL, tests, RPS__ARRAY_SIZE(tests));
}
