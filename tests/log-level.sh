#!/bin/sh
# RDMAPS_LOG_LEVEL (rdmaps(3) ENVIRONMENT): debug prints the library's
# own account (here, the shard map reads); the default prints none of it;
# a word it does not know is said once, naming the variable, and ignored.
# psperf over tcp with one in-process server is the client.
# Run by `make check`, which sets top_builddir.
: "${top_builddir:=.}"
psperf=$top_builddir/psperf
tmp=$(mktemp -d "${TMPDIR:-/tmp}/log-level.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
run() { RDMAPS_LOG_LEVEL=$1 "$psperf" --transport tcp -t push -s 4K -n 10 -q >"$tmp/out" 2>"$tmp/err" ||
	{ cat "$tmp/out" "$tmp/err"; bad "psperf with RDMAPS_LOG_LEVEL=$1 exited non-zero"; }; }

run debug
grep -q "^debug: .*shard map read: entry [0-9]*" "$tmp/err" || { cat "$tmp/err"; bad "debug: no 'shard map read' line"; }
run ""
grep -q "^debug:" "$tmp/err" && { cat "$tmp/err"; bad "the default printed debug lines"; }
run warn
grep -q "^debug:" "$tmp/err" && { cat "$tmp/err"; bad "warn printed debug lines"; }
run loud
[ "$(grep -c "RDMAPS_LOG_LEVEL=loud: say error, warn, info or debug: ignored" "$tmp/err")" = 1 ] ||
	{ cat "$tmp/err"; bad "an unknown level was not said exactly once"; }
grep -q "^debug:" "$tmp/err" && bad "an unknown level changed the level"
exit $fail
