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

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.names import instance_label
from miles_profile.runmodel import fleet, floor_trend
from miles_profile.runmodel.fleet_identity import unidentified
from miles_profile.words import role_text
from miles_profile.verdicts.common import size
from miles_profile.verdicts.resolution import resolution_of
from miles_profile.runmodel.slopes import slopes_of
from miles_profile.verdicts.trend import judge_floors, step_cause_of
from miles_profile.verdicts.types import JUDGED, TOO_SMALL, WARN, CheckResult, Finding, gib

GiB = 1024 ** 3
MiB = 1024 ** 2


@dataclass(frozen=True)
class FleetThresholds:
    """Every tolerance of the fleet checks. Shares are fractions; bytes are integers."""

    # rank_imbalance: a lane's peak in one (iteration, phase) fails when it exceeds the median of its
    # peers in that cell by more than the largest of: `imbalance_spread_z` x their spread (the median
    # absolute deviation scaled to a standard deviation: 3.5 is Iglewicz and Hoaglin's outlier cut for
    # the modified z-score), `imbalance_share` of the median, and `imbalance_resolution_multiple` x the
    # series' resolution (below that it is too small to judge). A cell is judged only with at least
    # `imbalance_min_peers` lanes in it (with two, neither is the odd one).
    imbalance_spread_z: float = 3.5
    imbalance_share: float = 0.10
    imbalance_resolution_multiple: float = 2.0
    imbalance_min_peers: int = 3
    # ... and an outlier fails only when it matters and recurs: its excess is above
    # `imbalance_total_share` of the lane's total (the GPU's memory, or the host's) in at least
    # `imbalance_min_iterations` iterations. An outlier that differs once, or by little against the
    # total in several iterations, is a warning; once and by little, a pass (a process hosting the
    # sampler, a one-time buffer). Peers' spread counts their variation over the iterations of a phase too.
    imbalance_total_share: float = 0.02
    imbalance_min_iterations: int = 2
    # floor_trend_leak: the leak rule of verdicts/trend.py per GPU and per process: the lower bound of
    # the Theil-Sen slope's 95 % interval times the iterations judged fails when above the largest of
    # `floor_trend_abs_bytes`, `floor_trend_share` of the lane's total and
    # `floor_trend_resolution_multiple` x the series' resolution; the first
    # `floor_trend_skip_iterations` are warm-up; a series needs `floor_trend_min_iterations` floors
    # after them (fewer give an interval wider than the floors' spread).
    floor_trend_abs_bytes: int = 256 * MiB
    floor_trend_share: float = 0.02
    floor_trend_resolution_multiple: float = 2.0
    floor_trend_skip_iterations: int = 1
    floor_trend_min_iterations: int = 5
    # serialized_peaks_per_gpu: during a footprint phase (train, generate) the lane's processes may
    # hold together, above their own lowest levels, the larger footprint plus this share of the
    # smaller plus `serialized_abs_bytes`.
    serialized_overlap_share: float = 0.5
    serialized_abs_bytes: int = 64 * MiB
    # a failing phase is blamed on both footprints only when what it held above its own footprint is
    # within this share of the other footprint (as serialized_peaks: 1 - offload_min_drop_share); else
    # it is a residual.
    serialized_match_share: float = 0.2

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class FleetCheckResult(CheckResult):
    judged: dict[str, int] = field(default_factory=dict)   # {"lanes": n, "processes": m}
    worst: dict[str, Any] | None = None


def _count(n: int, words: str) -> str:
    """"1 lane", "2 lanes", "1 GPU held ...": the first word of `words` (a plural) agrees with n."""
    first, _, rest = words.partition(" ")
    if n == 1:
        first = "process" if first == "processes" else first[:-1] if first.endswith("s") else first
    return f"{n} {first}" + (f" {rest}" if rest else "")


def _result(name, title, explanation, findings, judged, worst, series, ok, bad) -> FleetCheckResult:
    failed = [f for f in findings if f.status == "fail"]
    counted = ", ".join(_count(v, k) for k, v in judged.items() if v)
    where = f"; worst {worst['label']}" + (f" pid {worst['pid']}" if worst.get("pid") is not None else "") + \
        f": {worst['message']}" if worst else ""
    spans = [f.span for f in findings if f.span]
    span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
    warned = [f for f in findings if f.status == WARN]
    if failed:
        summary = f"{len(failed)} of {len(findings)} {bad} (judged {counted}){where}"
        status = "fail"
    elif warned:
        summary = f"{len(warned)} of {len(findings)} unsure (judged {counted}); first: {warned[0].message}"
        status = WARN
    else:
        summary = f"{_count(len(findings), ok)} (judged {counted}){where}"
        status = "pass"
    return FleetCheckResult(name, title, status, summary, explanation, span, findings, series, judged=judged,
                            worst=worst)


def _na(name, title, explanation, why) -> FleetCheckResult:
    return FleetCheckResult(name, title, "n/a", why, explanation, judged={})


def _where(lane_row, **extra) -> dict:
    return dict(lane=lane_row["lane"], label=lane_row["label"], host=lane_row["host"],
                gpu_uuid=lane_row["gpu_uuid"], **extra)


# -- rank imbalance ----------------------------------------------------------------------------
def check_rank_imbalance(table: pd.DataFrame, th: FleetThresholds, matrix: fleet.GpuMatrix | None = None
                         ) -> FleetCheckResult:
    name, title = "rank_imbalance", "No GPU or rank runs higher than its peers"
    explanation = (f"In each (iteration, phase) a lane's peak (a GPU, or a rank's host memory) may exceed the median "
                   f"of all lanes in that cell by at most the largest of {th.imbalance_spread_z:g} x the peers' "
                   f"spread (median absolute deviation, scaled), {th.imbalance_share:.0%} of the median and "
                   f"{th.imbalance_resolution_multiple:g} x the series' resolution (an excess above the first two "
                   f"but below that is too small to judge); each process's own peak likewise against the processes "
                   f"of its role. Cells with fewer than {th.imbalance_min_peers} peers are not judged.")
    df = fleet.normalize(table)
    # a process whose meta was unreadable has no rank: it is nobody's peer, and the rank it belonged to
    # lacks it; both are left out (and said) so the readable ranks are still compared
    df, unknown, incomplete = unidentified(df)
    if unknown:
        matrix = fleet.gpu_matrix(df[~df["lane"].isin(incomplete)])
    matrix = matrix if matrix is not None else fleet.gpu_matrix(df)
    lanes = matrix.lanes.assign(resolution=_lane_resolutions(df, matrix.lanes)).to_dict("records")
    findings, worst = _imbalance(matrix.bytes, matrix.columns, lanes, th, _lanes_word(matrix.lanes))
    judged = {"lanes": len(findings), "processes": 0}
    for who, values, columns in _process_matrices(df, fleet.lanes(df) if unknown else matrix.lanes):
        more, candidate = _imbalance(values, columns, who, th, f"{who[0]['role'] or 'unknown-role'} processes")
        findings += more
        judged["processes"] += len(more)
        if candidate is not None and (worst is None or candidate["excess"] > worst["excess"]):
            worst = candidate
    left_out = _left_out(unknown, incomplete, df)
    if not findings:
        return _na(name, title, explanation,
                   f"needs at least {th.imbalance_min_peers} lanes with the same phase" + left_out)
    result = _result(name, title, explanation, findings, judged, worst,
                     " / ".join(sorted(set(matrix.lanes["source"]))) + "; own memory per process",
                     f"{_lanes_word(matrix.lanes)} and processes within their peers' peaks", "above their peers")
    result = _with_small(result, findings)
    result.summary += left_out
    return result


def _left_out(unknown: list[int], incomplete: list[str], df: pd.DataFrame) -> str:
    """The summary's words for processes without a readable meta and the lanes that may lack them."""
    if not unknown:
        return ""
    pids = ", ".join(map(str, unknown[:4])) + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
    text = f"; left out: {_count(len(unknown), 'processes')} without a readable meta (pid {pids}: rank unknown)"
    if incomplete:
        labels = fleet.lanes(df[df["lane"].isin(incomplete)])["label"].tolist()
        text += f" and the {_count(len(labels), 'lanes')} that may lack them ({', '.join(labels[:4])})"
    return text


def _lanes_word(lanes: pd.DataFrame) -> str:
    """What a fleet's lanes are, for messages: GPUs, or ranks' host memory on a run without GPUs."""
    kinds = set(lanes["kind"]) if "kind" in lanes else {"gpu"}
    return "GPUs" if kinds == {"gpu"} else ("ranks' host memory" if kinds == {"host"} else "lanes")


def _lane_resolutions(df: pd.DataFrame, lanes: pd.DataFrame) -> list[float]:
    """Per lane, what its values resolve: NVML used, else the coarsest own series of its processes."""
    own = df.groupby("lane")["own_series"].agg(lambda s: sorted(set(s) - {""}))
    return [resolution_of("used") if source == fleet.SOURCE_USED else resolution_of(own.get(lane) or ["rss"])
            for lane, source in zip(lanes["lane"], lanes["source"])]


def _with_small(result: FleetCheckResult, findings: list[Finding]) -> FleetCheckResult:
    """_result knows pass and fail: a fleet check whose judged findings are all too small says so."""
    resolutions = [f.resolution for f in findings if f.resolution is not None]
    result.resolution = max(resolutions) if resolutions else None
    small = [f for f in findings if f.status == TOO_SMALL]
    if result.status == "pass" and small and not any(f.status == "pass" for f in findings):
        result.status = TOO_SMALL
    if small and result.status != TOO_SMALL:
        result.summary += f"; {len(small)} too small to judge"
    return result


def _process_matrices(df: pd.DataFrame, lanes: pd.DataFrame):
    """Per role: (one dict per process, its own peak per (iteration, phase) cell, the cells)."""
    labels = dict(zip(lanes["lane"], lanes["label"]))
    totals = dict(zip(lanes["lane"], lanes["total"])) if "total" in lanes else {}
    rows = df[df["own_peak"].notna()]
    if rows.empty:
        return
    col, n_cols = fleet.cell_codes(rows)
    columns = fleet.cell_columns(rows, col, n_cols)
    for role, part in rows.assign(_col=col).groupby("role", sort=True):
        row, pids = pd.factorize(part["pid"])
        values = np.full((len(pids), n_cols), np.nan)
        np.fmax.at(values, (row, part["_col"].to_numpy()), part["own_peak"].to_numpy())
        first = part.drop_duplicates("pid").set_index("pid").loc[pids]
        who = [dict(lane=r.lane, label=labels.get(r.lane, r.lane), host=r.host, gpu_uuid=r.gpu_uuid, pid=int(p),
                    rank=int(r.rank), role=role, ranks=str(r.rank), source=f"own memory ({r.own_series})",
                    resolution=resolution_of(r.own_series or "rss"), total=totals.get(r.lane, np.nan))
               for p, r in zip(pids, first.itertuples())]
        used = np.isfinite(values).any(axis=0)
        yield who, values[:, used], columns[used].reset_index(drop=True)


def _imbalance(values: np.ndarray, columns: pd.DataFrame, who: list[dict], th: FleetThresholds, peers_name: str):
    """One Finding per row of `values` (rows: lanes or processes, columns: cells) against the column medians
    and spreads; each row's `resolution` (bytes) sets the floor below which an excess is too small."""
    peers = np.isfinite(values).sum(axis=0)
    judged_cols = peers >= th.imbalance_min_peers
    if not judged_cols.any():
        return [], None
    values, peers = values[:, judged_cols], peers[judged_cols]
    cols = columns[judged_cols].reset_index(drop=True)
    with np.errstate(all="ignore"):
        median = np.nanmedian(values, axis=0)
        spread = np.fmax(_spread(values, median), _spread_over_iterations(values, median, cols))
        excess = values - median
        outlier = excess > np.fmax(th.imbalance_spread_z * spread, th.imbalance_share * median)
        floor = th.imbalance_resolution_multiple * np.array([w["resolution"] for w in who], dtype=float)[:, None]
        fails = outlier & (excess > floor)
        small = outlier & ~fails
        totals = np.array([w.get("total", np.nan) for w in who], dtype=float)
        matters_floor = np.where(np.isfinite(totals) & (totals > 0), th.imbalance_total_share * totals, 0.0)[:, None]
        matters = fails & (excess > matters_floor)
    iterations = cols["iteration"].to_numpy()
    findings, worst = [], None
    for r, w in enumerate(who):
        row = excess[r]
        if not np.isfinite(row).any():
            continue
        # the cell shown: the largest excess among the failing cells, else among the too small, else overall
        shown = matters[r] if matters[r].any() else (fails[r] if fails[r].any() else small[r])
        c = int(np.nanargmax(np.where(shown, row, -np.inf))) if shown.any() else int(np.nanargmax(row))
        recur = (len(set(iterations[matters[r]])), len(set(iterations[fails[r]])))
        finding = _imbalance_finding(w, cols.iloc[c], values[r, c], median[c], spread[c], int(peers[c]),
                                     int(fails[r].sum()), bool(small[r].any()), floor[r, 0], peers_name,
                                     recur, float(matters_floor[r, 0]), th.imbalance_min_iterations)
        same = (cols["phase"] == cols.iloc[c]["phase"]).to_numpy()  # the shown phase's cells, over iterations
        if finding.status == "fail" and _grows(row[same], iterations[same], fails[r][same]):
            finding = replace(finding, status=WARN, cause="sustained_growth",
                              message=finding.message.replace("an outlier among its peers", "") +
                              "its excess grows with the iterations: a leak of this process, "
                              "judged by leak and floor_trend_leak, not an imbalance")
        findings.append(finding)
        if worst is None or row[c] > worst["excess"]:
            worst = dict(finding.numbers, phase=finding.phase, iteration=finding.iteration,
                         message=f"{cols.iloc[c]['label']} {gib(row[c])} over the median of {peers_name}")
    return findings, worst


def _grows(excess: np.ndarray, iterations: np.ndarray, over: np.ndarray) -> bool:
    """The excess rises with the iterations (rank correlation above 0.8) from a first iteration where it
    was under a third of its highest: the process's floor climbs, a leak for the leak checks to name (a
    cleanup at the end of the run may drop it again)."""
    ok = np.isfinite(excess) & (iterations >= 0)
    if ok.sum() < 4 or not over.any():
        return False
    order = np.argsort(iterations[ok], kind="stable")
    it, ex = iterations[ok][order], excess[ok][order]
    first, last = ex[it == it.min()].max(), ex.max()
    if not last > 3 * max(first, 0.0):
        return False
    upto = int(np.argmax(ex)) + 1  # up to its highest: a cleanup at the end does not hide the climb
    it, ex = it[:upto], ex[:upto]
    if len(it) < 4:
        return False
    # Spearman's rank correlation in numpy (the GPU machine has no scipy; ties get their order's rank)
    ranks = [np.argsort(np.argsort(v, kind="stable"), kind="stable").astype(float) for v in (it, ex)]
    if ranks[1].std() == 0 or ranks[0].std() == 0:
        return False
    rho = float(np.corrcoef(ranks[0], ranks[1])[0, 1])
    return bool(np.isfinite(rho) and rho > 0.8)


def _spread_over_iterations(values: np.ndarray, median: np.ndarray, cols: pd.DataFrame) -> np.ndarray:
    """Per cell, how much the peers' own peaks of that phase move over its iterations: the median over
    peers of each one's median absolute deviation across the phase's cells (scaled), so a phase whose
    peaks move by 0.1 GiB between iterations does not call a 0.1 GiB difference an outlier."""
    out = np.zeros(values.shape[1])
    for _, idx in cols.groupby("phase", sort=False).indices.items():
        if len(idx) < 3:
            continue
        part = values[:, idx]
        part = part[np.isfinite(part).any(axis=1)]  # a peer never read in this phase has no spread of its own
        if not len(part):
            continue
        own = np.nanmedian(part, axis=1, keepdims=True)
        mad = 1.4826 * np.nanmedian(np.abs(part - own), axis=1)
        if np.isfinite(mad).any():
            out[idx] = np.nanmedian(mad)
    return out


def _spread(values: np.ndarray, median: np.ndarray) -> np.ndarray:
    """Per cell, the peers' median absolute deviation scaled to a standard deviation (x 1.4826, as
    scipy.stats.median_abs_deviation(scale="normal")): one outlier cannot widen it, as it would a std."""
    return 1.4826 * np.nanmedian(np.abs(values - median), axis=0)


def _imbalance_finding(w: dict, col, value: float, median: float, spread: float, peers: int, cells_over: int,
                       small: bool, floor: float, peers_name: str, recur: tuple[int, int] = (0, 0),
                       matters_floor: float = 0.0, min_iterations: int = 2) -> Finding:
    excess = value - median
    name = w["label"] + (f" pid {w['pid']}" if "pid" in w else "") + f" (ranks {w['ranks'] or '?'})"
    mattering, over = recur  # iterations over the total's share, and iterations over the peers at all
    status = "fail" if cells_over else (TOO_SMALL if small else "pass")
    if status == "fail":  # an outlier: it fails only where it matters against the total and recurs
        status = "fail" if mattering >= min_iterations else (WARN if mattering or over >= min_iterations else "pass")
    message = (f"{name}: {col['label']} peak {gib(value)}, median of {peers} {peers_name} {gib(median)} "
               f"({excess / median:+.1%}, peers' spread ±{size(spread)})")
    if status == "fail":
        message += (f"; over its peers by more than {gib(matters_floor)} of the total in {mattering} iterations: "
                    f"an outlier among its peers")
    elif status == WARN:
        message += ("; over its peers in one iteration only" if over < min_iterations else
                    f"; over its peers in {over} iterations, but by less than {gib(matters_floor)} of the total")
        message += ": unsure, not an imbalance yet"
    elif cells_over:
        message += f"; over its peers once, by less than {gib(matters_floor)} of the total: not an imbalance"
    elif status == TOO_SMALL:
        message = (f"{name}: too small to judge ({col['label']}: {gib(excess)} above the median of {peers} "
                   f"{peers_name}, below {gib(floor)}, twice the resolution {gib(w['resolution'])} of {w['source']})")
    numbers = _where(w, pid=w.get("pid"), excess=float(excess), median=float(median), spread=float(spread),
                     cells_over=cells_over, series=w["source"], iterations_over=over,
                     iterations_mattering=mattering, matters_above=matters_floor)
    cause = {"fail": "rank_outlier", WARN: "differs_once"}.get(status)
    return Finding(status, message, (col["t0"], col["t1"]), col["phase"], int(col["iteration"]), numbers,
                   cause=cause, series=w["source"],
                   resolution=float(w["resolution"]))


# -- floor trend leak --------------------------------------------------------------------------
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
        return _na(name, title, explanation, why)
    result = _result(name, title, explanation, findings, judged, worst,
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
    numbers = _where(lane, pid=pid, **judged.numbers, series=what, limit=float(allowed))
    if "growth" in numbers:
        numbers["rise"] = numbers["growth"]
    return Finding(status, f"{who}: {judged.text}", (float(first["t0"]), float(last["t1"])),
                   str(last["phase"]), int(last["iteration"]), numbers, cause=judged.cause, series=what,
                   resolution=res)


# -- serialized peaks per GPU ------------------------------------------------------------------
_FOOTPRINTS = (names.TRAIN, names.GENERATE)
_ROLLOUT_OFFLOADS = (names.OFFLOAD_ROLLOUT, names.OFFLOAD_KV, names.OFFLOAD_WEIGHTS)


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
    full = fleet.normalize(table)
    df = full[full["own_peak"].notna()].reset_index(drop=True)
    judged = _serialized_judge(df, th, full) if len(df) else None
    if judged is None or judged.empty:
        return _na(name, title, explanation, "no GPU with both a train and a generate phase in separate processes "
                   "(an in-process engine is judged by serialized_peaks; a host lane only when its training "
                   "state leaves host memory)")
    lane_rows = fleet.lanes(df).set_index("lane", drop=False)
    own = df.groupby("lane")["own_series"].agg(lambda s: sorted(set(s) - {""}))
    findings, worst = [], None
    by_lane = judged.assign(over=judged["together"] > judged["limit"]).groupby("lane_code", sort=False)
    overs, counts = by_lane["over"].sum(), by_lane.size()
    for k in by_lane["ratio"].idxmax():
        r = judged.loc[k]
        over, count = int(overs[r["lane_code"]]), int(counts[r["lane_code"]])
        lane = lane_rows.loc[r["lane"]]
        on_gpu = lane["kind"] == "gpu"
        what = ("NVML used of the GPU" if r["source"] == fleet.SOURCE_USED
                else "its processes' own levels summed" if on_gpu else "its processes' host RSS summed")
        cause, story = _serialized_cause(r, th) if over else (None, "")
        message = (f"{lane['label']}: {instance_label(r['phase'], r['iteration'])} (pid {r['pid']}, {r['role'] or '?'}) held "
                   f"{gib(r['together'])} together above their roles' floors ({what}); "
                   f"footprints train {gib(r['f_train'])}, "
                   f"rollout {gib(r['f_rollout'])}, limit {gib(r['limit'])}"
                   + (f"; {over} of {count} phases over{story}" if over else ""))
        series = r["source"] if r["source"] == fleet.SOURCE_USED else f"{r['source']} ({', '.join(own[r['lane']])})"
        res = resolution_of("used") if r["source"] == fleet.SOURCE_USED else resolution_of(own[r["lane"]] or ["rss"])
        numbers = _where(lane, pid=int(r["pid"]), together=float(r["together"]), limit=float(r["limit"]),
                         train=float(r["f_train"]), rollout=float(r["f_rollout"]), ratio=float(r["ratio"]),
                         phases_over=over, phases=count, series=series)
        findings.append(Finding("fail" if over else "pass", message, (r["t0"], r["t1"]), r["phase"],
                                int(r["iteration"]), numbers, cause=cause, series=series, resolution=res))
        if worst is None or numbers["ratio"] > worst["ratio"]:
            worst = dict(numbers, phase=r["phase"], iteration=int(r["iteration"]),
                         message=f"{gib(r['together'])} held together, limit {gib(r['limit'])}")
    processes = int(df.loc[df["lane_code"].isin(judged["lane_code"].unique()), "pid"].nunique())
    word = _lanes_word(lane_rows)
    result = _result(name, title, explanation, findings, {"lanes": len(findings), "processes": processes}, worst,
                     "NVML used of the GPU where the host sampler read it, else the sum of its processes' own "
                     "memory (proc, else reserved; rss on host lanes)",
                     f"{word} held one footprint at a time", f"{word} held more than one footprint")
    result = _with_small(result, findings)
    skipped = df["lane_code"].nunique() - len(findings)
    if skipped:
        result.summary += f"; {_count(skipped, 'lanes')} without both footprints in separate processes not judged"
    return result


def _serialized_cause(r, th: FleetThresholds) -> tuple[str, str]:
    """Both footprints only when what the phase held above its own footprint is about the other one's
    size (within serialized_match_share of it); else a residual another process kept."""
    own, other = (r["f_train"], r["f_rollout"]) if r["phase"] == names.TRAIN else (r["f_rollout"], r["f_train"])
    excess = r["together"] - own
    if abs(excess - other) <= th.serialized_match_share * other:
        return "both_footprints", ": both footprints held at once"
    return "residual", (f": {gib(excess)} above one footprint, not the other's {gib(other)}: a residual, "
                        "see offload_drop and floor_trend_leak")


def _role_floors(df: pd.DataFrame, full: pd.DataFrame | None = None) -> pd.Series:
    """Per process: the lowest own level of any process of its role across the fleet (its own lowest
    where the role is unknown), or the level its offloads declare it falls to where that is lower."""
    low = df["own_floor"].fillna(df["own_peak"])
    own = low.groupby(df["pid"]).min()
    role = df.groupby("pid")["role"].first()
    by_role = low[df["role"] != ""].groupby(df["role"]).min()
    base = pd.Series(np.where(role != "", role.map(by_role), own), index=own.index).fillna(own)
    # what a process's offloads say it should fall to: alone on its role (one GPU), its own lowest level
    # would hide memory it never releases
    offloads = df[df["phase"].str.startswith(names.OFFLOAD_PREFIX) & (df["expected_bytes"] > 0)]
    declared = (offloads["own_first"] - offloads["expected_bytes"]).groupby(offloads["pid"]).min()
    # a delegated offload is often shorter than the host sampler's interval: no own level of its own
    full = df if full is None else full
    delegated = full[full["phase"].str.startswith(names.OFFLOAD_PREFIX) & (full["expected_bytes"] > 0)]
    declared = pd.concat([declared, _delegated_floors(df, delegated)]).groupby(level=0).min()
    return np.fmax(np.fmin(base, declared.reindex(base.index)), 0.0)


def _delegated_floors(df: pd.DataFrame, offloads: pd.DataFrame) -> pd.Series:
    """Per engine process: the level a rollout offload declared by another process of its GPU (an actor
    driving its engine server) says the engine falls to: the engine's level entering the offload (the last
    finite level of its latest phase ended by then) minus the offload's expected_bytes. Without it an
    engine that never releases would have its stuck memory taken for its context."""
    rollout = offloads[offloads["phase"].isin(_ROLLOUT_OFFLOADS) & (offloads["role"] != names.ROLE_ENGINE)]
    engines = df[(df["role"] == names.ROLE_ENGINE) & df["own_last"].notna()]
    out = {}
    if rollout.empty or engines.empty:
        return pd.Series(out, dtype=float)
    rollout_by_lane = rollout.groupby("lane_code").indices
    for (lane, pid), rows in engines.groupby(["lane_code", "pid"], sort=False):
        mine = rollout.iloc[rollout_by_lane.get(lane, [])]
        mine = mine[mine["pid"] != pid]
        if mine.empty:
            continue
        held = fleet.levels_during(rows["t0"].to_numpy(), rows["t1"].to_numpy(), np.full(len(rows), np.nan),
                                   rows["own_last"].to_numpy(), mine["t0"].to_numpy(), mine["t0"].to_numpy())
        fall = held - mine["expected_bytes"].to_numpy()
        if np.isfinite(fall).any():
            out[pid] = float(np.nanmin(fall))
    return pd.Series(out, dtype=float)


def _separate_footprints(foot: pd.DataFrame) -> pd.Series:
    """Per lane: whether a process of another role than the training processes runs generate without
    training (an engine server beside its actor). Two data-parallel ranks that each run the whole loop,
    or an actor beside a reference model of the same role, share a GPU without being a colocated
    train/rollout pair: each process's own serialized_peaks judges its footprints; their sum is not two
    footprints (issue 30)."""
    role = foot.drop_duplicates("pid").set_index("pid")["role"].astype(str).to_dict()
    sets = foot.groupby(["lane_code", "phase"])["pid"].agg(lambda s: frozenset(s)).unstack("phase")
    if names.TRAIN not in sets or names.GENERATE not in sets:
        return pd.Series(False, index=sets.index)
    train = sets[names.TRAIN].apply(lambda v: v if isinstance(v, frozenset) else frozenset())
    gen = sets[names.GENERATE].apply(lambda v: v if isinstance(v, frozenset) else frozenset())
    return pd.Series([any(role.get(p) not in {role.get(q) for q in t} for p in g - t) for t, g in zip(train, gen)],
                     index=sets.index)


def _serialized_judge(df: pd.DataFrame, th: FleetThresholds, full: pd.DataFrame | None = None) -> pd.DataFrame:
    """The train and generate rows of the lanes that can be judged, with `together` (their process's peak
    plus what each other process of the lane held in their window, all above the processes' bases),
    the lane's footprints, `limit` and `ratio`. Vectorized: one levels_during call per process."""
    base = _role_floors(df, full)
    df = df.assign(above=df["own_peak"] - df["pid"].map(base).to_numpy())
    foot = df[df["phase"].isin(_FOOTPRINTS)]
    per_lane = foot.groupby(["lane_code", "phase"])["pid"].agg(["nunique", "min"]).unstack("phase")
    if len(per_lane) == 0 or per_lane["nunique"].shape[1] < len(_FOOTPRINTS):
        return foot.iloc[:0]
    pids_per_lane = df.groupby("lane_code")["pid"].nunique()
    both = per_lane["nunique"].notna().all(axis=1)
    # one process holding both footprints: its own memory already is their sum (serialized_peaks judges it)
    one_process = (per_lane["nunique"] == 1).all(axis=1) & \
        (per_lane["min"][names.TRAIN] == per_lane["min"][names.GENERATE])
    ok = both & ~one_process & (pids_per_lane.reindex(both.index) >= 2) & _separate_footprints(foot).reindex(
        both.index, fill_value=False)
    # A host lane (a run without GPUs) holds both footprints by design unless the training state
    # leaves host memory (an offload_train that moves bytes, e.g. to disk): with target cpu nothing moves.
    moves = df[(df["phase"] == names.OFFLOAD_TRAIN) & (df["expected_bytes"] > 0)]["lane_code"].unique()
    on_gpu = df.groupby("lane_code")["gpu_uuid"].first().astype(str) != ""
    ok &= on_gpu.reindex(ok.index, fill_value=False) | ok.index.isin(moves)
    lanes_ok = ok[ok].index.to_numpy()
    judged = foot[foot["lane_code"].isin(lanes_ok)].reset_index(drop=True)
    if judged.empty:
        return judged
    # a footprint is held by one process per phase instance (the engine in generate, not the actor
    # waiting on it over HTTP): the largest of each (iteration, phase) cell, then the median
    cells = judged.groupby(["lane_code", "phase", "iteration"])["above"].max()
    medians = cells.groupby(level=["lane_code", "phase"]).median().unstack("phase")
    f_train = medians[names.TRAIN].reindex(judged["lane_code"]).to_numpy()
    f_rollout = medians[names.GENERATE].reindex(judged["lane_code"]).to_numpy()
    limit = np.maximum(f_train, f_rollout) + th.serialized_overlap_share * np.minimum(f_train, f_rollout) \
        + th.serialized_abs_bytes
    together = judged["above"].to_numpy(copy=True)
    windows = judged.groupby("lane_code").indices
    w0, w1, owner = judged["t0"].to_numpy(), judged["t1"].to_numpy(), judged["pid"].to_numpy()
    rows = df[df["lane_code"].isin(lanes_ok)]
    for (lane, pid), p in rows.groupby(["lane_code", "pid"], sort=False):
        at = windows[lane]
        level = fleet.levels_during(p["t0"].to_numpy(), p["t1"].to_numpy(), p["own_peak"].to_numpy(),
                                    p["own_last"].to_numpy(), w0[at], w1[at]) - base[pid]
        together[at] += np.where(owner[at] != pid, np.nan_to_num(level), 0.0)
    # Where the host sampler read the GPU's NVML used in the window, judge the device's own total
    # instead: summed per-process peaks need not coincide in time and overstate (24.5 GiB summed
    # against 16.97 GiB really used on the H200 run of sample_logs/h200/9-dist-engine-server).
    lane_base = base.groupby(df.groupby("pid")["lane_code"].first().reindex(base.index)).sum()
    device = judged["used_peak"].to_numpy() - judged["lane_code"].map(lane_base).to_numpy()
    on_device = np.isfinite(device)
    together = np.where(on_device, device, together)
    source = np.where(on_device, fleet.SOURCE_USED, fleet.SOURCE_SUM)
    return judged.assign(together=together, f_train=f_train, f_rollout=f_rollout, limit=limit, ratio=together / limit,
                         source=source)


def run_fleet_checks(table: pd.DataFrame, thresholds: FleetThresholds | None = None,
                     matrix: fleet.GpuMatrix | None = None) -> list[FleetCheckResult]:
    th = thresholds or FleetThresholds()
    df = fleet.normalize(table)
    return [check_rank_imbalance(df, th, matrix), check_floor_trend_leak(df, th), check_serialized_peaks_per_gpu(df, th)]
