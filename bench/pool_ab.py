"""Several runs of bench/overhead_ab.py pooled into one ratio and interval.

One device call resolves the recorder's cost to about +-0.6%; calls on different machines (or on one
machine on different days) have different step times, so their seconds cannot simply be added. Each
run's quads are scaled by that run's mean A step, then the scaled quads are resampled within each run
(a stratified bootstrap) and the ratio of the pooled B and A sums is taken: every quad weighs the same.

    python bench/pool_ab.py RUN.json [RUN.json ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def pooled_ratio(runs: list[dict], resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """(B/A ratio of the pooled scaled quads, 2.5th and 97.5th percentile of the stratified bootstrap)."""
    rng = np.random.default_rng(seed)
    scaled = []
    for run in runs:
        a, b = np.asarray(run.get("quad_seconds_a", ()), float), np.asarray(run.get("quad_seconds_b", ()), float)
        if len(a) == 0 or len(a) != len(b):
            raise ValueError("a run without per-quad seconds (bench/overhead_ab.py writes them with --out)")
        scale = a.mean()
        scaled.append((a / scale, b / scale))
    ratio = sum(b.sum() for _, b in scaled) / sum(a.sum() for a, _ in scaled)
    boot_a, boot_b = np.zeros(resamples), np.zeros(resamples)
    for a, b in scaled:
        idx = rng.integers(0, len(a), size=(resamples, len(a)))
        boot_a += a[idx].sum(axis=1)
        boot_b += b[idx].sum(axis=1)
    boot = boot_b / boot_a
    return float(ratio), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/pool_ab.py", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="JSON files written by bench/overhead_ab.py --out")
    args = parser.parse_args(argv)
    runs = []
    for path in args.runs:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            parser.error(f"{path}: {exc}")
    try:
        ratio, lo, hi = pooled_ratio(runs)
    except ValueError as exc:
        parser.error(str(exc))
    for path, r in zip(args.runs, runs):
        print(f"pool_ab: {path}: {r.get('interval_ms')} ms, {len(r['quad_seconds_a']) * 4} blocks, "
              f"{r.get('step_ms_a')} ms a step, ratio {r.get('ratio')} {r.get('ci95')}")
    intervals = {r.get("interval_ms") for r in runs}
    if len(intervals) > 1:
        print(f"pool_ab: warning: the runs were recorded at different intervals {sorted(map(str, intervals))}")
    print(f"pool_ab: pooled over {sum(len(r['quad_seconds_a']) * 4 for r in runs)} blocks: ratio {ratio:.4f}, "
          f"95% interval [{lo:.4f}, {hi:.4f}] (+-{(hi - lo) / 2 * 100:.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
