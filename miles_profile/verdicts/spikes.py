"""transition_spikes: no peak between two phases above both neighbours' peaks."""
from __future__ import annotations

import numpy as np

from miles_profile.logdir.lost_phases import lost_spans, meets_lost_span
from miles_profile.names import iteration_tag
from miles_profile.runmodel.stats import phase_instances
from miles_profile.verdicts.common import (
    Tracks,
    nanmax,
    not_applicable,
    still_open,
    too_small,
    track_resolution,
    verdict,
    window,
)
from miles_profile.verdicts.types import CheckResult, Finding, Thresholds, gib


def check_transition_spikes(run, th: Thresholds) -> CheckResult:
    name, title = "transition_spikes", "No spikes between phases"
    explanation = ("Between two consecutive phases the true peak may exceed the larger neighbour's peak by at most "
                   f"{th.transition_tolerance_share:.0%} of it plus {gib(th.transition_abs_bytes)}: a spike there "
                   "is memory held outside any phase: two states coexisting during the hand-over, or untagged "
                   "work between the phases (wrapped in mp.phase(), it is judged as a phase of its own).")
    inst = phase_instances(run)
    if len(inst) < 2:
        return not_applicable(name, title, explanation, "fewer than two phases")
    tracks = Tracks(run)
    lost = lost_spans(run.meta if isinstance(run.meta, dict) else {})
    findings = []
    for pid, group in inst[inst["depth"] == 0].sort_values("start").groupby("pid"):
        track = tracks.memory(int(pid))
        if track is None:
            continue
        rows = list(group.itertuples())
        for a, b in zip(rows, rows[1:]):
            if still_open(a) or still_open(b):
                continue  # an open neighbour's peak is not known yet
            gap = window(track, a.end, b.start)
            if gap.stop <= gap.start:
                continue  # no sample between the phases: nothing happened outside them
            if meets_lost_span(lost, a.end, b.start):  # the gap may be a phase the reader dropped
                findings.append(Finding("n/a", f"{a.name} → {b.name} ({iteration_tag(b.iteration)}): not judged, a "
                                               "phase line the reader dropped (see the warnings) may lie between them",
                                        (a.end, b.start), b.name, int(b.iteration)))
                continue
            written = track.measured_times(peak=True)
            if not len(written) or written[-1] < b.end:  # b's peak may be in the samples not written yet
                findings.append(Finding("n/a", f"{a.name} → {b.name} ({iteration_tag(b.iteration)}): not judged, the samples "
                                               "end before the phase after it does", (a.end, b.start), b.name,
                                        int(b.iteration)))
                continue
            spike = nanmax(track.peak[gap])
            neighbours = np.fmax(nanmax(track.peak[window(track, a.start, a.end)]),
                                 nanmax(track.peak[window(track, b.start, b.end)]))
            if not (np.isfinite(spike) and np.isfinite(neighbours)):
                continue
            findings.append(_spike_finding(a, b, spike, neighbours, track, th))
    if not findings:
        return not_applicable(name, title, explanation, "no samples between consecutive phases")
    return verdict(name, title, explanation, findings, "device memory" if tracks.gpu else "host RSS (no GPU columns)",
                    "phase boundaries without a spike", "boundaries spiked")


def _gap_text(a, b) -> str:
    gap = b.start - a.end
    return f"{gap * 1000:.0f} ms" if gap < 1 else f"{gap:.1f} s"


def _spike_finding(a, b, spike: float, neighbours: float, track, th: Thresholds) -> Finding:
    label = f"{a.name} → {b.name} ({iteration_tag(b.iteration)})"
    where = dict(span=(a.end, b.start), phase=b.name, iteration=int(b.iteration))
    limit = neighbours * (1 + th.transition_tolerance_share) + th.transition_abs_bytes
    numbers = dict(spike=spike, neighbours=neighbours, limit=limit, series=track.label)
    res = track_resolution(track)
    if limit - neighbours < res:  # a tolerance under the series' noise (thresholds set to 0) judges noise
        return too_small(label, "the tolerance over the neighbours' peak,", limit - neighbours, res, track.label,
                         where, numbers)
    spiked = spike > limit
    return Finding("fail" if spiked else "pass",
                   f"{label}: peak {gib(spike)} in the {_gap_text(a, b)} between them, neighbours {gib(neighbours)}"
                   + (": held outside any phase (two states during the hand-over, or untagged work: "
                      "wrap it in mp.phase() to judge it)" if spiked else ""),
                   numbers=numbers, cause="transition_spike" if spiked else None, series=track.label,
                   resolution=res, **where)
