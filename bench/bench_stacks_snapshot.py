"""The 101 MiB, 2,000,000-entry stacks snapshot of issue 33 item 6, reported whole (time and memory).

    python -m bench.bench_stacks_snapshot RUN_DIR [--entries 2000000]

RUN_DIR is a recorded run with a `stacks` event and its `.stacks.pickle` (tests/faults/sweep.py's
one-process template: `record` then `_add_calibration_and_stacks`). Two copies are made in a
temporary directory: one with the snapshot as recorded, one with a plain-data history of `--entries`
allocations and frees (about 101 MiB at 2M); `visualize` reports each twice, interleaved, in a fresh
interpreter, and this prints each report's wall time and peak RSS (/usr/bin/time).
"""
from __future__ import annotations

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MiB = 1024 ** 2


def big_snapshot(entries: int) -> dict:
    frames = [{"filename": "/home/u/train.py", "line": 77, "name": "train_step"}]
    trace = [{"action": "alloc" if k % 2 == 0 else "free_completed", "addr": 4096 * (k // 2 + 1),
              "size": 64 * MiB - k % 4096, "stream": 0, "device": 0, "pool": 1, "frames": [frames[0]],
              "time_us": 1_700_000_000_000_000 + k} for k in range(entries)]
    return {"segments": [{"device": 0, "address": 4096, "total_size": 64 * MiB, "blocks": [
        {"address": 4096, "size": 64 * MiB, "requested_size": 64 * MiB, "state": "active_allocated",
         "frames": []}]}], "device_traces": [trace]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--entries", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stacks-bench-") as scratch:
        runs = {}
        for which in ("as_recorded", "big"):
            runs[which] = Path(shutil.copytree(args.run, Path(scratch) / which,
                                               ignore=shutil.ignore_patterns("*.arrow", "*.lock", "report.html")))
        (path,) = runs["big"].glob("*.stacks.pickle")
        path.write_bytes(pickle.dumps(big_snapshot(args.entries)))
        size = path.stat().st_size
        print(f"{path.name}: {size:,} bytes ({size / MiB:.1f} MiB), {args.entries:,} entries")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        for which in ("big", "as_recorded", "big", "as_recorded"):
            out = Path(scratch) / f"out-{which}"
            out.mkdir(exist_ok=True)
            done = subprocess.run(["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "miles_profile.visualize",
                                   str(runs[which]), "-o", str(out / "r.html"), "--json", str(out / "v.json")],
                                  env=env, capture_output=True, text=True)
            wall, rss_kib = done.stderr.strip().splitlines()[-1].split()
            print(f"{which:12} exit {done.returncode}  {float(wall):6.1f} s  peak RSS {int(rss_kib) / 1024:7.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
