#!/bin/sh
# etcd-compare.sh - the commit latency of a 3-member etcd cluster on this
# machine's loopback, measured the way psperf -t commit measures rdmaps':
# one client, one connection kept open, N sequential writes that each
# return once committed by a majority, latency per write.
#
#   perf/etcd-compare.sh [N] [fsync|nofsync]
#
# Needs etcd and python3 (Debian: apt-get install etcd-server python3).
# etcd has no switch to skip fsync; "nofsync" puts the data dirs on tmpfs
# (/dev/shm), which makes fsync free.  Prints min / median / mean / p99 in
# microseconds.  Not part of any test: a reference figure for
# perf/RESULTS.md.
set -eu
N=${1:-2000}
MODE=${2:-fsync}
command -v etcd >/dev/null || { echo "etcd-compare: etcd not found: apt-get install etcd-server" >&2; exit 77; }
if [ "$MODE" = nofsync ]; then base=/dev/shm; else base=${TMPDIR:-/var/tmp}; fi
dir=$(mktemp -d "$base/etcd-compare.XXXXXX")
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
cluster=e1=http://127.0.0.1:23801,e2=http://127.0.0.1:23802,e3=http://127.0.0.1:23803
for i in 1 2 3; do
	etcd --name e$i --data-dir "$dir/e$i" \
		--listen-peer-urls http://127.0.0.1:2380$i --initial-advertise-peer-urls http://127.0.0.1:2380$i \
		--listen-client-urls http://127.0.0.1:2379$i --advertise-client-urls http://127.0.0.1:2379$i \
		--initial-cluster "$cluster" --initial-cluster-state new --log-level error >"$dir/e$i.log" 2>&1 &
	pids="$pids $!"
done
python3 - "$N" <<'EOF'
import base64, http.client, json, statistics, sys, time
n = int(sys.argv[1])
# find the leader (writes go there; a follower would forward them)
deadline = time.time() + 30
leader = None
while leader is None and time.time() < deadline:
    for port in (23791, 23792, 23793):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("POST", "/v3/maintenance/status", "{}")
            st = json.loads(c.getresponse().read())
            if st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
                leader = port
        except Exception:
            pass
    time.sleep(0.1)
if leader is None:
    sys.exit("etcd-compare: no leader within 30 s")
c = http.client.HTTPConnection("127.0.0.1", leader)
def put(i):
    body = json.dumps({"key": base64.b64encode(b"k").decode(), "value": base64.b64encode(str(i).encode()).decode()})
    c.request("POST", "/v3/kv/put", body)
    r = c.getresponse(); r.read()
    if r.status != 200:
        sys.exit("etcd-compare: put failed: %d" % r.status)
def status():
    c.request("POST", "/v3/maintenance/status", "{}")
    r = c.getresponse(); r.read()
for i in range(200):
    put(i)
def measure(f):
    t = []
    for i in range(n):
        t0 = time.perf_counter_ns(); f(i) if f is put else f(); t.append((time.perf_counter_ns() - t0) / 1000)
    t.sort()
    return t[0], statistics.median(t), statistics.mean(t), t[int(len(t) * 0.99)]
p = measure(put)
s = measure(status)
print("etcd 3-member put    (us): min %.1f  median %.1f  mean %.1f  p99 %.1f" % p)
print("etcd status round trip (us): min %.1f  median %.1f  mean %.1f  p99 %.1f" % s)
print("put / round trip (median): x%.2f" % (p[1] / s[1]))
EOF
