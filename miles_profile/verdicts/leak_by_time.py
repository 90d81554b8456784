"""leak, for a run without phases (nothing tagged its iterations): the floor judged over windows of time.

The main process's series (device, host RSS) is cut into equal windows of time, each read at least
`leak_min_reads` times (at most MAX_WINDOWS of them); the first WARMUP_SHARE of the run and the first
`leak_skip_iterations` windows after it are warm-up (imports, model building: a floor that rises while a
program starts is no leak), and the last TEARDOWN_SHARE is its end (what a program frees as it exits
would hide what it held). Each window's lowest level is a floor, judged by `trend.judge_floors` with the
same evidence rules as floors per iteration (a Theil-Sen trend and its 95% interval; a one-time step and
growth that stopped pass), its rates per minute.
"""
from __future__ import annotations

import numpy as np

from miles_profile.runmodel.series import Track, main_pid
from miles_profile.verdicts.common import Tracks, nanmax, not_applicable, verdict
from miles_profile.verdicts.leak import _columns_of, iteration_floors
from miles_profile.verdicts.resolution import resolution_of
from miles_profile.verdicts.trend import judge_floors, step_cause_of
from miles_profile.verdicts.types import TOO_SMALL, WARN, CheckResult, Finding, Thresholds, gib

MAX_WINDOWS = 30
WARMUP_SHARE = 0.2   # of the recorded time: start-up (imports, model building), before the first window judged
TEARDOWN_SHARE = 0.1  # and after the last: the end of training and the interpreter's exit free what was held
JUDGED_BY = "time"   # a finding's numbers["judged_by"]: windows of time, not iterations
# Judged over fewer seconds than this, a rise fails only where the floor rose in every window: a Ray driver
# that crashed 7 s in climbed while importing, stepped once at ray.init and stayed flat between
# ([213, 235, 257, 268, 268, 306, 312] MiB): "+1494 MiB/min, sustained growth" was a false cause.
SHORT_RUN_SECONDS = 30.0


def time_windows(track: Track, th: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of equal windows of time after the warm-up, each holding >= `leak_min_reads` reads."""
    written = track.measured_times()
    with np.errstate(invalid="ignore"):  # a process tree reads 0 once the program has ended
        alive = track.t[np.isfinite(track.value) & (track.value > 0)]
    if len(alive) < 2:
        return np.empty(0), np.empty(0)
    first, last = float(alive[0]), float(alive[-1])
    begin, last = first + WARMUP_SHARE * (last - first), last - TEARDOWN_SHARE * (last - first)
    reads = int(np.count_nonzero((written > begin) & (written <= last)))
    count = min(MAX_WINDOWS, reads // th.leak_min_reads)
    if count < 1:
        return np.empty(0), np.empty(0)
    edges = np.linspace(begin, last, count + 1)
    return edges[:-1][th.leak_skip_iterations:], edges[1:][th.leak_skip_iterations:]


def judge_track_by_time(track: Track, th: Thresholds) -> Finding:
    starts, ends = time_windows(track, th)
    floors = iteration_floors(track, starts, ends, th)
    t0 = float(track.measured_times()[0]) if len(track.measured_times()) else 0.0
    minutes = ((starts + ends) / 2 - t0) / 60.0   # each window's middle, in minutes since the first reading
    resolution = resolution_of(_columns_of(track))
    allowed = th.leak_share * nanmax(track.peak) + max(th.leak_abs_bytes, th.leak_resolution_multiple * resolution)
    seconds = float(ends[0] - starts[0]) if len(starts) else 0.0
    judged = judge_floors(minutes, floors, resolution=resolution, allowed=allowed,
                          min_iterations=th.leak_min_iterations, unit="min",
                          step_cause=step_cause_of("host" if track.name == "host" else "device", offloads=False),
                          over=f"{np.isfinite(floors).sum()} windows of {seconds:.1f} s")
    text = judged.text.replace(f"needs {th.leak_min_iterations} iterations", f"needs {th.leak_min_iterations} windows")
    span = (float(starts[0]), float(ends[-1])) if len(starts) else None
    status, cause = (TOO_SMALL if judged.status == "too small to judge" else judged.status), judged.cause
    judged_seconds = span[1] - span[0] if span else 0.0
    finite = floors[np.isfinite(floors)]
    if status == "fail" and judged_seconds < SHORT_RUN_SECONDS and not (np.diff(finite) > 0).all():
        # a few seconds of an untagged run, with flat stretches: a program starting (imports, a
        # connection, a model built) looks the same; only a climb in every window is a leak this short
        status, cause = WARN, "short_untagged_run"
        text = (f"the floor rose {gib(float(finite[-1] - finite[0]))} over {judged_seconds:.0f} s judged, not in "
                f"every window: too short to tell a program's start-up from a leak (tag iterations with phase("
                f"rollout_id=) or record longer); {text.replace('sustained growth: ', '')}")
    numbers = dict(judged.numbers, series=track.label, limit=allowed, judged_by=JUDGED_BY, unit="min",
                   window_seconds=seconds)
    return Finding(status, f"{track.name}, by time: {text}", span, numbers=numbers, cause=cause,
                   series=track.label, resolution=resolution)


def check_leak_by_time(run, th: Thresholds, name: str, title: str, explanation: str) -> CheckResult:
    """The leak check's verdict on a run with no phases: floors over windows of time."""
    explanation += (f" A run without phases is judged over windows of time instead (after the first "
                    f"{WARMUP_SHARE:.0%} of the run, start-up, and before its last {TEARDOWN_SHARE:.0%}), its rates "
                    "per minute.")
    pid = main_pid(run)
    tracks = Tracks(run)
    findings = [judge_track_by_time(track, th) for track in filter(None, (tracks.device(pid), tracks.host(pid)))]
    if not findings:
        return not_applicable(name, title, explanation, "no memory series")
    return verdict(name, title, explanation, findings, " and ".join(f.series for f in findings),
                   "series without sustained growth", "series leaked")
