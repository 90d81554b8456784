"""offload_drop: after each offload_* phase, judge what remains, on two series separately
(offload_series.py): the declared tensors left the allocator (allocated), and the memory went back to
the driver (NVML per process, else reserved; RSS on CPU), so that freed cache cannot hide a residual.

Causes (verdicts/types.py CAUSES): allocated kept more than the tolerance -> `still_referenced`;
allocated fell, the driver's series did not -> `cached_not_returned`; the drop came only in the next
phase of the same process -> `freed_late`; neither inside nor in the next phase -> `never_freed`
(`paused_not_released` for a torch_memory_saver pause). Below a series' resolution: too small to judge.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from miles_profile import names
from miles_profile.names import instance_label
from miles_profile.runmodel.engine_server import engine_of, holder_track, moves_rollout
from miles_profile.runmodel.stats import phase_instances
from miles_profile.verdicts.common import (
    not_applicable,
    open_finding,
    still_open,
    tags_of,
    verdict,
)
from miles_profile.verdicts.offload_late import LateWindow, ambiguity, late_drop, late_or_own, late_windows
from miles_profile.verdicts.offload_series import (
    ALLOCATED,
    DRIVER,
    LEVEL,
    OffloadSeries,
    offload_series,
    pids_with_heap,
)
from miles_profile.verdicts.resolution import resolution_of
from miles_profile.verdicts.types import (
    TOO_SMALL,
    WARN,
    CheckResult,
    Finding,
    Thresholds,
    gib,
)

PASS, LATE, KEPT, NOT_JUDGED, NOISE, AMBIGUOUS = "pass", "late", "kept", "n/a", "noise", "ambiguous"


@dataclass
class Reading:
    """One series around one offload: its levels, and what they say."""
    series: OffloadSeries
    outcome: str = NOT_JUDGED           # PASS, LATE, KEPT, NOISE (within the series' noise), AMBIGUOUS (a late fall
    #                                     the next phase's own doing may explain), TOO_SMALL or NOT_JUDGED
    note: str = ""                      # why not judged, or what was too small
    before: float = np.nan
    at_end: float = np.nan
    later_low: float = np.nan
    residual: float = np.nan            # declared bytes still there at the phase's end
    late: float = np.nan                # bytes gone by the end of the late window (offload_late.py)
    own_doing: str = ""                 # what of the next phase's own doing was taken out of `late`

    @property
    def inside(self) -> float:
        return self.before - self.at_end

    @property
    def label(self) -> str:
        return self.series.track.label


def check_offload_drop(run, th: Thresholds) -> CheckResult:
    name, title = "offload_drop", "Offload drops memory"
    explanation = (f"After each offload_* phase judge what remains, separately on what the allocator holds "
                   f"(allocated; glibc's heap on CPU) and on what the driver holds (NVML per process, else reserved; "
                   f"RSS on CPU): each must fall by more than {th.offload_min_drop_share:.0%} of the phase's "
                   f"expected_bytes inside the phase. A drop that comes only in the next phase of the same process "
                   f"is 'freed late' (the 'OOM at wake-up' story). torch_memory_saver pauses are invisible to the "
                   f"allocator's counters: judged on NVML alone. Below a series' resolution: too small to judge.")
    inst = phase_instances(run)
    offloads = inst[inst["name"].str.startswith(names.OFFLOAD_PREFIX)] if len(inst) else inst
    if offloads.empty:
        return not_applicable(name, title, explanation, "no offload_* phase in this run")
    late = late_windows(inst, max(int(th.offload_late_phases), 0))
    findings = [_offload_finding(run, k, row, late[k], th) for k, row in offloads.iterrows()]
    findings = _swapped_references(offloads, findings)
    return verdict(name, title, explanation, findings, _series_text(run),
                   "offloads dropped what they moved", "offloads did not drop what they declared in time")


def _swapped_references(offloads, findings: list[Finding]) -> list[Finding]:
    """A reference swapped each iteration (the new state kept, the previous one dropped) frees the old copy
    inside each later offload, so those pass on their drop alone while the declared bytes stay resident.
    After an instance of an offload that kept them (still_referenced, never_freed), each later instance of
    the same offload in the same process whose allocated level (heap on CPU) ends no lower than that one's,
    less what it needed to drop, left its declared bytes resident too: it fails (issue 30)."""
    out = list(findings)
    # the start times as one array, a row read only where a finding is compared (a row of this frame per
    # offload, twice, was a fifth of the check on 1,440 offloads)
    starts = offloads["start"].to_numpy(dtype=float)
    order = sorted(range(len(out)), key=lambda k: starts[k])
    kept: dict[tuple, tuple[float, str]] = {}
    for k in order:
        f = out[k]
        after = f.numbers.get(f"{ALLOCATED}_after")
        if after is None or not np.isfinite(after):
            continue
        row = offloads.iloc[k]
        key = (int(row["pid"]), str(row["name"]))
        if f.status == "fail" and f.cause in ("still_referenced", "never_freed"):
            kept.setdefault(key, (float(after), instance_label(row["name"], row["iteration"])))
        elif f.status == "pass" and key in kept and after > kept[key][0] - f.numbers.get("needed", 0.0):
            level, first = kept[key]
            label = instance_label(row["name"], row["iteration"])
            # what it freed is what its level ends below the one that kept them, not the old copy's drop: the
            # first screen's "freed X of Y declared" read 77 of 77 MiB beside "6 FAILED" (a peft LoRA loop)
            freed = max(0.0, level - after)
            numbers = {**f.numbers, "freed": freed}
            out[k] = replace(f, status="fail", cause="still_referenced", numbers=numbers, message=(
                f"{label}: the declared bytes stayed resident: it dropped {gib(f.numbers.get('dropped_alloc', 0.0))}, "
                f"but its allocated level ends at {gib(after)}, no lower than {first}'s {gib(level)}, which kept "
                f"them: the previous copy was freed and the new one kept (a reference swapped each iteration)"))
    return out


def _series_text(run) -> str:
    if run.gpu_indices:
        return "allocator allocated and the driver's series (NVML per process, else allocator reserved)"
    return "glibc heap and host RSS" if pids_with_heap(run) else "host RSS (no GPU columns)"


def _offload_finding(run, k, row, late: LateWindow, th: Thresholds) -> Finding:
    phases = run.phases
    label = instance_label(row['name'], row['iteration'])
    where = dict(span=(row["start"], row["end"]), phase=row["name"], iteration=int(row["iteration"]))
    expected = row["expected_bytes"]
    if still_open(row):  # its memory may not be released yet: that is no failure
        return open_finding(label, where, run, int(row["pid"]))
    if not (np.isfinite(expected) and expected > 0):
        return Finding("n/a", f"{label}: no expected_bytes", **where)
    target = phases.loc[k, "target"] if "target" in phases else None
    if not run.gpu_indices and target == "cpu":
        return Finding("n/a", f"{label}: moves to CPU memory on a CPU-only run, nothing measurable is freed", **where)
    pid = int(row["pid"])
    backend = _backend(run, phases, k, pid)
    paused = bool(run.gpu_indices) and backend == names.TORCH_MEMORY_SAVER
    tags = tags_of(phases.loc[k, "tags"]) if "tags" in phases else []
    holder = engine_of(run.processes, _meta(run, pid)) if moves_rollout(tags) else None
    unread = (_meta(run, pid) or {}).get("engine_unreadable") if moves_rollout(tags) and holder is None else None
    if unread:  # the engine server that holds it may be a process whose meta is unreadable: not this one's memory
        return Finding("n/a", f"{label}: not judged, its engine server is unknown (pid "
                              f"{', '.join(map(str, unread[:3]))} on this host has no readable meta)", **where)
    series = _holder_series(run, holder, paused) if holder is not None else offload_series(run, pid, paused)
    if not series:
        return Finding("n/a", f"{label}: no memory series for its process"
                              + (" that sees a torch_memory_saver pause (NVML)" if paused else ""), **where)
    need = th.offload_min_drop_share * expected
    readings = [_read(s, row["start"], row["end"], late, expected, need) for s in series]
    finding = _combine(readings, label, expected, need, paused, where, th)
    finding.numbers.update(backend=backend, next_phase=late.next_phase, late_window_end=late.end)
    if paused:
        finding.message += " (torch_memory_saver: judged on NVML; the allocator's counters do not see a pause)"
    if holder is not None:  # say where it was judged: not the declaring process's own memory
        finding.message += f" (judged on the engine server that holds it, pid {int(holder['pid'])})"
        finding.numbers["holder_pid"] = int(holder["pid"])
    return finding


def _holder_series(run, holder: dict, paused: bool) -> list[OffloadSeries]:
    """The engine server's own series, else NVML used of its GPU from the host sampler."""
    own = offload_series(run, int(holder["pid"]), paused, others=False)
    if own:
        return own
    used = holder_track(run, None, holder)
    if used is None:
        return []
    keep = np.isfinite(used.value)
    track = type(used)(used.name, used.label, used.pid, used.t[keep], used.value[keep], used.value[keep])
    return [OffloadSeries(LEVEL, track, ("used",), resolution_of("used"), False)]


def _read(s: OffloadSeries, start: float, end: float, late: LateWindow, expected: float, need: float) -> Reading:
    track = s.track
    gap = _gap(s, start, end)
    if gap:
        return Reading(s, note=f"not judged, {gap}")
    r = Reading(s, before=track.at_or_before(start), at_end=track.at_or_before(end))
    # the next phase's own doing adds up only on what tensors hold: on the driver's series its allocations
    # reuse cached blocks first (an onload after an offload that kept its cache rose by less: no late free)
    own = late if s.role == ALLOCATED else replace(late, own=())
    r.late, r.own_doing = late_drop(track, r.before, r.at_end, end, own, s.resolution)
    r.later_low = r.before - r.late
    r.residual = max(expected - max(r.inside, 0.0), 0.0)
    if expected < s.resolution:
        r.outcome, r.note = TOO_SMALL, f"expected {gib(expected)} below the resolution {gib(s.resolution)} of {r.label}"
    elif r.inside > need:
        r.outcome = PASS
        if r.inside < s.resolution:  # above the share, but no drop this series can tell from its noise
            r.outcome, r.note = NOISE, (f"dropped {gib(r.inside)}, under the resolution {gib(s.resolution)} of "
                                        f"{r.label}: too small to tell from noise")
    elif max(r.residual, need - r.inside) < s.resolution:  # the shortfall (need > expected when a share > 1)
        short = max(r.residual, need - r.inside)
        r.outcome, r.note = TOO_SMALL, f"{gib(short)} left below the resolution {gib(s.resolution)} of {r.label}"
    elif need - r.inside < s.resolution and not r.late > need:
        # short of the share by less than the series resolves: neither a clear pass nor a clear failure
        r.outcome, r.note = NOISE, (f"dropped {gib(r.inside)}, {gib(need - r.inside)} short of the {gib(need)} "
                                    f"needed: within the resolution {gib(s.resolution)} of {r.label}")
    elif r.late > need and late_or_own(late, r.late, r.inside, expected, need, s.resolution):
        r.outcome, r.note = AMBIGUOUS, ambiguity(late, r.late, r.inside, expected, r.label)
    else:
        r.outcome = LATE if r.late > need else KEPT
    return r


def _gap(s: OffloadSeries, start: float, end: float) -> str | None:
    gap = s.track.sample_gap(start, end)
    if gap and s.boundary_only and gap.startswith("the samples end"):
        # Read at phase boundaries only: the last read is this phase's own end row, just before its end event.
        t = s.track.measured_times()
        if t[0] <= start < t[-1] <= end:
            return None
    return gap


def _host_retention(readings: list[Reading]) -> None:
    """On the host, RSS cannot tell a kept reference from glibc keeping freed pages (a freed block below
    its mmap threshold, up to 32 MiB, or one served from free space inside the heap, stays resident), nor
    an offload's late free from the next phase's own frees: RSS never fails an offload. Beside the heap
    probe it is a note (the heap says whether the tensors went, and when); alone it is not judged."""
    for r in readings:
        if r.series.track.name == "host" and r.series.role in (DRIVER, LEVEL) and r.outcome in (KEPT, LATE, NOISE,
                                                                                                 AMBIGUOUS):
            r.outcome = NOT_JUDGED
            r.note = (f"RSS fell {gib(r.inside)} inside the phase: glibc may keep freed memory resident and free "
                      "other memory later, so RSS cannot tell a kept reference or a late free from retention"
                      + ("" if r.series.role == DRIVER else "; record with --heap to judge the heap"))


def _combine(readings: list[Reading], label: str, expected: float, need: float, paused: bool, where: dict,
             th: Thresholds) -> Finding:
    _host_retention(readings)
    by_role = {r.series.role: r for r in readings}
    held = by_role.get(ALLOCATED) or by_role.get(LEVEL)
    driver = by_role.get(DRIVER)
    numbers = dict(expected_bytes=expected, declared=expected, needed=need)
    for r in readings:
        numbers.update({f"{r.series.role}_{key}": value for key, value in (
            ("series", r.label), ("before", r.before), ("after", r.at_end), ("later_low", r.later_low),
            ("dropped", r.inside), ("residual", r.residual), ("resolution", r.series.resolution),
            ("outcome", r.outcome))})
    # what report/summary.py reads for the bytes measured gone on each question
    numbers.update({key: r.inside for key, r in (("dropped_alloc", held), ("dropped_driver", driver)) if r is not None})
    failing = next((r for r in (held, driver) if r is not None and r.outcome in (LATE, KEPT, AMBIGUOUS)), None)
    if failing is not None and failing.outcome == AMBIGUOUS:  # never a FAIL, never a pass credited to it
        numbers.update(late_fall=failing.late)
        return _finding(WARN, f"{label}: {failing.note}", failing, numbers, where, "late_or_own_free")
    if failing is not None:
        cause = _cause(failing, held, paused)
        if cause == "cached_not_returned" and _fragmented(failing, held, expected):
            stuck = max(min(held.inside, expected) - failing.inside, 0.0)
            numbers.update(stuck=stuck)
            return _finding(WARN, _fragmentation_message(failing, held, label, stuck), failing, numbers, where,
                            "fragmentation")
        return _finding("fail", _failure_message(cause, failing, held, label, expected, need, th), failing,
                        numbers, where, cause)
    passed = [r for r in readings if r.outcome == PASS]
    if passed:
        least = min(passed, key=lambda r: r.inside)
        notes = [f"{r.label}: {r.note}" if r.outcome == NOT_JUDGED else r.note if r.outcome == NOISE
                 else f"too small to judge ({r.note})"
                 for r in readings if r.outcome != PASS]
        drops = ", ".join(f"{_word(r)} {gib(r.inside)}" for r in passed)
        message = f"{label}: dropped {gib(least.inside)} of {gib(expected)} expected ({drops})"
        return _finding("pass", message + "".join(f"; {n}" for n in notes), least, numbers, where, None,
                        series=" and ".join(r.label for r in passed),
                        resolution=max(r.series.resolution for r in passed))
    noisy = [r for r in readings if r.outcome == NOISE]
    if noisy:  # a drop within noise (issue 30): ambiguous evidence, a WARN with its reason
        return _finding(WARN, f"{label}: a drop within noise ({noisy[0].note})", noisy[0], numbers, where,
                        "within_noise")
    small = [r for r in readings if r.outcome == TOO_SMALL]
    if small:
        return _finding(TOO_SMALL, f"{label}: too small to judge ({small[0].note})", small[0], numbers, where, None)
    first = readings[0]
    return Finding("n/a", f"{label}: {first.note}", numbers=dict(numbers, series=first.label), **where)


def _cause(failing: Reading, held: Reading | None, paused: bool) -> str:
    if failing.outcome == LATE:
        return "freed_late"
    if failing.series.role == ALLOCATED:
        return "still_referenced"
    if failing.series.role == DRIVER and held is not None and held.outcome == PASS:
        return "cached_not_returned"
    return "paused_not_released" if paused else "never_freed"


# The driver's series fell by at least this share of the declared bytes (and FRAGMENT_RESOLUTIONS times its
# resolution): the cache was returned (torch.cuda.empty_cache(); the allocator returns nothing by itself),
# and what stayed is held by segments that still hold live blocks (issue 30, class 8: a healthy disk offload,
# allocated fell by 3.0 GiB, NVML by 2.1 GiB, was told to call the empty_cache() it had called).
FRAGMENT_SHARE, FRAGMENT_RESOLUTIONS = 0.25, 4.0


def _fragmented(driver: Reading, held: Reading | None, expected: float) -> bool:
    return (driver.series.track.name == "device" and held is not None
            and driver.inside >= max(FRAGMENT_SHARE * expected, FRAGMENT_RESOLUTIONS * driver.series.resolution))


def _fragmentation_message(r: Reading, held: Reading, label: str, stuck: float) -> str:
    return (f"{label}: fragmentation: the cache was returned ({_word(r)} fell by {gib(r.inside)}), but "
            f"{gib(stuck)} of the {gib(held.inside)} allocated freed stays in segments that still hold live blocks "
            "(a WARN: the offload freed its tensors; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True returns "
            "such memory)")


def _word(r: Reading) -> str:
    kinds = {c.split("_", 1)[1] if c.startswith("gpu") else c for c in r.series.columns}
    if r.series.role == ALLOCATED:
        return "allocated" if "alloc" in kinds else "heap"
    return "RSS" if "rss" in kinds else ("NVML" if kinds & {"proc", "boundary_proc", "used", "boundary_used"}
                                         else "reserved")


def _failure_message(cause: str, r: Reading, held: Reading | None, label: str, expected: float, need: float,
                     th: Thresholds) -> str:
    short = f"dropped {gib(r.inside)}, expected more than {gib(need)} ({th.offload_min_drop_share:.0%} of {gib(expected)})"
    gpu = r.series.track.name == "device"
    own = f"; {r.own_doing}" if r.own_doing else ""
    if cause == "still_referenced":
        what = "allocated" if gpu else "the glibc heap"
        return f"{label}: tensors still referenced ({what} kept {gib(r.residual)}; {short}{own})"
    if cause == "cached_not_returned":
        if gpu:
            return (f"{label}: cached, not returned to the driver: call torch.cuda.empty_cache() (allocated fell by "
                    f"{gib(held.inside)}, {_word(r)} by only {gib(r.inside)} of {gib(expected)} expected)")
        return (f"{label}: freed, not returned to the OS: glibc kept the pages (heap fell by {gib(held.inside)}, "
                f"RSS by only {gib(r.inside)} of {gib(expected)} expected; malloc_trim(0) returns them)")
    if cause == "freed_late":
        return (f"{label}: returned having dropped {gib(r.inside)} ({_word(r)}); {gib(r.late)} was freed only after "
                f"the phase ended, in the next phase (expected {gib(expected)} inside{own})")
    if cause == "paused_not_released":
        return f"{label}: the torch_memory_saver pause did not return the memory to the driver ({short})"
    return f"{label}: never freed, neither inside the phase nor in the next one ({_word(r)} {short}{own})"


def _finding(status, message: str, r: Reading, numbers: dict, where: dict, cause: str | None, *,
             series: str | None = None, resolution: float | None = None) -> Finding:
    numbers = dict(numbers, series=series or r.label, before=r.before, at_end=r.at_end, later_low=r.later_low,
                   dropped_inside=r.inside, residual=r.residual)
    return Finding(status, message, numbers=numbers, cause=cause, series=series or r.label,
                   resolution=resolution if resolution is not None else r.series.resolution, **where)


def _meta(run, pid: int) -> dict | None:
    return next((p for p in run.processes if p.get("pid") == pid), None)


def _backend(run, phases, k, pid: int) -> str:
    """The phase's `backend` attribute, else torch_memory_saver when its process's annotations name it."""
    value = phases.loc[k, "backend"] if "backend" in phases else None
    if isinstance(value, str):
        return value
    notes = next((p.get("annotations", {}) for p in run.processes if p.get("pid") == pid), {})
    return names.TORCH_MEMORY_SAVER if names.TORCH_MEMORY_SAVER in notes.values() else names.BUILTIN
