/*
 * test_rng.h - the unit tests' deterministic random numbers (xorshift64*),
 * so that a failure reproduces.  Define TEST_RNG_SEED before including.
 */
#ifndef RPS_TEST_RNG_H
#define RPS_TEST_RNG_H

#include <stdint.h>

static uint64_t rng_state = TEST_RNG_SEED;

static inline uint64_t rng(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [-a, a) with all 24 mantissa bits random. */
static inline float rng_float(float a)
{
	return (float)((double)(rng() >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a;
}

#endif
