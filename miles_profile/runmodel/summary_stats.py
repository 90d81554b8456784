"""Per-phase statistics from the phase summaries alone (`Run.phase_summaries`), never the samples:
their cost grows with the number of phases, not samples. Pure functions over DataFrames.

    summary_instances(phases, summaries) -> DataFrame
        one row per (phase instance, series): host, pid, id, name, iteration, start, end, series,
        peak, floor, first, last, rows
    summary_table(phases, summaries, by_iteration=False) -> DataFrame
        per phase name (or iteration and name) and series: count, peak (highest true peak), floor
        (lowest level), first (the earliest instance's first value), last (the latest's last value)

The iteration of a phase is as in stats.py: its `rollout_id` (carried forward), else the number of starts
of its process's most frequent top-level phase name up to it.
"""
from __future__ import annotations

import pandas as pd

from miles_profile.runmodel.stats import _iterations

_KEY = ["host", "pid", "id"]
_VALUES = ["peak", "floor", "first", "last"]


def summary_instances(phases: pd.DataFrame, summaries: pd.DataFrame) -> pd.DataFrame:
    columns = [*_KEY, "name", "iteration", "start", "end", "series", *_VALUES, "rows"]
    if phases.empty or summaries.empty:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame({
        "host": phases["host"].fillna("").astype(str).to_numpy() if "host" in phases else "",
        "pid": phases["pid"].to_numpy(), "id": phases["id"].to_numpy(), "name": phases["name"].astype(str).to_numpy(),
        "start": phases["start"].to_numpy(float), "end": phases["end"].to_numpy(float)})
    # Iterations without rollout_id count per process, and a pid may repeat on another host.
    table["iteration"] = _iterations(phases.assign(pid=(table["host"] + ":" + table["pid"].astype(str)).to_numpy()))
    right = summaries.drop(columns=["name"]).assign(host=summaries["host"].astype(str))
    out = table.merge(right, on=_KEY, how="inner")
    return out.sort_values(["start", "series"], kind="stable").reset_index(drop=True)[columns]

def summary_table(phases: pd.DataFrame, summaries: pd.DataFrame, by_iteration: bool = False) -> pd.DataFrame:
    keys = (["iteration"] if by_iteration else []) + ["name", "series"]
    instances = summary_instances(phases, summaries)
    if instances.empty:
        return pd.DataFrame(columns=[*keys, "count", *_VALUES])
    grouped = instances.groupby(keys, sort=False)  # instances are in start order: first/last by time
    table = grouped.agg(count=("rows", "size"), peak=("peak", "max"), floor=("floor", "min"))
    table["first"] = grouped["first"].agg(lambda s: s.dropna().iloc[0] if s.notna().any() else pd.NA)
    table["last"] = grouped["last"].agg(lambda s: s.dropna().iloc[-1] if s.notna().any() else pd.NA)
    for column in _VALUES:
        table[column] = table[column].astype("Int64")
    return table.reset_index()
