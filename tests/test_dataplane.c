/*
 * test_dataplane.c - unit tests of the data plane through the seam: a real
 * server (TCP, 127.0.0.1, port 0) whose loop runs in a thread, with a FAKE
 * control plane in the place of src/control: hooks (server/dataplane.h)
 * that record every call, and partition facts and checkpoint holds set
 * only through the ops table, on the serving thread (from run_timers, as
 * the real control plane does from its timers).  The fake does the least
 * the real one does for workers to find their way: it registers a map
 * buffer, writes a one-member shard map into it and serves every
 * partition.  Real workers (librdmaps over TCP) then push and pull.
 *
 * The mirror image of test_cplane.c (the control plane against a fake
 * data plane).
 */
#include "config.h"
#include "common/common.h"
#include "client/ctl.h"
#include "proto/shard.h"
#include "proto/smap.h"
#include "server/dataplane.h"
#include "server/server.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"
#include "req_peek.h"

#define NPART 4u
#define SHARD_BYTES 64u		/* 16 floats: one shard per test tensor */
#define COUNT 8u
#define TIMER_MS 2		/* what the fake's run_timers asks for */
#define QUICK_MS 300		/* timeout_ms of the workers that are refused */

/* ---- the fake control plane ------------------------------------------------ */

struct fake;
typedef void (*fake_fn)(struct fake *f, void *arg);

struct fake {
	const char *name;
	struct rps__server *srv;
	const struct rps__dp_ops *dp;
	pthread_t thread;
	int run_ret;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* a job for the serving thread (fake_do) */
	fake_fn todo;
	void *todo_arg;
	bool todo_done;
	/* run_timers: the delay it returns; after `fail_at` calls it returns
	 * -ECANCELED, after `stop_at` it sets *stop (0: never) */
	int timer_ms;
	unsigned fail_at, stop_at;
	/* what the loop called up with */
	unsigned n_timers, n_messages, n_gone, n_send_done, n_read_done, n_accept, n_attached, n_fini;
	struct srv_conn *msg_conn;		/* the last on_message */
	enum conn_role_kind msg_role;
	unsigned msg_type;
	uint64_t msg_req_id;
	int32_t msg_status;
	uint32_t msg_len;
	struct srv_conn *gone_conn;		/* the last on_conn_gone */
	struct srv_conn *peer_conn;		/* the last peer_attached */
	uint64_t peer_id;		/* ... its conn_peer_id */
	unsigned n_dialed;		/* peer_dialed calls */
	struct srv_conn *dialed_conn;	/* the last one's connection (NULL: failed) */
	uint64_t dialed_id;		/* ... its conn_peer_id */
	uint64_t accept_from, accept_to;	/* the last accept_peer */
	uint64_t refuse_from;		/* accept_peer refuses this member */
	bool read_ok;
	char read_buf[64];
	/* the shard map workers READ */
	struct rps__smap map;
	char *mapbuf;
};

static void fake_lock(struct fake *f) { pthread_mutex_lock(&f->lock); }
static void fake_unlock(struct fake *f) { pthread_mutex_unlock(&f->lock); }

static void h_on_message(void *ctx, struct srv_conn *c, const struct rps__msg_hdr *h, void *body, uint32_t len)
{
	struct fake *f = ctx;

	(void)body;
	fake_lock(f);
	f->n_messages++;
	f->msg_conn = c;
	f->msg_role = f->dp->conn_role(c);
	f->msg_type = h->type;
	f->msg_req_id = h->req_id;
	f->msg_status = h->status;
	f->msg_len = len;
	fake_unlock(f);
	/* psctl's STATUS gets an answer naming this member */
	if (h->type == RPS__MSG_STATUS) {
		struct rps__status_rep rep;
		memset(&rep, 0, sizeof(rep));
		rep.id = 1;
		rep.applied = f->map.applied;
		f->dp->conn_reply(c, RPS__MSG_STATUS_REP, h->req_id, 0, &rep, sizeof(rep));
	}
}

static void h_on_conn_gone(void *ctx, struct srv_conn *c)
{
	struct fake *f = ctx;

	fake_lock(f);
	f->n_gone++;
	f->gone_conn = c;
	fake_unlock(f);
}

static void h_on_read_done(void *ctx, struct srv_conn *c, bool ok, const void *buf)
{
	struct fake *f = ctx;

	(void)c;
	fake_lock(f);
	f->n_read_done++;
	f->read_ok = ok;
	if (ok)
		memcpy(f->read_buf, buf, sizeof(f->read_buf));
	fake_unlock(f);
}

static void h_on_send_done(void *ctx, struct srv_conn *c)
{
	struct fake *f = ctx;

	(void)c;
	fake_lock(f);
	f->n_send_done++;
	fake_unlock(f);
}

static int h_accept_peer(void *ctx, uint64_t from_id, uint64_t to_id, const char *addr, const char **why)
{
	struct fake *f = ctx;
	int ret = 0;

	fake_lock(f);
	f->n_accept++;
	f->accept_from = from_id;
	f->accept_to = to_id;
	if (from_id == f->refuse_from) {
		*why = "not a member (test)";
		ret = -EPERM;
	}
	fake_unlock(f);
	return ret;
}

static void h_peer_attached(void *ctx, struct srv_conn *c)
{
	struct fake *f = ctx;

	fake_lock(f);
	f->n_attached++;
	f->peer_conn = c;
	f->peer_id = f->dp->conn_peer_id(c);
	fake_unlock(f);
}

static void h_peer_dialed(void *ctx, const char *uri, uint64_t to_id, struct srv_conn *c)
{
	struct fake *f = ctx;

	(void)uri;
	(void)to_id;
	fake_lock(f);
	f->n_dialed++;
	f->dialed_conn = c;
	f->dialed_id = c ? f->dp->conn_peer_id(c) : 0;
	fake_unlock(f);
}

static int h_run_timers(void *ctx, uint64_t now, bool *stop)
{
	struct fake *f = ctx;
	fake_fn fn;
	void *arg;
	int ms;

	(void)now;
	fake_lock(f);
	f->n_timers++;
	if (f->fail_at && f->n_timers >= f->fail_at) {
		fake_unlock(f);
		return -ECANCELED;
	}
	if (f->stop_at && f->n_timers >= f->stop_at)
		*stop = true;
	fn = f->todo;
	arg = f->todo_arg;
	f->todo = NULL;
	ms = f->timer_ms;
	fake_unlock(f);
	if (fn) {
		fn(f, arg);		/* the ops, on the serving thread */
		fake_lock(f);
		f->todo_done = true;
		pthread_cond_broadcast(&f->cond);
		fake_unlock(f);
	}
	return ms;
}

static void h_fini(void *ctx)
{
	struct fake *f = ctx;

	fake_lock(f);
	f->n_fini++;
	fake_unlock(f);
}

static void fake_init(struct fake *f, const char *name)
{
	memset(f, 0, sizeof(*f));
	f->name = name;
	f->dp = rps__dataplane_ops();
	f->timer_ms = TIMER_MS;
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
}

static int fake_server(struct fake *f, uint64_t member_id)
{
	const struct rps__dp_hooks hooks = {
		.on_message = h_on_message, .on_conn_gone = h_on_conn_gone, .on_read_done = h_on_read_done,
		.on_send_done = h_on_send_done, .accept_peer = h_accept_peer, .peer_attached = h_peer_attached,
		.peer_dialed = h_peer_dialed, .run_timers = h_run_timers, .fini = h_fini, .ctx = f,
	};
	struct rps__server_config cfg;
	int ret;

	rps__server_config_init(&cfg);
	cfg.listen.port = 0;
	cfg.shard_bytes = SHARD_BYTES;
	cfg.nslots = 4;
	cfg.no_pin = 1;
	ret = rps__server_create(&cfg, &f->srv);
	if (ret)
		return ret;
	rps__dp_set_hooks(f->srv, &hooks);
	f->dp->set_member_id(f->srv, member_id);
	return 0;
}

static void *loop_main(void *arg)
{
	struct fake *f = arg;

	f->run_ret = rps__server_run(f->srv);
	return NULL;
}

static int fake_start(struct fake *f)
{
	return -pthread_create(&f->thread, NULL, loop_main, f);
}

static void fake_stop(struct fake *f)
{
	rps__server_stop(f->srv);
	pthread_join(f->thread, NULL);
}

/* Run fn on the serving thread (at its next run_timers) and wait for it. */
static void fake_do(struct fake *f, fake_fn fn, void *arg)
{
	fake_lock(f);
	f->todo = fn;
	f->todo_arg = arg;
	f->todo_done = false;
	while (!f->todo_done)
		pthread_cond_wait(&f->cond, &f->lock);
	fake_unlock(f);
}

/* Wait (5 s at most) until *counter, read under the fake's lock, reaches n. */
static bool fake_wait(struct fake *f, const unsigned *counter, unsigned n)
{
	uint64_t end = rps__now_ns() + 5000000000ull;
	struct timespec ts = { 0, 1000000 };
	bool ok;

	for (;;) {
		fake_lock(f);
		ok = *counter >= n;
		fake_unlock(f);
		if (ok || rps__now_ns() > end)
			return ok;
		nanosleep(&ts, NULL);
	}
}

static unsigned fake_count(struct fake *f, const unsigned *counter)
{
	unsigned n;

	fake_lock(f);
	n = *counter;
	fake_unlock(f);
	return n;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* ---- what the fake tells the data plane (on the serving thread) ------------ */

/* As the real control plane does (cp_map.c): [u32 length][encoded map].
 * (Jobs run on the serving thread: no CU_ASSERT_FATAL there.) */
static int map_publish(struct fake *f)
{
	char tmp[RPS__MAP_BUF];
	size_t len = 0;
	uint32_t len32;
	int ret;

	f->map.applied++;
	f->dp->set_map(f->srv, f->map.npart, f->map.applied);
	ret = rps__smap_encode(&f->map, tmp + 4, sizeof(tmp) - 4, &len);
	if (ret)
		return ret;
	len32 = (uint32_t)len;
	memcpy(tmp, &len32, 4);
	memset(tmp + 4 + len, 0, sizeof(tmp) - 4 - len);
	memcpy(f->mapbuf, tmp, sizeof(tmp));
	return 0;
}

static void part_view(struct fake *f, uint32_t p, uint64_t epoch, bool serving, bool lost)
{
	struct rps__dp_part v = {
		.epoch = epoch, .map_epoch = f->map.parts[p].epoch, .serving = serving, .lost = lost,
		.owned_lost = lost,
	};

	f->dp->part_set(f->srv, p, &v);
}

/* cplane's bootstrap, in short: every partition ours, created, served. */
static int fake_bootstrap(struct fake *f)
{
	char uri[64];
	const char *uris[1] = { uri };
	uint32_t p;
	int ret;

	snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%u", (unsigned)f->dp->port(f->srv));
	ret = rps__smap_init(&f->map, uris, 1, NPART);
	if (ret)
		return ret;
	f->mapbuf = calloc(1, RPS__MAP_BUF);
	if (!f->mapbuf)
		return -ENOMEM;
	ret = f->dp->map_register(f->srv, f->mapbuf, RPS__MAP_BUF);
	if (ret)
		return ret;
	ret = map_publish(f);
	if (ret)
		return ret;
	for (p = 0; p < NPART; p++) {
		part_view(f, p, f->map.parts[p].epoch, true, false);
		f->dp->part_create(f->srv, p);
	}
	return 0;
}

static uint32_t job_part;
static bool job_fenced;

/* A move's first steps (cp_moves.c): not served, what waits refused,
 * locks sealed, headers say "moved". */
static void do_fence(struct fake *f, void *arg)
{
	(void)arg;
	part_view(f, job_part, f->map.parts[job_part].epoch, false, false);
	f->dp->part_refuse(f->srv, job_part);
	job_fenced = f->dp->part_fence(f->srv, job_part);
	f->dp->part_publish(f->srv, job_part, RPS__EPOCH_MOVED);
}

/* The move aborted (cp_map.c reconcile_part): unfenced, served again. */
static void do_unfence(struct fake *f, void *arg)
{
	(void)arg;
	f->dp->part_unfence(f->srv, job_part, f->map.parts[job_part].epoch);
	part_view(f, job_part, f->map.parts[job_part].epoch, true, false);
}

/* The data plane serves the partition under the next epoch; the map that
 * workers read does not know yet. */
static void do_next_epoch(struct fake *f, void *arg)
{
	uint64_t e = f->map.parts[job_part].epoch + 1;

	(void)arg;
	part_view(f, job_part, e, true, false);
	f->dp->part_publish(f->srv, job_part, e);
}

/* ... and now the map says so too. */
static void do_map_epoch(struct fake *f, void *arg)
{
	(void)arg;
	f->map.parts[job_part].epoch++;
	part_view(f, job_part, f->map.parts[job_part].epoch, true, false);
	CU_ASSERT_EQUAL(map_publish(f), 0);
}

static void do_stop_serving(struct fake *f, void *arg)
{
	(void)arg;
	part_view(f, job_part, f->map.parts[job_part].epoch, false, false);
	f->dp->part_refuse(f->srv, job_part);
}

static void do_serve(struct fake *f, void *arg)
{
	(void)arg;
	part_view(f, job_part, f->map.parts[job_part].epoch, true, false);
}

static void do_lost(struct fake *f, void *arg)
{
	(void)arg;
	part_view(f, job_part, f->map.parts[job_part].epoch, false, true);
}

static void do_map_lost(struct fake *f, void *arg)
{
	f->map.parts[job_part].lost = *(uint64_t *)arg;
	CU_ASSERT_EQUAL(map_publish(f), 0);
	part_view(f, job_part, f->map.parts[job_part].epoch, !f->map.parts[job_part].lost,
		  f->map.parts[job_part].lost != 0);
}

/* ---- the data plane under test ----------------------------------------------- */

static struct fake A;
static char servers[64];
static rps_client_t *cl;	/* a worker with the default timeout */
static rps_client_t *quick;	/* one that gives up after QUICK_MS */

static int connect_worker(int rank, int num_workers, int timeout_ms, rps_client_t **out)
{
	struct rps_client_opts o;

	rps_client_opts_init(&o);
	o.servers = servers;
	o.rank = rank;
	o.num_workers = num_workers;
	o.timeout_ms = timeout_ms;
	return rps_client_connect(&o, out);
}

static int suite_init(void)
{
	rps__log_level = RPS__LOG_ERROR;
	fake_init(&A, "A");
	if (fake_server(&A, 1) || fake_bootstrap(&A) || fake_start(&A)) {
		fprintf(stderr, "test_dataplane: %s\n", rps__errbuf());
		return -1;
	}
	snprintf(servers, sizeof(servers), "tcp://127.0.0.1:%u", (unsigned)rps__server_port(A.srv));
	if (connect_worker(0, 1, 10000, &cl) || connect_worker(0, 1, QUICK_MS, &quick)) {
		fprintf(stderr, "test_dataplane: %s\n", rps_last_error());
		return -1;
	}
	return 0;
}

static int suite_fini(void)
{
	rps_client_close(quick);
	rps_client_close(cl);
	fake_stop(&A);
	A.dp->map_deregister(A.srv);
	rps__server_destroy(A.srv);
	free(A.mapbuf);
	return A.run_ret == 0 && A.n_fini == 1 ? 0 : -1;
}

/* The partition of a tensor's only shard. */
static uint32_t part_of(const char *name)
{
	struct rps__layout l;

	CU_ASSERT_EQUAL_FATAL(rps__layout_init(&l, name, COUNT, SHARD_BYTES / 4, NPART), 0);
	CU_ASSERT_EQUAL_FATAL(l.nshards, 1u);
	return rps__shard_server(&l, 0);
}

static const float init[COUNT] = { 1, 2, 3, 4, 5, 6, 7, 8 };
static const float grad[COUNT] = { 0.5f, -1, 2, 0.25f, 10, -3, 0, 1 };

static int tensor(rps_client_t *c, const char *name, enum rps_mode mode, rps_tensor_t **t)
{
	struct rps_tensor_opts o;

	rps_tensor_opts_init(&o);
	o.count = COUNT;
	o.dtype = RPS_DTYPE_F32;
	o.mode = mode;
	o.optimizer = RPS_OPT_SUM;
	o.init = init;
	return rps_tensor_create(c, name, &o, t);
}

/* init + k * grad, exactly (sums of these are exact in fp32) */
static void expect(const float *got, unsigned k)
{
	for (unsigned i = 0; i < COUNT; i++)
		CU_ASSERT_EQUAL(got[i], init[i] + (float)k * grad[i]);
}

/* ---- hooks ------------------------------------------------------------------- */

/* psctl's STATUS is a control-plane message: it reaches on_message with
 * the admin connection, the fake's reply goes back over it, and closing
 * the channel reaches on_conn_gone with the same connection. */
static void test_hooks_admin_message(void)
{
	struct rps__status_rep rep;
	struct rps__ctl *ctl;
	struct rps__uri u;
	size_t len = 0;
	int32_t status = 1;
	unsigned gone;

	CU_ASSERT(fake_count(&A, &A.n_timers) > 0);
	CU_ASSERT_EQUAL_FATAL(rps__uri_parse(servers, &u), 0);
	CU_ASSERT_EQUAL_FATAL(rps__ctl_open(&u, 5000, &ctl), 0);
	memset(&rep, 0xff, sizeof(rep));
	CU_ASSERT_EQUAL(rps__ctl_call(ctl, RPS__MSG_STATUS, NULL, 0, &rep, sizeof(rep), &len, &status, 5000), 0);
	CU_ASSERT_EQUAL(status, 0);
	CU_ASSERT_EQUAL(len, sizeof(rep));
	CU_ASSERT_EQUAL(rep.id, 1u);
	CU_ASSERT_EQUAL(rep.applied, 1u);
	fake_lock(&A);
	CU_ASSERT_EQUAL(A.n_messages, 1u);
	CU_ASSERT_EQUAL(A.msg_type, RPS__MSG_STATUS);
	CU_ASSERT_EQUAL(A.msg_role, CONN_ADMIN);
	CU_ASSERT_EQUAL(A.msg_len, 0u);
	gone = A.n_gone;
	fake_unlock(&A);
	rps__ctl_close(ctl);
	CU_ASSERT_FATAL(fake_wait(&A, &A.n_gone, gone + 1));
	fake_lock(&A);
	CU_ASSERT_PTR_EQUAL(A.gone_conn, A.msg_conn);
	CU_ASSERT_EQUAL(A.n_attached, 0u);	/* an admin is no peer */
	fake_unlock(&A);
}

static struct srv_conn *job_conn;
static uint64_t job_got;
static struct rps__mr *job_mr;
static char peer_mem[64];

static void do_dial(struct fake *f, void *arg)
{
	CU_ASSERT_EQUAL(f->dp->peer_dial(f->srv, arg, 1), 0);
}

/* Dial from f and wait for peer_dialed: job_conn and job_got. */
static void dial_wait(struct fake *f, const char *uri)
{
	unsigned n;

	fake_lock(f);
	n = f->n_dialed;
	fake_unlock(f);
	fake_do(f, do_dial, (void *)uri);
	CU_ASSERT_FATAL(fake_wait(f, &f->n_dialed, n + 1));
	fake_lock(f);
	job_conn = f->dialed_conn;
	job_got = f->dialed_id;
	fake_unlock(f);
}

static void do_member2(struct fake *f, void *arg)
{
	(void)arg;
	f->dp->set_member_id(f->srv, 2);
}

static void do_send_to_peer(struct fake *f, void *arg)
{
	(void)arg;
	f->dp->conn_reply(job_conn, RPS__MSG_MIGRATE_REP, 7, -EAGAIN, NULL, 0);
}

static void do_mem_register(struct fake *f, void *arg)
{
	(void)arg;
	CU_ASSERT_EQUAL(f->dp->mem_register(f->srv, peer_mem, sizeof(peer_mem), &job_mr), 0);
}

/* B's key for A: a window of the connection A's message came in on */
static void do_mem_window(struct fake *f, void *arg)
{
	CU_ASSERT_EQUAL(f->dp->mem_window(f->msg_conn, job_mr, (uint32_t *)arg), 0);
}

static void do_read_peer(struct fake *f, void *arg)
{
	CU_ASSERT_EQUAL(f->dp->conn_read(job_conn, (uint64_t)(uintptr_t)peer_mem, *(uint32_t *)arg,
					 sizeof(peer_mem)), 0);
}

/* A second data plane dials A as a peer: accept_peer decides (a refusal
 * leaves no connection), peer_attached gets the connection with the id the
 * dialer gave; messages flow both ways (on_message, on_send_done); a READ
 * of memory registered through the ops reaches on_read_done with its
 * bytes; the peer's end reaches on_conn_gone. */
static void test_hooks_peer(void)
{
	struct fake B;
	uint32_t rkey;
	unsigned msgs, sends, gone;

	fake_init(&B, "B");
	CU_ASSERT_EQUAL_FATAL(fake_server(&B, 3), 0);
	CU_ASSERT_EQUAL_FATAL(fake_start(&B), 0);
	A.refuse_from = 3;
	dial_wait(&B, servers);
	CU_ASSERT_PTR_NULL(job_conn);
	fake_lock(&A);
	CU_ASSERT_EQUAL(A.n_accept, 1u);
	CU_ASSERT_EQUAL(A.accept_from, 3u);
	CU_ASSERT_EQUAL(A.accept_to, 1u);
	CU_ASSERT_EQUAL(A.n_attached, 0u);
	fake_unlock(&A);

	/* as member 2 */
	fake_do(&B, do_member2, NULL);
	dial_wait(&B, servers);
	CU_ASSERT_PTR_NOT_NULL_FATAL(job_conn);
	CU_ASSERT_EQUAL(job_got, 1u);
	CU_ASSERT_FATAL(fake_wait(&A, &A.n_attached, 1));
	fake_lock(&A);
	CU_ASSERT_EQUAL(A.accept_from, 2u);
	CU_ASSERT_EQUAL(A.peer_id, 2u);
	msgs = A.n_messages;
	sends = A.n_send_done;
	fake_unlock(&A);

	/* B -> A: a peer's message reaches A's on_message */
	fake_do(&B, do_send_to_peer, NULL);
	CU_ASSERT_FATAL(fake_wait(&A, &A.n_messages, msgs + 1));
	fake_lock(&A);
	CU_ASSERT_EQUAL(A.msg_type, RPS__MSG_MIGRATE_REP);
	CU_ASSERT_EQUAL(A.msg_req_id, 7u);
	CU_ASSERT_EQUAL(A.msg_status, -EAGAIN);
	CU_ASSERT_EQUAL(A.msg_role, CONN_PEER);
	CU_ASSERT_PTR_EQUAL(A.msg_conn, A.peer_conn);
	fake_unlock(&A);

	/* A -> B: sent, and on_send_done at A when B took it */
	job_conn = A.peer_conn;
	fake_do(&A, do_send_to_peer, NULL);
	CU_ASSERT_FATAL(fake_wait(&B, &B.n_messages, 1));
	CU_ASSERT_EQUAL(B.msg_type, RPS__MSG_MIGRATE_REP);
	CU_ASSERT_EQUAL(B.msg_role, CONN_PEER);
	CU_ASSERT_FATAL(fake_wait(&A, &A.n_send_done, sends + 1));

	/* A READs what B registered */
	for (unsigned i = 0; i < sizeof(peer_mem); i++)
		peer_mem[i] = (char)(i * 7 + 1);
	fake_do(&B, do_mem_register, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(job_mr);
	fake_do(&B, do_mem_window, &rkey);
	fake_do(&A, do_read_peer, &rkey);
	CU_ASSERT_FATAL(fake_wait(&A, &A.n_read_done, 1));
	fake_lock(&A);
	CU_ASSERT(A.read_ok);
	CU_ASSERT_EQUAL(memcmp(A.read_buf, peer_mem, sizeof(peer_mem)), 0);
	gone = A.n_gone;
	fake_unlock(&A);

	/* B goes away */
	fake_stop(&B);
	B.dp->mem_deregister(job_mr);
	rps__server_destroy(B.srv);
	CU_ASSERT_EQUAL(B.run_ret, 0);
	CU_ASSERT_EQUAL(B.n_fini, 1u);
	CU_ASSERT_FATAL(fake_wait(&A, &A.n_gone, gone + 1));
	fake_lock(&A);
	CU_ASSERT_PTR_EQUAL(A.gone_conn, A.peer_conn);
	fake_unlock(&A);
	pthread_mutex_destroy(&B.lock);
	pthread_cond_destroy(&B.cond);
}

/* run_timers on a server of its own, run on this thread: the loop sleeps
 * no less than the delay returned, returns the negative errno returned,
 * returns 0 when asked to stop, and fini comes at destroy. */
static void test_hooks_run_timers(void)
{
	struct fake C;
	uint64_t t0, ms;

	fake_init(&C, "C");
	CU_ASSERT_EQUAL_FATAL(fake_server(&C, 1), 0);
	C.timer_ms = 5;
	C.fail_at = 10;
	t0 = rps__now_ns();
	CU_ASSERT_EQUAL(rps__server_run(C.srv), -ECANCELED);
	ms = (rps__now_ns() - t0) / 1000000u;
	CU_ASSERT_EQUAL(C.n_timers, 10u);
	CU_ASSERT(ms >= 9u * 5u);	/* nine sleeps of 5 ms between ten turns */
	C.fail_at = 0;
	C.stop_at = 13;
	CU_ASSERT_EQUAL(rps__server_run(C.srv), 0);
	CU_ASSERT_EQUAL(C.n_timers, 13u);
	CU_ASSERT_EQUAL(C.n_fini, 0u);
	rps__server_destroy(C.srv);
	CU_ASSERT_EQUAL(C.n_fini, 1u);
	pthread_mutex_destroy(&C.lock);
	pthread_cond_destroy(&C.cond);
}

/* ---- partitions ------------------------------------------------------------------ */

/* A served partition: pushes are applied (sum, fp32) and a pull reads
 * exactly what they made. */
static void test_served_push_pull(void)
{
	float out[COUNT];
	uint64_t version = 99;
	rps_tensor_t *t;

	CU_ASSERT_EQUAL_FATAL(tensor(cl, "served", RPS_MODE_ASYNC, &t), 0);
	CU_ASSERT_EQUAL(rps_tensor_shards(t), 1u);
	CU_ASSERT_EQUAL(rps_pull(t, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 0u);
	expect(out, 0);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	CU_ASSERT_EQUAL(rps_pull(t, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 2u);
	expect(out, 2);
	rps_tensor_close(t);
}

/* rps_tensor_create refuses a NaN or infinite hyper-parameter, even one
 * its optimizer does not use, with -EINVAL and one line, before any server
 * is asked (nothing is created). */
static void test_create_not_finite(void)
{
	struct rps_tensor_opts o;
	rps_tensor_t *t = NULL;
	float bad[] = { NAN, INFINITY, -INFINITY };

	for (unsigned i = 0; i < 3; i++) {
		for (int opt = RPS_OPT_SUM; opt <= RPS_OPT_ADAM; opt++) {
			rps_tensor_opts_init(&o);
			o.count = COUNT;
			o.mode = RPS_MODE_ASYNC;
			o.optimizer = (enum rps_optimizer)opt;
			o.lr = bad[i];
			CU_ASSERT_EQUAL(rps_tensor_create(cl, "notfinite", &o, &t), -EINVAL);
			CU_ASSERT_PTR_NULL(t);
			CU_ASSERT(strstr(rps_last_error(), "tensor 'notfinite'") != NULL);
			CU_ASSERT(strstr(rps_last_error(), "learning rate") != NULL);
			CU_ASSERT(strchr(rps_last_error(), '\n') == NULL);
			rps_tensor_opts_init(&o);
			o.count = COUNT;
			o.optimizer = (enum rps_optimizer)opt;
			o.momentum = bad[i];
			CU_ASSERT_EQUAL(rps_tensor_create(cl, "notfinite", &o, &t), -EINVAL);
			CU_ASSERT(strstr(rps_last_error(), "momentum") != NULL);
		}
	}
	CU_ASSERT_EQUAL(rps_tensor_open(cl, "notfinite", &t), -ENOENT);
}

/* A fenced partition (refused, locks sealed, headers say moved): a push
 * is not applied; the worker follows the move and, no server serving the
 * shard for its timeout_ms, gets RPS_ESTALE_EPOCH; a pull too.  Unfenced
 * (an aborted move), the values are those before the fence, and a push
 * that was retrying goes through. */
static void test_fenced_partition(void)
{
	float out[COUNT];
	uint64_t version = 99;
	rps_tensor_t *t, *tq;
	rps_request_t *r;

	CU_ASSERT_EQUAL_FATAL(tensor(cl, "fenced", RPS_MODE_ASYNC, &t), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(quick, "fenced", RPS_MODE_ASYNC, &tq), 0);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	job_part = part_of("fenced");
	job_fenced = false;
	fake_do(&A, do_fence, NULL);
	CU_ASSERT(job_fenced);			/* no lock was held: all sealed */
	CU_ASSERT_EQUAL(rps_push(tq, grad, sizeof(grad)), RPS_ESTALE_EPOCH);
	CU_ASSERT_EQUAL(rps_pull(tq, out, sizeof(out), NULL), RPS_ESTALE_EPOCH);
	fake_do(&A, do_unfence, NULL);
	CU_ASSERT_EQUAL(rps_pull(t, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 1u);		/* the refused push was not applied */
	expect(out, 1);

	/* fenced again while a push retries; unfenced: it goes through */
	fake_do(&A, do_fence, NULL);
	CU_ASSERT(job_fenced);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(t, grad, sizeof(grad), &r), 0);
	sleep_ms(100);
	fake_do(&A, do_unfence, NULL);
	CU_ASSERT_EQUAL(rps_wait(r), 0);
	CU_ASSERT_EQUAL(rps_pull(t, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 2u);
	expect(out, 2);
	rps_tensor_close(tq);
	rps_tensor_close(t);
}

/* The data plane serves the partition under a newer epoch than the one
 * the workers' regions were announced with (the map still names the old
 * one): its answer to a push naming the old epoch is exactly
 * RPS_ESTALE_EPOCH, and the push is not applied; the worker re-opens the
 * tensor, the data plane announces the epoch it serves, and the push is
 * resent and applied once.  A push naming the served epoch is applied at
 * once.  A pull of a worker still at the old epoch sees the header's new
 * epoch, refreshes the same way and reads the exact values.  (The worker
 * gets RPS_ESTALE_EPOCH only when no server serves the shard for its
 * timeout: see the fenced and refuse tests; req_peek sees the answer
 * before the worker's retry.) */
static void test_stale_epoch_refused(void)
{
	float out[COUNT];
	uint64_t version = 99;
	rps_tensor_t *t, *tq;
	rps_request_t *r;

	CU_ASSERT_EQUAL_FATAL(tensor(cl, "stale", RPS_MODE_ASYNC, &t), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(quick, "stale", RPS_MODE_ASYNC, &tq), 0);
	job_part = part_of("stale");
	fake_do(&A, do_next_epoch, NULL);
	CU_ASSERT_EQUAL_FATAL(rps_push_start(tq, grad, sizeof(grad), &r), 0);
	CU_ASSERT_EQUAL(req_peek_status(r, 5000), RPS_ESTALE_EPOCH);	/* the old epoch */
	CU_ASSERT_EQUAL(rps_wait(r), 0);	/* resent at the served one */
	CU_ASSERT_EQUAL(rps_pull(t, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 1u);		/* refused once, applied once */
	expect(out, 1);
	/* tq names the served epoch now: applied, not refused */
	CU_ASSERT_EQUAL_FATAL(rps_push_start(tq, grad, sizeof(grad), &r), 0);
	CU_ASSERT_EQUAL(req_peek_status(r, 5000), 0);
	CU_ASSERT_EQUAL(rps_wait(r), 0);
	CU_ASSERT_EQUAL(rps_pull(t, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 2u);
	expect(out, 2);
	/* the map catches up (the control plane's commit): nothing changes */
	fake_do(&A, do_map_epoch, NULL);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	CU_ASSERT_EQUAL(rps_pull(tq, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 3u);
	expect(out, 3);
	rps_tensor_close(tq);
	rps_tensor_close(t);
}

/* part_refuse answers what waits for a partition no longer served: a
 * sync pull waiting for the other worker's push gets RPS_ESTALE_EPOCH (it
 * would have timed out with -ETIMEDOUT had its WAIT stayed unanswered);
 * served again, the step completes and both read the exact sum. */
static void test_refuse_waiters(void)
{
	rps_client_t *w0, *w1;
	rps_tensor_t *t0, *t1;
	rps_request_t *r;
	float out[COUNT];
	uint64_t version = 99;
	int res = 1;

	CU_ASSERT_EQUAL_FATAL(connect_worker(0, 2, QUICK_MS, &w0), 0);
	CU_ASSERT_EQUAL_FATAL(connect_worker(1, 2, 10000, &w1), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w0, "refuse", RPS_MODE_SYNC, &t0), 0);
	CU_ASSERT_EQUAL_FATAL(tensor(w1, "refuse", RPS_MODE_SYNC, &t1), 0);
	CU_ASSERT_EQUAL(rps_push(t0, grad, sizeof(grad)), 0);	/* step 0: rank 0's part */
	CU_ASSERT_EQUAL_FATAL(rps_pull_start(t0, out, sizeof(out), NULL, &r), 0);
	sleep_ms(100);
	CU_ASSERT_EQUAL(rps_test(r, &res), 0);			/* waiting for rank 1 */
	job_part = part_of("refuse");
	fake_do(&A, do_stop_serving, NULL);
	CU_ASSERT_EQUAL(rps_wait(r), RPS_ESTALE_EPOCH);
	fake_do(&A, do_serve, NULL);
	CU_ASSERT_EQUAL(rps_push(t1, grad, sizeof(grad)), 0);
	CU_ASSERT_EQUAL(rps_pull(t1, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 1u);
	expect(out, 2);
	CU_ASSERT_EQUAL(rps_pull(t0, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 1u);
	expect(out, 2);
	rps_tensor_close(t1);
	rps_tensor_close(t0);
	rps_client_close(w1);
	rps_client_close(w0);
}

/* A name whose only shard is in partition p. */
static void name_in(uint32_t p, char *buf, size_t len)
{
	for (unsigned i = 0;; i++) {
		snprintf(buf, len, "lost-%u", i);
		if (part_of(buf) == p)
			return;
	}
}

/* A lost partition: the data plane refuses a push with -ENODATA as soon
 * as it is told, the worker reads the map's lost mark and refuses pulls
 * with -ENODATA without reading (the buffer untouched, never zeros), and
 * a tensor with shards in it cannot be created.  Cleared, it serves. */
static void test_lost_partition(void)
{
	float out[COUNT];
	uint64_t version = 99, lost_with = 1, cleared = 0;
	rps_tensor_t *t, *t2;
	rps_client_t *fresh;
	char other[32];

	CU_ASSERT_EQUAL_FATAL(tensor(cl, "lost", RPS_MODE_ASYNC, &t), 0);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	job_part = part_of("lost");
	fake_do(&A, do_lost, NULL);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), -ENODATA);	/* the data plane's refusal */
	fake_do(&A, do_map_lost, &lost_with);
	/* a worker that reads the map now */
	CU_ASSERT_EQUAL_FATAL(connect_worker(0, 1, QUICK_MS, &fresh), 0);
	CU_ASSERT_EQUAL(tensor(fresh, "lost", RPS_MODE_ASYNC, &t2), -ENODATA);
	name_in(job_part, other, sizeof(other));
	CU_ASSERT_EQUAL(tensor(fresh, other, RPS_MODE_ASYNC, &t2), -ENODATA);
	CU_ASSERT_EQUAL_FATAL(rps_tensor_open(fresh, "lost", &t2), 0);
	memset(out, 0x7f, sizeof(out));
	CU_ASSERT_EQUAL(rps_pull(t2, out, sizeof(out), &version), -ENODATA);
	for (unsigned i = 0; i < COUNT; i++)
		CU_ASSERT_EQUAL(((uint32_t *)(void *)out)[i], 0x7f7f7f7fu);
	CU_ASSERT_EQUAL(rps_push(t2, grad, sizeof(grad)), -ENODATA);
	rps_tensor_close(t2);
	rps_client_close(fresh);
	/* accepted (here: kept as it was) */
	fake_do(&A, do_map_lost, &cleared);
	CU_ASSERT_EQUAL(rps_pull(t, out, sizeof(out), &version), 0);
	CU_ASSERT_EQUAL(version, 1u);
	expect(out, 1);
	rps_tensor_close(t);
}

/* ---- checkpoints ------------------------------------------------------------------ */

static struct rps__ckpt_target held_step;
static bool reached;
static struct {
	uint64_t version;
	uint32_t elems;
	bool ready, found;
	float params[COUNT];
} taken;

static void do_hold(struct fake *f, void *arg)
{
	struct rps__ckpt_target *tg = NULL;
	uint32_t n = f->dp->hold_steps(f->srv, &tg);

	(void)arg;
	memset(&held_step, 0, sizeof(held_step));
	for (uint32_t i = 0; i < n; i++)
		if (!strcmp(tg[i].name, "held"))
			held_step = tg[i];
	free(tg);
	f->dp->hold_tensor(f->srv, "held", held_step.step);
}

static void do_reached(struct fake *f, void *arg)
{
	(void)arg;
	f->dp->drain(f->srv);
	reached = f->dp->hold_reached(f->srv);
}

static void do_take(struct fake *f, void *arg)
{
	struct rps__dp_copy cc;

	(void)arg;
	memset(&taken, 0, sizeof(taken));
	memset(&cc, 0, sizeof(cc));
	CU_ASSERT_EQUAL(f->dp->take(f->srv, &cc), 0);
	for (uint32_t i = 0; i < cc.nshards; i++) {
		const struct rps__dp_shard_copy *s = &cc.shards[i];
		if (strcmp(cc.tensors[s->tensor].name, "held"))
			continue;
		taken.found = true;
		taken.version = s->meta.version;
		taken.elems = s->meta.elems;
		taken.ready = s->meta.ready;
		memcpy(taken.params, s->params, sizeof(taken.params));
	}
	f->dp->copy_free(&cc);
	f->dp->hold_release(f->srv);
	f->dp->drain(f->srv);	/* (ckpt_srv.c: the pushes that waited go on) */
}

/* A checkpoint through the ops: the hold is set at the step each sync
 * tensor has reached; pushes past it are taken (set aside) but not
 * applied, a pull waiting for them waits; take copies exactly the values
 * at the hold; release lets them be applied. */
static void test_checkpoint_hold_take(void)
{
	float out[COUNT];
	uint64_t version = 99;
	rps_tensor_t *t;
	rps_request_t *r;
	int res = 1;

	CU_ASSERT_EQUAL_FATAL(tensor(cl, "held", RPS_MODE_SYNC, &t), 0);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	fake_do(&A, do_hold, NULL);
	CU_ASSERT_STRING_EQUAL(held_step.name, "held");
	CU_ASSERT_EQUAL(held_step.step, 2u);
	/* steps 2 and 3 arrive: taken by the server, not applied */
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	CU_ASSERT_EQUAL(rps_push(t, grad, sizeof(grad)), 0);
	CU_ASSERT_EQUAL_FATAL(rps_pull_start(t, out, sizeof(out), &version, &r), 0);
	sleep_ms(100);
	CU_ASSERT_EQUAL(rps_test(r, &res), 0);		/* waits for step 4 */
	reached = false;
	fake_do(&A, do_reached, NULL);
	CU_ASSERT(reached);
	fake_do(&A, do_take, NULL);
	CU_ASSERT(taken.found);
	CU_ASSERT_EQUAL(taken.version, 2u);
	CU_ASSERT(taken.ready);
	CU_ASSERT_EQUAL(taken.elems, COUNT);
	expect(taken.params, 2);
	/* released: steps 2 and 3 applied, the pull answered */
	CU_ASSERT_EQUAL(rps_wait(r), 0);
	CU_ASSERT_EQUAL(version, 4u);
	expect(out, 4);
	rps_tensor_close(t);
}

/* A request's status when its parts fail differently: the first failure,
 * unless a retry could mend it (a moved shard, a lost connection) and a
 * later one cannot: then the later one.  A pull whose first failed shard
 * was stale and whose second was refused (a rank gone, a lost partition)
 * was retried for the stale one alone and returned 0 with the other
 * shard's output never written (the soak's "-nan"). */
static void test_request_status_precedence(void)
{
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, RPS_ESTALE_EPOCH, -EPIPE), -EPIPE);
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, -ECONNRESET, -ENODATA), -ENODATA);
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, -EFAULT, -ECONNREFUSED), -ECONNREFUSED);
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, -EPIPE, RPS_ESTALE_EPOCH), -EPIPE);
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, -EPERM, -ENODATA), -EPERM);	/* the first of two */
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, RPS_ESTALE_EPOCH, -ECONNRESET), RPS_ESTALE_EPOCH);
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, RPS_ESTALE_EPOCH, -EALREADY), RPS_ESTALE_EPOCH);
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, 0, -EPIPE), -EPIPE);
	CU_ASSERT_EQUAL(req_peek_two_parts(cl, 0, 0), 0);
}

/* Death test: the client's invariants are asserted, and asserts are live
 * in the test build (req_peek.h). */
static void test_client_asserts_live(void)
{
	CU_ASSERT(req_peek_asserts_live());
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "hooks: an admin message, its reply, the connection gone", test_hooks_admin_message },
		{ "hooks: a peer accepted, attached, messaged, READ, gone", test_hooks_peer },
		{ "hooks: run_timers' delay, errno and stop obeyed; fini", test_hooks_run_timers },
		{ "served partition: push then pull, exact values", test_served_push_pull },
		{ "client: an invariant broken aborts (asserts live)", test_client_asserts_live },
		{ "client: a part's failure no retry mends wins over an earlier one a retry would",
		  test_request_status_precedence },
		{ "create: a NaN or infinite hyper-parameter refused, one line", test_create_not_finite },
		{ "fenced partition: refused, not applied; unfenced: applied", test_fenced_partition },
		{ "stale epoch: refused, not applied; resent at the served epoch", test_stale_epoch_refused },
		{ "refuse: a waiting pull answered RPS_ESTALE_EPOCH", test_refuse_waiters },
		{ "lost partition: -ENODATA, never zeros", test_lost_partition },
		{ "checkpoint: hold, take the held values, release", test_checkpoint_hold_take },
	};

	return cutest_run1("dataplane", suite_init, suite_fini, NULL, NULL, tests, RPS__ARRAY_SIZE(tests));
}
