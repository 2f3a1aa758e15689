/*
 * cutest.h - the one CUnit main of the test programs: each program lists
 * its suites as tables of {name, function} and hands them to cutest_run,
 * which registers them, runs them verbosely and turns the result into an
 * exit status automake understands.
 *
 * RPS_TEST_ONLY=text (or RPS_IT_ONLY=text, its older name in it_control)
 * runs only the tests whose names contain text.
 */
#ifndef RPS_TESTS_CUTEST_H
#define RPS_TESTS_CUTEST_H

#include <CUnit/Basic.h>
#include <stddef.h>

struct cutest {
	const char *name;
	CU_TestFunc fn;
};

struct cutest_suite {
	const char *name;
	CU_InitializeFunc init;		/* once before the suite, may be NULL */
	CU_CleanupFunc clean;		/* once after it, may be NULL */
	CU_SetUpFunc setup;		/* before each test, may be NULL */
	CU_TearDownFunc teardown;	/* after each test, may be NULL */
	const struct cutest *tests;
	size_t ntests;
};

#define CUTEST_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Tests of the test hooks (src/common/fault.h, RPS_FAULT), which only a
 * build configured with --enable-fault-injection (config.h's
 * RPS_FAULT_INJECTION) compiles in.  Without them, a program with some
 * such tests lists each as CUTEST_FAULT(name, fn): cutest_run leaves it
 * out and says so (and exits 77, SKIP, if that leaves nothing to run); a
 * program that needs them throughout returns cutest_require_faults(name)
 * from main first when it is not 0. */
#define CUTEST_NO_FAULTS "built without --enable-fault-injection: configure with it to run this test"
#ifdef RPS_FAULT_INJECTION
#define CUTEST_FAULT(name, fn) { name, fn }
#else
#define CUTEST_FAULT(name, fn) { name, 0 ? (fn) : NULL }	/* (fn still compiles) */
#endif

/* 0 in a build with the hooks; else 77 (SKIP), having said why. */
int cutest_require_faults(const char *prog);

/* Register and run the suites.  Returns the exit status for main: 0 when
 * everything passed, 1 when an assertion, a test or a suite's init or
 * clean-up failed (not the count: 77 and 99 mean SKIP and ERROR to
 * automake, and counts wrap at 256), 99 when CUnit itself failed. */
int cutest_run(const struct cutest_suite *suites, size_t nsuites);

/* The common case: one suite. */
static inline int cutest_run1(const char *name, CU_InitializeFunc init, CU_CleanupFunc clean,
			      CU_SetUpFunc setup, CU_TearDownFunc teardown, const struct cutest *tests,
			      size_t ntests)
{
	const struct cutest_suite s = { name, init, clean, setup, teardown, tests, ntests };

	return cutest_run(&s, 1);
}

#endif
