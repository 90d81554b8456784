"""Checks: pure functions from a loaded run to verdicts with numbers (no plotly).

Each check returns a `CheckResult`: status "pass", "fail" or "n/a", a one-line summary with the
numbers, the time span it looked at, a one-sentence explanation, and `findings` (one per phase
instance or boundary it judged). Thresholds live in `Thresholds`; every field is documented there
and can be overridden (`Thresholds(offload_min_drop_share=0.8)` or visualize `--threshold`).

"Device memory" is the GPU memory of the phase's process (NVML per-process, else the allocator's
reserved, else allocated; summed over the GPUs it uses; true peaks from `gpu{i}_alloc_peak`). On a
run without GPU columns the checks that make sense on the host use host RSS (`rss`/`rss_peak`)
instead and say so; the others are "n/a".

A run still being written is judged on what has finished: an open phase (no end event yet) and an
unfinished iteration (one holding an open phase, and the last one while a recorder process has not
written its `end_time`) are "n/a" until they end, never a failure on half the data. Likewise a phase
whose samples are not all there: events are written at once but samples every 0.5 s, so after a
`kill -9`, or while a run is written, the phases of the last half second have their events and not
yet their samples. A phase is judged only when its memory series has a sample at or before its start,
one inside it, and reaches its end (`Track.sample_gap`); otherwise its finding is "n/a" with the reason.

Public API (stable; shared with the Dash dashboard):

    Thresholds(...)                            # dataclass, documented fields below
    CheckResult(name, title, status, summary, explanation, span, findings)
    Finding(status, message, span, phase, iteration, numbers)
    run_checks(run, thresholds=None) -> list[CheckResult]
    recording(run) -> bool                     # a recorder process has not written its end_time
    unfinished_iterations(run) -> set[int]     # iterations not judged yet
    check_offload_drop, check_serialized_peaks, check_transition_spikes, check_disk_offload_host_flat,
    check_host_weight_copies, check_leak, check_headroom   # each (run, thresholds) -> CheckResult
    overall_status(results) -> "pass" | "fail" | "n/a"

(The result types and thresholds are defined in check_types.py and re-exported here.)
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.report.check_types import (  # noqa: F401 - re-exported: the public API above
    CheckResult, Finding, Status, Thresholds, gib, overall_status)
from miles_profile.report.engine_server import engine_of, holder_track, moves_rollout
from miles_profile.report.series import DRIVER_KINDS, Track, device_track, host_track, main_pid
from miles_profile.report.stats import phase_instances

MiB = 1024 ** 2


def _span(findings: list[Finding]) -> tuple[float, float] | None:
    spans = [f.span for f in findings if f.span]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None


def _verdict(name: str, title: str, explanation: str, findings: list[Finding], series: str,
             ok: str, bad: str) -> CheckResult:
    failed = [f for f in findings if f.status == "fail"]
    judged = [f for f in findings if f.status != "n/a"]
    if not judged:
        summary = findings[0].message if len(findings) == 1 else (
            f"{len(findings)} not judged; first: {findings[0].message}" if findings else "nothing to check")
        return CheckResult(name, title, "n/a", summary, explanation, _span(findings), findings, series)
    if failed:
        summary = f"{len(failed)} of {len(judged)} {bad}; first: {failed[0].message}"
        return CheckResult(name, title, "fail", summary, explanation, _span(judged), findings, series)
    summary = judged[0].message if len(judged) == 1 else f"{len(judged)} {ok}"
    unjudged = [f for f in findings if f.status == "n/a"]
    if unjudged:  # say so: a pass over some phases is not a pass over all of them
        summary += f"; {len(unjudged)} not judged, first: {unjudged[0].message}"
    return CheckResult(name, title, "pass", summary, explanation, _span(judged), findings, series)


def _na(name: str, title: str, explanation: str, why: str) -> CheckResult:
    return CheckResult(name, title, "n/a", why, explanation)


class _Tracks:
    """Per process: its device track (None on a CPU-only run) and host track, computed once."""

    def __init__(self, run):
        self.run = run
        self._cache: dict[tuple[str, int], Track | None] = {}
        self.gpu = bool(run.gpu_indices)

    def device(self, pid: int) -> Track | None:
        key = ("device", pid)
        if key not in self._cache:
            self._cache[key] = device_track(self.run, pid)
        return self._cache[key]

    def host(self, pid: int) -> Track | None:
        key = ("host", pid)
        if key not in self._cache:
            self._cache[key] = host_track(self.run, pid)
        return self._cache[key]

    def memory(self, pid: int) -> Track | None:
        """Device memory, or host RSS on a run without GPU columns."""
        return self.device(pid) if self.gpu else self.host(pid)

    def driver(self, pid: int) -> Track | None:
        """Device memory as the driver sees it (NVML per process, else NVML device used)."""
        key = ("driver", pid)
        if key not in self._cache:
            self._cache[key] = device_track(self.run, pid, DRIVER_KINDS)
        return self._cache[key]


def _window(track: Track, a: float, b: float) -> slice:
    """Samples with a < t <= b (their peaks fall in that span)."""
    return slice(int(np.searchsorted(track.t, a, "right")), int(np.searchsorted(track.t, b, "right")))


def _nanmax(x: np.ndarray) -> float:
    return float(np.nanmax(x)) if len(x) and np.isfinite(x).any() else float("nan")


def _nanmin(x: np.ndarray) -> float:
    return float(np.nanmin(x)) if len(x) and np.isfinite(x).any() else float("nan")


def recording(run) -> bool:
    """True while a recorder process has not written its `end_time` (the run is being written, or that
    recorder died without a clean stop): either way its last iteration did not finish."""
    return any("start_time" in p and "end_time" not in p for p in run.processes)


def unfinished_iterations(run) -> set[int]:
    """Iterations that hold an open phase, and the last iteration while the run is being recorded."""
    inst = phase_instances(run)
    if inst.empty:
        return set()
    iterations = inst["iteration"]
    unfinished = {int(i) for i in iterations[inst["status"] == names.OPEN]}
    if recording(run):
        unfinished.add(int(iterations.max()))
    return {i for i in unfinished if i >= 0}


def _still_open(row) -> bool:
    """Whether a phase instance (a row of phase_instances, as a Series or a namedtuple) has not ended."""
    return getattr(row, "status", None) == names.OPEN


def _open_finding(label: str, where: dict) -> Finding:
    return Finding("n/a", f"{label}: still open, judged once it ends", **where)


def _tags(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)] if isinstance(value, str) else []


# -- offload drop ------------------------------------------------------------------------------
def check_offload_drop(run, th: Thresholds) -> CheckResult:
    name, title = "offload_drop", "Offload drops memory"
    explanation = (f"After each offload_* phase the memory it moved must be gone: the level fell by more than "
                   f"{th.offload_min_drop_share:.0%} of the phase's expected_bytes, and within the phase — a "
                   f"release that returns early and frees later is flagged (the 'OOM at wake-up' story).")
    inst = phase_instances(run)
    offloads = inst[inst["name"].str.startswith(names.OFFLOAD_PREFIX)] if len(inst) else inst
    if offloads.empty:
        return _na(name, title, explanation, "no offload_* phase in this run")
    tracks = _Tracks(run)
    phases = run.phases
    findings = []
    for k, row in offloads.iterrows():
        target = phases.loc[k, "target"] if "target" in phases else None
        expected = row["expected_bytes"]
        span = (row["start"], row["end"])
        where = dict(span=span, phase=row["name"], iteration=int(row["iteration"]))
        if _still_open(row):  # its memory may not be released yet: that is no failure
            findings.append(_open_finding(f"{row['name']} #{row['iteration']}", where))
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
        tags = _tags(phases.loc[k, "tags"]) if "tags" in phases else []
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
    return _verdict(name, title, explanation, findings, "device memory" if tracks.gpu else "host RSS (no GPU columns)",
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
    after = track.value[_window(track, row["end"], row["end"] + th.offload_late_window_s)]
    later_low = min(_nanmin(after), at_end) if np.isfinite(_nanmin(after)) else at_end
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


# -- serialized peaks --------------------------------------------------------------------------
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
        return _na(name, title, explanation, "no phases in this run")
    train = inst[inst["name"] == names.OFFLOAD_TRAIN]["expected_bytes"].max()
    rollout_rows = inst[inst["name"].isin(_ROLLOUT_OFFLOADS)]
    rollout = rollout_rows.groupby("iteration")["expected_bytes"].sum(min_count=1).max() if len(rollout_rows) else np.nan
    if not (np.isfinite(train) and np.isfinite(rollout) and train > 0 and rollout > 0):
        return _na(name, title, explanation,
                   "needs expected_bytes of an offload_train and a rollout offload (runs without colocation offloads)")
    track = _Tracks(run).memory(main_pid(run))
    if track is None:
        return _na(name, title, explanation, "no memory series")
    floor = _nanmin(track.value[_window(track, inst["start"].min(), inst["end"].max())])
    findings = [_resident_finding(row, track, floor, train, rollout, share)
                for row in inst[inst["name"].isin([names.TRAIN, names.GENERATE])].itertuples()]
    findings = [f for f in findings if f is not None]
    if not findings:
        return _na(name, title, explanation, "no samples inside train or generate phases")
    return _verdict(name, title, explanation, findings, track.label,
                    "train/generate phases held one footprint at a time", "phases held both footprints")


def _resident_finding(row, track: Track, floor: float, train: float, rollout: float, share: float) -> Finding | None:
    window = _window(track, row.start, row.end)
    if window.stop <= window.start:
        return None
    iteration = int(getattr(row, "iteration", -1))
    where = dict(span=(row.start, row.end), phase=row.name, iteration=iteration)
    if _still_open(row):  # its lowest level may be still to come
        return _open_finding(f"{row.name} #{iteration}", where)
    gap = track.sample_gap(row.start, row.end, before=False)
    if gap:  # its lowest level may be in the samples not written yet
        return Finding("n/a", f"{row.name} #{iteration}: not judged, {gap}", **where)
    resident = _nanmin(track.value[window])
    own, other = (train, rollout) if row.name == names.TRAIN else (rollout, train)
    limit = floor + own + share * other
    numbers = dict(floor=floor, train_bytes=train, rollout_bytes=rollout, resident=resident, limit=limit,
                   peak=_nanmax(track.peak[window]), series=track.label)
    iteration = int(getattr(row, "iteration", -1))
    if resident >= limit:
        return Finding("fail", f"{row.name} #{iteration}: {gib(resident)} resident ≥ {gib(limit)}: both footprints "
                               "held at once", (row.start, row.end), row.name, iteration, numbers)
    return Finding("pass", f"{row.name} #{iteration}: {gib(resident)} resident < {gib(limit)} (floor {gib(floor)} + "
                           f"{'train' if row.name == names.TRAIN else 'rollout'} {gib(own)})",
                   (row.start, row.end), row.name, iteration, numbers)


# -- transition spikes -------------------------------------------------------------------------
def check_transition_spikes(run, th: Thresholds) -> CheckResult:
    name, title = "transition_spikes", "No spikes between phases"
    explanation = ("Between two consecutive phases the true peak may exceed the larger neighbour's peak by at most "
                   f"{th.transition_tolerance_share:.0%} of it plus {gib(th.transition_abs_bytes)}: a spike there "
                   "means two states coexisted during the hand-over.")
    inst = phase_instances(run)
    if len(inst) < 2:
        return _na(name, title, explanation, "fewer than two phases")
    tracks = _Tracks(run)
    findings = []
    for pid, group in inst[inst["depth"] == 0].sort_values("start").groupby("pid"):
        track = tracks.memory(int(pid))
        if track is None:
            continue
        rows = list(group.itertuples())
        for a, b in zip(rows, rows[1:]):
            if _still_open(a) or _still_open(b):
                continue  # an open neighbour's peak is not known yet
            gap = _window(track, a.end, b.start)
            if gap.stop <= gap.start:
                continue  # no sample between the phases: nothing happened outside them
            written = track.measured_times(peak=True)
            if not len(written) or written[-1] < b.end:  # b's peak may be in the samples not written yet
                findings.append(Finding("n/a", f"{a.name} → {b.name} (#{b.iteration}): not judged, the samples "
                                               "end before the phase after it does", (a.end, b.start), b.name,
                                        int(b.iteration)))
                continue
            spike = _nanmax(track.peak[gap])
            neighbours = np.fmax(_nanmax(track.peak[_window(track, a.start, a.end)]),
                                 _nanmax(track.peak[_window(track, b.start, b.end)]))
            if not (np.isfinite(spike) and np.isfinite(neighbours)):
                continue
            limit = neighbours * (1 + th.transition_tolerance_share) + th.transition_abs_bytes
            status = "fail" if spike > limit else "pass"
            findings.append(Finding(status, f"{a.name} → {b.name} (#{b.iteration}): peak {gib(spike)} between them, "
                                            f"neighbours {gib(neighbours)}",
                                    (a.end, b.start), b.name, int(b.iteration),
                                    dict(spike=spike, neighbours=neighbours, limit=limit, series=track.label)))
    if not findings:
        return _na(name, title, explanation, "no samples between consecutive phases")
    return _verdict(name, title, explanation, findings, "device memory" if tracks.gpu else "host RSS (no GPU columns)",
                    "phase boundaries without a spike", "boundaries spiked")


# -- host memory -------------------------------------------------------------------------------
def check_disk_offload_host_flat(run, th: Thresholds) -> CheckResult:
    name, title = "disk_offload_host_flat", "Disk offload keeps host RSS flat"
    explanation = ("An offload to disk must stream to the file, not stage the state in host memory: host RSS "
                   f"may rise by at most {th.host_flat_share:.0%} of expected_bytes plus {gib(th.host_flat_abs_bytes)}.")
    inst = phase_instances(run)
    phases = run.phases
    if inst.empty or "target" not in phases:
        return _na(name, title, explanation, "no offload with target='disk'")
    disk = inst[(phases["target"] == "disk").to_numpy() & inst["name"].str.startswith(names.OFFLOAD_PREFIX).to_numpy()]
    if disk.empty:
        return _na(name, title, explanation, "no offload with target='disk'")
    tracks = _Tracks(run)
    findings = []
    for row in disk.itertuples():
        track = tracks.host(int(row.pid))
        where = dict(span=(row.start, row.end), phase=row.name, iteration=int(row.iteration))
        if _still_open(row):
            findings.append(_open_finding(f"{row.name} #{row.iteration}", where))
            continue
        if track is None:
            findings.append(Finding("n/a", f"{row.name}: no host RSS", **where))
            continue
        gap = track.sample_gap(row.start, row.end, peak=True)
        if gap:
            findings.append(Finding("n/a", f"{row.name} #{row.iteration}: not judged, {gap}", **where))
            continue
        before = track.at_or_before(row.start)
        peak = _nanmax(track.peak[_window(track, row.start, row.end)])
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
    return _verdict(name, title, explanation, findings, "host RSS", "disk offloads kept host RSS flat",
                    "disk offloads staged in host memory")


_WEIGHT_MOVES = (names.UPDATE_WEIGHTS, names.ONLOAD_WEIGHTS)


def check_host_weight_copies(run, th: Thresholds) -> CheckResult:
    name, title = "host_weight_copies", "No second host copy of the weights"
    explanation = ("Moving weights (update_weights, onload_weights) must not materialize a whole extra copy in host "
                   f"memory: host RSS may grow by less than {th.weight_copy_share:.0%} of the weights' bytes "
                   "(expected_bytes of phases tagged 'weights').")
    if not run.gpu_indices:
        return _na(name, title, explanation, "not applicable on a CPU-only run: the weights live in host memory")
    inst = phase_instances(run)
    phases = run.phases
    if inst.empty or "tags" not in phases:
        return _na(name, title, explanation, "no phase tagged 'weights' with expected_bytes")
    tagged = np.array([names.WEIGHTS in _tags(v) for v in phases["tags"]], dtype=bool)
    weights = inst["expected_bytes"].to_numpy()[tagged]
    weights = weights[np.isfinite(weights)]
    if not len(weights):
        return _na(name, title, explanation, "no phase tagged 'weights' with expected_bytes")
    w = float(weights.max())
    moves = inst[inst["name"].isin(_WEIGHT_MOVES)]
    if moves.empty:
        return _na(name, title, explanation, "no update_weights or onload_weights phase")
    tracks = _Tracks(run)
    findings = []
    for row in moves.itertuples():
        track = tracks.host(int(row.pid))
        if track is None or _still_open(row):
            continue
        gap = track.sample_gap(row.start, row.end, peak=True)
        if gap:
            findings.append(Finding("n/a", f"{row.name} #{row.iteration}: not judged, {gap}",
                                    (row.start, row.end), row.name, int(row.iteration)))
            continue
        before = track.at_or_before(row.start)
        growth = _nanmax(track.peak[_window(track, row.start, row.end)]) - before
        if not np.isfinite(growth):
            continue
        findings.append(Finding("fail" if growth >= th.weight_copy_share * w else "pass",
                                f"{row.name} #{row.iteration}: host RSS grew {gib(growth)}, weights {gib(w)}",
                                (row.start, row.end), row.name, int(row.iteration),
                                dict(growth=growth, weights_bytes=w, series=track.label)))
    return _verdict(name, title, explanation, findings, "host RSS", "weight moves without an extra host copy",
                    "weight moves made a host copy")


# -- leak --------------------------------------------------------------------------------------
def check_leak(run, th: Thresholds) -> CheckResult:
    name, title = "leak", "No leak across iterations"
    explanation = ("The lowest level of each iteration must not grow: from the first iteration after warm-up to the "
                   f"last it may rise by at most {th.leak_share:.0%} of the peak plus {gib(th.leak_abs_bytes)}.")
    inst = phase_instances(run)
    if inst.empty:
        return _na(name, title, explanation, "no phases in this run")
    tracks = _Tracks(run)
    pid = main_pid(run)
    mine = inst[(inst["pid"] == pid) & (inst["iteration"] >= 0)]
    spans = mine.groupby("iteration").agg(start=("start", "min"), end=("end", "max")).sort_index()
    spans = spans.iloc[th.leak_skip_iterations:]
    # An unfinished iteration has not reached its floor yet: judging it would report a leak mid-run.
    spans = spans[~spans.index.isin(list(unfinished_iterations(run)))]
    if len(spans) < 2:
        return _na(name, title, explanation, f"needs at least {th.leak_skip_iterations + 2} finished iterations")
    findings = []
    for track in filter(None, (tracks.device(pid), tracks.host(pid))):
        written = track.measured_times()
        reached = written[-1] if len(written) else -np.inf  # an iteration past it has not its floor on disk
        floors = np.array([_nanmin(track.value[_window(track, s, e)]) if e <= reached else np.nan
                           for s, e in zip(spans["start"], spans["end"])])
        ok = np.isfinite(floors)
        if ok.sum() < 2:
            continue
        first, last = floors[ok][0], floors[ok][-1]
        limit = th.leak_share * _nanmax(track.peak) + th.leak_abs_bytes
        growth = last - first
        findings.append(Finding("fail" if growth > limit else "pass",
                                f"{track.name}: floor {gib(first)} → {gib(last)} over {int(ok.sum())} iterations "
                                f"(allowed growth {gib(limit)})",
                                (float(spans['start'].iloc[0]), float(spans['end'].iloc[-1])),
                                numbers=dict(floors=[float(f) for f in floors], growth=growth, limit=limit,
                                             series=track.label)))
    if not findings:
        return _na(name, title, explanation, "no memory series")
    return _verdict(name, title, explanation, findings, " and ".join(f.numbers["series"] for f in findings),
                    "series with a flat floor", "series leaked")


# -- headroom ----------------------------------------------------------------------------------
def _host_total(run) -> float:
    for process in run.processes:
        for probe in process.get("probes", []):
            if probe.get("name") == "host" and isinstance(probe.get("total"), (int, float)):
                return float(probe["total"])
    return float("nan")


def check_headroom(run, th: Thresholds) -> CheckResult:
    name, title = "headroom", "Headroom against the device total"
    explanation = (f"The highest true peak must stay below {th.headroom_max_share:.0%} of the device's total memory "
                   "(on a run without GPU columns: of the host's), so the next, slightly larger batch does not OOM.")
    from miles_profile.report.series import pids_with, series_arrays
    findings = []
    for device in run.devices if run.gpu_indices else []:
        i = int(device.get("index", -1))
        total = device.get("total")
        columns = [c for c in (f"gpu{i}_used", f"gpu{i}_alloc_peak", f"gpu{i}_reserved") if pids_with(run, c)]
        if not columns or not isinstance(total, (int, float)) or total <= 0:
            continue
        # an engine server's samples in an actor's view (fleet_report) are its engine's to judge, not its own
        peers = {p.get("pid") for p in run.processes if p.get("view_peer")}
        owners = {c: [p for p in pids_with(run, c) if p not in peers][:8] for c in columns}
        if not any(owners.values()):
            continue
        peak = max(_nanmax(series_arrays(run, p, c)[1]) for c in columns for p in owners[c])
        findings.append(_headroom_finding(f"GPU {i}", peak, float(total), th))
    if not run.gpu_indices:
        total = _host_total(run)
        column = "rss_peak" if pids_with(run, "rss_peak") else "rss"
        peaks = [_nanmax(series_arrays(run, p, column)[1]) for p in pids_with(run, column)]
        if peaks and np.isfinite(total):
            findings.append(_headroom_finding("host", max(peaks), total, th))
    if not findings:
        why = ("host total unknown (no host probe in meta)" if not run.gpu_indices
               else "device totals unknown (no NVML devices in meta)" if not run.devices
               else "device totals not recorded (an import: NVML used without the total)")
        return _na(name, title, explanation, why)
    t = run.samples["t"]
    span = (float(t.iloc[0]), float(t.iloc[-1])) if len(t) else None
    for f in findings:
        f.span = span
    return _verdict(name, title, explanation, findings, "GPU" if run.gpu_indices else "host RSS (no GPU columns)",
                    "of the memories checked kept headroom", "memories near their total")


def _headroom_finding(what: str, peak: float, total: float, th: Thresholds) -> Finding:
    share = peak / total
    return Finding("fail" if share > th.headroom_max_share else "pass",
                   f"{what}: peak {gib(peak)} of {gib(total)} ({share:.0%})",
                   numbers=dict(peak=peak, total=total, share=share))


CHECKS: tuple[Callable[[Any, Thresholds], CheckResult], ...] = (
    check_offload_drop, check_serialized_peaks, check_transition_spikes, check_disk_offload_host_flat,
    check_host_weight_copies, check_leak, check_headroom,
)


def run_checks(run, thresholds: Thresholds | None = None) -> list[CheckResult]:
    th = thresholds or Thresholds()
    return [check(run, th) for check in CHECKS]


def results_frame(results: list[CheckResult], t0: float = 0.0) -> pd.DataFrame:
    """The checks as a table: check, status, summary, span (seconds since t0)."""
    return pd.DataFrame([{
        "check": r.name, "status": r.status, "summary": r.summary,
        "span_s": "" if r.span is None else f"{r.span[0] - t0:.2f}–{r.span[1] - t0:.2f}",
    } for r in results])
