"""floor_trend_leak: the leak rule of verdicts/trend.py per GPU and per process of a fleet: the floor of
each iteration, a Theil-Sen trend with its interval, against a share of the lane's total. A pure function of
the PhaseTable (runmodel/fleet.py).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.runmodel import fleet, floor_trend
from miles_profile.runmodel.slopes import slopes_of
from miles_profile.verdicts.fleet_types import (
    MiB,
    FleetCheckResult,
    FleetThresholds,
    fleet_na,
    fleet_result,
    lane_where,
)
from miles_profile.verdicts.resolution import resolution_of
from miles_profile.verdicts.trend import judge_floors, step_cause_of
from miles_profile.verdicts.types import JUDGED, TOO_SMALL, Finding, gib
from miles_profile.words import role_text


def check_floor_trend_leak(table: pd.DataFrame, th: FleetThresholds) -> FleetCheckResult:
    name, title = "floor_trend_leak", "No floor creeping up across iterations"
    explanation = ("The lowest level of each iteration (per GPU: NVML used; per process: its own memory), taken only "
                   "from a series read in nearly every phase of the iteration, is judged by the leak rule: a "
                   f"Theil-Sen trend over at least {th.floor_trend_min_iterations} iterations after warm-up fails "
                   "only when the lower bound of its 95% interval, over the iterations judged, exceeds "
                   f"{gib(th.floor_trend_abs_bytes)}, {th.floor_trend_share:.0%} of the total or "
                   f"{th.floor_trend_resolution_multiple:g}x the series' resolution, whichever is largest; a "
                   "one-time step is reported, not failed.")
    df = fleet.normalize(table)
    lane_rows = {r["lane"]: r for r in fleet.lanes(df).to_dict("records")}
    findings, worst, judged = [], None, {"lanes": 0, "processes": 0}
    # a host step in a fleet without offloads blames no offload round trip (issue 30, class 8)
    offloads = "phase" in df and bool(df["phase"].astype(str).str.startswith("offload").any())
    for key in ("lane", "pid"):
        floors = floor_trend.dense_floors(df, key)
        parts = list(floor_trend.groups(floors, key, th.floor_trend_skip_iterations))
        ends = [p[0][0] for p in parts] + [p[0][-1] for p in parts]  # only these rows become dicts
        columns = ["lane", "pid", "role", "rank", "phase", "iteration", "t0", "t1", "series"]
        rows = dict(zip(ends, floors[columns].iloc[ends].to_dict("records")))
        fits = slopes_of([(x, y) for _, x, y in parts])  # one numpy pass for all, not one call each
        for (at, x, y), fit in zip(parts, fits):
            finding = _floor_finding(rows[at[0]], rows[at[-1]], x, y, fit, key, lane_rows, th, offloads)
            findings.append(finding)
            if finding.status == "n/a":
                continue
            judged["lanes" if key == "lane" else "processes"] += 1
            score = finding.numbers["growth_low"] / finding.numbers["allowed"]
            if worst is None or score > worst["score"]:
                worst = dict(finding.numbers, score=float(score), phase=finding.phase, iteration=finding.iteration,
                             message=_measured(finding.numbers))
    if not any(f.status in (*JUDGED, TOO_SMALL) for f in findings):
        why = findings[0].message if findings else "no GPU or process has a floor read throughout its iterations"
        return fleet_na(name, title, explanation, why)
    result = fleet_result(name, title, explanation, findings, judged, worst,
                     "NVML used per GPU; own memory per process (series read throughout each iteration)",
                     "floors without sustained growth", "floors growing steadily")
    if not any(f.status in JUDGED for f in findings):
        result.status = TOO_SMALL
    steps = [f for f in findings if f.cause == "one_time_step"]
    if steps:
        result.summary += f"; {len(steps)} one-time steps (not leaks), first: {steps[0].message}"
    return result


def _measured(n: dict) -> str:
    return (f"floor {n['slope'] / MiB:+.1f} MiB/iteration (95% interval {n['slope_low'] / MiB:+.1f} to "
            f"{n['slope_high'] / MiB:+.1f}), {gib(n['growth'])} over {n['iterations']} iterations, "
            f"allowed {gib(n['allowed'])}")


def _floor_finding(first: dict, last: dict, x: np.ndarray, y: np.ndarray, fit, key: str, lane_rows: dict,
                   th: FleetThresholds, offloads: bool = True) -> Finding:
    """One lane's or process's floors after warm-up (the rows of its first and last, the iterations, the
    bytes) judged by verdicts/trend.py."""
    lane = lane_rows[last["lane"]]
    series = str(last["series"])
    res = resolution_of(series)
    total = lane["total"]
    allowed = max(th.floor_trend_abs_bytes, th.floor_trend_share * total if np.isfinite(total) else 0.0,
                  th.floor_trend_resolution_multiple * res)
    kind = "host" if series == "rss" else ("alloc" if series == "alloc" else "device")
    judged = judge_floors(x, y, resolution=res, allowed=allowed,
                          min_iterations=th.floor_trend_min_iterations, step_cause=step_cause_of(kind, offloads), fit=fit)
    pid = int(last["pid"]) if key == "pid" else None
    rank = f" rank {last['rank']}" if int(last["rank"]) >= 0 else ""  # -1: outside any process group
    who = lane["label"] + (f" pid {pid} ({role_text(last['role'])}{rank})" if pid is not None else "")
    what = "NVML used" if series == "used" else f"own memory ({series})"
    status = TOO_SMALL if judged.status == "too small to judge" else judged.status
    numbers = lane_where(lane, pid=pid, **judged.numbers, series=what, limit=float(allowed))
    if "growth" in numbers:
        numbers["rise"] = numbers["growth"]
    return Finding(status, f"{who}: {judged.text}", (float(first["t0"]), float(last["t1"])),
                   str(last["phase"]), int(last["iteration"]), numbers, cause=judged.cause, series=what,
                   resolution=res)
