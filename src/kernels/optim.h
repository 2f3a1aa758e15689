/*
 * optim.h - the per-tensor optimizers the server applies to its fp32
 * parameters once a gradient (sync: the sum over workers) is complete.
 *
 * The arithmetic is pinned down to the operation so that the server's
 * results are bit-identical to a single-process reference (sync mode) and
 * across code paths.  Per element, in fp32, evaluated as these C
 * expressions (left to right, every operation rounded to fp32, no fused
 * multiply-add: the project builds with -std=c11, hence -ffp-contract=off):
 *
 *   g' = (rescale == 1.0f) ? g : rescale * g
 *   d  = (wd == 0.0f) ? g' : g' + wd * p                 (SGD, MOMENTUM, ADAM)
 *
 *   SUM:       p = p + g'
 *   SGD:       p = p - lr * d
 *   MOMENTUM:  v = mu * v + d;
 *              p = p - lr * v
 *   ADAM:      m = b1 * m + (1.0f - b1) * d;
 *              v = b2 * v + (1.0f - b2) * d * d;          i.e. ((1-b2)*d)*d
 *              p = p - lr * (m / bc1) / (sqrtf(v / bc2) + eps)
 *                                                  i.e. (lr*(m/bc1)) / (...)
 *     with, once per call, bc1 = (float)(1.0 - pow((double)b1, (double)step))
 *     and bc2 likewise from b2; (1.0f - b1) and (1.0f - b2) are fp32.
 *
 * SUM uses only rescale; wd == 0 skips the decay term exactly (so an Inf
 * parameter does not turn the gradient into NaN through 0 * Inf).
 *
 * State, beside the n parameters, zero at creation: MOMENTUM keeps v[n];
 * ADAM keeps m[n] then v[n] (state[0..n) and state[n..2n)).
 */
#ifndef RPS_OPTIM_H
#define RPS_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "rdmaps.h"

struct rps__optim {		/* hyper-parameters, fixed at tensor creation */
	enum rps_optimizer type;
	float lr, momentum, beta1, beta2, eps, weight_decay, rescale;
};

/* Floats of state beside n parameters: 0 SUM/SGD, n MOMENTUM, 2n ADAM. */
size_t rps__optim_state_len(enum rps_optimizer type, size_t n);

/*
 * Apply one update to n parameters p with gradient g (fp32), as defined
 * above.  state holds rps__optim_state_len() floats (may be NULL when that
 * is 0).  step is the 1-based count of updates applied to these parameters
 * including this one (Adam's bias correction; 0 is taken as 1).  p, g and
 * state must not overlap.  Thread-safe: no state outside the arguments.
 */
void rps__optim_apply(const struct rps__optim *o, float *restrict p, const float *restrict g,
		      float *restrict state, size_t n, uint64_t step);

/*
 * Code paths, for tests and benchmarks: the same loops compiled for the
 * build's baseline (SSE2 on x86-64) and, on x86 CPUs that have it, for AVX2.
 * rps__optim_apply() takes the best (decided once per process); every path
 * gives the same bits.  Asking for a path the CPU lacks runs the baseline.
 */
enum rps__optim_path {
	RPS__OPTIM_BASELINE = 0,
	RPS__OPTIM_AVX2 = 1,
};
enum rps__optim_path rps__optim_best_path(void);
void rps__optim_apply_path(enum rps__optim_path path, const struct rps__optim *o,
			   float *restrict p, const float *restrict g, float *restrict state,
			   size_t n, uint64_t step);

/* 0, or -EINVAL with a message for nonsense: an unknown type; a NaN or Inf
 * among the parameters the type uses; lr < 0; momentum, beta1 or beta2
 * outside [0, 1); eps <= 0 (Adam); weight_decay < 0; rescale <= 0. */
int rps__optim_validate(const struct rps__optim *o);

/* "sum", "sgd", "momentum", "adam"; "?" for an unknown type. */
const char *rps__optim_name(enum rps_optimizer type);
/* The names above, any case.  0, or -EINVAL with a message. */
int rps__optim_parse(const char *s, enum rps_optimizer *out);

#endif
