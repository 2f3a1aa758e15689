#!/bin/sh
# Replicated partitions over verbs: a primary killed (and one restarted)
# while workers push; nothing acknowledged lost or doubled.  Not here (they
# run in `make check`, plain and under the sanitizers): the async and
# bounded variants of a primary killed mid-push (sync runs here, and async
# in "a primary restarted at once", which kills it mid-push the same way
# before restarting it: the replication stream is the same in every
# mode); psctl rebalance, --rebalance off and auto (the leader's choice of
# moves; verbs-control moves partitions under sync training); the sync
# variant of a backup's stream broken (the async one runs here: the same
# stream and the same drop); a client refused after waiting for a failover
# that does not come (its wait is the client's clock, not the transport's).
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_TEST_SKIP="${RPS_TEST_SKIP-async: a primary killed mid-push|bounded: a primary killed mid-push|--rebalance|alive: every step|not failed over: refused}" \
	RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_replica
