"""Where the suite's CPU goes inside each program: a system-wide `perf record` joined to suite_cpu's programs.

    perf record -e cpu-clock -a -F 49 -o /tmp/suite.perf -- sleep 900 &
    SUITE_CPU_KEEP=DIR python bench/suite_cpu.py -q -n 3 --dist loadgroup -p no:cacheprovider
    python bench/suite_perf.py /tmp/suite.perf DIR [--freq 49]

Per program (suite_cpu's kinds, by pid from DIR/programs.jsonl): CPU seconds sampled, the share spent in
Python's cyclic garbage collector (libpython's gc_collect_main and the traverse functions it calls), in the
kernel, and the hottest symbol. How the collector's 13.6 % of the suite was found (docs/benchmarks.md, Round 12).
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path

GC_SYMBOLS = {"gc_collect_main", "visit_decref", "visit_reachable", "PyObject_IS_GC",
              "_PyObject_VisitInstanceAttributes", "move_unreachable", "update_refs", "subtract_refs"}


def is_gc(symbol: str, dso: str) -> bool:
    return "libpython" in dso and (symbol in GC_SYMBOLS or symbol.endswith("_traverse") or symbol == "traverse")


def samples(perf_data: Path):
    """(pid, symbol, dso) of every sample that is not the idle task."""
    done = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "pid,comm,ip,sym,dso"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:  # e.g. `perf record` still writing it
        lines = done.stderr.strip().splitlines()
        raise SystemExit(f"suite_perf: perf script cannot read {perf_data}: {lines[-1] if lines else done.returncode}")
    out = done.stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] != "swapper":
            yield int(parts[1]), parts[3], parts[-1].strip("()")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/suite_perf.py", description=__doc__.splitlines()[0])
    parser.add_argument("perf_data", type=Path)
    parser.add_argument("keep_dir", type=Path, help="suite_cpu's SUITE_CPU_KEEP folder (programs.jsonl)")
    parser.add_argument("--freq", type=float, default=49.0, help="perf record's -F (default: %(default)s)")
    args = parser.parse_args(argv)
    programs = args.keep_dir / "programs.jsonl"
    if not programs.is_file() or not args.perf_data.is_file():
        print(f"suite_perf: need {args.perf_data} and {programs}", file=sys.stderr)
        return 2
    kind = {row["pid"]: row["kind"] for row in map(json.loads, programs.read_text().splitlines())}
    total, gc, kernel = collections.Counter(), collections.Counter(), collections.Counter()
    hottest: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for pid, symbol, dso in samples(args.perf_data):
        program = kind.get(pid, "(not seen by the scans)")
        total[program] += 1
        gc[program] += is_gc(symbol, dso)
        kernel[program] += "kernel" in dso
        hottest[program][symbol] += 1
    every = sum(total.values())
    print(f"suite_perf: {every / args.freq:.0f} CPU-s sampled; Python's cyclic GC {sum(gc.values()) / every:.1%}, "
          f"the kernel {sum(kernel.values()) / every:.1%}")
    print(f"{'CPU s':>8} {'GC':>6} {'kernel':>7}  {'program':40} hottest symbol")
    for program, n in total.most_common(30):
        symbol, hits = hottest[program].most_common(1)[0]
        print(f"{n / args.freq:8.1f} {gc[program] / n:6.1%} {kernel[program] / n:7.1%}  {program[:40]:40} "
              f"{symbol[:40]} ({hits / n:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
