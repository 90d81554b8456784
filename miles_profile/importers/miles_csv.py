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

import csv
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.files import read_data  # NotRegularFile is a MilesProfileError
from miles_profile.logdir.layout import FORMAT_VERSION
from miles_profile.logdir.lost_phases import add_lost_span
from miles_profile.logdir.ranges import MAX_BYTES
from miles_profile.logdir.reader import Run, events_frame, phase_timeline, phases_from_events

REQUIRED = ("time_s", "used_gb", "available_gb", "percent", "marker")
ROLE = "miles_cpu_profiler"
IMPORT_PID = 0
_LABEL = re.compile(r"^(?:(?P<prefix>[^/]*)/)?(?P<name>.+?)_(?P<edge>start|end|begin)$")
_STEP = re.compile(r"(?:step|rollout|iter(?:ation)?)_?(\d+)$")
GB = 10 ** 9  # the profiler's unit (decimal), not GiB


def _read(path: Path, warnings: list[str] | None = None) -> pd.DataFrame:
    """The CSV's cells as strings, with `_line` (each row's line in the file). A row with more cells
    than the header (garbage, two rows run together) is skipped and said, naming its line; its place
    in time (between the rows around it) is kept in `frame.attrs["skipped_between"]`."""
    warnings = [] if warnings is None else warnings
    try:  # the guarded open: regular files only, holes skipped, at most DATA_MAX_BYTES
        data, _ = read_data(path)
        end = data.rfind(b"\n")
        cut = bool(data) and end < len(data) - 1 and end > 0
        if cut:  # a row cut by a crash or a copy: its numbers are the cut's, not the profiler's
            last_line = data.count(b"\n") + 1
            warnings.append(f"{path.name}: dropped a truncated last line (line {last_line})")
            data = data[: end + 1]
        rows, lines = [], []
        # line by line: a stray quote in a damaged row must not swallow the rows after it as one cell
        for number, text in enumerate(data.decode("utf-8").split("\n"), 1):
            if text.strip():
                rows.append(next(csv.reader([text.rstrip("\r")], skipinitialspace=True)))
                lines.append(number)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MilesProfileError(f"{path}: unreadable CSV ({type(exc).__name__})") from None
    if not rows:
        raise MilesProfileError(f"{path}: unreadable CSV (EmptyDataError)")
    header = [str(c).strip() for c in rows[0]]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise MilesProfileError(f"{path}: not a miles-profile run nor a Miles CPU memory profile "
                                f"(CSV lacks columns {', '.join(missing)})")
    kept, kept_lines, bad_lines, between = [], [], [], []
    for row, line in zip(rows[1:], lines[1:]):
        if len(row) > len(header):
            bad_lines.append(line)
            between.append(len(kept))  # before the kept row of this index
            continue
        kept.append(row + [""] * (len(header) - len(row)))
        kept_lines.append(line)
    if bad_lines:
        warnings.append(f"{path.name}: skipped {len(bad_lines)} malformed line{'s' * (len(bad_lines) != 1)} "
                        f"(more cells than the header; first: line {bad_lines[0]})")
    frame = pd.DataFrame(kept, columns=header, dtype=object) if kept else pd.DataFrame(columns=header, dtype=object)
    frame = frame.loc[:, ~frame.columns.duplicated()]
    frame["_line"] = kept_lines
    frame.attrs["skipped_between"] = between
    frame.attrs["cut"] = cut
    return frame


def _gb_or_absent(column: pd.Series, values: np.ndarray, path: Path, warnings: list[str],
                  lines: np.ndarray | None = None) -> np.ndarray:
    """GB values, with those that are no amount of memory (text, NaN, inf, below 0, over 2**50 bytes)
    set absent and said in one line naming the first (its line in the file): a 1e308 cell made the
    host's used memory overflow, silently."""
    given = column.notna().to_numpy() & (column.astype(str).str.strip() != "").to_numpy()
    with np.errstate(invalid="ignore"):
        bad = given & ~(np.isfinite(values) & (values >= 0) & (values <= MAX_BYTES / GB))
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        n = int(bad.sum())
        line = int(lines[at]) if lines is not None else at + 2
        warnings.append(f"{path.name}: dropped {n} {column.name} value{'s' * (n != 1)} that {'are' if n != 1 else 'is'} "
                        f"no amount of memory (first: line {line}, {str(column.iloc[at])[:30]!r})")
        values = np.where(bad, np.nan, values)
    return values


def _check_percent(column: pd.Series, path: Path, warnings: list[str], lines: np.ndarray) -> None:
    """`percent` is not read (used and available are), but a cell that is no percentage is damage to say."""
    text = column.astype(str).str.strip()
    with np.errstate(invalid="ignore"):
        values = pd.to_numeric(text, errors="coerce").to_numpy(float)
        bad = (text != "").to_numpy() & ~(np.isfinite(values) & (values >= 0) & (values <= 100))
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        warnings.append(f"{path.name}: {int(bad.sum())} percent value(s) that are no percentage, ignored (first: "
                        f"line {int(lines[at])}, {str(column.iloc[at])[:30]!r})")


def _around(good: np.ndarray, t: np.ndarray, at: int) -> tuple[float | None, float | None]:
    """The valid times before and at-or-after row position `at` (None where there is none)."""
    valid = np.flatnonzero(good)
    k = int(np.searchsorted(valid, at))
    lo = float(t[valid[k - 1]]) if k > 0 else None
    hi = float(t[valid[k]]) if k < len(valid) else None
    return (min(lo, hi), max(lo, hi)) if lo is not None and hi is not None else (lo, hi)


def load_miles_csv(path: str | Path) -> Run:
    path = Path(path)
    warnings: list[str] = []
    frame = _read(path, warnings)
    lines = frame["_line"].to_numpy(np.int64)
    t = pd.to_numeric(frame["time_s"], errors="coerce").to_numpy(float)
    used = pd.to_numeric(frame["used_gb"], errors="coerce").to_numpy(float)
    available = pd.to_numeric(frame["available_gb"], errors="coerce").to_numpy(float)
    used = _gb_or_absent(frame["used_gb"], used, path, warnings, lines)
    available = _gb_or_absent(frame["available_gb"], available, path, warnings, lines)
    _check_percent(frame["percent"], path, warnings, lines)
    markers = frame["marker"].astype(str).to_numpy(object)
    good = np.isfinite(t)
    # where a marker may have been lost: a skipped line, a row without a time that held one, a cut row
    lost = [_around(good, t, at) for at in frame.attrs.get("skipped_between", [])]
    lost += [_around(good, t, at) for at in np.flatnonzero(~good) if str(markers[at]).strip()]
    if frame.attrs.get("cut"):
        lost.append((float(t[good][-1]) if good.any() else None, None))
    if (~good).any():
        warnings.append(f"{path.name}: dropped {int((~good).sum())} rows without a valid time_s "
                        f"(first: line {int(lines[np.flatnonzero(~good)[0]])})")
    t, used, available, markers, lines = t[good], used[good], available[good], markers[good], lines[good]
    if len(t) == 0:
        raise MilesProfileError(f"{path}: no samples")
    if (np.diff(t) < 0).any():
        warnings.append(f"{path.name}: rows were out of time order; sorted")
        order = np.argsort(t, kind="stable")
        t, used, available, markers, lines = t[order], used[order], available[order], markers[order], lines[order]
    events, unmatched = _events(t, markers, warnings, path.name, lines)
    lost += unmatched
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
    for lo, hi in lost:
        add_lost_span(meta, lo, hi)
    total = float(np.nanmedian(used + available)) * GB if np.isfinite(used + available).any() else None
    processes = [{"pid": IMPORT_PID, "role": ROLE, "rank": 0, "devices": [],
                  "probes": [{"name": "host", "active": True, "total": total}]}]
    return Run(path, meta, processes, samples, events, phases_from_events(events, samples), warnings)


def _events(t: np.ndarray, markers: np.ndarray, warnings: list[str], name: str = "", lines=None
            ) -> tuple[pd.DataFrame, list[tuple[float | None, float]]]:
    """The phase events of the markers, and for each end marker without a start the span where its
    start was lost (from the marker before it)."""
    rows, open_ids, next_id, unmatched, nan_labels, lost = [], {}, 1, [], [], []
    before = None  # the time of the last marker seen
    for k, (when, cell) in enumerate(zip(t, markers)):
        for label in (s.strip() for s in str(cell).split(";")):
            if not label:
                continue
            if label.lower() == "nan":  # what a writer prints for a missing value: no label
                nan_labels.append(k)
                continue
            match = _LABEL.match(label)
            if not match:
                rows.append({"t": when, "kind": names.MARK, "name": label, "pid": IMPORT_PID, "attrs": {}})
                before = when
                continue
            prefix, name_ = match["prefix"] or "", match["name"]
            key = (prefix, name_)
            attrs = {"marker_prefix": prefix} if prefix else {}
            step = _STEP.search(prefix) if prefix else None
            if step:
                attrs["rollout_id"] = int(step.group(1))
            if match["edge"] in ("start", "begin"):
                open_ids[key] = next_id
                rows.append({"t": when, "kind": names.BEGIN, "name": name_, "pid": IMPORT_PID, "id": next_id,
                             "attrs": attrs})
                next_id += 1
            elif key in open_ids:
                rows.append({"t": when, "kind": names.END, "name": name_, "pid": IMPORT_PID, "id": open_ids.pop(key),
                             "attrs": {"status": "ok"}})
            else:
                unmatched.append(k)
                lost.append((before, float(when)))
            before = when
    where = (lambda k: f" (first: line {int(lines[k])})") if lines is not None else (lambda k: "")
    prefix = f"{name}: " if name else ""
    if unmatched:
        warnings.append(f"{prefix}skipped {len(unmatched)} end markers without a start{where(unmatched[0])}")
    if nan_labels:
        warnings.append(f"{prefix}skipped {len(nan_labels)} marker label(s) 'nan'{where(nan_labels[0])}")
    return events_frame(rows), lost
