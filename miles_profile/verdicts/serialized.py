"""serialized_peaks: with colocation, the training and rollout footprints are never resident at once."""
from __future__ import annotations

import numpy as np

from miles_profile import names
from miles_profile.report.series import Track, main_pid
from miles_profile.report.stats import phase_instances
from miles_profile.verdicts.types import CheckResult, Finding, Thresholds, gib
from miles_profile.verdicts.common import (
    Tracks, nanmax, nanmin, not_applicable, open_finding, still_open, verdict,
    window)


_ROLLOUT_OFFLOADS = (names.OFFLOAD_ROLLOUT, names.OFFLOAD_KV, names.OFFLOAD_WEIGHTS)


def check_serialized_peaks(run, th: Thresholds) -> CheckResult:
    name, title = "serialized_peaks", "Training and rollout peaks serialized"
    share = th.serialized_overlap_share
    explanation = ("With colocation the training state and the rollout engine's memory (sizes from the "
                   "expected_bytes of offload_train and of the rollout offloads) must never be resident at once. "
                   "A phase's resident memory is its lowest sampled level, so a train phase's activations don't "
                   f"count: fail when a train phase never fell below floor + training bytes + {share:.0%} of the "
                   f"rollout bytes, or a generate phase below floor + rollout bytes + {share:.0%} of the training bytes.")
    inst = phase_instances(run)
    if inst.empty:
        return not_applicable(name, title, explanation, "no phases in this run")
    train = inst[inst["name"] == names.OFFLOAD_TRAIN]["expected_bytes"].max()
    rollout_rows = inst[inst["name"].isin(_ROLLOUT_OFFLOADS)]
    rollout = rollout_rows.groupby("iteration")["expected_bytes"].sum(min_count=1).max() if len(rollout_rows) else np.nan
    if not (np.isfinite(train) and np.isfinite(rollout) and train > 0 and rollout > 0):
        return not_applicable(name, title, explanation,
                   "needs expected_bytes of an offload_train and a rollout offload (runs without colocation offloads)")
    track = Tracks(run).memory(main_pid(run))
    if track is None:
        return not_applicable(name, title, explanation, "no memory series")
    floor = nanmin(track.value[window(track, inst["start"].min(), inst["end"].max())])
    findings = [_resident_finding(row, track, floor, train, rollout, share)
                for row in inst[inst["name"].isin([names.TRAIN, names.GENERATE])].itertuples()]
    findings = [f for f in findings if f is not None]
    if not findings:
        return not_applicable(name, title, explanation, "no samples inside train or generate phases")
    return verdict(name, title, explanation, findings, track.label,
                    "train/generate phases held one footprint at a time", "phases held both footprints")


def _resident_finding(row, track: Track, floor: float, train: float, rollout: float, share: float) -> Finding | None:
    inside = window(track, row.start, row.end)
    if inside.stop <= inside.start:
        return None
    iteration = int(getattr(row, "iteration", -1))
    where = dict(span=(row.start, row.end), phase=row.name, iteration=iteration)
    if still_open(row):  # its lowest level may be still to come
        return open_finding(f"{row.name} #{iteration}", where)
    gap = track.sample_gap(row.start, row.end, before=False)
    if gap:  # its lowest level may be in the samples not written yet
        return Finding("n/a", f"{row.name} #{iteration}: not judged, {gap}", **where)
    resident = nanmin(track.value[inside])
    own, other = (train, rollout) if row.name == names.TRAIN else (rollout, train)
    limit = floor + own + share * other
    numbers = dict(floor=floor, train_bytes=train, rollout_bytes=rollout, resident=resident, limit=limit,
                   peak=nanmax(track.peak[inside]), series=track.label)
    iteration = int(getattr(row, "iteration", -1))
    if resident >= limit:
        return Finding("fail", f"{row.name} #{iteration}: {gib(resident)} resident ≥ {gib(limit)}: both footprints "
                               "held at once", (row.start, row.end), row.name, iteration, numbers)
    return Finding("pass", f"{row.name} #{iteration}: {gib(resident)} resident < {gib(limit)} (floor {gib(floor)} + "
                           f"{'train' if row.name == names.TRAIN else 'rollout'} {gib(own)})",
                   (row.start, row.end), row.name, iteration, numbers)

