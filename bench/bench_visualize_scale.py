"""`visualize` end to end at the fleet shapes of issue 35, each against its target, side by side.

    nice -n 10 python bench/bench_visualize_scale.py [--cases rows fleet] [--dir DIR] [--keep]

rows:  32 processes (2 hosts x 8 GPUs, an actor and an engine per GPU) of 300,000 samples each (250 min
       at 50 ms), written WITHOUT phase summaries (as a crashed run or a foreign log is): the reader, the
       ledger, the checks and the figures must all come from the samples. Target: 10 s, 1 GiB peak RSS.
fleet: 1,024 processes (64 hosts), 30 min, with summaries. Target: 10 s.

The runs are bench/bench_fleet_visualize.py's writer (the real log format; samples files of the same GPU
index and role are hard links of one file). visualize runs in a child with the reader's arrow cache off
(MILES_PROFILE_CACHE=0: every run is a first read); its wall time and peak RSS (getrusage of children)
and CPU time (user + system: what the command costs whatever else runs) are printed. Run it alone: the
machine's other load counts in the wall time (the load average is printed).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fleet_visualize import INTERVAL_S, measure, write_run  # noqa: E402

GiB = 1024 ** 3
CASES = {  # name: (processes, minutes, summaries, target wall s, target peak RSS bytes or None)
    "rows": (32, 300_000 * INTERVAL_S / 60, False, 10.0, 1 * GiB),
    "fleet": (1024, 30.0, True, 10.0, None),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--dir", help="where to write the runs (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the runs (a later --dir run reuses them)")
    parser.add_argument("--verbose", action="store_true", help="print visualize's output")
    args = parser.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-visualize-scale-"))
    rows = []
    try:
        for name in args.cases:
            processes, minutes, summaries, wall_target, rss_target = CASES[name]
            run_dir = root / name / f"run-{processes}"
            started = time.perf_counter()
            if not (run_dir / "meta.json").is_file():
                run_dir = write_run(root / name, processes, minutes, summaries=summaries)
            written = time.perf_counter() - started
            csv_bytes = sum(f.stat().st_size for f in run_dir.glob("*.csv"))  # each hard link: a file read
            result = measure(run_dir, None)
            if args.verbose or result["exit"] not in (0, 1):
                print(result["output"])
            rows.append((name, processes, summaries, csv_bytes, written, result, wall_target, rss_target))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(f"visualize end to end (load average {load[0]:.1f} on {os.cpu_count()} cores; cache off)")
    print(f"{'case':>6} {'processes':>9} {'summaries':>9} {'CSV GB':>7} {'exit':>4} {'wall s':>7} {'CPU s':>6} "
          f"{'target':>6} {'peak RSS GiB':>12} {'target':>6} {'write s':>7}")
    for name, processes, summaries, csv_bytes, written, r, wall_target, rss_target in rows:
        rss_t = f"{rss_target / GiB:.1f}" if rss_target else "-"
        print(f"{name:>6} {processes:>9} {'yes' if summaries else 'no':>9} {csv_bytes / 1e9:>7.2f} {r['exit']:>4} "
              f"{r['wall_s']:>7.1f} {r['cpu_s']:>6.1f} {wall_target:>6.0f} {r['peak_rss'] / GiB:>12.2f} {rss_t:>6} {written:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
