#!/bin/sh
# build.sh - compile the libFuzzer harnesses (tests/fuzz/fuzz_<name>.c) with
# clang, -fsanitize=fuzzer,address,undefined, against the product's sources
# compiled the same way.  `make fuzz` runs it; it needs only the configured
# build tree (for config.h) and the pkg-config libraries configure found.
#
#   build.sh SRCDIR BUILDDIR OUTDIR NAME...
#
# The product is compiled without the verbs transport (the harnesses run
# on the TCP provider), so the fuzz binaries need no RDMA libraries.  A new
# harness is one more NAME in FUZZ_TARGETS of Makefile.am.
set -eu
srcdir=$1 builddir=$2 out=$3
shift 3
CLANG=${CLANG:-clang}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CFLAGS_FUZZ="-g -O1 -fno-omit-frame-pointer -std=c11 -pthread -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers"
mkdir -p "$out/obj" "$out/inc"
# config.h as configured, minus verbs
{ cat "$builddir/config.h"; echo '#undef HAVE_VERBS'; } > "$out/inc/config.h.new"
cmp -s "$out/inc/config.h.new" "$out/inc/config.h" 2>/dev/null || mv "$out/inc/config.h.new" "$out/inc/config.h"
rm -f "$out/inc/config.h.new"
PKG_CFLAGS=$(pkg-config --cflags libisal hwloc libsodium)
PKG_LIBS="$(pkg-config --libs libisal hwloc libsodium) -lm"
INC="-I$out/inc -I$srcdir/include -I$srcdir/src"

# every product source but the programs (src/programs) and the verbs provider,
# the out-of-date ones compiled in parallel (JOBS, default: the cpus)
objs="" stale=""
for src in "$srcdir"/src/*/*.c "$srcdir"/src/*/*/*.c; do
	[ -f "$src" ] || continue
	rel=${src#"$srcdir"/src/}	# transport/tcp/tcp.c: object transport_tcp_tcp.o
	[ "${rel%%/*}" = programs ] && continue
	obj="$out/obj/$(echo "${rel%.c}" | tr / _).o"
	if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ "$out/inc/config.h" -nt "$obj" ] ||
	   [ -n "$(find "$srcdir/src" "$srcdir/include" -name '*.h' -newer "$obj" 2>/dev/null | head -1)" ]; then
		stale="$stale $src"
	fi
	objs="$objs $obj"
done
if [ -n "$stale" ]; then
	export CLANG CFLAGS_FUZZ SAN INC PKG_CFLAGS out srcdir
	# shellcheck disable=SC2016
	printf '%s\n' $stale | xargs -P "${JOBS:-$(nproc 2>/dev/null || echo 2)}" -I{} sh -c '
		rel=${1#"$srcdir"/src/}
		obj=$(echo "${rel%.c}" | tr / _)
		echo "  CC(fuzz) src/$rel"
		rm -f "$out/obj/$obj.o"
		$CLANG $CFLAGS_FUZZ -fsanitize=fuzzer-no-link $SAN $INC $PKG_CFLAGS -c "$1" -o "$out/obj/$obj.o"' sh {}
fi
rm -f "$out/libfuzzcore.a"
ar rcs "$out/libfuzzcore.a" $objs

for name in "$@"; do
	h="$srcdir/tests/fuzz/fuzz_$name.c"
	[ -f "$h" ] || { echo "build.sh: no harness $h" >&2; exit 1; }
	echo "  CCLD(fuzz) tests/fuzz/fuzz_$name"
	$CLANG $CFLAGS_FUZZ -fsanitize=fuzzer $SAN $INC $PKG_CFLAGS "$h" "$out/libfuzzcore.a" $PKG_LIBS \
		-o "$out/fuzz_$name"
done
