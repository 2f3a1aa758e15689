/*
 * agg.c - gradient aggregation: dtype conversions and the fp32 accumulate
 * loop that is the server's hot path.
 *
 * Three implementations of the same definition (see agg.h):
 *  - scalar: one element at a time, integer-only conversions;
 *  - vector: GCC vector extensions, 16-byte vectors, so it is SSE2 on
 *    x86-64 and NEON on arm64 without naming either;
 *  - avx2: x86 AVX2 intrinsics, F16C for fp16, chosen at run time.
 * Each performs exactly one fp32 add per element and exact conversions, so
 * they agree bit for bit; the unit tests hold them to that.
 */
#include "config.h"
#include "kernels/agg.h"
#include "common/common.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>

#if defined(__GNUC__)
#define AGG_HAVE_VECTOR 1
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define AGG_HAVE_AVX2 1
#include <cpuid.h>
#include <immintrin.h>
#define AVX2_TARGET __attribute__((target("avx2,f16c")))
#endif

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* ---- scalar definitions ------------------------------------------------ */

static inline uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline float bf16_widen(uint16_t h)
{
	/* bf16 is the top half of an fp32: the shift is exact for every
	 * pattern, NaN payloads included. */
	return bits_f32((uint32_t)h << 16);
}

static inline uint16_t bf16_narrow(float f)
{
	uint32_t u = f32_bits(f);

	/* Rounding a NaN could carry its payload away and leave an Inf (or
	 * a zero payload, i.e. Inf, after truncation): keep it a quiet NaN. */
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	/* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to
	 * even; a carry runs into the exponent, as far as Inf for values past
	 * the largest bf16.  No wrap: the largest input here is -Inf. */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static inline float f16_widen(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t mant = h & 0x3ffu;

	if (exp == 0x1f) {
		/* Inf, or NaN made quiet with its payload kept (what F16C's
		 * vcvtph2ps does, so that every path agrees). */
		return bits_f32(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0));
	}
	if (exp != 0)
		return bits_f32(sign | ((exp + 127 - 15) << 23) | (mant << 13));
	if (mant == 0)
		return bits_f32(sign);
	/* Subnormal, mant * 2^-24: every one is a normal fp32.  Shift the
	 * leading one up to the implicit bit and lower the exponent to match;
	 * integers only, so DAZ/FTZ modes cannot touch it. */
	exp = 127 - 15 + 1;
	while (!(mant & 0x400u)) {
		mant <<= 1;
		exp--;
	}
	return bits_f32(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
}

/* Round-to-nearest-even right shift of a positive integer by s (1..31). */
static inline uint32_t shift_rne(uint32_t x, unsigned s)
{
	uint32_t kept = x >> s;
	uint32_t rest = x & ((1u << s) - 1);
	uint32_t half = 1u << (s - 1);

	if (rest > half || (rest == half && (kept & 1u)))
		kept++;
	return kept;
}

static inline uint16_t f16_narrow(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;

	if (a > 0x7f800000u)	/* NaN: quiet, top 9 payload bits kept */
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	/* 65520 is half way between 65504 (0x7bff, odd) and 2^16: from there
	 * on, round to nearest even overflows to Inf. */
	if (a >= 0x477ff000u)
		return (uint16_t)(sign | 0x7c00u);
	if (a >= 0x38800000u) {
		/* Normal fp16 (|f| >= 2^-14): rebias the exponent by 127-15,
		 * round off 13 mantissa bits; a carry into the exponent is the
		 * right answer (up to 0x7bff, Inf was handled above). */
		return (uint16_t)(sign | shift_rne(a - ((127u - 15u) << 23), 13));
	}
	if (a <= 0x33000000u)	/* <= 2^-25, half the smallest subnormal: rounds to even 0 */
		return sign;
	/* Subnormal fp16: round(|f| * 2^24).  |f| = m * 2^(e-150) with the
	 * implicit bit in m, so the result is m >> (126 - e), e in 102..112. */
	{
		uint32_t e = a >> 23;
		uint32_t m = (a & 0x7fffffu) | 0x800000u;

		return (uint16_t)(sign | shift_rne(m, 126 - e));
	}
}

float rps__bf16_to_f32(uint16_t h) { return bf16_widen(h); }
uint16_t rps__f32_to_bf16(float f) { return bf16_narrow(f); }
float rps__f16_to_f32(uint16_t h) { return f16_widen(h); }
uint16_t rps__f32_to_f16(float f) { return f16_narrow(f); }

/* Element i of a source at any byte alignment, widened to fp32. */
static ALWAYS_INLINE float load_widen(const unsigned char *src, size_t i, enum rps_dtype dt)
{
	if (dt == RPS_DTYPE_F32) {
		float f;

		memcpy(&f, src + 4 * i, sizeof(f));
		return f;
	} else {
		uint16_t h;

		memcpy(&h, src + 2 * i, sizeof(h));
		return dt == RPS_DTYPE_BF16 ? bf16_widen(h) : f16_widen(h);
	}
}

static ALWAYS_INLINE void scalar_range(float *restrict acc, const unsigned char *restrict src,
				       size_t from, size_t to, enum rps_dtype dt, int add)
{
	for (size_t i = from; i < to; i++) {
		float x = load_widen(src, i, dt);

		acc[i] = add ? acc[i] + x : x;
	}
}

static void scalar_run(float *restrict acc, const unsigned char *restrict src,
		       enum rps_dtype dt, size_t n, int add)
{
	switch (dt) {
	case RPS_DTYPE_F32:
		scalar_range(acc, src, 0, n, RPS_DTYPE_F32, add);
		break;
	case RPS_DTYPE_BF16:
		scalar_range(acc, src, 0, n, RPS_DTYPE_BF16, add);
		break;
	case RPS_DTYPE_F16:
		scalar_range(acc, src, 0, n, RPS_DTYPE_F16, add);
		break;
	}
}

/* Elements to handle one by one before acc + i is `align`-byte aligned, so
 * that the vector stores never straddle a cache line (the source, from the
 * network, may be misaligned whatever we do). */
static inline size_t peel_count(const float *acc, size_t align, size_t n)
{
	size_t mis = (size_t)((uintptr_t)acc & (align - 1));
	size_t peel = mis ? (align - mis) / sizeof(float) : 0;

	return peel < n ? peel : n;
}

/* ---- portable vector path (GCC vector extensions) ----------------------- */

#ifdef AGG_HAVE_VECTOR
typedef float v4sf __attribute__((vector_size(16)));
typedef uint32_t v4su __attribute__((vector_size(16)));
typedef uint16_t v4hu __attribute__((vector_size(8)));

static ALWAYS_INLINE v4sf vec_f16_widen(v4hu h16)
{
	/* F. Giesen's half->float: move exponent and mantissa into place,
	 * rebias, then fix up Inf/NaN and subnormals with lane masks.  The one
	 * float operation (subnormals) works on normal numbers only, so the
	 * result does not depend on DAZ/FTZ. */
	const v4su h = __builtin_convertvector(h16, v4su);
	const v4su magic = (v4su){ 0, 0, 0, 0 } + ((127u - 15u + 1u) << 23);	/* 2^-14 */
	v4su o = (h & 0x7fffu) << 13;
	const v4su exp = o & 0x0f800000u;
	const v4su infnan = (v4su)(exp == 0x0f800000u);
	const v4su nan = infnan & (v4su)((h & 0x3ffu) != 0);
	const v4su sub = (v4su)(exp == 0);
	v4su subval;

	o += (127u - 15u) << 23;
	o += infnan & ((128u - 16u) << 23);	/* exponent all ones */
	o |= nan & 0x00400000u;			/* quiet, as F16C does */
	/* Subnormal m * 2^-24 = 2^-14 * (1 + m/1024) - 2^-14, exactly. */
	subval = (v4su)((v4sf)(o + (1u << 23)) - (v4sf)magic);
	o = (sub & subval) | (~sub & o);
	return (v4sf)(o | ((h & 0x8000u) << 16));
}

static ALWAYS_INLINE v4sf vec_load_widen(const unsigned char *src, size_t i, enum rps_dtype dt)
{
	if (dt == RPS_DTYPE_F32) {
		v4sf v;

		memcpy(&v, src + 4 * i, sizeof(v));
		return v;
	} else {
		v4hu h;

		memcpy(&h, src + 2 * i, sizeof(h));
		if (dt == RPS_DTYPE_BF16)
			return (v4sf)(__builtin_convertvector(h, v4su) << 16);
		return vec_f16_widen(h);
	}
}

static ALWAYS_INLINE void vec_step(float *restrict acc, const unsigned char *restrict src,
				   size_t i, enum rps_dtype dt, int add)
{
	v4sf x = vec_load_widen(src, i, dt);

	if (add) {
		v4sf a;

		memcpy(&a, acc + i, sizeof(a));
		x = a + x;
	}
	memcpy(acc + i, &x, sizeof(x));
}

static ALWAYS_INLINE void vec_range(float *restrict acc, const unsigned char *restrict src,
				    size_t n, enum rps_dtype dt, int add)
{
	size_t i = peel_count(acc, 16, n);

	scalar_range(acc, src, 0, i, dt, add);
	for (; i + 16 <= n; i += 16) {
		vec_step(acc, src, i, dt, add);
		vec_step(acc, src, i + 4, dt, add);
		vec_step(acc, src, i + 8, dt, add);
		vec_step(acc, src, i + 12, dt, add);
	}
	for (; i + 4 <= n; i += 4)
		vec_step(acc, src, i, dt, add);
	scalar_range(acc, src, i, n, dt, add);
}

static void vec_run(float *restrict acc, const unsigned char *restrict src,
		    enum rps_dtype dt, size_t n, int add)
{
	switch (dt) {
	case RPS_DTYPE_F32:
		vec_range(acc, src, n, RPS_DTYPE_F32, add);
		break;
	case RPS_DTYPE_BF16:
		vec_range(acc, src, n, RPS_DTYPE_BF16, add);
		break;
	case RPS_DTYPE_F16:
		vec_range(acc, src, n, RPS_DTYPE_F16, add);
		break;
	}
}
#endif

/* ---- x86 AVX2 + F16C path ----------------------------------------------- */

#ifdef AGG_HAVE_AVX2
AVX2_TARGET static ALWAYS_INLINE __m256 avx2_load_widen(const unsigned char *src, size_t i,
							 enum rps_dtype dt)
{
	if (dt == RPS_DTYPE_F32)
		return _mm256_loadu_ps((const float *)(const void *)(src + 4 * i));
	{
		__m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));

		if (dt == RPS_DTYPE_BF16)
			return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
		return _mm256_cvtph_ps(h);
	}
}

AVX2_TARGET static ALWAYS_INLINE void avx2_step(float *restrict acc, const unsigned char *restrict src,
						size_t i, enum rps_dtype dt, int add)
{
	__m256 x = avx2_load_widen(src, i, dt);

	if (add)
		x = _mm256_add_ps(_mm256_loadu_ps(acc + i), x);
	_mm256_storeu_ps(acc + i, x);
}

AVX2_TARGET static ALWAYS_INLINE void avx2_range(float *restrict acc, const unsigned char *restrict src,
						 size_t n, enum rps_dtype dt, int add)
{
	size_t i = peel_count(acc, 32, n);

	scalar_range(acc, src, 0, i, dt, add);
	/* Four independent vectors per iteration hide the add latency. */
	for (; i + 32 <= n; i += 32) {
		avx2_step(acc, src, i, dt, add);
		avx2_step(acc, src, i + 8, dt, add);
		avx2_step(acc, src, i + 16, dt, add);
		avx2_step(acc, src, i + 24, dt, add);
	}
	for (; i + 8 <= n; i += 8)
		avx2_step(acc, src, i, dt, add);
	scalar_range(acc, src, i, n, dt, add);
}

AVX2_TARGET static void avx2_run(float *restrict acc, const unsigned char *restrict src,
				 enum rps_dtype dt, size_t n, int add)
{
	switch (dt) {
	case RPS_DTYPE_F32:
		avx2_range(acc, src, n, RPS_DTYPE_F32, add);
		break;
	case RPS_DTYPE_BF16:
		avx2_range(acc, src, n, RPS_DTYPE_BF16, add);
		break;
	case RPS_DTYPE_F16:
		avx2_range(acc, src, n, RPS_DTYPE_F16, add);
		break;
	}
}
#endif

/* ---- dispatch ----------------------------------------------------------- */

static enum rps__agg_isa detect_isa(void)
{
#ifdef AGG_HAVE_AVX2
	unsigned int eax, ebx, ecx, edx;

	/* The compiler runtime's avx2 check includes the OS enabling the AVX
	 * register state (XGETBV), which F16C needs too; F16C itself is asked
	 * of CPUID directly, as not every compiler knows it by name. */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
	    (ecx & bit_F16C))
		return RPS__AGG_AVX2;
#endif
#ifdef AGG_HAVE_VECTOR
	return RPS__AGG_VECTOR;
#else
	return RPS__AGG_SCALAR;
#endif
}

enum rps__agg_isa rps__agg_best_isa(void)
{
	/* Detection is pure, so racing threads store the same value. */
	static atomic_int cached = -1;
	int isa = atomic_load_explicit(&cached, memory_order_relaxed);

	if (isa < 0) {
		isa = (int)detect_isa();
		atomic_store_explicit(&cached, isa, memory_order_relaxed);
	}
	return (enum rps__agg_isa)isa;
}

int rps__agg_isa_available(enum rps__agg_isa isa)
{
	return (int)isa >= 0 && isa <= rps__agg_best_isa();
}

const char *rps__agg_isa_name(enum rps__agg_isa isa)
{
	switch (isa) {
	case RPS__AGG_SCALAR:
		return "scalar";
	case RPS__AGG_VECTOR:
		return "vector";
	case RPS__AGG_AVX2:
		return "avx2";
	}
	return "?";
}

static void run(enum rps__agg_isa isa, float *acc, const void *src, enum rps_dtype dt,
		size_t n, int add)
{
	enum rps__agg_isa best = rps__agg_best_isa();

	assert(rps__dtype_size(dt) != 0);
	if (n == 0)
		return;
	if (isa > best)
		isa = best;
	switch (isa) {
#ifdef AGG_HAVE_AVX2
	case RPS__AGG_AVX2:
		avx2_run(acc, src, dt, n, add);
		return;
#endif
#ifdef AGG_HAVE_VECTOR
	case RPS__AGG_VECTOR:
		vec_run(acc, src, dt, n, add);
		return;
#endif
	default:
		scalar_run(acc, src, dt, n, add);
		return;
	}
}

void rps__agg_copy_isa(enum rps__agg_isa isa, float *dst, const void *src,
		       enum rps_dtype dt, size_t n)
{
	/* fp32 to fp32 is a byte copy on every path; memcpy is the fastest. */
	if (dt == RPS_DTYPE_F32) {
		if (n)
			memcpy(dst, src, n * sizeof(float));
		return;
	}
	run(isa, dst, src, dt, n, 0);
}

void rps__agg_add_isa(enum rps__agg_isa isa, float *acc, const void *src,
		      enum rps_dtype dt, size_t n)
{
	run(isa, acc, src, dt, n, 1);
}

void rps__agg_copy(float *dst, const void *src, enum rps_dtype dt, size_t n)
{
	rps__agg_copy_isa(rps__agg_best_isa(), dst, src, dt, n);
}

void rps__agg_add(float *acc, const void *src, enum rps_dtype dt, size_t n)
{
	run(rps__agg_best_isa(), acc, src, dt, n, 1);
}

void rps__f32_to_dtype(void *dst, const float *src, enum rps_dtype dt, size_t n)
{
	unsigned char *out = dst;

	assert(rps__dtype_size(dt) != 0);
	switch (dt) {
	case RPS_DTYPE_F32:
		if (n)
			memcpy(out, src, n * sizeof(float));
		break;
	case RPS_DTYPE_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h = bf16_narrow(src[i]);

			memcpy(out + 2 * i, &h, sizeof(h));
		}
		break;
	case RPS_DTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h = f16_narrow(src[i]);

			memcpy(out + 2 * i, &h, sizeof(h));
		}
		break;
	}
}

/* ---- dtype names -------------------------------------------------------- */

size_t rps__dtype_size(enum rps_dtype dt)
{
	switch (dt) {
	case RPS_DTYPE_F32:
		return 4;
	case RPS_DTYPE_BF16:
	case RPS_DTYPE_F16:
		return 2;
	}
	return 0;
}

const char *rps__dtype_name(enum rps_dtype dt)
{
	switch (dt) {
	case RPS_DTYPE_F32:
		return "f32";
	case RPS_DTYPE_BF16:
		return "bf16";
	case RPS_DTYPE_F16:
		return "f16";
	}
	return "?";
}

int rps__dtype_parse(const char *s, enum rps_dtype *out)
{
	static const struct {
		const char *name;
		enum rps_dtype dt;
	} names[] = {
		{ "f32", RPS_DTYPE_F32 },   { "fp32", RPS_DTYPE_F32 },
		{ "float32", RPS_DTYPE_F32 }, { "bf16", RPS_DTYPE_BF16 },
		{ "bfloat16", RPS_DTYPE_BF16 }, { "f16", RPS_DTYPE_F16 },
		{ "fp16", RPS_DTYPE_F16 },  { "float16", RPS_DTYPE_F16 },
	};

	for (size_t i = 0; s && i < RPS__ARRAY_SIZE(names); i++) {
		if (strcasecmp(s, names[i].name) == 0) {
			*out = names[i].dt;
			return 0;
		}
	}
	return rps__seterr(-EINVAL, "unknown dtype '%s': use f32, bf16 or f16", s ? s : "(null)");
}
