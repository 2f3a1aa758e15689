/*
 * stats.c - samples and the statistics psperf prints: per-op times merged
 * over workers, sorted into min / median / mean / p99 / p99.9, bandwidth
 * and ops/s over the pass's wall time, and the ratios to the baselines.
 */
#include "config.h"
#include "psperf_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- samples and statistics ------------------------------------------------ */

void psperf_samples_reserve(struct samples *s, size_t n)
{
	if (n <= s->cap)
		return;
	s->v = realloc(s->v, n * sizeof(*s->v));
	if (!s->v) {
		fprintf(stderr, "psperf: out of memory for %zu samples: lower --iters\n", n);
		exit(1);
	}
	s->cap = n;
}

void psperf_samples_add(struct samples *s, uint64_t ns)
{
	if (s->n == s->cap)
		psperf_samples_reserve(s, s->cap ? s->cap * 2 : 1024);
	s->v[s->n++] = ns;
}

void psperf_samples_free(struct samples *s)
{
	free(s->v);
	memset(s, 0, sizeof(*s));
}

void psperf_pass_merge(struct pass *dst, const struct pass *src)
{
	size_t i;

	dst->tx += src->tx;
	/* the workers of one process measure the same process CPU over
	 * nearly the same span: the largest is the pass's */
	if (src->cpu_ns > dst->cpu_ns)
		dst->cpu_ns = src->cpu_ns;
	if (!src->s.n)
		return;
	psperf_samples_reserve(&dst->s, dst->s.n + src->s.n);
	for (i = 0; i < src->s.n; i++)
		dst->s.v[dst->s.n++] = src->s.v[i];
	if (!dst->t0 || src->t0 < dst->t0)
		dst->t0 = src->t0;
	if (src->t1 > dst->t1)
		dst->t1 = src->t1;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Value at quantile q of a sorted array: the smallest sample with at least
 * q of the samples at or below it. */
static double quantile_us(const uint64_t *v, size_t n, double q)
{
	size_t i = (size_t)ceil(q * (double)n);

	if (i < 1)
		i = 1;
	if (i > n)
		i = n;
	return (double)v[i - 1] / 1e3;
}

/* Sort the pass's samples and fill st; bytes_per_op gives the bandwidth. */
void psperf_stats_compute(struct stats *st, struct pass *p, double bytes_per_op)
{
	double sum = 0, wall;
	size_t i, n = p->s.n;

	memset(st, 0, sizeof(*st));
	if (!n)
		return;
	qsort(p->s.v, n, sizeof(*p->s.v), cmp_u64);
	for (i = 0; i < n; i++)
		sum += (double)p->s.v[i];
	st->valid = true;
	st->n = n;
	st->min = (double)p->s.v[0] / 1e3;
	st->typ = (double)p->s.v[(n - 1) / 2] / 1e3;
	st->avg = sum / (double)n / 1e3;
	st->p99 = quantile_us(p->s.v, n, 0.99);
	st->p999 = quantile_us(p->s.v, n, 0.999);
	wall = (double)(p->t1 - p->t0) / 1e9;
	if (wall > 0) {
		st->ops = (double)n / wall;
		st->gbs = bytes_per_op * (double)n / wall / 1e9;
	}
}

/* ---- figures and ratios ------------------------------------------------------------------------ */

static double ratio(double ours, double raw)
{
	return raw > 0 && ours > 0 ? ours / raw : NAN;
}

void psperf_compute_figures(struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++) {
		struct row *row = &r->rows[i];
		psperf_stats_compute(&row->s_lat, &row->lat, row->moved);
		psperf_stats_compute(&row->s_bw, &row->bw, row->moved);
		if (!row->s_bw.valid)
			row->s_bw = row->s_lat;
		row->x_lat = row->raw_lat && row->raw_lat->st.valid ? ratio(row->s_lat.typ, row->raw_lat->st.typ) : NAN;
		row->x_bw = row->raw_bw && row->raw_bw->st.valid ? ratio(row->s_bw.gbs, row->raw_bw->st.gbs) : NAN;
		row->x_ref = row->raw_ref && row->raw_ref->st.valid ? ratio(row->s_lat.typ, row->raw_ref->st.typ) : NAN;
		if (psperf_in_process(row->test) && row->raw_lat)
			row->x_lat = ratio(row->s_lat.typ, row->raw_lat->st.typ);
		row->x_rtt = NAN;
		row->x_group = NAN;
		/* the group row and the row of its tensors apart move the same
		 * bytes an op: the ratio of their rates is that of tensors/s */
		if (row->test == T_GROUP && !row->group_separate && i + 1 < r->nrows && r->rows[i + 1].group_separate)
			row->x_group = -1;	/* (filled below, once the next row's figures are in) */
		row->tx_per_byte = NAN;
		row->cpu_s_per_gb = NAN;
		if (row->test == T_PUSH || row->test == T_PULL || row->test == T_PUSHPULL) {
			const struct pass *p = row->bw.s.n ? &row->bw : &row->lat;
			if (p->s.n && row->moved > 0 && p->cpu_ns)
				row->cpu_s_per_gb = ((double)p->cpu_ns / 1e9) / (row->moved * (double)p->s.n / 1e9);
		}
		if (row->test == T_PUSH || row->test == T_PUSHPULL) {
			/* the bandwidth pass if there was one: windows and contention */
			const struct pass *p = row->bw.s.n ? &row->bw : &row->lat;
			if (p->s.n && row->bytes)
				row->tx_per_byte = (double)p->tx / ((double)row->bytes * (double)p->s.n);
		}
	}
	for (i = 0; i + 1 < r->nrows; i++)
		if (r->rows[i].x_group == -1)
			r->rows[i].x_group = r->rows[i].s_lat.valid && r->rows[i + 1].s_lat.valid
				? ratio(r->rows[i].s_lat.gbs, r->rows[i + 1].s_lat.gbs) : NAN;
	for (i = 0; i < r->nrows; i++) {
		struct row *row = &r->rows[i], *nk;
		row->x_key = NAN;
		if (row->test == T_CONNECT && !row->connect_nokey && !row->connect_servers &&
		    (nk = psperf_plan_connect_row(r, true, row->connect_worker)) && row->s_lat.valid && nk->s_lat.valid)
			row->x_key = ratio(row->s_lat.typ, nk->s_lat.typ);
		row->x_many = NAN;
		if (row->test == T_CONNECT && row->connect_servers && (nk = psperf_plan_connect_row(r, false, true)) &&
		    row->s_lat.valid && nk->s_lat.valid)
			row->x_many = ratio(row->s_lat.typ, nk->s_lat.typ);
	}
	{
		struct row *cr = psperf_plan_commit_row(r, false), *rr = psperf_plan_commit_row(r, true);
		if (cr && rr && cr->s_lat.valid && rr->s_lat.valid)
			cr->x_rtt = ratio(cr->s_lat.typ, rr->s_lat.typ);
	}
}
