"""Checks across the fleet: pure functions PhaseTable (see fleet.py) + FleetThresholds -> FleetCheckResult.

A `FleetCheckResult` is a checks.CheckResult (same status, summary, explanation, span, findings) that
also says how many lanes (GPUs, or ranks' host memory) and processes it judged (`judged`) and which
was worst (`worst`: lane, label, host, gpu_uuid, pid where it applies, the number that made it
worst). There is one Finding per lane (or per process) judged, naming its worst phase instance;
`Finding.numbers` holds lane, label, host, gpu_uuid (and pid) so a UI can link to that timeline.

    FleetThresholds(...)
    check_rank_imbalance(table, th) / check_floor_trend_leak(table, th) / check_serialized_peaks_per_gpu(table, th)
    run_fleet_checks(table, thresholds=None) -> list[FleetCheckResult]
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.report import fleet
from miles_profile.report.checks import CheckResult, Finding, gib

GiB = 1024 ** 3
MiB = 1024 ** 2


@dataclass(frozen=True)
class FleetThresholds:
    """Every tolerance of the fleet checks. Shares are fractions; bytes are integers."""

    # rank_imbalance: a lane's peak in one (iteration, phase) fails when it exceeds the median of its
    # peers in that cell by more than this share of the median AND by more than `imbalance_abs_bytes`;
    # a cell is judged only with at least `imbalance_min_peers` lanes in it (with two, neither is the odd one).
    imbalance_share: float = 0.10
    imbalance_abs_bytes: int = 1 * GiB
    imbalance_min_peers: int = 3
    # floor_trend_leak: the rise of the least-squares line through every iteration's floor (slope x
    # (last - first iteration)) fails when above both `floor_trend_abs_bytes` and `floor_trend_share`
    # of the lane's total; the first `floor_trend_skip_iterations` are warm-up; a series needs
    # `floor_trend_min_iterations` iterations after them.
    floor_trend_abs_bytes: int = 256 * MiB
    floor_trend_share: float = 0.02
    floor_trend_skip_iterations: int = 1
    floor_trend_min_iterations: int = 3
    # serialized_peaks_per_gpu: during a footprint phase (train, generate) the lane's processes may
    # hold together, above their own lowest levels, the larger footprint plus this share of the
    # smaller plus `serialized_abs_bytes`.
    serialized_overlap_share: float = 0.5
    serialized_abs_bytes: int = 64 * MiB

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class FleetCheckResult(CheckResult):
    judged: dict[str, int] = field(default_factory=dict)   # {"lanes": n, "processes": m}
    worst: dict[str, Any] | None = None


def _result(name, title, explanation, findings, judged, worst, series, ok, bad) -> FleetCheckResult:
    failed = [f for f in findings if f.status == "fail"]
    counted = ", ".join(f"{v} {k}" for k, v in judged.items() if v)
    where = f"; worst {worst['label']}" + (f" pid {worst['pid']}" if worst.get("pid") is not None else "") + \
        f": {worst['message']}" if worst else ""
    spans = [f.span for f in findings if f.span]
    span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
    if failed:
        summary = f"{len(failed)} of {len(findings)} {bad} (judged {counted}){where}"
        status = "fail"
    else:
        summary = f"{len(findings)} {ok} (judged {counted}){where}"
        status = "pass"
    return FleetCheckResult(name, title, status, summary, explanation, span, findings, series, judged, worst)


def _na(name, title, explanation, why) -> FleetCheckResult:
    return FleetCheckResult(name, title, "n/a", why, explanation, judged={})


def _where(lane_row, **extra) -> dict:
    return dict(lane=lane_row["lane"], label=lane_row["label"], host=lane_row["host"],
                gpu_uuid=lane_row["gpu_uuid"], **extra)


# -- rank imbalance ----------------------------------------------------------------------------
def check_rank_imbalance(table: pd.DataFrame, th: FleetThresholds, matrix: fleet.GpuMatrix | None = None
                         ) -> FleetCheckResult:
    name, title = "rank_imbalance", "No GPU runs higher than its peers"
    explanation = (f"In each (iteration, phase) a GPU's peak may exceed the median of all GPUs in that cell by at "
                   f"most {th.imbalance_share:.0%} of the median or {gib(th.imbalance_abs_bytes)} (it fails only "
                   f"above both); cells with fewer than {th.imbalance_min_peers} GPUs are not judged.")
    df = fleet.normalize(table)
    matrix = matrix if matrix is not None else fleet.gpu_matrix(df)
    values = matrix.bytes
    peers = np.isfinite(values).sum(axis=0)
    judged_cols = peers >= th.imbalance_min_peers
    if not judged_cols.any():
        return _na(name, title, explanation, f"needs at least {th.imbalance_min_peers} lanes with the same phase")
    with np.errstate(all="ignore"):
        median = np.nanmedian(values[:, judged_cols], axis=0)
        excess = values[:, judged_cols] - median
        fails = (excess > th.imbalance_share * median) & (excess > th.imbalance_abs_bytes)
    cols = matrix.columns[judged_cols].reset_index(drop=True)
    findings, worst = [], None
    for r, lane in matrix.lanes.iterrows():
        row = excess[r]
        if not np.isfinite(row).any():
            continue
        # the cell shown: the largest excess among the failing cells, else overall
        c = int(np.nanargmax(np.where(fails[r], row, -np.inf))) if fails[r].any() else int(np.nanargmax(row))
        col = cols.iloc[c]
        status = "fail" if fails[r].any() else "pass"
        message = (f"{lane['label']} (ranks {lane['ranks'] or '?'}): {col['label']} peak {gib(values[r][judged_cols][c])}, "
                   f"median of {int(peers[judged_cols][c])} GPUs {gib(median[c])} ({row[c] / median[c]:+.1%})"
                   + (f"; {int(fails[r].sum())} cells over" if status == "fail" else ""))
        numbers = _where(lane, excess=float(row[c]), median=float(median[c]), cells_over=int(fails[r].sum()),
                         series=lane["source"])
        findings.append(Finding(status, message, (col["t0"], col["t1"]), col["phase"], int(col["iteration"]), numbers))
        if worst is None or row[c] > worst["excess"]:
            worst = dict(numbers, pid=None, excess=float(row[c]), phase=col["phase"], iteration=int(col["iteration"]),
                         message=f"{col['label']} {gib(row[c])} over the median")
    return _result(name, title, explanation, findings, {"lanes": len(findings), "processes": df["pid"].nunique()},
                   worst, " / ".join(sorted(set(matrix.lanes["source"]))), "GPUs within their peers' peaks",
                   "GPUs above their peers")


# -- floor trend leak --------------------------------------------------------------------------
def check_floor_trend_leak(table: pd.DataFrame, th: FleetThresholds) -> FleetCheckResult:
    name, title = "floor_trend_leak", "No floor creeping up across iterations"
    explanation = ("The lowest level of each iteration (per GPU: NVML used; per process: its own memory) is fitted "
                   "by least squares over every iteration after warm-up, not first against last, so one noisy "
                   f"iteration does not decide; the fitted rise over the run (slope x iterations) must stay under "
                   f"{gib(th.floor_trend_abs_bytes)} or {th.floor_trend_share:.0%} of the total, whichever is larger.")
    df = fleet.normalize(table)
    lane_rows = fleet.lanes(df).set_index("lane", drop=False)
    series = [("lane", "used_floor", "GPU (NVML used)"), ("pid", "own_floor", "process")]
    findings, worst, judged = [], None, {"lanes": 0, "processes": 0}
    for key, value, what in series:
        floors = fleet.iteration_floors(df, key, value)
        if floors.empty:
            continue
        fits = fleet.fit_slopes(floors, key, th.floor_trend_skip_iterations)
        fits = fits[(fits["n"] >= th.floor_trend_min_iterations) & fits["slope"].notna()]
        for k, fit in fits.iterrows():
            lane = lane_rows.loc[fit["lane"]]
            total = lane["total"]
            limit = max(th.floor_trend_abs_bytes, th.floor_trend_share * total if np.isfinite(total) else 0.0)
            status = "fail" if fit["rise"] > limit else "pass"
            pid = int(fit["pid"]) if key == "pid" else None
            who = lane["label"] + (f" pid {pid} ({fit['role'] or '?'} rank {fit['rank']})" if pid is not None else "")
            message = (f"{who}: floor rises {gib(fit['slope'])}/iteration, {gib(fit['rise'])} over {int(fit['n'])} "
                       f"iterations (allowed {gib(limit)})")
            numbers = _where(lane, pid=pid, slope=float(fit["slope"]), rise=float(fit["rise"]), limit=float(limit),
                             iterations=int(fit["n"]), series=what)
            findings.append(Finding(status, message, (fit["t0"], fit["t1"]), fit["phase"], int(fit["iteration"]),
                                    numbers))
            judged["lanes" if key == "lane" else "processes"] += 1
            score = fit["rise"] / limit
            if worst is None or score > worst["score"]:
                worst = dict(numbers, score=float(score), phase=fit["phase"], iteration=int(fit["iteration"]),
                             message=f"{gib(fit['rise'])} over the run")
    if not findings:
        return _na(name, title, explanation, f"needs {th.floor_trend_skip_iterations + th.floor_trend_min_iterations} "
                   "iterations with floors")
    return _result(name, title, explanation, findings, judged, worst, "NVML used per GPU; own memory per process",
                   "floors flat", "floors creeping up")


# -- serialized peaks per GPU ------------------------------------------------------------------
_FOOTPRINTS = (names.TRAIN, names.GENERATE)


def check_serialized_peaks_per_gpu(table: pd.DataFrame, th: FleetThresholds) -> FleetCheckResult:
    name, title = "serialized_peaks_per_gpu", "Training and rollout footprints never held together on a GPU"
    explanation = (
        "Per GPU, across all its processes, each measured above the lowest level of any process of its role in "
        "the fleet (what every such process holds anyway: CUDA context, interpreter), or below the level its "
        "offload phases declare it falls to (first minus expected_bytes) where that is lower, so memory a "
        "process never releases is not taken for its context: the training footprint F_train is the median peak of the train phases, the rollout "
        "footprint F_rollout that of the generate phases. During each train or generate phase, its process's peak "
        "plus what every other process of the GPU held then (its phases overlapping in time, or what its last "
        "phase left) must stay under max(F_train, F_rollout) + "
        f"{th.serialized_overlap_share:.0%} of the smaller + {gib(th.serialized_abs_bytes)}.")
    df = fleet.normalize(table)
    df = df[df["own_peak"].notna()]
    lane_rows = fleet.lanes(df).set_index("lane", drop=False) if len(df) else None
    findings, worst, pids = [], None, set()
    skipped = 0
    base = _role_floors(df)
    for lane_id, rows in df.groupby("lane", sort=False):
        finding = _serialized_lane(rows, lane_rows.loc[lane_id], base, th)
        if finding is None:
            skipped += 1
            continue
        findings.append(finding)
        pids |= set(rows["pid"])
        if worst is None or finding.numbers["ratio"] > worst["ratio"]:
            worst = dict(finding.numbers, phase=finding.phase, iteration=finding.iteration,
                         message=f"{gib(finding.numbers['together'])} held together, limit {gib(finding.numbers['limit'])}")
    if not findings:
        return _na(name, title, explanation, "no GPU with both a train and a generate phase in separate processes "
                   "(an in-process engine is judged by serialized_peaks)")
    result = _result(name, title, explanation, findings, {"lanes": len(findings), "processes": len(pids)}, worst,
                     "own memory of each process (proc, else reserved; rss on host lanes)",
                     "GPUs held one footprint at a time", "GPUs held both footprints")
    if skipped:
        result.summary += f"; {skipped} lanes without both footprints in separate processes not judged"
    return result


def _role_floors(df: pd.DataFrame) -> pd.Series:
    """Per process: the lowest own level of any process of its role across the fleet (its own lowest
    where the role is unknown)."""
    low = df["own_floor"].fillna(df["own_peak"])
    own = low.groupby(df["pid"]).min()
    role = df.groupby("pid")["role"].first()
    by_role = low[df["role"] != ""].groupby(df["role"]).min()
    base = pd.Series(np.where(role != "", role.map(by_role), own), index=own.index).fillna(own)
    # what a process's offloads say it should fall to: alone on its role (one GPU), its own lowest level
    # would hide memory it never releases
    offloads = df[df["phase"].str.startswith(names.OFFLOAD_PREFIX) & (df["expected_bytes"] > 0)]
    declared = (offloads["own_first"] - offloads["expected_bytes"]).groupby(offloads["pid"]).min()
    return np.fmax(np.fmin(base, declared.reindex(base.index)), 0.0)


def _serialized_lane(rows: pd.DataFrame, lane, base: pd.Series, th: FleetThresholds) -> Finding | None:
    above = rows["own_peak"] - rows["pid"].map(base)
    foot = {p: above[rows["phase"] == p] for p in _FOOTPRINTS}
    if any(f.empty for f in foot.values()) or rows["pid"].nunique() < 2:
        return None
    owners = {p: set(rows.loc[rows["phase"] == p, "pid"]) for p in _FOOTPRINTS}
    if owners[names.TRAIN] == owners[names.GENERATE] and len(owners[names.TRAIN]) == 1:
        return None  # one process holds both: its own memory already is the sum, judged by serialized_peaks
    f_train, f_rollout = float(foot[names.TRAIN].median()), float(foot[names.GENERATE].median())
    limit = max(f_train, f_rollout) + th.serialized_overlap_share * min(f_train, f_rollout) + th.serialized_abs_bytes
    judged = rows[rows["phase"].isin(_FOOTPRINTS)]
    together = above[judged.index].to_numpy(copy=True)
    for pid, other in rows.groupby("pid"):
        level = fleet.levels_during(other["t0"], other["t1"], other["own_peak"], other["own_last"],
                                    judged["t0"], judged["t1"]) - base[pid]
        together += np.where(judged["pid"].to_numpy() != pid, np.nan_to_num(level), 0.0)
    k = int(np.argmax(together))
    row = judged.iloc[k]
    over = int((together > limit).sum())
    status = "fail" if over else "pass"
    message = (f"{lane['label']}: {row['phase']} #{row['iteration']} (pid {row['pid']}, {row['role'] or '?'}) held "
               f"{gib(together[k])} together above their roles' floors; footprints train {gib(f_train)}, rollout "
               f"{gib(f_rollout)}, limit {gib(limit)}" + (f"; {over} of {len(judged)} phases over" if over else ""))
    numbers = _where(lane, pid=int(row["pid"]), together=float(together[k]), limit=float(limit), train=f_train,
                     rollout=f_rollout, ratio=float(together[k] / limit), phases_over=over, phases=len(judged))
    return Finding(status, message, (row["t0"], row["t1"]), row["phase"], int(row["iteration"]), numbers)


FLEET_CHECKS = (check_rank_imbalance, check_floor_trend_leak, check_serialized_peaks_per_gpu)


def run_fleet_checks(table: pd.DataFrame, thresholds: FleetThresholds | None = None,
                     matrix: fleet.GpuMatrix | None = None) -> list[FleetCheckResult]:
    th = thresholds or FleetThresholds()
    df = fleet.normalize(table)
    return [check_rank_imbalance(df, th, matrix), check_floor_trend_leak(df, th), check_serialized_peaks_per_gpu(df, th)]
