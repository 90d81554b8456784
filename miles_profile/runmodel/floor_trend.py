"""Per-iteration floors of a fleet's GPUs and processes from the PhaseTable (fleet.py), taken only from
series read throughout each iteration, and their robust trends (runmodel/slopes.py; verdicts/trend.py
judges them).

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

from miles_profile.runmodel.slopes import slopes_of

# the share of a key's phase instances (and of each iteration's) that must hold a value of the series
MIN_COVERAGE = 0.9
CANDIDATES = {"pid": {"gpu": ("proc", "reserved", "alloc"), "host": ("rss",)},
              "lane": {"gpu": ("used",), "host": ()}}


def dense_floors(df: pd.DataFrame, key: str) -> pd.DataFrame:
    """One row per (key, iteration >= 0) whose chosen series covers the iteration: the phase instance
    where the lowest value was reached (its link columns), `floor` and `series`. Per key the series is
    the first candidate read in at least MIN_COVERAGE of its phase instances. Vectorized: a 1,024-process
    table is grouped a few times, never looped over."""
    rows = df[df["iteration"] >= 0]
    chosen = pd.Series("", index=rows.index, dtype=object)
    for kind in ("gpu", "host"):
        mine = (rows["lane_kind"] == kind).to_numpy()
        for s in reversed(CANDIDATES[key][kind]):  # the last assignment wins: the first candidate that covers
            covered = rows[f"{s}_floor"].notna().groupby(rows[key]).transform("mean") >= MIN_COVERAGE
            chosen[mine & covered.to_numpy()] = s
    value = np.full(len(rows), np.nan)
    for s in set(chosen) - {""}:
        at = (chosen == s).to_numpy()
        value[at] = rows[f"{s}_floor"].to_numpy()[at]
    rows = rows.assign(floor=value, series=chosen.to_numpy())[chosen.to_numpy() != ""]
    # an iteration counts only where the series has a value in MIN_COVERAGE of its phase instances
    good = rows["floor"].notna().groupby([rows[key], rows["iteration"]]).transform("mean") >= MIN_COVERAGE
    rows = rows[good.to_numpy() & rows["floor"].notna().to_numpy()]
    if rows.empty:
        return rows
    at = rows.groupby([key, "iteration"])["floor"].idxmin()
    return rows.loc[at.to_numpy()].sort_values([key, "iteration"]).reset_index(drop=True)


def groups(floors: pd.DataFrame, key: str, skip: int = 0):
    """Per key of dense_floors' output: (positions of its rows after the first `skip`, iterations,
    floors) as numpy arrays; rows in (key, iteration) order."""
    if floors.empty:
        return
    keys = floors[key].to_numpy()
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    x, y = floors["iteration"].to_numpy(dtype=float), floors["floor"].to_numpy(dtype=float)
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(keys)]):
        if b - a > skip:
            at = np.arange(a + skip, b)
            yield at, x[at], y[at]


def floor_trends(df: pd.DataFrame, key: str, skip: int = 0) -> pd.DataFrame:
    """Per key, the Theil-Sen slope of its dense floors after the first `skip` iterations: `slope`,
    `slope_low`, `slope_high` (bytes/iteration, 95 % interval), `n`, `rise` (slope x the iterations
    spanned), `series`; the row is the floor's phase instance in the last iteration (a link target).
    Keys with the same iterations (usually all of them) are fitted together in one numpy pass."""
    floors = dense_floors(df, key)
    parts = [p for p in groups(floors, key, skip) if len(p[0]) >= 2]
    fits = slopes_of([(x, y) for _, x, y in parts])
    values = np.array([(f.slope, f.low, f.high, f.n, f.slope * f.span, y[0]) for f, (_, _, y) in zip(fits, parts)],
                      dtype=float).reshape(-1, 6)
    out = floors.iloc[[at[-1] for at, _, _ in parts]].reset_index(drop=True)
    names = ["slope", "slope_low", "slope_high", "n", "rise", "first_floor"]
    return out.assign(**{n: values[:, k] for k, n in enumerate(names)})
