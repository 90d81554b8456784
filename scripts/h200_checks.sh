#!/usr/bin/env bash
# The one device call that re-verifies the recorder and trainer on the H200 (about 9 minutes):
#   scripts/h200_checks.sh OUT_DIR [SECONDS]   (with the torch_memory_saver wheel in .whl/: run(carry=[".whl"]))
# GPU tests of the probes and the host sampler; the trainer's GPU tests with torch_memory_saver in torch
# hook mode, then its torch_memory_saver tests again in preload mode (as SGLang runs it); spike capture
# (at 100 ms, 240 spikes each at least two rows apart: about 2 minutes);
# then the recorder's overhead at the default interval by alternation (bench/overhead_ab.py, 250 ms
# blocks) for as many blocks as fit in SECONDS (default 540) from the script's start. Runs from source.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [SECONDS]}
budget=${2:-540}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ls .whl/torch_memory_saver-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/torch_memory_saver-*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
status=0
python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_probes.py tests/unit/test_host_sampler.py 2>&1 \
  | tail -3 || status=1
timeout 150 python3 tests/integration/test_trainer_gpu.py > "$out/trainer_gpu_tests.log" 2>&1 || status=1
if python3 -c "import torch_memory_saver" 2>/dev/null; then
  preload=$(python3 -c "from torch_memory_saver.utils import get_binary_path_from_package as p
print(p('torch_memory_saver_hook_mode_preload'))")
  LD_PRELOAD=$preload timeout 100 python3 tests/integration/test_trainer_gpu.py tms \
    > "$out/trainer_gpu_tests_preload.log" 2>&1 || status=1
fi
grep -HE "^(PASS|FAIL|SKIP)|step [0-9]:|freed|hook mode" "$out"/trainer_gpu_tests*.log
timeout 200 python3 bench/bench_sampler.py --only spikes --out "$out/bench" > "$out/spikes.log" 2>&1 || status=1
grep -iE "spike|caught|captured" "$out/spikes.log" | tail -6
echo "h200_checks: tests and spikes took ${SECONDS} s"
# Alternate until 45 s before the budget ends (torch's import, the warm-up and the read of the log come
# around it): the number of blocks follows from the machine's speed, not from a guess of it.
seconds=$(( budget - SECONDS - 45 ))
if [ "$seconds" -ge 40 ]; then
  timeout $(( budget - SECONDS )) python3 bench/overhead_ab.py --block-ms 250 --blocks 4000 --seconds "$seconds" \
    --seed 17 --out "$out/overhead_ab_default.json" 2>&1 | grep "^overhead_ab" || status=1
else
  echo "h200_checks: no time left for the overhead run"; status=1
fi
exit $status
