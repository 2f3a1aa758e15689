#!/bin/sh
# Replicated partitions over verbs: a primary killed (and one restarted)
# while workers push; nothing acknowledged lost or doubled.  Not here (they
# run in `make check`, plain and under the sanitizers): the bounded
# variant of a primary killed mid-push (async and sync run here: the
# replication stream is the same in every mode) and psctl rebalance with
# --rebalance off (--rebalance auto runs here: the same moves).
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_TEST_SKIP="${RPS_TEST_SKIP-bounded: a primary killed mid-push|--rebalance off}" \
	RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_replica
