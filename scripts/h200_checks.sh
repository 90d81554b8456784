#!/usr/bin/env bash
# What a GPU session should run in one device call to re-verify the recorder and trainer on the H200:
#   scripts/h200_checks.sh OUT_DIR
# recorder probes (gpu test), overhead with the current NVML schedule and its variants, spike capture,
# the trainer's GPU tests, and the offload throughput benchmark. About 6 minutes; runs from source.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_probes.py 2>&1 | tail -3 || status=1
timeout 100 python3 tests/integration/test_trainer_gpu.py > "$out/trainer_gpu_tests.log" 2>&1 || status=1
grep -E "^(PASS|FAIL)|step [0-9]:|freed" "$out/trainer_gpu_tests.log"
timeout 300 python3 bench/bench_sampler.py --rounds 10 --variant recorder_50ms --variant recorder_no_nvml \
  --out "$out/bench" > "$out/bench_sampler.log" 2>&1 || status=1
grep -E "whole_sample|rate_|off_again|recorder|naive_100|memory_history|step_ms" "$out/bench_sampler.log"
timeout 200 python3 bench/bench_offload.py --preset gpu --device cuda --disk-dir /tmp/bench-offload --repeats 1 \
  --out "$out/bench/offload.json" 2>&1 | tail -6 || status=1
exit $status
