"""Reading logs whose `end` events carry no phase summaries (older versions, other tools, a crash):
first read (parses the CSVs, leaves the cache) and cached read, wall time and peak RSS, against the
targets of issue 22 item 2.

    python bench/bench_read.py [--dir D] [--keep] [--repeat 2] [--only fleet|single]

Builds two synthetic logs in a temporary directory (or D), both without summaries:
  * fleet:  32 processes x 300,000 samples (one GPU each, 20 ms, 30 iterations of 7 phases),
  * single: one process of 10,000,000 samples (bench/make_synthetic_log.py).
Each read runs in a fresh child process. "per-phase numbers" is what whole-run analysis reads:
`load_run(dir, sample_pids=set())` (metas, events, phases), the phase summaries computed from the
samples files (`logdir.sample_summaries.summaries_from_samples`: one streamed pass per file, cached
beside it) and the fleet's `runmodel.phase_table.phase_table(run)`. With `--full`, "all samples as one
frame" is `load_run(dir)` (what a timeline of every process needs; the reader's columnar cache serves
its cached read of a file of 64 MiB or more). "first read" removes the caches first (the CSVs are in
the page cache: they were just written or read); "cached" is the best of --repeat reads. Time is
measured inside the child after its imports; peak RSS is the child's VmHWM.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import make_synthetic_log as synth  # noqa: E402

GiB = 1024 ** 3
TARGETS = {"fleet": (10.0, 10.0, 1 * GiB), "single": (5.0, 1.0, None)}  # first s, cached s, peak RSS


def write_fleet_log(out: Path, processes: int = 32, samples: int = 300_000, seed: int = 0) -> Path:
    """`processes` processes of `samples` rows each, in the real format, no summaries in the events.
    Each process starts a little later than the one before (rows interleave in time) and has its own
    noise; the phase pattern is make_synthetic_log's."""
    out.mkdir(parents=True, exist_ok=True)
    start = 1_700_000_000.0
    (out / "meta.json").write_text(json.dumps({
        "format_version": 1, "run_id": "bench-read", "command": ["bench/bench_read.py"], "host": synth.HOST,
        "pid": 1, "start_time": start, "interval_ms": synth.INTERVAL_S * 1000}))
    names = pa.array([p for p, _, _, _ in synth.PATTERN])
    for k in range(processes):
        pid, offset = 5000 + k, k * 0.0005
        stem = f"{synth.HOST}-{pid}"
        (out / f"{stem}.meta.json").write_text(json.dumps({
            "format_version": 1, "run_id": "bench-read", "host": synth.HOST, "pid": pid, "rank": k,
            "world_size": processes, "role": "actor", "start_time": start, "interval_ms": synth.INTERVAL_S * 1000,
            "end_time": start + offset + samples * synth.INTERVAL_S, "columns": synth.COLUMNS,
            "devices": [{"index": 0, "name": "NVIDIA H200 (synthetic)", "uuid": f"GPU-bench-{k}", "total": 141 * GiB}],
            "gpu_uuid": f"GPU-bench-{k}"}))
        columns, slot = synth._levels(samples, 0, np.random.default_rng(seed + k))
        t = np.round(start + offset + np.arange(samples) * synth.INTERVAL_S, 6)
        table = pa.table({"t": t, "phase": pa.DictionaryArray.from_arrays(pa.array(slot, pa.int32()), names),
                          **columns})
        with open(out / f"{stem}.samples.csv", "wb") as file:
            file.write((",".join(["t", "phase", *synth.COLUMNS]) + "\n").encode())
            pacsv.write_csv(table, file, pacsv.WriteOptions(include_header=False, quoting_style="none"))
        synth._write_events(out / f"{stem}.events.jsonl", samples, start + offset)
        _set_pid(out / f"{stem}.events.jsonl", pid)
    return out


def _set_pid(path: Path, pid: int) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    path.write_text("".join(json.dumps({**e, "pid": pid}) + "\n" for e in lines))


# -- the measured read, in a fresh child --------------------------------------------------------------
CHILD = r"""
import json, sys, time
started = time.perf_counter()
from miles_profile.logdir.reader import load_run
from miles_profile.logdir.sample_summaries import summaries_from_samples
from miles_profile.runmodel.phase_table import phase_table
imported = time.perf_counter()
cpu = time.process_time()
mode, path = sys.argv[1], sys.argv[2]
if mode == "analysis":  # what whole-run analysis reads: metas, events, per-phase numbers
    run = load_run(path, sample_pids=set())
    loaded = time.perf_counter()
    rows = len(summaries_from_samples(run))
    table = phase_table(run)
    assert table["rss_peak"].notna().all(), "a phase without its numbers"
else:  # every sample as one frame (what a timeline of every process needs)
    run = load_run(path)
    loaded = time.perf_counter()
    rows = len(run.samples)
done = time.perf_counter()
hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": done - imported, "load_s": loaded - imported, "cpu_s": time.process_time() - cpu,
                  "import_s": imported - started, "peak_rss": hwm, "rows": rows}))
"""


def measure(path: Path, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    load = os.getloadavg()[0]  # on a shared machine the wall time says as much about the others
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the read failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - started
    result["load"] = load
    return result


def drop_caches(path: Path) -> None:
    """Remove the reader's cache files (hidden, `.<name>.arrow`) so the next read is a first read."""
    for cache in path.glob(".*.arrow"):
        cache.unlink()


def _row(label: str, what: str, r: dict, target_s: float | None, target_rss: int | None) -> str:
    ok_s = "" if target_s is None else ("met" if r["seconds"] <= target_s else "MISSED")
    ok_m = "" if target_rss is None else ("met" if r["peak_rss"] <= target_rss else "MISSED")
    ts = f"<= {target_s:g} s" if target_s is not None else "-"
    tm = f"<= {target_rss / GiB:g} GiB" if target_rss is not None else "(stated)"
    return (f"| {label} | {what} | {r['seconds']:.2f} s ({r['cpu_s']:.1f} s CPU) | {ts} {ok_s} | "
            f"{r['peak_rss'] / GiB:.2f} GiB | {tm} {ok_m} | {r['wall_s']:.1f} s | {r['load']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where to write the logs (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the logs (and reuse them when present)")
    parser.add_argument("--repeat", type=int, default=2, help="cached reads per log (the best is shown)")
    parser.add_argument("--only", choices=("fleet", "single"))
    parser.add_argument("--processes", type=int, default=32)
    parser.add_argument("--rows", type=int, default=300_000, help="samples per process of the fleet log")
    parser.add_argument("--samples", type=int, default=10_000_000, help="samples of the single-process log")
    parser.add_argument("--full", action="store_true", help="also time load_run with every sample as one frame")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-read-"))
    logs = {"fleet": (root / "fleet", f"{args.processes} x {args.rows:,}",
                      lambda p: write_fleet_log(p, args.processes, args.rows)),
            "single": (root / "single", f"1 x {args.samples:,}", lambda p: synth.write_log(p, args.samples))}
    lines = ["| log | read | in-process time | target | peak RSS | target | child wall | load before |",
             "|---|---|---|---|---|---|---|---|"]
    try:
        for name, (path, label, write) in logs.items():
            if args.only and name != args.only:
                continue
            if not (path / "meta.json").exists():
                started = time.perf_counter()
                write(path)
                size = sum(f.stat().st_size for f in path.glob("*.samples.csv"))
                print(f"wrote {name} ({label} samples, {size / 1e9:.2f} GB of CSV) in {time.perf_counter() - started:.0f} s",
                      flush=True)
            first_s, cached_s, rss = TARGETS[name]
            modes = ["analysis"] + (["full"] if args.full else [])
            for mode in modes:
                drop_caches(path)
                what = "per-phase numbers" if mode == "analysis" else "all samples as one frame"
                lines.append(_row(label, f"{what}, first read", measure(path, mode), first_s if mode == "analysis" else None,
                                  rss if mode == "analysis" else None))
                print(lines[-1], flush=True)
                best = min((measure(path, mode) for _ in range(max(1, args.repeat))), key=lambda r: r["seconds"])
                lines.append(_row(label, f"{what}, cached", best, cached_s if mode == "analysis" else None,
                                  rss if mode == "analysis" else None))
                print(lines[-1], flush=True)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(f"\n{os.cpu_count()} CPU cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end "
          f"(in-process time excludes the interpreter start and imports)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
