"""What `record --heap` costs: each heap read (glibc's mallinfo2) timed beside the process probe's read
(/proc/self/status, every sample anyway), in the same sampler thread of a real cpu-preset trainer run,
and the run's wall time with and without the heap probe, alternated. `--modes off boundaries every`
also times the default (the heap read at phase boundaries only, what offload_drop needs on the host):
the time spent in heap reads per run and the wall time of each mode.

    PYTHONPATH=. python bench/heap_probe_cost.py [--rounds 2] [trainer flags]
        (default flags: --preset cpu --num-rollout 2 and every offload, state to disk)

mallinfo2 walks every free chunk of every arena under the arena's lock, so its cost grows with the
process's freed blocks, and the job's mallocs wait meanwhile: its tail matters as much as its median.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import miles_profile as mp  # noqa: E402
from miles_profile.probes.heap import HeapProbe  # noqa: E402
from miles_profile.probes.process import OwnProcessProbe  # noqa: E402
from trainer.args import parse_args  # noqa: E402
from trainer.train import run  # noqa: E402

DEFAULT = ["--preset", "cpu", "--num-rollout", "2", "--offload-train", "--offload-rollout",
           "--colocate-memory-peak-device", "gpu", "--offload-rollout-level", "kv_cache", "weight",
           "--optimizer-cpu-offload", "--offload-train-target", "disk", "--offload-train-disk-dir"]


def _timed(cls, sink: list[float]):
    read = cls.read

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return read(self, *args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)
    return read, timed


def _one_run(argv: list[str], heap, heap_reads: list[float], process_reads: list[float]) -> float:
    cfg = parse_args(argv, cuda_available=False)
    heap_read, HeapProbe.read = _timed(HeapProbe, heap_reads)
    process_read, OwnProcessProbe.read = _timed(OwnProcessProbe, process_reads)
    try:
        with tempfile.TemporaryDirectory() as log_dir, mp.Recorder(log_dir, heap=heap):
            t0 = time.perf_counter()
            run(cfg)
            return time.perf_counter() - t0
    finally:
        HeapProbe.read, OwnProcessProbe.read = heap_read, process_read


def _quantiles(values: list[float]) -> str:
    values = sorted(values)
    return (f"median {statistics.median(values) * 1e6:.0f} us, p99 {values[int(len(values) * 0.99)] * 1e6:.0f} us, "
            f"max {values[-1] * 1e6:.0f} us over {len(values)} reads")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/heap_probe_cost.py")
    parser.add_argument("--rounds", type=int, default=2, help="runs with and without the heap probe, alternated")
    parser.add_argument("--modes", nargs="+", choices=["off", "boundaries", "every"],
                        help="compare these heap modes instead (time in heap reads and wall time per mode)")
    options, flags = parser.parse_known_args(argv)
    flags = flags or DEFAULT + [tempfile.mkdtemp(prefix="heap-bench-")]
    if options.modes:
        return _modes(flags, options.modes, options.rounds)
    heap_reads: list[float] = []
    process_reads: list[float] = []
    walls: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(options.rounds):
        for heap in (False, True):
            walls[heap].append(_one_run(flags, heap, heap_reads if heap else [], process_reads if heap else []))
    print(f"heap read (mallinfo2):      {_quantiles(heap_reads)}")
    print(f"process read (/proc):       {_quantiles(process_reads)}")
    print(f"heap / process read, median: {statistics.median(heap_reads) / statistics.median(process_reads):.1f}x")
    off, on = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"trainer wall time: without {off:.2f} s, with {on:.2f} s, ratio {on / off:.3f} "
          f"(medians of {options.rounds} alternated runs)")
    return 0


def _modes(flags: list[str], modes: list[str], rounds: int) -> int:
    spent: dict[str, list[float]] = {m: [] for m in modes}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    calls: dict[str, list[int]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode in modes:
            reads: list[float] = []
            walls[mode].append(_one_run(flags, "" if mode == "off" else mode, reads, []))
            real = [r for r in reads if r > 2e-6]  # a periodic row in boundary mode returns at once
            spent[mode].append(sum(real))
            calls[mode].append(len(real))
    base = statistics.median(walls[modes[0]])
    for mode in modes:
        wall = statistics.median(walls[mode])
        print(f"heap {mode:10}: wall {wall:.2f} s (x{wall / base:.3f} of {modes[0]}), heap reads "
              f"{statistics.median(calls[mode]):.0f} taking {statistics.median(spent[mode]) * 1e3:.1f} ms per run "
              f"({statistics.median(spent[mode]) / wall:.3%} of the wall time; medians of {rounds} alternated runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
