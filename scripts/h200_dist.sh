#!/usr/bin/env bash
# Miles' topology on one H200: one training rank under torchrun with its rollout engine in a separate
# process (python -m trainer.engine_server) sharing the GPU, recorded by `record` in one command:
#   scripts/h200_dist.sh OUT_DIR [NUM_ROLLOUT]
# Writes OUT_DIR/logs (the run: record, rank and engine each with their own files), train.log and
# nvidia-smi.csv (both processes on the GPU, once a second), and runs the engine server's GPU test
# (weights over CUDA IPC handles). About 2-3 minutes; runs from source. The GPU machine has no plotly:
# render the report where it is installed (python -m miles_profile.visualize OUT_DIR/logs).
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [NUM_ROLLOUT]}
rollouts=${2:-3}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/integration/test_engine_server.py 2>&1 | tail -3 \
  || status=1
nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_memory --format=csv -l 1 > "$out/nvidia-smi.csv" 2>&1 &
smi=$!
# The recommended colocation flags (docs/trainer.md); the engine is a server because torchrun runs the rank.
timeout 480 python3 -m miles_profile.record --log-dir "$out/logs" -- --nproc-per-node 1 \
  --preset gpu --num-rollout "$rollouts" --offload-train --offload-rollout --colocate-memory-peak-device gpu \
  --offload-rollout-level kv_cache weight --optimizer-cpu-offload 2>&1 | tee "$out/train.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
echo "GPU processes seen: $(awk -F', ' 'NR>1 {print $2}' "$out/nvidia-smi.csv" | sort -u | tr '\n' ' ')"
exit $status
