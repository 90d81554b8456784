"""STAND-IN, written for the dashboard's fleet panel until the other engineer's `phase_table` lands on
this branch; at merge their version replaces this file. Callers depend only on the PhaseTable contract
(miles_profile/report/fleet.py's docstring), never on anything else here.

    phase_table(run) -> PhaseTable    # one row per (process, phase instance), from the end events'
                                      # summaries, the process metas and the host files' NVML device used

Cost grows with phases (and, for `used`, with host samples: one sorted pass per GPU), never with the
processes' own samples.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from miles_profile.report.stats import _iterations

_GPU_SERIES = re.compile(r"^gpu(\d+)_(used|proc|alloc|reserved)$")


def _int(value, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _process_frame(run) -> pd.DataFrame:
    """host, pid, rank, role, gpu_uuid, cuda index of that GPU (for its gpu{i}_* series), gpu_total."""
    totals = {g.get("uuid"): g.get("total") for h in run.hosts for g in h.get("gpus") or []}
    rows = []
    for p in run.processes:
        uuid = p.get("gpu_uuid") or ""
        index = 0
        for k, d in enumerate(p.get("cuda_devices") or []):
            if d.get("uuid") == uuid:
                index = int(d.get("index", k))
                totals.setdefault(uuid, d.get("total"))
        rows.append(dict(host=str(p.get("host") or ""), pid=_int(p.get("pid")), rank=_int(p.get("rank")),
                         role=str(p.get("role") or ""), gpu_uuid=uuid, cuda_index=index))
    frame = pd.DataFrame(rows, columns=["host", "pid", "rank", "role", "gpu_uuid", "cuda_index"])
    frame["gpu_total"] = pd.to_numeric(frame["gpu_uuid"].map(totals), errors="coerce").astype(float)
    host_total = run.host_samples.groupby("host")["host_total"].max() if len(run.host_samples) else pd.Series()
    cpu = frame["gpu_uuid"] == ""
    frame.loc[cpu, "gpu_total"] = pd.to_numeric(frame.loc[cpu, "host"].map(host_total), errors="coerce")
    return frame


def _wide_summaries(run, procs: pd.DataFrame) -> pd.DataFrame:
    """host, pid, id, then S_peak/floor/first/last for S in the contract's series."""
    s = run.phase_summaries
    if s.empty:
        return pd.DataFrame(columns=["host", "pid", "id"])
    names = pd.Series(s["series"].unique())  # a few names: parse them once, not once per row
    m = names.str.extract(_GPU_SERIES).set_axis(names)
    index = pd.to_numeric(s["series"].map(m[0]), errors="coerce").to_numpy()
    own_index = s[["host", "pid"]].merge(procs[["host", "pid", "cuda_index"]], how="left")["cuda_index"].fillna(0)
    is_rss = (s["series"] == "rss").to_numpy()
    keep = is_rss | (index == own_index.to_numpy())
    series = np.where(is_rss, "rss", s["series"].map(m[1]).to_numpy(dtype=object))
    long = s.loc[keep].assign(series=series[keep])
    wide = long.pivot_table(index=["host", "pid", "id"], columns="series",
                            values=["peak", "floor", "first", "last"], aggfunc="max")
    wide = wide.astype(float)
    wide.columns = [f"{series}_{stat}" for stat, series in wide.columns]
    return wide.reset_index()


def _used_from_host(run, table: pd.DataFrame) -> None:
    """Fill used_peak where the summaries lack it: the highest NVML device used in [t0, t1] of the lane."""
    gpu = run.gpu_samples
    if gpu.empty or not len(table):
        return
    need = table["used_peak"].isna() & (table["gpu_uuid"] != "")
    at = gpu.groupby(["host", "gpu_uuid"], observed=True).indices  # one grouping, not a mask per GPU
    t_all, used_all = gpu["t"].to_numpy(float), gpu["used"].to_numpy(float)
    t0s, t1s = table["t0"].to_numpy(float), table["t1"].to_numpy(float)
    out = table["used_peak"].to_numpy(float, copy=True)
    positions = np.flatnonzero(need.to_numpy())
    for (host, uuid), rows in table.loc[need, ["host", "gpu_uuid"]].groupby(["host", "gpu_uuid"]).indices.items():
        rows = positions[rows]  # positions in `table`
        where = at.get((host, uuid))
        if where is None:
            continue
        order = where[np.argsort(t_all[where], kind="stable")]
        t, used = t_all[order], used_all[order]
        i0 = np.searchsorted(t, t0s[rows], "left")
        i1 = np.searchsorted(t, t1s[rows], "right")
        padded = np.append(used, np.nan)
        flat = np.column_stack((np.minimum(i0, len(t)), np.minimum(i1, len(t)))).ravel()
        peak = np.fmax.reduceat(padded, flat)[::2]
        out[rows] = np.where(i1 > i0, peak, np.nan)
    table["used_peak"] = out


def phase_table(run) -> pd.DataFrame:
    phases = run.phases
    if phases.empty:
        return pd.DataFrame(columns=["host", "gpu_uuid", "pid", "phase", "t0", "t1"])
    procs = _process_frame(run)
    host = phases["host"].fillna("").astype(str) if "host" in phases else pd.Series("", index=phases.index)
    table = pd.DataFrame({
        "host": host.to_numpy(), "pid": phases["pid"].to_numpy(np.int64), "id": phases["id"].to_numpy(np.int64),
        "phase": phases["name"].astype(str).to_numpy(), "phase_id": phases["id"].to_numpy(np.int64),
        "iteration": _iterations(phases.assign(pid=(host + ":" + phases["pid"].astype(str)).to_numpy())),
        "t0": phases["start"].to_numpy(float), "t1": phases["end"].to_numpy(float),
        "expected_bytes": pd.to_numeric(phases.get("expected_bytes", pd.Series(np.nan, index=phases.index)),
                                        errors="coerce").to_numpy(float)})
    table = table.merge(procs.drop(columns="cuda_index"), on=["host", "pid"], how="left")
    table["gpu_uuid"] = table["gpu_uuid"].fillna("")
    table = table.merge(_wide_summaries(run, procs), on=["host", "pid", "id"], how="left").drop(columns="id")
    if "used_peak" not in table:
        table["used_peak"] = np.nan
    _used_from_host(run, table)
    return table
