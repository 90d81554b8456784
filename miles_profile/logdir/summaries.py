"""The phase summaries that `end` events carry (phase_summary.py writes them), as one long frame."""
from __future__ import annotations

import pandas as pd

from miles_profile import names

SUMMARY_COLUMNS = ["host", "pid", "id", "name", "series", "peak", "floor", "first", "last", "rows",
                   "t_first", "t_last"]


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
        frame[column] = pd.array(frame[column].tolist(), dtype="Int64")  # exact: no float round trip
    for column in ("t_first", "t_last"):
        frame[column] = frame[column].astype(float)
    return frame
