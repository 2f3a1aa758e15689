#!/bin/sh
# include/rdmaps.h compiles on its own, first thing in a file, as strict C11
# and as C++ (a C++ trainer includes it as it is), macros included.
# Run by `make check`; $CC defaults to gcc, $CXX to g++.
set -e
: "${top_srcdir:=.}"
inc=$top_srcdir/include
tmp=$(mktemp -d "${TMPDIR:-/tmp}/header-standalone.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/use.c" <<'EOF2'
#include <rdmaps.h>
/* the init macros, the version macros and every declaration, used once */
int rps_header_use(void);
int rps_header_use(void)
{
	struct rps_client_opts co;
	struct rps_tensor_opts to;
	const char *s = RPS_VERSION_STRING;

	rps_client_opts_init(&co);
	rps_tensor_opts_init(&to);
	return rps_version(&s) == RPS_VERSION_NUMBER && co.size && to.size;
}
EOF2
cp "$tmp/use.c" "$tmp/use.cc"
cc=${CC:-gcc}
echo "$cc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only"
$cc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$tmp/use.c"
$cc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -x c "$inc/rdmaps.h"
cxx=${CXX:-g++}
if ! command -v "${cxx%% *}" >/dev/null 2>&1; then
	echo "no C++ compiler ($cxx): C++ not checked"
	exit 77
fi
echo "$cxx -std=c++11 -pedantic -Wall -Wextra -Werror -fsyntax-only"
$cxx -std=c++11 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$tmp/use.cc"
$cxx -std=c++11 -pedantic -Wall -Wextra -Werror -fsyntax-only -x c++ "$inc/rdmaps.h"
echo ok
