/*
 * test_agg.c - unit tests of gradient aggregation (src/kernels/agg.c).
 *
 * Conversions are checked against definitions written here independently
 * (ldexp for the values, a nearest-value search over every representable
 * bf16 / fp16 for the rounding), over every 16-bit pattern.  Aggregation is
 * checked, on every code path the CPU offers, bit for bit against a plain
 * loop, at unaligned source offsets and all small sizes: the sync mode's
 * promise of results bit-identical to a single-process reference rests on it.
 */
#include "config.h"
#include "kernels/agg.h"
#include "common/common.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#endif

/* ---- helpers ------------------------------------------------------------ */

static uint32_t bits_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float float_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "test_rng.h"
#include "lib/cutest.h"

/* Independent definitions of the 16-bit formats' values. */
static double ref_bf16_value(uint16_t h)
{
	int sign = h >> 15, exp = (h >> 7) & 0xff, mant = h & 0x7f;
	double v;

	if (exp == 0xff)
		v = mant ? NAN : INFINITY;
	else if (exp == 0)
		v = ldexp(mant, -126 - 7);
	else
		v = ldexp(128 + mant, exp - 127 - 7);
	return sign ? -v : v;
}

static double ref_f16_value(uint16_t h)
{
	int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
	double v;

	if (exp == 0x1f)
		v = mant ? NAN : INFINITY;
	else if (exp == 0)
		v = ldexp(mant, -24);
	else
		v = ldexp(1024 + mant, exp - 15 - 10);
	return sign ? -v : v;
}

static int is_nan16(uint16_t h, enum rps_dtype dt)
{
	return dt == RPS_DTYPE_BF16 ? (h & 0x7f80) == 0x7f80 && (h & 0x7f)
				    : (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

/* The widened bits a NaN must get (agg.h): bf16 shifted, fp16 quietened. */
static uint32_t nan_widened(uint16_t h, enum rps_dtype dt)
{
	if (dt == RPS_DTYPE_BF16)
		return (uint32_t)h << 16;
	return ((uint32_t)(h & 0x8000) << 16) | 0x7fc00000u | ((uint32_t)(h & 0x3ff) << 13);
}

/* The reference widening used by the aggregation checks: the ldexp value,
 * NaNs as agg.h defines them. */
static float ref_widen(const unsigned char *src, size_t i, enum rps_dtype dt)
{
	uint16_t h;

	if (dt == RPS_DTYPE_F32) {
		float f;

		memcpy(&f, src + 4 * i, 4);
		return f;
	}
	memcpy(&h, src + 2 * i, 2);
	if (is_nan16(h, dt))
		return float_of(nan_widened(h, dt));
	return (float)(dt == RPS_DTYPE_BF16 ? ref_bf16_value(h) : ref_f16_value(h));
}

static const enum rps_dtype all_dtypes[] = { RPS_DTYPE_F32, RPS_DTYPE_BF16, RPS_DTYPE_F16 };

/* ---- widening: all 65536 patterns --------------------------------------- */

static void check_widen_all(enum rps_dtype dt)
{
	unsigned bad = 0;

	for (uint32_t p = 0; p < 65536; p++) {
		uint16_t h = (uint16_t)p;
		float got = dt == RPS_DTYPE_BF16 ? rps__bf16_to_f32(h) : rps__f16_to_f32(h);
		double want = dt == RPS_DTYPE_BF16 ? ref_bf16_value(h) : ref_f16_value(h);
		int ok;

		if (is_nan16(h, dt))
			ok = isnan(got) && bits_of(got) == nan_widened(h, dt);
		else
			ok = bits_of(got) == bits_of((float)want) && (double)got == want;
		if (!ok && bad++ < 5)
			printf("\n  %s 0x%04x -> 0x%08x, want %.9g\n", rps__dtype_name(dt), p,
			       bits_of(got), want);
	}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_bf16_widen_all(void) { check_widen_all(RPS_DTYPE_BF16); }
static void test_f16_widen_all(void) { check_widen_all(RPS_DTYPE_F16); }

static void check_roundtrip_all(enum rps_dtype dt)
{
	unsigned bad = 0;

	for (uint32_t p = 0; p < 65536; p++) {
		uint16_t h = (uint16_t)p, back, want = h;

		if (dt == RPS_DTYPE_BF16)
			back = rps__f32_to_bf16(rps__bf16_to_f32(h));
		else
			back = rps__f32_to_f16(rps__f16_to_f32(h));
		if (is_nan16(h, dt))	/* stays NaN, quiet */
			want = (uint16_t)(h | (dt == RPS_DTYPE_BF16 ? 0x0040 : 0x0200));
		if (back != want && bad++ < 5)
			printf("\n  %s 0x%04x -> 0x%04x, want 0x%04x\n", rps__dtype_name(dt), p,
			       back, want);
	}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_bf16_roundtrip_all(void) { check_roundtrip_all(RPS_DTYPE_BF16); }
static void test_f16_roundtrip_all(void) { check_roundtrip_all(RPS_DTYPE_F16); }

/* ---- narrowing: known bit patterns -------------------------------------- */

struct narrow_case {
	uint32_t in;
	uint16_t out;
	const char *what;
};

static const struct narrow_case bf16_cases[] = {
	{ 0x3f800000, 0x3f80, "1.0" },
	{ 0x3f808000, 0x3f80, "tie, down to even" },
	{ 0x3f818000, 0x3f82, "tie, up to even" },
	{ 0x3f808001, 0x3f81, "just above tie" },
	{ 0x3f807fff, 0x3f80, "just below tie" },
	{ 0xbf818000, 0xbf82, "negative tie, up to even" },
	{ 0x7f7f7fff, 0x7f7f, "largest bf16 kept" },
	{ 0x7f7f8000, 0x7f80, "tie at the top overflows to Inf" },
	{ 0x7f7fffff, 0x7f80, "FLT_MAX overflows to Inf" },
	{ 0xff7fffff, 0xff80, "-FLT_MAX overflows to -Inf" },
	{ 0x7f800000, 0x7f80, "Inf" },
	{ 0xff800000, 0xff80, "-Inf" },
	{ 0x00000000, 0x0000, "+0" },
	{ 0x80000000, 0x8000, "-0" },
	{ 0x00008000, 0x0000, "subnormal tie to even 0" },
	{ 0x80008000, 0x8000, "negative subnormal tie to -0" },
	{ 0x00018000, 0x0002, "subnormal tie up to even" },
	{ 0x0000ffff, 0x0001, "subnormal rounds up" },
	{ 0x807fffff, 0x8080, "largest subnormal rounds up to -FLT_MIN" },
	{ 0x7fc00000, 0x7fc0, "quiet NaN" },
	{ 0x7f800001, 0x7fc0, "signalling NaN, low payload: quietened, not Inf" },
	{ 0x7fbfffff, 0x7fff, "signalling NaN, no carry into the sign" },
	{ 0xffffffff, 0xffff, "negative NaN" },
};

static const struct narrow_case f16_cases[] = {
	{ 0x3f800000, 0x3c00, "1.0" },
	{ 0x3f801000, 0x3c00, "1 + 2^-11: tie down to even" },
	{ 0x3f803000, 0x3c02, "1 + 3*2^-11: tie up to even" },
	{ 0x3f801001, 0x3c01, "just above tie" },
	{ 0x3f800fff, 0x3c00, "just below tie" },
	{ 0xc0000000, 0xc000, "-2" },
	{ 0x477fe000, 0x7bff, "65504, largest fp16" },
	{ 0x477fefff, 0x7bff, "just below 65520" },
	{ 0x477ff000, 0x7c00, "65520: tie overflows to Inf" },
	{ 0x501502f9, 0x7c00, "1e10 -> Inf" },
	{ 0xc77ff000, 0xfc00, "-65520 -> -Inf" },
	{ 0x7f800000, 0x7c00, "Inf" },
	{ 0xff800000, 0xfc00, "-Inf" },
	{ 0x00000000, 0x0000, "+0" },
	{ 0x80000000, 0x8000, "-0" },
	{ 0x00000001, 0x0000, "fp32 subnormal -> +0" },
	{ 0x80000001, 0x8000, "negative fp32 subnormal -> -0" },
	{ 0x33800000, 0x0001, "2^-24, smallest fp16 subnormal" },
	{ 0x33000000, 0x0000, "2^-25: tie to even 0" },
	{ 0xb3000000, 0x8000, "-2^-25: tie to -0" },
	{ 0x33000001, 0x0001, "just above 2^-25" },
	{ 0x33c00000, 0x0002, "1.5*2^-24: tie up to even 2" },
	{ 0x34200000, 0x0002, "2.5*2^-24: tie down to even 2" },
	{ 0x387fc000, 0x03ff, "largest fp16 subnormal" },
	{ 0x387fe000, 0x0400, "2^-14 - 2^-25: tie up to the smallest normal" },
	{ 0x38800000, 0x0400, "2^-14, smallest normal" },
	{ 0x7fc00000, 0x7e00, "quiet NaN" },
	{ 0x7f800001, 0x7e00, "signalling NaN, payload below fp16: quietened, not Inf" },
	{ 0x7f802000, 0x7e01, "NaN payload kept" },
	{ 0xffffffff, 0xffff, "negative NaN" },
};

static void test_narrow_known(void)
{
	for (size_t i = 0; i < RPS__ARRAY_SIZE(bf16_cases); i++) {
		uint16_t got = rps__f32_to_bf16(float_of(bf16_cases[i].in));

		if (got != bf16_cases[i].out)
			printf("\n  bf16 0x%08x (%s) -> 0x%04x, want 0x%04x\n", bf16_cases[i].in,
			       bf16_cases[i].what, got, bf16_cases[i].out);
		CU_ASSERT_EQUAL(got, bf16_cases[i].out);
	}
	for (size_t i = 0; i < RPS__ARRAY_SIZE(f16_cases); i++) {
		uint16_t got = rps__f32_to_f16(float_of(f16_cases[i].in));

		if (got != f16_cases[i].out)
			printf("\n  f16 0x%08x (%s) -> 0x%04x, want 0x%04x\n", f16_cases[i].in,
			       f16_cases[i].what, got, f16_cases[i].out);
		CU_ASSERT_EQUAL(got, f16_cases[i].out);
	}
}

/* ---- narrowing: against a nearest-value search -------------------------- */

/*
 * The non-negative finite values of the format in pattern order (which is
 * value order), plus the first pattern past them (Inf) standing for the
 * next power of two, as IEEE's overflow rule prescribes for rounding.
 */
struct format_table {
	enum rps_dtype dt;
	uint16_t inf;		/* 0x7f80 or 0x7c00 */
	double val[0x7f81];
};

static struct format_table *format_table_new(enum rps_dtype dt)
{
	struct format_table *t = malloc(sizeof(*t));

	t->dt = dt;
	t->inf = dt == RPS_DTYPE_BF16 ? 0x7f80 : 0x7c00;
	for (uint32_t h = 0; h < t->inf; h++)
		t->val[h] = dt == RPS_DTYPE_BF16 ? ref_bf16_value((uint16_t)h)
						 : ref_f16_value((uint16_t)h);
	t->val[t->inf] = dt == RPS_DTYPE_BF16 ? ldexp(1, 128) : ldexp(1, 16);
	return t;
}

/* Round f to the format by searching the nearest value; ties to the even
 * pattern.  Comparing with the exact midpoint avoids any subtraction. */
static uint16_t nearest(const struct format_table *t, float f)
{
	uint16_t sign = (uint16_t)((bits_of(f) >> 16) & 0x8000);
	double x = fabs((double)f);
	uint32_t lo = 0, hi = t->inf, k;
	double mid;

	if (isnan(f)) {
		/* Not a rounding question: the NaN contract of agg.h. */
		if (t->dt == RPS_DTYPE_BF16)
			return (uint16_t)((bits_of(f) >> 16) | 0x0040);
		return (uint16_t)(sign | 0x7e00 | ((bits_of(f) >> 13) & 0x3ff));
	}
	if (x >= t->val[t->inf])
		return (uint16_t)(sign | t->inf);
	while (hi - lo > 1) {	/* invariant: val[lo] <= x < val[hi] */
		uint32_t m = (lo + hi) / 2;

		if (t->val[m] <= x)
			lo = m;
		else
			hi = m;
	}
	mid = (t->val[lo] + t->val[hi]) / 2;
	if (x < mid)
		k = lo;
	else if (x > mid)
		k = hi;
	else
		k = (lo & 1) ? hi : lo;
	return (uint16_t)(sign | k);
}

static unsigned check_narrow_one(const struct format_table *t, float f)
{
	uint16_t got = t->dt == RPS_DTYPE_BF16 ? rps__f32_to_bf16(f) : rps__f32_to_f16(f);
	uint16_t want = nearest(t, f);

	if (got == want)
		return 0;
	printf("\n  %s 0x%08x (%.9g) -> 0x%04x, want 0x%04x\n", rps__dtype_name(t->dt),
	       bits_of(f), (double)f, got, want);
	return 1;
}

static void check_narrow_vs_nearest(enum rps_dtype dt)
{
	struct format_table *t = format_table_new(dt);
	unsigned bad = 0;

	/* Every representable value, every midpoint, and one fp32 ulp either
	 * side of each midpoint, both signs. */
	for (uint32_t k = 0; k < t->inf && bad < 5; k++) {
		float mid = (float)((t->val[k] + t->val[k + 1]) / 2);
		float probes[] = { (float)t->val[k], mid, nextafterf(mid, 0), nextafterf(mid, INFINITY) };

		for (size_t j = 0; j < RPS__ARRAY_SIZE(probes); j++) {
			bad += check_narrow_one(t, probes[j]);
			bad += check_narrow_one(t, -probes[j]);
		}
	}
	/* Random fp32 patterns, NaNs and Infs included. */
	for (int i = 0; i < 1000000 && bad < 5; i++)
		bad += check_narrow_one(t, float_of((uint32_t)rng()));
	CU_ASSERT_EQUAL(bad, 0);
	free(t);
}

static void test_bf16_narrow_nearest(void) { check_narrow_vs_nearest(RPS_DTYPE_BF16); }
static void test_f16_narrow_nearest(void) { check_narrow_vs_nearest(RPS_DTYPE_F16); }

static void test_f32_to_dtype(void)
{
	enum { N = 1003 };
	float src[N];
	unsigned char dst[4 * N + 8], want[4 * N];

	for (int i = 0; i < N; i++)
		src[i] = i % 7 ? rng_float(1e5f) : float_of((uint32_t)rng());
	for (size_t d = 0; d < RPS__ARRAY_SIZE(all_dtypes); d++) {
		enum rps_dtype dt = all_dtypes[d];
		size_t es = rps__dtype_size(dt);

		for (int i = 0; i < N; i++) {
			uint16_t h;

			if (dt == RPS_DTYPE_F32) {
				memcpy(want + 4 * i, &src[i], 4);
				continue;
			}
			h = dt == RPS_DTYPE_BF16 ? rps__f32_to_bf16(src[i]) : rps__f32_to_f16(src[i]);
			memcpy(want + 2 * i, &h, 2);
		}
		for (size_t off = 0; off < 4; off++) {
			memset(dst, 0xa5, sizeof(dst));
			rps__f32_to_dtype(dst + off, src, dt, N);
			CU_ASSERT_EQUAL(memcmp(dst + off, want, es * N), 0);
			CU_ASSERT_EQUAL(dst[off + es * N], 0xa5);	/* no overrun */
			rps__f32_to_dtype(dst + off, src, dt, 0);
		}
	}
}

/* ---- aggregation on every code path ------------------------------------- */

/* A gradient element of type dt: mostly values near the accumulator's, so
 * that additions round, with zeros, subnormals and Infs mixed in. */
static void fill_gradient(unsigned char *buf, enum rps_dtype dt, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float f;
		uint16_t h;

		switch (rng() % 16) {
		case 0:
			f = (rng() & 1) ? -0.0f : 0.0f;
			break;
		case 1:
			f = float_of((uint32_t)rng() & 0x807fffffu);	/* fp32 subnormal */
			break;
		case 2:
			f = rng_float(1e-5f);	/* fp16 subnormal range */
			break;
		case 3:
			f = (rng() & 1) ? INFINITY : rng_float(3e38f);
			break;
		default:
			f = rng_float(4.0f);
			break;
		}
		if (dt == RPS_DTYPE_F32) {
			memcpy(buf + 4 * i, &f, 4);
			continue;
		}
		h = dt == RPS_DTYPE_BF16 ? rps__f32_to_bf16(f) : rps__f32_to_f16(f);
		memcpy(buf + 2 * i, &h, 2);
	}
}

static void fill_acc(float *acc, size_t n)
{
	for (size_t i = 0; i < n; i++)
		acc[i] = rng() % 32 ? rng_float(4.0f) : -0.0f;
}

static int isa_count(void)
{
	return (int)rps__agg_best_isa() + 1;
}

/* One configuration: returns 1 on mismatch (and says which). */
static int check_agg(enum rps__agg_isa isa, enum rps_dtype dt, size_t n, size_t src_off,
		     size_t acc_off, int add)
{
	size_t es = rps__dtype_size(dt);
	unsigned char *src = malloc(es * n + src_off + 1);
	float *acc = malloc((n + acc_off + 1) * sizeof(float));
	float *want = malloc((n + 1) * sizeof(float));
	const float canary = float_of(0x7fa5a5a5u);
	int bad = 0;

	fill_gradient(src + src_off, dt, n);
	fill_acc(acc + acc_off, n);
	acc[acc_off + n] = canary;
	for (size_t i = 0; i < n; i++) {
		float x = ref_widen(src + src_off, i, dt);

		want[i] = add ? acc[acc_off + i] + x : x;
	}
	if (add)
		rps__agg_add_isa(isa, acc + acc_off, src + src_off, dt, n);
	else
		rps__agg_copy_isa(isa, acc + acc_off, src + src_off, dt, n);
	if ((n && memcmp(acc + acc_off, want, n * sizeof(float)) != 0) ||
	    bits_of(acc[acc_off + n]) != bits_of(canary)) {
		printf("\n  %s %s %s n=%zu src+%zu acc+%zu differs\n", add ? "add" : "copy",
		       rps__agg_isa_name(isa), rps__dtype_name(dt), n, src_off, acc_off);
		bad = 1;
	}
	free(src);
	free(acc);
	free(want);
	return bad;
}

static void check_agg_sizes(int add)
{
	static const size_t large[] = { 1000, 4099, 100003 };
	int bad = 0;

	for (int isa = 0; isa < isa_count(); isa++) {
		for (size_t d = 0; d < RPS__ARRAY_SIZE(all_dtypes); d++) {
			enum rps_dtype dt = all_dtypes[d];

			for (size_t n = 0; n <= 70; n++)
				for (size_t so = 0; so < 4; so++)
					for (size_t ao = 0; ao < 8; ao += 3)
						bad += check_agg((enum rps__agg_isa)isa, dt, n, so, ao, add);
			for (size_t j = 0; j < RPS__ARRAY_SIZE(large); j++)
				for (size_t so = 0; so < 4; so += 3)
					bad += check_agg((enum rps__agg_isa)isa, dt, large[j], so, 5, add);
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_copy_sizes(void) { check_agg_sizes(0); }
static void test_add_sizes(void) { check_agg_sizes(1); }

/* Every 16-bit pattern, NaNs included, through every path, one byte off
 * alignment: the vector conversions must match the scalar ones exactly. */
static void check_all_patterns_every_isa(void)
{
	enum { N = 65536 };
	unsigned char *src = malloc(2 * N + 1);
	float *acc0 = malloc(N * sizeof(float));
	float *want = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));

	for (uint32_t h = 0; h < N; h++) {
		uint16_t v = (uint16_t)h;

		memcpy(src + 1 + 2 * h, &v, 2);
	}
	fill_acc(acc0, N);	/* finite: at most one NaN operand per add */
	for (size_t d = 1; d < RPS__ARRAY_SIZE(all_dtypes); d++) {
		enum rps_dtype dt = all_dtypes[d];

		for (int isa = 0; isa < isa_count(); isa++) {
			for (uint32_t h = 0; h < N; h++)
				want[h] = dt == RPS_DTYPE_BF16 ? rps__bf16_to_f32((uint16_t)h)
							       : rps__f16_to_f32((uint16_t)h);
			rps__agg_copy_isa((enum rps__agg_isa)isa, got, src + 1, dt, N);
			CU_ASSERT_EQUAL(memcmp(got, want, sizeof(float) * N), 0);

			for (uint32_t h = 0; h < N; h++)
				want[h] = acc0[h] + want[h];
			memcpy(got, acc0, sizeof(float) * N);
			rps__agg_add_isa((enum rps__agg_isa)isa, got, src + 1, dt, N);
			CU_ASSERT_EQUAL(memcmp(got, want, sizeof(float) * N), 0);
		}
	}
	free(src);
	free(acc0);
	free(want);
	free(got);
}

static void test_all_patterns_every_isa(void)
{
	check_all_patterns_every_isa();
}

/* Trainers' math libraries often switch on flush-to-zero and
 * denormals-are-zero; fp16 subnormals must still widen exactly. */
static void test_all_patterns_daz_ftz(void)
{
#ifdef HAVE_MXCSR
	unsigned int saved = _mm_getcsr();

	_mm_setcsr(saved | 0x8040);	/* FTZ | DAZ */
	check_all_patterns_every_isa();
	_mm_setcsr(saved);
#else
	CU_PASS("no MXCSR on this architecture");
#endif
}

/* The sync mode's invariant in miniature: the server seeds the sum with
 * rank 0's gradient and adds ranks 1..3 in order; a single process doing
 * the same in plain C must get the same bits. */
static void test_four_workers_rank_order(void)
{
	enum { W = 4, N = (1 << 16) + 13 };

	for (size_t d = 0; d < RPS__ARRAY_SIZE(all_dtypes); d++) {
		enum rps_dtype dt = all_dtypes[d];
		size_t es = rps__dtype_size(dt);
		unsigned char *grad[W];
		float *server = malloc(N * sizeof(float)), *ref = malloc(N * sizeof(float));

		for (int w = 0; w < W; w++) {
			grad[w] = malloc(es * N + 3);
			fill_gradient(grad[w] + (size_t)w % 4, dt, N);	/* offsets 0..3 */
		}
		rps__agg_copy(server, grad[0], dt, N);
		for (int w = 1; w < W; w++)
			rps__agg_add(server, grad[w] + w, dt, N);
		for (size_t i = 0; i < N; i++) {
			float sum = ref_widen(grad[0], i, dt);

			for (int w = 1; w < W; w++)
				sum = sum + ref_widen(grad[w] + w, i, dt);
			ref[i] = sum;
		}
		CU_ASSERT_EQUAL(memcmp(server, ref, N * sizeof(float)), 0);
		for (int w = 0; w < W; w++)
			free(grad[w]);
		free(server);
		free(ref);
	}
}

static void test_dtype_names(void)
{
	static const struct {
		const char *s;
		enum rps_dtype dt;
	} ok[] = {
		{ "f32", RPS_DTYPE_F32 },   { "fp32", RPS_DTYPE_F32 },  { "float32", RPS_DTYPE_F32 },
		{ "FP32", RPS_DTYPE_F32 },  { "bf16", RPS_DTYPE_BF16 }, { "bfloat16", RPS_DTYPE_BF16 },
		{ "f16", RPS_DTYPE_F16 },   { "fp16", RPS_DTYPE_F16 },  { "float16", RPS_DTYPE_F16 },
	};
	static const char *const bad[] = { "", "f64", "bf", "fp16x", "int8" };
	enum rps_dtype dt;

	for (size_t i = 0; i < RPS__ARRAY_SIZE(ok); i++) {
		dt = (enum rps_dtype)0;
		CU_ASSERT_EQUAL(rps__dtype_parse(ok[i].s, &dt), 0);
		CU_ASSERT_EQUAL(dt, ok[i].dt);
	}
	for (size_t i = 0; i < RPS__ARRAY_SIZE(bad); i++) {
		rps__clearerr();
		CU_ASSERT_EQUAL(rps__dtype_parse(bad[i], &dt), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "dtype"));
	}
	CU_ASSERT_EQUAL(rps__dtype_parse(NULL, &dt), -EINVAL);
	for (size_t d = 0; d < RPS__ARRAY_SIZE(all_dtypes); d++) {
		CU_ASSERT_EQUAL(rps__dtype_parse(rps__dtype_name(all_dtypes[d]), &dt), 0);
		CU_ASSERT_EQUAL(dt, all_dtypes[d]);
	}
	CU_ASSERT_EQUAL(rps__dtype_size(RPS_DTYPE_F32), 4);
	CU_ASSERT_EQUAL(rps__dtype_size(RPS_DTYPE_BF16), 2);
	CU_ASSERT_EQUAL(rps__dtype_size(RPS_DTYPE_F16), 2);
	CU_ASSERT_EQUAL(rps__dtype_size((enum rps_dtype)0), 0);
	CU_ASSERT_STRING_EQUAL(rps__dtype_name((enum rps_dtype)99), "?");
}

static void test_isa_selection(void)
{
	enum rps__agg_isa best = rps__agg_best_isa();

	CU_ASSERT(rps__agg_isa_available(RPS__AGG_SCALAR));
	CU_ASSERT(rps__agg_isa_available(best));
	CU_ASSERT_STRING_NOT_EQUAL(rps__agg_isa_name(best), "?");
#if defined(__x86_64__) && defined(__GNUC__)
	/* x86-64 always has SSE2, which the vector path compiles to. */
	CU_ASSERT(best >= RPS__AGG_VECTOR);
	{
		unsigned int eax, ebx, ecx, edx;

		__builtin_cpu_init();
		if (__builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
		    (ecx & bit_F16C))
			CU_ASSERT_EQUAL(best, RPS__AGG_AVX2);
	}
#endif
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "bf16 -> f32, all 65536 patterns", test_bf16_widen_all },
		{ "f16 -> f32, all 65536 patterns", test_f16_widen_all },
		{ "bf16 -> f32 -> bf16, all patterns", test_bf16_roundtrip_all },
		{ "f16 -> f32 -> f16, all patterns", test_f16_roundtrip_all },
		{ "f32 -> bf16/f16, known patterns", test_narrow_known },
		{ "f32 -> bf16 vs nearest-value search", test_bf16_narrow_nearest },
		{ "f32 -> f16 vs nearest-value search", test_f16_narrow_nearest },
		{ "f32 -> dtype arrays, unaligned", test_f32_to_dtype },
		{ "copy, every path, n 0..70 and large, unaligned", test_copy_sizes },
		{ "add, every path, n 0..70 and large, unaligned", test_add_sizes },
		{ "all 16-bit patterns, every path", test_all_patterns_every_isa },
		{ "all 16-bit patterns, every path, FTZ+DAZ", test_all_patterns_daz_ftz },
		{ "4 workers in rank order = reference", test_four_workers_rank_order },
		{ "dtype names", test_dtype_names },
		{ "code path selection", test_isa_selection },
	};
	const struct cutest_suite suites[] = {
		{ "agg", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	printf("agg code paths: best is %s\n", rps__agg_isa_name(rps__agg_best_isa()));
	return cutest_run(suites, CUTEST_COUNT(suites));
}
