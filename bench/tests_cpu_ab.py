"""The machine's CPU for some test files at two commits, side by side: old, new, new, old, ... in one run.

The suite's wall time on the 2-core VM is its CPU over two cores, and that VM delivers 10 to 15 % more or less
work per CPU-second by hour: a change's saving shows only against the old code measured beside it.

    python bench/tests_cpu_ab.py OLD NEW [--rounds 2] -- tests/integration/test_trainer_torchrun.py ...

Each commit is checked out into its own temporary clone of this repository (sharing this checkout's .venv);
pytest runs there as `make test` does (`-n 2`, bytecode caches written, the CI hypothesis profile). Each line:
the commit, pytest's last line, the machine's busy CPU-seconds from /proc/stat (everything running, so run it on
an otherwise idle machine) and the wall time; then the medians and their ratio.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scratch_write_cost import busy_s  # the machine's busy CPU-seconds so far (/proc/stat)

REPO = Path(__file__).resolve().parents[1]


def checkout(commit: str, where: Path) -> Path:
    for git in (["clone", "-q", str(REPO), str(where)], ["-C", str(where), "checkout", "-q", commit]):
        done = subprocess.run(["git", *git], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"tests_cpu_ab.py: error: git {git[0] if git[0] != '-C' else 'checkout'} {commit}: "
                     f"{(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    (where / ".venv").symlink_to(REPO / ".venv")
    return where


def run_tests(clone: Path, tests: list[str]) -> tuple[str, float, float]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTHONPATH", None)
    busy, started = busy_s(), time.monotonic()
    done = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", *tests], cwd=clone, env=env, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    for line in lines:  # a failure is news: which test, not only how many
        if line.startswith(("FAILED ", "ERROR ")):
            print(f"    {line[:200]}", flush=True)
    return (lines[-1] if lines else done.stderr.strip()[-200:]), busy_s() - busy, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs, each new beside an old (default 2)")
    parser.add_argument("tests", nargs="+", help="test files or node ids, after --")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    cpu: dict[str, list[float]] = {args.old: [], args.new: []}
    with tempfile.TemporaryDirectory(prefix="tests-cpu-ab-") as tmp:
        clones = {c: checkout(c, Path(tmp) / name) for c, name in ((args.old, "old"), (args.new, "new"))}
        for clone in clones.values():  # each clone's bytecode caches written once, before anything is measured
            run_tests(clone, ["--collect-only", *args.tests])
        order = [c for r in range(args.rounds) for c in ((args.old, args.new) if r % 2 == 0 else (args.new, args.old))]
        for commit in order:
            last, busy, wall = run_tests(clones[commit], args.tests)
            cpu[commit].append(busy)
            print(f"{commit:>12}  {last[:60]:60}  machine {busy:6.1f} CPU-s  wall {wall:6.1f} s", flush=True)
        for clone in clones.values():
            shutil.rmtree(clone, ignore_errors=True)
    old, new = statistics.median(cpu[args.old]), statistics.median(cpu[args.new])
    print(f"median machine CPU-s: old {old:.1f}, new {new:.1f}; new/old {new / old:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
