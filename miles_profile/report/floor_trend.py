"""Per-iteration floors of a fleet's GPUs and processes from the PhaseTable (fleet.py), taken only from
series read throughout each iteration, and their robust trends (verdicts/trend.py).

A series is read throughout when nearly every phase instance has a value for it (`MIN_COVERAGE`):
the allocator and RSS are sampled in the process at every boundary and between; NVML per process
comes from the host sampler every 100 ms and misses phases shorter than that. On the H200
engine-server run (sample_logs/h200/9-dist-engine-server) the engine's NVML readings fell in 1 or 2
of its 24 phases an iteration, at the ends of its generate phases: a "floor" of those readings moved
by 12 GiB between iterations while the allocator's (read in all 24) stayed flat.

    dense_floors(table, key) -> DataFrame      # key "pid" (own memory) or "lane" (NVML used)
    floor_trends(table, key, skip) -> DataFrame   # one row per key: Theil-Sen slope and interval
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.verdicts.trend import robust_slope

# the share of a key's phase instances (and of each iteration's) that must hold a value of the series
MIN_COVERAGE = 0.9
CANDIDATES = {"pid": {"gpu": ("proc", "reserved", "alloc"), "host": ("rss",)},
              "lane": {"gpu": ("used",), "host": ()}}


def _coverage(rows: pd.DataFrame, series: str) -> float:
    return float(rows[f"{series}_floor"].notna().mean()) if len(rows) else 0.0


def _chosen_series(rows: pd.DataFrame, key: str) -> str | None:
    """The first candidate series read in at least MIN_COVERAGE of the key's phase instances."""
    kind = str(rows["lane_kind"].iloc[0])
    return next((s for s in CANDIDATES[key][kind] if _coverage(rows, s) >= MIN_COVERAGE), None)


def dense_floors(df: pd.DataFrame, key: str) -> pd.DataFrame:
    """One row per (key, iteration >= 0) whose chosen series covers the iteration: the phase instance
    where the lowest value was reached (its link columns), `floor` and `series`."""
    rows = df[df["iteration"] >= 0]
    out = []
    for _, mine in rows.groupby(key, sort=False):
        series = _chosen_series(mine, key)
        if series is None:
            continue
        column = f"{series}_floor"
        covered = mine[column].notna().groupby(mine["iteration"]).mean() >= MIN_COVERAGE
        good = mine[mine["iteration"].isin(covered[covered].index) & mine[column].notna()]
        if good.empty:
            continue
        at = good.groupby("iteration")[column].idxmin()
        out.append(good.loc[at.to_numpy()].assign(floor=lambda f: f[column], series=series))
    if not out:
        return rows.iloc[:0].assign(floor=pd.Series(dtype=float), series=pd.Series(dtype=object))
    return pd.concat(out).sort_values([key, "iteration"]).reset_index(drop=True)


def floor_trends(df: pd.DataFrame, key: str, skip: int = 0) -> pd.DataFrame:
    """Per key, the Theil-Sen slope of its dense floors after the first `skip` iterations: `slope`,
    `slope_low`, `slope_high` (bytes/iteration, 95 % interval), `n`, `rise` (slope x the iterations
    spanned), `series`; the row is the floor's phase instance in the last iteration (a link target)."""
    floors = dense_floors(df, key)
    rows = []
    for _, f in floors.groupby(key, sort=False):
        f = f.iloc[skip:]
        fit = robust_slope(f["iteration"], f["floor"]) if len(f) >= 2 else None
        if fit is None:
            continue
        rows.append(dict(f.iloc[-1].to_dict(), slope=fit.slope, slope_low=fit.low, slope_high=fit.high, n=fit.n,
                         rise=fit.slope * fit.span, first_floor=float(f["floor"].iloc[0]),
                         iterations=f["iteration"].tolist(), floors=f["floor"].tolist()))
    columns = list(floors.columns) + ["slope", "slope_low", "slope_high", "n", "rise", "first_floor",
                                      "iterations", "floors"]
    return pd.DataFrame(rows, columns=columns)
