/*
 * util.c - psperf's small helpers: usage errors, a test's failure,
 * allocations that exit when memory runs out, sizes in words, and the
 * progress line on stderr.
 */
#include "config.h"
#include "psperf_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- small helpers -------------------------------------------------------- */

void psperf_die_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "psperf: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (psperf --help lists the options)\n");
	exit(2);
}

/* The main thread's tests (commit, reseed) stop at their first error:
 * keep that one (a later one is usually its consequence). */
int psperf_run_fail(struct run *r, const char *fmt, ...)
{
	va_list ap;

	if (!r->err[0]) {
		va_start(ap, fmt);
		vsnprintf(r->err, sizeof(r->err), fmt, ap);
		va_end(ap);
	}
	r->failed = true;
	return -EIO;
}

void *psperf_xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (!p) {
		fprintf(stderr, "psperf: out of memory (%zu x %zu bytes): lower --size / --sweep or --workers\n", n, size);
		exit(1);
	}
	return p;
}

void *psperf_xalloc_aligned(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, len ? len : 1)) {
		fprintf(stderr, "psperf: out of memory (%zu bytes): lower --size / --sweep or --workers\n", len);
		exit(1);
	}
	memset(p, 0, len);
	return p;
}

const char *psperf_human(size_t b, char *buf, size_t len)
{
	if (b >= (1u << 20) && b % (1u << 20) == 0)
		snprintf(buf, len, "%zu MiB", b >> 20);
	else if (b >= 1024 && b % 1024 == 0)
		snprintf(buf, len, "%zu KiB", b >> 10);
	else
		snprintf(buf, len, "%zu B", b);
	return buf;
}

void psperf_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* ---- progress ------------------------------------------------------------------- */

static bool progress_on(const struct opts *o)
{
	return !o->quiet && isatty(STDERR_FILENO);
}

void psperf_progress_set(struct run *r, long row, int phase, long total)
{
	atomic_store_explicit(&r->prog_row, row, memory_order_relaxed);
	atomic_store_explicit(&r->prog_phase, phase, memory_order_relaxed);
	atomic_store_explicit(&r->prog_total, total, memory_order_relaxed);
	atomic_store_explicit(&r->prog_done, 0, memory_order_relaxed);
}

void psperf_progress_print(struct run *r)
{
	static const char *const phases[] = { "setup", "warm-up", "latency", "bandwidth", "baseline", "raise" };
	long ri = atomic_load_explicit(&r->prog_row, memory_order_relaxed);
	int ph = atomic_load_explicit(&r->prog_phase, memory_order_relaxed);
	char h[32];
	const struct row *row;

	if (!progress_on(r->o) || ri < 0 || (size_t)ri >= r->nrows)
		return;
	row = &r->rows[ri];
	fprintf(stderr, "\r\033[Kpsperf: %s %s %s %ld/%ld (row %ld of %zu)", psperf_test_names[row->test],
		row->label[0] ? row->label : psperf_human(row->bytes, h, sizeof(h)), phases[ph % 6],
		atomic_load_explicit(&r->prog_done, memory_order_relaxed),
		atomic_load_explicit(&r->prog_total, memory_order_relaxed), ri + 1, r->nrows);
	fflush(stderr);
}

void psperf_progress_clear(const struct run *r)
{
	if (progress_on(r->o)) {
		fprintf(stderr, "\r\033[K");
		fflush(stderr);
	}
}
