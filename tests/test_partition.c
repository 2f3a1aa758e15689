/*
 * test_partition.c - unit tests of the partition image a move ships: an
 * in-process data plane (TCP on loopback, nothing served) builds
 * the image of one of its partitions, a field is made bad, and installing
 * it as a move's destination would must refuse it whole and change
 * nothing.  Before the validation pass, a parked push that did not fit its
 * tensor was installed and crashed the server when it was drained
 * (rps__srv_drain_held -> sync_take -> rps__agg_copy).
 *
 * Seeding a backup installs the same image: a sync step in progress in it
 * (acknowledged before the partition had backups, never resent) is kept,
 * taken on by nothing while the server is a backup, forgotten once the
 * primary's step is applied there, and taken on in rank order once the
 * backup is promoted (doc/operations.md "Server death, with replicas").
 */
#include "config.h"
#include "common/common.h"
#include "kernels/agg.h"
#include "server/server_int.h"
#include "server/repl.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rdmaps.h"
#include "lib/cutest.h"

#define SHARD_BYTES 1024u	/* 256 fp32 per shard */
#define NPART 4u

static struct rps__server *srv;

/* What the control plane of a one-member cluster tells its data plane:
 * NPART partitions, every one of them served here. */
static void serve_all(void)
{
	const struct rps__dp_ops *dp = rps__dataplane_ops();
	uint32_t p;

	dp->set_map(srv, NPART, 1);
	for (p = 0; p < NPART; p++)
		dp->part_set(srv, p, &(struct rps__dp_part){ .epoch = 1, .map_epoch = 1, .serving = true });
}

static int suite_init(void)
{
	struct rps__server_config cfg;

	rps__server_config_init(&cfg);
	cfg.listen.kind = RPS__KIND_TCP;
	snprintf(cfg.listen.host, sizeof(cfg.listen.host), "127.0.0.1");
	cfg.shard_bytes = SHARD_BYTES;
	cfg.npart = NPART;
	cfg.fsync_none = 1;
	cfg.no_pin = 1;
	if (rps__server_create(&cfg, &srv)) {
		fprintf(stderr, "test_partition: %s\n", rps__errbuf());
		return -1;
	}
	serve_all();
	return 0;
}

static int suite_fini(void)
{
	rps__server_destroy(srv);
	srv = NULL;
	return 0;
}

/* A tensor with its shards of partition 0 here. */
static struct srv_tensor *tensor_new_dt(const char *name, enum rps_mode mode, int nworkers, enum rps_dtype dt);

static struct srv_tensor *tensor_new(const char *name, enum rps_mode mode, int nworkers)
{
	return tensor_new_dt(name, mode, nworkers, RPS_DTYPE_F32);
}

static struct srv_tensor *tensor_new_dt(const char *name, enum rps_mode mode, int nworkers, enum rps_dtype dt)
{
	struct rps__tensor_spec sp;
	struct srv_tensor *t = NULL;
	uint32_t p;

	memset(&sp, 0, sizeof(sp));
	sp.count = 4 * NPART * (SHARD_BYTES / 4);	/* 4 shards in every partition */
	sp.dtype = dt;
	sp.mode = mode;
	sp.optimizer = RPS_OPT_SGD;
	sp.lr = 0.5f;
	sp.rescale = 1.0f;
	sp.num_workers = nworkers;
	CU_ASSERT_EQUAL_FATAL(rps__srv_tensor_add(srv, name, &sp, &t), 0);
	for (p = 0; p < NPART; p++) {
		CU_ASSERT_EQUAL_FATAL(rps__srv_region_alloc(srv, t, p, false, NULL), 0);
		CU_ASSERT_EQUAL_FATAL(rps__srv_region_register(srv, t, p), 0);
	}
	return t;
}

/* A parked push of the first shard of partition 0 (as park() keeps one). */
static void park_one(struct srv_tensor *t, uint64_t clock, int rank, size_t nbytes)
{
	struct parked *pk;

	CU_ASSERT_EQUAL_FATAL(rps__srv_parked_slot(srv, &pk), 0);
	srv->push.nparked++;
	pk->t = t;
	pk->local = rps__part_shard(&t->layout, 0, 0);
	pk->clock = clock;
	pk->rank = rank;
	pk->nbytes = nbytes;
	pk->data = calloc(1, nbytes ? nbytes : 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pk->data);
	pk->cap = nbytes;
	srv->push.parked_bytes += nbytes;
}

static void unpark_all(void)
{
	while (srv->push.nparked) {
		struct parked *pk = &srv->push.parked[--srv->push.nparked];
		srv->push.parked_bytes -= pk->nbytes;
		free(pk->data);
	}
}

/* What installing must not change when it refuses. */
struct before {
	uint32_t ntensors, nparked;
	void *mem[8];
	uint64_t step0[8];
	float p0[8];
};

static void snap(struct before *b)
{
	uint32_t i;

	memset(b, 0, sizeof(*b));
	b->ntensors = srv->ntensors;
	b->nparked = srv->push.nparked;
	for (i = 0; i < srv->ntensors && i < 8; i++) {
		struct srv_tensor *t = srv->tensors[i];
		struct shard *s = &t->shards[rps__part_shard(&t->layout, 0, 0)];
		b->mem[i] = t->regions[0].mem;
		b->step0[i] = s->step;
		b->p0[i] = s->params ? s->params[0] : -1.0f;
	}
}

static void assert_unchanged(const struct before *b)
{
	struct before now;
	uint32_t i;

	snap(&now);
	CU_ASSERT_EQUAL(now.ntensors, b->ntensors);
	CU_ASSERT_EQUAL(now.nparked, b->nparked);
	for (i = 0; i < 8; i++) {
		CU_ASSERT_PTR_EQUAL(now.mem[i], b->mem[i]);
		CU_ASSERT_EQUAL(now.step0[i], b->step0[i]);
		CU_ASSERT_EQUAL(now.p0[i], b->p0[i]);
	}
}

/* Build partition 0's image with what is parked now, unpark it, install it:
 * the install's result.  A refused image must leave everything as it was;
 * one that is taken is drained as the server would. */
static int ship_and_install(void)
{
	struct before b;
	void *img = NULL;
	size_t len = 0;
	int ret;

	CU_ASSERT_EQUAL_FATAL(rps__srv_image_build(srv, 0, srv->parts[0].epoch, &img, &len), 0);
	unpark_all();
	snap(&b);
	ret = rps__srv_image_install(srv, 0, srv->parts[0].epoch, img, len);
	if (ret)
		assert_unchanged(&b);
	else
		rps__srv_drain_held(srv);
	free(img);
	return ret;
}

static void test_install_takes_valid_image(void)
{
	struct srv_tensor *t = rps__srv_tensor_by_name(srv, "sync1");
	struct shard *s;

	if (!t)
		t = tensor_new("sync1", RPS_MODE_SYNC, 2);
	s = &t->shards[rps__part_shard(&t->layout, 0, 0)];
	s->params[0] = 3.0f;
	park_one(t, 0, 1, (size_t)s->elems * 4);
	CU_ASSERT_EQUAL(ship_and_install(), 0);
	s = &t->shards[rps__part_shard(&t->layout, 0, 0)];
	CU_ASSERT_EQUAL(s->params[0], 3.0f);
	CU_ASSERT_EQUAL(srv->push.nparked, 1u);	/* rank 1 waits for rank 0 */
	unpark_all();
}

static void test_install_refuses_bad_parked_push(void)
{
	struct srv_tensor *t = rps__srv_tensor_by_name(srv, "sync1");
	struct shard *s;

	if (!t)
		t = tensor_new("sync1", RPS_MODE_SYNC, 2);
	s = &t->shards[rps__part_shard(&t->layout, 0, 0)];
	/* a push of 8 bytes for a shard of 1 KiB: summing it read past it */
	park_one(t, s->step, 0, 8);
	CU_ASSERT_EQUAL(ship_and_install(), -EBADMSG);
	CU_ASSERT(strstr(rps__errbuf(), "parked push 1: 8 bytes") != NULL);
	/* a rank beyond the tensor's workers */
	park_one(t, s->step, 2, (size_t)s->elems * 4);
	CU_ASSERT_EQUAL(ship_and_install(), -EBADMSG);
	CU_ASSERT(strstr(rps__errbuf(), "rank 2 of 2 workers") != NULL);
	/* a clock behind the shard's version */
	s->step = 5;
	park_one(t, 4, 0, (size_t)s->elems * 4);
	CU_ASSERT_EQUAL(ship_and_install(), -EBADMSG);
	CU_ASSERT(strstr(rps__errbuf(), "clock 4") != NULL);
	s->step = 0;
}

static void test_install_refuses_push_parked_for_async_tensor(void)
{
	struct srv_tensor *t = tensor_new("async1", RPS_MODE_ASYNC, 0);
	struct shard *s = &t->shards[rps__part_shard(&t->layout, 0, 0)];

	/* right size, but an async shard has no accumulator: summing it
	 * dereferenced NULL */
	park_one(t, 0, 0, (size_t)s->elems * 4);
	CU_ASSERT_EQUAL(ship_and_install(), -EBADMSG);
	CU_ASSERT(strstr(rps__errbuf(), "not in sync mode") != NULL);
}

/* Field by field: every byte of a valid image flipped in turn must be
 * refused (or be a value the server can use), never crash or leave part
 * of the image installed. */
static void test_install_refuses_mutated_fields(void)
{
	struct srv_tensor *t = rps__srv_tensor_by_name(srv, "sync1");
	void *img = NULL;
	unsigned char *m;
	size_t len = 0, i;
	int refused = 0;

	if (!t)
		t = tensor_new("sync1", RPS_MODE_SYNC, 2);
	park_one(t, 0, 1, (size_t)t->shards[rps__part_shard(&t->layout, 0, 0)].elems * 4);
	CU_ASSERT_EQUAL_FATAL(rps__srv_image_build(srv, 0, srv->parts[0].epoch, &img, &len), 0);
	unpark_all();
	m = malloc(len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	/* the header, and every count and spec byte up to the first values */
	for (i = 0; i < len && i < 256; i++) {
		struct before b;
		int ret;
		memcpy(m, img, len);
		m[i] ^= 0x80;
		snap(&b);
		ret = rps__srv_image_install(srv, 0, srv->parts[0].epoch, m, len);
		if (ret) {
			CU_ASSERT_EQUAL(ret, -EBADMSG);
			assert_unchanged(&b);
			refused++;
		} else {
			rps__srv_drain_held(srv);
			unpark_all();
		}
	}
	/* truncated anywhere */
	for (i = 0; i < len; i += 97) {
		struct before b;
		snap(&b);
		CU_ASSERT_EQUAL(rps__srv_image_install(srv, 0, srv->parts[0].epoch, img, i), -EBADMSG);
		assert_unchanged(&b);
	}
	CU_ASSERT(refused > 0);
	free(m);
	free(img);
}

/* A sync push taken early (push.c) lives in its shard's accumulator, not
 * in a buffer of its own: the image carries it as an ordinary parked push
 * with the very bytes the worker sent (narrowed back from the exact fp32
 * widening), and giving the partition away forgets it. */
static void test_early_push_in_image(void)
{
	struct srv_tensor *t = tensor_new_dt("early-bf16", RPS_MODE_SYNC, 2, RPS_DTYPE_BF16);
	struct shard *s = &t->shards[rps__part_shard(&t->layout, 0, 0)];
	uint16_t *sent = malloc((size_t)s->elems * 2);
	struct parked *pk;
	void *img = NULL;
	size_t len = 0;
	uint32_t i;

	CU_ASSERT_PTR_NOT_NULL_FATAL(sent);
	for (i = 0; i < s->elems; i++)
		sent[i] = rps__f32_to_bf16((float)i * -0.37f + 1.0f / 3.0f);
	sent[1] = 0x8000;		/* -0 */
	sent[2] = 0x0001;		/* the smallest subnormal */
	/* what take_early leaves: rank 1's push alone in the sum */
	rps__agg_copy(s->acc, sent, RPS_DTYPE_BF16, s->elems);
	s->early_rank = 1;
	park_one(t, s->step, 1, (size_t)s->elems * 2);
	pk = &srv->push.parked[srv->push.nparked - 1];
	free(pk->data);
	pk->data = NULL;
	pk->cap = 0;
	pk->in_acc = true;
	srv->push.parked_bytes -= pk->nbytes;	/* (an early push takes no parking bytes) */
	CU_ASSERT_EQUAL_FATAL(rps__srv_image_build(srv, 0, srv->parts[0].epoch, &img, &len), 0);
	rps__srv_part_forget_parked(srv, 0);
	CU_ASSERT_EQUAL(srv->push.nparked, 0u);
	CU_ASSERT_EQUAL(s->early_rank, -1);
	CU_ASSERT_EQUAL(srv->push.parked_bytes, 0u);
	CU_ASSERT_EQUAL_FATAL(rps__srv_image_install(srv, 0, srv->parts[0].epoch, img, len), 0);
	CU_ASSERT_EQUAL_FATAL(srv->push.nparked, 1u);
	pk = &srv->push.parked[0];
	CU_ASSERT_FALSE(pk->in_acc);
	CU_ASSERT_EQUAL(pk->rank, 1);
	CU_ASSERT_EQUAL(pk->nbytes, (size_t)s->elems * 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pk->data);
	CU_ASSERT(memcmp(pk->data, sent, (size_t)s->elems * 2) == 0);
	CU_ASSERT_EQUAL(s->early_rank, -1);
	unpark_all();
	free(img);
	free(sent);
}

/* A bounded tensor whose slow rank was removed (psctl remove-rank): the
 * shard's minimum clock is taken over the ranks left, and its image, a
 * move's or a seed's, carries that minimum.  The check took the minimum
 * over every rank, removed ones too, and refused the image ("minimum clock
 * 5, its clocks say 1"): the partition could not move or be seeded. */
static void test_image_bounded_rank_removed(void)
{
	struct srv_tensor *t = tensor_new("bounded-removed", RPS_MODE_BOUNDED, 3);
	uint32_t local = rps__part_shard(&t->layout, 0, 0);
	struct shard *s = &t->shards[local];

	s->ready = true;
	rps__srv_clock_note(t, s, 0, 4);	/* clocks 5, 1, 6 */
	rps__srv_clock_note(t, s, 1, 0);
	rps__srv_clock_note(t, s, 2, 5);
	CU_ASSERT_EQUAL(s->hdr->min_clock, 1u);
	CU_ASSERT_EQUAL(ship_and_install(), 0);	/* (every rank in: the plain case) */
	CU_ASSERT_EQUAL(rps__srv_rank_remove(srv, "bounded-removed", 1), 1);
	t = rps__srv_tensor_by_name(srv, "bounded-removed");
	s = &t->shards[local];
	CU_ASSERT_EQUAL(s->hdr->min_clock, 5u);	/* rank 1 aside */
	CU_ASSERT_EQUAL(ship_and_install(), 0);
	t = rps__srv_tensor_by_name(srv, "bounded-removed");
	s = &t->shards[local];
	CU_ASSERT_EQUAL(s->hdr->min_clock, 5u);
	CU_ASSERT(rps__srv_rank_removed(t, 1));
	CU_ASSERT_FALSE(rps__srv_rank_removed(t, 0));
	/* a minimum that is not the one over the ranks left is still refused */
	s->hdr->min_clock = 1;
	CU_ASSERT_EQUAL(ship_and_install(), -EBADMSG);
	s->hdr->min_clock = 5;
}

/* Parking buffers go back to a pool and come out again for the next push
 * of a size they fit, still counted against --memory-limit; under the
 * limit, kept ones are freed before anything is refused. */
static void test_park_pool(void)
{
	size_t used = srv->mem_used, cap = 0, cap2 = 0, limit = srv->cfg.mem_limit;
	struct parked p;
	void *a, *b;

	a = rps__srv_park_buf_get(srv, 1000, &cap);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_EQUAL(cap, 1000u);
	CU_ASSERT_EQUAL(srv->mem_used, used + 1000);
	memset(&p, 0, sizeof(p));
	p.data = a;
	p.cap = cap;
	p.nbytes = 1000;
	srv->push.parked_bytes += 1000;
	rps__srv_parked_release(srv, &p);
	CU_ASSERT_PTR_NULL(p.data);
	CU_ASSERT_EQUAL(srv->push.parked_bytes, 0u);
	CU_ASSERT_EQUAL(srv->push.npark_pool, 1u);
	CU_ASSERT_EQUAL(srv->mem_used, used + 1000);	/* kept: still counted */
	/* a push of 800 bytes reuses it; one of 400 would waste half: not */
	b = rps__srv_park_buf_get(srv, 800, &cap2);
	CU_ASSERT_PTR_EQUAL(b, a);
	CU_ASSERT_EQUAL(cap2, 1000u);
	CU_ASSERT_EQUAL(srv->push.npark_pool, 0u);
	p.data = b;
	p.cap = cap2;
	p.nbytes = 800;
	srv->push.parked_bytes += 800;
	rps__srv_parked_release(srv, &p);
	b = rps__srv_park_buf_get(srv, 400, &cap2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_PTR_NOT_EQUAL(b, a);
	CU_ASSERT_EQUAL(cap2, 400u);
	CU_ASSERT_EQUAL(srv->mem_used, used + 1400);
	free(b);
	rps__srv_mem_give(srv, 400);
	/* the limit: 500 bytes left, a take of 800 frees the kept 1000 */
	srv->cfg.mem_limit = srv->mem_used + 500;
	CU_ASSERT_EQUAL(rps__srv_mem_take(srv, 800, "a test"), 0);
	CU_ASSERT_EQUAL(srv->push.npark_pool, 0u);
	CU_ASSERT_EQUAL(srv->mem_used, used + 800);
	CU_ASSERT_EQUAL(rps__srv_mem_take(srv, 1000, "a test"), -ENOMEM);	/* (200 left) */
	rps__srv_mem_give(srv, 800);
	srv->cfg.mem_limit = limit;
	CU_ASSERT_EQUAL(srv->mem_used, used);
}

/* The data plane's invariants are asserted (src/server: assert.h), and
 * the asserts are live in the build the tests use (no NDEBUG): a parked
 * push released with more bytes than the budget counts aborts, in a child,
 * rather than wrap parked_bytes around. */
static void test_invariant_asserts_live(void)
{
	int status = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		struct rlimit none = { 0, 0 };
		struct parked p;

		setrlimit(RLIMIT_CORE, &none);	/* (no core file for an abort we want) */
		fprintf(stderr, "test_partition: an assertion failure on parked_bytes is expected next\n");
		memset(&p, 0, sizeof(p));
		p.data = malloc(1000);
		p.cap = p.nbytes = 1000;
		srv->push.parked_bytes = 999;	/* one byte short of what p counts */
		rps__srv_parked_release(srv, &p);
		_exit(0);	/* the assert did not fire */
	}
	CU_ASSERT_EQUAL_FATAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
	CU_ASSERT_EQUAL(srv->push.parked_bytes, 0u);	/* (the child's copy was broken, not ours) */
}

/* ---- seeding a backup mid-step ---------------------------------------------- */

/* Partition 0 as a backup of member 2 (not served), or served again. */
static void part0_backup(void)
{
	rps__dataplane_ops()->part_set(srv, 0, &(struct rps__dp_part){
		.epoch = 1, .map_epoch = 1, .primary = 2, .backups = { 1 }, .nbackups = 1, .backup = true });
}

static void fill(float *g, uint32_t n, float scale, uint32_t salt)
{
	for (uint32_t i = 0; i < n; i++)
		g[i] = ((float)((i * 2654435761u + salt) % 1000u) - 500.0f) / 3.0f * scale;
}

/* Tensor `name`'s first shard of partition 0 mid-step, as a primary
 * without backups leaves it: rank 0's push summed, rank 1's parked in its
 * turn (held there for replication credits when the image was cut), rank
 * 0's push of the next step parked.  The image is built, the parked
 * pushes go (they travel in it), and it is installed as a backup's seed.
 * *sp: the shard installed; g: three gradients of its size. */
static void seed_mid_step(const char *name, struct srv_tensor **tp, struct shard **sp, float *g[3])
{
	struct srv_tensor *t = tensor_new(name, RPS_MODE_SYNC, 3);
	struct shard *s = &t->shards[rps__part_shard(&t->layout, 0, 0)];
	size_t bytes = (size_t)s->elems * 4;
	void *img = NULL;
	size_t len = 0;

	for (int k = 0; k < 3; k++) {
		g[k] = malloc(bytes);
		CU_ASSERT_PTR_NOT_NULL_FATAL(g[k]);
		fill(g[k], s->elems, (float)(1u << (4 * k)), (uint32_t)k * 7919u);
	}
	s->step = 3;
	rps__agg_copy(s->acc, g[0], RPS_DTYPE_F32, s->elems);
	s->nsummed = 1;
	s->next_rank = 1;
	park_one(t, 3, 1, bytes);
	memcpy(srv->push.parked[srv->push.nparked - 1].data, g[1], bytes);
	park_one(t, 4, 0, bytes);
	memcpy(srv->push.parked[srv->push.nparked - 1].data, g[2], bytes);
	CU_ASSERT_EQUAL_FATAL(rps__srv_image_build(srv, 0, srv->parts[0].epoch, &img, &len), 0);
	unpark_all();
	part0_backup();
	CU_ASSERT_EQUAL_FATAL(rps__srv_image_install_backup(srv, 0, 1, img, len, 7), 0);
	CU_ASSERT_EQUAL(rps__srv_repl_seq(srv, 0), 7u);
	free(img);
	*tp = t;
	*sp = &t->shards[rps__part_shard(&t->layout, 0, 0)];
}

/* The parked push of (t, s) for clock and rank, or NULL. */
static struct parked *parked_of(const struct srv_tensor *t, const struct shard *s, uint64_t clock, int rank)
{
	for (uint32_t i = 0; i < srv->push.nparked; i++)
		if (srv->push.parked[i].t == t && srv->push.parked[i].local == s->index &&
		    srv->push.parked[i].clock == clock && srv->push.parked[i].rank == rank)
			return &srv->push.parked[i];
	return NULL;
}

/* A backup keeps the step in progress, takes nothing on while it is one,
 * and once promoted goes on from there: rank 1's parked push is summed
 * after rank 0's, to the bits of the rank-order sum. */
static void test_seeded_backup_keeps_step(void)
{
	struct srv_tensor *t;
	struct shard *s;
	float *g[3], *ref;
	struct parked *pk;

	seed_mid_step("seed-promoted", &t, &s, g);
	ref = malloc((size_t)s->elems * 4);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
	CU_ASSERT_EQUAL(s->step, 3u);
	CU_ASSERT_EQUAL(s->next_rank, 1);
	CU_ASSERT_EQUAL(s->nsummed, 1u);
	CU_ASSERT(memcmp(s->acc, g[0], (size_t)s->elems * 4) == 0);
	CU_ASSERT_EQUAL(srv->push.nparked, 2u);
	pk = parked_of(t, s, 3, 1);
	CU_ASSERT_FATAL(pk && pk->data && !memcmp(pk->data, g[1], (size_t)s->elems * 4));
	CU_ASSERT_PTR_NOT_NULL(parked_of(t, s, 4, 0));
	/* a backup takes nothing on: the primary's step comes whole */
	rps__srv_drain_held(srv);
	CU_ASSERT_EQUAL(s->next_rank, 1);
	CU_ASSERT_EQUAL(s->nsummed, 1u);
	CU_ASSERT_EQUAL(srv->push.nparked, 2u);
	/* promoted (a FAILOVER): served from here on, rank 1's turn is taken */
	rps__dataplane_ops()->part_promote(srv, 0, 2);
	rps__dataplane_ops()->part_set(srv, 0, &(struct rps__dp_part){ .epoch = 2, .map_epoch = 2, .serving = true });
	rps__agg_copy(ref, g[0], RPS_DTYPE_F32, s->elems);
	rps__agg_add(ref, g[1], RPS_DTYPE_F32, s->elems);
	CU_ASSERT_EQUAL(s->step, 3u);		/* (rank 2's push is not in) */
	CU_ASSERT_EQUAL(s->next_rank, 2);
	CU_ASSERT_EQUAL(s->nsummed, 2u);
	CU_ASSERT(memcmp(s->acc, ref, (size_t)s->elems * 4) == 0);
	CU_ASSERT_EQUAL(srv->push.nparked, 1u);
	CU_ASSERT_PTR_NOT_NULL(parked_of(t, s, 4, 0));
	unpark_all();
	serve_all();
	for (int k = 0; k < 3; k++)
		free(g[k]);
	free(ref);
}

/* The primary's step, applied on the backup, holds what the seeding image
 * carried of it: forgotten, the later step's parked push kept. */
static void test_seeded_backup_step_replicated(void)
{
	struct srv_tensor *t;
	struct shard *s;
	float *g[3];

	seed_mid_step("seed-replicated", &t, &s, g);
	CU_ASSERT_EQUAL(srv->push.nparked, 2u);
	s->step = 4;				/* (what REPL_STEP's apply leaves) */
	rps__srv_sync_step_replicated(srv, t, s->index);
	CU_ASSERT_EQUAL(s->next_rank, 0);
	CU_ASSERT_EQUAL(s->nsummed, 0u);
	CU_ASSERT_EQUAL(srv->push.nparked, 1u);
	CU_ASSERT_PTR_NOT_NULL(parked_of(t, s, 4, 0));
	unpark_all();
	serve_all();
	for (int k = 0; k < 3; k++)
		free(g[k]);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "a valid image is installed", test_install_takes_valid_image },
		{ "install refuses a bad parked push", test_install_refuses_bad_parked_push },
		{ "install refuses a push parked for an async tensor", test_install_refuses_push_parked_for_async_tensor },
		{ "install refuses mutated fields, changing nothing", test_install_refuses_mutated_fields },
		{ "a push taken early travels in the image as a parked push", test_early_push_in_image },
		{ "kept parking buffers are reused, and give way under the memory limit", test_park_pool },
		{ "a bounded tensor's image after a rank removal: minimum over the ranks left", test_image_bounded_rank_removed },
		{ "the data plane's invariants are asserted, the asserts live", test_invariant_asserts_live },
		{ "a backup seeded mid-step keeps the step, takes nothing; promoted, goes on in rank order",
		  test_seeded_backup_keeps_step },
		{ "a backup forgets the seeded step once the primary's step is applied", test_seeded_backup_step_replicated },
	};
	const struct cutest_suite suites[] = {
		{ "partition image", suite_init, suite_fini, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	rps__log_level = RPS__LOG_ERROR;
	return cutest_run(suites, CUTEST_COUNT(suites));
}
