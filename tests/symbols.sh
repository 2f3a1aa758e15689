#!/bin/sh
# Every extern symbol of the product is used outside the file that defines
# it: an internal function or variable that only its own file calls is
# static there (the issue of exported-but-private helpers: a header that
# promises more than the code uses).  Public rps_* names (the API,
# include/rdmaps.h) are exempt; rps__* (internal) are not.  Users are the
# product's other objects and the test programs' (tests drive internal
# hooks).  Run by `make check` after the build (top_builddir).
set -e
: "${top_builddir:=.}"
cd "$top_builddir"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/symbols.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# the product's objects, from the archives the build links (no stale .o)
libs=$(ls src/*/.libs/librps_*.a src/*/*/.libs/librps_*.a verbs/.libs/librps_*.a 2>/dev/null || true)
[ -n "$libs" ] || { echo "symbols.sh: no internal library built under $top_builddir: build first"; exit 1; }
progs=$(ls src/programs/*.o perf/*.o 2>/dev/null || true)
users=$(ls tests/*.o tests/lib/.libs/*.o tests/lib/*.o 2>/dev/null || true)
# "file symbol" per defined extern symbol (nm -A: archive[member]: ...)
for f in $libs $progs; do
	nm -A -g --defined-only "$f" 2>/dev/null | awk '$(NF-1) ~ /^[TDBRC]$/ { sub(/:[^:]*$/, "", $1); print $1, $NF }'
done | sort -u >"$tmp/def"
for f in $libs $progs $users; do
	nm -A -u "$f" 2>/dev/null | awk '{ sub(/:[^:]*$/, "", $1); print $1, $NF }'
done | sort -u >"$tmp/use"
fail=0
while read -r file sym; do
	case $sym in
	rps__*) ;;
	rps_* | main) continue ;;
	__* | .*) continue ;;	# the compiler's and sanitizers' (__odr_asan.NAME under ASan)
	esac
	# used by any file other than its own?
	if ! awk -v s="$sym" -v f="$file" '$2 == s && $1 != f { found = 1; exit } END { exit !found }' "$tmp/use"; then
		echo "FAIL: $sym ($file) is extern but nothing outside its file uses it: make it static (or drop it)"
		fail=1
	fi
done <"$tmp/def"
[ $fail = 0 ] && echo "symbols: every extern internal symbol is used outside its file"
exit $fail
