"""The phase summaries that `end` events carry (phase_summary.py writes them), as one long frame."""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile import names

SUMMARY_COLUMNS = ["host", "pid", "id", "name", "series", "peak", "floor", "first", "last", "rows",
                   "t_first", "t_last"]


def _int64(values: list) -> pd.arrays.IntegerArray:
    """Integers (None, or anything not an int, absent) as a nullable Int64 array, without a float
    round trip and without pandas' per-element inference (a 1,024-process run has 600,000 values)."""
    mask = np.fromiter((type(v) is not int or not -2 ** 63 <= v < 2 ** 63 for v in values), bool, len(values))
    data = np.fromiter((0 if m else v for v, m in zip(values, mask)), np.int64, len(values))
    return pd.arrays.IntegerArray(data, mask)


def summaries_frame(events: pd.DataFrame) -> pd.DataFrame:
    """One row per (phase instance, series); phases without a summary (version-1 logs written before
    summaries, phases still open) have no rows. Bytes are Int64 (absent: <NA>)."""
    rows = []
    ends = events[events["kind"] == names.END] if len(events) else events
    hosts = ends["host"] if "host" in ends else [None] * len(ends)
    for host, pid, phase_id, name, attrs in zip(hosts, ends["pid"], ends["id"], ends["name"], ends["attrs"]):
        summary = attrs.get("summary") if isinstance(attrs, dict) else None
        if not isinstance(summary, dict) or not isinstance(summary.get("series"), dict):
            continue
        host = "" if host is None or host != host else str(host)
        for series, stats in summary["series"].items():
            if isinstance(stats, dict):
                rows.append((host, int(pid), int(phase_id) if phase_id == phase_id else -1, name, series,
                             stats.get("peak"), stats.get("floor"), stats.get("first"), stats.get("last"),
                             summary.get("rows"), summary.get("t_first"), summary.get("t_last")))
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    for column in ("peak", "floor", "first", "last", "rows"):
        frame[column] = _int64(frame[column].tolist())  # exact: no float round trip
    for column in ("t_first", "t_last"):
        frame[column] = frame[column].astype(float)
    return frame
