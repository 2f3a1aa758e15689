/*
 * test_abi.c - the promises rdmaps.h makes to binaries built against an
 * older or newer header: the *_opts_init functions and rps_tensor_info
 * write no byte past the size the caller gives (a canary follows the
 * caller's smaller structure), and rps_version() matches the header and
 * configure.  Before the sized init, rps_client_opts_init zeroed the
 * library's sizeof and rps_tensor_info called it before clamping `size`,
 * so an older binary's struct overflowed the day a member was added.
 * rps_tensor_info runs against an in-process server on loopback TCP.
 */
#include "config.h"
#include "common/common.h"
#include "control/daemon.h"
#include "server/server.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "rdmaps.h"
#include "lib/cutest.h"

#define CANARY 0xa5
/* room for the structure, any growth the test simulates, and a canary */
#define BUF_BYTES 256

struct guarded {
	alignas(max_align_t) unsigned char b[BUF_BYTES];
};

static void guard(struct guarded *g)
{
	memset(g->b, CANARY, sizeof(g->b));
}

/* the first offset at or after `from` whose byte is not the canary, or BUF_BYTES */
static size_t first_written(const struct guarded *g, size_t from)
{
	size_t i;

	for (i = from; i < sizeof(g->b); i++)
		if (g->b[i] != CANARY)
			return i;
	return sizeof(g->b);
}

/* An older header's struct rps_client_opts: the members before verify. */
static void test_client_opts_init_older_struct_not_overrun(void)
{
	const size_t old = offsetof(struct rps_client_opts, verify);
	struct guarded g;
	struct rps_client_opts *o = (struct rps_client_opts *)g.b;

	guard(&g);
	rps_client_opts_init_sized(o, old);
	CU_ASSERT_EQUAL(first_written(&g, old), (size_t)BUF_BYTES);
	CU_ASSERT_EQUAL(o->size, old);
	CU_ASSERT_EQUAL(o->num_workers, 1);
	CU_ASSERT_EQUAL(o->timeout_ms, 30000);
	CU_ASSERT_PTR_NULL(o->servers);
	CU_ASSERT_EQUAL(o->rank, 0);
}

static void test_tensor_opts_init_older_struct_not_overrun(void)
{
	const size_t old = offsetof(struct rps_tensor_opts, weight_decay);
	struct guarded g;
	struct rps_tensor_opts *o = (struct rps_tensor_opts *)g.b;

	guard(&g);
	rps_tensor_opts_init_sized(o, old);
	CU_ASSERT_EQUAL(first_written(&g, old), (size_t)BUF_BYTES);
	CU_ASSERT_EQUAL(o->size, old);
	CU_ASSERT_EQUAL(o->dtype, RPS_DTYPE_F32);
	CU_ASSERT_EQUAL(o->mode, RPS_MODE_SYNC);
	CU_ASSERT_EQUAL(o->optimizer, RPS_OPT_SUM);
	CU_ASSERT_EQUAL(o->eps, 1e-8f);
}

/* A newer header's struct, 16 bytes longer: the members the library does
 * not know are zeroed, nothing past them is touched, and size tells the
 * caller how much of its structure the library understands. */
static void test_opts_init_newer_struct_tail_zeroed(void)
{
	const size_t cnew = sizeof(struct rps_client_opts) + 16, tnew = sizeof(struct rps_tensor_opts) + 16;
	struct guarded g;
	size_t i;

	guard(&g);
	rps_client_opts_init_sized((struct rps_client_opts *)g.b, cnew);
	CU_ASSERT_EQUAL(first_written(&g, cnew), (size_t)BUF_BYTES);
	for (i = sizeof(struct rps_client_opts); i < cnew; i++)
		CU_ASSERT_EQUAL(g.b[i], 0);
	CU_ASSERT_EQUAL(((struct rps_client_opts *)g.b)->size, sizeof(struct rps_client_opts));

	guard(&g);
	rps_tensor_opts_init_sized((struct rps_tensor_opts *)g.b, tnew);
	CU_ASSERT_EQUAL(first_written(&g, tnew), (size_t)BUF_BYTES);
	for (i = sizeof(struct rps_tensor_opts); i < tnew; i++)
		CU_ASSERT_EQUAL(g.b[i], 0);
	CU_ASSERT_EQUAL(((struct rps_tensor_opts *)g.b)->size, sizeof(struct rps_tensor_opts));
}

/* A size that cannot even hold `size` is ignored: nothing is written. */
static void test_opts_init_tiny_size_writes_nothing(void)
{
	struct guarded g;

	guard(&g);
	rps_client_opts_init_sized((struct rps_client_opts *)g.b, sizeof(size_t) - 1);
	rps_tensor_opts_init_sized((struct rps_tensor_opts *)g.b, 0);
	CU_ASSERT_EQUAL(first_written(&g, 0), (size_t)BUF_BYTES);
}

static void test_version_matches_header_and_configure(void)
{
	const char *s = NULL;

	CU_ASSERT_EQUAL(rps_version(&s), RPS_VERSION_NUMBER);
	CU_ASSERT_STRING_EQUAL(s, RPS_VERSION_STRING);
	CU_ASSERT_STRING_EQUAL(s, PACKAGE_VERSION);
	CU_ASSERT_EQUAL(rps_version(NULL), RPS_VERSION_NUMBER);
	CU_ASSERT_EQUAL(RPS_VERSION_NUMBER, RPS_VERSION_MAJOR * 10000 + RPS_VERSION_MINOR * 100 + RPS_VERSION_PATCH);
}

/* ---- rps_tensor_info against an in-process server ------------------------ */

static struct rps__daemon *srv;
static pthread_t srv_thread;
static int srv_running;

static void *serve(void *arg)
{
	return (void *)(intptr_t)rps__daemon_run(arg);
}

static int suite_server_init(void)
{
	struct rps__server_config cfg;

	rps__server_config_init(&cfg);
	cfg.listen.kind = RPS__KIND_TCP;
	snprintf(cfg.listen.host, sizeof(cfg.listen.host), "127.0.0.1");
	cfg.shard_bytes = 1024;
	cfg.fsync_none = 1;
	cfg.no_pin = 1;
	if (rps__daemon_create(&cfg, &srv)) {
		fprintf(stderr, "test_abi: %s\n", rps__errbuf());
		return -1;
	}
	if (pthread_create(&srv_thread, NULL, serve, srv))
		return -1;
	srv_running = 1;
	return 0;
}

static int suite_server_fini(void)
{
	if (srv_running) {
		rps__daemon_stop(srv);
		pthread_join(srv_thread, NULL);
	}
	rps__daemon_destroy(srv);
	srv = NULL;
	return 0;
}

static void test_tensor_info_writes_at_most_callers_size(void)
{
	/* an older struct rps_tensor_opts: everything up to init, not init */
	const size_t old = offsetof(struct rps_tensor_opts, init);
	struct rps_client_opts co;
	struct rps_tensor_opts to, *o;
	rps_client_t *cl;
	rps_tensor_t *t;
	struct guarded g;
	char servers[64];

	snprintf(servers, sizeof(servers), "tcp://127.0.0.1:%u", (unsigned)rps__daemon_port(srv));
	rps_client_opts_init(&co);
	co.servers = servers;
	co.timeout_ms = 10000;
	CU_ASSERT_EQUAL_FATAL(rps_client_connect(&co, &cl), 0);
	rps_tensor_opts_init(&to);
	to.count = 1000;
	to.mode = RPS_MODE_ASYNC;
	to.optimizer = RPS_OPT_ADAM;
	to.lr = 0.25f;
	to.weight_decay = 0.5f;
	CU_ASSERT_EQUAL_FATAL(rps_tensor_create(cl, "abi-info", &to, &t), 0);

	guard(&g);
	o = (struct rps_tensor_opts *)g.b;
	o->size = old;
	CU_ASSERT_EQUAL(rps_tensor_info(t, o), 0);
	CU_ASSERT_EQUAL(first_written(&g, old), (size_t)BUF_BYTES);
	CU_ASSERT_EQUAL(o->size, old);
	CU_ASSERT_EQUAL(o->count, 1000);
	CU_ASSERT_EQUAL(o->mode, RPS_MODE_ASYNC);
	CU_ASSERT_EQUAL(o->optimizer, RPS_OPT_ADAM);
	CU_ASSERT_EQUAL(o->lr, 0.25f);
	CU_ASSERT_EQUAL(o->weight_decay, 0.5f);

	/* the whole structure: init is NULL, size stays */
	guard(&g);
	o->size = sizeof(*o);
	CU_ASSERT_EQUAL(rps_tensor_info(t, o), 0);
	CU_ASSERT_EQUAL(first_written(&g, sizeof(*o)), (size_t)BUF_BYTES);
	CU_ASSERT_EQUAL(o->size, sizeof(*o));
	CU_ASSERT_PTR_NULL(o->init);
	CU_ASSERT_EQUAL(o->count, 1000);

	/* too small to hold the description: refused, nothing written */
	guard(&g);
	o->size = offsetof(struct rps_tensor_opts, rescale);
	CU_ASSERT_EQUAL(rps_tensor_info(t, o), -EINVAL);
	CU_ASSERT_EQUAL(first_written(&g, sizeof(o->size)), (size_t)BUF_BYTES);

	rps_tensor_close(t);
	CU_ASSERT_EQUAL(rps_client_close(cl), 0);
}

int main(void)
{
	static const struct cutest opts_tests[] = {
		{ "client opts init: an older struct is not overrun", test_client_opts_init_older_struct_not_overrun },
		{ "tensor opts init: an older struct is not overrun", test_tensor_opts_init_older_struct_not_overrun },
		{ "opts init: a newer struct's unknown tail is zeroed", test_opts_init_newer_struct_tail_zeroed },
		{ "opts init: a size below sizeof(size) writes nothing", test_opts_init_tiny_size_writes_nothing },
		{ "rps_version matches the header and configure", test_version_matches_header_and_configure },
	};
	static const struct cutest info_tests[] = {
		{ "rps_tensor_info writes at most the caller's size", test_tensor_info_writes_at_most_callers_size },
	};
	const struct cutest_suite suites[] = {
		{ "option structures and version", NULL, NULL, NULL, NULL, opts_tests, CUTEST_COUNT(opts_tests) },
		{ "rps_tensor_info, one in-process server", suite_server_init, suite_server_fini, NULL, NULL, info_tests,
		  CUTEST_COUNT(info_tests) },
	};

	rps__log_level = RPS__LOG_ERROR;
	return cutest_run(suites, CUTEST_COUNT(suites));
}
