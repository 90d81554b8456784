"""serialized_peaks: with colocation, the training and rollout footprints are never resident at once.

Judged on the memory the footprints live in: the bytes the caching allocator has allocated to tensors on
CUDA, not what it reserves (a cache the program never emptied, e.g. the fp32 blocks left by building a model
in fp32 and casting it to bf16, holds no footprint: the next phase reuses it; offload_drop judges a cache
that was not returned), and not NVML (memory
outside it, the CUDA context, lazily loaded kernels and library handles, holds neither footprint and
grows through the first iteration: 0.598 -> 0.811 GiB of NVML per process on the H200 tiny run, above
the run's floor taken before it grew), host RSS on a run without GPU columns. Where torch_memory_saver
pauses memory, each series overstates in its own way (the allocator may still count a paused tensor;
NVML counts that context growth: 610 -> 808 MiB outside the allocator in the first iteration of the tiny
preset on the H200 with a torch_memory_saver engine, which failed two train phases on NVML alone), so a
phase is judged on both and fails only where both show the excess; the finding reported is the one of the
series with the smaller excess.
"""
from __future__ import annotations

import numpy as np

from miles_profile import names
from miles_profile.names import instance_label
from miles_profile.runmodel.series import Track, device_track, main_pid
from miles_profile.runmodel.stats import phase_instances
from miles_profile.verdicts.common import (
    Tracks,
    nanmax,
    nanmin,
    not_applicable,
    open_finding,
    size,
    still_open,
    too_small,
    track_resolution,
    verdict,
    window,
)
from miles_profile.verdicts.types import TOO_SMALL, CheckResult, Finding, Thresholds, gib

_ROLLOUT_OFFLOADS = (names.OFFLOAD_ROLLOUT, names.OFFLOAD_KV, names.OFFLOAD_WEIGHTS)


def check_serialized_peaks(run, th: Thresholds) -> CheckResult:
    name, title = "serialized_peaks", "Training and rollout peaks serialized"
    share = th.serialized_overlap_share
    explanation = ("With colocation the training state and the rollout engine's memory (sizes from the "
                   "expected_bytes of offload_train and of the rollout offloads) must never be resident at once. "
                   "A phase's resident memory is its lowest level (at its start or sampled inside), so a train "
                   "phase's activations don't count: fail when a train phase never fell below floor + training "
                   f"bytes + {share:.0%} of the rollout bytes, or a generate phase below floor + rollout bytes + "
                   f"{share:.0%} of the training bytes. The excess over floor + own footprint is blamed on both "
                   f"footprints only when it is about the other footprint's size (within "
                   f"{1 - th.offload_min_drop_share:.0%} of it); otherwise it is a residual (see offload_drop and "
                   "leak). Below the series' resolution a comparison is too small to judge.")
    inst = phase_instances(run)
    if inst.empty:
        return not_applicable(name, title, explanation, "no phases in this run")
    train = inst[inst["name"] == names.OFFLOAD_TRAIN]["expected_bytes"].max()
    rollout_rows = inst[inst["name"].isin(_ROLLOUT_OFFLOADS)]
    rollout = rollout_rows.groupby("iteration")["expected_bytes"].sum(min_count=1).max() if len(rollout_rows) else np.nan
    if not (np.isfinite(train) and np.isfinite(rollout) and train > 0 and rollout > 0):
        return not_applicable(name, title, explanation,
                   "needs expected_bytes of an offload_train and a rollout offload (runs without colocation offloads)")
    pid = main_pid(run)
    tracks = _footprint_tracks(run, Tracks(run), pid)
    if not tracks:
        return not_applicable(name, title, explanation, "no memory series")
    jump = th.serialized_overlap_share * min(train, rollout)
    floors = [_iteration_floors(inst, track, jump) for track in tracks]
    findings = []
    for row in inst[inst["name"].isin([names.TRAIN, names.GENERATE])].itertuples():
        judged = [_resident_finding(row, track, dict(floor=floor.get(int(row.iteration), np.nan), train=train,
                                                     rollout=rollout, resolution=track_resolution(track)), th, run)
                  for track, floor in zip(tracks, floors)]
        judged = [f for f in judged if f is not None]
        if judged:
            findings.append(min(judged, key=_severity))
    if not findings:
        return not_applicable(name, title, explanation, "no samples inside train or generate phases")
    return verdict(name, title, explanation, findings, " and ".join(t.label for t in tracks),
                   "train/generate phases held one footprint at a time", "phases held more than one footprint")


_RANK = {"pass": 0, TOO_SMALL: 1, "fail": 3}


def _severity(finding: Finding) -> tuple[int, float]:
    """Order of a phase's findings on its series: the mildest first, a smaller excess first among equals
    (a fail needs every series to show it); a finding not judged ranks between too small and fail."""
    numbers = finding.numbers or {}
    excess = numbers.get("resident", np.nan) - numbers.get("limit", np.nan)
    return _RANK.get(finding.status, 2), excess if np.isfinite(excess) else np.inf


def _iteration_floors(inst, track: Track, jump: float) -> dict[int, float]:
    """Per iteration, the floor its phases are judged above: its own lowest level, so that a floor creeping
    up from one iteration to the next stays the leak check's to judge (against the run's first floor, a
    leaking HF loop's train phases said 'both footprints' once the leak reached the rollout footprint's
    size); but the iteration before's when the floor jumped by `jump` or more, which a footprint held
    through a whole iteration does (the setup iteration, before the engine loads, for the first)."""
    spans = inst.groupby("iteration").agg(start=("start", "min"), end=("end", "max")).sort_index()
    own = [nanmin(track.value[window(track, s, e)]) for s, e in zip(spans["start"], spans["end"])]
    return {int(i): own[k - 1] if k and own[k] - own[k - 1] >= jump else own[k] for k, i in enumerate(spans.index)}


def _footprint_tracks(run, tracks: Tracks, pid) -> list[Track]:
    """Where the footprints live: allocator reserved (else allocated) on CUDA, and NVML besides where
    memory is paused by torch_memory_saver (the allocator may still count a paused tensor), host RSS
    without GPUs."""
    if not tracks.gpu:
        return [t for t in (tracks.host(pid),) if t is not None]
    allocator = device_track(run, pid, ("alloc", "reserved"))
    if _pauses_memory(run, pid):
        found = [tracks.driver(pid) or tracks.device(pid), allocator]
    else:
        found = [allocator or tracks.device(pid)]
    unique = []
    for track in found:
        if track is not None and all(track.label != t.label for t in unique):
            unique.append(track)
    return unique


def _pauses_memory(run, pid) -> bool:
    phases = run.phases
    if "backend" in phases and (phases["backend"] == names.TORCH_MEMORY_SAVER).any():
        return True
    notes = next((p.get("annotations") or {} for p in run.processes if p.get("pid") == pid), {})
    return names.TORCH_MEMORY_SAVER in [v for v in notes.values() if isinstance(v, str)]


def _resident_finding(row, track: Track, fp: dict, th: Thresholds, run) -> Finding | None:
    inside = window(track, row.start, row.end)
    if inside.stop <= inside.start:
        return None
    iteration = int(getattr(row, "iteration", -1))
    label = instance_label(row.name, iteration)
    where = dict(span=(row.start, row.end), phase=row.name, iteration=iteration)
    if still_open(row):  # its lowest level may be still to come
        return open_finding(label, where, run, int(row.pid))
    gap = track.sample_gap(row.start, row.end, before=False)
    if gap:  # its lowest level may be in the samples not written yet
        return Finding("n/a", f"{label}: not judged, {gap}", **where)
    # the level entering the phase counts too: a short phase's samples may all hold its working memory
    resident = np.fmin(nanmin(track.value[inside]), track.at_or_before(row.start))
    is_train = row.name == names.TRAIN
    own, other = (fp["train"], fp["rollout"]) if is_train else (fp["rollout"], fp["train"])
    own_name, other_name = ("train", "rollout") if is_train else ("rollout", "train")
    share, res = th.serialized_overlap_share, fp["resolution"]
    limit = fp["floor"] + own + share * other
    excess = resident - fp["floor"] - own  # above one footprint
    numbers = dict(floor=fp["floor"], train_bytes=fp["train"], rollout_bytes=fp["rollout"], resident=resident,
                   limit=limit, excess=excess, peak=nanmax(track.peak[inside]), series=track.label)
    judged = dict(numbers=numbers, series=track.label, resolution=res, **where)
    if share * other < res:  # the other footprint cannot be told from the series' noise
        return too_small(label, f"{share:.0%} of the {other_name} footprint,", share * other, res, track.label,
                         where, numbers)
    if resident < limit:
        return Finding("pass", f"{label}: {gib(resident)} resident < {gib(limit)} (floor {gib(fp['floor'])} + "
                               f"{own_name} {gib(own)})", **judged)
    if resident - limit < res:
        return too_small(label, "the excess over the limit,", resident - limit, res, track.label, where, numbers)
    band = 1 - th.offload_min_drop_share
    if abs(excess - other) <= band * other:
        return Finding("fail", f"{label}: {gib(resident)} resident ≥ {gib(limit)}: both footprints held at once "
                               f"({size(excess)} above floor + {own_name}, the {other_name} footprint is "
                               f"{size(other)})", cause="both_footprints", **judged)
    return Finding("fail", f"{label}: {gib(resident)} resident ≥ {gib(limit)}: {size(excess)} above one footprint "
                           f"(floor + {own_name}), not the {other_name} footprint's {size(other)}: a residual, see "
                           "offload_drop and leak", cause="residual", **judged)
