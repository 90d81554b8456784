"""serialized_peaks_per_gpu: on each GPU that a training process and a rollout process share (colocated),
the two footprints are never resident at once: during train and generate the lane's processes hold together,
above their roles' floors, at most the larger footprint plus a share of the smaller. Two processes of one
role on one GPU are no colocated pair. A pure function of the PhaseTable (runmodel/fleet.py).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.names import instance_label
from miles_profile.runmodel import fleet
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
from miles_profile.verdicts.types import Finding, gib


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
        return fleet_na(name, title, explanation, "no GPU with both a train and a generate phase in separate processes "
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
        numbers = lane_where(lane, pid=int(r["pid"]), together=float(r["together"]), limit=float(r["limit"]),
                         train=float(r["f_train"]), rollout=float(r["f_rollout"]), ratio=float(r["ratio"]),
                         phases_over=over, phases=count, series=series)
        findings.append(Finding("fail" if over else "pass", message, (r["t0"], r["t1"]), r["phase"],
                                int(r["iteration"]), numbers, cause=cause, series=series, resolution=res))
        if worst is None or numbers["ratio"] > worst["ratio"]:
            worst = dict(numbers, phase=r["phase"], iteration=int(r["iteration"]),
                         message=f"{gib(r['together'])} held together, limit {gib(r['limit'])}")
    processes = int(df.loc[df["lane_code"].isin(judged["lane_code"].unique()), "pid"].nunique())
    word = lanes_word(lane_rows)
    result = fleet_result(name, title, explanation, findings, {"lanes": len(findings), "processes": processes}, worst,
                     "NVML used of the GPU where the host sampler read it, else the sum of its processes' own "
                     "memory (proc, else reserved; rss on host lanes)",
                     f"{word} held one footprint at a time", f"{word} held more than one footprint")
    result = with_too_small(result, findings)
    skipped = df["lane_code"].nunique() - len(findings)
    if skipped:
        result.summary += f"; {count_text(skipped, 'lanes')} without both footprints in separate processes not judged"
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
    # the columns read below only: each process's group of the whole table copied all its columns
    engines = df.loc[(df["role"] == names.ROLE_ENGINE) & df["own_last"].notna(), ["lane_code", "pid", "t0", "t1", "own_last"]]
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


def _with_co_training(judged: pd.DataFrame) -> np.ndarray:
    """Each row's `above`, a train row's plus that of other processes' train phases of its lane overlapping
    it in time: Miles trains the critic beside the actor (two Ray actors on one GPU), and their two
    training states are the run's training footprint, not a rollout footprint held during train (the
    H100 run of `--launcher ray --use-critic` failed on that, 2026-12-05)."""
    above = judged["above"].to_numpy(copy=True)
    out = above.copy()
    train = np.flatnonzero(judged["phase"].to_numpy() == names.TRAIN)
    t0, t1, pid = judged["t0"].to_numpy(), judged["t1"].to_numpy(), judged["pid"].to_numpy()
    for at in judged.iloc[train].groupby("lane_code").indices.values():
        rows = train[at]
        if len(np.unique(pid[rows])) < 2:
            continue
        a0, a1, ap = t0[rows], t1[rows], pid[rows]
        overlap = (a0[:, None] < a1[None, :]) & (a0[None, :] < a1[:, None]) & (ap[:, None] != ap[None, :])
        out[rows] += overlap.astype(float) @ np.nan_to_num(above[rows])
    return out


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
    # waiting on it over HTTP): the largest of each (iteration, phase) cell, then the median; processes
    # training at once (an actor and its critic, as Miles trains them) hold one training footprint together
    cells = judged.assign(above=_with_co_training(judged)).groupby(["lane_code", "phase", "iteration"])["above"].max()
    medians = cells.groupby(level=["lane_code", "phase"]).median().unstack("phase")
    f_train = medians[names.TRAIN].reindex(judged["lane_code"]).to_numpy()
    f_rollout = medians[names.GENERATE].reindex(judged["lane_code"]).to_numpy()
    limit = np.maximum(f_train, f_rollout) + th.serialized_overlap_share * np.minimum(f_train, f_rollout) \
        + th.serialized_abs_bytes
    together = judged["above"].to_numpy(copy=True)
    windows = judged.groupby("lane_code").indices
    w0, w1, owner = judged["t0"].to_numpy(), judged["t1"].to_numpy(), judged["pid"].to_numpy()
    # the columns read below only: each process's group of the whole table was a copy of all its columns
    rows = df.loc[df["lane_code"].isin(lanes_ok), ["lane_code", "pid", "t0", "t1", "own_peak", "own_last"]]
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
