"""offload_drop: after each offload_* phase, the memory it declared is gone."""
from __future__ import annotations

import numpy as np

from miles_profile import names
from miles_profile.report.engine_server import engine_of, holder_track, moves_rollout
from miles_profile.report.series import Track
from miles_profile.report.stats import phase_instances
from miles_profile.verdicts.types import CheckResult, Finding, Thresholds, gib
from miles_profile.verdicts.common import (
    Tracks, nanmin, not_applicable, open_finding, still_open, tags_of, verdict,
    window)


def check_offload_drop(run, th: Thresholds) -> CheckResult:
    name, title = "offload_drop", "Offload drops memory"
    explanation = (f"After each offload_* phase the memory it moved must be gone: the level fell by more than "
                   f"{th.offload_min_drop_share:.0%} of the phase's expected_bytes, and within the phase — a "
                   f"release that returns early and frees later is flagged (the 'OOM at wake-up' story).")
    inst = phase_instances(run)
    offloads = inst[inst["name"].str.startswith(names.OFFLOAD_PREFIX)] if len(inst) else inst
    if offloads.empty:
        return not_applicable(name, title, explanation, "no offload_* phase in this run")
    tracks = Tracks(run)
    phases = run.phases
    findings = []
    for k, row in offloads.iterrows():
        target = phases.loc[k, "target"] if "target" in phases else None
        expected = row["expected_bytes"]
        span = (row["start"], row["end"])
        where = dict(span=span, phase=row["name"], iteration=int(row["iteration"]))
        if still_open(row):  # its memory may not be released yet: that is no failure
            findings.append(open_finding(f"{row['name']} #{row['iteration']}", where))
            continue
        if not (np.isfinite(expected) and expected > 0):
            findings.append(Finding("n/a", f"{row['name']} #{row['iteration']}: no expected_bytes", **where))
            continue
        if not tracks.gpu and target == "cpu":
            findings.append(Finding("n/a", f"{row['name']} #{row['iteration']}: moves to CPU memory on a CPU-only "
                                           "run, nothing measurable is freed", **where))
            continue
        backend = _backend(run, phases, k, int(row["pid"]))
        paused = tracks.gpu and backend == names.TORCH_MEMORY_SAVER  # the allocator never sees a pause
        tags = tags_of(phases.loc[k, "tags"]) if "tags" in phases else []
        holder = engine_of(run.processes, _meta(run, int(row["pid"]))) if moves_rollout(tags) else None
        if holder is not None:
            pid = int(holder["pid"])
            track = holder_track(run, tracks.driver(pid) if paused else tracks.memory(pid), holder)
        else:
            track = tracks.driver(int(row["pid"])) if paused else tracks.memory(int(row["pid"]))
        if track is None:
            findings.append(Finding("n/a", f"{row['name']}: no memory series for its process"
                                           + (" that sees a torch_memory_saver pause (NVML)" if paused else ""),
                                    **where))
            continue
        finding = _judge_offload(track, row, expected, th, where)
        finding.numbers["backend"] = backend
        if holder is not None:  # say where it was judged: not the declaring process's own memory
            finding.message += f" (judged on {track.label})"
            finding.numbers["holder_pid"] = int(holder["pid"])
        findings.append(finding)
    return verdict(name, title, explanation, findings, "device memory" if tracks.gpu else "host RSS (no GPU columns)",
                    "offloads dropped what they moved", "offloads did not drop in time")


def _meta(run, pid: int) -> dict | None:
    return next((p for p in run.processes if p.get("pid") == pid), None)


def _backend(run, phases, k, pid: int) -> str:
    """The phase's `backend` attribute, else torch_memory_saver when its process's annotations name it."""
    value = phases.loc[k, "backend"] if "backend" in phases else None
    if isinstance(value, str):
        return value
    notes = next((p.get("annotations", {}) for p in run.processes if p.get("pid") == pid), {})
    return names.TORCH_MEMORY_SAVER if names.TORCH_MEMORY_SAVER in notes.values() else names.BUILTIN


def _judge_offload(track: Track, row, expected: float, th: Thresholds, where: dict) -> Finding:
    label = f"{row['name']} #{row['iteration']}"
    gap = track.sample_gap(row["start"], row["end"])
    if gap:
        return Finding("n/a", f"{label}: not judged, {gap}", numbers=dict(series=track.label), **where)
    before = track.at_or_before(row["start"])
    at_end = track.at_or_before(row["end"])
    after = track.value[window(track, row["end"], row["end"] + th.offload_late_window_s)]
    later_low = min(nanmin(after), at_end) if np.isfinite(nanmin(after)) else at_end
    need = th.offload_min_drop_share * expected
    inside = before - at_end
    total = before - later_low
    numbers = dict(before=before, at_end=at_end, later_low=later_low, expected_bytes=expected,
                   dropped_inside=inside, needed=need, series=track.label)
    if not np.isfinite(inside):
        return Finding("n/a", f"{label}: no sample before and at the end of the phase", numbers=numbers, **where)
    if inside > need:
        return Finding("pass", f"{label}: dropped {gib(inside)} of {gib(expected)} expected", numbers=numbers, **where)
    if total > need:
        return Finding("fail", f"{label}: returned having dropped {gib(inside)}; {gib(total)} was freed only "
                               f"after the phase ended (expected {gib(expected)} inside)",
                       numbers=numbers, **where)
    return Finding("fail", f"{label}: dropped {gib(inside)}, expected more than {gib(need)} "
                           f"({th.offload_min_drop_share:.0%} of {gib(expected)})", numbers=numbers, **where)

