"""Where a scrape's reading goes (issue 32, item 5), at 64 processes every 1 s and every 15 s
(bench_metrics.FakeHost): each stage of HostState.read timed on this thread's CPU clock by wrappers
around its calls (medians over the scrapes; the wrappers add about 0.3 us a call), then a cProfile on
the same clock of the same reads, its functions by own time, scaled to the reading's unwrapped median
(cProfile inflates every call; its shares are what it measures).

    python bench/metrics_read_profile.py [--processes 64] [--phase-seconds 1] [--scrapes 15]
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_metrics as b  # noqa: E402

from miles_profile.metrics import row_peaks  # noqa: E402
from miles_profile.metrics.host_state import HostState  # noqa: E402

STAGES = {
    "refresh": "the host sampler's files (its GPU rows, NVML's processes)",
    "events_pread": "pread of each process's new event lines",
    "samples_pread": "pread of each process's new rows",
    "read_new": "event lines parsed and kept (orjson, phases, floors, transitions, offloads ended)",
    "fold": "rows folded by pyarrow, all processes at once (from 2,000 rows)",
    "add_rows": "rows folded a process at a time (split, peaks, levels), when not by pyarrow",
    "judge": "offloads judged (the row before each began, by bisection)",
    "reading": "the reading assembled (peaks taken, GPUs, kills)",
}


def _timed(spent: collections.Counter, stage: str, call):
    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            spent[stage] += time.thread_time() - start
    return wrapper


def _wrap(state: HostState, spent: collections.Counter) -> None:
    """Instance attributes in front of the methods a read calls (the class stays untouched)."""
    state._reading = _timed(spent, "reading", state._reading)
    for files in state._hosts.values():
        files.refresh = _timed(spent, "refresh", files.refresh)
    for process in state._processes.values():
        process._events.read = _timed(spent, "events_pread", process._events.read)
        process._samples.read = _timed(spent, "samples_pread", process._samples.read)
        process.read_new = _timed(spent, "read_new", process.read_new)
        process.add_rows = _timed(spent, "add_rows", process.add_rows)
        process._judge_ended = _timed(spent, "judge", process._judge_ended)


def _unwrap(state: HostState) -> None:
    del state._reading
    for files in state._hosts.values():
        del files.refresh
    for process in state._processes.values():
        del process._events.read, process._samples.read, process.read_new, process.add_rows, process._judge_ended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--phase-seconds", type=float, default=1.0)
    parser.add_argument("--scrapes", type=int, default=15)
    args = parser.parse_args(argv)
    _, render = b.renderer()
    fold = row_peaks.fold
    for interval in (1.0, 15.0):
        with tempfile.TemporaryDirectory() as tmp:
            host = b.FakeHost(Path(tmp), args.processes, args.phase_seconds)
            state = b.scrape_only_state(tmp)
            host.advance(interval if args.phase_seconds == 1 else max(interval, len(b.PHASES) * args.phase_seconds))
            render(state.read())
            plain = []
            for _ in range(args.scrapes):  # unwrapped: the figure
                host.advance(interval)
                start = time.thread_time()
                reading = state.read()
                plain.append(time.thread_time() - start)
                render(reading)
            stages: dict[str, list[float]] = collections.defaultdict(list)
            wrapped = []
            spent: collections.Counter = collections.Counter()
            _wrap(state, spent)
            row_peaks.fold = _timed(spent, "fold", fold)
            try:
                for _ in range(args.scrapes):
                    host.advance(interval)
                    spent.clear()
                    start = time.thread_time()
                    reading = state.read()
                    wrapped.append(time.thread_time() - start)
                    for stage in STAGES:
                        stages[stage].append(spent[stage])
                    render(reading)
            finally:
                row_peaks.fold = fold
                _unwrap(state)
            profile = cProfile.Profile(time.thread_time)
            for _ in range(args.scrapes):
                host.advance(interval)
                profile.enable()
                reading = state.read()
                profile.disable()
                render(reading)
        median = statistics.median(plain)
        print(f"every {interval:g} s, {args.processes} processes: reading {median * 1e3:.2f} ms of CPU (median of "
              f"{len(plain)}; {statistics.median(wrapped) * 1e3:.2f} wrapped), by stage (medians, ms):")
        # read_new includes the preads and judge's time is inside add_rows: each shown without the other.
        own = {s: statistics.median(v) for s, v in stages.items()}
        own["read_new"] = statistics.median(
            [r - e - p for r, e, p in zip(stages["read_new"], stages["events_pread"], stages["samples_pread"])])
        own["add_rows"] = statistics.median([a - j for a, j in zip(stages["add_rows"], stages["judge"])])
        for stage, what in STAGES.items():
            print(f"  {own[stage] * 1e3:6.2f}  {what}")
        rest = statistics.median(wrapped) - sum(own.values())
        print(f"  {rest * 1e3:6.2f}  the rest: HostState.read's loops, the lock, rows counted and grouped")
        stats = pstats.Stats(profile)
        total = sum(v[2] for v in stats.stats.values())
        top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:12]
        print(f"  cProfile, own time of the top functions (share; scaled to {median * 1e3:.2f} ms):")
        for (file, line, name), v in top:
            print(f"    {v[2] / total * 100:5.1f} %  {v[2] / total * median * 1e3:5.2f} ms  {v[0] // args.scrapes:6d} calls "
                  f"a scrape  {Path(file).name}:{line}({name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
