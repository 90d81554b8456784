"""Print what each probe read in a run: per phase, the peak of every column (GiB). No plotting."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import miles_profile as mp  # noqa: E402
from miles_profile.logdir import find_runs  # noqa: E402

GiB = 1024 ** 3

for run_dir in find_runs(Path(sys.argv[1])):
    run = mp.load(run_dir)
    s = run.samples
    print(f"== {run_dir.name}: {len(s)} samples, devices {run.devices}, warnings {run.warnings}")
    for p in run.processes:
        print("  process", p["pid"], p["role"], [(q["name"], q.get("active"), q.get("reason", "")) for q in p["probes"]])
    cols = [c for c in s.columns if c not in ("t", "phase", "pid")]
    table = s.groupby(["pid", "phase"], observed=True)[cols].max() / GiB
    print(table.round(3).to_string())
