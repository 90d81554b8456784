#!/usr/bin/env bash
# Record every CUDA case of the workload corpus (tests/corpus/manifest.py CUDA_CASES) on one H200, flat:
# OUT_DIR/<case>/run-*/, then OUT_DIR/corpus_logs.tgz. Judging happens elsewhere (no plotly here):
#   scripts/h200_corpus.sh OUT_DIR                               # on the H200, from the repo root
#   tar xzf corpus_logs.tgz -C LOGS && PYTHONPATH=. python3 bench/verdicts.py --device cuda --logs LOGS
# ONLY="llama mlp-none" records the cases whose names contain one of the words; BUDGET_S=N stops recording
# after N seconds and still packs what was recorded. The rank-imbalance
# case stays a CPU (gloo, 8 ranks) case: DDP on one GPU cannot show a bad rank among GPU peers.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
device=${DEVICE:-cuda}  # DEVICE=cpu (PYTHON=.venv/bin/python): the same logic over the CPU cases (a dry run on a machine without a GPU)
timeout "${BUDGET_S:-0}" "${PYTHON:-python3}" bench/verdicts.py --device "$device" --logs "$out/logs" --record-only ${ONLY:+--only $ONLY} \
  2>&1 | tee "$out/record.log"
status=${PIPESTATUS[0]}
# what each program printed last, so a failed case can be read without unpacking
for f in "$out"/logs/*/program.log; do echo "== $f"; tail -n 3 "$f"; done > "$out/programs_tail.log"
tar czf "$out/corpus_logs.tgz" -C "$out/logs" .
du -sh "$out/corpus_logs.tgz"
exit $status
