"""Import the CSV written by the Miles framework's own CPU memory profiler.

Columns: `time_s, used_gb, available_gb, percent, marker`. `marker` holds zero or more labels joined
by `;`; a label `step_3/generate_start` opens phase `generate` of iteration 3 (its `rollout_id`) and
`step_3/generate_end` closes it; any other label becomes a mark. GB are decimal: Miles'
`tools/cpu_memory_profiler.py` writes `psutil.virtual_memory().used / 1e9` with three decimals, so a
value is exact to ±0.5 MB (reading it as GiB made every value 7.37 % too high).
`used_gb` is the host's used memory (not one process's RSS) and has no true peak between samples;
the report labels it as such.

    load_miles_csv(path) -> Run
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.files import read_data  # NotRegularFile is a MilesProfileError
from miles_profile.logdir.layout import FORMAT_VERSION
from miles_profile.logdir.ranges import MAX_BYTES
from miles_profile.logdir.reader import Run, events_frame, phase_timeline, phases_from_events

REQUIRED = ("time_s", "used_gb", "available_gb", "percent", "marker")
ROLE = "miles_cpu_profiler"
IMPORT_PID = 0
_LABEL = re.compile(r"^(?:(?P<prefix>[^/]*)/)?(?P<name>.+?)_(?P<edge>start|end|begin)$")
_STEP = re.compile(r"(?:step|rollout|iter(?:ation)?)_?(\d+)$")
GB = 10 ** 9  # the profiler's unit (decimal), not GiB


def _read(path: Path, warnings: list[str] | None = None) -> pd.DataFrame:
    try:  # the guarded open: regular files only, holes skipped, at most DATA_MAX_BYTES
        data, _ = read_data(path)
        end = data.rfind(b"\n")
        if data and end < len(data) - 1 and end > 0 and warnings is not None:
            # a row cut by a crash or a copy: its numbers are the cut's, not the profiler's
            warnings.append(f"{path.name}: dropped a truncated last line")
            data = data[: end + 1]
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False, skipinitialspace=True,
                            on_bad_lines="skip", engine="python")
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise MilesProfileError(f"{path}: unreadable CSV ({type(exc).__name__})") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise MilesProfileError(f"{path}: not a miles-profile run nor a Miles CPU memory profile "
                                f"(CSV lacks columns {', '.join(missing)})")
    return frame


def _gb_or_absent(column: pd.Series, values: np.ndarray, path: Path, warnings: list[str]) -> np.ndarray:
    """GB values, with those that are no amount of memory (text, NaN, inf, below 0, over 2**50 bytes)
    set absent and said in one line naming the first (its line in the file): a 1e308 cell made the
    host's used memory overflow, silently."""
    given = column.notna().to_numpy() & (column.astype(str).str.strip() != "").to_numpy()
    with np.errstate(invalid="ignore"):
        bad = given & ~(np.isfinite(values) & (values >= 0) & (values <= MAX_BYTES / GB))
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        n = int(bad.sum())
        warnings.append(f"{path.name}: dropped {n} {column.name} value{'s' * (n != 1)} that {'are' if n != 1 else 'is'} "
                        f"no amount of memory (first: line {at + 2}, {str(column.iloc[at])[:30]!r})")
        values = np.where(bad, np.nan, values)
    return values


def load_miles_csv(path: str | Path) -> Run:
    path = Path(path)
    warnings: list[str] = []
    frame = _read(path, warnings)
    t = pd.to_numeric(frame["time_s"], errors="coerce").to_numpy(float)
    used = pd.to_numeric(frame["used_gb"], errors="coerce").to_numpy(float)
    available = pd.to_numeric(frame["available_gb"], errors="coerce").to_numpy(float)
    used = _gb_or_absent(frame["used_gb"], used, path, warnings)
    available = _gb_or_absent(frame["available_gb"], available, path, warnings)
    markers = frame["marker"].astype(str).to_numpy(object)
    good = np.isfinite(t)
    if (~good).any():
        warnings.append(f"{path.name}: dropped {int((~good).sum())} rows without a valid time_s")
    t, used, available, markers = t[good], used[good], available[good], markers[good]
    if len(t) == 0:
        raise MilesProfileError(f"{path}: no samples")
    if (np.diff(t) < 0).any():
        warnings.append(f"{path.name}: rows were out of time order; sorted")
        order = np.argsort(t, kind="stable")
        t, used, available, markers = t[order], used[order], available[order], markers[order]
    events = _events(t, markers, warnings)
    samples = pd.DataFrame({
        "t": t, "phase": "", "pid": np.int64(IMPORT_PID),
        "rss": pd.array(np.where(np.isfinite(used), np.round(used * GB), np.nan), dtype="Float64").astype("Int64"),
        "host_available": pd.array(np.where(np.isfinite(available), np.round(available * GB), np.nan),
                                   dtype="Float64").astype("Int64"),
    })
    samples["rss"] = samples["rss"].astype("float64")
    samples["host_available"] = samples["host_available"].astype("float64")
    times, labels = phase_timeline(events)
    if len(times):
        at = np.searchsorted(times, t, side="right") - 1
        samples["phase"] = np.where(at >= 0, np.asarray(labels, dtype=object)[np.maximum(at, 0)], "")
    samples["phase"] = samples["phase"].astype("category")
    interval = float(np.median(np.diff(t)) * 1000) if len(t) > 1 else None
    meta = {"format_version": FORMAT_VERSION, "command": [f"imported from {path}"], "host": "",
            "start_time": float(t[0]), "interval_ms": interval, "source": "Miles CPU memory profiler CSV"}
    total = float(np.nanmedian(used + available)) * GB if np.isfinite(used + available).any() else None
    processes = [{"pid": IMPORT_PID, "role": ROLE, "rank": 0, "devices": [],
                  "probes": [{"name": "host", "active": True, "total": total}]}]
    return Run(path, meta, processes, samples, events, phases_from_events(events, samples), warnings)


def _events(t: np.ndarray, markers: np.ndarray, warnings: list[str]) -> pd.DataFrame:
    rows, open_ids, next_id, unmatched = [], {}, 1, 0
    for when, cell in zip(t, markers):
        for label in (s.strip() for s in str(cell).split(";")):
            if not label or label.lower() == "nan":
                continue
            match = _LABEL.match(label)
            if not match:
                rows.append({"t": when, "kind": names.MARK, "name": label, "pid": IMPORT_PID, "attrs": {}})
                continue
            prefix, name = match["prefix"] or "", match["name"]
            key = (prefix, name)
            attrs = {"marker_prefix": prefix} if prefix else {}
            step = _STEP.search(prefix) if prefix else None
            if step:
                attrs["rollout_id"] = int(step.group(1))
            if match["edge"] in ("start", "begin"):
                open_ids[key] = next_id
                rows.append({"t": when, "kind": names.BEGIN, "name": name, "pid": IMPORT_PID, "id": next_id,
                             "attrs": attrs})
                next_id += 1
            elif key in open_ids:
                rows.append({"t": when, "kind": names.END, "name": name, "pid": IMPORT_PID, "id": open_ids.pop(key),
                             "attrs": {"status": "ok"}})
            else:
                unmatched += 1
    if unmatched:
        warnings.append(f"skipped {unmatched} end markers without a start")
    return events_frame(rows)
