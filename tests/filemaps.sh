#!/bin/sh
# The file maps stay true (doc/design.md "Source tree").  Every folder of
# sources (src/ and each folder under it, at any depth, verbs/, perf/) that
# holds .c files has one map: the top comment (the /* ... */ block the file
# opens with) of the one file of that folder whose top comment names
# tests/filemaps.sh.  This checks, folder by folder, that:
#  1. exactly one file of the folder carries the map;
#  2. every .c file of the folder is named in it (by its base name);
#  3. every bare name.c in it is a file of the folder (a file of another
#     folder is written with its folder: server/dataplane.c, src/...);
#  4. no two source files (.c or .h) of src/, verbs/ and perf/ share a base
#     name, so that a bare name in a map, a log or a debugger is one file.
# A new folder needs a map of its own; a new, moved or removed file, a line
# in its folder's map.  Run by `make check`, which sets top_srcdir.
set -e
: "${top_srcdir:=.}"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# The top comment of $1: from its first line, if that opens a comment, to
# the line that closes it.
top_comment() {
	awk 'NR == 1 && !/^\/\*/ { exit } { print } /\*\// { exit }' "$1"
}

nfolders=0
for d in $(cd "$top_srcdir" && find src verbs perf -type d | sort); do
	set -- "$top_srcdir/$d"/*.c
	[ -e "$1" ] || continue
	nfolders=$((nfolders + 1))
	map=""
	for f in "$top_srcdir/$d"/*.[ch]; do
		top_comment "$f" | grep -q 'tests/filemaps\.sh' || continue
		[ -z "$map" ] || bad "$d/: two maps, $map and $(basename "$f") (keep one)"
		map=$(basename "$f")
	done
	if [ -z "$map" ]; then
		bad "$d/: no map (the top comment of one of its files naming every .c file and tests/filemaps.sh)"
		continue
	fi
	text=$(top_comment "$top_srcdir/$d/$map")
	for f in "$@"; do
		c=$(basename "$f")
		printf '%s\n' "$text" | grep -Eq "(^|[^A-Za-z0-9_/.-])$(printf '%s' "$c" | sed 's/\./\\./g')([^A-Za-z0-9_]|$)" ||
			bad "$d/$c: not named in its folder's map ($d/$map)"
	done
	for c in $(printf '%s\n' "$text" | grep -oE '(^|[^A-Za-z0-9_/.*-])[A-Za-z0-9_]+\.c([^A-Za-z0-9_]|$)' |
		grep -oE '[A-Za-z0-9_]+\.c' | sort -u); do
		[ -f "$top_srcdir/$d/$c" ] || bad "$d/$map names $c, which is not a file of $d/"
	done
done
dups=$(cd "$top_srcdir" && find src verbs perf -name '*.[ch]' | sed 's|.*/||' | sort | uniq -d)
for c in $dups; do
	bad "$c: one base name for $(cd "$top_srcdir" && find src verbs perf -name "$c" | sort | tr '\n' ' ')(rename one to say what it holds)"
done
[ "$nfolders" -gt 8 ] || bad "found only $nfolders folders of sources"
[ $fail -eq 0 ] && echo "filemaps: every .c file of $nfolders folders named in its folder's map; every base name unique"
exit $fail
