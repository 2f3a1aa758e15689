/*
 * reseed.c - the reseed test: the re-replication rate (bytes of partition
 * images copied to new backups per second) beside the raw bandwidth of the
 * same path, in one run.
 *
 * Local mode only, on a cluster of its own (--servers N >= 2, started
 * without a replication target, so the map's target is what this test
 * sets).  Per size S of the sweep the cluster holds S bytes of fp32
 * parameters, non-zero (each step adds a tensor of what the previous
 * steps lack, created with initial values and pushed once).  Then, per
 * cycle (-n, default 1): SET_REPLICAS R through the same ADMIN request
 * psctl set-replicas sends; the clock starts at its reply (the entry is
 * committed and applied on the leader) and stops when the leader's map has
 * R copies of every partition (no under-replicated one), polled with
 * STATUS; then SET_REPLICAS 1 drops the backups again and the next cycle
 * or size starts from there (after RESEED_SETTLE_MS).  Bytes seeded = S * (R - 1): every parameter
 * byte is copied into R - 1 new backups (the images also carry a few
 * bytes of header per shard, not counted).  After each size, the raw
 * bandwidth on the same path: over tcp a plain socket stream (the ratio)
 * and the tcp transport's READ (what a backup's image READ goes through),
 * over verbs RDMA READ.
 */
#include "config.h"
#include "psperf_int.h"
#include "client/ctl.h"
#include "proto/proto.h"
#include "proto/smap.h"
#include "control/raft.h"
#include "transport/uri.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESEED_POLL_MS 5		/* STATUS while waiting for the map: the timing's resolution */
#define RESEED_WAIT_S 600		/* a raise or drop that takes longer has failed */
#define RESEED_RAW_MSG (1u << 20)	/* raw stream / READ message size at most */
#define RESEED_RAW_MIN 64L		/* raw messages at least, per row */
/* Before a raise: the leader spaces its proposals for one partition 0.5 s
 * apart (REPLICA_RETRY_NS, src/control/repl_place.c), so a raise right
 * after the drop would first wait out the drop's spacing, which a
 * re-replication after a failover does not: let it pass. */
#define RESEED_SETTLE_MS 1000

struct reseed {
	struct run *r;
	struct rps__uri *uris;
	int n;
	struct rps__ctl **ctl;	/* per server; NULL until opened */
	int leader;
	char *buf;		/* RPS__BIG_MSG_MAX: a STATUS reply */
	struct rps__smap map;	/* the last one read */
	rps_client_t *cl;
	rps_tensor_t **tens;	/* one per size step */
	size_t held;		/* parameter bytes the tensors hold so far */
};

/* ---- which rows, their raw operations -------------------------------------------------------- */

/* The raw bandwidth each reseed row is shown beside (always measured: it
 * is half of what this test reports). */
static void plan_raws(struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++) {
		struct row *row = &r->rows[i];
		size_t a = RPS__MIN(row->bytes, (size_t)RESEED_RAW_MSG);
		long n = RPS__MAX((long)(row->bytes / a), RESEED_RAW_MIN);

		if (row->test != T_RESEED)
			continue;
		if (r->kind == RPS__KIND_VERBS) {
			row->raw_bw = psperf_raw_add(r, RAW_READ_BW, a, 0, n, n);
		} else {
			row->raw_bw = psperf_raw_add(r, RAW_SOCK_STREAM, a, 0, n, n);
			row->raw_x[1] = psperf_raw_add(r, RAW_READ_BW, a, 0, n, n);
			row->raw_x[1]->transport_tcp = true;
		}
	}
}

/* ---- admin: STATUS, the leader, SET_REPLICAS --------------------------------------------------- */

static int status_of(struct reseed *x, int i, struct rps__status_rep *st, bool with_map)
{
	size_t len = 0;
	int32_t status = 0;
	int ret;

	if (!x->ctl[i] && (ret = rps__ctl_open(&x->uris[i], x->r->o->timeout_ms, &x->ctl[i]))) {
		x->ctl[i] = NULL;
		return ret;
	}
	ret = rps__ctl_call(x->ctl[i], RPS__MSG_STATUS, NULL, 0, x->buf, RPS__BIG_MSG_MAX, &len, &status,
			    x->r->o->timeout_ms);
	if (ret == -ECONNRESET) {
		rps__ctl_close(x->ctl[i]);
		x->ctl[i] = NULL;
	}
	if (ret)
		return ret;
	if (status < 0)
		return rps__seterr(status, "STATUS refused: %s", rps_strerror(status));
	if (len < sizeof(*st))
		return rps__seterr(-EBADMSG, "STATUS reply of %zu bytes is too short", len);
	memcpy(st, x->buf, sizeof(*st));
	if (with_map && (len == sizeof(*st) || rps__smap_decode(x->buf + sizeof(*st), len - sizeof(*st), &x->map)))
		return rps__seterr(-EBADMSG, "STATUS reply without a shard map that decodes");
	return 0;
}

/* The server that says it leads, once its map is bootstrapped. */
static int find_leader(struct reseed *x, uint64_t deadline)
{
	struct rps__status_rep st;
	char last[512] = "";
	int i;

	for (;;) {
		for (i = 0; i < x->n; i++) {
			if (status_of(x, i, &st, true)) {
				snprintf(last, sizeof(last), "%s", rps__errbuf());
				continue;
			}
			if (st.role == RPS__RAFT_LEADER && x->map.npart) {
				x->leader = i;
				return 0;
			}
		}
		if (rps__now_ns() >= deadline)
			return psperf_run_fail(x->r, "reseed: no server of %d reported itself leader%s%s", x->n,
					   last[0] ? "; last error: " : "", last);
		psperf_sleep_ms(20);
	}
}

/* SET_REPLICAS k on the leader, as psctl set-replicas does: 0 once the
 * leader answered that it applied the entry. */
static int set_replicas(struct reseed *x, uint32_t k, uint64_t deadline)
{
	struct rps__admin a;
	struct rps__admin_rep rep;
	size_t len = 0;
	int32_t status = 0;
	int ret;

	memset(&a, 0, sizeof(a));
	a.op = RPS__ADMIN_SET_REPLICAS;
	a.id = k;
	a.timeout_ms = (uint32_t)x->r->o->timeout_ms;
	for (;;) {
		memset(&rep, 0, sizeof(rep));
		ret = rps__ctl_call(x->ctl[x->leader], RPS__MSG_ADMIN, &a, sizeof(a), &rep, sizeof(rep), &len, &status,
				    x->r->o->timeout_ms + 5000);
		if (ret)
			return psperf_run_fail(x->r, "reseed: set-replicas %u: %s", k, rps__errbuf());
		rep.msg[sizeof(rep.msg) - 1] = '\0';
		if (!status)
			return 0;
		if ((status != -EPERM && status != -EAGAIN) || rps__now_ns() >= deadline)
			return psperf_run_fail(x->r, "reseed: set-replicas %u refused: %s", k,
					   rep.msg[0] ? rep.msg : rps_strerror(status));
		/* leadership moved, or a fresh leader has not committed yet */
		if (status == -EPERM && find_leader(x, deadline))
			return -EIO;
		psperf_sleep_ms(10);
	}
}

/* Every partition has exactly k copies and none is being seeded. */
static bool map_at(const struct rps__smap *m, uint32_t k)
{
	uint32_t p;

	if (m->replicas != k || rps__smap_nunder(m))
		return false;
	for (p = 0; p < m->npart; p++)
		if (m->parts[p].joining || 1 + rps__smap_nbackups(m, p) != k)
			return false;
	return true;
}

/* Poll the leader's map until map_at(k). */
static int wait_map(struct reseed *x, uint32_t k, uint64_t deadline)
{
	struct rps__status_rep st;
	int ret;

	for (;;) {
		ret = status_of(x, x->leader, &st, true);
		if (ret)
			return psperf_run_fail(x->r, "reseed: STATUS of the leader: %s", rps__errbuf());
		if (map_at(&x->map, k))
			return 0;
		if (rps__now_ns() >= deadline)
			return psperf_run_fail(x->r, "reseed: %u of %u partitions still under-replicated after %d s (target %u)",
					   rps__smap_nunder(&x->map), x->map.npart, RESEED_WAIT_S, k);
		psperf_sleep_ms(RESEED_POLL_MS);
	}
}

/* ---- the data ------------------------------------------------------------------------------- */

/* Grow what the cluster holds to row->bytes of fp32 parameters: one more
 * tensor, created with non-zero values and pushed once. */
static int grow_to(struct reseed *x, struct row *row, size_t step)
{
	const struct opts *o = x->r->o;
	size_t add = row->bytes - x->held, count = add / 4, i;
	struct rps_tensor_opts to;
	float *init, *grad;
	char name[64];
	int ret;

	if (!count)
		return 0;
	init = psperf_xalloc_aligned(add);
	grad = psperf_xalloc_aligned(add);
	for (i = 0; i < count; i++)
		init[i] = (float)(i % 251 + 1);
	psperf_fill_gradient(grad, RPS_DTYPE_F32, count);
	rps_tensor_opts_init(&to);
	to.count = count;
	to.mode = RPS_MODE_ASYNC;
	to.optimizer = RPS_OPT_SUM;
	to.init = init;
	snprintf(name, sizeof(name), "%s.reseed.%zu", o->tag, step);
	ret = rps_tensor_create(x->cl, name, &to, &x->tens[step]);
	if (!ret)
		ret = rps_push(x->tens[step], grad, add);
	free(init);
	free(grad);
	if (ret)
		return psperf_run_fail(x->r, "reseed %zu bytes: %s %s: %s", row->bytes, x->tens[step] ? "rps_push to" :
				   "rps_tensor_create", name, rps_last_error()[0] ? rps_last_error() : rps_strerror(ret));
	x->held = row->bytes;
	return 0;
}

/* ---- the measurement ----------------------------------------------------------------------- */

static void progress(struct run *r, const struct row *row, int ph, long total, long done)
{
	psperf_progress_set(r, (long)(row - r->rows), ph, total);
	atomic_store_explicit(&r->prog_done, done, memory_order_relaxed);
	psperf_progress_print(r);
}

/* The primaries did not change since `owners` (no failover during the
 * raise: its time would not be a re-replication's). */
static int same_primaries(struct reseed *x, const struct row *row, const uint64_t *owners)
{
	uint32_t p;

	for (p = 0; p < x->map.npart; p++)
		if (x->map.parts[p].owner != owners[p])
			return psperf_run_fail(x->r, "reseed %zu bytes: partition %u changed primary during the raise "
					   "(member %llu, now %llu): a failover (a server loop stalled past "
					   "--failover-ms on a loaded machine?), not a re-replication", row->bytes, p,
					   (unsigned long long)owners[p], (unsigned long long)x->map.parts[p].owner);
	return 0;
}

/* One row: its cycles of raise (timed) and drop.  The pass's span is the
 * sum of the timed raises, so that its bandwidth is bytes seeded over the
 * time spent seeding, not over the drops in between. */
static int measure_row(struct reseed *x, struct row *row)
{
	uint32_t R = (uint32_t)x->r->o->replicas, p;
	uint64_t t0, t1, deadline, owners[RPS__SMAP_MAX_PART];
	long k;
	int ret;

	psperf_samples_reserve(&row->lat.s, (size_t)row->iters);
	row->lat.t0 = 0;
	row->lat.t1 = 0;
	for (k = 0; k < row->iters; k++) {
		progress(x->r, row, 5, row->iters, k);
		deadline = rps__now_ns() + (uint64_t)RESEED_WAIT_S * 1000000000ull;
		if ((ret = wait_map(x, 1, deadline)))
			return ret;
		for (p = 0; p < x->map.npart; p++)
			owners[p] = x->map.parts[p].owner;
		psperf_sleep_ms(RESEED_SETTLE_MS);
		if ((ret = set_replicas(x, R, deadline)))
			return ret;
		t0 = rps__now_ns();
		if ((ret = wait_map(x, R, deadline)))
			return ret;
		t1 = rps__now_ns();
		if ((ret = same_primaries(x, row, owners)))
			return ret;
		psperf_samples_add(&row->lat.s, t1 - t0);
		row->lat.t1 += t1 - t0;
		deadline = rps__now_ns() + (uint64_t)RESEED_WAIT_S * 1000000000ull;
		if ((ret = set_replicas(x, 1, deadline)) || (ret = wait_map(x, 1, deadline)))
			return ret;
	}
	row->reseed_parts = x->map.npart * (R - 1);
	return 0;
}

static int reseed_measure(struct reseed *x)
{
	struct run *r = x->r;
	struct rps_client_opts co;
	uint64_t deadline = rps__now_ns() + (uint64_t)r->o->timeout_ms * 1000000ull;
	size_t i, step = 0;
	int ret;

	if ((ret = find_leader(x, deadline)))
		return ret;
	/* a new cluster of 2 or more servers starts with a backup of every
	 * partition (no --replicas here: see server_cfg): the raises start
	 * from 1 copy */
	if ((ret = set_replicas(x, 1, deadline)) || (ret = wait_map(x, 1, deadline)))
		return ret;
	if (!map_at(&x->map, 1))
		return psperf_run_fail(r, "reseed: the new cluster's map has a replication target of %u, not 1",
				   x->map.replicas);
	rps_client_opts_init(&co);
	co.servers = r->reseed_servers;
	co.rank = 0;
	co.num_workers = 1;
	co.timeout_ms = r->o->timeout_ms;
	co.spin_us = r->o->spin_us;
	if ((ret = rps_client_connect(&co, &x->cl)))
		return psperf_run_fail(r, "reseed: rps_client_connect: %s", rps_last_error());
	x->tens = psperf_xcalloc(r->nrows, sizeof(*x->tens));
	for (i = 0; i < r->nrows; i++) {
		struct row *row = &r->rows[i];
		if (row->test != T_RESEED)
			continue;
		progress(r, row, 0, 0, 0);
		if ((ret = grow_to(x, row, step++)) || (ret = measure_row(x, row)))
			return ret;
		if (row->raw_bw || row->raw_x[1]) {
			struct baseline *b;
			progress(r, row, 4, 0, 0);
			b = psperf_baseline_new(r);
			psperf_baseline_row(r, b, row);
			psperf_baseline_free(b);
		}
	}
	return 0;
}

static void reseed_close(struct reseed *x)
{
	size_t i;

	for (i = 0; x->tens && i < x->r->nrows; i++)
		if (x->tens[i] && !x->r->failed)
			rps_tensor_close(x->tens[i]);
	if (x->cl)
		rps_client_close(x->cl);
	for (i = 0; x->ctl && i < (size_t)x->n; i++)
		rps__ctl_close(x->ctl[i]);
	free(x->tens);
	free(x->ctl);
	free(x->uris);
	free(x->buf);
}

/* Local mode: a cluster of --servers of its own, without a replication
 * target (the map's is 1 until this test sets it). */
int psperf_run_reseed_local(struct run *r)
{
	struct lcluster *c = psperf_xcalloc(1, sizeof(*c));
	struct reseed *x = psperf_xcalloc(1, sizeof(*x));
	int ret;

	plan_raws(r);
	x->r = r;
	c->no_target = true;
	ret = psperf_cluster_start(r, c, r->o->nservers, r->reseed_servers, sizeof(r->reseed_servers));
	if (ret) {
		psperf_run_fail(r, "reseed: the cluster of %d servers could not start (see above)", r->o->nservers);
	} else if (rps__uri_list_parse(r->reseed_servers, &x->uris, &x->n)) {
		ret = psperf_run_fail(r, "reseed: %s", rps__errbuf());
	} else {
		if (!r->servers[0])
			snprintf(r->servers, sizeof(r->servers), "%s", r->reseed_servers);
		x->ctl = psperf_xcalloc((size_t)x->n, sizeof(*x->ctl));
		x->buf = psperf_xalloc_aligned(RPS__BIG_MSG_MAX);
		ret = reseed_measure(x);
	}
	psperf_progress_clear(r);
	reseed_close(x);
	psperf_cluster_destroy(c);
	if (psperf_cluster_errors(c) && !ret)
		ret = psperf_run_fail(r, "reseed: a server stopped with an error (see above)");
	free(x);
	free(c);
	return ret;
}
