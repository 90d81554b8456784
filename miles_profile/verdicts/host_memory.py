"""Host memory during moves: disk offload keeps RSS flat; no second host copy of the weights."""
from __future__ import annotations

import numpy as np

from miles_profile import names
from miles_profile.names import instance_label
from miles_profile.runmodel.stats import phase_instances
from miles_profile.verdicts.common import (
    Tracks,
    nanmax,
    not_applicable,
    open_finding,
    size,
    still_open,
    tags_of,
    too_small,
    track_resolution,
    verdict,
    window,
)
from miles_profile.verdicts.types import CheckResult, Finding, Thresholds, gib


def check_disk_offload_host_flat(run, th: Thresholds) -> CheckResult:
    name, title = "disk_offload_host_flat", "Disk offload keeps host RSS flat"
    explanation = ("An offload to disk must stream to the file, not stage the state in host memory: host RSS "
                   f"may rise by at most {th.host_flat_share:.0%} of expected_bytes plus {gib(th.host_flat_abs_bytes)}.")
    inst = phase_instances(run)
    phases = run.phases
    if inst.empty or "target" not in phases:
        return not_applicable(name, title, explanation, "no offload with target='disk'")
    disk = inst[(phases["target"] == "disk").to_numpy() & inst["name"].str.startswith(names.OFFLOAD_PREFIX).to_numpy()]
    if disk.empty:
        return not_applicable(name, title, explanation, "no offload with target='disk'")
    tracks = Tracks(run)
    findings = []
    for row in disk.itertuples():
        track = tracks.host(int(row.pid))
        where = dict(span=(row.start, row.end), phase=row.name, iteration=int(row.iteration))
        if still_open(row):
            findings.append(open_finding(f"{instance_label(row.name, row.iteration)}", where, run, int(row.pid)))
            continue
        if track is None:
            findings.append(Finding("n/a", f"{row.name}: no host RSS", **where))
            continue
        gap = track.sample_gap(row.start, row.end, peak=True)
        if gap:
            findings.append(Finding("n/a", f"{instance_label(row.name, row.iteration)}: not judged, {gap}", **where))
            continue
        before = track.at_or_before(row.start)
        peak = nanmax(track.peak[window(track, row.start, row.end)])
        expected = row.expected_bytes if np.isfinite(row.expected_bytes) else 0.0
        allowed = th.host_flat_share * expected + th.host_flat_abs_bytes
        rise = peak - before
        if not np.isfinite(rise):
            findings.append(Finding("n/a", f"{instance_label(row.name, row.iteration)}: no samples in the phase", **where))
            continue
        # the allowance holds host_flat_abs_bytes (128 MiB), above RSS's resolution: never too small
        staged = rise > allowed
        findings.append(Finding("fail" if staged else "pass",
                                f"{instance_label(row.name, row.iteration)}: host RSS rose {gib(rise)} (allowed {gib(allowed)})"
                                + (": the state was staged in host memory" if staged else ""),
                                numbers=dict(before=before, peak=peak, rise=rise, allowed=allowed, series=track.label),
                                cause="host_staging" if staged else None, series=track.label,
                                resolution=track_resolution(track), **where))
    return verdict(name, title, explanation, findings, "host RSS", "disk offloads kept host RSS flat",
                    "disk offloads staged in host memory")


_WEIGHT_MOVES = (names.UPDATE_WEIGHTS, names.ONLOAD_WEIGHTS)


def check_host_weight_copies(run, th: Thresholds) -> CheckResult:
    name, title = "host_weight_copies", "No second host copy of the weights"
    explanation = ("Moving weights (update_weights, onload_weights) must not materialize a whole extra copy in host "
                   f"memory: host RSS may grow by less than {th.weight_copy_share:.0%} of the weights' bytes "
                   "(expected_bytes of phases tagged 'weights').")
    if not run.gpu_indices:
        return not_applicable(name, title, explanation, "not applicable on a CPU-only run: the weights live in host memory")
    inst = phase_instances(run)
    phases = run.phases
    if inst.empty or "tags" not in phases:
        return not_applicable(name, title, explanation, "no phase tagged 'weights' with expected_bytes")
    tagged = np.array([names.WEIGHTS in tags_of(v) for v in phases["tags"]], dtype=bool)
    weights = inst["expected_bytes"].to_numpy()[tagged]
    weights = weights[np.isfinite(weights)]
    if not len(weights):
        return not_applicable(name, title, explanation, "no phase tagged 'weights' with expected_bytes")
    w = float(weights.max())
    moves = inst[inst["name"].isin(_WEIGHT_MOVES)]
    if moves.empty:
        return not_applicable(name, title, explanation, "no update_weights or onload_weights phase")
    tracks = Tracks(run)
    findings = []
    for row in moves.itertuples():
        track = tracks.host(int(row.pid))
        if track is None:
            continue
        finding = _weight_copy_finding(row, track, w, th, run)
        if finding is not None:
            findings.append(finding)
    return verdict(name, title, explanation, findings, "host RSS", "weight moves without an extra host copy",
                    "weight moves made a host copy")


def _weight_copy_finding(row, track, weights: float, th: Thresholds, run) -> Finding | None:
    label = instance_label(row.name, row.iteration)
    where = dict(span=(row.start, row.end), phase=row.name, iteration=int(row.iteration))
    if still_open(row):
        return open_finding(label, where, run, int(row.pid))
    gap = track.sample_gap(row.start, row.end, peak=True)
    if gap:
        return Finding("n/a", f"{label}: not judged, {gap}", **where)
    before = track.at_or_before(row.start)
    growth = nanmax(track.peak[window(track, row.start, row.end)]) - before
    if not np.isfinite(growth):
        return None
    numbers = dict(growth=growth, weights_bytes=weights, series=track.label)
    copy, res = th.weight_copy_share * weights, track_resolution(track)
    if copy < res:  # a copy this small hides in RSS's own noise (a few KiB of weights on the tiny preset)
        return too_small(label, f"{th.weight_copy_share:.0%} of the weights,", copy, res, track.label, where, numbers)
    copied = growth >= copy
    return Finding("fail" if copied else "pass",
                   f"{label}: host RSS grew {size(growth)}, weights {size(weights)}"
                   + (": a second host copy of the weights" if copied else ""),
                   numbers=numbers, cause="host_weight_copy" if copied else None, series=track.label,
                   resolution=res, **where)
