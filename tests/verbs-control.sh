#!/bin/sh
# The control-plane integration tests (3 Raft members, psctl, moves during
# training, checkpoints) over verbs.  Not here: what psctl checks and
# refuses before anything reaches a data path (status output, bad input,
# names under --checkpoint-dir, a garbage ADD_SERVER uri, transfer-leader):
# the same code whatever the transport, run by `make check` twice (plain
# and under the sanitizers).
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
# Under TCG a test can take minutes when the host is busy: a longer watchdog.
RPS_TEST_SKIP="${RPS_TEST_SKIP-status: one leader|bad input|checkpoint names stay|garbage uri|transfer-leader}" \
	RPS_IT_WATCHDOG_S=${RPS_IT_WATCHDOG_S:-300} RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_control
