#!/bin/sh
# The control-plane integration tests (3 Raft members, psctl, moves during training) over verbs.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_control
