#!/bin/sh
# The Raft group over verbs: three rdmapsd on the RDMA device (rxe0 in the
# Soft-RoCE VM of make check-rxe) elect a leader and agree on it, commit
# shard-map changes (psctl move), elect a new leader after kill -9 of the
# old one, and the killed server catches up after a restart on its data dir.
# Then the commit latency of one log entry (psperf -t commit) beside the raw
# SEND/RECV latency of ib_send_lat on the same device: printed, never failed
# on (the VM's absolute times mean nothing; the ratio is the figure).
# Waits poll the cluster's status against a deadline; no fixed sleeps.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
set -u
dev=$(rdma link show 2>/dev/null | awk '{print $2}' | cut -d/ -f1 | head -1)
dir=$(mktemp -d "${TMPDIR:-/tmp}/verbs-raft.XXXXXX") || exit 99
base=$((20000 + $$ % 20000))
port0=$base port1=$((base + 1)) port2=$((base + 2))
cluster="verbs://$addr:$port0,verbs://$addr:$port1,verbs://$addr:$port2"
pid0= pid1= pid2=
WAIT_S=${RPS_RAFT_WAIT_S:-120}	# deadline of each wait (TCG is slow)

cleanup() {
	for p in $pid0 $pid1 $pid2; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$dir" /tmp/verbs-raft-pt.$$.*
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
	echo "FAIL: $*"
	for i in 0 1 2; do
		echo "--- rdmapsd $i (verbs://$addr:$((base + i))), last lines of its log"
		tail -n 15 "$dir/log$i" 2>/dev/null
	done
	exit 1
}

start() {	# start INDEX: rdmapsd number INDEX (member id INDEX+1) on its data dir
	./rdmapsd --listen "verbs://$addr:$((base + $1))" --cluster "$cluster" --index "$1" \
		--data-dir "$dir/d$1" --fsync none --partitions 8 --replicas 1 >>"$dir/log$1" 2>&1 &
	eval "pid$1=$!"
}

# "id role term applied" for every member that answers, from psctl --json status
members() {
	printf '%s\n' "$1" |
		grep -o '"id":[0-9]*,"uri":"[^"]*","reachable":true,"role":"[a-z]*","term":[0-9]*,"commit":[0-9]*,"applied":[0-9]*' |
		sed 's/"id":\([0-9]*\),"uri":"[^"]*","reachable":true,"role":"\([a-z]*\)","term":\([0-9]*\),"commit":[0-9]*,"applied":\([0-9]*\)/\1 \2 \3 \4/'
}

owner_of() {	# owner_of PART JSON: the partition's owner in the leader's map
	printf '%s\n' "$2" | grep -o "\"partition\":$1,\"owner\":[0-9]*,\"epoch\":[0-9]*,\"moving_to\":0" |
		sed 's/.*"owner":\([0-9]*\).*/\1/'
}

status() { ./psctl -s "$cluster" --timeout 5 --json status 2>"$dir/psctl.err"; }

# look: one psctl status; sets js (the JSON), m (the answering members'
# lines), n (how many), nl (leaders), nt (distinct terms), na (distinct
# applied indexes), leader, term, applied (the first member's)
look() {
	js=$(status)
	m=$(members "$js")
	n=$(printf '%s\n' "$m" | grep -c .)
	nl=$(printf '%s\n' "$m" | grep -c ' leader ')
	nt=$(printf '%s\n' "$m" | awk 'NF {print $3}' | sort -u | grep -c .)
	na=$(printf '%s\n' "$m" | awk 'NF {print $4}' | sort -u | grep -c .)
	leader=$(printf '%s\n' "$m" | awk '$2 == "leader" {print $1; exit}')
	term=$(printf '%s\n' "$m" | awk 'NF {print $3; exit}')
	applied=$(printf '%s\n' "$m" | awk 'NF {print $4; exit}')
}

# until N members answer, all in one term, with one leader (not member NOT)
agreed() { [ "$n" -ge "$1" ] && [ "$nl" -eq 1 ] && [ "$nt" -eq 1 ] && [ "$leader" != "$2" ]; }
# --replicas 1: the bootstrap map's backups (R = 2 from 2 servers on) are
# dropped, one epoch each; moves wait for that (a move names the epoch)
unreplicated() { ! printf '%s\n' "$js" | grep -q '"backups"'; }

# until WHAT (a shell condition) holds after a look, or the deadline
poll() {
	deadline=$(($(date +%s) + WAIT_S))
	while :; do
		look
		eval "$1" && return 0
		if [ "$(date +%s)" -ge "$deadline" ]; then
			echo "after ${WAIT_S}s, not ($1): $n member(s) answer, $nl leader(s), $nt term(s), $na applied index(es):"
			printf '%s\n' "$m" | sed 's/^/  id role term applied: /'
			cat "$dir/psctl.err"
			return 1
		fi
		sleep 0.2	# poll interval
	done
}

# move PART TO, then wait until the leader's map shows TO as its owner
move() {
	./psctl -s "$cluster" --timeout 60 move "$1" "$2" || fail "psctl move $1 $2"
	poll "[ \"\$(owner_of $1 \"\$js\")\" = $2 ]" || fail "partition $1 did not reach member $2"
	echo "partition $1 is on member $2"
}

echo "== 3 rdmapsd over verbs on $dev ($cluster), data in $dir"
for i in 0 1 2; do start $i; done
poll 'agreed 3 0 && unreplicated' || fail "no leader that all three agree on, at 1 copy"
echo "leader: member $leader, term $term; every member agrees:"
printf '%s\n' "$m" | sed 's/^/  id role term applied: /'

# commit: partition 0 to a follower that does not own it (it survives what follows)
own=$(owner_of 0 "$js")
to=$(printf '%s\n' "$m" | awk -v l="$leader" -v o="$own" '$1 != l && $1 != o {print $1; exit}')
[ -n "$own" ] && [ -n "$to" ] || fail "cannot read partition 0's owner from psctl status"
move 0 "$to"

# kill -9 the leader; a new one among the other two
old=$leader
oldterm=$term
eval "p=\$pid$((old - 1))"
echo "== kill -9 the leader, member $old (pid $p)"
kill -9 "$p"
wait "$p" 2>/dev/null
eval "pid$((old - 1))="
poll "agreed 2 $old" || fail "no new leader after the leader died"
[ "$term" -gt "$oldterm" ] || fail "new leader $leader in term $term, not after term $oldterm"
echo "new leader: member $leader, term $term"

# commit again: partition 0 from its owner (alive) to the other live member
own=$(owner_of 0 "$js")
to=$(printf '%s\n' "$m" | awk -v o="$own" -v d="$old" 'NF && $1 != o && $1 != d {print $1; exit}')
[ -n "$to" ] || fail "no live member to move partition 0 to"
move 0 "$to"
look
want=$(printf '%s\n' "$m" | awk -v l="$leader" '$1 == l {print $4}')

# restart the killed server on its data dir: it must catch up
echo "== restart member $old on its data dir"
start $((old - 1))
poll "agreed 3 0 && [ \$na -eq 1 ] && [ \$applied -ge ${want:-1} ]" || fail "member $old did not catch up"
echo "caught up: all three at applied index $applied, term $term, leader $leader"
printf '%s\n' "$m" | sed 's/^/  id role term applied: /'
[ "$(owner_of 0 "$js")" = "$to" ] || fail "partition 0 lost its move: owner $(owner_of 0 "$js"), not $to"

# ---- figures: the commit latency beside raw SEND/RECV (printed, not judged)
rc=0
echo "== psperf -t commit against these three rdmapsd (fsync none)"
./psperf -t commit --connect "$cluster" -n 200 -q >"$dir/connect.out" 2>&1 || rc=1
cat "$dir/connect.out"
for p in $pid0 $pid1 $pid2; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
pid0= pid1= pid2=
echo "== psperf -t commit, local cluster over verbs, with its raw SEND ping-pong"
./psperf -t commit --transport verbs --addr "$addr" --fsync none -n 200 --baseline -q >"$dir/local.out" 2>&1 || rc=1
cat "$dir/local.out"
# (no busy-polling variant: 3 spinning servers and a spinning client on the
# VM's 2 vCPUs starve each other and take minutes)
st=
if command -v ib_send_lat >/dev/null 2>&1 && [ -n "$dev" ]; then
	echo "== ib_send_lat on $dev ($addr): 304 B (the admin reply) and 8 B"
	for size in 304 8; do
		ib_send_lat -d "$dev" -n 1000 -s $size >/tmp/verbs-raft-pt.$$.srv 2>&1 &
		spid=$!
		i=0
		until ib_send_lat -d "$dev" -n 1000 -s $size "$addr" >/tmp/verbs-raft-pt.$$.cli 2>&1; do
			i=$((i + 1))
			[ $i -ge 20 ] && { echo "ib_send_lat failed"; cat /tmp/verbs-raft-pt.$$.cli; rc=1; break; }
			sleep 0.5	# the server is not listening yet: retry
		done
		wait $spid 2>/dev/null
		grep -E '^ *#bytes|^ *[0-9]' /tmp/verbs-raft-pt.$$.cli | sed 's/^/ib_send_lat /'
		[ $size = 304 ] && st=$(awk '$1 == 304 {print $5; exit}' /tmp/verbs-raft-pt.$$.cli)
	done
else
	echo "perftest not installed or no device name: ib_send_lat skipped (apt-get install perftest)"
fi
# t_typ of a commit row: the column after #iters, t_min
ct=$(awk '/^ commit \(fsync/ {print $6; exit}' "$dir/connect.out")
lt=$(awk '/^ commit \(fsync/ {print $6; exit}' "$dir/local.out")
sp=$(awk '/^ SEND ping-pong/ {print $6; exit}' "$dir/local.out")
echo "== commit latency (t_typ, us) against raw SEND/RECV"
echo "ib_send_lat 304 B t_typical ${st:-?} us is half a round trip: round trip $(awk -v s="${st:-0}" 'BEGIN {print 2 * s}') us"
for x in "rdmapsd x3 (--connect):${ct:-}:${sp:-}" "psperf local x3:${lt:-}:${sp:-}"; do
	name=${x%%:*} t=${x#*:} p=${t#*:} t=${t%%:*}
	awk -v n="$name" -v t="${t:-0}" -v s="${st:-0}" -v p="${p:-0}" 'BEGIN {
		printf "%s: commit %s us; / ib_send_lat round trip %s; / ib_send_lat t_typical %s; / psperf SEND ping-pong %s\n",
			n, t, (s > 0 && t > 0) ? sprintf("%.2f", t / (2 * s)) : "-",
			(s > 0 && t > 0) ? sprintf("%.2f", t / s) : "-", (p > 0 && t > 0) ? sprintf("%.2f", t / p) : "-" }'
done
exit $rc
