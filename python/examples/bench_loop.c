/*
 * bench_loop.c - the C side of python/examples/bench.py: n pushes (or
 * pulls) of one buffer back to back through the same librdmaps calls the
 * Python package makes, timed in C.  bench.py compiles it at run time
 * (cc -shared) and loads it into its own process beside the package, so
 * both loops use one client, one tensor and one buffer.
 */
#include <stddef.h>
#include <time.h>

#include "rdmaps.h"

double rps_bench_loop(rps_tensor_t *t, void *buf, size_t nbytes, int n, int pull);

/* Seconds for the n calls, or the failing call's negative errno. */
double rps_bench_loop(rps_tensor_t *t, void *buf, size_t nbytes, int n, int pull)
{
	struct timespec a, b;
	int i, ret;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (i = 0; i < n; i++) {
		ret = pull ? rps_pull(t, buf, nbytes, NULL) : rps_push(t, buf, nbytes);
		if (ret)
			return ret;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
}
