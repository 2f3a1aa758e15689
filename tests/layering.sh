#!/bin/sh
# The layers stay layers (doc/design.md "Source tree"):
#  1. only verbs/ includes <infiniband/*> or <rdma/*> (the product: src/,
#     include/, perf/; tests of the verbs provider may look at verbs);
#  2. a layer includes headers of itself and of the layers it may use, never
#     of a layer above it;
#  3. librdmaps.so defines no symbol of the server, the control plane or
#     psctl's admin channel, so
#     the version script hides nothing that should not be there;
#  4. the data plane calls nothing of the control plane: librps_server.a
#     leaves no control-plane symbol undefined (the control plane reaches
#     it through server/dataplane.h, and it calls up through hooks).
#  5. the providers' interface (transport/provider.h: the ops table and the
#     objects' common heads) is included by the dispatch and the providers
#     (src/transport/, verbs/) only: the layers above see transport.h alone
#     (and tests/test_verbs.c, the verbs provider's white-box test); a
#     provider's own headers (transport/tcp/, verbs/) are that provider's.
# Run by `make check`, which sets top_srcdir and top_builddir.
set -e
: "${top_srcdir:=.}" "${top_builddir:=.}"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# 1. verbs headers
hits=$(cd "$top_srcdir" && grep -rlE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(infiniband|rdma)/' src include perf || true)
[ -z "$hits" ] || bad "outside verbs/, these include verbs headers: $hits"

# 2. include direction: the layers each layer may use (itself included)
allowed() {
	case $1 in
	common) echo "common" ;;
	transport) echo "common transport" ;;
	verbs) echo "common transport verbs" ;;
	proto) echo "common proto" ;;
	kernels) echo "common kernels" ;;
	client) echo "common transport proto kernels client" ;;
	server) echo "common transport proto kernels server" ;;
	control) echo "common transport proto kernels server control" ;;
	programs) echo "common transport proto kernels client server control programs" ;;
	*) echo "" ;;
	esac
}
nfiles=0
for f in "$top_srcdir"/src/*/*.[ch] "$top_srcdir"/src/*/*/*.[ch] "$top_srcdir"/verbs/*.[ch]; do
	[ -f "$f" ] || continue
	nfiles=$((nfiles + 1))
	# the layer is the folder under src/ (src/transport/tcp/ is transport's)
	layer=${f#"$top_srcdir"/}
	layer=${layer#src/}
	layer=${layer%%/*}
	ok=$(allowed "$layer")
	[ -n "$ok" ] || { bad "${f#"$top_srcdir"/}: in no known layer (add it to tests/layering.sh and doc/design.md)"; continue; }
	for used in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z]*\)\/.*/\1/p' "$f" | sort -u); do
		case " $ok " in
		*" $used "*) ;;
		*) bad "${f#"$top_srcdir"/} ($layer) includes $used/: $layer may use only: $ok" ;;
		esac
	done
	# an unqualified product header would hide the direction
	sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^/"]*\.h\)".*/\1/p' "$f" | while read -r h; do
		case $h in config.h | rdmaps.h) ;; *) echo "FAIL: ${f#"$top_srcdir"/} includes \"$h\": name its layer (\"layer/$h\")" ;; esac
	done | grep . && fail=1
done
[ "$nfiles" -gt 20 ] || bad "found only $nfiles sources under src/*/, src/*/*/ and verbs/"

# 5. provider.h: the providers' side of the transport
hits=$(cd "$top_srcdir" && grep -rlE --include='*.[ch]' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"transport/provider\.h"' \
	src include perf tests python 2>/dev/null | grep -vE '^(src/transport/|tests/test_verbs\.c$)' || true)
[ -z "$hits" ] || bad "outside src/transport/ and verbs/, these include transport/provider.h (use transport.h): $(echo $hits)"
hits=$(cd "$top_srcdir" && grep -rlE --include='*.[ch]' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"transport/tcp/' \
	src include perf tests python verbs 2>/dev/null | grep -vE '^src/transport/tcp/' || true)
[ -z "$hits" ] || bad "outside src/transport/tcp/, these include the TCP provider's headers: $(echo $hits)"

# 3. no server or control-plane code in the client library, nor psctl's
#    admin channel (src/client/ctl.c: its own convenience library)
so=$top_builddir/.libs/librdmaps.so
if [ -f "$so" ]; then
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/layering.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	nm --defined-only "$so" | awk '{ print $3 }' | sort -u >"$tmp/lib"
	for a in "$top_builddir"/src/server/.libs/librps_server.a "$top_builddir"/src/control/.libs/librps_control.a \
		"$top_builddir"/src/client/.libs/librps_ctl.a; do
		[ -f "$a" ] || { bad "no $a: build first"; continue; }
		nm --defined-only "$a" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBR]/ { print $3 }' | sort -u >"$tmp/srv"
		leaked=$(comm -12 "$tmp/lib" "$tmp/srv")
		[ -z "$leaked" ] || bad "librdmaps.so defines symbols of $(basename "$a"): $(echo $leaked)"
	done
	[ -s "$tmp/lib" ] || bad "nm found no symbol in $so"
fi
# 4. the seam: nothing of src/control is called from src/server
a=$top_builddir/src/server/.libs/librps_server.a
if [ -f "$a" ]; then
	up=$(nm --undefined-only "$a" 2>/dev/null | awk '{ print $NF }' |
		grep -E '^(rps__cp_|rps__ck_|rps__rnode_|rps__raft_|rps__wal_|rps__smap_apply|rps__daemon_)' | sort -u || true)
	[ -z "$up" ] || bad "the data plane calls the control plane: $(echo $up)"
fi
[ $fail -eq 0 ] && echo "layering: $nfiles sources in their layers; librdmaps holds no server code; the data plane calls nothing above it"
exit $fail
