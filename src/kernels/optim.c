/*
 * optim.c - the per-tensor optimizers (formulas in optim.h).
 *
 * Written as plain element loops so that the compiler vectorises them, and
 * shaped so that it does so at -O2: GCC's default cost model there
 * ("very cheap") only vectorises loops whose trip count is a known multiple
 * of the vector width, so the work is cut into fixed BLOCK-element pieces
 * (plus one short tail), and each (optimizer, rescale?, decay?) combination
 * is its own loop with the choices folded away at compile time.  Every
 * operation is a single IEEE fp32 operation in the order optim.h gives,
 * so vector and scalar iterations produce identical bits.  The loops are
 * compiled twice on x86, for the baseline and for AVX2, picked at run time.
 *
 * sqrtf is the exception to auto-vectorisation: with errno-setting maths
 * (the C default) the compiler must keep it a library call.  Adam therefore
 * takes the square roots of a block in one separate step, with SSE's sqrtps
 * where there is one; IEEE square root is correctly rounded, so it gives
 * the same bits as sqrtf.
 */
#include "config.h"
#include "kernels/optim.h"
#include "common/common.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <strings.h>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define OPTIM_HAVE_AVX2 1
#define AVX2_TARGET __attribute__((target("avx2")))
#endif

/* The formulas are exact fp32 operations in order: never fuse a*b+c into
 * an FMA, whatever the build's -std or -march (-std=c11 already implies
 * this for GCC; -std=gnu11 and clang with FMA hardware would not). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Elements per vectorised piece: a multiple of every vector width we meet
 * (4 SSE/NEON, 8 AVX, 16 AVX-512). */
#define BLOCK 16

/* Loop variants, as compile-time flags. */
#define RESCALED 1u	/* g' = rescale * g (rescale != 1) */
#define DECAYED 2u	/* d = g' + wd * p (wd != 0) */

/* The per-call constants, computed once. */
struct coeffs {
	float rescale, lr, wd, mu;
	float b1, b2, one_minus_b1, one_minus_b2, eps, bc1, bc2;
};

static ALWAYS_INLINE float direction(float g, float p, const struct coeffs *c, unsigned flags)
{
	float gs = (flags & RESCALED) ? c->rescale * g : g;

	return (flags & DECAYED) ? gs + c->wd * p : gs;
}

/* sqrt of u[0..n), n <= BLOCK. */
static ALWAYS_INLINE void sqrt_block(float *u, size_t n)
{
	size_t i = 0;

#if defined(__SSE__)
	for (; i + 4 <= n; i += 4)
		_mm_storeu_ps(u + i, _mm_sqrt_ps(_mm_loadu_ps(u + i)));
#endif
	for (; i < n; i++)
		u[i] = sqrtf(u[i]);
}

/* One piece of n <= BLOCK elements.  m is the momentum (MOMENTUM's v lives
 * here too); v is Adam's second moment.  Copies of the coefficients in
 * locals keep them in registers across the stores. */
static ALWAYS_INLINE void update(enum rps_optimizer type, unsigned flags, const struct coeffs *cp,
				 float *restrict p, const float *restrict g, float *restrict m,
				 float *restrict v, size_t n)
{
	const struct coeffs c = *cp;

	switch (type) {
	case RPS_OPT_SUM:
		for (size_t i = 0; i < n; i++)
			p[i] = p[i] + ((flags & RESCALED) ? c.rescale * g[i] : g[i]);
		break;
	case RPS_OPT_SGD:
		for (size_t i = 0; i < n; i++)
			p[i] = p[i] - c.lr * direction(g[i], p[i], &c, flags);
		break;
	case RPS_OPT_MOMENTUM:
		for (size_t i = 0; i < n; i++) {
			m[i] = c.mu * m[i] + direction(g[i], p[i], &c, flags);
			p[i] = p[i] - c.lr * m[i];
		}
		break;
	case RPS_OPT_ADAM: {
		float root[BLOCK];

		for (size_t i = 0; i < n; i++) {
			float d = direction(g[i], p[i], &c, flags);

			m[i] = c.b1 * m[i] + c.one_minus_b1 * d;
			v[i] = c.b2 * v[i] + c.one_minus_b2 * d * d;
			root[i] = v[i] / c.bc2;
		}
		sqrt_block(root, n);
		for (size_t i = 0; i < n; i++)
			p[i] = p[i] - c.lr * (m[i] / c.bc1) / (root[i] + c.eps);
		break;
	}
	}
}

static ALWAYS_INLINE void blocked(enum rps_optimizer type, unsigned flags, const struct coeffs *c,
				  float *restrict p, const float *restrict g, float *restrict state,
				  size_t n)
{
	/* No pointer arithmetic on a NULL state for the stateless types. */
	float *m = type == RPS_OPT_MOMENTUM || type == RPS_OPT_ADAM ? state : NULL;
	float *v = type == RPS_OPT_ADAM ? state + n : NULL;
	size_t i = 0;

	for (; i + BLOCK <= n; i += BLOCK)
		update(type, flags, c, p + i, g + i, m ? m + i : NULL, v ? v + i : NULL, BLOCK);
	if (i < n)
		update(type, flags, c, p + i, g + i, m ? m + i : NULL, v ? v + i : NULL, n - i);
}

/* One function per optimizer and code path, each with its four flag
 * variants inlined.  `target` is empty (the build's baseline) or AVX2. */
#define DEFINE_RUN(fn, type, target)                                                      \
	target static void fn(unsigned flags, const struct coeffs *c, float *restrict p, \
			      const float *restrict g, float *restrict state, size_t n) \
	{                                                                                 \
		switch (flags) {                                                          \
		case 0:                                                                   \
			blocked(type, 0, c, p, g, state, n);                              \
			break;                                                            \
		case RESCALED:                                                            \
			blocked(type, RESCALED, c, p, g, state, n);                       \
			break;                                                            \
		case DECAYED:                                                             \
			blocked(type, DECAYED, c, p, g, state, n);                        \
			break;                                                            \
		default:                                                                  \
			blocked(type, RESCALED | DECAYED, c, p, g, state, n);             \
			break;                                                            \
		}                                                                         \
	}

typedef void run_fn(unsigned flags, const struct coeffs *c, float *restrict p,
		    const float *restrict g, float *restrict state, size_t n);

DEFINE_RUN(run_sum, RPS_OPT_SUM, )
DEFINE_RUN(run_sgd, RPS_OPT_SGD, )
DEFINE_RUN(run_momentum, RPS_OPT_MOMENTUM, )
DEFINE_RUN(run_adam, RPS_OPT_ADAM, )

#ifdef OPTIM_HAVE_AVX2
/* The same source compiled for 256-bit vectors: Adam's divisions and
 * square roots are compute bound, and twice the width nearly halves them.
 * AVX2 without FMA, and no contraction anyway, so the bits are the same. */
DEFINE_RUN(run_sum_avx2, RPS_OPT_SUM, AVX2_TARGET)
DEFINE_RUN(run_sgd_avx2, RPS_OPT_SGD, AVX2_TARGET)
DEFINE_RUN(run_momentum_avx2, RPS_OPT_MOMENTUM, AVX2_TARGET)
DEFINE_RUN(run_adam_avx2, RPS_OPT_ADAM, AVX2_TARGET)
#endif

/* Indexed by [path][type - RPS_OPT_SUM]. */
static run_fn *const runs[][4] = {
	[RPS__OPTIM_BASELINE] = { run_sum, run_sgd, run_momentum, run_adam },
#ifdef OPTIM_HAVE_AVX2
	[RPS__OPTIM_AVX2] = { run_sum_avx2, run_sgd_avx2, run_momentum_avx2, run_adam_avx2 },
#endif
};

enum rps__optim_path rps__optim_best_path(void)
{
	/* Detection is pure, so racing threads store the same value. */
	static atomic_int cached = -1;
	int path = atomic_load_explicit(&cached, memory_order_relaxed);

	if (path < 0) {
		path = RPS__OPTIM_BASELINE;
#ifdef OPTIM_HAVE_AVX2
		/* Includes the OS enabling the AVX register state (XGETBV). */
		__builtin_cpu_init();
		if (__builtin_cpu_supports("avx2"))
			path = RPS__OPTIM_AVX2;
#endif
		atomic_store_explicit(&cached, path, memory_order_relaxed);
	}
	return (enum rps__optim_path)path;
}

/* 1 - beta^step, in double from the float beta, rounded to float once. */
static float bias_correction(float beta, uint64_t step)
{
	return (float)(1.0 - pow((double)beta, (double)step));
}

size_t rps__optim_state_len(enum rps_optimizer type, size_t n)
{
	switch (type) {
	case RPS_OPT_MOMENTUM:
		return n;
	case RPS_OPT_ADAM:
		return 2 * n;
	case RPS_OPT_SUM:
	case RPS_OPT_SGD:
		break;
	}
	return 0;
}

void rps__optim_apply_path(enum rps__optim_path path, const struct rps__optim *o,
			   float *restrict p, const float *restrict g, float *restrict state,
			   size_t n, uint64_t step)
{
	struct coeffs c = {
		.rescale = o->rescale,
		.lr = o->lr,
		.wd = o->weight_decay,
		.mu = o->momentum,
		.b1 = o->beta1,
		.b2 = o->beta2,
		.one_minus_b1 = 1.0f - o->beta1,
		.one_minus_b2 = 1.0f - o->beta2,
		.eps = o->eps,
	};
	unsigned flags = (o->rescale != 1.0f ? RESCALED : 0) | (o->weight_decay != 0.0f ? DECAYED : 0);

	if (n == 0)
		return;
	if (path > rps__optim_best_path())
		path = rps__optim_best_path();
	switch (o->type) {
	case RPS_OPT_SUM:
		flags &= RESCALED;	/* SUM has no decay term */
		state = NULL;
		break;
	case RPS_OPT_SGD:
		state = NULL;
		break;
	case RPS_OPT_MOMENTUM:
		break;
	case RPS_OPT_ADAM:
		if (step == 0)
			step = 1;
		c.bc1 = bias_correction(o->beta1, step);
		c.bc2 = bias_correction(o->beta2, step);
		break;
	default:
		assert(!"rps__optim_apply: unknown optimizer (not validated?)");
		return;
	}
	runs[path][o->type - RPS_OPT_SUM](flags, &c, p, g, state, n);
}

void rps__optim_apply(const struct rps__optim *o, float *restrict p, const float *restrict g,
		      float *restrict state, size_t n, uint64_t step)
{
	rps__optim_apply_path(rps__optim_best_path(), o, p, g, state, n, step);
}

/* The range checks below are written so that NaN fails them. */
static int check_unit(const char *opt, const char *what, float x, const char *usual)
{
	if (x >= 0.0f && x < 1.0f)
		return 0;
	return rps__seterr(-EINVAL, "optimizer %s: %s = %g is outside [0, 1): use e.g. %s", opt,
			   what, (double)x, usual);
}

int rps__optim_validate(const struct rps__optim *o)
{
	const char *name = rps__optim_name(o->type);

	if (name[0] == '?')
		return rps__seterr(-EINVAL, "unknown optimizer %d: use sum, sgd, momentum or adam",
				   (int)o->type);
	{	/* every knob finite, used or not: a NaN never compares equal, so
		 * a second worker's create would never match the first's */
		const float v[] = { o->lr, o->momentum, o->beta1, o->beta2, o->eps, o->weight_decay, o->rescale };
		static const char *const what[] = { "learning rate", "momentum", "beta1", "beta2", "eps",
						    "weight decay", "rescale" };

		for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
			if (!isfinite(v[i]))
				return rps__seterr(-EINVAL, "optimizer %s: %s = %g is not a finite number", name,
						   what[i], (double)v[i]);
	}
	if (!(o->rescale > 0.0f && isfinite(o->rescale)))
		return rps__seterr(-EINVAL,
				   "optimizer %s: rescale = %g must be finite and > 0 (1, or 1/W to average W workers)",
				   name, (double)o->rescale);
	if (o->type == RPS_OPT_SUM)
		return 0;
	if (!(o->lr >= 0.0f && isfinite(o->lr)))
		return rps__seterr(-EINVAL, "optimizer %s: learning rate %g must be finite and >= 0",
				   name, (double)o->lr);
	if (!(o->weight_decay >= 0.0f && isfinite(o->weight_decay)))
		return rps__seterr(-EINVAL, "optimizer %s: weight decay %g must be finite and >= 0 (0 for none)",
				   name, (double)o->weight_decay);
	if (o->type == RPS_OPT_MOMENTUM)
		return check_unit(name, "momentum", o->momentum, "0.9");
	if (o->type == RPS_OPT_ADAM) {
		int err = check_unit(name, "beta1", o->beta1, "0.9");

		if (!err)
			err = check_unit(name, "beta2", o->beta2, "0.999");
		if (!err && !(o->eps > 0.0f && isfinite(o->eps)))
			err = rps__seterr(-EINVAL, "optimizer adam: eps = %g must be finite and > 0: use e.g. 1e-8",
					  (double)o->eps);
		return err;
	}
	return 0;
}

const char *rps__optim_name(enum rps_optimizer type)
{
	switch (type) {
	case RPS_OPT_SUM:
		return "sum";
	case RPS_OPT_SGD:
		return "sgd";
	case RPS_OPT_MOMENTUM:
		return "momentum";
	case RPS_OPT_ADAM:
		return "adam";
	}
	return "?";
}

int rps__optim_parse(const char *s, enum rps_optimizer *out)
{
	static const enum rps_optimizer all[] = { RPS_OPT_SUM, RPS_OPT_SGD, RPS_OPT_MOMENTUM,
						  RPS_OPT_ADAM };

	for (size_t i = 0; s && i < RPS__ARRAY_SIZE(all); i++) {
		if (strcasecmp(s, rps__optim_name(all[i])) == 0) {
			*out = all[i];
			return 0;
		}
	}
	return rps__seterr(-EINVAL, "unknown optimizer '%s': use sum, sgd, momentum or adam",
			   s ? s : "(null)");
}
