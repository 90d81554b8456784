"""Which memory series a run has, and their values as numpy arrays (no plotly).

A run's samples hold one row per process per sample; most columns belong to the process that wrote
the row (`rss`, `gpu{i}_alloc`, ...), a few describe the whole device or host (`gpu{i}_used`,
`host_available`) and are taken from the one process that recorded most of them.

Public API (stable; shared with the Dash dashboard):

    GiB                                   # 1024**3: the only unit on screen
    Series(column, pid, label, group, kind, peak_of)
    timeline_series(run) -> list[Series]  # what the timeline plots, grouped "gpu0", ..., "host"
    series_arrays(run, pid, column) -> (t, y)   # float64 arrays, t sorted
    process_rows(run, pid) -> positions | None  # one process's rows, all processes indexed in one pass
    process_samples(run, pid) -> DataFrame      # those rows, its own columns only
    process_columns(run, pid, columns) -> DataFrame   # some columns of those rows
    process_take(run, pid, at, columns) -> DataFrame  # some of those rows (positions among them)
    sample_store(run) -> ProcessSamples | None  # the samples per process, as read (not merged)
    sample_columns(run) / has_column(run, c) / sample_count(run) / first_and_last_t(run)
                                                # the merged frame's shape, without merging
    own_columns(run, pid) -> [column]           # t, phase, pid and the columns it has values in
    process_label(run, pid) -> str
    Track(name, label, pid, t, value, peak)     # one memory level and its true-peak envelope;
                                                #   .sample_gap(start, end): why it can't judge a span
    host_track(run, pid) / device_track(run, pid, kinds=ALLOCATOR_KINDS | DRIVER_KINDS) -> Track | None
    main_pid(run) -> int | None           # the process whose phases drive the report
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from miles_profile.runmodel.sample_shape import (  # noqa: F401 (this module's API: the views import them from here)
    columns_of, first_and_last_t, has_column, sample_columns, sample_count, sample_store,
)

GiB = 1024 ** 3

# Per GPU, the columns in the order they are drawn, with their legend text.
GPU_KINDS = (
    ("used", "NVML used (device)"),
    ("proc", "NVML this process"),
    ("reserved", "allocator reserved"),
    ("alloc", "allocator allocated"),
    ("alloc_peak", "allocated, true peak"),
)
DEVICE_WIDE = ("host_available",)  # plus gpu{i}_used
# NVML and disk columns are read at phase boundaries and every 100 ms, empty in the rows between: a
# plot skips those rows rather than break its line at each of them.
SPARSE_SUFFIXES = ("_used", "_proc", "disk")


@dataclass(frozen=True)
class Series:
    column: str       # column in run.samples
    pid: int          # whose rows hold it
    label: str        # legend text
    group: str        # subplot: "gpu0", "gpu1", ..., "host"
    kind: str         # "used", "proc", "reserved", "alloc", "alloc_peak", "rss", "rss_peak", ...
    peak_of: str | None = None  # for a true-peak envelope, the column it bounds


@dataclass
class Track:
    """One memory level of one process (or device) and its true-peak envelope, for the checks."""
    name: str         # "host" or "device"
    label: str        # what it measures, for messages
    pid: int
    t: np.ndarray
    value: np.ndarray
    peak: np.ndarray
    _measured: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def at_or_before(self, when: float) -> float:
        """The last level recorded at or before `when` (NaN if none)."""
        k = int(np.searchsorted(self.t, when, side="right")) - 1
        return float(self.value[k]) if k >= 0 else float("nan")

    def measured_times(self, peak: bool = False) -> np.ndarray:
        """Times of the samples where the level (or the peak) was measured: NVML and disk columns are
        empty between their reads, and those rows say nothing. Computed once per track."""
        if peak not in self._measured:
            self._measured[peak] = self.t[np.isfinite(self.peak if peak else self.value)]
        return self._measured[peak]

    def sample_gap(self, start: float, end: float, *, before: bool = True, peak: bool = False) -> str | None:
        """Why these samples cannot judge the span start..end, or None when they can.

        Judged when a measured sample lies at or before `start` (with `before`), one lies inside
        (start < t <= end), and the series reaches `end`: the last samples of a run being written, or
        of a recorder killed with `kill -9`, are not on disk yet while its last events are.
        """
        t = self.measured_times(peak)
        if not len(t):
            return "no measured sample at all"
        if t[-1] < end:
            return "the samples end before it does (log cut off, or samples not written yet)"
        if before and t[0] > start:
            return "no sample before it"
        k = int(np.searchsorted(t, start, "right"))
        if k >= len(t) or t[k] > end:
            return "no sample inside it (shorter than the sampling interval)"
        return None


def _cache(run) -> dict[str, Any]:
    return run.__dict__.setdefault("_report_cache", {})


def _rows_of(run, pid: int) -> np.ndarray | None:
    """Row positions of one process (in time order), or None when the run has only that process. Every
    process's rows come from one stable sort of the pid column, made once per run: a mask per process
    read the whole column once per process (32 x 9.6M rows on a fleet run without summaries)."""
    cache = _cache(run)
    if "rows_by_pid" not in cache:
        pids = run.samples["pid"].to_numpy()
        if not len(pids) or (pids == pids[0]).all():
            cache["rows_by_pid"] = {int(pids[0]): None} if len(pids) else {}
        else:
            order = np.argsort(pids, kind="stable")  # stable: each process's rows stay in time order
            ordered = pids[order]
            cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
            cache["rows_by_pid"] = {int(ordered[a]): order[a:b] for a, b in
                                    zip(np.r_[0, cuts], np.r_[cuts, len(order)])}
    found = cache["rows_by_pid"]
    return found[pid] if pid in found else np.empty(0, dtype=np.int64)


def process_rows(run, pid: int) -> np.ndarray | None:
    """Row positions in `run.samples` of one process, in time order (None: every row, the run has only
    that process). Computed for every process at once and kept with the run, so the ledger, the checks
    and the figures share one pass over the samples."""
    return _rows_of(run, pid)


def process_samples(run, pid: int):
    """One process's rows of `run.samples` (a frame of its own), through process_rows, holding only the
    columns it has a value in (own_columns)."""
    store = sample_store(run)
    if store is not None:
        if pid not in store.by_pid:  # no rows: the merged frame's t, phase and pid, empty
            frame = store.frames[0] if store.frames else None
            return frame[["t", "phase", "pid"]].iloc[:0].reset_index(drop=True) if frame is not None else \
                pd.DataFrame({"t": pd.Series(dtype=float), "phase": pd.Series(dtype="category"),
                              "pid": pd.Series(dtype="int64")})
        frame = store.by_pid[pid]
        if len(store.frames) == 1:  # the run's one frame: `run.samples` itself, as below
            return frame
        own = store.own_columns(pid)
        return frame if own == list(frame.columns) else columns_of(frame, own)
    rows = _rows_of(run, pid)
    return run.samples if rows is None else take_rows(run.samples, rows, own_columns(run, pid))


def process_columns(run, pid: int, columns: list[str]) -> pd.DataFrame:
    """`columns` of one process's rows (a frame of its own, index 0..n-1)."""
    store = sample_store(run)
    if store is not None:
        frame = store.by_pid[pid]
        return columns_of(frame, columns)
    rows = _rows_of(run, pid)
    return run.samples[columns] if rows is None else take_rows(run.samples, rows, columns)


def process_take(run, pid: int, at: np.ndarray, columns: list[str]) -> pd.DataFrame:
    """`process_columns(run, pid, columns).iloc[at]` with index 0..n-1, copying only those rows."""
    store = sample_store(run)
    if store is not None:
        return take_rows(store.by_pid[pid], at, columns)
    positions = _rows_of(run, pid)
    return take_rows(run.samples, at if positions is None else positions[at], columns)


def own_columns(run, pid: int) -> list[str]:
    """The samples columns of one process: t, phase, pid and every column it has a value in. The run's
    frame holds every process's columns (gpu3_proc beside gpu5_proc), empty but for their owner's rows;
    a copy of them per process was most of the checks' and the ledger's time on a 32-process run."""
    store = sample_store(run)
    if store is not None:
        return store.own_columns(pid) if pid in store.by_pid else ["t", "phase", "pid"]
    return [c for c in run.samples.columns if c in ("t", "phase", "pid") or pid in _value_counts(run, c)]


def take_rows(samples, rows: np.ndarray, columns: list[str]):
    """`samples[columns].iloc[rows].reset_index(drop=True)`, copying only those columns' rows (pandas
    copies every column of the whole frame to select columns, then takes)."""
    out = {}
    for c in columns:
        column = samples[c]
        if isinstance(column.dtype, pd.CategoricalDtype):
            out[c] = pd.Categorical.from_codes(column.cat.codes.to_numpy()[rows], dtype=column.dtype)
        else:
            out[c] = column.to_numpy()[rows]
    return pd.DataFrame(out, columns=columns, copy=False)  # no 2-D block built by copying the columns again


def _value_counts(run, column: str) -> dict[int, int]:
    """{pid: values it has in `column`} for the processes with any, from the run's one index: one pass
    over the column, not a groupby of it per call."""
    cache = _cache(run).setdefault("value_counts", {})
    if column not in cache and (store := sample_store(run)) is not None:
        found = {}
        for pid, frame in store.by_pid.items():
            if column in frame:
                n = len(frame) if not frame[column].hasnans else int(frame[column].notna().sum())
                if n:
                    found[pid] = n
        cache[column] = dict(sorted(found.items()))
    if column not in cache:
        samples = run.samples
        if column not in samples or not len(samples):
            cache[column] = {}
        else:
            values = samples[column]
            present = values.notna().to_numpy() if values.hasnans or values.dtype == object else None
            found = {}
            for pid in pids(run):
                rows = _rows_of(run, pid)
                n = (len(samples) if rows is None else len(rows)) if present is None else \
                    int(present.sum() if rows is None else present[rows].sum())
                if n:
                    found[pid] = n
            cache[column] = found
    return cache[column]


def _column(run, column: str) -> np.ndarray:
    """One samples column as float64 (NaN where absent), converted once per run, not once per process."""
    cache = _cache(run).setdefault("columns", {})
    if column not in cache:
        samples = run.samples
        cache[column] = samples[column].to_numpy(dtype=np.float64, na_value=np.nan) if column in samples else None
    return cache[column]


def series_arrays(run, pid: int, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(t, y) of one column of one process, float64, sorted by t."""
    cache = _cache(run).setdefault("arrays", {})
    key = (pid, column)
    if key not in cache and (store := sample_store(run)) is not None:
        frame = store.by_pid.get(pid)
        times = _cache(run).setdefault("times", {})
        if pid not in times:
            times[pid] = frame["t"].to_numpy(np.float64) if frame is not None else np.empty(0)
        t = times[pid]
        y = frame[column].to_numpy(dtype=np.float64, na_value=np.nan) if frame is not None and column in frame \
            else np.full(len(t), np.nan)
        cache[key] = (t, y)
    if key not in cache:
        rows = _rows_of(run, pid)
        t = _column(run, "t")
        if t is None:
            t = np.empty(0)
        y = _column(run, column)
        if y is None:
            y = np.full(len(t), np.nan)
        if rows is not None:  # one copy of a process's times for all its columns (not one per column)
            times = _cache(run).setdefault("times", {})
            if pid not in times:
                times[pid] = t[rows]
            t, y = times[pid], y[rows]
        cache[key] = (t, y)
    return cache[key]


def pids(run) -> list[int]:
    cache = _cache(run)
    if "pids" not in cache and (store := sample_store(run)) is not None:
        cache["pids"] = sorted(store.by_pid)
    if "pids" not in cache:
        cache["pids"] = sorted(int(p) for p in run.samples["pid"].unique()) if len(run.samples) else []
    return cache["pids"]


def pids_with(run, column: str) -> list[int]:
    """Processes with at least one value in `column`, most values first."""
    if not has_column(run, column):
        return []
    cache = _cache(run).setdefault("pids_with", {})
    if column not in cache:
        counts = _value_counts(run, column)
        cache[column] = sorted(counts, key=lambda p: -counts[p])  # stable: equal counts by pid
    return cache[column]


def _role(run, pid: int) -> str | None:
    return next((p.get("role") for p in run.processes if p.get("pid") == pid), None)


def process_label(run, pid: int) -> str:
    role = _role(run, pid)
    if role == "exec_parent":
        return f"process tree (pid {pid}, sampled from outside)"
    if role == "miles_cpu_profiler":
        return "host used memory (Miles CPU profiler)"
    return f"pid {pid}"


def main_pid(run) -> int | None:
    """The process that recorded the most phases, among those that train where any does (else the one
    with the most samples). The trainer drives the loop: an engine server records a phase per weight
    bucket (88 `update_weights` against its actor's 4 on sample_logs/h200/9-dist-engine-server), so a
    plain count picked the engine and left every train cell empty."""
    if len(run.phases):
        trains = run.phases.loc[run.phases["name"] == "train", "pid"].unique()
        phases = run.phases[run.phases["pid"].isin(trains)] if len(trains) else run.phases
        return int(phases["pid"].value_counts().idxmax())
    found = pids_with(run, "rss")
    return found[0] if found else (pids(run)[0] if pids(run) else None)


def timeline_series(run) -> list[Series]:
    """Every series the timeline draws: per GPU, then the host."""
    out: list[Series] = []
    many = len(pids(run)) > 1
    for i in run.gpu_indices:
        for kind, text in GPU_KINDS:
            column = f"gpu{i}_{kind}"
            owners = pids_with(run, column)
            if kind == "used":
                owners = owners[:1]  # the device's own number: one copy is enough
            for pid in owners:
                label = text if not many or kind == "used" else f"{text}, {process_label(run, pid)}"
                out.append(Series(column, pid, label, f"gpu{i}", kind,
                                  f"gpu{i}_alloc" if kind == "alloc_peak" else None))
    for pid in pids_with(run, "rss"):
        suffix = f", {process_label(run, pid)}" if many else ""
        label = process_label(run, pid) if _role(run, pid) == "miles_cpu_profiler" else f"RSS{suffix}"
        out.append(Series("rss", pid, label, "host", "rss"))
        if pid in pids_with(run, "rss_peak"):
            out.append(Series("rss_peak", pid, f"RSS, true peak{suffix}", "host", "rss_peak", "rss"))
    for column, text in (("pinned", "pinned host memory"), ("disk", "offload files on disk")):
        for pid in pids_with(run, column):
            out.append(Series(column, pid, text + (f", {process_label(run, pid)}" if many else ""), "host", column))
    for pid in pids_with(run, "host_available")[:1]:
        out.append(Series("host_available", pid, "host available", "host", "host_available"))
    return out


# -- tracks for the checks -------------------------------------------------------------------
def host_track(run, pid: int | None) -> Track | None:
    """RSS of `pid` (falling back to the outside sampler, then any process) and its true peak."""
    candidates = pids_with(run, "rss")
    if not candidates:
        return None
    if pid not in candidates:
        outside = [p for p in candidates if _role(run, p) == "exec_parent"]
        pid = (outside or candidates)[0]
    t, value = series_arrays(run, pid, "rss")
    peak = series_arrays(run, pid, "rss_peak")[1] if has_column(run, "rss_peak") else value
    peak = np.fmax(peak, value)
    return Track("host", f"host RSS of {process_label(run, pid)}", pid, t, value, peak)


ALLOCATOR_KINDS = ("proc", "reserved", "alloc", "used")
# torch_memory_saver pauses are invisible to the allocator's counters: only the driver's series see them.
DRIVER_KINDS = ("proc", "used")


def _device_columns(run, pid: int, kinds: tuple[str, ...] = ALLOCATOR_KINDS) -> list[tuple[str, str | None]]:
    """Per GPU this process uses: (level column, peak column) in order of preference."""
    chosen = []
    for i in run.gpu_indices:
        for kind in kinds:
            column = f"gpu{i}_{kind}"
            y = series_arrays(run, pid, column)[1] if has_column(run, column) else None
            if y is not None and np.isfinite(y).any() and np.nanmax(y) > 0:
                peak = f"gpu{i}_alloc_peak" if has_column(run, f"gpu{i}_alloc_peak") else None
                chosen.append((column, peak))
                break
    return chosen


def device_track(run, pid: int | None, kinds: tuple[str, ...] = ALLOCATOR_KINDS) -> Track | None:
    """GPU memory of `pid` summed over the GPUs it uses (NVML per process, else allocator; with
    `kinds=DRIVER_KINDS` NVML per process, else NVML device used), or None."""
    if not run.gpu_indices:
        return None
    order = ([pid] if pid is not None else []) + [p for p in pids(run) if p != pid]
    for candidate in order:
        columns = _device_columns(run, candidate, kinds)
        if columns:
            break
    else:
        return None
    t = series_arrays(run, candidate, columns[0][0])[0]
    value = np.zeros(len(t))
    peak = np.zeros(len(t))
    for column, peak_column in columns:
        y = series_arrays(run, candidate, column)[1]
        p = series_arrays(run, candidate, peak_column)[1] if peak_column else y
        value += y
        peak += np.fmax(y, p)
    names = "+".join(c for c, _ in columns)
    return Track("device", f"GPU memory ({names}) of {process_label(run, candidate)}", candidate, t, value, peak)
