#!/bin/sh
# The ABI's bookkeeping agrees with itself: the symbols librdmaps.so
# exports == the symbols in src/librdmaps.map == the functions rdmaps(3)
# documents (its SYNOPSIS, less the header's macros) == rdmaps(3)'s NAME
# list less its macros; NAME == RPS_MAN3_ALIASES (the `man rps_push` pages);
# the version in rdmaps.h == AC_INIT's; the newest .map node is not newer
# than that; -version-info follows the .map (policy atop librdmaps.map).
# Run by `make check`, which sets the variables below.
set -e
: "${top_srcdir:=.}" "${top_builddir:=.}"
hdr=$top_srcdir/include/rdmaps.h
map=$top_srcdir/src/librdmaps.map
man=$top_srcdir/man/rdmaps.3
so=$top_builddir/.libs/librdmaps.so
tmp=$(mktemp -d "${TMPDIR:-/tmp}/abi-symbols.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# same SET as; prints the differences
same() {	# name-a file-a name-b file-b
	if ! cmp -s "$2" "$4"; then
		bad "$1 and $3 differ (< only in $1, > only in $3):"
		diff "$2" "$4" | grep '^[<>]' || true
	fi
}

if [ ! -f "$so" ]; then
	echo "no $so (a static-only build?): nothing to check"
	exit 77
fi
# exported: defined dynamic symbols, less the version nodes themselves (type A)
nm -D --defined-only "$so" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp/exported"
sed -n 's/^[[:space:]]*\(rps_[a-z0-9_]*\);.*/\1/p' "$map" | sort >"$tmp/map"
# the header's function-like macros (rps_client_opts_init, ...)
sed -n 's/^#define \(rps_[a-z0-9_]*\)(.*/\1/p' "$hdr" | sort -u >"$tmp/macros"
# rdmaps(3): names in SYNOPSIS (".BI "int rps_push(..." lines) and in NAME
sed -n '/^\.SH SYNOPSIS/,/^\.SH /p' "$man" | grep -o 'rps_[a-z0-9_]*(' | tr -d '(' | sort -u >"$tmp/synopsis"
sed -n '/^\.SH NAME/,/^\.SH /p' "$man" | grep -o 'rps_[a-z0-9_]*' | sort -u >"$tmp/name"
comm -23 "$tmp/synopsis" "$tmp/macros" >"$tmp/documented"
comm -23 "$tmp/name" "$tmp/macros" >"$tmp/name-functions"
# declared in the header as functions
sed -n 's/^[a-z].*[ *]\(rps_[a-z0-9_]*\)(.*/\1/p' "$hdr" | sort -u >"$tmp/declared"

same "nm -D $so" "$tmp/exported" "$map" "$tmp/map"
same "$map" "$tmp/map" "rdmaps(3) SYNOPSIS" "$tmp/documented"
same "rdmaps(3) SYNOPSIS" "$tmp/synopsis" "rdmaps(3) NAME" "$tmp/name"
same "$map" "$tmp/map" "rdmaps.h declarations" "$tmp/declared"
if [ -n "${RPS_MAN3_ALIASES+set}" ]; then
	printf '%s\n' $RPS_MAN3_ALIASES | sort >"$tmp/aliases"
	same "RPS_MAN3_ALIASES (Makefile.am)" "$tmp/aliases" "rdmaps(3) NAME" "$tmp/name"
fi
[ -s "$tmp/map" ] || bad "no symbol found in $map"

# versions: the header is the source
ver() { sed -n "s/^#define RPS_VERSION_$1  *//p" "$hdr"; }
major=$(ver MAJOR) minor=$(ver MINOR) patch=$(ver PATCH)
if [ -n "$PACKAGE_VERSION" ] && [ "$PACKAGE_VERSION" != "$major.$minor.$patch" ]; then
	bad "configure says $PACKAGE_VERSION, rdmaps.h says $major.$minor.$patch: re-run autogen.sh"
fi
grep -q "^\.TH RDMAPS 3 .* \"rdmaps $major.$minor.$patch\"" "$man" ||
	bad "rdmaps(3)'s .TH line does not name rdmaps $major.$minor.$patch"
nodes=$(sed -n 's/^\(RDMAPS_[0-9]*\.[0-9]*\) *{.*/\1/p' "$map")
nnodes=$(printf '%s\n' $nodes | grep -c .)
newest=$(printf '%s\n' $nodes | tail -n 1)
newest_v=${newest#RDMAPS_}
if [ $(( ${newest_v%%.*} * 1000 + ${newest_v#*.} )) -gt $(( major * 1000 + minor )) ]; then
	bad "the newest node $newest is newer than the release $major.$minor"
fi
grep -q "$newest" "$man" || bad "rdmaps(3) does not name the version node $newest"
if [ -n "$RPS_LT_VERSION_INFO" ]; then
	IFS=: read -r cur rev age <<-EOF2
	$RPS_LT_VERSION_INFO
	EOF2
	[ "$cur" -eq $((nnodes - 1)) ] || bad "-version-info $RPS_LT_VERSION_INFO: current must be $((nnodes - 1)) ($nnodes nodes in $map)"
	[ "$age" -eq "$cur" ] || bad "-version-info $RPS_LT_VERSION_INFO: age must equal current (no interface is ever removed)"
	soname=$(objdump -p "$so" 2>/dev/null | sed -n 's/^ *SONAME *//p')
	[ -z "$soname" ] || [ "$soname" = "librdmaps.so.$((cur - age))" ] || bad "SONAME $soname, expected librdmaps.so.$((cur - age))"
fi

if [ $fail = 0 ]; then
	echo "ok: $(wc -l <"$tmp/map") symbols in node(s) $(echo $nodes); rdmaps $major.$minor.$patch, -version-info ${RPS_LT_VERSION_INFO:-?}"
fi
exit $fail
