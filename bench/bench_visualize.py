"""Benchmark `python -m miles_profile.visualize` on a 10-million-sample synthetic log.

    python bench/bench_visualize.py [--samples 10000000] [--repeat 3] [--no-naive]

Prints, side by side, the reduced report (end-to-end wall and CPU time of the CLI, HTML size, points
drawn) and a naive plot of all points (time and size), and verifies that the global peak and every
phase's peak of every series appear in the reduced figure exactly as recorded. Figures: docs/report.md.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from make_synthetic_log import write_log  # noqa: E402


def _cli(log: Path, out: Path) -> tuple[float, float, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(log), "-o", str(out)],
                            env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in (0, 1):
        sys.exit(f"visualize failed ({result.returncode}): {result.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, result.returncode


def verify_peaks(log: Path) -> tuple[int, int, int]:
    """(points drawn, phases x series checked, mismatches): every phase peak and the global peak exact."""
    from miles_profile.logdir.reader import load_run
    from miles_profile.report.figures import run_start, timeline_figure
    from miles_profile.runmodel.reduce import phase_ranges
    from miles_profile.runmodel.series import GiB, series_arrays, timeline_series

    run = load_run(log)
    figure = timeline_figure(run)
    t0 = run_start(run)
    traces = {tr.name: tr for tr in figure.data if tr.type == "scatter"}
    starts, ends = run.phases["start"].to_numpy(float), run.phases["end"].to_numpy(float)
    checked = mismatches = points = 0
    for s in timeline_series(run):
        trace = traces[s.label]
        x, y = np.asarray(trace.x, dtype=float), np.asarray(trace.y, dtype=float)
        points += len(x)
        t, raw = series_arrays(run, s.pid, s.column)
        if not np.isfinite(raw).any():
            continue
        if np.nanmax(y) != np.nanmax(raw) / GiB:
            mismatches += 1
        # phase ranges on the raw times and on the drawn times select the same samples
        r0, r1 = phase_ranges(t, starts, ends)
        d0, d1 = phase_ranges(x + t0, starts, ends)
        for a, b, c, d in zip(r0, r1, d0, d1):
            part = raw[a:b]
            if not np.isfinite(part).any():
                continue
            checked += 1
            drawn = y[c:d]
            if not (np.isfinite(drawn).any() and np.nanmax(drawn) == np.nanmax(part) / GiB):
                mismatches += 1
    return points, checked, mismatches


def naive(log: Path, out: Path) -> tuple[float, int, int]:
    """Every sample of every series in one figure, written the same way."""
    from miles_profile.logdir.reader import load_run
    from miles_profile.report.figures import timeline_figure
    started = time.perf_counter()
    run = load_run(log)
    figure = timeline_figure(run, max_points=10 ** 12)
    figure.write_html(str(out), include_plotlyjs=True)
    points = sum(len(tr.x) for tr in figure.data if tr.type == "scatter")
    return time.perf_counter() - started, out.stat().st_size, points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out")
    parser.add_argument("--no-naive", dest="naive", action="store_false")
    args = parser.parse_args()
    log = args.out / f"synthetic-{args.samples}"
    if not (log / "meta.json").exists():
        started = time.perf_counter()
        write_log(log, args.samples)
        print(f"wrote the synthetic log {log} in {time.perf_counter() - started:.1f} s")
    size = sum(f.stat().st_size for f in log.iterdir() if f.is_file() and not f.name.startswith("."))
    print(f"log: {args.samples:,} samples, {size / 1e9:.2f} GB on disk; machine: {os.cpu_count()} cores; "
          f"load average now {os.getloadavg()[0]:.1f}")
    out = args.out / "report.html"
    for cache in log.glob(".*.arrow"):  # cold: the first read parses the CSV (and leaves the columnar cache)
        cache.unlink()
    cold_wall, cold_cpu, _ = _cli(log, out)
    runs = [_cli(log, out) for _ in range(args.repeat)]  # warm: later reads map the cache
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    html_size = out.stat().st_size
    points, checked, mismatches = verify_peaks(log)
    rows = [("end-to-end wall, first read, s", f"{cold_wall:.1f}"),
            ("CPU time (user+sys), first read, s", f"{cold_cpu:.1f}"),
            ("end-to-end wall, cached, s (min/med)", f"{min(walls):.1f} / {statistics.median(walls):.1f}"),
            ("CPU time (user+sys), cached, s", f"{min(cpus):.1f}"), ("HTML size, MB", f"{html_size / 1e6:.1f}"),
            ("points drawn", f"{points:,}"),
            ("phase peaks exact", f"{checked - mismatches:,} of {checked:,}" + (" OK" if not mismatches else " FAIL"))]
    naive_cells = ["", "", "", "", "", "", "n/a"]
    if args.naive:
        wall, nbytes, npoints = naive(log, args.out / "naive.html")
        naive_cells = [f"{wall:.1f}", "", "", "", f"{nbytes / 1e6:.0f}", f"{npoints:,}", "all points"]
    print(f"\n{'':36} {'visualize (reduced)':>22} {'naive (all points)':>22}")
    for (label, value), other in zip(rows, naive_cells):
        print(f"{label:36} {value:>22} {other:>22}")
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
