#!/bin/sh
# Failover over verbs: the scenarios of it_failover (a sync Adam job whose
# primary is killed mid-step, bit-identical to a run without the kill; the
# Raft leader killed; a kill during re-replication; replicas' bytes equal).
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_failover
