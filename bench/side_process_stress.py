"""Fork beside pyarrow's thread pools at work, again and again: no child may hang or fail.

    python bench/side_process_stress.py [--runs 200] [--rows 200000]

logdir/side_process.py forks `visualize` after pyarrow's pools have started (the ledger's child) and
while jemalloc's background thread runs (the NVML child). A fork while another thread holds a lock
(a pool's queue, an allocator's arena) can leave the child waiting on it for ever. Here a thread keeps
pyarrow's CPU and IO pools and its allocators busy (multi-threaded CSV reads, sorts, conversions to
pandas) while the main thread forks children that do the same work through side_process; each must
deliver within the wait. Prints the runs, failures, hangs and the children's round-trip times;
exit code 1 if any failed or hung.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from miles_profile.logdir import side_process  # noqa: E402


def _work(path: str) -> int:
    table = pacsv.read_csv(path)  # pyarrow's CPU and IO pools, its allocator
    order = pc.sort_indices(table, sort_keys=[("a", "ascending")])
    frame = table.take(order).to_pandas()
    return int(frame.groupby("s")["a"].sum().sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--wait", type=float, default=30.0, help="seconds a child may take (side_process.WAIT_S)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="side-stress-") as tmp:
        path = os.path.join(tmp, "t.csv")
        table = pa.table({"a": rng.integers(0, 1 << 40, args.rows),
                          "s": pa.array([f"name{k % 997}" for k in range(args.rows)])})
        pacsv.write_csv(table, path)
        expected = _work(path)
        stop = threading.Event()
        busy = [0]

        def keep_busy():
            while not stop.is_set():
                _work(path)
                busy[0] += 1

        thread = threading.Thread(target=keep_busy, daemon=True)
        thread.start()
        times, failed, hung = [], 0, 0
        with side_process.allowed():
            for k in range(args.runs):
                time.sleep(float(rng.uniform(0, 0.02)))  # fork at a different point of the thread's work each time
                started = time.monotonic()
                side = side_process.start(_work, path)
                ok, value = side.result(wait_s=args.wait) if side is not None else (False, None)
                took = time.monotonic() - started
                times.append(took)
                if took >= args.wait:
                    hung += 1
                elif not ok or value != expected:
                    failed += 1
        stop.set()
        thread.join()
    print(f"{args.runs} forks beside pyarrow at work ({busy[0]} passes of the busy thread, load average "
          f"{os.getloadavg()[0]:.1f}): {args.runs - failed - hung} delivered, {failed} failed, {hung} hung "
          f"(past {args.wait:g} s); round trip median {statistics.median(times) * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms")
    return 1 if failed or hung else 0


if __name__ == "__main__":
    sys.exit(main())
