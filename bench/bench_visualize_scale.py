"""`visualize` end to end at the fleet shapes of issue 35, each against its target, side by side.

    nice -n 10 python bench/bench_visualize_scale.py [--cases rows fleet] [--dir DIR] [--keep]
                                                     [--base CHECKOUT --rounds N]

rows:  32 processes (2 hosts x 8 GPUs, an actor and an engine per GPU) of 300,000 samples each (250 min
       at 50 ms), written WITHOUT phase summaries (as a crashed run or a foreign log is): the reader, the
       ledger, the checks and the figures must all come from the samples. Target: 10 s, 1 GiB peak RSS.
fleet: 1,024 processes (64 hosts), 30 min, with summaries. Target: 10 s.

The runs are bench/bench_fleet_visualize.py's writer (the real log format; samples files of the same GPU
index and role are hard links of one file). visualize runs in a child with the reader's arrow cache off
(MILES_PROFILE_CACHE=0: every run is a first read); its wall time and peak RSS (getrusage of children)
and CPU time (user + system: what the command costs whatever else runs) are printed. Run it alone: the
machine's other load counts in the wall time (the load average is printed).

--base CHECKOUT: the same runs with another checkout's code too (`git worktree add DIR COMMIT`), the two
alternated (base first in odd rounds, this one first in even ones) for --rounds rounds; the medians and the
median of the per-round ratios this/base are printed: on a shared machine the ratio is the figure to quote.
"""
from __future__ import annotations

import argparse
import os
import statistics
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fleet_visualize import INTERVAL_S, REPO, measure, write_run  # noqa: E402

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
    parser.add_argument("--base", type=Path, help="another checkout to measure alternately (A/B)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-visualize-scale-"))
    codes = ([("base", args.base.resolve())] if args.base else []) + [("this", REPO)]
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
            results = {code: [] for code, _ in codes}
            for k in range(args.rounds):
                for code, repo in (codes if k % 2 == 0 else codes[::-1]):
                    result = measure(run_dir, None, repo)
                    if args.verbose or result["exit"] not in (0, 1):
                        print(result["output"])
                    results[code].append(result)
            rows.append((name, processes, summaries, csv_bytes, written, results, wall_target, rss_target))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(f"visualize end to end (load average {load[0]:.1f} on {os.cpu_count()} cores; cache off; "
          f"{args.rounds} round(s), medians)")
    print(f"{'case':>6} {'code':>5} {'processes':>9} {'summaries':>9} {'CSV GB':>7} {'exit':>4} {'wall s':>7} "
          f"{'CPU s':>6} {'target':>6} {'peak RSS GiB':>12} {'target':>6} {'write s':>7}")
    for name, processes, summaries, csv_bytes, written, results, wall_target, rss_target in rows:
        rss_t = f"{rss_target / GiB:.1f}" if rss_target else "-"
        for code, found in results.items():
            med = {k: statistics.median(r[k] for r in found) for k in ("wall_s", "cpu_s", "peak_rss")}
            print(f"{name:>6} {code:>5} {processes:>9} {'yes' if summaries else 'no':>9} {csv_bytes / 1e9:>7.2f} "
                  f"{found[-1]['exit']:>4} {med['wall_s']:>7.1f} {med['cpu_s']:>6.1f} {wall_target:>6.0f} "
                  f"{med['peak_rss'] / GiB:>12.2f} {rss_t:>6} {written:>7.1f}")
        if "base" in results:
            pairs = list(zip(results["this"], results["base"]))
            cpu = statistics.median(a["cpu_s"] / b["cpu_s"] for a, b in pairs)
            wall = statistics.median(a["wall_s"] / b["wall_s"] for a, b in pairs)
            rss = statistics.median(a["peak_rss"] / b["peak_rss"] for a, b in pairs)
            rounds = ", ".join(f"{b['wall_s']:.1f}/{a['wall_s']:.1f}" for a, b in pairs)
            print(f"{name:>6} this/base: wall {wall:.3f}, CPU {cpu:.3f}, peak RSS {rss:.3f} (median of "
                  f"{len(pairs)} rounds' ratios; wall base/this per round: {rounds} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
