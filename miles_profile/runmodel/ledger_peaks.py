"""The ledger's rows at each phase's peak (`at` = "peak"): per lane, the instant of its highest sample
inside the phase, the other processes on that GPU as they stood then (ledger.py's docstring)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.runmodel.ledger_categories import HOST, _held, _gpu_rows, _host_rows, _value
from miles_profile.runmodel.ledger_sources import _Context, _gpu_indices, _member, _nvml, _row_at, _used_at
from miles_profile.runmodel.series import pids, process_samples, sample_count


# The series whose highest sample inside a phase marks its peak instant, best first: on a GPU the
# allocator's true peak (where activations live), then the levels; on the host the true RSS peak
# (VmHWM since the previous sample), then RSS.
HOST_PEAK_SERIES = ("rss_peak", "rss")


def _gpu_peak_series(i: int) -> tuple[str, ...]:
    return (f"gpu{i}_alloc_peak", f"gpu{i}_alloc", f"gpu{i}_reserved", f"gpu{i}_proc", f"gpu{i}_used")


def _highest(window: pd.DataFrame, series: tuple[str, ...]) -> tuple[int, str, float] | None:
    """(row, series, value) of the highest sample of the first series measured in the window."""
    for column in series:
        if column in window.columns:
            values = pd.to_numeric(window[column], errors="coerce").to_numpy(float)
            if np.isfinite(values).any():
                k = int(np.nanargmax(values))
                return k, column, float(values[k])
    return None


def _carry_nvml(frame: pd.DataFrame) -> pd.DataFrame:
    """NVML read less often than the samples (a Miles import, logs without an allocator): a row without
    its own read takes the latest one. With an allocator, a peak's NVML comes from the phase boundary
    before it instead (_gpu_peak)."""
    rest = [c for c in frame.columns if c.startswith("gpu") and c.endswith(("_used", "_proc"))]
    frame[rest] = frame[rest].ffill()
    return frame


def _samples_by_process(run, only: set[tuple[str, int]] | None) -> dict[int, pd.DataFrame]:
    """Each recorded pid's samples in time order (samples carry no host: pids are unique in a run),
    NVML carried between its reads (_carry_nvml)."""
    if not sample_count(run):
        return {}
    wanted = pids(run) if only is None else sorted({int(p) for _, p in only} & set(pids(run)))
    # Each process's rows from the run's one index (series.process_rows: already in time order), not
    # a groupby that copies and sorts the whole frame again.
    return {pid: _carry_nvml(process_samples(run, pid).reset_index(drop=True)) for pid in wanted}


def _host_peak(ctx: _Context, host: str, pid: int, window: pd.DataFrame) -> list[tuple] | None:
    found = _highest(window, HOST_PEAK_SERIES)
    if found is None:
        return None
    k, _, peak = found
    row = window.iloc[k].copy()
    t = float(row["t"])
    rss = _value(row, "rss")
    if rss is not None and _value(row, "rss_anon") is not None:
        # the true peak's excess over the row's RSS was allocated and freed between two samples: anonymous
        row["rss_anon"] = row["rss_anon"] + max(peak - rss, 0.0)
    row["rss"] = peak
    declared = {c: v for (d, c), v in ctx.declared.at(host, pid, t).items() if d == HOST}
    rows, total = _host_rows(row, declared)
    return [(t, HOST, f"host RSS, pid {pid}", c, s, v, np.nan if total is None else total) for c, s, v in rows]


def _at_peak(state: pd.Series | None, row: pd.Series, i: int, peak: float) -> tuple[pd.Series, float | None]:
    """This process's row at its allocated peak, made of one instant: allocated = the true peak,
    reserved at least that; NVML per-process = reserved plus what it held beyond reserved at the
    phase boundary before (context, NCCL: they barely move), device used = that boundary's plus this
    process's change since. NVML and the allocator are read at different instants inside a phase:
    taken as read, an onload's peak showed -10.6 GiB of non-PyTorch memory and an offload's +14 GiB
    (sample_logs/h200/9-dist-engine-server), the latest periodic read 19 GiB of a finished generate
    under other processes (h200/4-both). Returns the row and device used (None: unknown)."""
    row = row.copy()
    row[f"gpu{i}_alloc"] = peak
    reserved = _value(row, f"gpu{i}_reserved")
    if reserved is not None:
        reserved = row[f"gpu{i}_reserved"] = max(reserved, peak)
    before = {k: _nvml(state, i, k) for k in ("proc", "used")}
    before_reserved = _value(state, f"gpu{i}_reserved")
    for name in (f"gpu{i}_proc", f"gpu{i}_boundary_proc", f"gpu{i}_used", f"gpu{i}_boundary_used"):
        row[name] = np.nan
    if before["proc"] is None:
        return row, before["used"]
    proc = before["proc"] if reserved is None or before_reserved is None else reserved + before["proc"] - before_reserved
    row[f"gpu{i}_proc"] = proc
    return row, None if before["used"] is None else before["used"] + proc - before["proc"]


def _gpu_peak(ctx: _Context, host: str, pid: int, i: int, window: pd.DataFrame) -> list[tuple] | None:
    found = _highest(window, _gpu_peak_series(i))
    if found is None:
        return None
    k, column, peak = found
    row = window.iloc[k]
    t = float(row["t"])
    uuid = ctx.uuids((host, pid)).get(i, f"gpu{i}")
    state = _row_at(ctx.states.get((host, pid)), t)
    if column.endswith(("_alloc_peak", "_alloc")) and state is not None:
        row, used = _at_peak(state, row, i, peak)
    else:  # no allocator (or no boundary yet): the row's own reads, the latest carried
        used = _nvml(row, i, "used")
    members = [_member(ctx, who, uuid, t, row if who == (host, pid) else None)
               for who in ctx.on_gpu.get((host, uuid), [])]
    if used is not None and state is not None and column.endswith(("_alloc_peak", "_alloc")):
        # the others' change since this process's boundary is on the device too (an engine server that
        # freed its KV cache during the actor's offload_kv call), or it lands in "other processes"
        others = [who for who in ctx.on_gpu.get((host, uuid), []) if who != (host, pid)]
        used += sum(_held(_member(ctx, who, uuid, t)) - _held(_member(ctx, who, uuid, float(state.name)))
                    for who in others)
    if used is None:
        used = _used_at(ctx.run, host, uuid, t)
    if not members and used is None:
        return None
    label = f"gpu{i} ({uuid[:12]})" if uuid.startswith("GPU-") else f"gpu{i}"
    return [(t, uuid, label, c, s, v, np.nan if used is None else used) for c, s, v in _gpu_rows(used, members)]


def _peak_rows(ctx: _Context, samples: dict[int, pd.DataFrame], host: str, pid: int, start: float,
               end: float) -> list[tuple]:
    """(t, device, label, category, source, bytes, total) at each lane's peak inside [start, end]:
    this process's RSS at its highest sample, each GPU it samples at its highest allocated (the other
    processes on that GPU as they stood then). A phase without a sample inside has none."""
    own = samples.get(pid)
    if own is None:
        return []
    t = own["t"].to_numpy(float)
    window = own.iloc[int(np.searchsorted(t, start, "left")):int(np.searchsorted(t, end, "right"))]
    if window.empty:
        return []
    out = _host_peak(ctx, host, pid, window) or []
    for i in _gpu_indices(window.iloc[-1]):
        out += _gpu_peak(ctx, host, pid, i, window) or []
    return out
