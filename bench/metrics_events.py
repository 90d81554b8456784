"""What parsing a scrape's event lines costs, by parser, side by side in one run (issue 32 round 2b):
orjson line by line (what metrics/process_state.py does), orjson on all lines at once, the stdlib's json
line by line (process_state.py's fallback where orjson is absent), and the project's own event reader
(logdir/events.py parse_event_lines: json on all lines at once, then every event's structure and
attributes checked, what the report needs).

    python bench/metrics_events.py [--interval 15] [--repeat 7]

The lines are bench_metrics.py FakeHost's: 64 processes, a phase's begin and end (with its summary)
every second each; at a 15 s scrape interval a scrape meets 1,920 of them. This thread's CPU seconds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_metrics as b  # noqa: E402

from miles_profile.logdir.events import EventProblems, parse_event_lines  # noqa: E402


def _per_line(loads):
    def parse(data: bytes) -> None:
        for line in data.split(b"\n"):
            if line:
                try:
                    loads(line)
                except ValueError:
                    pass
    return parse


def _orjson_batch(data: bytes) -> None:
    import orjson
    lines = data.split(b"\n")
    lines.pop()
    orjson.loads(b"[" + b",".join(lines) + b"]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        host = b.FakeHost(Path(tmp), 64)
        host.advance(args.interval)
        datas = [p.read_bytes() for p in sorted(Path(tmp).glob("*.events.jsonl"))]
    cases = {"json, line by line": _per_line(json.loads),
             "logdir/events.py parse_event_lines": lambda d: parse_event_lines(d, 0, EventProblems())}
    try:
        import orjson
        cases = {"orjson, line by line": _per_line(orjson.loads), "orjson, all lines at once": _orjson_batch, **cases}
    except ImportError:
        print("orjson is not installed: the stdlib's json and the project's reader only")
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeat):  # interleaved: a load that comes and goes is shared by all
        for name, parse in cases.items():
            start = time.thread_time()
            for data in datas:
                parse(data)
            times[name].append(time.thread_time() - start)
    lines = sum(d.count(b"\n") for d in datas)
    print(f"{len(datas)} processes, {lines} event lines ({sum(map(len, datas)) // max(lines, 1)} bytes a line), "
          f"a scrape every {args.interval:g} s:")
    for name, values in times.items():
        print(f"  {name}: CPU median {statistics.median(values) * 1e3:.2f} ms, min {min(values) * 1e3:.2f} ms "
              f"over {len(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
