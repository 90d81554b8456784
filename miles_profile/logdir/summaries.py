"""The phase summaries that `end` events carry (phase_summary.py writes them), as one long frame."""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.logdir.gc_pause import gc_paused
from miles_profile.logdir.str_column import str_array

SUMMARY_COLUMNS = ["host", "pid", "id", "name", "series", "peak", "floor", "first", "last", "rows",
                   "t_first", "t_last"]


def _int64(values: list) -> pd.arrays.IntegerArray:
    """Integers (None, or anything not an int, absent) as a nullable Int64 array, without a float
    round trip and without pandas' per-element inference (a 1,024-process run has 600,000 values)."""
    if set(map(type, values)) <= {int}:  # the common case: one C-level conversion (the test, too, in C)
        try:
            return pd.arrays.IntegerArray(np.array(values, dtype=np.int64), np.zeros(len(values), dtype=bool))
        except OverflowError:
            pass
    mask = np.fromiter((type(v) is not int or not -2 ** 63 <= v < 2 ** 63 for v in values), bool, len(values))
    data = np.fromiter((0 if m else v for v, m in zip(values, mask)), np.int64, len(values))
    return pd.arrays.IntegerArray(data, mask)


def summaries_frame(events: pd.DataFrame) -> pd.DataFrame:
    """One row per (phase instance, series); phases without a summary (version-1 logs written before
    summaries, phases still open) have no rows. Bytes are Int64 (absent: <NA>)."""
    with gc_paused():  # 276,000 row tuples at 1,024 processes, none garbage
        return _summaries_frame(events)


def _summaries_frame(events: pd.DataFrame) -> pd.DataFrame:
    ends = events[events["kind"] == names.END] if len(events) else events
    hosts = ends["host"].tolist() if "host" in ends else [None] * len(ends)
    rows = []
    # plain lists, not the frame's (Arrow-backed) columns: iterating those costs seconds at 600,000 rows
    for host, pid, phase_id, name, attrs in zip(hosts, ends["pid"].tolist(), ends["id"].tolist(),
                                                ends["name"].tolist(), ends["attrs"].tolist()):
        summary = attrs.get("summary") if isinstance(attrs, dict) else None
        if not isinstance(summary, dict) or not isinstance(summary.get("series"), dict):
            continue
        host = "" if host is None or host != host else str(host)
        key = (host, int(pid), int(phase_id) if phase_id == phase_id and phase_id is not None else -1, name)
        whole = (summary.get("rows"), summary.get("t_first"), summary.get("t_last"))
        for series, stats in summary["series"].items():
            if isinstance(stats, dict):
                rows.append((*key, series, stats.get("peak"), stats.get("floor"), stats.get("first"),
                             stats.get("last"), *whole))
    cols = dict(zip(SUMMARY_COLUMNS, map(list, zip(*rows)))) if rows else {c: [] for c in SUMMARY_COLUMNS}
    if rows and all(set(map(type, cols[c])) <= {str} for c in ("host", "name", "series")):
        # each column made as it ends up (the usual case): not twelve object columns first and then
        # converted (half a second at 276,000 rows)
        # the numbers' columns are added below, in SUMMARY_COLUMNS' order: made here as object
        # columns first, they were half of this function's time
        frame = pd.DataFrame({"host": str_array(cols["host"]), "pid": np.array(cols["pid"], dtype=np.int64),
                              "id": np.array(cols["id"], dtype=np.int64), "name": str_array(cols["name"]),
                              "series": str_array(cols["series"])})
    else:
        frame = pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in cols.items()})
        for column in ("host", "name", "series"):
            frame[column] = frame[column].astype(str)
        frame["pid"] = frame["pid"].astype(np.int64)
        frame["id"] = frame["id"].astype(np.int64)
    for column in ("peak", "floor", "first", "last", "rows"):
        frame[column] = _int64(cols[column])  # exact: no float round trip
    for column in ("t_first", "t_last"):
        values = frame[column] if column in frame else pd.Series(cols[column], dtype=object, index=frame.index)
        frame[column] = pd.to_numeric(values, errors="coerce").astype(float)
    return frame
