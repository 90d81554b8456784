"""Build a synthetic regression from a real run: a copy of its directory with one phase's memory raised.

Test code only (the package never forges logs). Every byte value measured inside the phase is raised by
`factor`: the samples tagged with the phase, the summaries in its `end` events, and the host sampler's
device and per-process rows inside its instances. `host_available` (free host memory) is left alone.
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

KEEP = {"t", "phase", "host_available", "host_total", "cgroup_limit", "gpu_uuid", "pid"}


def _scale(value: str, factor: float) -> str:
    return str(int(round(int(value) * factor))) if value.strip() else value


def _rewrite_csv(path: Path, raise_row) -> None:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    out = [header] + [raise_row(header, row) for row in body]
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(out)


def raise_phase(src: str | Path, dst: str | Path, phase: str, factor: float = 1.10) -> Path:
    """Copy the run directory `src` to `dst` with `phase`'s memory multiplied by `factor`."""
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".*.arrow", "report.html"))
    windows = []
    for events in dst.glob("*.events.jsonl"):
        lines = []
        begins = {}
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event.get("name") == phase and event.get("kind") == "begin":
                begins[event.get("id")] = event["t"]
            if event.get("name") == phase and event.get("kind") == "end":
                windows.append((begins.get(event.get("id"), event["t"]), event["t"]))
                for stats in (event.get("attrs", {}).get("summary") or {}).get("series", {}).values():
                    for key in ("peak", "floor", "first", "last"):
                        if isinstance(stats.get(key), int):
                            stats[key] = int(round(stats[key] * factor))
                line = json.dumps(event)
            lines.append(line)
        events.write_text("\n".join(lines) + "\n")

    def in_phase(header, row):
        if row[header.index("phase")] != phase:
            return row
        return [v if name in KEEP or name.startswith("host_") else _scale(v, factor) for name, v in zip(header, row)]

    def in_window(header, row):
        t = float(row[header.index("t")])
        if not any(a < t <= b for a, b in windows):
            return row
        return [v if name in KEEP or name.startswith("host_") or name.startswith("cgroup") else _scale(v, factor)
                for name, v in zip(header, row)]

    for samples in dst.glob("*.samples.csv"):
        _rewrite_csv(samples, in_phase)
    for host_rows in [*dst.glob("*.host.csv"), *dst.glob("*.gpu_procs.csv")]:
        _rewrite_csv(host_rows, in_window)
    return dst
