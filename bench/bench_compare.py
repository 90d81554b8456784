"""Benchmark the phase-aligned comparison of two runs as their phase count grows.

    python bench/bench_compare.py [--phases 70 280 2000 10000] [--old-up-to 280] [--visualize]

Builds two runs in memory (a GPU and host series, 20 samples per phase, iterations of the seven
canonical phases; the second run 1.5x slower) and times, side by side:
  * new: `comparison_figure` + `comparison_html` as `visualize --compare` and the dashboard call them
    (phase bands as one filled trace per phase name);
  * old: the same figure with the bands added the way they were before (one `add_vrect` per phase),
    only up to --old-up-to phases (its cost grows with the square of the phase count).
With --visualize, also the whole `visualize A --compare B` CLI on the runs written as run directories.
Prints the traces and shapes of each figure: both must stay O(1) in phases for the new method.
Figures: docs/report.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from miles_profile.logdir.reader import EVENT_COLUMNS, Run, events_frame, phases_from_events  # noqa: E402

GiB = 1024 ** 3
PID = 4242
CYCLE = ["generate", "offload_rollout", "train", "offload_train", "onload_weights", "update_weights", "onload_kv"]
SAMPLES_PER_PHASE = 20


def synthetic_run(n_phases: int, name: str, slow: float = 1.0, seed: int = 0) -> Run:
    """`n_phases` back-to-back top-level phases, each 1 s * slow, sampled SAMPLES_PER_PHASE times."""
    rng = np.random.default_rng(seed)
    start = 1_700_000_000.0
    n = n_phases * SAMPLES_PER_PHASE
    t = start + np.arange(n) * slow / SAMPLES_PER_PHASE
    level = np.repeat(rng.integers(1, 60, n_phases), SAMPLES_PER_PHASE) * GiB
    samples = pd.DataFrame({"t": t, "phase": pd.Categorical([""] * n), "pid": np.int64(PID),
                            "rss": level // 4, "rss_peak": level // 4 + 1, "gpu0_alloc": level,
                            "gpu0_alloc_peak": level + rng.integers(0, GiB, n)})
    rows = []
    for k in range(n_phases):
        phase = CYCLE[k % len(CYCLE)]
        begin, end = start + k * slow, start + (k + 1) * slow - 1e-3
        rows.append({"t": begin, "kind": "begin", "name": phase, "pid": PID, "id": k + 1, "parent": None,
                     "attrs": {"rollout_id": k // len(CYCLE)}})
        rows.append({"t": end, "kind": "end", "name": phase, "pid": PID, "id": k + 1, "parent": None,
                     "attrs": {"status": "ok"}})
    events = events_frame(rows)
    assert list(events.columns) == EVENT_COLUMNS
    meta = {"format_version": 1, "command": ["bench"], "host": "bench", "start_time": start, "interval_ms": 50.0}
    processes = [{"pid": PID, "role": "in_process", "rank": 0,
                  "devices": [{"index": 0, "name": "synthetic", "uuid": "GPU-0", "total": 141 * GiB}],
                  "probes": [{"name": "host", "active": True, "total": 512 * GiB}]}]
    return Run(Path(name), meta, processes, samples, events, phases_from_events(events, samples), [])


def write_run(run: Run, out: Path) -> Path:
    """`run` as a run directory in the real log format (docs/log-format.md)."""
    out.mkdir(parents=True)
    stem = f"bench-{PID}"
    (out / "meta.json").write_text(json.dumps(run.meta))
    (out / f"{stem}.meta.json").write_text(json.dumps({**run.meta, **run.processes[0], "stem": stem,
                                                       "end_time": float(run.samples["t"].max())}))
    run.samples.drop(columns="pid").to_csv(out / f"{stem}.samples.csv", index=False, float_format="%.6f")
    with open(out / f"{stem}.events.jsonl", "w") as file:
        for event in run.events.to_dict("records"):
            event = {k: v for k, v in event.items() if not (k == "parent" and v != v)}
            file.write(json.dumps(event) + "\n")
    return out


def visualize_seconds(runs: list[Run]) -> float:
    """Wall time of `python -m miles_profile.visualize A --compare B` (reading, both reports, comparison)."""
    with tempfile.TemporaryDirectory() as tmp:
        a, b = (write_run(run, Path(tmp) / run.name) for run in runs)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(a), "--compare", str(b),
                               "-o", str(Path(tmp) / "report.html")], capture_output=True, text=True,
                              env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        if done.returncode not in (0, 1):
            sys.exit(f"visualize failed ({done.returncode}): {done.stderr}")
        return time.perf_counter() - started


def old_bands(fig, runs) -> None:
    """The bands as drawn before this benchmark existed: one add_vrect per phase slot."""
    from miles_profile.report.compare import _slot_order
    from miles_profile.report.figures import phase_color
    for j, key in enumerate(_slot_order(runs)):
        fig.add_vrect(x0=j, x1=j + 1, fillcolor=phase_color(key[1]), opacity=0.10, line_width=0, layer="below")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", type=int, nargs="+", default=[70, 280, 2000, 10_000])
    parser.add_argument("--old-up-to", type=int, default=280, help="time the old bands only up to this many phases")
    parser.add_argument("--visualize", action="store_true", help="also time the visualize CLI end to end")
    args = parser.parse_args(argv)
    from miles_profile.report import compare
    print(f"{'phases/run':>10} {'new figure s':>12} {'new html s':>10} {'traces':>6} {'shapes':>6}"
          f" {'old bands s':>11} {'old shapes':>10}" + (f" {'visualize s':>11}" if args.visualize else ""))
    for n in args.phases:
        runs = [synthetic_run(n, "a"), synthetic_run(n, "b", slow=1.5, seed=1)]
        started = time.perf_counter()
        fig = compare.comparison_figure(runs)
        figure_s = time.perf_counter() - started
        started = time.perf_counter()
        compare.comparison_html(runs)
        html_s = time.perf_counter() - started
        old = "-"
        old_shapes = "-"
        if n <= args.old_up_to:
            plain = compare.comparison_figure(runs)
            plain.data = [trace for trace in plain.data if trace.legendgroup != "phase bands"]
            started = time.perf_counter()
            old_bands(plain, runs)
            old = f"{time.perf_counter() - started:.2f}"
            old_shapes = str(len(plain.layout.shapes))
        print(f"{n:>10,} {figure_s:>12.2f} {html_s:>10.2f} {len(fig.data):>6} {len(fig.layout.shapes):>6}"
              f" {old:>11} {old_shapes:>10}" + (f" {visualize_seconds(runs):>11.2f}" if args.visualize else ""),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
