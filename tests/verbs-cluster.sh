#!/bin/sh
# The data-plane integration tests (2 servers x 4 workers) over verbs.
# Not here: a dead worker named to the others at R = 2 (37 s under TCG):
# the R = 1 variant runs here, the same death seen through the same
# connections; the replicated step after it is the replication stream's,
# which verbs-replica.sh and verbs-failover.sh run.  `make check` runs both.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_TEST_SKIP="${RPS_TEST_SKIP-sync: a dead worker is named}" \
	RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_cluster
