#!/usr/bin/env bash
# A held-out program (PyTorch Lightning's BoringModel fitted by its own Trainer: scripts/heldout_lightning.py)
# with and without `record --exec`, interleaved ABBAAB, each run's fit seconds printed (about 2 minutes):
#   scripts/h200_heldout.sh OUT_DIR [STEPS]          (the GPU machine has pytorch_lightning; on CPU: DEVICE=cpu)
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [STEPS]}
steps=${2:-6000}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
program=("$py" scripts/heldout_lightning.py --steps "$steps" --device "${DEVICE:-cuda}")
status=0
for cond in A B B A A B; do
  if [ "$cond" = A ]; then
    line=$(timeout 120 "${program[@]}" 2>&1 | grep "^fit_s") || status=1
  else
    line=$(timeout 120 "$py" -m miles_profile.record --log-dir "$out/logs" --exec -- "${program[@]}" 2>&1 | grep "^fit_s") || status=1
  fi
  echo "heldout $cond $line" | tee -a "$out/heldout.txt"
done
awk '$3 == "fit_s" { s[$2] += $4; n[$2]++ } END { if (n["A"] && n["B"]) printf "heldout: recorded / plain fit time %.4f (%d runs each)\n", (s["B"] / n["B"]) / (s["A"] / n["A"]), n["A"] }' "$out/heldout.txt"
exit $status
