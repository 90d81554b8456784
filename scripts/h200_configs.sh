#!/usr/bin/env bash
# The eight offload configurations of issue 6, each recorded into its own log dir:
#   scripts/h200_configs.sh OUT_DIR [PRESET] [NUM_ROLLOUT] [extra trainer args...]
# Runs from source (PYTHONPATH=.) with the python3 on PATH, as on the GPU machine.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [PRESET] [NUM_ROLLOUT] [extra trainer args...]}
preset=${2:-gpu}
rollouts=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
interval=${INTERVAL_MS:-20}
disk_dir=${DISK_DIR:-/tmp/miles_offload}
both="--offload-train --offload-rollout"
declare -A configs=(
  [1-no-offload]=""
  [2-offload-train]="--offload-train"
  [3-offload-rollout]="--offload-rollout"
  [4-both]="$both"
  [5-both-gpu-peak]="$both --colocate-memory-peak-device gpu"
  [6-gpu-peak-disk]="$both --colocate-memory-peak-device gpu --offload-train-target disk --offload-train-disk-dir $disk_dir"
  [7-gpu-peak-optimizer-cpu]="$both --colocate-memory-peak-device gpu --optimizer-cpu-offload"
  [8-critic-both]="$both --use-critic"
)
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
for name in $(printf '%s\n' "${!configs[@]}" | sort); do
  echo "=== $name: ${configs[$name]}"
  python3 -m miles_profile.record --log-dir "$out/$name" --interval-ms "$interval" -- \
    --preset "$preset" --num-rollout "$rollouts" ${configs[$name]} "$@" || { echo "FAILED: $name"; status=1; }
  # One run per configuration: make $out/<config> the run directory itself (sample_logs/h200 layout).
  run_dir=$(ls -d "$out/$name"/run-* 2>/dev/null | head -1)
  [ -n "$run_dir" ] && mv "$run_dir"/* "$out/$name"/ && rmdir "$run_dir"
done
exit $status
