"""What one integration step phase costs the recorded process (its begin and end rows and events), with
and without glibc's heap read at its boundaries, interleaved in one process under `record --exec`.

An integration's step phase (`phases.step_phase`, integrations/steps.py) leaves the heap unread at its
boundaries; an ordinary `phase()` reads it (mallinfo2, for offload_drop). Each measured phase is opened
after a busy-wait step (caches as cold as after real work) and closed after another; the arm of each
phase is seeded at random. Printed: this thread's CPU time per phase (begin + end), median and mean.

    PYTHONPATH=. python bench/step_phase_cost.py [--phases 200] [--step-ms 50]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.under_record import rerun_under_record  # noqa: E402


def busy_step(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def measure(args) -> None:
    import torch  # noqa: F401 -- a trainer's heap: mallinfo2 walks every free chunk
    import transformers  # noqa: F401

    import miles_profile as mp
    from miles_profile import phases, recorder

    mp.annotate(bench="step_phase_cost")  # starts this process's recorder
    rec = recorder.active()
    rng = random.Random(args.seed)
    cpu: dict[str, list[float]] = {"step_phase (no heap read)": [], "phase (heap read)": []}
    for i in range(args.phases):
        arm = rng.choice(list(cpu))
        opener = phases.step_phase if arm.startswith("step_phase") else phases.phase
        busy_step(args.step_ms / 1e3)
        c0 = time.thread_time()
        opened = opener("train", step=i, rollout_id=i)
        opened.__enter__()
        c1 = time.thread_time()
        busy_step(args.step_ms / 1e3)
        c2 = time.thread_time()
        opened.__exit__(None, None, None)
        cpu[arm].append(c1 - c0 + time.thread_time() - c2)
        # An ordinary phase makes every later boundary read the heap (the process tags phases of its own):
        # undone here so that the two arms keep measuring what each does alone.
        rec._own_phases = False
    for arm, values in cpu.items():
        print(f"{arm}: {len(values)} phases, CPU per phase median {statistics.median(values) * 1e6:.0f} us, "
              f"mean {statistics.mean(values) * 1e6:.0f} us")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in-process", action="store_true", help="run here, not under record --exec")
    args = parser.parse_args(argv)
    if not args.in_process:
        code = rerun_under_record(__file__, "step_phase_cost_", argv)
        if code is not None:
            return code
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
