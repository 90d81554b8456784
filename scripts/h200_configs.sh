#!/usr/bin/env bash
# The eight offload configurations of issue 6, each recorded into its own log dir:
#   [MEMORY_BACKEND=builtin|torch_memory_saver] scripts/h200_configs.sh OUT_DIR [PRESET] [NUM_ROLLOUT] [extra trainer args...]
# Runs from source (PYTHONPATH=.) with the python3 on PATH, as on the GPU machine.
# MEMORY_BACKEND=torch_memory_saver (the second set, issue 10) adds --rollout-memory-backend
# torch_memory_saver to every configuration and --offload-train-backend torch_memory_saver to those that
# offload the training state to cpu (disk stays builtin), installing the wheel from .whl/ into /tmp/site
# when the package is not importable. MEMORY_BACKEND=builtin forces the first set's backend (the trainer's
# auto would pick torch_memory_saver wherever the package imports). Unset: each run's defaults.
# ONLY="4-both 8-critic-both" records those configurations alone.
# CALIBRATE=1 measures the links once (record --calibrate: pinned/pageable copies, the offload disk) and
# stores them in every log, so the report's transition meter gives ratios to them (docs/transitions.md).
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
backend=${MEMORY_BACKEND:-}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ "$backend" = torch_memory_saver ] && ! python3 -c "import torch_memory_saver" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "cannot install torch_memory_saver from .whl/"; exit 1; }
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
status=0
for name in $(printf '%s\n' "${!configs[@]}" | sort); do
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || continue
  flags=${configs[$name]}
  case $backend in
    torch_memory_saver)
      flags="$flags --rollout-memory-backend torch_memory_saver"
      case " $flags " in *" --offload-train "*)
        [[ $flags == *disk* ]] || flags="$flags --offload-train-backend torch_memory_saver";; esac;;
    builtin) flags="$flags --rollout-memory-backend builtin";;
    "") ;;
    *) echo "MEMORY_BACKEND must be builtin or torch_memory_saver, not $backend"; exit 2;;
  esac
  echo "=== $name: $flags"
  calibrate=()
  [ -z "${CALIBRATE:-}" ] || { mkdir -p "$disk_dir"; calibrate=(--calibrate --watch-dir "$disk_dir"); }
  python3 -m miles_profile.record --log-dir "$out/$name" --interval-ms "$interval" ${calibrate[@]+"${calibrate[@]}"} -- \
    --preset "$preset" --num-rollout "$rollouts" $flags "$@" || { echo "FAILED: $name"; status=1; }
  # One run per configuration: make $out/<config> the run directory itself (sample_logs/h200 layout).
  run_dir=$(ls -d "$out/$name"/run-* 2>/dev/null | head -1)
  [ -n "$run_dir" ] && mv "$run_dir"/* "$out/$name"/ && rmdir "$run_dir"
done
exit $status
