"""Seconds per rollout of the data-parallel trainer under torchrun, 1, 2 and 4 ranks, with and without
`record`, printed side by side.

    python bench/bench_dist.py [--ranks 1 2 4] [--num-rollout 5] [--preset tiny]

Every configuration runs N ranks under `python -m torch.distributed.run --standalone`, each with its
rollout engine in its own process (the torchrun default). Seconds per rollout is the median of the
"step" times rank 0 prints, the first rollout left out (it pays for first-touch allocations); rank 0
waits for every peer in the gradient all-reduce, so its step is the slowest rank's. Start-up (imports,
engine start, rendezvous) is reported apart as wall time of the whole command.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^rollout \d+/\d+ .* step ([0-9.]+)s$", re.M)


@dataclass(frozen=True)
class Timing:
    ranks: int
    recorded: bool
    step_s: float    # median seconds per rollout, first one excluded
    wall_s: float    # the whole command, start-up included


def command(ranks: int, recorded: bool, train_args: list[str], log_dir: str) -> list[str]:
    if recorded:
        return [sys.executable, "-m", "miles_profile.record", "--log-dir", log_dir, "--",
                "--nproc-per-node", str(ranks), *train_args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
            "-m", "trainer.train", *train_args]


def measure(ranks: int, recorded: bool, train_args: list[str]) -> Timing:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as log_dir:
        start = time.monotonic()
        result = subprocess.run(command(ranks, recorded, train_args, log_dir), cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"bench_dist: {ranks} ranks, recorded={recorded} failed:\n{result.stderr[-2000:]}")
    steps = [float(s) for s in STEP.findall(result.stdout)]
    return Timing(ranks, recorded, statistics.median(steps[1:] or steps), wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--num-rollout", type=int, default=5)
    parser.add_argument("--preset", default="tiny")
    args = parser.parse_args(argv)
    train_args = ["--preset", args.preset, "--num-rollout", str(args.num_rollout)]
    print(f"{os.cpu_count()} CPU cores; preset {args.preset}, {args.num_rollout} rollouts, engine server per rank")
    print(f"{'ranks':>5}  {'s/rollout':>10}  {'recorded':>10}  {'ratio':>6}  {'wall s':>7}  {'recorded':>9}")
    for n in args.ranks:
        plain, recorded = measure(n, False, train_args), measure(n, True, train_args)
        print(f"{n:>5}  {plain.step_s:>10.3f}  {recorded.step_s:>10.3f}  {recorded.step_s / plain.step_s:>6.2f}  "
              f"{plain.wall_s:>7.1f}  {recorded.wall_s:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
