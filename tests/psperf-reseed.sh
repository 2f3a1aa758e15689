#!/bin/sh
# psperf -t reseed over tcp, short: 2 in-process servers, 2 partitions,
# R=2, 64 KiB of parameters, one raise.  The JSON must carry the row with
# the bytes seeded and partitions seeded (exact), a rate > 0, the raw
# bandwidth measured in the same run > 0 and the ratio of the two > 0.
# Run by `make check`, which sets top_builddir.
set -e
: "${top_builddir:=.}"
psperf=$top_builddir/psperf
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psperf-reseed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
json=$tmp/out.json
fail=0
bad() { echo "FAIL: $*"; fail=1; }

"$psperf" --transport tcp --servers 2 --replicas 2 --partitions 2 -t reseed -s 64K -q -j "$json" \
	>"$tmp/out" 2>&1 || { cat "$tmp/out"; echo "FAIL: psperf -t reseed exited non-zero"; exit 1; }
cat "$tmp/out"

# The first value of "key": in the JSON ("" when absent).
val() { grep -o "\"$1\": [^,}]*" "$json" | head -n 1 | sed 's/^[^:]*: //'; }
# Is $1 a number above 0 (null, empty: no)?
positive() { awk -v v="$1" 'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 > 0) }'; }

[ "$(val test)" = '"reseed"' ] || bad "the row's test is '$(val test)', not \"reseed\""
[ "$(val bytes)" = 65536 ] || bad "bytes: '$(val bytes)', not 65536"
[ "$(val seeded_bytes)" = 65536 ] || bad "seeded_bytes: '$(val seeded_bytes)', not 65536 (64 KiB * (R-1))"
[ "$(val partitions_seeded)" = 2 ] || bad "partitions_seeded: '$(val partitions_seeded)', not 2"
[ "$(val raises)" = 1 ] || bad "raises: '$(val raises)', not 1"
for k in t_typical_s rate_gbs raw_gbs x_bw x_read; do
	positive "$(val $k)" || bad "$k: '$(val $k)', not a number above 0"
done
grep -q '"raw_read_bandwidth": {"op": "READ bw"' "$json" || bad "no tcp transport READ bandwidth in the row"
grep -q '^ 65536  *1  *2 ' "$tmp/out" || bad "the table has no row '65536, 1 raise, 2 partitions'"

[ $fail = 0 ] && echo "psperf -t reseed: every field present and right"
exit $fail
