/*
 * test_optim.c - unit tests of the server's optimizers (src/kernels/optim.c).
 *
 * The reference below restates optim.h's formulas as the plainest possible
 * scalar loop; the library's blocked, vectorised loops must match it bit for
 * bit, for every optimizer, with and without weight decay and rescale, over
 * several steps, at every size around the block and vector widths.  A few
 * checks against known behaviour (Adam's first step is ~lr, momentum's
 * geometric sum) guard against the reference and the library sharing a
 * misreading of the formulas.
 */
#include "config.h"
#include "kernels/optim.h"
#include "common/common.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The formulas are exact fp32 operations in order: never fuse a*b+c into
 * an FMA, whatever the build's -std or -march (-std=c11 already implies
 * this for GCC; -std=gnu11 and clang with FMA hardware would not). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define TEST_RNG_SEED 0x243f6a8885a308d3ull
#include "test_rng.h"
#include "lib/cutest.h"

static uint32_t bits_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/* optim.h, element by element, as literally as C allows. */
static void ref_apply(const struct rps__optim *o, float *p, const float *g, float *state,
		      size_t n, uint64_t step)
{
	const float bc1 = (float)(1.0 - pow((double)o->beta1, (double)step));
	const float bc2 = (float)(1.0 - pow((double)o->beta2, (double)step));

	for (size_t i = 0; i < n; i++) {
		float gs = (o->rescale == 1.0f) ? g[i] : o->rescale * g[i];
		float d = (o->weight_decay == 0.0f) ? gs : gs + o->weight_decay * p[i];

		switch (o->type) {
		case RPS_OPT_SUM:
			p[i] = p[i] + gs;
			break;
		case RPS_OPT_SGD:
			p[i] = p[i] - o->lr * d;
			break;
		case RPS_OPT_MOMENTUM: {
			float *v = state;

			v[i] = o->momentum * v[i] + d;
			p[i] = p[i] - o->lr * v[i];
			break;
		}
		case RPS_OPT_ADAM: {
			float *m = state, *v = state + n;

			m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * d;
			v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * d * d;
			p[i] = p[i] - o->lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + o->eps);
			break;
		}
		}
	}
}

static struct rps__optim optim_default(enum rps_optimizer type)
{
	struct rps__optim o = {
		.type = type, .lr = 0.01f, .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f,
		.eps = 1e-8f, .weight_decay = 0.0f, .rescale = 1.0f,
	};
	return o;
}

static const enum rps_optimizer all_types[] = { RPS_OPT_SUM, RPS_OPT_SGD, RPS_OPT_MOMENTUM,
						RPS_OPT_ADAM };

/* Equal bits, or both NaN (which NaN two NaN operands yield is not pinned). */
static int same_floats(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (bits_of(a[i]) != bits_of(b[i]) && !(isnan(a[i]) && isnan(b[i])))
			return 0;
	return 1;
}

/*
 * Run `steps` updates from random parameters on the library and on the
 * reference and compare everything after each step.  off shifts p, g and
 * state by different element counts so that vector loads meet every
 * alignment.  Returns 1 on mismatch, after saying where.
 */
static int check_steps(enum rps__optim_path path, const struct rps__optim *o, size_t n,
		       size_t off, int steps, uint64_t first_step, int specials)
{
	size_t slen = rps__optim_state_len(o->type, n);
	float *p = calloc(n + off + 1, sizeof(float)), *pr = calloc(n + 1, sizeof(float));
	float *g = calloc(n + 2 * off + 1, sizeof(float));
	float *s = calloc(slen + 3 * off + 1, sizeof(float)), *sr = calloc(slen + 1, sizeof(float));
	int bad = 0;

	for (size_t i = 0; i < n; i++)
		pr[i] = p[off + i] = rng_float(2.0f);
	if (specials && n >= 6) {
		const float sp[] = { INFINITY, -INFINITY, -0.0f, 1e-40f, -1e-42f, 3e38f };

		for (size_t i = 0; i < 6; i++)
			pr[i * n / 6] = p[off + i * n / 6] = sp[i];
	}
	for (int t = 0; t < steps && !bad; t++) {
		uint64_t step = first_step + (uint64_t)t;

		for (size_t i = 0; i < n; i++) {
			/* Gradients spanning many binades, so roundings vary. */
			g[2 * off + i] = rng_float(1.0f) * ldexpf(1.0f, (int)(rng() % 20) - 10);
			if (specials && rng() % 8 == 0) {
				const float sp[] = { -0.0f, 0.0f, 1e-39f, 2e38f, -INFINITY, 1e-45f };

				g[2 * off + i] = sp[rng() % 6];
			}
		}
		rps__optim_apply_path(path, o, p + off, g + 2 * off, slen ? s + 3 * off : NULL, n,
				      step);
		ref_apply(o, pr, g + 2 * off, sr, n, step);
		if (!same_floats(p + off, pr, n) || !same_floats(s + 3 * off, sr, slen)) {
			printf("\n  %s path %d wd=%g rescale=%g n=%zu off=%zu step=%llu: differs\n",
			       rps__optim_name(o->type), (int)path, (double)o->weight_decay,
			       (double)o->rescale, n, off, (unsigned long long)step);
			bad = 1;
		}
	}
	free(p);
	free(pr);
	free(g);
	free(s);
	free(sr);
	return bad;
}

static const size_t sizes[] = { 0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65,
				100, 1000, 4099 };

static void check_every_variant(enum rps_optimizer type)
{
	static const float decays[] = { 0.0f, 0.01f };
	static const float rescales[] = { 1.0f, 0.25f, 1.0f / 3.0f };
	int bad = 0;

	for (int path = 0; path <= (int)rps__optim_best_path(); path++) {
		for (size_t w = 0; w < RPS__ARRAY_SIZE(decays); w++) {
			for (size_t r = 0; r < RPS__ARRAY_SIZE(rescales); r++) {
				struct rps__optim o = optim_default(type);

				o.weight_decay = decays[w];
				o.rescale = rescales[r];
				for (size_t k = 0; k < RPS__ARRAY_SIZE(sizes); k++)
					for (size_t off = 0; off < 2; off++)
						bad += check_steps((enum rps__optim_path)path, &o,
								   sizes[k], off, 6, 1, 0);
			}
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_sum(void) { check_every_variant(RPS_OPT_SUM); }
static void test_sgd(void) { check_every_variant(RPS_OPT_SGD); }
static void test_momentum(void) { check_every_variant(RPS_OPT_MOMENTUM); }
static void test_adam(void) { check_every_variant(RPS_OPT_ADAM); }

/* Other hyper-parameters, late steps (bias correction near 1), and special
 * values in parameters and gradients. */
static void test_hyper_and_specials(void)
{
	int bad = 0;

	for (int pi = 0; pi <= (int)rps__optim_best_path(); pi++) {
		enum rps__optim_path path = (enum rps__optim_path)pi;

		for (size_t t = 0; t < RPS__ARRAY_SIZE(all_types); t++) {
			struct rps__optim o = optim_default(all_types[t]);

			o.lr = 0.37f;
			o.momentum = 0.5f;
			o.beta1 = 0.0f;
			o.beta2 = 0.5f;
			o.eps = 1e-3f;
			o.weight_decay = 3.0f;
			o.rescale = 1e-3f;
			bad += check_steps(path, &o, 1000, 1, 4, 1, 0);
			bad += check_steps(path, &o, 257, 0, 3, 1000000, 0);
			o = optim_default(all_types[t]);
			bad += check_steps(path, &o, 1000, 0, 3, (uint64_t)1 << 40, 0);
			bad += check_steps(path, &o, 1000, 1, 4, 1, 1);
			o.weight_decay = 0.5f;
			o.rescale = 2.0f;
			bad += check_steps(path, &o, 1000, 1, 4, 1, 1);
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
}

/* wd == 0 must skip the decay term exactly: 0 * Inf would be NaN. */
static void test_zero_decay_is_skipped(void)
{
	for (size_t t = 1; t < RPS__ARRAY_SIZE(all_types); t++) {
		struct rps__optim o = optim_default(all_types[t]);
		float p[40], g[40], s[80] = { 0 };

		for (int i = 0; i < 40; i++) {
			p[i] = INFINITY;
			g[i] = 1.0f;
		}
		rps__optim_apply(&o, p, g, s, 40, 1);
		for (int i = 0; i < 40; i++)
			CU_ASSERT(isinf(p[i]) && p[i] > 0);
		for (int i = 0; i < 80; i++)
			CU_ASSERT(!isnan(s[i]));
	}
}

/* Known behaviour, independent of the reference's transcription. */
static void test_known_values(void)
{
	enum { N = 37 };
	float p[N], g[N], s[2 * N];
	struct rps__optim o;

	/* SUM with rescale 1/4 of four workers' sum: the average. */
	o = optim_default(RPS_OPT_SUM);
	o.rescale = 0.25f;
	for (int i = 0; i < N; i++) {
		p[i] = 1.0f;
		g[i] = 4.0f * (float)i;
	}
	rps__optim_apply(&o, p, g, NULL, N, 1);
	for (int i = 0; i < N; i++)
		CU_ASSERT_EQUAL(p[i], 1.0f + (float)i);

	/* SGD: 1 - 0.5 * (2 + 0.5 * 1) = -0.25, exact in binary. */
	o = optim_default(RPS_OPT_SGD);
	o.lr = 0.5f;
	o.weight_decay = 0.5f;
	for (int i = 0; i < N; i++) {
		p[i] = 1.0f;
		g[i] = 2.0f;
	}
	rps__optim_apply(&o, p, g, NULL, N, 1);
	for (int i = 0; i < N; i++)
		CU_ASSERT_EQUAL(p[i], -0.25f);

	/* Momentum 0.5, lr 0.25, constant g = 1: v = 1, 1.5; p = -0.25, -0.625. */
	o = optim_default(RPS_OPT_MOMENTUM);
	o.lr = 0.25f;
	o.momentum = 0.5f;
	memset(s, 0, sizeof(s));
	for (int i = 0; i < N; i++) {
		p[i] = 0.0f;
		g[i] = 1.0f;
	}
	rps__optim_apply(&o, p, g, s, N, 1);
	rps__optim_apply(&o, p, g, s, N, 2);
	for (int i = 0; i < N; i++) {
		CU_ASSERT_EQUAL(s[i], 1.5f);
		CU_ASSERT_EQUAL(p[i], -0.625f);
	}

	/* Adam's bias-corrected first step is lr * g / (|g| + eps) ~ lr * sign(g),
	 * and stays ~lr under a constant gradient. */
	o = optim_default(RPS_OPT_ADAM);
	o.lr = 0.001f;
	memset(s, 0, sizeof(s));
	for (int i = 0; i < N; i++) {
		p[i] = 0.0f;
		g[i] = (i & 1) ? 0.3f : -7.0f;
	}
	for (uint64_t step = 1; step <= 10; step++) {
		float before[N];

		memcpy(before, p, sizeof(p));
		rps__optim_apply(&o, p, g, s, N, step);
		for (int i = 0; i < N; i++) {
			float moved = before[i] - p[i];

			CU_ASSERT(fabsf(fabsf(moved) - 0.001f) < 1e-6f);
			CU_ASSERT((moved > 0) == (g[i] > 0));
		}
	}
}

static void test_state_len(void)
{
	CU_ASSERT_EQUAL(rps__optim_state_len(RPS_OPT_SUM, 100), 0);
	CU_ASSERT_EQUAL(rps__optim_state_len(RPS_OPT_SGD, 100), 0);
	CU_ASSERT_EQUAL(rps__optim_state_len(RPS_OPT_MOMENTUM, 100), 100);
	CU_ASSERT_EQUAL(rps__optim_state_len(RPS_OPT_ADAM, 100), 200);
	CU_ASSERT_EQUAL(rps__optim_state_len(RPS_OPT_ADAM, 0), 0);
}

static void expect_invalid(struct rps__optim o, const char *what)
{
	int err;

	rps__clearerr();
	err = rps__optim_validate(&o);
	if (err != -EINVAL)
		printf("\n  %s: validate gave %d\n", what, err);
	CU_ASSERT_EQUAL(err, -EINVAL);
	CU_ASSERT(rps__errbuf()[0] != '\0');
}

static void test_validate(void)
{
	struct rps__optim o;

	for (size_t t = 0; t < RPS__ARRAY_SIZE(all_types); t++) {
		o = optim_default(all_types[t]);
		CU_ASSERT_EQUAL(rps__optim_validate(&o), 0);
		o.weight_decay = 1e-4f;
		o.rescale = 0.125f;
		o.lr = 0.0f;
		CU_ASSERT_EQUAL(rps__optim_validate(&o), 0);

		o = optim_default(all_types[t]);
		o.rescale = NAN;
		expect_invalid(o, "rescale NaN");
		o.rescale = 0.0f;
		expect_invalid(o, "rescale 0");
		o.rescale = -1.0f;
		expect_invalid(o, "rescale < 0");
		o.rescale = INFINITY;
		expect_invalid(o, "rescale Inf");
	}
	for (size_t t = 1; t < RPS__ARRAY_SIZE(all_types); t++) {
		o = optim_default(all_types[t]);
		o.lr = -0.1f;
		expect_invalid(o, "lr < 0");
		o.lr = NAN;
		expect_invalid(o, "lr NaN");
		o.lr = INFINITY;
		expect_invalid(o, "lr Inf");
		o = optim_default(all_types[t]);
		o.weight_decay = -1e-4f;
		expect_invalid(o, "wd < 0");
		o.weight_decay = NAN;
		expect_invalid(o, "wd NaN");
	}

	o = optim_default(RPS_OPT_MOMENTUM);
	o.momentum = 1.0f;
	expect_invalid(o, "momentum 1");
	o.momentum = -0.5f;
	expect_invalid(o, "momentum < 0");
	o.momentum = NAN;
	expect_invalid(o, "momentum NaN");
	o.momentum = 0.0f;
	CU_ASSERT_EQUAL(rps__optim_validate(&o), 0);

	o = optim_default(RPS_OPT_ADAM);
	o.beta1 = 1.0f;
	expect_invalid(o, "beta1 1");
	o.beta1 = -0.1f;
	expect_invalid(o, "beta1 < 0");
	o.beta1 = NAN;
	expect_invalid(o, "beta1 NaN");
	o = optim_default(RPS_OPT_ADAM);
	o.beta2 = 1.0f;
	expect_invalid(o, "beta2 1");
	o.beta2 = 1.5f;
	expect_invalid(o, "beta2 > 1");
	o.beta2 = NAN;
	expect_invalid(o, "beta2 NaN");
	o = optim_default(RPS_OPT_ADAM);
	o.eps = 0.0f;
	expect_invalid(o, "eps 0");
	o.eps = -1e-8f;
	expect_invalid(o, "eps < 0");
	o.eps = NAN;
	expect_invalid(o, "eps NaN");
	o.eps = INFINITY;
	expect_invalid(o, "eps Inf");
	o = optim_default(RPS_OPT_ADAM);
	o.beta1 = 0.0f;
	CU_ASSERT_EQUAL(rps__optim_validate(&o), 0);

	o = optim_default(RPS_OPT_SGD);
	o.type = (enum rps_optimizer)0;
	expect_invalid(o, "type 0");
	o.type = (enum rps_optimizer)99;
	expect_invalid(o, "type 99");

	/* SUM ignores the knobs it does not use. */
	o = optim_default(RPS_OPT_SUM);
	o.lr = -1.0f;
	o.eps = 0.0f;
	CU_ASSERT_EQUAL(rps__optim_validate(&o), 0);
	/* ... but never a NaN or an infinity, in any knob of any optimizer */
	for (size_t t = 0; t < RPS__ARRAY_SIZE(all_types); t++) {
		for (int k = 0; k < 7; k++) {
			for (int nan = 0; nan < 2; nan++) {
				float *f[] = { &o.lr, &o.momentum, &o.beta1, &o.beta2, &o.eps, &o.weight_decay,
					       &o.rescale };

				o = optim_default(all_types[t]);
				*f[k] = nan ? NAN : -INFINITY;
				expect_invalid(o, "a knob not finite");
				CU_ASSERT(strstr(rps__errbuf(), "is not a finite number") != NULL);
				CU_ASSERT(strchr(rps__errbuf(), '\n') == NULL);
			}
		}
	}
}

static void test_path_selection(void)
{
	enum rps__optim_path best = rps__optim_best_path();

	CU_ASSERT(best == RPS__OPTIM_BASELINE || best == RPS__OPTIM_AVX2);
#if defined(__x86_64__) && defined(__GNUC__)
	__builtin_cpu_init();
	CU_ASSERT_EQUAL(best, __builtin_cpu_supports("avx2") ? RPS__OPTIM_AVX2 : RPS__OPTIM_BASELINE);
#endif
}

static void test_names(void)
{
	static const char *const bad[] = { "", "rmsprop", "adamw", "sg" };
	enum rps_optimizer t;

	for (size_t i = 0; i < RPS__ARRAY_SIZE(all_types); i++) {
		CU_ASSERT_EQUAL(rps__optim_parse(rps__optim_name(all_types[i]), &t), 0);
		CU_ASSERT_EQUAL(t, all_types[i]);
	}
	CU_ASSERT_EQUAL(rps__optim_parse("ADAM", &t), 0);
	CU_ASSERT_EQUAL(t, RPS_OPT_ADAM);
	CU_ASSERT_STRING_EQUAL(rps__optim_name(RPS_OPT_MOMENTUM), "momentum");
	CU_ASSERT_STRING_EQUAL(rps__optim_name((enum rps_optimizer)42), "?");
	for (size_t i = 0; i < RPS__ARRAY_SIZE(bad); i++) {
		rps__clearerr();
		CU_ASSERT_EQUAL(rps__optim_parse(bad[i], &t), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(rps__errbuf(), "optimizer"));
	}
	CU_ASSERT_EQUAL(rps__optim_parse(NULL, &t), -EINVAL);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "sum = reference, all variants and sizes", test_sum },
		{ "sgd = reference, all variants and sizes", test_sgd },
		{ "momentum = reference, all variants and sizes", test_momentum },
		{ "adam = reference, all variants and sizes", test_adam },
		{ "other hyper-parameters, late steps, specials", test_hyper_and_specials },
		{ "weight decay 0 is skipped exactly", test_zero_decay_is_skipped },
		{ "known values", test_known_values },
		{ "state length", test_state_len },
		{ "validate rejects nonsense", test_validate },
		{ "names", test_names },
		{ "code path selection", test_path_selection },
	};
	const struct cutest_suite suites[] = {
		{ "optim", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	printf("optim code paths: best is %s\n",
	       rps__optim_best_path() == RPS__OPTIM_AVX2 ? "avx2" : "baseline");
	return cutest_run(suites, CUTEST_COUNT(suites));
}
