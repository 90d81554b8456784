#!/usr/bin/env bash
# The H200 runs issue 21 names, recorded for judging back on the CPU machine (about 4 minutes):
#   scripts/h200_verdicts.sh OUT_DIR        (the torch_memory_saver wheel in .whl/: run(carry=[".whl"]))
# 1. the tiny preset on CUDA with the recommended colocation flags (its offloads are a few MiB: below what
#    the series resolve, so every verdict must be pass or "too small to judge", never fail);
# 2. Miles' topology with torch_memory_saver: one rank under torchrun plus its engine server, both pausing
#    memory (every offload must be judged on the NVML reading of the process that paused it);
# 3. the GPU tests of the NVML probe (boundary reads of a process without the host role).
# Each run is tarred flat into OUT_DIR (deep folders do not come back). Runs from source.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ls .whl/torch_memory_saver-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/torch_memory_saver-*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
status=0
colocate="--offload-train --offload-rollout --colocate-memory-peak-device gpu --offload-rollout-level kv_cache weight"
timeout 120 python3 -m miles_profile.record --log-dir "$work/tiny-cuda" -- --preset tiny --num-rollout 3 \
  $colocate > "$out/tiny-cuda.log" 2>&1 || status=1
tail -2 "$out/tiny-cuda.log"
timeout 300 python3 -m miles_profile.record --log-dir "$work/tms-engine-server" -- --nproc-per-node 1 --preset gpu \
  --num-rollout 5 $colocate --rollout-memory-backend torch_memory_saver --offload-train-backend torch_memory_saver \
  > "$out/tms-engine-server.log" 2>&1 || status=1
tail -2 "$out/tms-engine-server.log"
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_nvml_probe.py tests/unit/test_probes.py \
  tests/unit/test_host_sampler.py 2>&1 | tail -3 || status=1
for run in tiny-cuda tms-engine-server; do
  tar czf "$out/$run.tgz" -C "$work" "$run"
done
rm -rf "$work"
exit $status
