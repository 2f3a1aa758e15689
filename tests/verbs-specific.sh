#!/bin/sh
# Verbs-only tests: memlock, killed peers, multi-process atomics, RNR bursts.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_TEST_ADDR=$addr exec ./tests/test_verbs
