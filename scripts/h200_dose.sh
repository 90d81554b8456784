#!/usr/bin/env bash
# What each of the recorder's reads costs the job per call (bench/overhead_dose.py at 400 calls a second,
# every load), then the recorder at 100 ms against its pause by alternation (bench/overhead_ab.py), in one
# device call (about 8 minutes):   scripts/h200_dose.sh OUT_DIR [AB_BLOCKS]
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [AB_BLOCKS]}
blocks=${2:-600}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
timeout 330 python3 bench/overhead_dose.py --rate 400 --blocks 160 --block-ms 100 --out "$out/overhead_dose.json" \
  2>&1 | grep -E "^overhead_dose|Error" || status=1
timeout 200 python3 bench/overhead_ab.py --interval-ms 100 --block-ms 250 --blocks "$blocks" --seed 13 \
  --out "$out/overhead_ab_100ms.json" 2>&1 | grep "^overhead_ab" || status=1
exit $status
