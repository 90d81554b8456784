#!/usr/bin/env bash
# One device call: the recorder's and trainer's GPU tests on the current code, then the public held-out GPU
# programs (tests/corpus/heldout_turn3/gpu_programs) and the class programs (tests/corpus/gpu_class_programs)
# recorded again under the real `record --exec` (auto-tagging on, heap at phase boundaries: the defaults);
# logs tarred into OUT_DIR and judged on the CPU machine (bench/heldout_turn3.py --judge-only or visualize).
#   scripts/h200_heldout3.sh OUT_DIR
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out/logs"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_probes.py tests/unit/test_host_sampler.py 2>&1 | tail -2 || status=1
timeout 150 python3 tests/integration/test_trainer_gpu.py > "$out/trainer_gpu_tests.log" 2>&1 || status=1
grep -HE "^(PASS|FAIL|SKIP)" "$out/trainer_gpu_tests.log" | cut -c1-160
rec() {  # name, timeout, command...
  local name=$1 t=$2; shift 2; local s=$SECONDS
  timeout "$t" python3 -m miles_profile.record --log-dir "$out/logs/$name" --exec -- "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(( SECONDS - s ))s"
}
hf=tests/corpus/heldout_turn3/gpu_programs
for d in none no_empty keep_optim late_free; do rec "hf_$d" 120 python3 $hf/hf_rl_loop.py --defect $d --iters 3; done
rec hf_leak 120 python3 $hf/hf_rl_loop.py --defect leak --iters 4
rec ddp_healthy 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 $hf/ddp_two_ranks.py
rec ddp_bad1 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 $hf/ddp_two_ranks.py --bad-rank 1
rec lora_none 120 python3 tests/corpus/gpu_class_programs/lora_resident.py
rec lora_keep_state 120 python3 tests/corpus/gpu_class_programs/lora_resident.py --defect keep_state
(cd "$out" && tar czf logs.tgz logs && rm -rf logs && tar czf outlogs.tgz *.log)
echo "h200_heldout3: ${SECONDS} s"
exit $status
