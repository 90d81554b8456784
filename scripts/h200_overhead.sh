#!/usr/bin/env bash
# The recorder's overhead at 100 ms against 20 ms, side by side in one device call, and spike capture at
# 100 ms (about 8 minutes):   scripts/h200_overhead.sh OUT_DIR [BLOCKS_AT_100_MS]
# bench/overhead_ab.py: launch-bound loop, CUDA-event step times, ABBA blocks of 250 ms, recorder paused (A)
# or running (B); each JSON keeps the per-quad seconds, so other estimators can be computed afterwards.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [BLOCKS_AT_100_MS]}
blocks=${2:-1400}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
for spec in "100 $blocks" "20 400"; do
  set -- $spec
  timeout 420 python3 bench/overhead_ab.py --interval-ms "$1" --block-ms 250 --blocks "$2" --seed 11 \
    --out "$out/overhead_ab_${1}ms.json" 2>&1 | grep "^overhead_ab" || status=1
done
timeout 90 python3 bench/bench_sampler.py --only spikes --interval-ms 100 --out "$out/bench" > "$out/spikes.log" 2>&1 || status=1
grep -iE "interval|spikes|caught" "$out/spikes.log" | tail -6
exit $status
