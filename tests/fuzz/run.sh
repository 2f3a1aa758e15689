#!/bin/sh
# run.sh - run each libFuzzer harness for SECONDS on a scratch copy of its
# seed corpus (tests/fuzz/corpus/<name>; new inputs land in the scratch
# copy, the committed seeds are not touched).  A crash leaves its input in
# OUTDIR/artifacts/<name>/ and makes the run fail (after the other targets ran).
#
#   run.sh SRCDIR OUTDIR SECONDS NAME...
set -u
srcdir=$1 out=$2 secs=$3
shift 3
# Targets run FUZZ_JOBS at a time (default: one a CPU), each for the
# whole SECONDS: the same fuzzing per target in a fraction of the time.
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}

# One target; its summary lines go to $out/fuzz_NAME.result.
run_one() {
	name=$1 work="$out/work/$1" art="$out/artifacts/$1" res="$out/fuzz_$1.result"
	rm -rf "$work"
	mkdir -p "$work" "$art"
	[ -d "$srcdir/tests/fuzz/corpus/$name" ] && cp "$srcdir/tests/fuzz/corpus/$name"/* "$work"/ 2>/dev/null
	extra=""
	# The admin harness keeps a server running across inputs: memory it
	# holds between inputs is not a leak of one input.
	case $name in admin) extra="-detect_leaks=0" ;; esac
	echo "== fuzz_$name: $secs s" > "$res"
	if ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
	   "$out/fuzz_$name" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2560 -max_len=65536 \
		-print_final_stats=1 -artifact_prefix="$art/" $extra "$work" > "$out/fuzz_$name.log" 2>&1; then
		{ grep -E '^stat::(number_of_executed_units|average_exec_per_sec)' "$out/fuzz_$name.log" | tr '\n' ' '
		  echo; } >> "$res"
	else
		{ echo "fuzz_$name FAILED: crash input in $art/, log $out/fuzz_$name.log:"
		  grep -E 'invariant failed|ERROR|runtime error|SUMMARY|Test unit written' "$out/fuzz_$name.log" | head -12
		} >> "$res"
	fi
}

running=0
for name in "$@"; do
	run_one "$name" &
	running=$((running + 1))
	if [ "$running" -ge "$jobs" ]; then
		wait
		running=0
	fi
done
wait
failed=""
for name in "$@"; do
	cat "$out/fuzz_$name.result"
	grep -q "^fuzz_$name FAILED" "$out/fuzz_$name.result" && failed="$failed $name"
done
if [ -n "$failed" ]; then
	echo "fuzz targets that crashed:$failed"
	exit 1
fi
