"""rank_imbalance: in each (iteration, phase), a lane (a GPU, or a rank's host memory) and a process may not
run higher than the median of their peers by more than their spread, a share and the resolution; an
outlier fails only when its excess matters against the lane's total and recurs (a process that hosts the
sampler or holds a one-time buffer warns or passes). A pure function of the PhaseTable (runmodel/fleet.py).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from miles_profile.runmodel import fleet
from miles_profile.runmodel.fleet_identity import unidentified
from miles_profile.verdicts.common import size
from miles_profile.verdicts.fleet_types import (
    FleetCheckResult,
    FleetThresholds,
    count_text,
    fleet_na,
    fleet_result,
    lane_where,
    lanes_word,
    with_too_small,
)
from miles_profile.verdicts.resolution import resolution_of
from miles_profile.verdicts.types import TOO_SMALL, WARN, Finding, gib


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
    findings, worst = _imbalance(matrix.bytes, matrix.columns, lanes, th, lanes_word(matrix.lanes))
    judged = {"lanes": len(findings), "processes": 0}
    for who, values, columns in _process_matrices(df, fleet.lanes(df) if unknown else matrix.lanes):
        more, candidate = _imbalance(values, columns, who, th, f"{who[0]['role'] or 'unknown-role'} processes")
        findings += more
        judged["processes"] += len(more)
        if candidate is not None and (worst is None or candidate["excess"] > worst["excess"]):
            worst = candidate
    left_out = _left_out(unknown, incomplete, df)
    if not findings:
        return fleet_na(name, title, explanation,
                   f"needs at least {th.imbalance_min_peers} lanes with the same phase" + left_out)
    result = fleet_result(name, title, explanation, findings, judged, worst,
                     " / ".join(sorted(set(matrix.lanes["source"]))) + "; own memory per process",
                     f"{lanes_word(matrix.lanes)} and processes within their peers' peaks", "above their peers")
    result = with_too_small(result, findings)
    result.summary += left_out
    return result


def _left_out(unknown: list[int], incomplete: list[str], df: pd.DataFrame) -> str:
    """The summary's words for processes without a readable meta and the lanes that may lack them."""
    if not unknown:
        return ""
    pids = ", ".join(map(str, unknown[:4])) + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
    text = f"; left out: {count_text(len(unknown), 'processes')} without a readable meta (pid {pids}: rank unknown)"
    if incomplete:
        labels = fleet.lanes(df[df["lane"].isin(incomplete)])["label"].tolist()
        text += f" and the {count_text(len(labels), 'lanes')} that may lack them ({', '.join(labels[:4])})"
    return text


def _lane_resolutions(df: pd.DataFrame, lanes: pd.DataFrame) -> list[float]:
    """Per lane, what its values resolve: NVML used, else the coarsest own series of its processes."""
    own = df.groupby("lane")["own_series"].agg(lambda s: sorted(set(s) - {""}))
    return [resolution_of("used") if source == fleet.SOURCE_USED else resolution_of(own.get(lane) or ["rss"])
            for lane, source in zip(lanes["lane"], lanes["source"])]


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
    # each shown cell's column once, and the phases as one array: a pandas row or comparison per lane
    # was most of this check at 1,024 processes (1,536 rows)
    phase_of, col_of = cols["phase"].to_numpy(), {}
    findings, worst = [], None
    for r, w in enumerate(who):
        row = excess[r]
        if not np.isfinite(row).any():
            continue
        # the cell shown: the largest excess among the failing cells, else among the too small, else overall
        shown = matters[r] if matters[r].any() else (fails[r] if fails[r].any() else small[r])
        c = int(np.nanargmax(np.where(shown, row, -np.inf))) if shown.any() else int(np.nanargmax(row))
        recur = (len(set(iterations[matters[r]])), len(set(iterations[fails[r]])))
        col = col_of[c] if c in col_of else col_of.setdefault(c, cols.iloc[c])
        finding = _imbalance_finding(w, col, values[r, c], median[c], spread[c], int(peers[c]),
                                     int(fails[r].sum()), bool(small[r].any()), floor[r, 0], peers_name,
                                     recur, float(matters_floor[r, 0]), th.imbalance_min_iterations)
        same = phase_of == phase_of[c]  # the shown phase's cells, over iterations
        if finding.status == "fail" and _grows(row[same], iterations[same], fails[r][same]):
            finding = replace(finding, status=WARN, cause="sustained_growth",
                              message=finding.message.replace("an outlier among its peers", "") +
                              "its excess grows with the iterations: a leak of this process, "
                              "judged by leak and floor_trend_leak, not an imbalance")
        findings.append(finding)
        if worst is None or row[c] > worst["excess"]:
            worst = dict(finding.numbers, phase=finding.phase, iteration=finding.iteration,
                         message=f"{col['label']} {gib(row[c])} over the median of {peers_name}")
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
    numbers = lane_where(w, pid=w.get("pid"), excess=float(excess), median=float(median), spread=float(spread),
                     cells_over=cells_over, series=w["source"], iterations_over=over,
                     iterations_mattering=mattering, matters_above=matters_floor)
    cause = {"fail": "rank_outlier", WARN: "differs_once"}.get(status)
    return Finding(status, message, (col["t0"], col["t1"]), col["phase"], int(col["iteration"]), numbers,
                   cause=cause, series=w["source"],
                   resolution=float(w["resolution"]))
