/*
 * kernels.c - the tests measured in-process, without a cluster: agg (the
 * server's aggregation, rps__agg_add) and the checkpoint kernels crc
 * (ISA-L CRC-32C) and igzip (ISA-L level-1 raw deflate), each against
 * memcpy of the same bytes.
 */
#include "config.h"
#include "psperf_int.h"
#include "kernels/agg.h"
#include "common/crc.h"

#include <isa-l/igzip_lib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- agg: the server's aggregation in-process ------------------------------------------------- */

static void agg_pass(struct pass *p, float *acc, void **grads, int W, enum rps_dtype dt, size_t n, long iters)
{
	long i;
	int k;

	psperf_samples_reserve(&p->s, (size_t)iters);
	p->t0 = rps__now_ns();
	for (i = 0; i < iters; i++) {
		uint64_t t0 = rps__now_ns();
		for (k = 0; k < W; k++)
			rps__agg_add(acc, grads[k], dt, n);
		psperf_samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
}

static void memcpy_pass(struct pass *p, char *dst, void **grads, int W, size_t bytes, long iters)
{
	volatile char sink;
	long i;
	int k;

	psperf_samples_reserve(&p->s, (size_t)iters);
	p->t0 = rps__now_ns();
	for (i = 0; i < iters; i++) {
		uint64_t t0 = rps__now_ns();
		for (k = 0; k < W; k++) {
			memcpy(dst, grads[k], bytes);
			__asm__ __volatile__("" : : "r"(dst) : "memory");
		}
		psperf_samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
	sink = dst[bytes - 1];
	(void)sink;
}

static void run_agg_row(struct run *r, struct row *row)
{
	enum rps_dtype dt = r->o->dtype;
	size_t n = row->bytes / rps__dtype_size(dt);
	float *acc = psperf_xalloc_aligned(n * 4);
	void **grads = psperf_xcalloc((size_t)r->W, sizeof(*grads));
	char *dst = psperf_xalloc_aligned(row->bytes);
	struct pass warm = { { NULL, 0, 0 }, 0, 0, 0, 0 };
	struct raw_result *raw;
	int k;

	for (k = 0; k < r->W; k++) {
		grads[k] = psperf_xalloc_aligned(row->bytes);
		psperf_fill_gradient(grads[k], dt, n);
	}
	agg_pass(&warm, acc, grads, r->W, dt, n, row->warmup);
	agg_pass(&row->lat, acc, grads, r->W, dt, n, row->iters);
	raw = psperf_raw_add(r, RAW_MEMCPY, row->bytes, (size_t)r->W, row->iters, row->iters);
	if (!raw->st.valid) {
		struct pass mp = { { NULL, 0, 0 }, 0, 0, 0, 0 };
		memcpy_pass(&mp, dst, grads, r->W, row->bytes, row->warmup);
		psperf_samples_free(&mp.s);
		memset(&mp, 0, sizeof(mp));
		memcpy_pass(&mp, dst, grads, r->W, row->bytes, row->iters);
		psperf_stats_compute(&raw->st, &mp, (double)row->bytes * r->W);
		psperf_samples_free(&mp.s);
	}
	row->raw_lat = row->raw_bw = raw;
	psperf_samples_free(&warm.s);
	for (k = 0; k < r->W; k++)
		free(grads[k]);
	free(grads);
	free(acc);
	free(dst);
}

/* ---- crc, igzip: the checkpoint kernels in-process ---------------------------------------------- */

/* fp32 parameter-like data: small normal-ish floats (Irwin-Hall of 4
 * uniforms, sd about 0.02), what a trained layer's weights look like. */
static void fill_params(float *dst, size_t n)
{
	uint64_t x = 0x2545f4914f6cdd1dull;
	size_t i;

	for (i = 0; i < n; i++) {
		double u = 0;
		int k;

		for (k = 0; k < 4; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			u += (double)(x >> 11) / 9007199254740992.0;
		}
		dst[i] = (float)((u - 2.0) * 0.0346);
	}
}

/* rps__crc32c, the convention checkpoint and log files checksum their
 * records with (crc.h): the product's call, not the bare ISA-L kernel, so
 * the figure is what a checkpoint pays per byte (the same crc32_iscsi run,
 * plus two inversions). */
static void crc_pass(struct pass *p, const void *buf, size_t bytes, long iters)
{
	volatile uint32_t sink;
	uint32_t c = 0;
	long i;

	psperf_samples_reserve(&p->s, (size_t)iters);
	p->t0 = rps__now_ns();
	for (i = 0; i < iters; i++) {
		uint64_t t0 = rps__now_ns();
		c ^= rps__crc32c(0, buf, bytes);
		psperf_samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
	sink = c;
	(void)sink;
}

/* Returns the deflated size of the last iteration (0: did not fit). */
static size_t igzip_pass(struct pass *p, const void *buf, size_t bytes, uint8_t *out, size_t out_len,
			 uint8_t *level_buf, long iters)
{
	size_t last = 0;
	long i;

	psperf_samples_reserve(&p->s, (size_t)iters);
	p->t0 = rps__now_ns();
	for (i = 0; i < iters; i++) {
		struct isal_zstream zs;
		uint64_t t0 = rps__now_ns();

		memset(&zs, 0, sizeof(zs));
		isal_deflate_stateless_init(&zs);
		zs.level = 1;
		zs.level_buf = level_buf;
		zs.level_buf_size = ISAL_DEF_LVL1_DEFAULT;
		zs.gzip_flag = IGZIP_DEFLATE;
		zs.end_of_stream = 1;
		zs.next_in = (uint8_t *)buf;
		zs.avail_in = (uint32_t)bytes;
		zs.next_out = out;
		zs.avail_out = (uint32_t)out_len;
		last = isal_deflate_stateless(&zs) == COMP_OK ? zs.total_out : 0;
		psperf_samples_add(&p->s, rps__now_ns() - t0);
	}
	p->t1 = rps__now_ns();
	return last;
}

static void run_kernel_row(struct run *r, struct row *row)
{
	size_t bytes = row->bytes, out_len = bytes + bytes / 8 + 4096;
	float *src = psperf_xalloc_aligned(bytes);
	char *dst = psperf_xalloc_aligned(bytes);
	uint8_t *out = NULL, *level_buf = NULL;
	struct pass warm = { { NULL, 0, 0 }, 0, 0, 0, 0 };
	struct raw_result *raw;

	if (row->zeros)
		memset(src, 0, bytes);
	else
		fill_params(src, bytes / 4);
	if (row->test == T_CRC) {
		crc_pass(&warm, src, bytes, row->warmup);
		crc_pass(&row->lat, src, bytes, row->iters);
	} else {
		size_t got;

		out = psperf_xalloc_aligned(out_len);
		level_buf = psperf_xalloc_aligned(ISAL_DEF_LVL1_DEFAULT);
		igzip_pass(&warm, src, bytes, out, out_len, level_buf, row->warmup);
		got = igzip_pass(&row->lat, src, bytes, out, out_len, level_buf, row->iters);
		row->ratio = got ? (double)bytes / (double)got : NAN;
	}
	raw = psperf_raw_add(r, RAW_MEMCPY, bytes, 1, row->iters, row->iters);
	if (!raw->st.valid) {
		void *one[1] = { src };
		struct pass mp = { { NULL, 0, 0 }, 0, 0, 0, 0 };

		memcpy_pass(&mp, dst, one, 1, bytes, row->warmup);
		psperf_samples_free(&mp.s);
		memset(&mp, 0, sizeof(mp));
		memcpy_pass(&mp, dst, one, 1, bytes, row->iters);
		psperf_stats_compute(&raw->st, &mp, (double)bytes);
		psperf_samples_free(&mp.s);
	}
	row->raw_lat = row->raw_bw = raw;
	psperf_samples_free(&warm.s);
	free(level_buf);
	free(out);
	free(dst);
	free(src);
}

/* Every in-process row: agg, crc, igzip. */
void psperf_run_agg_rows(struct run *r)
{
	size_t i;

	for (i = 0; i < r->nrows; i++) {
		if (!psperf_in_process(r->rows[i].test))
			continue;
		psperf_progress_set(r, (long)i, 2, r->rows[i].iters);
		psperf_progress_print(r);
		if (r->rows[i].test == T_AGG)
			run_agg_row(r, &r->rows[i]);
		else
			run_kernel_row(r, &r->rows[i]);
	}
	psperf_progress_clear(r);
}
