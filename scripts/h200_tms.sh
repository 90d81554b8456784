#!/usr/bin/env bash
# torch_memory_saver on the H200 in one device call (about 5 minutes, at most 9 by the timeouts):
#   scripts/h200_tms.sh OUT_DIR          (the wheel in .whl/, carried: run(carry=[".whl"]))
# installs the wheel into /tmp/site; runs the GPU tests of the torch_memory_saver paths in torch hook
# mode, then again in preload mode (LD_PRELOAD of the package's library, as SGLang runs it);
# bench/bench_tms.py at the gpu preset; bench/overhead_ab.py (200 alternating blocks) and its A/A null.
# Seven files under OUT_DIR. Runs from source with the python3 on PATH.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "cannot install torch_memory_saver from .whl/"; exit 1; }
export PYTHONPATH=.:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
python3 -c "import torch_memory_saver" || exit 1
preload=$(python3 -c "from torch_memory_saver.utils import get_binary_path_from_package as p
print(p('torch_memory_saver_hook_mode_preload'))")
timeout 100 python3 tests/integration/test_trainer_gpu.py tms > "$out/tests_torch_hook.log" 2>&1 || status=1
LD_PRELOAD=$preload timeout 100 python3 tests/integration/test_trainer_gpu.py tms \
  > "$out/tests_preload_hook.log" 2>&1 || status=1
grep -HE "^(PASS|FAIL|SKIP)|freed|RSS|order|hook mode" "$out"/tests_*.log
timeout 220 python3 bench/bench_tms.py --preset gpu --repeats 2 --out "$out/bench_tms.json" \
  > "$out/bench_tms.log" 2>&1 || status=1
cat "$out/bench_tms.log"
{ timeout 60 python3 bench/overhead_ab.py --blocks 200 --out "$out/overhead_ab.json" || status=1
  timeout 55 python3 bench/overhead_ab.py --blocks 200 --null --out "$out/overhead_ab_null.json" || status=1
} > "$out/overhead_ab.log" 2>&1
grep "^overhead_ab" "$out/overhead_ab.log"
exit $status
