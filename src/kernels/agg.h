/*
 * agg.h - gradient aggregation on the server: widening bf16 / fp16 / fp32
 * gradients to fp32 and summing them into an fp32 accumulator.
 *
 * Contract that the sync mode relies on: rps__agg_add() performs exactly one
 * IEEE binary32 addition per element, acc[i] = acc[i] + widen(src[i]), so
 * its result is bit-identical whichever code path (scalar, portable vector,
 * AVX2/F16C) runs, and summing workers in rank order on the server gives the
 * same bits as a single-process reference doing the same loop.  The only
 * freedom left is which payload a NaN result carries when both operands are
 * NaNs (IEEE leaves it open; training is already lost by then).
 *
 * Widening is exact:
 *  - bf16 -> fp32 is the 16-bit shift: every bit kept, a signalling NaN
 *    stays a signalling NaN bit pattern (any arithmetic on it quiets it).
 *  - fp16 -> fp32 is exact for every value including subnormals; a NaN keeps
 *    its payload and comes out quiet (as the F16C instruction does, so all
 *    paths agree).  Independent of the MXCSR DAZ/FTZ modes.
 * Narrowing (fp32 -> bf16 / fp16) rounds to nearest, ties to even; values
 * past the largest finite overflow to Inf; a NaN stays a NaN, made quiet,
 * keeping the top bits of its payload; signs of zeros are kept.
 *
 * Sources may sit at any byte offset (they come straight from network
 * buffers); n may be 0.  acc / dst and src must not overlap.
 *
 * The files of src/kernels/ (tests/filemaps.sh checks that this names
 * each): agg.c, the aggregation of this header; optim.c, the optimizers
 * (optim.h).
 */
#ifndef RPS_AGG_H
#define RPS_AGG_H

#include <stddef.h>
#include <stdint.h>

#include "rdmaps.h"

/* Scalar conversions (the definitions every vector path must match). */
float rps__bf16_to_f32(uint16_t h);
uint16_t rps__f32_to_bf16(float f);
float rps__f16_to_f32(uint16_t h);
uint16_t rps__f32_to_f16(float f);

/* dst[i] = (float)src[i], for i < n. */
void rps__agg_copy(float *dst, const void *src, enum rps_dtype dt, size_t n);
/* acc[i] = acc[i] + (float)src[i], one fp32 addition per element. */
void rps__agg_add(float *acc, const void *src, enum rps_dtype dt, size_t n);
/* dst[i] = (dt)src[i] (round to nearest even); dst may be unaligned. */
void rps__f32_to_dtype(void *dst, const float *src, enum rps_dtype dt, size_t n);

/* Bytes per element: 4, 2, 2; 0 for an unknown dtype. */
size_t rps__dtype_size(enum rps_dtype dt);
/* "f32", "bf16", "f16"; "?" for an unknown dtype. */
const char *rps__dtype_name(enum rps_dtype dt);
/* Accepts "f32" / "fp32" / "float32", "bf16" / "bfloat16",
 * "f16" / "fp16" / "float16" (any case).  0, or -EINVAL with a message. */
int rps__dtype_parse(const char *s, enum rps_dtype *out);

/*
 * Code paths.  rps__agg_copy/add pick the best one the CPU supports (decided
 * once per process); tests and benchmarks name one explicitly to check that
 * every path gives the same bits.  Asking for a path the CPU lacks runs the
 * best available one below it.
 */
enum rps__agg_isa {
	RPS__AGG_SCALAR = 0,	/* plain C, one element at a time */
	RPS__AGG_VECTOR = 1,	/* GCC vector extensions (SSE2 on x86-64, NEON...) */
	RPS__AGG_AVX2 = 2,	/* x86 AVX2 + F16C */
};
#define RPS__AGG_NISA 3

enum rps__agg_isa rps__agg_best_isa(void);
int rps__agg_isa_available(enum rps__agg_isa isa);
const char *rps__agg_isa_name(enum rps__agg_isa isa);
void rps__agg_copy_isa(enum rps__agg_isa isa, float *dst, const void *src,
		       enum rps_dtype dt, size_t n);
void rps__agg_add_isa(enum rps__agg_isa isa, float *acc, const void *src,
		      enum rps_dtype dt, size_t n);

#endif
