"""Cost of the fleet analysis at 64, 256 and 1,024 processes, printed side by side.

    python bench/bench_fleet.py [--sizes 64 256 1024] [--minutes 30] [--json OUT]

Each size runs in a fresh child process (so peak memory is its own): a synthetic PhaseTable
(miles_profile/runmodel/fleet_synthetic.py: hosts x 8 GPUs, an actor and an engine per GPU, `--minutes`
of the colocated loop at 13.5 s per iteration, about 600 phase instances per process), then
gpu_matrix, rank_outliers, the three fleet checks and the heatmap figure (serialized to JSON, as the
report and the dashboard do). It prints seconds per stage, the peak traced allocation of the analysis
(tracemalloc, in a second pass so tracing does not slow the timed one; numpy and pandas buffers are
included), the child's peak RSS (interpreter, imports and the table included), and each cost per 1,000 phase
instances, which stays flat or falls when growth is at most linear. Figures: docs/report.md.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPUS = 8


def measure(processes: int, minutes: float) -> dict:
    from miles_profile.runmodel import fleet
    from miles_profile.verdicts.fleet_checks import run_fleet_checks
    from miles_profile.report.fleet_figures import fleet_heatmap
    from miles_profile.runmodel.fleet_synthetic import GiB, MiB, iterations_for, synthetic_table

    hosts = processes // (2 * GPUS)
    iterations = iterations_for(minutes)
    started = time.perf_counter()
    table = synthetic_table(hosts, GPUS, iterations, hot_rank=(3, 3 * GiB), creep_rank=(5, 40 * MiB),
                            shortfall=(1, 2, 5 * GiB), keep_kv_rank=6)
    out = {"processes": processes, "hosts": hosts, "iterations": iterations, "phase_rows": len(table),
           "build_s": time.perf_counter() - started}
    stages, matrix, outliers, results, figure_json = _analysis(fleet, run_fleet_checks, fleet_heatmap, table)
    tracemalloc.start()  # a second pass for memory only: tracing slows allocation-heavy code
    _analysis(fleet, run_fleet_checks, fleet_heatmap, table)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out.update(stages)
    out["analysis_s"] = sum(stages.values())
    out["analysis_peak_traced_mb"] = peak / 2 ** 20
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["heatmap_json_mb"] = len(figure_json) / 1e6
    out["matrix"] = f"{matrix.bytes.shape[0]} x {matrix.bytes.shape[1]}"
    out["verdicts"] = {r.name: r.status for r in results}
    out["top_shortfall"] = outliers.shortfall.iloc[0]["label"] if len(outliers.shortfall) else None
    return out


def _analysis(fleet, run_fleet_checks, fleet_heatmap, table):
    stages = {}
    t = time.perf_counter()
    df = fleet.normalize(table)
    stages["normalize_s"] = time.perf_counter() - t
    t = time.perf_counter()
    matrix = fleet.gpu_matrix(df)
    stages["gpu_matrix_s"] = time.perf_counter() - t
    t = time.perf_counter()
    outliers = fleet.rank_outliers(df, matrix=matrix)
    stages["outliers_s"] = time.perf_counter() - t
    t = time.perf_counter()
    results = run_fleet_checks(df, matrix=matrix)
    stages["checks_s"] = time.perf_counter() - t
    t = time.perf_counter()
    figure_json = fleet_heatmap(matrix).to_json()
    stages["heatmap_s"] = time.perf_counter() - t
    return stages, matrix, outliers, results, figure_json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.minutes)))
        return 0
    results = []
    for n in args.sizes:
        done = subprocess.run([sys.executable, __file__, "--child", str(n), "--minutes", str(args.minutes)],
                              capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    _print(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _print(results: list[dict]) -> None:
    keys = [("phase_rows", "{:,}"), ("matrix", "{}"), ("build_s", "{:.2f}"), ("normalize_s", "{:.2f}"),
            ("gpu_matrix_s", "{:.2f}"), ("outliers_s", "{:.2f}"), ("checks_s", "{:.2f}"), ("heatmap_s", "{:.2f}"),
            ("analysis_s", "{:.2f}"), ("analysis_peak_traced_mb", "{:.0f}"), ("peak_rss_mb", "{:.0f}"),
            ("heatmap_json_mb", "{:.2f}")]
    print(f"{'processes':<26}" + "".join(f"{r['processes']:>14}" for r in results))
    for key, fmt in keys:
        print(f"{key:<26}" + "".join(f"{fmt.format(r[key]):>14}" for r in results))
    for key in ("analysis_s", "analysis_peak_traced_mb"):
        per = [r[key] / r["phase_rows"] * 1000 for r in results]
        print(f"{key + ' per 1k rows':<26}" + "".join(f"{p:>14.4f}" for p in per))
    print(f"{'verdicts':<26}" + "".join(f"{' '.join(v[0] for v in r['verdicts'].values()):>14}" for r in results))


if __name__ == "__main__":
    sys.exit(main())
