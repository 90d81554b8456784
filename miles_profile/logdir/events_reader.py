"""A run's events files read into the events frame, and the phase table built from it."""
from __future__ import annotations

from operator import itemgetter
from pathlib import Path

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.logdir.events import EventProblems, parse_event_lines
from miles_profile.logdir.gc_pause import gc_paused
from miles_profile.logdir.files import EVENT_LINE_MAX, NotRegularFile, read_lines_bounded
from miles_profile.logdir.layout import EVENTS_SUFFIX, pid_of
from miles_profile.logdir.str_column import str_array

PHASE_COLUMNS = ["name", "start", "end", "duration", "pid", "host", "id", "parent", "depth", "status", "attrs"]
EVENT_COLUMNS = ["t", "kind", "name", "pid", "host", "id", "parent", "attrs"]
_STR = pd.Series([""], dtype=str).dtype  # pandas' str dtype


def read_all_events(run_dir: Path, warnings: list[str], skip: set[str] | None = None,
                    without_events: list[str] | None = None) -> pd.DataFrame:
    with gc_paused():  # a million dicts, none garbage: logdir/gc_pause.py
        return _read_all_events(run_dir, warnings, skip, without_events)


def _read_all_events(run_dir: Path, warnings: list[str], skip: set[str] | None,
                     without_events: list[str] | None) -> pd.DataFrame:
    rows, problems, too_long = [], EventProblems(), [0]
    for path in sorted(run_dir.glob(f"*{EVENTS_SUFFIX}")):
        if skip and path.name[: -len(EVENTS_SUFFIX)] in skip:
            continue
        host = path.name[: -len(EVENTS_SUFFIX)].rsplit("-", 1)[0]
        try:  # a regular file; no line over EVENT_LINE_MAX (dropped and counted)
            data = read_lines_bounded(path, too_long=too_long)
        except NotRegularFile as exc:
            warnings.append(str(exc))
            continue
        events, duplicated = drop_duplicated_events(parse_event_lines(data, pid_of(path, EVENTS_SUFFIX), problems,
                                                                        path.name))
        if not events and without_events is not None:
            without_events.append(path.name[: -len(EVENTS_SUFFIX)])
        if duplicated:
            warnings.append(f"{path.name}: dropped {duplicated} duplicated event line{'s' * (duplicated != 1)} "
                            "(a phase begun or ended twice under one id, or a line repeated; the first kept)")
        for event in events:
            if not isinstance(event.get("host"), str):
                event["host"] = host
            rows.append(event)
    warnings.extend(problems.warnings())
    if too_long[0]:
        warnings.append(f"skipped {too_long[0]} event lines over {EVENT_LINE_MAX:,} bytes")
    return events_frame(rows)


def drop_duplicated_events(events: list[dict]) -> tuple[list[dict], int]:
    """One file's events without repeats, and how many were dropped. A phase id is begun and ended once
    per process, so a second begin (or end) of an id is a copied line (`cat E E > E`, a re-sent log); any
    other event repeated whole (same time, kind, name and attributes) is too. Every view keys phases by
    (host, pid, id): a repeat would make that key ambiguous."""
    seen: set = set()
    kept = []
    for event in events:
        if event["kind"] in (names.BEGIN, names.END) and event.get("id") is not None:
            key = (event["kind"], event["pid"], event["id"])
        else:
            key = (event["kind"], event["pid"], event["name"], event["t"], repr(event.get("attrs")))
        if key not in seen:
            seen.add(key)
            kept.append(event)
    return kept, len(events) - len(kept)


def events_frame(rows: list[dict]) -> pd.DataFrame:
    """Event dicts as the `Run.events` frame: dict attrs, float times, sorted by time."""
    # column by column, a key missing read as NaN as the frame of dicts has it: 2-3x faster at 276,000 rows
    plain = [c for c in EVENT_COLUMNS if c != "attrs"]
    try:  # every row has every key (as written): one C-level pick per row
        columns = dict(zip(plain, map(list, zip(*map(itemgetter(*plain), rows)))))
    except KeyError:
        columns = {c: [row.get(c, np.nan) for row in rows] for c in plain}
    columns["attrs"] = [a if isinstance(a := row.get("attrs"), dict) else {} for row in rows]
    if not rows:
        events = pd.DataFrame(rows, columns=EVENT_COLUMNS)
        events["t"] = events["t"].astype(float)
        return events.sort_values("t", kind="stable").reset_index(drop=True)
    # in time order before the frame is made (the order sort_values("t", kind="stable") gives): a sort
    # of the frame took each str column again
    times = np.array(columns["t"], dtype=float)
    order = np.argsort(times, kind="stable")
    if (order != np.arange(len(order))).any():
        at = order.tolist()
        columns = {c: [v[k] for k in at] for c, v in columns.items() if c != "t"}
    columns["t"] = times[order]  # float already: no astype (which copied the frame's other columns)
    for c in ("kind", "name", "host"):  # pyarrow makes the str column (logdir/str_column.py)
        if set(map(type, columns[c])) <= {str}:
            columns[c] = str_array(columns[c])
    return pd.DataFrame(columns, columns=EVENT_COLUMNS)


def phases_from_events(events: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """One row per phase instance; a phase never ended (a crash) ends at the last sample, status 'open'."""
    begins = events[events["kind"] == names.BEGIN]
    if begins.empty:
        return pd.DataFrame(columns=PHASE_COLUMNS)
    ends = events[events["kind"] == names.END]
    last_t = float(samples["t"].max()) if len(samples) else float(events["t"].max())
    # ends matched to begins by (host, pid, id) as columns (a 1,024-process run has 150,000 phases)
    def keys(frame):
        ids = pd.to_numeric(frame["id"], errors="coerce").fillna(-1).astype(np.int64)
        return pd.MultiIndex.from_arrays([_hosts(frame), frame["pid"].astype(np.int64).to_numpy(), ids.to_numpy()])
    end_keys = keys(ends)
    last_end = ~end_keys.duplicated(keep="last")  # as a dict would: the last end of an id wins
    at = end_keys[last_end].get_indexer(keys(begins))
    found = at >= 0
    # padded by one: a begin without an end (at = -1) reads the pad, replaced below
    end_t = np.append(ends["t"].to_numpy(float)[last_end], np.nan)[at]
    end_status = np.append(np.array([a.get("status", "ok") for a in ends["attrs"]], dtype=object)[last_end],
                           "open")[at]
    t = begins["t"].to_numpy(float)
    end = np.where(found, end_t, np.maximum(last_t, t))
    ids, parents = begins["id"], begins["parent"]
    # the str columns as they end up (names kept as the events' str column, hosts made by pyarrow, the
    # status an object column): not inferred from Python objects again (138,000 phases)
    name = begins["name"]
    rows = {"name": name.array if name.dtype == _STR else name.to_numpy(), "start": t, "end": end,
            "duration": end - t, "pid": begins["pid"].astype(int).to_numpy(), "host": str_array(_hosts(begins)),
            "id": pd.to_numeric(ids, errors="coerce").fillna(-1).astype(int).to_numpy(),
            "parent": pd.to_numeric(parents, errors="coerce").fillna(-1).astype(int).to_numpy(),
            "status": pd.Series(np.where(found, end_status, "open"), dtype=object, index=pd.RangeIndex(len(t))),
            "attrs": begins["attrs"].to_numpy()}
    phases = pd.DataFrame(rows)
    phases["depth"] = _depths(phases)
    extra = _attr_columns(phases["attrs"].tolist(), phases.index)
    phases = pd.concat([phases[PHASE_COLUMNS], extra], axis=1)
    return phases.sort_values(["start", "depth"], kind="stable").reset_index(drop=True)


def _attr_columns(attrs: list[dict], index: pd.Index) -> pd.DataFrame:
    """The attributes as columns (those not named like a phase column), in the order they first appear,
    NaN where a phase lacks one: the frame that a list of dicts makes (the same dtypes), column by
    column, a third of the time at 138,000 phases."""
    keys: dict = {}
    for a in attrs:
        for k in a:
            if k not in keys and k not in PHASE_COLUMNS:
                keys[k] = None
    if not keys:  # as the list of dicts makes it (its empty column index, too)
        return pd.DataFrame([{} for _ in attrs], index=index)
    nan = np.nan
    return pd.DataFrame({k: [a.get(k, nan) for a in attrs] for k in keys}, index=index)


def _hosts(events: pd.DataFrame) -> list[str]:
    """The host of each event ("" where unknown: fakes, tails of old logs)."""
    if "host" not in events:
        return [""] * len(events)
    return ["" if h is None or h != h else str(h) for h in events["host"].tolist()]


def _depths(phases: pd.DataFrame) -> list[int]:
    # plain lists: iterating the (Arrow-backed) host column costs a second at 138,000 phases
    keys = list(zip(phases["host"].tolist(), phases["pid"].tolist()))
    ids, parents = phases["id"].tolist(), phases["parent"].tolist()
    parent_of = {(*k, i): par for k, i, par in zip(keys, ids, parents)}
    # (host, pid, id) unique (the usual case): a phase's entry is its own parent, no lookup to make it
    own = len(parent_of) == len(ids)
    depths = []
    for key, phase_id, parent in zip(keys, ids, parents):
        depth, parent = 0, parent if own else parent_of.get((*key, phase_id), -1)
        while parent != -1 and depth < 64:
            depth, parent = depth + 1, parent_of.get((*key, parent), -1)
        depths.append(depth)
    return depths


def fill_phases_from_timeline(samples: pd.DataFrame, events: pd.DataFrame, pids: list[int]) -> pd.DataFrame:
    """Rows sampled from outside (`record --exec`) get the innermost phase open at their time."""
    times, labels = phase_timeline(events)
    if not len(times):
        return samples
    mask = samples["pid"].isin(pids).to_numpy()
    at = np.searchsorted(times, samples["t"].to_numpy()[mask], side="right") - 1
    filled = np.where(at >= 0, np.asarray(labels, dtype=object)[np.maximum(at, 0)], "")
    phase = samples["phase"].astype(str).to_numpy(dtype=object)
    phase[mask] = filled
    samples["phase"] = pd.Categorical(phase)
    return samples


def phase_timeline(events: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Step function: from times[k] on, the innermost open phase is labels[k] ('' when none)."""
    open_phases: dict[tuple, str] = {}
    times, labels = [], []
    for kind, host, pid, phase_id, name, t in zip(events["kind"], _hosts(events), events["pid"], events["id"],
                                                  events["name"], events["t"]):
        if kind == names.BEGIN:
            open_phases[(host, pid, phase_id)] = name
        elif kind == names.END:
            open_phases.pop((host, pid, phase_id), None)
        else:
            continue
        times.append(t)
        labels.append(next(reversed(open_phases.values()), ""))
    return np.asarray(times, dtype=float), labels
