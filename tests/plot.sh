#!/bin/sh
# perf/plot on a hand-written psperf-1 JSON fixture (two runs over tcp with
# --baseline: push at 4K, 64K and 1M with raw_latency / raw_bandwidth; the
# second run also has pull rows without a baseline).  With --script it must
# write, without gnuplot:
#  - the size axis as an explicit tic list in binary units ("4K" 4096,
#    "64K" 65536, "1M" 1048576), and no decimal "kB" anywhere;
#  - the ratio data our/raw, exact, per size and run (latency: t_typ / raw
#    t_typ; bandwidth: GB/s / raw GB/s), and no ratio chart for pull, whose
#    rows have no baseline;
#  - the goal lines at 1.3 and 0.8, or at --goal-latency / --goal-bandwidth;
#  - each run's raw baseline as a dashed series by default (and with the old
#    --raw), none with --no-raw;
# and bad input (JSON that is not psperf's) must exit 2 with a message.
# Where gnuplot is installed, the PNGs are drawn (by perf/plot and from the
# --script file) and must be PNG files.
# Run by `make check`, which sets top_srcdir.
set -eu
: "${top_srcdir:=.}"
plot=$top_srcdir/perf/plot
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tmp=$(cd "$tmp" && pwd) # perf/plot writes absolute paths into the script
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# ---- the fixture: what psperf --json --baseline writes (perf/output.c) ----
# stats N TYP_US GBS: a "stats" object of N samples around TYP_US
stats() {
	printf '{"n": %s, "t_min_us": %s, "t_typical_us": %s, "t_avg_us": %s, "t_p99_us": %s, "t_p999_us": %s, "bw_gbs": %s, "ops_s": %s}' \
		"$1" "$(awk -v t="$2" 'BEGIN { print t * 0.9 }')" "$2" "$(awk -v t="$2" 'BEGIN { print t * 1.1 }')" \
		"$(awk -v t="$2" 'BEGIN { print t * 2 }')" "$(awk -v t="$2" 'BEGIN { print t * 3 }')" "$3" \
		"$(awk -v t="$2" 'BEGIN { print int(1e6 / t) }')"
}
# raw OP NAME A B STATS
raw() {
	printf '{"op": "%s", "name": "%s", "a_bytes": %s, "b_bytes": %s, "iters": 1000, "count": 1000, "tcp_transport": false, "stats": %s}' \
		"$1" "$2" "$3" "$4" "$5"
}
# row TEST BYTES LAT_US GBS RAW_LAT_US RAW_GBS (RAW_LAT_US "-": no baseline)
row() {
	if [ "$5" = - ]; then
		rl=null rb=null xl=null xb=null
	else
		if [ "$1" = push ]; then
			rl=$(raw "socket req/resp" "socket $2->8" "$2" 8 "$(stats 1000 "$5" 0.1)")
		else
			rl=$(raw "socket req/resp" "socket 8->$2" 8 "$2" "$(stats 1000 "$5" 0.1)")
		fi
		rb=$(raw "socket stream" "socket stream $2" "$2" 0 "$(stats 1000 1 "$6")")
		xl=$(awk -v a="$3" -v b="$5" 'BEGIN { printf "%.6g", a / b }')
		xb=$(awk -v a="$4" -v b="$6" 'BEGIN { printf "%.6g", a / b }')
	fi
	printf '    {"test": "%s", "label": "", "bytes": %s, "moved_bytes": %s, "workers": 1, "iters": 1000, "warmup": 100,\n' \
		"$1" "$2" "$2"
	printf '     "latency": %s,\n' "$(stats 1000 "$3" 0.2)"
	printf '     "bandwidth": %s,\n' "$(stats 1000 1 "$4")"
	printf '     "raw_latency": %s,\n     "raw_bandwidth": %s,\n     "x_lat": %s, "x_bw": %s}' "$rl" "$rb" "$xl" "$xb"
}
# run LABEL MODE ROWS...
run() {
	label=$1 mode=$2
	shift 2
	cat <<EOF
{
  "format": "psperf-1",
  "config": {"label": "$label", "host": "node1", "date": "2024-05-02T10:11:12Z", "kernel": "Linux 6.1.0-21-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.90-1 x86_64", "cpu": "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz", "loadavg": [0.12, 0.20, 0.18], "ncpus": 2, "psperf_version": "0.1", "rdmaps_version": "0.1", "role": "local", "transport": "tcp", "device": "", "addr": "127.0.0.1", "servers_uri": "tcp://127.0.0.1:7000",
    "options": {"tests": ["push", "pull"], "servers": 1, "replicas": 1, "workers": 1, "size_min": 4096, "size_max": 1048576, "factor": 16, "iters": 1000, "warmup": 100, "window": 8, "mode": "$mode", "staleness": 0, "dtype": "fp32", "optimizer": "sgd", "shard_bytes": 65536, "slots": 4, "spin_us": 50, "timeout_ms": 10000, "baseline": true, "rank": 0, "num_workers": 1, "tag": "", "fsync": "always", "partitions": 1, "agg_isa": "avx2"},
    "argv": ["psperf", "-t", "push,pull", "-S", "4K:1M:16", "--baseline", "--label", "$label", "--json", "run.json"]
  },
  "rows": [
EOF
	sep=
	for r in "$@"; do
		printf '%s%s' "$sep" "$r"
		sep=",
"
	done
	cat <<EOF

  ],
  "baselines": [
  ]
}
EOF
}
# run 1: ratios 2, 1.5, 1.25 (latency) and 0.5, 0.75, 0.8 (bandwidth)
run "tcp async" async \
	"$(row push 4096 20 0.5 10 1)" \
	"$(row push 65536 60 1.5 40 2)" \
	"$(row push 1048576 500 3 400 3.75)" >"$tmp/a.json"
# run 2: 1.5, 1.1, 1.2 and 0.9, 0.9, 0.9; pull rows without a baseline
run "tcp sync" sync \
	"$(row push 4096 15 0.9 10 1)" \
	"$(row push 65536 44 1.8 40 2)" \
	"$(row push 1048576 480 3.6 400 4)" \
	"$(row pull 4096 12 0.4 - -)" \
	"$(row pull 65536 50 1.4 - -)" >"$tmp/b.json"
python3 -c 'import json, sys; [json.load(open(f)) for f in sys.argv[1:]]' "$tmp/a.json" "$tmp/b.json" ||
	{ echo "FAIL: the fixture is not JSON"; exit 1; }

# ---- the script and its data, by default ----
mkdir "$tmp/s"
python3 "$plot" -o "$tmp/png" --script "$tmp/s/plot.gp" "$tmp/a.json" "$tmp/b.json" >"$tmp/out" 2>&1 ||
	{ cat "$tmp/out"; echo "FAIL: perf/plot --script exited non-zero"; exit 1; }
gp=$tmp/s/plot.gp
[ -s "$gp" ] || { cat "$tmp/out"; echo "FAIL: no script $gp"; exit 1; }

# the size axis: binary units, exact
tics=$(grep '^set xtics (' "$gp" | head -n 1)
for t in '"4K" 4096' '"64K" 65536' '"1M" 1048576'; do
	case $tics in *"$t"*) ;; *) bad "the xtics list lacks $t: $tics" ;; esac
done
# (the script names files under $tmp, whose random name may hold "kB")
! sed "s|$tmp||g" "$gp" | grep -q 'kB' || bad "the script still has a decimal kB: $(sed "s|$tmp||g" "$gp" | grep kB)"
! grep -q "set format x" "$gp" || bad "the size axis is still formatted by gnuplot: $(grep 'set format x' "$gp")"

# the ratios: our / raw, exactly, by size; run 1 then run 2
expect() { # FILE then the lines it must hold
	f=$1
	shift
	printf '%s\n' "$@" >"$tmp/want"
	if [ ! -f "$f" ]; then
		bad "no data file $f"
	elif ! cmp -s "$tmp/want" "$f"; then
		bad "$f holds:"
		cat "$f"
		echo "  not:"
		cat "$tmp/want"
	fi
}
expect "$tmp/s/plot-push-0-ratio.dat" "4096 2 0.5" "65536 1.5 0.75" "1048576 1.25 0.8"
expect "$tmp/s/plot-push-1-ratio.dat" "4096 1.5 0.9" "65536 1.1 0.9" "1048576 1.2 0.9"
# our figures and the raw ones beside them
expect "$tmp/s/plot-push-0.dat" "4096 20 0.5" "65536 60 1.5" "1048576 500 3"
expect "$tmp/s/plot-push-0-raw.dat" "4096 10 1" "65536 40 2" "1048576 400 3.75"
expect "$tmp/s/plot-pull-1.dat" "4096 12 0.4" "65536 50 1.4"
# pull has no baseline: no ratio data, no ratio chart, no raw series
[ ! -e "$tmp/s/plot-pull-1-ratio.dat" ] || bad "ratio data for pull, whose rows have no baseline"
[ ! -e "$tmp/s/plot-pull-1-raw.dat" ] || bad "raw data for pull, whose rows have no baseline"
! grep -q 'pull-latency-ratio.png\|pull-bandwidth-ratio.png' "$gp" || bad "a ratio chart for pull, without a baseline"
for c in push-latency push-bandwidth push-latency-ratio push-bandwidth-ratio pull-latency pull-bandwidth; do
	grep -q "^set output '$tmp/png/$c.png'\$" "$gp" || bad "the script draws no $c.png into -o"
done
# each ratio chart plots the ratio data of both runs
for col in 2 3; do
	for i in 0 1; do
		grep -q "'$tmp/s/plot-push-$i-ratio.dat' using 1:$col with" "$gp" ||
			bad "the push ratio chart (column $col) does not plot run $i"
	done
done

# the goal lines, at the defaults
grep -q "^plot .* 1\.3 with lines .*dt 2.* title \"goal 1\.3\"" "$gp" || bad "no dashed goal line at 1.3 (latency ratio)"
grep -q "^plot .* 0\.8 with lines .*dt 2.* title \"goal 0\.8\"" "$gp" || bad "no dashed goal line at 0.8 (bandwidth ratio)"

# the baseline beside each run, by default: dashed, the run's colour
for i in 0 1; do
	c=$((i + 1))
	n=$(grep -c "'$tmp/s/plot-push-$i-raw.dat' using 1:[23] with linespoints lc $c dt 2 " "$gp" || true)
	[ "$n" = 2 ] || bad "run $i's raw baseline is in $n push chart(s), not 2 (dashed, lc $c)"
done
grep -q 'title "tcp async raw"' "$gp" || bad "no series titled 'tcp async raw'"
grep -q 'title "tcp sync raw"' "$gp" || bad "no series titled 'tcp sync raw'"

# ---- options ----
mkdir "$tmp/g"
python3 "$plot" -o "$tmp/png" --goal-latency 1.5 --goal-bandwidth 0.65 --script "$tmp/g/plot.gp" \
	"$tmp/a.json" "$tmp/b.json" >"$tmp/out" 2>&1 || { cat "$tmp/out"; bad "--goal-latency/--goal-bandwidth: exit non-zero"; }
grep -q "^plot .* 1\.5 with lines .* title \"goal 1\.5\"" "$tmp/g/plot.gp" || bad "no goal line at --goal-latency 1.5"
grep -q "^plot .* 0\.65 with lines .* title \"goal 0\.65\"" "$tmp/g/plot.gp" || bad "no goal line at --goal-bandwidth 0.65"
! grep -q 'goal 1\.3\|goal 0\.8' "$tmp/g/plot.gp" || bad "a default goal line despite the options"

mkdir "$tmp/n"
python3 "$plot" -o "$tmp/png" --no-raw --script "$tmp/n/plot.gp" "$tmp/a.json" "$tmp/b.json" >"$tmp/out" 2>&1 ||
	{ cat "$tmp/out"; bad "--no-raw: exit non-zero"; }
! grep -q -- '-raw\.dat\| raw"' "$tmp/n/plot.gp" || bad "--no-raw still draws a baseline: $(grep -- '-raw\.dat' "$tmp/n/plot.gp")"
! ls "$tmp/n" | grep -q -- '-raw\.dat' || bad "--no-raw still writes baseline data"
grep -q 'push-latency-ratio.png' "$tmp/n/plot.gp" || bad "--no-raw dropped the ratio charts too"

mkdir "$tmp/r"
python3 "$plot" -o "$tmp/png" --raw --script "$tmp/r/plot.gp" "$tmp/a.json" "$tmp/b.json" >"$tmp/out" 2>&1 ||
	{ cat "$tmp/out"; bad "--raw (kept for old command lines): exit non-zero"; }
cmp -s "$tmp/r/plot-push-0-raw.dat" "$tmp/s/plot-push-0-raw.dat" || bad "--raw does not draw the same baseline as the default"

# ---- bad input: exit 2 and say why ----
printf '{"format": "other", "rows": []}\n' >"$tmp/other.json"
printf '[1, 2, 3]\n' >"$tmp/list.json"
printf '{"format": "psperf-1", "rows": [\n' >"$tmp/cut.json"
for f in other list cut; do
	set +e
	python3 "$plot" --script "$tmp/x/plot.gp" "$tmp/$f.json" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	set -e
	[ $rc = 2 ] || bad "$f.json: exit $rc, not 2"
	grep -q "^plot: .*$f.json" "$tmp/err" || bad "$f.json: no message naming the file: '$(cat "$tmp/err")'"
	case $f in
	other | list) grep -q 'not a psperf JSON file' "$tmp/err" || bad "$f.json: the message does not say why" ;;
	esac
	[ ! -e "$tmp/x" ] || bad "$f.json: a script or data written for bad input"
done

# ---- the PNGs, where gnuplot is installed ----
png_ok() { # a non-empty file that starts with PNG's 8 magic bytes
	[ -s "$1" ] && [ "$(od -An -tx1 -N8 "$1" | tr -d ' \n')" = 89504e470d0a1a0a ]
}
if command -v gnuplot >/dev/null 2>&1; then
	python3 "$plot" -o "$tmp/direct" "$tmp/a.json" "$tmp/b.json" >"$tmp/out" 2>&1 ||
		{ cat "$tmp/out"; bad "perf/plot (drawing) exited non-zero"; }
	gnuplot "$gp" >"$tmp/gpout" 2>&1 || { cat "$tmp/gpout"; bad "gnuplot on the --script file failed"; }
	for d in direct png; do
		for c in push-latency push-bandwidth push-latency-ratio push-bandwidth-ratio pull-latency pull-bandwidth; do
			png_ok "$tmp/$d/$c.png" || bad "$d: $c.png is missing or not a PNG file"
		done
		[ ! -e "$tmp/$d/pull-latency-ratio.png" ] || bad "$d: a pull ratio chart without a baseline"
	done
	echo "perf/plot: charts drawn by gnuplot ($(ls "$tmp/direct" | wc -l) files)"
else
	echo "perf/plot: no gnuplot, the PNGs are not drawn (the script and its data are checked)"
fi

[ $fail = 0 ] && echo "perf/plot: binary size labels, exact ratios, goal lines, baselines, bad input: all right"
exit $fail
