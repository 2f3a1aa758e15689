/*
 * worker.c - a worker: one thread with its own rps_client that runs every
 * cluster row of the plan (tensors, one operation, the latency and window
 * passes, the lock loop), and the code that starts workers, waits for them
 * and merges their samples into the rows.
 */
#include "config.h"
#include "psperf_int.h"
#include "kernels/agg.h"
#include "client/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* The group test: N members of S bytes, as one group and as N tensors. */
struct group_set {
	rps_group_t *g;
	rps_tensor_t **apart;
	const void **grads;
	size_t *nbytes;
	int n;
};

struct worker {
	struct run *run;
	int rank;
	struct baseline *bl;	/* worker 0 with --baseline */
	pthread_t thread;
	rps_client_t *cl;
	rps_tensor_t **tens;	/* one per size index */
	rps_tensor_t *lockt;
	struct group_set *grp;	/* the group test's row pair, while it runs */
	void *grad;
	float *pull;
	rps_buffer_t *grad_buf, *pull_buf;	/* --registered */
	struct pass *lat, *bw;	/* per row */
	int status;
	char err[1024];
};

/* ---- worker: failures --------------------------------------------------------------- */

static int worker_fail(struct worker *w, const struct row *row, const char *what, int ret)
{
	char h[32];

	snprintf(w->err, sizeof(w->err), "%s%s%s, worker %d: %s: %s", row ? psperf_test_names[row->test] : "setup",
		 row ? " " : "", row ? (row->label[0] ? row->label : psperf_human(row->bytes, h, sizeof(h))) : "", w->rank, what,
		 rps_last_error()[0] ? rps_last_error() : rps_strerror(ret));
	w->status = ret ? ret : -EIO;
	return w->status;
}

/* ---- worker: tensors ------------------------------------------------------------------ */

static int tensor_for(struct worker *w, const struct row *row, rps_tensor_t **out)
{
	const struct opts *o = w->run->o;
	size_t i = psperf_size_index(w->run, row->bytes);
	struct rps_tensor_opts to;
	char name[64];
	int ret;

	if (w->tens[i]) {
		*out = w->tens[i];
		return 0;
	}
	rps_tensor_opts_init(&to);
	to.count = row->bytes / rps__dtype_size(o->dtype);
	to.dtype = o->dtype;
	to.mode = o->mode;
	to.staleness = o->staleness;
	to.optimizer = o->optimizer;
	snprintf(name, sizeof(name), "%s.%s.%s.%zu", o->tag, psperf_mode_name(o->mode), rps__dtype_name(o->dtype),
		 row->bytes);
	ret = rps_tensor_create(w->cl, name, &to, &w->tens[i]);
	if (ret)
		return worker_fail(w, row, "rps_tensor_create", ret);
	*out = w->tens[i];
	return 0;
}

static int lock_tensor(struct worker *w, const struct row *row)
{
	struct rps_tensor_opts to;
	char name[64];
	int ret;

	if (w->lockt)
		return 0;
	rps_tensor_opts_init(&to);
	to.count = 2;
	to.mode = RPS_MODE_ASYNC;
	snprintf(name, sizeof(name), "%s.lock", w->run->o->tag);
	ret = rps_tensor_create(w->cl, name, &to, &w->lockt);
	return ret ? worker_fail(w, row, "rps_tensor_create", ret) : 0;
}

/* ---- worker: one operation ---------------------------------------------------------------- */

static int op_blocking(struct worker *w, const struct row *row, rps_tensor_t *t)
{
	const struct opts *o = w->run->o;
	const struct group_set *gs = w->grp;
	int ret = 0;

	if (row->test == T_GROUP && !row->group_separate) {
		ret = rps_group_push(gs->g, gs->grads, gs->nbytes);
		return ret ? worker_fail(w, row, "rps_group_push", ret) : 0;
	}
	for (int k = 0; row->test == T_GROUP && k < gs->n; k++)
		if ((ret = rps_push(gs->apart[k], gs->grads[k], gs->nbytes[k])))
			return worker_fail(w, row, "rps_push", ret);

	if (row->test == T_PUSH || row->test == T_PUSHPULL) {
		ret = rps_push(t, w->grad, row->bytes);
		if (ret)
			return worker_fail(w, row, "rps_push", ret);
	}
	if (row->test == T_PULL || row->test == T_PUSHPULL) {
		ret = rps_pull(t, w->pull, psperf_pull_bytes(o, row), NULL);
		if (ret)
			return worker_fail(w, row, "rps_pull", ret);
	}
	return 0;
}

static int op_start(struct worker *w, const struct row *row, rps_tensor_t *t, rps_request_t **req)
{
	const struct opts *o = w->run->o;
	int ret;

	req[0] = req[1] = NULL;
	if (row->test == T_PUSH || row->test == T_PUSHPULL) {
		ret = rps_push_start(t, w->grad, row->bytes, &req[0]);
		if (ret)
			return worker_fail(w, row, "rps_push_start", ret);
	}
	if (row->test == T_PULL || row->test == T_PUSHPULL) {
		ret = rps_pull_start(t, w->pull, psperf_pull_bytes(o, row), NULL, &req[1]);
		if (ret) {
			worker_fail(w, row, "rps_pull_start", ret);
			if (req[0])
				rps_wait(req[0]);
			req[0] = NULL;
			return ret;
		}
	}
	return 0;
}

static int op_finish(struct worker *w, const struct row *row, rps_request_t **req)
{
	int i, ret, first = 0;

	for (i = 0; i < 2; i++) {
		if (!req[i])
			continue;
		ret = rps_wait(req[i]);
		req[i] = NULL;
		if (ret && !first)
			first = worker_fail(w, row, i ? "rps_wait (pull)" : "rps_wait (push)", ret);
	}
	return first;
}

/* ---- worker: passes ------------------------------------------------------------------------ */

/* User + system CPU time of the whole process (every worker, the clients'
 * progress threads; local mode: the servers too). */
static uint64_t process_cpu_ns(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru))
		return 0;
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

static int barrier(struct worker *w, const struct row *row)
{
	int ret = rps_barrier(w->cl);

	return ret ? worker_fail(w, row, "rps_barrier", ret) : 0;
}

static void tick(struct worker *w, long done)
{
	if (w->rank == 0)
		atomic_store_explicit(&w->run->prog_done, done, memory_order_relaxed);
}

static void phase(struct worker *w, long ri, int ph, long total)
{
	if (w->rank == 0)
		psperf_progress_set(w->run, ri, ph, total);
}

/* Worker 0 measures the row's raw operations while the others wait. */
static void row_baseline(struct worker *w, long ri)
{
	if (!w->bl)
		return;
	phase(w, ri, 4, 0);
	psperf_baseline_row(w->run, w->bl, &w->run->rows[ri]);
}

static int pass_blocking(struct worker *w, long ri, rps_tensor_t *t, long n, struct pass *out)
{
	const struct row *row = &w->run->rows[ri];
	uint64_t t0, t1, tx0 = rps__client_tx_bytes(w->cl), cpu0 = process_cpu_ns();
	long i;

	if (out) {
		psperf_samples_reserve(&out->s, (size_t)n);
		out->t0 = rps__now_ns();
	}
	for (i = 0; i < n; i++) {
		t0 = rps__now_ns();
		if (op_blocking(w, row, t))
			return w->status;
		t1 = rps__now_ns();
		if (out)
			psperf_samples_add(&out->s, t1 - t0);
		tick(w, i + 1);
	}
	if (out) {
		out->t1 = rps__now_ns();
		out->tx = rps__client_tx_bytes(w->cl) - tx0;
		out->cpu_ns = process_cpu_ns() - cpu0;
	}
	return 0;
}

/* n operations with up to --window in flight; each op's time runs from its
 * start to the return of its wait (oldest first). */
static int pass_window(struct worker *w, long ri, rps_tensor_t *t, long n, struct pass *out)
{
	const struct row *row = &w->run->rows[ri];
	int win = w->run->o->window;
	rps_request_t *(*req)[2] = psperf_xcalloc((size_t)win, sizeof(*req));
	uint64_t *ts = psperf_xcalloc((size_t)win, sizeof(*ts));
	long posted = 0, done = 0;
	uint64_t tx0 = rps__client_tx_bytes(w->cl), cpu0 = process_cpu_ns();
	int ret = 0;

	psperf_samples_reserve(&out->s, (size_t)n);
	out->t0 = rps__now_ns();
	while (done < n) {
		while (!ret && posted < n && posted - done < win) {
			ts[posted % win] = rps__now_ns();
			ret = op_start(w, row, t, req[posted % win]);
			if (!ret)
				posted++;
		}
		if (done == posted)
			break;
		if (op_finish(w, row, req[done % win]) && !ret)
			ret = w->status;
		psperf_samples_add(&out->s, rps__now_ns() - ts[done % win]);
		tick(w, ++done);
	}
	out->t1 = rps__now_ns();
	out->tx = rps__client_tx_bytes(w->cl) - tx0;
	out->cpu_ns = process_cpu_ns() - cpu0;
	free(req);
	free(ts);
	return ret;
}

static int run_data_row(struct worker *w, long ri)
{
	const struct row *row = &w->run->rows[ri];
	rps_tensor_t *t = NULL;

	phase(w, ri, 0, 0);
	if (tensor_for(w, row, &t) || barrier(w, row))
		return w->status;
	phase(w, ri, 1, row->warmup);
	if (pass_blocking(w, ri, t, row->warmup, NULL) || barrier(w, row))
		return w->status;
	phase(w, ri, 2, row->iters);
	if (pass_blocking(w, ri, t, row->iters, &w->lat[ri]) || barrier(w, row))
		return w->status;
	if (w->run->o->window > 1) {
		phase(w, ri, 3, row->iters);
		if (pass_window(w, ri, t, row->iters, &w->bw[ri]) || barrier(w, row))
			return w->status;
	}
	row_baseline(w, ri);
	return barrier(w, row);
}

/* Rows ri (acquire) and ri+1 (release) from one loop of lock+unlock pairs. */
static int lock_loop(struct worker *w, long ri, long n, bool record)
{
	const struct row *row = &w->run->rows[ri];
	struct pass *acq = &w->lat[ri], *rel = &w->lat[ri + 1];
	uint64_t t0, t1, t2;
	long i;
	int ret;

	if (record) {
		psperf_samples_reserve(&acq->s, (size_t)n);
		psperf_samples_reserve(&rel->s, (size_t)n);
		acq->t0 = rel->t0 = rps__now_ns();
	}
	for (i = 0; i < n; i++) {
		t0 = rps__now_ns();
		ret = rps__tensor_lock(w->lockt, 0);
		if (ret)
			return worker_fail(w, row, "rps__tensor_lock", ret);
		t1 = rps__now_ns();
		ret = rps__tensor_unlock(w->lockt, 0);
		if (ret)
			return worker_fail(w, row, "rps__tensor_unlock", ret);
		t2 = rps__now_ns();
		if (record) {
			psperf_samples_add(&acq->s, t1 - t0);
			psperf_samples_add(&rel->s, t2 - t1);
		}
		tick(w, i + 1);
	}
	if (record)
		acq->t1 = rel->t1 = rps__now_ns();
	return 0;
}

static int run_lock_rows(struct worker *w, long ri)
{
	const struct row *row = &w->run->rows[ri];
	bool mine = !row->lock_alone || w->rank == 0;

	phase(w, ri, 0, 0);
	if (lock_tensor(w, row) || barrier(w, row))
		return w->status;
	phase(w, ri, 1, row->warmup);
	if ((mine && lock_loop(w, ri, row->warmup, false)) || barrier(w, row))
		return w->status;
	phase(w, ri, 2, row->iters);
	if ((mine && lock_loop(w, ri, row->iters, true)) || barrier(w, row))
		return w->status;
	row_baseline(w, ri);
	row_baseline(w, ri + 1);
	return barrier(w, row);
}

/* Rows ri (the group) and ri+1 (the same tensors apart): N members of S
 * bytes each, pushed as one group, then one by one (op_blocking). */
static int run_group_rows(struct worker *w, long ri)
{
	const struct opts *o = w->run->o;
	const struct row *row = &w->run->rows[ri];
	int N = o->group_n, k, ret = 0;
	size_t S = row->bytes, esz = rps__dtype_size(o->dtype);
	uint64_t *counts = psperf_xcalloc((size_t)N, sizeof(*counts));
	size_t *nbytes = psperf_xcalloc((size_t)N, sizeof(*nbytes));
	const void **grads = psperf_xcalloc((size_t)N, sizeof(*grads));
	rps_tensor_t **apart = psperf_xcalloc((size_t)N, sizeof(*apart));
	char *buf = psperf_xalloc_aligned((size_t)N * S);
	struct rps_tensor_opts to;
	struct group_set gs = { .apart = apart, .grads = grads, .nbytes = nbytes, .n = N };
	rps_group_t *g = NULL;
	char name[64];

	psperf_fill_gradient(buf, o->dtype, (size_t)N * S / esz);
	rps_tensor_opts_init(&to);
	to.dtype = o->dtype;
	to.mode = o->mode;
	to.staleness = o->staleness;
	to.optimizer = o->optimizer;
	for (k = 0; k < N; k++) {
		counts[k] = S / esz;
		nbytes[k] = S;
		grads[k] = buf + (size_t)k * S;
	}
	phase(w, ri, 0, 0);
	snprintf(name, sizeof(name), "%s.g.%s.%zu", o->tag, psperf_mode_name(o->mode), S);
	ret = rps_group_create(w->cl, name, &to, (uint32_t)N, counts, &g);
	if (ret) {
		worker_fail(w, row, "rps_group_create", ret);
		goto out;
	}
	to.count = S / esz;
	for (k = 0; k < N; k++) {
		snprintf(name, sizeof(name), "%s.a.%s.%zu.%d", o->tag, psperf_mode_name(o->mode), S, k);
		if ((ret = rps_tensor_create(w->cl, name, &to, &apart[k]))) {
			worker_fail(w, row, "rps_tensor_create", ret);
			goto out;
		}
	}
	gs.g = g;
	w->grp = &gs;
	for (k = 0; k < 2 && !w->status; k++) {
		long r = ri + k;

		if (barrier(w, &w->run->rows[r]))
			break;
		phase(w, r, 1, w->run->rows[r].warmup);
		if (pass_blocking(w, r, NULL, w->run->rows[r].warmup, NULL) || barrier(w, &w->run->rows[r]))
			break;
		phase(w, r, 2, w->run->rows[r].iters);
		if (pass_blocking(w, r, NULL, w->run->rows[r].iters, &w->lat[r]))
			break;
	}
	w->grp = NULL;
	if (!w->status)
		barrier(w, row);
out:
	for (k = 0; k < N && !w->status; k++)
		if (apart[k])
			rps_tensor_close(apart[k]);
	if (g && !w->status)
		rps_group_close(g);
	free(counts);
	free(nbytes);
	free(grads);
	free(apart);
	free(buf);
	return w->status;
}

/* ---- worker: the thread ------------------------------------------------------------------- */

void psperf_fill_gradient(void *dst, enum rps_dtype dt, size_t count)
{
	float tmp[1024];
	size_t i, k, n, esz = rps__dtype_size(dt);

	for (i = 0; i < 1024; i++)
		tmp[i] = 1e-3f * (float)((int)(i % 7) - 3);
	for (k = 0; k < count; k += n) {
		n = RPS__MIN(count - k, (size_t)1024);
		rps__f32_to_dtype((char *)dst + k * esz, tmp, dt, n);
	}
}

static int worker_setup(struct worker *w)
{
	const struct opts *o = w->run->o;
	size_t max = w->run->sizes[w->run->nsizes - 1];
	size_t count = max / rps__dtype_size(o->dtype);
	struct rps_client_opts co;
	int ret;

	w->tens = psperf_xcalloc(w->run->nsizes, sizeof(*w->tens));
	w->lat = psperf_xcalloc(w->run->nrows, sizeof(*w->lat));
	w->bw = psperf_xcalloc(w->run->nrows, sizeof(*w->bw));
	w->grad = psperf_xalloc_aligned(max);
	w->pull = psperf_xalloc_aligned(count * 4);
	psperf_fill_gradient(w->grad, o->dtype, count);
	rps_client_opts_init(&co);
	co.servers = w->run->servers;
	co.rank = w->rank;
	co.num_workers = w->run->W;
	co.timeout_ms = o->timeout_ms;
	co.spin_us = o->spin_us;	/* perftest busy-polls too: compare like with like */
	ret = rps_client_connect(&co, &w->cl);
	if (ret)
		return worker_fail(w, NULL, "rps_client_connect", ret);
	if (o->zcopy < 0)
		rps__client_set_copy(w->cl, 1);
	if (o->zcopy > 0) {
		ret = rps_buffer_register(w->cl, w->grad, max, &w->grad_buf);
		if (!ret)
			ret = rps_buffer_register(w->cl, w->pull, count * 4, &w->pull_buf);
		if (ret)
			return worker_fail(w, NULL, "rps_buffer_register", ret);
	}
	if (w->rank == 0)
		snprintf(w->run->device, sizeof(w->run->device), "%s", rps__client_fabric_name(w->cl));
	if (w->rank == 0 && o->baseline)
		w->bl = psperf_baseline_new(w->run);
	return barrier(w, NULL);
}

/* After a failure a timed-out operation may still be in flight, and
 * rps_tensor_close() waits for it without a bound: then the handles are
 * left to rps_client_close(), which fails what is in flight. */
static void worker_teardown(struct worker *w)
{
	size_t i;

	for (i = 0; !w->status && w->tens && i < w->run->nsizes; i++)
		if (w->tens[i])
			rps_tensor_close(w->tens[i]);
	if (w->lockt && !w->status)
		rps_tensor_close(w->lockt);
	if (!w->status) {	/* (else rps_client_close releases them) */
		rps_buffer_deregister(w->grad_buf);
		rps_buffer_deregister(w->pull_buf);
	}
	w->grad_buf = w->pull_buf = NULL;
	if (w->cl)
		rps_client_close(w->cl);
	w->cl = NULL;
	psperf_baseline_free(w->bl);
	w->bl = NULL;
	free(w->tens);
	free(w->grad);
	free(w->pull);
	w->tens = NULL;
	w->grad = w->pull = NULL;
}

/* Tell the main thread at once, so it can stop the servers before this
 * worker's teardown. */
static void worker_flag_failure(struct worker *w)
{
	struct run *r = w->run;

	pthread_mutex_lock(&r->mu);
	if (!r->failed) {
		r->failed = true;
		snprintf(r->err, sizeof(r->err), "%s", w->err);
	}
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static void worker_done(struct worker *w)
{
	struct run *r = w->run;

	pthread_mutex_lock(&r->mu);
	r->nfinished++;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct run *r = w->run;
	size_t ri;

	if (!worker_setup(w)) {
		for (ri = 0; ri < r->nrows && !w->status; ri++) {
			const struct row *row = &r->rows[ri];
			if (psperf_in_process(row->test) || row->test == T_COMMIT)
				continue;
			if (row->test == T_LOCK) {
				run_lock_rows(w, (long)ri);
				ri++;	/* the release row is filled by the same loop */
				continue;
			}
			if (row->test == T_GROUP) {
				run_group_rows(w, (long)ri);
				ri++;	/* and the row of the same tensors apart */
				continue;
			}
			run_data_row(w, (long)ri);
		}
	}
	if (w->status)
		worker_flag_failure(w);
	worker_teardown(w);
	worker_done(w);
	return NULL;
}

static void workers_merge(struct run *r, struct worker *ws, int n)
{
	size_t ri;
	int i;

	for (ri = 0; ri < r->nrows; ri++) {
		struct row *row = &r->rows[ri];
		if (psperf_in_process(row->test) || row->test == T_COMMIT)
			continue;
		for (i = 0; i < n; i++) {
			psperf_pass_merge(&row->lat, &ws[i].lat[ri]);
			psperf_pass_merge(&row->bw, &ws[i].bw[ri]);
		}
	}
	for (i = 0; i < n; i++) {
		for (ri = 0; ri < r->nrows; ri++) {
			psperf_samples_free(&ws[i].lat[ri].s);
			psperf_samples_free(&ws[i].bw[ri].s);
		}
		free(ws[i].lat);
		free(ws[i].bw);
	}
}

/* Wait for n workers, printing progress; on the first failure call
 * on_fail (local mode: stop the servers, so the others fail fast). */
static void workers_wait(struct run *r, int n, void (*on_fail)(void *), void *arg)
{
	bool stopped = false;

	pthread_mutex_lock(&r->mu);
	while (r->nfinished < n) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 200000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		if (r->failed && !stopped && on_fail) {
			stopped = true;
			pthread_mutex_unlock(&r->mu);
			on_fail(arg);
			pthread_mutex_lock(&r->mu);
		}
		pthread_mutex_unlock(&r->mu);
		psperf_progress_print(r);
		pthread_mutex_lock(&r->mu);
	}
	pthread_mutex_unlock(&r->mu);
	psperf_progress_clear(r);
}

/* Start workers, wait, merge.  n workers with ranks first..first+n-1. */
int psperf_run_workers(struct run *r, int first, int n, void (*on_fail)(void *), void *arg)
{
	struct worker *ws = psperf_xcalloc((size_t)n, sizeof(*ws));
	int i, started = 0, ret;

	for (i = 0; i < n; i++) {
		ws[i].run = r;
		ws[i].rank = first + i;
		ret = pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]);
		if (ret) {
			fprintf(stderr, "psperf: pthread_create: %s\n", strerror(ret));
			break;
		}
		started++;
	}
	if (started < n) {
		pthread_mutex_lock(&r->mu);
		r->nfinished += n - started;
		r->failed = true;
		snprintf(r->err, sizeof(r->err), "could not start worker thread %d", started);
		pthread_mutex_unlock(&r->mu);
		if (on_fail)
			on_fail(arg);
	}
	workers_wait(r, n, on_fail, arg);
	for (i = 0; i < started; i++)
		pthread_join(ws[i].thread, NULL);
	workers_merge(r, ws, started);
	free(ws);
	return r->failed ? -EIO : 0;
}
