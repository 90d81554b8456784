"""Recorder benchmarks: the cost of one sample per probe, the step-time overhead on training loops,
and spike capture against a polling baseline. Ratios are measured side by side in one run.

    python bench/bench_sampler.py [--out DIR] [--quick]

Runs on CPU here and on CUDA when a GPU is present (then it also compares a naive 100 Hz sampler and
PyTorch's memory-history recording).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402  (before the recorder, so its allocator probe sees torch)

from bench.common import device, write_result  # noqa: E402
from bench.overhead import measure_overhead  # noqa: E402
from bench.probe_cost import measure_probe_cost  # noqa: E402
from bench.spikes import measure_spikes  # noqa: E402
from miles_profile.recorder import DEFAULT_INTERVAL_MS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write one JSON file per benchmark into this directory")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test, not figures)")
    parser.add_argument("--interval-ms", type=float, default=DEFAULT_INTERVAL_MS)
    parser.add_argument("--rounds", type=int, help="interleaved overhead rounds (default 15, 3 with --quick)")
    parser.add_argument("--only", choices=["cost", "overhead", "spikes"], action="append")
    parser.add_argument("--variant", action="append", default=[],
                        help="extra overhead modes: recorder_<N>ms, recorder_no_nvml, recorder_no_torch_allocator")
    args = parser.parse_args(argv)
    only = set(args.only or ["cost", "overhead", "spikes"])
    dev = device()
    with tempfile.TemporaryDirectory() as tmp:
        if "cost" in only:
            write_result(args.out, "probe_cost", measure_probe_cost(Path(tmp), 200 if args.quick else 2000))
        if "spikes" in only:
            write_result(args.out, "spikes", measure_spikes(dev, Path(tmp), args.interval_ms,
                                                            spikes=20 if args.quick else 120))
        if "overhead" in only:
            write_result(args.out, "overhead", measure_overhead(dev, Path(tmp), args.interval_ms,
                                                                rounds=args.rounds or (3 if args.quick else 15),
                                                                variants=args.variant))
    return 0


if __name__ == "__main__":
    sys.exit(main())
