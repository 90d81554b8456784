#!/usr/bin/env bash
# The trainer on Ray (--launcher ray) on the GPU machine, recorded, in one device call:
#   scripts/ray_gpu.sh OUT_DIR [--cpu]      (.rayship/ from scripts/ray_pack.sh, carried: run(carry=[".rayship"]))
# 1. installs ray from .rayship/ into a temporary dir (the machine has no network and no ray);
# 2. starts a cluster (`ray start --head`, its own --temp-dir, no dashboard) with the machine's GPUs;
# 3. runs `record -- --launcher ray --nproc-per-node N <flags>` against it (RAY_ADDRESS): N ranks, their
#    critics and engines as Ray actors colocated on N GPUs through fractional bundles, offloads on;
# 4. stops the cluster by its processes' ids and counts what is left;
# 5. writes to OUT_DIR: logs.tar.gz (the run directory, flat), summary.json (processes with their Ray
#    identity and GPU, phases, offload_drop and oom verdicts, cluster.json, leftovers), train.log,
#    ray_start.log, install.log.
# --cost: instead, bench/ray_cost_breakdown.py (a two-node cluster on the machine; ROUNDS 1, STEPS 200; about
# a minute): OUT_DIR/ray_cost.json, the recorded actor's boundary costs, threads and malloc arenas there.
# --cpu: the same on this machine's CPU (preset tiny, 2 ranks, --use-critic): the test of every part but
# the GPU (tests/integration/test_ray_gpu_script.py). Environment: NPROC (default: the GPU count, CPU 2),
# TRAINER_FLAGS (flags of one run instead of the defaults in ray_gpu_run.py), RAY_SHIP (default .rayship;
# empty: use the ray this python imports already), PYTHON (default python3).
# Exit 0 only if ray installed, the trainer exited 0, every rank/engine (and critic) was recorded, and
# nothing of the cluster was left running. About 3-5 minutes on the GPU (gpu preset, 2 rollouts).
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [--cpu]}
case ${2:-} in --cpu) mode=cpu ;; --cost) mode=cost ;; "") mode=gpu ;; *) echo "usage: $0 OUT_DIR [--cpu|--cost]"; exit 2 ;; esac
mkdir -p "$out"
py=${PYTHON:-python3}
ship=${RAY_SHIP-.rayship}
site=$(mktemp -d /tmp/raysite.XXXXXX)
trap 'rm -rf "$site"' EXIT
# Keep NVLink multicast off in every process Ray starts (the GPU machines' rule: KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -n "$ship" ]; then
  (
    ls "$ship"/ray-*.tar.xz "$ship"/*.whl || exit 1
    tar -xJf "$ship"/ray-*.tar.xz -C "$site" || exit 1
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$ship"/*.whl || exit 1
  ) > "$out/install.log" 2>&1 || { echo "cannot install ray from $ship:"; cat "$out/install.log"; exit 1; }
  export PYTHONPATH=$PWD:$site${PYTHONPATH:+:$PYTHONPATH}
  "$py" -c "import ray, sys; print('ray', ray.__version__, 'from', ray.__file__); sys.exit(not ray.__file__.startswith('$site'))" \
    | tee -a "$out/install.log" || { echo "ray does not import from $site"; exit 1; }
else  # RAY_SHIP empty: the ray this python already imports (the CPU test)
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  "$py" -c "import ray; print('ray', ray.__version__, 'from', ray.__file__, '(not installed: RAY_SHIP empty)')" \
    | tee "$out/install.log" || exit 1
fi
if [ "$mode" = cost ]; then  # where a recorded actor's step cost goes, on this machine (docs/ray.md, "Cost")
  timeout 400 "$py" bench/ray_cost_breakdown.py --rounds "${ROUNDS:-1}" --steps "${STEPS:-200}" --env BREAKDOWN_MIMIC=1 \
    > "$out/ray_cost.json" 2> "$out/ray_cost.log"
  status=$?
  cat "$out/ray_cost.json"
  exit $status
fi
"$py" scripts/ray_gpu_run.py --out "$out" --mode "$mode"
