/*
 * plan.c - the plan: the sizes of the sweep and one row per test and size
 * (lock and commit rows have labels instead), with its iterations and
 * warm-up; every pass and figure of the run is kept in its row.
 */
#include "config.h"
#include "psperf_int.h"
#include "kernels/agg.h"

#include <stdio.h>
#include <string.h>

#define AUTO_BYTES (256ull << 20)	/* default iterations: about this many bytes a pass */
#define AUTO_ITERS_MAX 1000L
#define AUTO_ITERS_MIN 20L

/* ---- the plan: rows of every test -------------------------------------------------- */

static long row_iters(const struct opts *o, size_t bytes)
{
	long n;

	if (o->iters > 0)
		return o->iters;
	n = (long)(AUTO_BYTES / (bytes ? bytes : 1));
	return n < AUTO_ITERS_MIN ? AUTO_ITERS_MIN : n > AUTO_ITERS_MAX ? AUTO_ITERS_MAX : n;
}

long psperf_row_warmup(const struct opts *o, long iters)
{
	long n = iters / 10;

	if (o->warmup >= 0)
		return o->warmup;
	return n < 2 ? 2 : n > 100 ? 100 : n;
}

static void plan_sizes(struct run *r)
{
	const struct opts *o = r->o;
	size_t s;

	r->sizes = psperf_xcalloc(64, sizeof(*r->sizes));
	for (s = o->size_min; s <= o->size_max && r->nsizes < 64; s *= o->factor) {
		r->sizes[r->nsizes++] = s;
		if (s > SIZE_MAX / o->factor)
			break;
	}
}

static struct row *plan_add(struct run *r, enum test_id t, size_t bytes)
{
	struct row *row = &r->rows[r->nrows++];

	memset(row, 0, sizeof(*row));
	row->test = t;
	row->bytes = bytes;
	row->workers = r->W;
	row->iters = row_iters(r->o, bytes);
	row->warmup = psperf_row_warmup(r->o, row->iters);
	return row;
}

static double moved_bytes(const struct opts *o, enum test_id t, size_t bytes)
{
	double pull = (double)(bytes / rps__dtype_size(o->dtype)) * 4.0;

	switch (t) {
	case T_PUSH: return (double)bytes;
	case T_PULL: return pull;
	case T_PUSHPULL: return (double)bytes + pull;
	default: return 0;
	}
}

static void plan_lock(struct run *r)
{
	int v, alone;

	for (v = 0; v < 4; v++) {
		struct row *row;
		alone = v < 2;
		if (!alone && r->W < 2)
			break;
		row = plan_add(r, T_LOCK, 8);
		row->lock_alone = alone;
		row->lock_release = v % 2;
		row->workers = alone ? 1 : r->W;
		row->moved = 8;
		snprintf(row->label, sizeof(row->label), "%s x%d", row->lock_release ? "release" : "acquire",
			 row->workers);
	}
}

/* group: per size, the group push and the same tensors pushed one by one;
 * both move N members of S bytes an operation. */
static void plan_group(struct run *r)
{
	size_t i;
	int k;

	for (i = 0; i < r->nsizes; i++)
		for (k = 0; k < 2; k++) {
			struct row *row = plan_add(r, T_GROUP, r->sizes[i]);
			row->group_separate = k == 1;
			row->moved = (double)r->sizes[i] * r->o->group_n;
			if (r->o->iters <= 0) {	/* automatic: an op is N pushes */
				row->iters = RPS__MAX(row->iters / r->o->group_n, 20);
				row->warmup = psperf_row_warmup(r->o, row->iters);
			}
			snprintf(row->label, sizeof(row->label), k ? "%dx%zu apart" : "%dx%zu group", r->o->group_n,
				 r->sizes[i]);
		}
}

/* commit: the entry's latency, then the admin round trip it compares with;
 * the labels get the fsync policy once the leader has told it. */
static void plan_commit(struct run *r)
{
	struct row *row;
	int k;

	for (k = 0; k < 2; k++) {
		row = plan_add(r, T_COMMIT, 0);
		row->workers = 1;
		row->commit_rtt = k == 1;
		snprintf(row->label, sizeof(row->label), "%s", k ? "admin round trip" : "commit");
	}
}

/* connect: an admin channel and a worker's client, each to a server with
 * a key (the handshake) and to one without; -n connects each (default 200). */
static void plan_connect(struct run *r)
{
	int k;

	for (k = 0; k < 4; k++) {
		struct row *row = plan_add(r, T_CONNECT, 0);
		row->workers = 1;
		row->connect_worker = k >= 2;
		row->connect_nokey = k % 2 == 1;
		row->iters = r->o->iters > 0 ? r->o->iters : 200;
		row->warmup = RPS__MAX(row->iters / 20, 2L);
		snprintf(row->label, sizeof(row->label), "%s, %s", row->connect_worker ? "worker" : "admin",
			 row->connect_nokey ? "no key" : "key");
	}
	if (r->o->nservers_set && r->o->nservers > 1) {	/* the worker's dials, side by side */
		struct row *row = plan_add(r, T_CONNECT, 0);
		row->workers = 1;
		row->connect_worker = true;
		row->connect_servers = r->o->nservers;
		row->iters = r->o->iters > 0 ? r->o->iters : 200;
		row->warmup = RPS__MAX(row->iters / 20, 2L);
		snprintf(row->label, sizeof(row->label), "worker, key, %d servers", row->connect_servers);
	}
}

/* reseed: one row per size; -n raises per size (default 1: each one
 * seeds every partition again, seconds of work); what one raise moves is
 * the parameter bytes times the R-1 copies it makes. */
static void plan_reseed(struct run *r)
{
	size_t i;

	for (i = 0; i < r->nsizes; i++) {
		struct row *row = plan_add(r, T_RESEED, r->sizes[i]);
		row->workers = 1;
		row->iters = r->o->iters > 0 ? r->o->iters : 1;
		row->warmup = 0;
		row->moved = (double)r->sizes[i] * (double)(r->o->replicas - 1);
	}
}

void psperf_plan_rows(struct run *r)
{
	const struct opts *o = r->o;
	int t;
	size_t i;

	plan_sizes(r);
	r->rows = psperf_xcalloc(T_NTESTS * (2 * r->nsizes + 4), sizeof(*r->rows));
	for (t = 0; t < T_NTESTS; t++) {
		if (!(o->tests & (1u << t)))
			continue;
		if (t == T_LOCK) {
			plan_lock(r);
			continue;
		}
		if (t == T_COMMIT) {
			plan_commit(r);
			continue;
		}
		if (t == T_RESEED) {
			plan_reseed(r);
			continue;
		}
		if (t == T_CONNECT) {
			plan_connect(r);
			continue;
		}
		if (t == T_GROUP) {
			plan_group(r);
			continue;
		}
		for (i = 0; i < r->nsizes; i++) {
			struct row *row = plan_add(r, (enum test_id)t, r->sizes[i]);
			row->moved = t == T_AGG ? (double)r->sizes[i] * r->W : moved_bytes(o, (enum test_id)t, r->sizes[i]);
			if (t == T_CRC || t == T_IGZIP) {
				row->workers = 1;
				row->moved = (double)r->sizes[i];
			}
			if (t == T_IGZIP) {
				snprintf(row->label, sizeof(row->label), "%zu fp32", r->sizes[i]);
				row = plan_add(r, T_IGZIP, r->sizes[i]);
				row->workers = 1;
				row->moved = (double)r->sizes[i];
				row->zeros = true;
				snprintf(row->label, sizeof(row->label), "%zu zeros", r->sizes[i]);
			}
		}
	}
}

size_t psperf_size_index(const struct run *r, size_t bytes)
{
	size_t i;

	for (i = 0; i < r->nsizes; i++)
		if (r->sizes[i] == bytes)
			return i;
	return 0;
}

size_t psperf_pull_bytes(const struct opts *o, const struct row *row)
{
	return row->bytes / rps__dtype_size(o->dtype) * 4;
}

/* Rows that workers of a data cluster measure (not agg, commit, reseed). */
bool psperf_plan_has_cluster_rows(const struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (!psperf_in_process(r->rows[i].test) && r->rows[i].test != T_COMMIT && r->rows[i].test != T_RESEED &&
		    r->rows[i].test != T_CONNECT)
			return true;
	return false;
}

struct row *psperf_plan_commit_row(struct run *r, bool rtt)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (r->rows[i].test == T_COMMIT && r->rows[i].commit_rtt == rtt)
			return &r->rows[i];
	return NULL;
}

struct row *psperf_plan_connect_row(struct run *r, bool nokey, bool worker)
{
	size_t i;

	for (i = 0; i < r->nrows; i++)
		if (r->rows[i].test == T_CONNECT && r->rows[i].connect_nokey == nokey &&
		    r->rows[i].connect_worker == worker && !r->rows[i].connect_servers)
			return &r->rows[i];
	return NULL;
}

struct row *psperf_plan_connect_many_row(struct run *r)
{
	for (size_t i = 0; i < r->nrows; i++)
		if (r->rows[i].test == T_CONNECT && r->rows[i].connect_servers)
			return &r->rows[i];
	return NULL;
}
