#!/bin/sh
# The data-plane integration tests (2 servers x 4 workers) over verbs, with
# rdmapsd --threads 2: every shard op goes to its partition's serving
# thread, each with its own queue pairs and completion queue.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_IT_THREADS=2 RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_cluster
