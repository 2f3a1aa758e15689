#!/bin/sh
# The data-plane integration tests (2 servers x 4 workers) over verbs.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_cluster
