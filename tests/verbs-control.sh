#!/bin/sh
# The control-plane integration tests (3 Raft members, psctl, moves during training) over verbs.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
# Under TCG a test can take minutes when the host is busy: a longer watchdog.
RPS_IT_WATCHDOG_S=${RPS_IT_WATCHDOG_S:-300} RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_control
