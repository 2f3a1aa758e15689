#!/bin/sh
# The replication stream between two in-process servers over verbs.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/test_repl
