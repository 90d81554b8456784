"""What the distributed additions cost per sample: the phase-summary update of each row and one host
sample (host memory + cgroup; NVML where present).

    python bench/bench_summaries.py [--rows 20000]

The summary update runs under the sampler's lock after every row (phase_summary.py); it is timed for
a CPU process's columns and for an 8-GPU process's, with 0, 1 and 3 open phases. The host sample runs
every 100 ms in one process per host (host_sampler.py).
"""
from __future__ import annotations

import argparse
import tempfile
import time

from miles_profile.host_sampler import HostSampler
from miles_profile.logdir.layout import new_run_dir
from miles_profile.logdir.writer import write_run_meta
from miles_profile.phase_summary import PhaseSummaries

CPU_COLUMNS = ["rss", "rss_peak", "disk"]
GPU8_COLUMNS = ["rss", "rss_peak", *[f"gpu{i}_{k}" for i in range(8) for k in ("alloc", "alloc_peak", "reserved")],
                "pinned", "disk"]


def per_row_us(columns: list[str], open_phases: int, rows: int) -> float:
    tracker = PhaseSummaries(columns)
    for k in range(open_phases):
        tracker.open(k)
    values = [2 ** 33 + i for i in range(len(columns))]
    values[-1] = None  # a sparse column, empty in most rows
    start = time.perf_counter()
    for i in range(rows):
        tracker.add(float(i), values)
    return (time.perf_counter() - start) / rows * 1e6


def host_sample_us(samples: int) -> tuple[float, str]:
    run_dir = new_run_dir(tempfile.mkdtemp())
    write_run_meta(run_dir, {"run_id": "bench"})
    sampler = HostSampler(run_dir, interval_s=3600, prefer=True).start()  # the thread stays asleep
    start = time.perf_counter()
    for _ in range(samples):
        sampler.sample()
    cost = (time.perf_counter() - start) / samples * 1e6
    gpus = len(sampler.meta.get("gpus", []))
    sampler.stop()
    return cost, f"{gpus} GPUs" if gpus else "no NVML"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args(argv)
    print("phase-summary update per row (us):")
    for label, columns in (("CPU process", CPU_COLUMNS), ("8-GPU process", GPU8_COLUMNS)):
        cells = ", ".join(f"{n} open: {per_row_us(columns, n, args.rows):.2f}" for n in (0, 1, 3))
        print(f"  {label:14s} ({len(columns)} columns): {cells}")
    cost, what = host_sample_us(max(200, args.rows // 20))
    print(f"one host sample ({what}): {cost:.1f} us, every 100 ms in one process per host")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
