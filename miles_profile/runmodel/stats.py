"""Per-phase statistics: pure functions from a loaded run to pandas tables (bytes as integers).

Public API (stable; shared with the Dash dashboard):

    stat_metrics(run) -> list[Metric]        # which series the tables summarize
    phase_instances(run) -> DataFrame        # one row per phase instance: name, iteration, start,
                                             #   end, duration, pid, depth, status, expected_bytes,
                                             #   and per metric m: m_floor, m_mean, m_peak (Int64)
    phase_table(run, by_iteration=False) -> DataFrame
        # one row per phase (or per (iteration, phase)): count, total_s, mean_s and per metric
        # floor (lowest level), mean (mean of the instances' means) and peak (highest true peak)
    range_stats(y, i0, i1) -> (floor, mean, peak)   # vectorized over index ranges

A phase's samples are those with start < t <= end: each sample's peak covers the time since the
previous sample, so these are exactly the samples whose peaks fall inside the phase.
The iteration of a phase is its `rollout_id` attribute (carried forward in time to phases without
one; phases before the first get -1), or, in a run without any `rollout_id`, the number of starts of its
process's most frequent top-level phase name up to it (phases before the first: -1).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from miles_profile.runmodel.reduce import phase_ranges
from miles_profile.runmodel.series import pids_with, series_arrays


@dataclass(frozen=True)
class Metric:
    name: str              # prefix of the table's columns, e.g. "rss", "gpu0_alloc"
    label: str             # what it is, for headers
    column: str            # level column in samples
    peak_column: str       # true-peak column (the level column itself where none exists)
    per_process: bool      # True: read from the phase's own process when it has the column


def stat_metrics(run) -> list[Metric]:
    metrics = []
    for i in run.gpu_indices:
        for kind, label, peak, own in (("used", "NVML used", "used", False),
                                       ("reserved", "allocator reserved", "reserved", True),
                                       ("alloc", "allocator allocated", "alloc_peak", True)):
            column = f"gpu{i}_{kind}"
            if pids_with(run, column):
                peak_column = f"gpu{i}_{peak}" if pids_with(run, f"gpu{i}_{peak}") else column
                metrics.append(Metric(column, f"GPU {i} {label}", column, peak_column, own))
    if pids_with(run, "rss"):
        metrics.append(Metric("rss", "host RSS", "rss", "rss_peak" if pids_with(run, "rss_peak") else "rss", True))
    if pids_with(run, "host_available"):
        metrics.append(Metric("host_available", "host available", "host_available", "host_available", False))
    return metrics


def range_stats(y: np.ndarray, i0: np.ndarray, i1: np.ndarray, peak: np.ndarray | None = None):
    """Floor, mean and peak of y over each index range [i0, i1) (NaN for an empty range).

    `peak`, when given, is a true-peak series that bounds y from above (the peak is taken from it).
    No whole-series temporaries where avoidable: on a 10-million-sample run each one is 80 MB, and
    allocating it (page faults) costs more than the reductions.
    """
    y = np.asarray(y, dtype=np.float64)
    peak = None if peak is None else np.asarray(peak, dtype=np.float64)
    n = len(i0)
    if n == 0:
        empty = np.empty(0)
        return empty, empty, empty
    size = len(y)
    if size == 0:
        nan = np.full(n, np.nan)
        return nan, nan.copy(), nan.copy()
    i0 = np.asarray(i0, dtype=np.int64)
    i1 = np.asarray(i1, dtype=np.int64)
    empty = i1 <= i0
    # reduceat needs indices < size: a range reaching the end is cut one short, then completed below.
    flat = np.minimum(np.column_stack((i0, i1)).ravel(), size - 1)
    floor = np.fmin.reduceat(y, flat)[::2]
    top = np.fmax.reduceat(y, flat)[::2]
    if peak is not None:  # the maximum of max(peak, y) is the larger of the two maxima
        top = np.fmax(top, np.fmax.reduceat(peak, flat)[::2])
    finite = np.isfinite(y)
    if finite.all():
        sums = np.add.reduceat(y, flat)[::2]
        counts = np.diff(flat)[::2]  # exact except for ranges reaching the end, completed below
    else:
        sums = np.add.reduceat(np.where(finite, y, 0.0), flat)[::2]
        counts = np.add.reduceat(finite, flat, dtype=np.int64)[::2]
    for k in np.flatnonzero((i1 >= size) & ~empty):  # few: only ranges that run to the last sample
        a = int(i0[k])
        part = y[a:]
        part_peak = part if peak is None else np.fmax(peak[a:], part)
        ok = np.isfinite(part)
        floor[k] = np.min(part[ok]) if ok.any() else np.nan
        top[k] = np.nanmax(part_peak) if np.isfinite(part_peak).any() else np.nan
        sums[k], counts[k] = part[ok].sum(), ok.sum()
    counts = np.where(empty, 0, counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    floor = np.where(empty | (counts == 0), np.nan, floor)
    top = np.where(empty, np.nan, top)
    return floor, mean, top


def _iterations(phases: pd.DataFrame) -> np.ndarray:
    if "rollout_id" in phases and phases["rollout_id"].notna().any():
        ids = pd.to_numeric(phases["rollout_id"], errors="coerce")
        order = np.argsort(phases["start"].to_numpy(), kind="stable")
        filled = ids.iloc[order].ffill().fillna(-1).to_numpy()
        out = np.empty(len(phases), dtype=np.int64)
        out[order] = filled.astype(np.int64)
        return out
    return _counted_iterations(phases)


def process_iterations(phases: pd.DataFrame, hosts: list) -> np.ndarray:
    """`_iterations` with each process's own counted iterations (pids repeat across hosts): the
    host:pid key is made only where it is read, a run without `rollout_id` (138,000 f-strings at
    1,024 processes otherwise)."""
    if "rollout_id" in phases and phases["rollout_id"].notna().any():
        return _iterations(phases)
    return _iterations(phases.assign(pid=[f"{h}:{p}" for h, p in zip(hosts, phases["pid"].tolist())]))


def _counted_iterations(phases: pd.DataFrame) -> np.ndarray:
    """Without any `rollout_id`: per process, each start of its most frequent top-level phase name (ties:
    the one that starts first) opens an iteration, and every phase takes the iteration open at its start;
    phases before the first get -1 (setup). A loop with a `train` phase per step and an `eval` every 100
    steps: each eval belongs to the step before it (counting occurrences per name made the 27th eval,
    at step 2,799, iteration 27, and spread "iteration 27" over most of the run)."""
    out = np.full(len(phases), -1, dtype=np.int64)
    starts = phases["start"].to_numpy(float)
    names = phases["name"].astype(str).to_numpy()
    top_level = (pd.to_numeric(phases["depth"], errors="coerce").fillna(0).to_numpy() == 0
                 if "depth" in phases else np.ones(len(phases), dtype=bool))
    for rows in phases.groupby("pid", sort=False).indices.values():
        top = rows[top_level[rows]] if top_level[rows].any() else rows
        counts = pd.Series(names[top]).value_counts()
        tied = counts.index[counts == counts.max()]
        first = {name: starts[top][names[top] == name].min() for name in tied}
        opening = min(tied, key=lambda name: first[name])
        opens = np.sort(starts[top][names[top] == opening])
        out[rows] = np.searchsorted(opens, starts[rows], "right") - 1
    return out


def _source_pid(run, metric: Metric, pid: int) -> int | None:
    owners = pids_with(run, metric.column)
    if not owners:
        return None
    return pid if metric.per_process and pid in owners else owners[0]


def phase_instances(run) -> pd.DataFrame:
    """One row per phase instance, with its iteration and floor/mean/peak of each metric."""
    cache = run.__dict__.setdefault("_report_cache", {})
    if "instances" in cache:
        return cache["instances"]
    phases = run.phases
    cols = ["name", "iteration", "start", "end", "duration", "pid", "depth", "status", "expected_bytes"]
    if phases.empty:
        table = pd.DataFrame(columns=cols)
    else:
        table = pd.DataFrame({
            "name": phases["name"].astype(str).to_numpy(), "iteration": _iterations(phases),
            "start": phases["start"].to_numpy(float), "end": phases["end"].to_numpy(float),
            "duration": phases["duration"].to_numpy(float), "pid": phases["pid"].to_numpy(np.int64),
            "depth": phases["depth"].to_numpy(np.int64), "status": phases["status"].astype(str).to_numpy(),
            "expected_bytes": pd.to_numeric(phases.get("expected_bytes", pd.Series(np.nan, index=phases.index)),
                                            errors="coerce").to_numpy(float),
        })
        for metric in stat_metrics(run):
            floor = np.full(len(table), np.nan)
            mean, peak = floor.copy(), floor.copy()
            for pid, rows in table.groupby("pid").indices.items():
                source = _source_pid(run, metric, int(pid))
                if source is None:
                    continue
                t, y = series_arrays(run, source, metric.column)
                top = series_arrays(run, source, metric.peak_column)[1]
                i0, i1 = phase_ranges(t, table["start"].to_numpy()[rows], table["end"].to_numpy()[rows])
                floor[rows], mean[rows], peak[rows] = range_stats(y, i0, i1, top)
            table[f"{metric.name}_floor"] = _int(floor)
            table[f"{metric.name}_mean"] = _int(np.round(mean))
            table[f"{metric.name}_peak"] = _int(peak)
    cache["instances"] = table
    return table


def _int(values: np.ndarray) -> pd.Series:
    return pd.array(np.where(np.isfinite(values), values, np.nan), dtype="Float64").round().astype("Int64")


def phase_table(run, by_iteration: bool = False) -> pd.DataFrame:
    """Per phase (or per iteration and phase): count, durations and each metric's floor/mean/peak."""
    instances = phase_instances(run)
    keys = ["iteration", "name"] if by_iteration else ["name"]
    if instances.empty:
        return pd.DataFrame(columns=[*keys, "count", "total_s", "mean_s"])
    # the names as a list: iterating the str column costs a microsecond a phase
    order = {name: k for k, name in enumerate(dict.fromkeys(instances.sort_values("start")["name"].tolist()))}
    grouped = instances.groupby(keys, sort=False)
    table = grouped.agg(count=("duration", "size"), total_s=("duration", "sum"), mean_s=("duration", "mean"))
    for metric in stat_metrics(run):
        m = metric.name
        table[f"{m}_floor"] = grouped[f"{m}_floor"].min()
        table[f"{m}_mean"] = grouped[f"{m}_mean"].mean().round().astype("Int64")
        table[f"{m}_peak"] = grouped[f"{m}_peak"].max()
    table = table.reset_index()
    table["_order"] = table["name"].map(order)
    table = table.sort_values((["iteration"] if by_iteration else []) + ["_order"], kind="stable")
    return table.drop(columns="_order").reset_index(drop=True)
