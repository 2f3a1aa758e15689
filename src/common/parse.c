/*
 * parse.c - sizes and counts from the command line, parsed by hand rather
 * than with strtod/strtoull: those accept "nan", "inf", "1e30", leading
 * blanks and signs ("-1" is 2^64-1 to strtoull), and casting an out-of-range
 * double to an integer is undefined behaviour.
 */
#include "config.h"
#include "common/common.h"
#include "common/parse.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>

#define FRAC_DIGITS_MAX 6	/* 10^6 * 2^40 still fits in 64 bits */

const char *rps__size_str(uint64_t v, char *buf, size_t len)
{
	static const char units[] = "KMGT";
	int u = -1;

	while (v && u < 3 && v % 1024 == 0) {
		v /= 1024;
		u++;
	}
	if (u < 0)
		snprintf(buf, len, "%" PRIu64, v);
	else
		snprintf(buf, len, "%" PRIu64 "%c", v, units[u]);
	return buf;
}

/* Digits only, no sign, no blanks; -ERANGE past 2^64-1. */
static int digits(const char **sp, uint64_t *out)
{
	const char *s = *sp;
	uint64_t v = 0;
	bool over = false;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	for (; *s >= '0' && *s <= '9'; s++) {
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			over = true;
		else
			v = v * 10 + d;
	}
	*sp = s;
	*out = v;
	return over ? -ERANGE : 0;
}

static int range_err(int err, const char *what, const char *s, const char *kind, const char *lo,
		     const char *hi)
{
	return rps__seterr(err, "%s '%s': expected %s from %s to %s", what, s, kind, lo, hi);
}

int rps__parse_u64(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char lo[24], hi[24];
	const char *p = s;
	uint64_t v = 0;
	int ret;

	ret = digits(&p, &v);
	if (!ret && *p)
		ret = -EINVAL;
	if (!ret && (v < min || v > max))
		ret = -ERANGE;
	if (ret) {
		snprintf(lo, sizeof(lo), "%" PRIu64, min);
		snprintf(hi, sizeof(hi), "%" PRIu64, max);
		return range_err(ret, what, s, "an integer", lo, hi);
	}
	*out = v;
	return 0;
}

static int size_value(const char *s, uint64_t *out)
{
	uint64_t whole, frac = 0, den = 1, mult = 1;
	const char *p = s;
	int ret, n;

	ret = digits(&p, &whole);
	if (ret == -EINVAL)
		return ret;
	if (*p == '.') {
		p++;
		if (*p < '0' || *p > '9')
			return -EINVAL;
		for (n = 0; *p >= '0' && *p <= '9'; p++, n++) {
			if (n >= FRAC_DIGITS_MAX)
				return -EINVAL;
			frac = frac * 10 + (uint64_t)(*p - '0');
			den *= 10;
		}
	}
	switch (*p) {
	case 'k': case 'K': mult = 1ull << 10; p++; break;
	case 'm': case 'M': mult = 1ull << 20; p++; break;
	case 'g': case 'G': mult = 1ull << 30; p++; break;
	case 't': case 'T': mult = 1ull << 40; p++; break;
	default: break;
	}
	if (mult > 1 && *p == 'i')
		p++;
	if (*p == 'B' || *p == 'b')
		p++;
	if (*p)
		return -EINVAL;
	if (frac * mult % den)
		return -EINVAL;	/* not a whole number of bytes */
	if (ret || whole > (UINT64_MAX - frac * mult / den) / mult)
		return -ERANGE;
	*out = whole * mult + frac * mult / den;
	return 0;
}

int rps__parse_size(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char lo[24], hi[24];
	uint64_t v = 0;
	int ret;

	ret = size_value(s, &v);
	if (!ret && (v < min || v > max))
		ret = -ERANGE;
	if (ret)
		return range_err(ret, what, s, "a size", rps__size_str(min, lo, sizeof(lo)),
				 rps__size_str(max, hi, sizeof(hi)));
	*out = v;
	return 0;
}
