"""A loaded run as the fleet view's `PhaseTable` (fleet.py): one row per (process, phase instance).

    phase_table(run) -> DataFrame      # shared by the static report and the dashboard's fleet view
    window_stats(t, y, starts, ends) -> (peak, floor, first, last)   # rows with start < t <= end

Where each column comes from:

- identity (host, pid, rank, role, gpu_uuid) from the process metas. An engine process carries the
  rank it serves: the trainer spawns it with that rank's `RANK`. A process whose meta has no
  `gpu_uuid` (a CPU run, or CUDA never initialised) gets "" (a host-memory lane). A process whose
  meta could not be read gets rank -1 and `identified` False.
- `gpu_total`, `gpu_index` from the host samplers' metas (`gpus`), else the process metas' `devices`
  and `cuda_devices`; on a host lane the host's total (host probe, else the host samples' MemTotal).
- `proc/alloc/reserved/rss_*` from the phase summaries of the `end` events (the process's own
  `gpu{i}_*` columns of its GPU, `rss`): cost grows with phases, not samples. A phase without a
  summary (a version-1 log written before summaries, or a phase still open) gets the same four
  numbers computed from its process's samples with the same definition (rows with start < t <= end,
  the peak including `<c>_peak`); only those processes' samples are touched.
- `used_*`, the device's NVML total, is read from the host sampler's GPU samples (`Run.gpu_used`,
  every 100 ms), not from summaries: a process's summaries carry `gpu{i}_used` only when it sampled
  NVML itself. `proc_*` falls back to the host sampler's per-process rows (`Run.gpu_procs`) where the
  process's summaries lack it, then to the process's own reads at its phase boundaries
  (`gpu{i}_boundary_proc`) where a phase has neither. Both in one vectorized pass per GPU (or per process): a searchsorted
  for the window bounds and a `reduceat` for the peaks and floors.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from miles_profile.logdir.sample_summaries import processes_read, summaries_from_samples
from miles_profile.runmodel.series import (
    has_column, own_columns, pids, process_columns, sample_columns, sample_count, series_arrays,
)
from miles_profile.runmodel.stats import _iterations

_GPU_COLUMN = re.compile(r"^gpu(\d+)_(proc|alloc|reserved|used|boundary_proc)$")
_STATS = ("peak", "floor", "first", "last")


def window_stats(t: np.ndarray, y: np.ndarray, starts, ends, peak: np.ndarray | None = None):
    """For each window, over the rows with start < t <= end (t sorted): the highest of y and `peak`,
    the lowest y, the first and last finite y. NaN where a window has no finite value."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    top = y if peak is None else np.fmax(y, np.asarray(peak, dtype=float))
    i0 = np.searchsorted(t, np.asarray(starts, dtype=float), "right")
    i1 = np.searchsorted(t, np.asarray(ends, dtype=float), "right")
    n = len(i0)
    out = [np.full(n, np.nan) for _ in _STATS]
    empty = i1 <= i0
    if not len(y) or empty.all():
        return tuple(out)
    # reduceat over interleaved [i0, i1) bounds, every other result (reduceat needs no order; an
    # index at len(y) lands on the NaN pad)
    pad_top, pad_y = np.append(top, np.nan), np.append(y, np.nan)
    bounds = np.column_stack([np.minimum(i0, len(y)), np.minimum(i1, len(y))]).ravel()
    out[0] = np.fmax.reduceat(pad_top, bounds)[::2]
    out[1] = np.fmin.reduceat(pad_y, bounds)[::2]
    # first/last finite value: index of the next finite at or after i0, of the last finite before i1
    finite = np.isfinite(y)
    idx = np.arange(len(y))
    next_ok = np.minimum.accumulate(np.where(finite, idx, len(y))[::-1])[::-1]
    prev_ok = np.maximum.accumulate(np.where(finite, idx, -1))
    first_at = np.append(next_ok, len(y))[np.minimum(i0, len(y))]
    last_at = np.where(i1 > 0, prev_ok[np.maximum(i1 - 1, 0)], -1)
    ok_first = ~empty & (first_at < i1)
    ok_last = ~empty & (last_at >= i0)
    out[2][ok_first] = y[first_at[ok_first]]
    out[3][ok_last] = y[last_at[ok_last]]
    for k in (0, 1):
        out[k][empty] = np.nan
    return tuple(out)


def _process_info(run) -> dict[tuple[str, int], dict[str, Any]]:
    """(host, pid) -> rank, role, gpu_uuid, gpu_total, gpu_index, host_total from every meta."""
    totals: dict[str, tuple[float, int]] = {}  # uuid -> (total, index on its host)
    for host in run.hosts:
        for g in host.get("gpus") or []:
            if g.get("uuid"):
                totals[g["uuid"]] = (float(g.get("total") or np.nan), int(g.get("index", -1)))
    for p in run.processes:
        for g in (p.get("devices") or []) + (p.get("cuda_devices") or []):
            uuid = g.get("uuid")
            if uuid and uuid not in totals:
                totals[uuid] = (float(g.get("total") or np.nan), int(g.get("index", -1)))
    info = {}
    alone = _alone_in_a_world_of_one(run)
    for p in run.processes:
        host = str(p.get("host") or run.meta.get("host") or "")
        uuid = p.get("gpu_uuid") or _uuid_from_columns(p, run.devices)
        total, index = totals.get(uuid, (np.nan, -1)) if uuid else (_host_total(p, run, host), -1)
        rank = p.get("rank")
        if p.get("ray_actor_id") and p.get("world_size") in (None, 1):
            # a Ray actor outside any process group is "rank 0" of its own: two of them (a policy and a
            # reference) shared one host lane, their RSS summed (0.84 GiB) beside the report's 0.50 GiB peak
            rank = -1
        if (host, int(p.get("pid", -1))) in alone:
            rank = -1
        info[(host, int(p.get("pid", -1)))] = dict(
            rank=int(rank) if isinstance(rank, int) else -1, role=str(p.get("role") or ""), gpu_uuid=uuid,
            gpu_total=total, gpu_index=index)
    return info


def _alone_in_a_world_of_one(run) -> set[tuple[str, int]]:
    """Processes of a host that each say rank 0 of a world of one with no role of their own (an actor and
    a reference model started by torch.multiprocessing, two programs under one `record --exec`), where
    there are several: none is a rank, so each gets a lane of its own. They shared one, their RSS summed."""
    by_host: dict[str, list[int]] = {}
    for p in run.processes:
        if p.get("role") in (None, "", "in_process") and p.get("world_size") in (None, 1):
            by_host.setdefault(str(p.get("host") or run.meta.get("host") or ""), []).append(int(p.get("pid", -1)))
    return {(host, pid) for host, pids in by_host.items() if len(pids) > 1 for pid in pids}


def _uuid_from_columns(process: dict, devices: list[dict]) -> str:
    """A meta from before `gpu_uuid` (or CUDA initialised after the last boundary): the NVML device
    of the lowest gpu{i}_* column the process wrote, when NVML listed it."""
    index = _gpu_index_of({"gpu_index": -1}, process.get("columns") or [])
    return next((str(d["uuid"]) for d in devices if d.get("index") == index and d.get("uuid")), "")


def _host_total(process: dict, run, host: str) -> float:
    for probe in process.get("probes") or []:
        if probe.get("name") == "host" and isinstance(probe.get("total"), (int, float)):
            return float(probe["total"])
    for meta in run.hosts:
        if str(meta.get("host")) == host:
            for probe in meta.get("probes") or []:
                if isinstance(probe.get("total"), (int, float)):
                    return float(probe["total"])
    hs = run.host_samples
    rows = hs[hs["host"].astype(str) == host]["host_total"] if len(hs) else []
    return float(np.nanmax(rows)) if len(rows) and np.isfinite(rows).any() else np.nan


def _gpu_index_of(info: dict, columns) -> int | None:
    """Which gpu{i}_* columns are the process's own: its GPU's index, else the lowest one it has."""
    found = sorted({int(m.group(1)) for c in columns if (m := _GPU_COLUMN.match(str(c)))})
    if not found:
        return None
    return info["gpu_index"] if info["gpu_index"] in found else found[0]


def _series_name(column: str, index: int | None) -> str | None:
    if column == "rss":
        return "rss"
    m = _GPU_COLUMN.match(column)
    if m and index is not None and int(m.group(1)) == index and m.group(2) != "used":
        return m.group(2)
    return None


def phase_table(run) -> pd.DataFrame:
    """The run's PhaseTable (fleet.py's schema); an empty frame with those columns when no phases."""
    phases = run.phases
    columns = ["host", "gpu_uuid", "gpu_total", "gpu_index", "pid", "rank", "role", "phase", "phase_id",
               "iteration", "t0", "t1", "expected_bytes", "identified"] + \
        [f"{s}_{stat}" for s in ("used", "proc", "alloc", "reserved", "rss") for stat in _STATS]
    if phases.empty:
        return pd.DataFrame(columns=columns)
    phases = phases[phases["status"].astype(str) != "open"] if "status" in phases else phases
    hosts = phases["host"].fillna("").astype(str).to_numpy() if "host" in phases else np.full(len(phases), "")
    table = pd.DataFrame({
        "host": hosts, "pid": phases["pid"].to_numpy(np.int64), "phase": phases["name"].astype(str).to_numpy(),
        "phase_id": phases["id"].to_numpy(np.int64), "t0": phases["start"].to_numpy(float),
        "t1": phases["end"].to_numpy(float),
        "expected_bytes": pd.to_numeric(phases["expected_bytes"], errors="coerce").to_numpy(float)
        if "expected_bytes" in phases else np.nan})
    table["iteration"] = _iterations(phases.assign(pid=(table["host"] + ":" + table["pid"].astype(str)).to_numpy()))
    info = _process_info(run)
    default = dict(rank=-1, role="", gpu_uuid="", gpu_total=np.nan, gpu_index=-1)
    keys = list(zip(hosts.tolist(), table["pid"].tolist()))  # lists: iterating the str column is slow
    found = [info.get(k, default) for k in keys]
    for field in ("rank", "role", "gpu_uuid", "gpu_total", "gpu_index"):
        table[field] = [p[field] for p in found]
    table["identified"] = [k in info for k in keys]  # False: its meta was unreadable (rank, role, GPU unknown)
    for s in ("used", "proc", "alloc", "reserved", "rss"):
        for stat in _STATS:
            table[f"{s}_{stat}"] = np.nan
    _fill_from_summaries(run, table, info)
    _fill_from_samples(run, table, info)
    _fill_used(run, table)
    _fill_proc_from_nvml(run, table)
    _fill_proc_from_boundaries(table)
    return table.reindex(columns=columns).reset_index(drop=True)


def _fill_from_summaries(run, table: pd.DataFrame, info: dict, summaries: pd.DataFrame | None = None) -> None:
    summaries = run.phase_summaries if summaries is None else summaries
    if summaries.empty:
        return
    # series names are few: parse each once, then work on codes (a 1,024-process run has ~600,000 rows)
    names_, code = _sorted_codes(summaries["series"].astype(str))
    parsed = [(m.group(2), int(m.group(1))) if (m := _GPU_COLUMN.match(n)) else
              (("rss", -1) if n == "rss" else (None, -1)) for n in names_]
    kind = np.array([k or "" for k, _ in parsed], dtype=object)[code]
    gpu = np.array([i for _, i in parsed])[code]
    who = pd.MultiIndex.from_arrays([summaries["host"].astype(str), summaries["pid"].astype(np.int64)])
    proc_code, procs = pd.factorize(who)
    # a process's own gpu{i} columns: its GPU's index when it has them, else the lowest it has
    lowest = pd.Series(np.where(gpu >= 0, gpu, 1 << 30)).groupby(proc_code).min().to_numpy()
    preferred = np.array([info.get(p, {}).get("gpu_index", -1) for p in procs], dtype=np.int64)
    has_pref = pd.Series((gpu == preferred[proc_code]) & (gpu >= 0)).groupby(proc_code).any().to_numpy()
    own_index = np.where(has_pref, preferred, lowest)
    keep = (kind == "rss") | (np.isin(kind, ["proc", "alloc", "reserved", "boundary_proc"]) & (gpu == own_index[proc_code]))
    where = pd.MultiIndex.from_arrays([table["host"], table["pid"].astype(np.int64), table["phase_id"].astype(np.int64)])
    position = where.get_indexer(pd.MultiIndex.from_arrays(
        [summaries["host"].astype(str), summaries["pid"].astype(np.int64), summaries["id"].astype(np.int64)]))
    keep &= position >= 0
    for k in ("proc", "alloc", "reserved", "rss", "boundary_proc"):
        rows = keep & (kind == k)
        if not rows.any():
            continue
        for stat in _STATS:
            if f"{k}_{stat}" not in table:
                table[f"{k}_{stat}"] = np.nan
            values = table[f"{k}_{stat}"].to_numpy(dtype=float, copy=True)  # NaN unless filled before
            values[position[rows]] = summaries[stat].to_numpy(dtype=float, na_value=np.nan)[rows]
            table[f"{k}_{stat}"] = values


def _sorted_codes(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) of a str column: the sorted distinct values and each
    value's position among them, with the few distinct values sorted instead of all (np.unique sorted
    600,000 Python strings at 1,024 processes)."""
    first_seen, distinct = pd.factorize(values)
    distinct = np.asarray(distinct, dtype=object)
    order = np.argsort(distinct, kind="stable")
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    return distinct[order], rank[first_seen]


def _loaded_samples(run, pid: int) -> pd.DataFrame | None:
    """A process's samples when the run holds them in memory (the reader read them): the summaries come
    from there instead of a second parse of its file."""
    sample_pids = getattr(run, "sample_pids", None)
    if not sample_count(run) or (sample_pids is not None and pid not in sample_pids) or pid not in pids(run):
        return None
    # only the columns this process wrote: the run's frame holds every process's (gpu3_proc beside
    # gpu5_proc), empty for the others, and a summary has no row for a series without a value anyway
    return process_columns(run, pid, [c for c in own_columns(run, pid) if c != "pid"])


def _fill_from_samples(run, table: pd.DataFrame, info: dict) -> None:
    """Phases without any summary: the same numbers from their process's samples (version-1 logs).
    A run read from disk gets them streamed from its samples files, one pass per file and cached
    (logdir/sample_summaries.py), whether or not its samples were loaded."""
    own = ["proc", "alloc", "reserved", "rss"]
    missing = ~np.isfinite(table[[f"{k}_peak" for k in own]].to_numpy()).any(axis=1)
    if missing.any() and getattr(run, "directories", None):
        who = set(zip(table.loc[missing, "host"].tolist(), table.loc[missing, "pid"].astype(int).tolist()))
        found = summaries_from_samples(run, who, loaded=lambda pid: _loaded_samples(run, pid))
        keys = pd.MultiIndex.from_arrays([found["host"], found["pid"].astype(np.int64), found["id"].astype(np.int64)])
        wanted = pd.MultiIndex.from_arrays([table.loc[missing, "host"], table.loc[missing, "pid"].astype(np.int64),
                                            table.loc[missing, "phase_id"].astype(np.int64)])
        _fill_from_summaries(run, table, info, found[keys.isin(wanted)])
        # what has no samples file (an imported run's samples are only in memory) goes on below
        done = processes_read(run)
        missing &= ~pd.Series(list(zip(table["host"], table["pid"].astype(int)))).isin(done).to_numpy()
    if not missing.any() or not sample_count(run) or not has_column(run, "pid"):
        return
    have = set(pids(run))
    for (host, pid), rows in table[missing].groupby(["host", "pid"], sort=False).groups.items():
        if pid not in have:
            continue
        p_info = info.get((host, pid), {"gpu_index": -1})
        index = _gpu_index_of(p_info, sample_columns(run))
        for kind in own:
            column = "rss" if kind == "rss" else (f"gpu{index}_{kind}" if index is not None else None)
            if column is None or not has_column(run, column):
                continue
            t, y = series_arrays(run, int(pid), column)
            peak = series_arrays(run, int(pid), f"{column}_peak")[1] if has_column(run, f"{column}_peak") else None
            stats = window_stats(t, y, table.loc[rows, "t0"], table.loc[rows, "t1"], peak)
            for stat, values in zip(_STATS, stats):
                table.loc[rows, f"{kind}_{stat}"] = values


def _stats_columns(table: pd.DataFrame, kind: str) -> dict[str, np.ndarray]:
    """kind_* as writable float arrays: filled by position, then put back once (a `.loc` assignment per
    GPU and stat cost 5 of the 9 CPU seconds of a 1,024-process fleet's first screen)."""
    return {stat: table[f"{kind}_{stat}"].to_numpy(dtype=float, copy=True) for stat in _STATS}


def _fill_used(run, table: pd.DataFrame) -> None:
    on_gpu = table["gpu_uuid"].to_numpy() != ""
    if not on_gpu.any():
        return
    used = run.gpu_used if hasattr(run, "gpu_used") else {}
    out, t0, t1 = _stats_columns(table, "used"), table["t0"].to_numpy(float), table["t1"].to_numpy(float)
    positions = np.flatnonzero(on_gpu)
    for (host, uuid), at in table.iloc[positions].groupby(["host", "gpu_uuid"], sort=False).indices.items():
        series = used.get((host, uuid))
        if series is None:
            continue
        rows = positions[at]
        for stat, values in zip(_STATS, window_stats(series[0], series[1], t0[rows], t1[rows])):
            out[stat][rows] = values
    for stat in _STATS:
        table[f"used_{stat}"] = out[stat]


def _fill_proc_from_nvml(run, table: pd.DataFrame) -> None:
    """proc_* of GPU processes whose summaries lack it, from the host sampler's per-process rows."""
    lacking = (table["gpu_uuid"] != "") & table["proc_peak"].isna()
    lacking &= table.groupby(["host", "pid"])["proc_peak"].transform("count").to_numpy() == 0
    if not lacking.any() or not run.hosts:
        return
    out, t0, t1 = _stats_columns(table, "proc"), table["t0"].to_numpy(float), table["t1"].to_numpy(float)
    positions = np.flatnonzero(lacking.to_numpy())
    lacking_rows = table.iloc[positions]
    # host by host: at 64 hosts all the per-process rows together are millions
    for host, on_host in lacking_rows.groupby("host", sort=False).indices.items():
        procs = run.gpu_procs_of([host]) if hasattr(run, "gpu_procs_of") else run.gpu_procs
        if procs.empty:
            continue
        wanted = lacking_rows.iloc[on_host].groupby(["gpu_uuid", "pid"], sort=False).indices
        keys = [procs["gpu_uuid"].astype(str), procs["pid"]]
        for (uuid, pid), series in procs[procs["host"] == host].groupby(keys, sort=False, observed=True):
            at = wanted.get((uuid, int(pid)))
            if at is None:
                continue
            rows = positions[on_host[at]]
            stats = window_stats(series["t"].to_numpy(float), series["bytes"].to_numpy(float), t0[rows], t1[rows])
            for stat, values in zip(_STATS, stats):
                out[stat][rows] = values
    for stat in _STATS:
        table[f"proc_{stat}"] = out[stat]


def _fill_proc_from_boundaries(table: pd.DataFrame) -> None:
    """Merge the process's own NVML reads at its phase boundaries (`gpu{i}_boundary_proc`: a process
    without the host role reads its GPU when a phase closes) into proc_*: the last is the read taken at
    the close where there is one (the host sampler's row every 100 ms can predate the end of a release:
    an offload_train that freed 16.5 GiB read as 8.9 GiB short), the peak and floor the extremes of both,
    the first the host's where it has one. A release shorter than 100 ms has no host row at all, and its
    drop was read as a shortfall of everything it declared (11.65 of 12.04 GiB on
    sample_logs/h200-tms-engine-server, which freed it all)."""
    if "boundary_proc_last" not in table:
        return
    boundary = {stat: table.pop(f"boundary_proc_{stat}").to_numpy(float) for stat in _STATS}
    proc = {stat: table[f"proc_{stat}"].to_numpy(float) for stat in _STATS}
    table["proc_last"] = np.where(np.isfinite(boundary["last"]), boundary["last"], proc["last"])
    table["proc_first"] = np.where(np.isfinite(proc["first"]), proc["first"], boundary["first"])
    table["proc_peak"] = np.fmax(proc["peak"], boundary["peak"])
    table["proc_floor"] = np.fmin(proc["floor"], boundary["floor"])
