#!/usr/bin/env bash
# record --stacks on the H200 in one device call (about 4 minutes, at most 8 by the timeouts; 207 s on 2026-12-04):
#   scripts/h200_stacks.sh OUT_DIR
# 1. the CUDA tests of --stacks (tests/integration/test_stacks_cuda.py, as a script: no pytest needed);
# 2. the trainer's 4-both configuration (gpu preset, 3 rollouts) recorded with --stacks (the peak rule: the
#    kind that held the peak in iteration 0 is recorded in iteration 1), its log copied to OUT_DIR/stacks-run
#    and the sites at the snapshot's peak written to OUT_DIR/stacks_sites.json (report/stacks.py: pandas only,
#    so the figures come back even if the snapshot pickle is over what a device call returns);
# 3. the overhead (bench/stacks_overhead.py): history on / off per step of the launch-bound loop (A/B quads as
#    bench/overhead_ab.py), and whole runs with no stacks, --stacks bounded to one phase, history on all run.
# Runs from source with the python3 on PATH, as on the GPU machine.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0
timeout 150 python3 tests/integration/test_stacks_cuda.py > "$out/tests_stacks_cuda.log" 2>&1 || status=1
grep -HE "^(PASS|FAIL|SKIP)|snapshot" "$out/tests_stacks_cuda.log"
logs=$(mktemp -d)
timeout 200 python3 -m miles_profile.record --log-dir "$logs" --interval-ms 20 --stacks -- \
  --preset gpu --num-rollout 3 --offload-train --offload-rollout --rollout-memory-backend builtin \
  > "$out/stacks_run.log" 2>&1 || status=1
tail -3 "$out/stacks_run.log"
run=$(ls -d "$logs"/run-* 2>/dev/null | head -1)
if [ -n "$run" ]; then
  cp -r "$run" "$out/stacks-run"
  python3 - "$run" > "$out/stacks_sites.json" <<'EOF' || status=1
import json, sys
from miles_profile.logdir.reader import load_run
from miles_profile.report.stacks import stacks_of, stacks_records
print(json.dumps(stacks_records(stacks_of(load_run(sys.argv[1]))), indent=1))
EOF
  python3 - "$out/stacks_sites.json" <<'EOF'
import json, sys
for s in json.load(open(sys.argv[1])):
    print(f"stacks: pid {s['pid']} {s['status']} {s['phase']} #{s['iteration']} ({s['rule']}) {s['reason']}")
    for d in s["devices"]:
        print(f"  GPU {d['device']}: peak {d['peak_bytes'] / 2**30:.3f} GiB, {d['entries']} entries, full {d['truncated']}")
        for site in d["sites"][:5]:
            print(f"    {site['bytes'] / 2**20:10.1f} MiB  {site['count']:6d}  {site['site']} ({site['function']})")
EOF
fi
timeout 200 python3 bench/stacks_overhead.py --out "$out/stacks_overhead.json" > "$out/stacks_overhead.log" 2>&1 \
  || status=1
grep "^stacks_overhead" "$out/stacks_overhead.log"
exit $status
