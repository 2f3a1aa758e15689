#!/bin/sh
# Replicated partitions over verbs: a primary killed (and one restarted)
# while workers push; nothing acknowledged lost or doubled.  Not here (they
# run in `make check`, plain and under the sanitizers): the bounded
# variant of a primary killed mid-push (async and sync run here: the
# replication stream is the same in every mode) and psctl rebalance with
# --rebalance off (--rebalance auto runs here: the same moves); the sync
# variant of a backup's stream broken (the async one runs here: the same
# stream and the same drop); a client refused after waiting for a failover
# that does not come (its wait is the client's clock, not the transport's).
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_TEST_SKIP="${RPS_TEST_SKIP-bounded: a primary killed mid-push|--rebalance off|alive: every step|not failed over: refused}" \
	RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_replica
