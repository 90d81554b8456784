"""What the suite's Python processes pay to compile this checkout's modules when no bytecode cache may be
written (PYTHONDONTWRITEBYTECODE set, as on the development VM) against reading the caches, side by side,
alternating, in a copy of the checkout (`git archive HEAD`) so the working tree's caches play no part.

Why `make test` empties PYTHONDONTWRITEBYTECODE: the suite starts hundreds of Python processes (recorders,
trainers, `visualize`, dashboards, pytest's workers), and each one compiled what it imported from source.

    python bench/bytecode_cache_cost.py [--rounds 3]

Each row: the CPU-seconds of one child process (its rusage), median over the rounds; "cached" runs after one
process of that kind wrote the caches.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the suite starts most: a worker's collection of every test file, and the entry points tests run.
KINDS = {
    "pytest --collect-only (one xdist worker's collection)": ["-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"],
    "python -m miles_profile.record --help": ["-m", "miles_profile.record", "--help"],
    "python -m miles_profile.visualize sample_logs/cpu (its report)": [
        "-m", "miles_profile.visualize", "sample_logs/cpu", "-o", "{tmp}/report.html", "--json", "{tmp}/report.json"],
    "import trainer.train (torch included)": ["-c", "import trainer.train"],
    "import dashboards.serve": ["-c", "import dashboards.serve"],
}


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def drop_caches(tree: Path) -> None:
    for folder in tree.rglob("__pycache__"):
        shutil.rmtree(folder, ignore_errors=True)


def run(tree: Path, args: list[str], write: bool) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="" if write else "1")
    before = child_cpu_s()
    args = [a.replace("{tmp}", str(tree.parent)) for a in args]
    done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, timeout=300)
    if done.returncode not in (0, 1):  # visualize: 1 is a failing check, not a failed run
        raise SystemExit(f"{args}: exit {done.returncode}: {done.stderr.decode()[-500:]}")
    return child_cpu_s() - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bytecode-cost-") as tmp:
        tree = Path(tmp) / "checkout"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        print(f"{'process':62s} {'compiled':>9s} {'cached':>9s} {'ratio':>6s}  (CPU-s, median of {args.rounds})")
        for name, cmd in KINDS.items():
            compiled, cached = [], []
            for _ in range(args.rounds):
                drop_caches(tree)
                compiled.append(run(tree, cmd, write=False))
                run(tree, cmd, write=True)  # the first process writes the caches
                cached.append(run(tree, cmd, write=True))
            a, b = statistics.median(compiled), statistics.median(cached)
            print(f"{name:62s} {a:9.2f} {b:9.2f} {b / a:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
