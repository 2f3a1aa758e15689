#!/bin/sh
# The data plane's ops (RPS__DP_OPS in src/server/dataplane.h) cannot be
# forgotten by the serving threads' table (src/server/threads.c): threads.c
# is compiled (-fsyntax-only, strict C11) against copies of dataplane.h with
# one op added to the list, and
#  1. an op of each generated class (PART, ALL) is that one line: it compiles;
#  2. an op of no class, an ALL op with a result, a PART op with no `part`
#     parameter do not;
#  3. threads.c fills no member of its table by hand and copies no whole
#     table (every member comes from the list).
# Run by `make check`, which sets top_srcdir, top_builddir and CC.
set -e
: "${top_srcdir:=.}" "${top_builddir:=.}"
cc=${CC:-gcc}
fail=0
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/optable.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
hdr=$top_srcdir/src/server/dataplane.h
grep -q '^#define RPS__DP_OPS(X) \\$' "$hdr" || { echo "FAIL: no '#define RPS__DP_OPS(X) \\' line in $hdr"; exit 1; }

# compile threads.c with the line $2 added to the list: 0 if it compiles
with_op() {
	rm -rf "$tmp/inc" && mkdir -p "$tmp/inc/server"
	awk -v line="$2" '{ print } /^#define RPS__DP_OPS\(X\) \\$/ && line != "" { print "\t" line " \\" }' "$hdr" \
		>"$tmp/inc/server/dataplane.h"
	$cc -std=c11 -pedantic -Wall -Wextra -Wno-unused-parameter -Werror -fsyntax-only -DHAVE_CONFIG_H \
		-I"$tmp/inc" -I"$top_builddir" -I"$top_srcdir/include" -I"$top_srcdir/src" \
		"$top_srcdir/src/server/threads.c" >"$tmp/$1.log" 2>&1
}
compiles() { with_op "$1" "$2" || { bad "$1: does not compile:"; sed 's/^/  /' "$tmp/$1.log" | head -20; }; }
refused() { ! with_op "$1" "$2" || bad "$1: compiles: $2"; }

compiles "the list as it is" ""
compiles "a new PART op, one line" "X(PART, int, part_new, (struct rps__server *, srv), (uint32_t, part), (uint64_t, x))"
compiles "a new ALL op, one line" "X(ALL, void, all_new, (struct rps__server *, srv), (const char *, name))"
compiles "a new FIRST op, one line" "X(FIRST, size_t, first_new, (const struct srv_conn *, c))"
refused "an op of no class" "X(void, no_class, (struct rps__server *, srv))"
refused "an op of an unknown class" "X(SOME, void, some_class, (struct rps__server *, srv))"
refused "an ALL op with a result to combine" "X(ALL, int, all_int, (struct rps__server *, srv))"
refused "a PART op with no part" "X(PART, void, part_none, (struct rps__server *, srv), (uint32_t, p))"
refused "a _CUSTOM op nobody wrote" "X(ALL_CUSTOM, int, all_unwritten, (struct rps__server *, srv))"

# 3. no member set by hand, no whole-table copy
threads=$top_srcdir/src/server/threads.c
hits=$(grep -nE 'group_ops\.[a-z_]+[[:space:]]*=|=[[:space:]]*\*one\b' "$threads" || true)
[ -z "$hits" ] || bad "threads.c sets its table by hand: $hits"

[ $fail -eq 0 ] && echo "optable: every op of RPS__DP_OPS is classified, and a new one is one line"
exit $fail
