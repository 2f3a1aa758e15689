#!/bin/sh
# One tag, one type: no struct (nor union or enum: C gives them one tag
# namespace) is defined in two source files of the product's libraries and
# programs (src/ at any depth, verbs/; headers included).  Two `struct conn`
# are legal C, one per translation unit, but psperf and the tests link the
# client and the server together, and there a debugger's `ptype struct
# conn`, a core dump's types and a reader grepping for `struct conn {` find
# two different things under one name.  Tags defined in tests/ and perf/
# are not checked (perf's `struct opts` and `struct row` are per-program
# types beside rdmapsd's and psctl's, never linked together).
# A definition is `struct TAG {` on one line, outside a comment line (the
# tree's style; a definition split before its brace is not seen).
# Run by `make check`, which sets top_srcdir.
set -e
: "${top_srcdir:=.}"
cd "$top_srcdir"
files=$(find src verbs -name '*.[ch]' | sort)
[ -n "$files" ] || { echo "struct-tags.sh: no sources under $top_srcdir/src"; exit 1; }
# "tag file" per definition, once per file
defs=$(for f in $files; do
	grep -E '(^|[^A-Za-z0-9_])(struct|union|enum)[[:space:]]+[A-Za-z_][A-Za-z0-9_]*[[:space:]]*\{' "$f" |
		grep -vE '^[[:space:]]*(/?\*|//)' |
		sed -E 's/.*(^|[^A-Za-z0-9_])(struct|union|enum)[[:space:]]+([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\{.*/\2 \3/' |
		sort -u | sed "s|\$| $f|"
done)
ndefs=$(printf '%s\n' "$defs" | grep -c .)
[ "$ndefs" -gt 100 ] || { echo "struct-tags.sh: found only $ndefs tag definitions"; exit 1; }
# (a file that defines a tag twice, say under #if, is its own business)
dups=$(printf '%s\n' "$defs" | awk '{ k = $1 " " $2; n[k]++; f[k] = f[k] " " $3 }
	END { for (k in n) if (n[k] > 1) print k ":" f[k] }' | sort)
if [ -n "$dups" ]; then
	printf '%s\n' "$dups" | sed 's/^\([a-z]*\) \([^:]*\):\(.*\)/FAIL: \1 \2 is defined in more than one file:\3 (give each its own tag)/'
	exit 1
fi
echo "struct-tags: $ndefs struct, union and enum tags, each defined in one file"
