#!/bin/sh
# Every shell script of the tree parses under both shells it may meet: bash
# (CI's, and /bin/sh where that is bash, as in the Soft-RoCE VM) and dash
# (Debian's /bin/sh).  The two differ at the edges (a quote inside
# "${VAR-word}" is one), and a script that does not parse is found here in
# a second, not by a verbs suite twenty minutes into check-rxe.
# Run by `make check`, which sets top_srcdir.
: "${top_srcdir:=.}"
cd "$top_srcdir" || exit 99
command -v bash >/dev/null && command -v dash >/dev/null || { echo "SKIP: bash and dash needed"; exit 77; }
fail=0
for f in tests/*.sh tests/rxe/*.sh tests/rxe/vm .ci/run autogen.sh perf/*.sh; do
	[ -f "$f" ] || continue
	first=$(head -n 1 "$f")
	bash -n "$f" || { echo "FAIL: $f does not parse under bash"; fail=1; }
	case $first in
	*bash*) ;;	# bash's own: dash need not read it
	*) dash -n "$f" || { echo "FAIL: $f does not parse under dash"; fail=1; } ;;
	esac
done
exit $fail
