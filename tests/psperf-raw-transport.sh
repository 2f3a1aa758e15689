#!/bin/sh
# psperf -t push --baseline --raw-transport over tcp, short: one 64-byte
# push row.  The tcp transport's own raw ops must have run beside it: the
# WRITE_WITH_IMM ping-pong (64 bytes there, the PUSH_ACK's 48 back: the
# responder answers the immediate with a SEND) and the bare WRITE, each with
# its samples; and the CSV must have as many fields on every line as its
# header.
# Run by `make check`, which sets top_builddir.
set -e
: "${top_builddir:=.}"
psperf=$top_builddir/psperf
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psperf-raw-transport.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
json=$tmp/out.json
fail=0
bad() { echo "FAIL: $*"; fail=1; }
args="--transport tcp -t push -s 64 --workers 1 -W 1 -n 50 --baseline --raw-transport -q"

# shellcheck disable=SC2086
"$psperf" $args -j "$json" >"$tmp/out" 2>&1 || { cat "$tmp/out"; echo "FAIL: psperf exited non-zero"; exit 1; }
cat "$tmp/out"

one='"op": "WRITE_IMM ping-pong", "name": "WRITE_IMM ping-pong 64->48", "a_bytes": 64, "b_bytes": 48'
grep -q "{\"raw\": {$one, \"iters\": 50, \"count\": 50, \"tcp_transport\": true, \"stats\": {\"n\": 50," "$json" ||
	bad "no measured tcp-transport WRITE_IMM ping-pong 64->48 among the JSON's baselines"
grep -q '{"raw": {"op": "WRITE", "name": "WRITE 64", .*"tcp_transport": true, "stats": {"n": 50,' "$json" ||
	bad "no measured tcp-transport WRITE 64 among the JSON's baselines"
grep -q '^ tcp-transport WRITE_IMM ping-pong 64->48  *50 ' "$tmp/out" ||
	bad "the raw table has no row 'tcp-transport WRITE_IMM ping-pong 64->48' of 50 iterations"

# shellcheck disable=SC2086
"$psperf" $args --csv >"$tmp/csv" 2>&1 || { cat "$tmp/csv"; echo "FAIL: psperf --csv exited non-zero"; exit 1; }
awk -F, 'NR == 1 { n = NF } NF != n { print "FAIL: CSV line " NR " has " NF " fields, the header " n; e = 1 }
	END { exit e }' "$tmp/csv" || fail=1
grep -q '^raw,tcp-transport WRITE_IMM ping-pong 64->48,64,48,' "$tmp/csv" || bad "no WRITE_IMM ping-pong line in the CSV"

[ $fail = 0 ] && echo "psperf --raw-transport: the WRITE_IMM ping-pong and WRITE beside the push"
exit $fail
