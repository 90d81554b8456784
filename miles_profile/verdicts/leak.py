"""leak: the per-iteration floor does not keep growing after warm-up.

Per memory series of the main process (device, host RSS): the lowest level of each finished iteration
after `leak_skip_iterations`, taken only where the series was read throughout the iteration, judged
by `trend.judge_floors` (a Theil-Sen trend with its interval; a one-time step is its own, passing
finding with its likely cause). Causes: `sustained_growth` (fail), `one_time_step` and `growth_stopped`
(pass).

Iterations shorter than the sampling interval (a fast loop with a phase per step) have no floor of their
own: consecutive iterations are then judged in windows, each read `leak_min_reads` times, when that gives
more floors; the first window is warm-up too. A step that leaks 64 KiB in a 1 ms loop is found so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.runmodel.series import Track, main_pid, series_arrays
from miles_profile.runmodel.stats import phase_instances
from miles_profile.verdicts.common import (
    Tracks, lost_phases, nanmax, nanmin, not_applicable, unfinished_iterations, verdict, window)
from miles_profile.verdicts.resolution import resolution_of
from miles_profile.verdicts.trend import judge_floors, step_cause_of
from miles_profile.verdicts.types import TOO_SMALL, CheckResult, Finding, Thresholds, gib


def check_leak(run, th: Thresholds) -> CheckResult:
    name, title = "leak", "No leak across iterations"
    explanation = (f"The lowest level of each iteration after the first {th.leak_skip_iterations} (warm-up), from "
                   "series read throughout the iteration, must not keep growing: a Theil-Sen trend over at least "
                   f"{th.leak_min_iterations} iterations fails only when the lower bound of its "
                   "95% interval, over the iterations judged, exceeds "
                   f"{th.leak_share:.0%} of the peak plus the larger of {gib(th.leak_abs_bytes)} and "
                   f"{th.leak_resolution_multiple:g}x the series' resolution. A floor that steps up once and "
                   "stays flat is a one-time step (allocator or glibc retention), reported, not failed.")
    inst = phase_instances(run)
    lost = lost_phases(run) if inst.empty else None
    if lost:  # phases there were, their events are gone: judged by time, the start-up read as a leak
        return not_applicable(name, title, explanation, f"not judged: {lost}")
    if inst.empty:  # nothing tagged the iterations: the floor over windows of time (leak_by_time.py)
        from miles_profile.verdicts.leak_by_time import check_leak_by_time
        return check_leak_by_time(run, th, name, title, explanation)
    tracks = Tracks(run)
    pid = main_pid(run)
    mine = inst[(inst["pid"] == pid) & (inst["iteration"] >= 0)]
    spans = mine.groupby("iteration").agg(start=("start", "min"), end=("end", "max")).sort_index()
    spans = spans.iloc[th.leak_skip_iterations:]
    # An unfinished iteration has not reached its floor yet: judging it would report a leak mid-run.
    spans = spans[~spans.index.isin(list(unfinished_iterations(run)))]
    judged = mine[mine["iteration"].isin(spans.index)]
    findings = []
    for track in filter(None, (tracks.device(pid), anonymous(run, tracks.host(pid)))):
        finding = _judge_track(run, track, spans, judged, th)
        if finding is not None:
            findings.append(finding)
    if not findings:
        return not_applicable(name, title, explanation, "no memory series")
    return verdict(name, title, explanation, findings, " and ".join(f.series for f in findings),
                   "series without sustained growth", "series leaked")


def _judge_track(run, track: Track, spans, instances, th: Thresholds) -> Finding | None:
    columns = _columns_of(track)
    resolution = resolution_of(columns)
    floors = iteration_floors(track, spans["start"].to_numpy(), spans["end"].to_numpy(), th, begin_rows=True)
    over = None
    windows = read_windows(track, spans, th) if read_share(track, instances) >= th.leak_window_coverage else []
    if len(windows) > 1:
        windowed = iteration_floors(track, windows["start"].to_numpy(), windows["end"].to_numpy(), th,
                                    begin_rows=True)[1:]
        if np.isfinite(windowed).sum() > np.isfinite(floors).sum():
            over = (f"{int(windows['last'].iloc[-1] - windows.index[1]) + 1} iterations in {len(windowed)} windows "
                    f"(an iteration alone holds fewer than {th.leak_min_reads} readings)")
            spans, floors = windows.iloc[1:], windowed
    allowed = th.leak_share * nanmax(track.peak) + max(th.leak_abs_bytes, th.leak_resolution_multiple * resolution)
    kind = "host" if track.name == "host" else ("alloc" if set(columns) == {"alloc"} else "device")
    moved = ""
    if track.name == "host" and np.isfinite(floors).sum() < th.leak_min_iterations:
        floors, moved = _without_declared_host_state(run, track.pid, floors)
    cause = step_cause_of(kind, offloads=_has_offload(run, track.pid))  # no round trip blamed without one
    judged = judge_floors(spans.index.to_numpy(), floors, resolution=resolution, allowed=allowed,
                          min_iterations=th.leak_min_iterations, step_cause=cause, over=over)
    text = judged.text + moved + (file_backed_note(run, track, spans) if track.name == "host" else "")
    if judged.cause == "sustained_growth" and track.name == "host":
        heap = _heap_stayed_flat(run, track.pid, spans, th, allowed, judged.numbers.get("growth", 0.0))
        if heap:
            judged.status, judged.cause = "warn", "heap_flat"
            text = (f"the floor rose, glibc's heap in use did not: {text.removeprefix('sustained growth: ')}; "
                    f"{heap}: memory glibc keeps after frees, or memory outside malloc (a library's own "
                    "mapping, Python's small-object arenas), which these series cannot tell apart: a warning")
    if judged.cause == "one_time_step" and track.name == "host":
        text += _declared_host_state(run, track.pid, judged.numbers["step"])
    if judged.cause == "few_iterations" and track.name == "host":
        # two floors around an offload to the CPU: the host now holds the offloaded state, by design
        declared = _declared_host_state(run, track.pid, judged.numbers["growth"])
        if declared:
            judged.status, judged.cause, text = "pass", "one_time_step", text + declared
    span = (float(spans["start"].iloc[0]), float(spans["end"].iloc[-1])) if len(spans) else None
    status = TOO_SMALL if judged.status == "too small to judge" else judged.status
    numbers = dict(judged.numbers, series=track.label, limit=allowed)  # growth / limit ranks the worst process
    return Finding(status, f"{track.name}: {text}", span, numbers=numbers, cause=judged.cause, series=track.label,
                   resolution=resolution)


# The heap "did not grow" where its floor grew by at most this share of the resident floor's growth (or the
# heap series' noise): kept small Python objects put part of their bytes in malloc'd blocks (a list's items
# array: 8 of every ~36 bytes of a list of ints), far above it.
HEAP_SHARE, HEAP_FLAT_BYTES = 0.05, 2 * 1024 ** 2


def _heap_stayed_flat(run, pid: int, spans, th: Thresholds, allowed: float, growth: float) -> str:
    """Where the resident floor grew by `growth` while glibc's heap in use (read at every phase boundary) grew
    by less than HEAP_SHARE of it, the heap's floors in words; else "". Such growth is memory glibc keeps after
    frees (thread arenas that never shrink) or memory outside malloc (a library's own mapping): the first is
    no leak, the second may be, and the series cannot tell them apart, so it is a warning, not a failure. A
    healthy actor beside a leaking reference process grew +24 MiB/iteration of anonymous memory while its
    heap stayed at 325.7 MiB at every boundary. Kept Python objects grow the heap too (a list's item array,
    a dict's table are malloc'd): they stay a failure."""
    if "heap_used" not in run.samples:
        return ""
    t, heap = series_arrays(run, pid, "heap_used")
    read = np.isfinite(heap)
    t, heap = t[read], heap[read]
    if not len(t):
        return ""
    # the reads in [start - BEGIN_ROW_S, end] by bisection (a boundary's row is written just before its begin
    # event), as iteration_floors takes them; too few for its leak_min_reads: the heap is read at boundaries
    first = np.searchsorted(t, spans["start"].to_numpy() - BEGIN_ROW_S, "left")
    last = np.searchsorted(t, spans["end"].to_numpy(), "right")
    floors = np.array([heap[a:b].min() if b - a >= 2 else np.nan for a, b in zip(first, last)], dtype=float)
    judged = judge_floors(spans.index.to_numpy(), floors, resolution=resolution_of("heap_used"), allowed=allowed,
                          min_iterations=th.leak_min_iterations)
    n = judged.numbers
    if judged.status != "pass" or n.get("growth", np.inf) > max(HEAP_FLAT_BYTES, HEAP_SHARE * growth):
        return ""
    return f"heap in use {gib(n['first'])} → {gib(n['last'])}, {n['slope'] / 1024 ** 2:+.1f} MiB/iteration"


def anonymous(run, track: Track | None) -> Track | None:
    """The host track on anonymous memory (`rss_anon` + `rss_shmem`: heaps, tensors, shared memory) where
    the process recorded it: file-backed pages (`rss_file`: a memory-mapped data set, libraries) are page
    cache the kernel reclaims, never a leak. A nanoGPT-style np.memmap loader grew RSS by 100 MiB per
    iteration, all of it file-backed, while its anonymous memory stayed at 52 MiB (issue 30)."""
    if track is None or track.name != "host" or "rss_anon" not in run.samples:
        return track
    t, anon = series_arrays(run, track.pid, "rss_anon")
    if len(t) != len(track.t) or not np.isfinite(anon).any():
        return track
    shmem = series_arrays(run, track.pid, "rss_shmem")[1] if "rss_shmem" in run.samples else np.zeros(len(t))
    value = anon + np.nan_to_num(shmem)
    label = track.label.replace("host RSS", "anonymous host memory (rss_anon + rss_shmem)", 1)
    return Track("host", label, track.pid, t, value, value)


def file_backed_note(run, track: Track, spans) -> str:
    """What file-backed pages did over the iterations judged, shown apart (never judged)."""
    if "rss_file" not in run.samples or not len(spans):
        return ""
    t, y = series_arrays(run, track.pid, "rss_file")
    first = y[(t >= spans["start"].iloc[0]) & (t <= spans["end"].iloc[0])]
    last = y[(t >= spans["start"].iloc[-1]) & (t <= spans["end"].iloc[-1])]
    if not (np.isfinite(first).any() and np.isfinite(last).any()):
        return ""
    a, b = float(np.nanmin(first)), float(np.nanmin(last))
    if abs(b - a) < 16 * 1024 ** 2:
        return ""
    return f"; file-backed pages (rss_file, page cache the kernel reclaims, not judged) {gib(a)} → {gib(b)}"


def _has_offload(run, pid: int) -> bool:
    phases = run.phases
    if phases.empty or "name" not in phases:
        return False
    return bool(phases[phases["pid"] == pid]["name"].astype(str).str.startswith("offload").any())


def read_share(track: Track, instances) -> float:
    """The share of phase instances (start, end] that hold a reading of the series."""
    if instances.empty:
        return 0.0
    written = track.measured_times()
    inside = (np.searchsorted(written, instances["end"].to_numpy(), "right")
              - np.searchsorted(written, instances["start"].to_numpy(), "right"))
    return float(np.mean(inside > 0))


def read_windows(track: Track, spans, th: Thresholds, most: int = 100):
    """Consecutive iterations merged into windows that the series read at least `leak_min_reads` times
    (and a `most`-th of its reads in the span, so that a long run gives at most about `most` windows),
    indexed by each window's first iteration, with its `last`; the tail too short for a window is left out."""
    written = track.measured_times()
    starts, ends = spans["start"].to_numpy(), spans["end"].to_numpy()
    if len(starts) == 0:
        return pd.DataFrame(columns=["start", "end", "last"])
    before = np.searchsorted(written, starts, "right")  # reads inside (start_k, end_j]: upto[j] - before[k]
    upto = np.searchsorted(written, ends, "right")
    need = max(th.leak_min_reads, -(-(upto[-1] - before[0]) // most))
    rows, k, j = [], 0, 0
    while k < len(starts):
        j = max(j, k)
        while j < len(starts) and upto[j] - before[k] < need:
            j += 1
        if j == len(starts):
            break
        rows.append((spans.index[k], starts[k], ends[j], spans.index[j]))
        k = j + 1
    return pd.DataFrame([r[1:] for r in rows], index=[r[0] for r in rows], columns=["start", "end", "last"])


# The row a recorder writes just before a phase's begin event (recorder.py: the event is stamped right
# after it) is the level the phase began at; a reading this close before a window's start is taken as it.
BEGIN_ROW_S = 0.05


def iteration_floors(track: Track, starts: np.ndarray, ends: np.ndarray, th: Thresholds,
                     begin_rows: bool = False) -> np.ndarray:
    """The lowest level in each window, NaN where the series was not read throughout it (fewer than
    `leak_min_reads` readings: an NVML column read at a few phase ends gives no floor), and where the
    samples on disk do not reach the window's end yet. With `begin_rows` (windows that start at a phase's
    begin), the level the window began at counts too: the row written just before its begin event (within
    BEGIN_ROW_S). A loop that keeps its batch each iteration is at its floor only at that instant; the
    periodic readings inside caught it anywhere between that floor and the next while the allocation ran
    (issue 30, class 5: under load floors rose +22.9 then +181 MiB where +96 MiB were kept each time)."""
    written = track.measured_times()
    reached = written[-1] if len(written) else -np.inf
    out = np.full(len(starts), np.nan)
    # readings in each window (s, e], by bisection of the sorted times: a mask per window read the
    # whole series once per iteration
    first = np.searchsorted(written, starts, "right")
    reads = np.searchsorted(written, ends, "right") - first
    for k, (s, e) in enumerate(zip(starts, ends)):
        if e > reached or reads[k] < th.leak_min_reads:
            continue
        out[k] = nanmin(track.value[window(track, s, e)])
        if begin_rows and first[k] > 0 and s - written[first[k] - 1] <= BEGIN_ROW_S:
            out[k] = min(out[k], track.at_or_before(written[first[k] - 1]))
    return out


def _columns_of(track: Track) -> list[str]:
    """The column kinds a track was built from, read from its label ("GPU memory (gpu0_proc) of ...")."""
    if track.name == "host":
        return ["rss"]
    inner = track.label.split("(", 1)[1].split(")", 1)[0] if "(" in track.label else ""
    kinds = [c.split("_", 1)[1] for c in inner.split("+") if "_" in c]
    return kinds or ["proc"]


def _cpu_offload_sizes(run, pid: int) -> "pd.Series":
    phases = run.phases
    if phases.empty or "target" not in phases or "expected_bytes" not in phases:
        return pd.Series(dtype=float)
    cpu = phases[(phases["pid"] == pid) & (phases["target"].astype(str) == "cpu")
                 & phases["name"].astype(str).str.startswith("offload")]
    return cpu.groupby("name")["expected_bytes"].max().dropna()


def _without_declared_host_state(run, pid: int, floors: np.ndarray) -> tuple[np.ndarray, str]:
    """A short run's host floors with each rise the size of the state an offload to the CPU declares
    it moves (within 25 %) taken out: the host holding offloaded state is by design, not a leak."""
    sizes = _cpu_offload_sizes(run, pid)
    ok = np.flatnonzero(np.isfinite(floors))
    if sizes.empty or len(ok) < 2:
        return floors, ""
    out, removed = floors.copy(), 0.0
    for a, b in zip(ok[:-1], ok[1:]):
        rise = floors[b] - floors[a]
        if rise > 0 and ((sizes - rise).abs() <= 0.25 * rise).any():
            out[b:] -= rise
            removed += rise
    if not removed:
        return floors, ""
    return out, (f"; {gib(removed)} of the rise is the state the offloads to the CPU declare they move "
                 f"({', '.join(sizes.index)}): taken out, expected")


def _declared_host_state(run, pid: int, step: float) -> str:
    """A note when the step matches what an offload to the CPU declared it moves: host memory that
    holds declared offloaded state between its offload and its onload is expected, not leaked."""
    phases = run.phases
    if phases.empty or "target" not in phases or "expected_bytes" not in phases:
        return ""
    cpu = phases[(phases["pid"] == pid) & (phases["target"].astype(str) == "cpu")
                 & phases["name"].astype(str).str.startswith("offload")]
    sizes = cpu.groupby("name")["expected_bytes"].max().dropna()
    close = sizes[(sizes - step).abs() <= 0.25 * step]
    if close.empty:
        return ""
    which = close.index[0]
    return (f"; the step is the size of the state {which} declares it moves to the CPU ({gib(close.iloc[0])}): "
            "host memory holding offloaded state until its onload is expected")
