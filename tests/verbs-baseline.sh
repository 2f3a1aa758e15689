#!/bin/sh
# Raw verbs baselines (perftest) beside rdmaps' own figures (psperf), in one
# run on one device: the ratios psperf and perf/RESULTS.md quote.
# Prints; fails only if a tool that is present fails.
. "${srcdir:-.}/tests/rxe/verbs-env.sh"
dev=$(rdma link show 2>/dev/null | awk '{print $2}' | cut -d/ -f1 | head -1)
rc=0
run_pair() {	# perftest server in the background, client against it
	"$@" -d "$dev" >/tmp/perftest-server.$$ 2>&1 &
	spid=$!
	i=0
	until "$@" -d "$dev" "$addr" >/tmp/perftest-client.$$ 2>&1; do
		i=$((i + 1))
		[ $i -ge 20 ] && { echo "perftest $1 failed"; cat /tmp/perftest-client.$$; rc=1; break; }
		sleep 0.5	# the server is not listening yet: retry, do not guess
	done
	wait $spid 2>/dev/null
	grep -E '^ *#bytes|^ *[0-9]' /tmp/perftest-client.$$ | sed "s/^/$1 /"
	rm -f /tmp/perftest-server.$$ /tmp/perftest-client.$$
}
if command -v ib_write_lat >/dev/null 2>&1; then
	echo "== perftest on $dev ($addr)"
	run_pair ib_write_lat -n 1000 -s 8
	run_pair ib_atomic_lat -n 1000
	run_pair ib_send_lat -n 1000 -s 8
	run_pair ib_write_bw -n 1000 -s 1048576
else
	echo "perftest not installed: raw baselines skipped (apt-get install perftest)"
fi
echo "== psperf over verbs on $dev ($addr), with its own raw baselines"
./psperf --transport verbs --addr "$addr" -t push,pull,lock -S 8:4K:8 --workers 1 -W 1 -n 300 --baseline || rc=1
./psperf --transport verbs --addr "$addr" -t push -s 1M --workers 1 -n 100 --baseline || rc=1
echo "== psperf push over verbs on $dev, busy-polling (as perftest), beside WRITE_IMM ping-pong and WRITE"
./psperf --transport verbs --addr "$addr" -t push -S 8:4K:8 --workers 1 -W 1 -n 300 --baseline --spin-us 100000 || rc=1
exit $rc
