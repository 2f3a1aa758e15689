#!/bin/sh
# The data plane over verbs with --threads 2: every serving thread has its
# own device context, CQs, QPs and registered shards, and a worker holds a
# connection to each.  What runs is what moves data through those: every
# mode exact, contention and chains, groups, registered buffers, HOLD,
# workers and servers killed.  verbs-cluster.sh runs the whole suite over
# verbs with one thread; the plain and sanitizer passes of `make check`
# run the whole suite with 1 and 2 threads over TCP (what the rest checks,
# the command line, malformed input, rank bookkeeping, does not depend on
# the thread count and the transport both: "exact" would take in a rank's
# connections lost while it lives, which is bookkeeping, so it is skipped).
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_TEST_ONLY="${RPS_TEST_ONLY:-bit-identical|exact|groups|contended|windows|staleness|several tensors|killed|stalled|crossed|--threads 3|registered buffers|HOLD|timed-out}" \
	RPS_TEST_SKIP="${RPS_TEST_SKIP-a rank whose connections go}" \
	RPS_IT_THREADS=2 RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_cluster
