/*
 * test_parse.c - unit tests of the command-line number parser (src/common/parse.c):
 * every edge the tools used to get wrong (nan, inf, 1e30, negatives that
 * strtoull wraps, overflow, trailing junk) and the error line it leaves;
 * and the test hooks' list (src/common/fault.c), where it is compiled in;
 * and rps__grow (src/common/grow.c), every growing array's step.
 */
#include "config.h"
#include "common/common.h"
#include "common/fault.h"
#include "common/parse.h"
#include "lib/cutest.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t size_ok(const char *s)
{
	uint64_t v = 12345;

	CU_ASSERT_EQUAL(rps__parse_size("--x", s, 0, UINT64_MAX, &v), 0);
	return v;
}

static int size_err(const char *s, uint64_t min, uint64_t max)
{
	uint64_t v = 12345;
	int ret = rps__parse_size("--x", s, min, max, &v);

	CU_ASSERT_EQUAL(v, 12345);	/* untouched on failure */
	return ret;
}

static void test_size_accepts(void)
{
	CU_ASSERT_EQUAL(size_ok("0"), 0);
	CU_ASSERT_EQUAL(size_ok("100"), 100);
	CU_ASSERT_EQUAL(size_ok("4k"), 4096);
	CU_ASSERT_EQUAL(size_ok("4K"), 4096);
	CU_ASSERT_EQUAL(size_ok("64KiB"), 65536);
	CU_ASSERT_EQUAL(size_ok("64KB"), 65536);
	CU_ASSERT_EQUAL(size_ok("1M"), 1u << 20);
	CU_ASSERT_EQUAL(size_ok("1.5M"), 3u << 19);
	CU_ASSERT_EQUAL(size_ok("4G"), 4ull << 30);
	CU_ASSERT_EQUAL(size_ok("2T"), 2ull << 40);
	CU_ASSERT_EQUAL(size_ok("100B"), 100);
	CU_ASSERT_EQUAL(size_ok("1.0"), 1);
	CU_ASSERT_EQUAL(size_ok("18446744073709551615"), UINT64_MAX);
	CU_ASSERT_EQUAL(size_ok("16777215T"), 16777215ull << 40);
	CU_ASSERT_EQUAL(size_ok("007"), 7);
}

static void test_size_refuses(void)
{
	static const char *const bad[] = {
		"", "nan", "NaN", "inf", "INF", "infinity", "1e30", "1e3", "-1", "-0", "+1", " 1", "1 ",
		"0x10", "1.", ".5", "1.5", "0.1K", "1.0000001M", "4KK", "4Q", "4iB", "4Bi", "1,000", "M",
		"1.2.3",
	};
	size_t i;

	for (i = 0; i < RPS__ARRAY_SIZE(bad); i++) {
		int ret = size_err(bad[i], 0, UINT64_MAX);
		if (ret != -EINVAL)
			printf("\n  '%s' -> %d, expected -EINVAL\n", bad[i], ret);
		CU_ASSERT_EQUAL(ret, -EINVAL);
	}
	/* past 2^64-1, with and without a suffix */
	CU_ASSERT_EQUAL(size_err("18446744073709551616", 0, UINT64_MAX), -ERANGE);
	CU_ASSERT_EQUAL(size_err("99999999999999999999999", 0, UINT64_MAX), -ERANGE);
	CU_ASSERT_EQUAL(size_err("16777216T", 0, UINT64_MAX), -ERANGE);
	CU_ASSERT_EQUAL(size_err("17179869184G", 0, UINT64_MAX), -ERANGE);
}

static void test_size_range(void)
{
	uint64_t v = 0;

	CU_ASSERT_EQUAL(rps__parse_size("--shard-size", "64", 64, 1u << 30, &v), 0);
	CU_ASSERT_EQUAL(v, 64);
	CU_ASSERT_EQUAL(rps__parse_size("--shard-size", "1G", 64, 1u << 30, &v), 0);
	CU_ASSERT_EQUAL(v, 1u << 30);
	CU_ASSERT_EQUAL(size_err("63", 64, 1u << 30), -ERANGE);
	CU_ASSERT_EQUAL(size_err("1025M", 64, 1u << 30), -ERANGE);
	CU_ASSERT_EQUAL(rps__parse_size("--shard-size", "inf", 64, 1u << 30, &v), -EINVAL);
	/* one line: the option, the value, the range */
	CU_ASSERT_STRING_EQUAL(rps__errbuf(), "--shard-size 'inf': expected a size from 64 to 1G");
	CU_ASSERT_EQUAL(rps__parse_size("--memory-limit", "100", 8ull << 20, 1ull << 50, &v), -ERANGE);
	CU_ASSERT_STRING_EQUAL(rps__errbuf(), "--memory-limit '100': expected a size from 8M to 1024T");
}

static void test_u64(void)
{
	uint64_t v = 7;

	CU_ASSERT_EQUAL(rps__parse_u64("--n", "0", 0, 10, &v), 0);
	CU_ASSERT_EQUAL(v, 0);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "10", 0, 10, &v), 0);
	CU_ASSERT_EQUAL(v, 10);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "18446744073709551615", 0, UINT64_MAX, &v), 0);
	CU_ASSERT_EQUAL(v, UINT64_MAX);
	v = 7;
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "18446744073709551616", 0, UINT64_MAX, &v), -ERANGE);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "11", 0, 10, &v), -ERANGE);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "0", 1, 10, &v), -ERANGE);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "-1", 0, 10, &v), -EINVAL);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "+1", 0, 10, &v), -EINVAL);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", " 1", 0, 10, &v), -EINVAL);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "1K", 0, 10000, &v), -EINVAL);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "1.0", 0, 10, &v), -EINVAL);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "nan", 0, 10, &v), -EINVAL);
	CU_ASSERT_EQUAL(rps__parse_u64("--n", "", 0, 10, &v), -EINVAL);
	CU_ASSERT_EQUAL(v, 7);
	CU_ASSERT_STRING_EQUAL(rps__errbuf(), "--n '': expected an integer from 0 to 10");
	CU_ASSERT_EQUAL(rps__parse_u64("--spin-us", "4294967295", 0, 1000000, &v), -ERANGE);
	CU_ASSERT_STRING_EQUAL(rps__errbuf(), "--spin-us '4294967295': expected an integer from 0 to 1000000");
}

static void test_size_str(void)
{
	char b[32];

	CU_ASSERT_STRING_EQUAL(rps__size_str(0, b, sizeof(b)), "0");
	CU_ASSERT_STRING_EQUAL(rps__size_str(100, b, sizeof(b)), "100");
	CU_ASSERT_STRING_EQUAL(rps__size_str(1536, b, sizeof(b)), "1536");
	CU_ASSERT_STRING_EQUAL(rps__size_str(1u << 20, b, sizeof(b)), "1M");
	CU_ASSERT_STRING_EQUAL(rps__size_str(3ull << 40, b, sizeof(b)), "3T");
	CU_ASSERT_STRING_EQUAL(rps__size_str(1ull << 50, b, sizeof(b)), "1024T");
	CU_ASSERT_STRING_EQUAL(rps__size_str(UINT64_MAX, b, sizeof(b)), "18446744073709551615");
}

/* Whole names only, numbers only where asked, any place in the list. */
static void test_fault_list(void)
{
	long n = 0;

	rps__fault_set("isolate-signals,bootstrap-replicas-2,kill-mid-push:9");
	CU_ASSERT(rps__fault("isolate-signals"));
	CU_ASSERT(rps__fault("bootstrap-replicas-2"));
	CU_ASSERT(!rps__fault("isolate"));
	CU_ASSERT(!rps__fault("signals"));
	CU_ASSERT(!rps__fault("kill-mid-push"));
	CU_ASSERT(rps__fault_arg("bootstrap-replicas-", &n) && n == 2);
	CU_ASSERT(rps__fault_arg("kill-mid-push:", &n) && n == 9);
	CU_ASSERT(!rps__fault_arg("kill-mid-push", &n));	/* ":9" is no number */
	CU_ASSERT(!rps__fault_arg("isolate-", &n));
	CU_ASSERT(!rps__fault_arg("bootstrap-replicas-2", &n));	/* no digits after it */
	rps__fault_set("repl-break-at-x,repl-break-at-12,no-replica-duty");
	CU_ASSERT(rps__fault_arg("repl-break-at-", &n) && n == 12);
	CU_ASSERT(rps__fault("no-replica-duty"));
	CU_ASSERT(!rps__fault("isolate-signals"));
	rps__fault_set("repl-break-at-99999999999");		/* too long: refused, not wrapped */
	CU_ASSERT(!rps__fault_arg("repl-break-at-", &n));
	rps__fault_set(NULL);
	CU_ASSERT(!rps__fault("no-replica-duty"));
	CU_ASSERT(!rps__fault_arg("repl-break-at-", &n));
}

/* Doubling from `first`, room for `need` at once, elements kept, and a
 * refusal that leaves the array and its capacity as they were. */
static void test_grow(void)
{
	uint64_t *a = NULL;
	uint32_t cap = 0, i;

	CU_ASSERT_EQUAL(rps__grow(&a, &cap, 0, sizeof(*a), 8), 0);
	CU_ASSERT_PTR_NULL(a);			/* nothing needed: nothing allocated */
	CU_ASSERT_EQUAL(cap, 0);
	CU_ASSERT_EQUAL(rps__grow(&a, &cap, 1, sizeof(*a), 8), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_EQUAL(cap, 8);
	for (i = 0; i < 8; i++)
		a[i] = 1000 + i;
	CU_ASSERT_EQUAL(rps__grow(&a, &cap, 8, sizeof(*a), 8), 0);
	CU_ASSERT_EQUAL(cap, 8);		/* full, not over: no growth */
	CU_ASSERT_EQUAL(rps__grow(&a, &cap, 9, sizeof(*a), 8), 0);
	CU_ASSERT_EQUAL(cap, 16);
	CU_ASSERT_EQUAL(rps__grow(&a, &cap, 100, sizeof(*a), 8), 0);
	CU_ASSERT_EQUAL(cap, 128);		/* 16 doubled until 100 fits */
	for (i = 0; i < 8; i++)
		CU_ASSERT_EQUAL(a[i], 1000 + i);
	/* past what a uint32_t count or a size_t byte count can hold */
	CU_ASSERT_EQUAL(rps__grow(&a, &cap, UINT32_MAX, sizeof(*a), 8), -ENOMEM);
	CU_ASSERT_EQUAL(cap, 128);
	CU_ASSERT_EQUAL(rps__grow(&a, &cap, 1u << 31, SIZE_MAX / 1024, 8), -ENOMEM);
	CU_ASSERT_EQUAL(cap, 128);
	CU_ASSERT_EQUAL(a[7], 1007);
	free(a);
	a = NULL;
	cap = 0;
	CU_ASSERT_EQUAL(rps__grow(&a, &cap, 3, sizeof(*a), 0), 0);	/* first 0: from 1 */
	CU_ASSERT_EQUAL(cap, 4);
	free(a);
}

int main(void)
{
	static const struct cutest tests[] = {
		{ "sizes: digits, fractions, K/M/G/T, i, B", test_size_accepts },
		{ "sizes: nan, inf, 1e30, signs, junk, overflow refused", test_size_refuses },
		{ "sizes: min/max and the error line", test_size_range },
		{ "integers: range, signs, junk, overflow", test_u64 },
		{ "sizes printed exactly", test_size_str },
		{ "growing arrays: doubling, room at once, refusal keeps the array", test_grow },
		CUTEST_FAULT("the test hooks' list: whole names, numbers where asked", test_fault_list),
	};
	const struct cutest_suite suites[] = {
		{ "parse", NULL, NULL, NULL, NULL, tests, CUTEST_COUNT(tests) },
	};

	return cutest_run(suites, CUTEST_COUNT(suites));
}
