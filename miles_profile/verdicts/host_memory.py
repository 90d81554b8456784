"""Host memory during moves: disk offload keeps RSS flat; no second host copy of the weights."""
from __future__ import annotations

import numpy as np

from miles_profile import names
from miles_profile.report.stats import phase_instances
from miles_profile.verdicts.types import CheckResult, Finding, Thresholds, gib
from miles_profile.verdicts.common import (
    Tracks, nanmax, not_applicable, open_finding, still_open, tags_of, verdict,
    window)


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
            findings.append(open_finding(f"{row.name} #{row.iteration}", where))
            continue
        if track is None:
            findings.append(Finding("n/a", f"{row.name}: no host RSS", **where))
            continue
        gap = track.sample_gap(row.start, row.end, peak=True)
        if gap:
            findings.append(Finding("n/a", f"{row.name} #{row.iteration}: not judged, {gap}", **where))
            continue
        before = track.at_or_before(row.start)
        peak = nanmax(track.peak[window(track, row.start, row.end)])
        expected = row.expected_bytes if np.isfinite(row.expected_bytes) else 0.0
        allowed = th.host_flat_share * expected + th.host_flat_abs_bytes
        rise = peak - before
        if not np.isfinite(rise):
            findings.append(Finding("n/a", f"{row.name} #{row.iteration}: no samples in the phase", **where))
            continue
        findings.append(Finding("fail" if rise > allowed else "pass",
                                f"{row.name} #{row.iteration}: host RSS rose {gib(rise)} (allowed {gib(allowed)})",
                                numbers=dict(before=before, peak=peak, rise=rise, allowed=allowed, series=track.label),
                                **where))
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
        if track is None or still_open(row):
            continue
        gap = track.sample_gap(row.start, row.end, peak=True)
        if gap:
            findings.append(Finding("n/a", f"{row.name} #{row.iteration}: not judged, {gap}",
                                    (row.start, row.end), row.name, int(row.iteration)))
            continue
        before = track.at_or_before(row.start)
        growth = nanmax(track.peak[window(track, row.start, row.end)]) - before
        if not np.isfinite(growth):
            continue
        findings.append(Finding("fail" if growth >= th.weight_copy_share * w else "pass",
                                f"{row.name} #{row.iteration}: host RSS grew {gib(growth)}, weights {gib(w)}",
                                (row.start, row.end), row.name, int(row.iteration),
                                dict(growth=growth, weights_bytes=w, series=track.label)))
    return verdict(name, title, explanation, findings, "host RSS", "weight moves without an extra host copy",
                    "weight moves made a host copy")

