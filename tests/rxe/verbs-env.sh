# Sourced by the verbs test wrappers: find an RDMA device and the IPv4
# address rdma_cm reaches it on, or exit 77 (automake's SKIP).
# RPS_VERBS_ADDR (or the rxe VM's RXE_ADDR) overrides the search.
addr=${RPS_VERBS_ADDR:-${RXE_ADDR:-}}
if [ -z "$addr" ]; then
	netdev=$(rdma link show 2>/dev/null | sed -n 's/.* netdev \([^ ]*\).*/\1/p' | head -1)
	[ -n "$netdev" ] && addr=$(ip -4 -o addr show dev "$netdev" 2>/dev/null | awk '{sub("/.*","",$4); print $4; exit}')
fi
if [ -z "$addr" ]; then
	echo "SKIP: no RDMA device with an IPv4 address here (run make check-rxe for a Soft-RoCE VM)"
	exit 77
fi
# Every verbs test runs with a key, as a deployment does
# (doc/security.md): the servers listen on the device's address, beyond loopback.
if [ -z "${RDMAPS_KEY_FILE:-}" ]; then
	RDMAPS_KEY_FILE=$(mktemp -d "${TMPDIR:-/tmp}/rps-verbs-key.XXXXXX")/cluster.key
	./psctl keygen "$RDMAPS_KEY_FILE" >/dev/null || { echo "FAIL: psctl keygen"; exit 1; }
	export RDMAPS_KEY_FILE
fi
