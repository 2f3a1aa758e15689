/*
 * parse.h - the one parser for sizes and counts given on a command line
 * (rdmapsd, psctl, psperf), so that every tool refuses the same bad input
 * (nan, inf, negatives, overflow, trailing junk) with the same kind of line.
 */
#ifndef RPS_PARSE_H
#define RPS_PARSE_H

#include <stddef.h>
#include <stdint.h>

/*
 * A decimal integer in [min, max].  0, or -EINVAL (not a number) or -ERANGE
 * (outside [min, max], or beyond 2^64-1); on failure the error buffer says
 * "WHAT 'S': expected an integer from MIN to MAX" and *out is untouched.
 */
int rps__parse_u64(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out);

/*
 * A byte count in [min, max]: digits, optionally a fraction and then one of
 * the suffixes K, M, G, T (powers of 1024, either case), optionally followed
 * by "i" and/or "B" (1.5M, 64KiB, 4GB).  The result must be a whole number
 * of bytes.  Returns and reports as rps__parse_u64 ("expected a size").
 */
int rps__parse_size(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* v as the shortest exact "1G", "64K", "100" (for messages); returns buf. */
const char *rps__size_str(uint64_t v, char *buf, size_t len);

#endif
