/*
 * cutest.c - the one CUnit main of the test programs (see cutest.h).
 */
#include "config.h"
#include "cutest.h"
#include "tmpdir.h"
#include "common/fsutil.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Every test program keeps the loopback key of the servers it starts
 * without --key (proto/auth.h) in a directory of its own, removed at exit:
 * parallel tests, and the user's own ~/.rdmaps, never meet.  A test that
 * wants another sets RDMAPS_RUNTIME_DIR itself. */
static char runtime_dir[256];
static pid_t runtime_owner;

static void runtime_remove(void)
{
	if (runtime_dir[0] && getpid() == runtime_owner)	/* (forked workers exit too) */
		rps__remove_tree(runtime_dir);
}

static void runtime_init(void)
{
	test_mkdtemp(runtime_dir, sizeof(runtime_dir), "rps-runtime");
	runtime_owner = getpid();
	atexit(runtime_remove);
	setenv("RDMAPS_RUNTIME_DIR", runtime_dir, 1);
}

/* RPS_TEST_ONLY="a|b|c": the tests whose names contain a, b or c. */
static bool name_chosen(const char *name, const char *only)
{
	for (const char *p = only;; p++) {
		const char *bar = strchr(p, '|');
		size_t n = bar ? (size_t)(bar - p) : strlen(p);

		for (const char *q = name; n && strlen(q) >= n; q++)
			if (!strncmp(q, p, n))
				return true;
		if (!bar)
			return false;
		p = bar;
	}
}

/* RPS_TEST_SKIP="a|b": all but the tests whose names contain a or b. */
static const char *skip_filter(void)
{
	const char *skip = getenv("RPS_TEST_SKIP");

	return skip && *skip ? skip : NULL;
}

static const char *only_filter(void)
{
	const char *only = getenv("RPS_TEST_ONLY");

	if (!only || !*only)
		only = getenv("RPS_IT_ONLY");
	return only && *only ? only : NULL;
}

int cutest_require_faults(const char *prog)
{
#ifdef RPS_FAULT_INJECTION
	(void)prog;
	return 0;
#else
	printf("%s: SKIP: %s\n", prog, CUTEST_NO_FAULTS);
	return 77;
#endif
}

/*
 * Each test's wall time, printed after its name ("[12.3 s] "): what a
 * suite's share of CI's budget is spent on (the verbs suites under TCG
 * take minutes).  Every suite's setup and teardown go through these two,
 * which find the suite's own hooks by the running suite.
 */
static const struct cutest_suite *timed_suites;
static size_t timed_nsuites;
static struct timespec test_t0;

static const struct cutest_suite *running_suite(void)
{
	CU_pSuite s = CU_get_current_suite();

	for (size_t i = 0; s && i < timed_nsuites; i++)
		if (!strcmp(timed_suites[i].name, s->pName))
			return &timed_suites[i];
	return NULL;
}

static void timed_setup(void)
{
	const struct cutest_suite *su = running_suite();

	clock_gettime(CLOCK_MONOTONIC, &test_t0);
	if (su && su->setup)
		su->setup();
}

static void timed_teardown(void)
{
	const struct cutest_suite *su = running_suite();
	struct timespec t;

	if (su && su->teardown)
		su->teardown();
	clock_gettime(CLOCK_MONOTONIC, &t);
	printf("[%.1f s] ", (double)(t.tv_sec - test_t0.tv_sec) + (t.tv_nsec - test_t0.tv_nsec) / 1e9);
	fflush(stdout);
}

int cutest_run(const struct cutest_suite *suites, size_t nsuites)
{
	const char *only = only_filter(), *skip = skip_filter();
	unsigned failed, nrun = 0, nskipped = 0;

	runtime_init();
	timed_suites = suites;
	timed_nsuites = nsuites;
	if (CU_initialize_registry() != CUE_SUCCESS) {
		fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
		return 99;
	}
	for (size_t i = 0; i < nsuites; i++) {
		const struct cutest_suite *su = &suites[i];
		CU_pSuite s = CU_add_suite_with_setup_and_teardown(su->name, su->init, su->clean, timed_setup,
								   timed_teardown);

		if (!s)
			goto err;
		for (size_t j = 0; j < su->ntests; j++) {
			if ((only && !name_chosen(su->tests[j].name, only)) ||
			    (skip && name_chosen(su->tests[j].name, skip)))
				continue;
			if (!su->tests[j].fn) {		/* CUTEST_FAULT in a build without them */
				printf("SKIP: %s: %s: %s\n", su->name, su->tests[j].name, CUTEST_NO_FAULTS);
				nskipped++;
				continue;
			}
			if (!CU_add_test(s, su->tests[j].name, su->tests[j].fn))
				goto err;
			nrun++;
		}
	}
	if (!nrun && nskipped) {
		CU_cleanup_registry();
		return 77;
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	if (CU_basic_run_tests() != CUE_SUCCESS)
		goto err;
	failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() + CU_get_number_of_suites_failed();
	CU_cleanup_registry();
	return failed ? 1 : 0;
err:
	fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
	CU_cleanup_registry();
	return 99;
}
