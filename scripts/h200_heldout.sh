#!/usr/bin/env bash
# A held-out program (PyTorch Lightning's BoringModel fitted by its own Trainer) under the real `record --exec`,
# its cost resolved by alternation inside one run (bench/heldout_ab.py): first the method's own noise (the
# recorder stopped in every block), then the recorder running in B blocks. About 2 + 4 minutes at the default:
#   scripts/h200_heldout.sh OUT_DIR [BLOCKS]        (the GPU machine has pytorch_lightning; on CPU: DEVICE=cpu)
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [BLOCKS]}
blocks=${2:-800}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0
for mode in null recorded; do
  n=$blocks; extra=()
  if [ "$mode" = null ]; then n=$(( blocks / 8 * 4 )); extra=(--null); fi
  timeout 400 "$py" -m miles_profile.record --log-dir "$out/logs-$mode" --exec -- "$py" bench/heldout_ab.py \
    --device "${DEVICE:-cuda}" --blocks "$n" --seed 23 --out "$out/heldout_ab_$mode.json" \
    "${extra[@]}" > "$out/heldout_$mode.log" 2>&1 || status=1
  grep "^heldout_ab" "$out/heldout_$mode.log" || tail -3 "$out/heldout_$mode.log"
done
(cd "$out" && tar czf logs.tgz logs-* && rm -rf logs-*)  # deep folders do not come back from the device
exit $status
