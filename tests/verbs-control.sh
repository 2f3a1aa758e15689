#!/bin/sh
# The control-plane integration tests (3 Raft members, psctl, moves during
# training, checkpoints) over verbs.  Not here: what psctl checks and
# refuses before anything reaches a data path (status output, bad input,
# names under --checkpoint-dir, a garbage ADD_SERVER uri, transfer-leader):
# the same code whatever the transport, run by `make check` twice (plain
# and under the sanitizers).  Nor the variants of a scenario whose
# difference is above the transport: moves under bounded and async
# training (the sync one runs here: a move's shard copy and fence are the
# same in every mode), and two of the three moves cut by the leader's
# death (the one that aborts it runs here); those run in `make check`.
# Nor what is Raft's and psctl's alone once the peers are connected (Raft
# over verbs: verbs-raft.sh, and every test here): a server that joins
# through a follower, a follower cut off and catching up, psctl finding
# the leader past a member cut off.  Nor what happens on the servers' disks
# and in the map alone: the Adam state of a checkpoint restored
# bit-identical (the checkpoint and restore during sync training run
# here), an owner restarted without its partitions, a dead member removed
# by force; nor the two failovers, which verbs-failover.sh runs in full.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
# Under TCG a test can take minutes when the host is busy: a longer watchdog.
RPS_TEST_SKIP="${RPS_TEST_SKIP-status: one leader|bad input|checkpoint names stay|garbage uri|transfer-leader|moves during bounded|moves during async|leader killed while a move waits|leader killed right after a move|joins through a follower|follower cut off|psctl finds the leader|Adam state restored|restarted owner refuses|remove-server --force|failover: a follower killed|failover: the leader killed}" \
	RPS_IT_WATCHDOG_S=${RPS_IT_WATCHDOG_S:-300} RPS_IT_TRANSPORT=verbs RPS_IT_ADDR=$addr exec ./tests/it_control
