#!/bin/sh
# Replicated partitions over verbs: a primary killed (and one restarted)
# while workers push; nothing acknowledged lost or doubled.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_replica
