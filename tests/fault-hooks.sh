#!/bin/sh
# The test hooks stay in one place and out of shipped builds
# (src/common/fault.h, README "Testing"):
#  1. only src/common/fault.c names the RPS_FAULT variable in code: every
#     hook asks rps__fault(), none reads the environment itself;
#  2. a build configured without --enable-fault-injection carries no hook:
#     the string is in none of librdmaps.so, rdmapsd and psctl (and a build
#     with it has it in librdmaps.so and rdmapsd, so this check checks).
# Run by `make check`, which sets top_srcdir and top_builddir.
set -e
: "${top_srcdir:=.}" "${top_builddir:=.}"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# 1. (comments may name it: only a string literal is code that reads it)
hits=$(cd "$top_srcdir" && grep -rn '"RPS_FAULT' src verbs perf include python 2>/dev/null |
	grep -v '^src/common/fault\.c:' || true)
[ -z "$hits" ] || bad "RPS_FAULT read outside src/common/fault.c (ask rps__fault() instead):
$hits"
grep -q 'getenv("RPS_FAULT")' "$top_srcdir/src/common/fault.c" || bad "src/common/fault.c no longer reads RPS_FAULT"

# 2.
if [ ! -f "$top_builddir/config.h" ]; then
	bad "no $top_builddir/config.h: configure and build first"
elif grep -q '^#define RPS_FAULT_INJECTION 1' "$top_builddir/config.h"; then
	have=yes
	for f in .libs/librdmaps.so rdmapsd; do
		[ -f "$top_builddir/$f" ] || { bad "no $f: build first"; continue; }
		grep -q RPS_FAULT "$top_builddir/$f" || bad "built with --enable-fault-injection, yet $f has no hook"
	done
else
	have=no
	for f in .libs/librdmaps.so rdmapsd psctl; do
		[ -f "$top_builddir/$f" ] || { bad "no $f: build first"; continue; }
		! grep -q RPS_FAULT "$top_builddir/$f" || bad "built without --enable-fault-injection, yet $f reads RPS_FAULT"
	done
fi
[ $fail -eq 0 ] && echo "fault hooks: only src/common/fault.c reads RPS_FAULT; compiled in: $have"
exit $fail
