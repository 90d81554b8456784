"""In-memory runs for report and check tests: no recorder, no files (memray-style fake records)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from miles_profile.logdir.reader import EVENT_COLUMNS, Run, phases_from_events

GiB = 1024 ** 3
MiB = 1024 ** 2
PID = 100


def make_run(samples: dict, phases: list[dict] = (), *, pid: int = PID, devices: list[dict] | None = None,
             host_total: int = 64 * GiB, name: str = "fake-run", processes: list[dict] | None = None) -> Run:
    """`samples`: columns (t required; pid defaults to `pid`); `phases`: dicts with name, start, end
    and any attributes (pid, parent ids are optional); `end=None`: not ended yet (status "open")."""
    frame = pd.DataFrame(samples)
    frame.insert(1, "phase", pd.Categorical([""] * len(frame)))
    if "pid" not in frame:
        frame.insert(2, "pid", np.int64(pid))
    rows = []
    for k, p in enumerate(phases, start=1):
        attrs = {a: v for a, v in p.items() if a not in ("name", "start", "end", "pid", "parent", "status")}
        who = p.get("pid", pid)
        rows.append({"t": p["start"], "kind": "begin", "name": p["name"], "pid": who, "id": k,
                     "parent": p.get("parent"), "attrs": attrs})
        if p["end"] is not None:
            rows.append({"t": p["end"], "kind": "end", "name": p["name"], "pid": who, "id": k, "parent": None,
                         "attrs": {"status": p.get("status", "ok")}})
    events = pd.DataFrame(rows, columns=EVENT_COLUMNS).sort_values("t", kind="stable").reset_index(drop=True)
    events["t"] = events["t"].astype(float)
    meta = {"format_version": 1, "command": ["fake"], "host": "test", "start_time": float(frame["t"].min()),
            "interval_ms": 10.0}
    processes = processes if processes is not None else [{
        "pid": pid, "role": "in_process", "rank": 0, "devices": devices or [],
        "probes": [{"name": "host", "active": True, "total": host_total}]}]
    return Run(Path(name), meta, processes, frame, events, phases_from_events(events, frame), [])


def steps(t: np.ndarray, levels: list[tuple[float, float]]) -> np.ndarray:
    """A level series: levels[(from_time, value)], each holding from its time on."""
    out = np.zeros(len(t))
    for start, value in levels:
        out[t >= start] = value
    return out
