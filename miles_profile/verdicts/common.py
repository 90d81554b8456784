"""What every per-process check shares: the memory tracks of a run's processes, windows over them,
which phases and iterations are finished, and the one rule that turns findings into a CheckResult."""
from __future__ import annotations

import re

import numpy as np

from miles_profile import names
from miles_profile.logdir.completeness import why_no_events
from miles_profile.logdir.samples_reader import phase_named, rows_naming_a_phase
from miles_profile.runmodel.series import DRIVER_KINDS, Track, device_track, host_track, process_samples
from miles_profile.runmodel.stats import phase_instances
from miles_profile.verdicts.resolution import resolution_of
from miles_profile.verdicts.types import JUDGED, TOO_SMALL, WARN, CheckResult, Finding

MiB = 1024 ** 2


def span_of(findings: list[Finding]) -> tuple[float, float] | None:
    spans = [f.span for f in findings if f.span]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None


def verdict(name: str, title: str, explanation: str, findings: list[Finding], series: str,
            ok: str, bad: str) -> CheckResult:
    """A check's result from its findings: one failure fails it; else one warning (ambiguous evidence)
    warns; else a pass passes it; else findings too small to judge make it "too small to judge"; else
    n/a. Its resolution is the coarsest judged."""
    failed = [f for f in findings if f.status == "fail"]
    warned = [f for f in findings if f.status == WARN]
    judged = [f for f in findings if f.status in JUDGED]
    small = [f for f in findings if f.status == TOO_SMALL]
    resolutions = [f.resolution for f in findings if f.resolution is not None]
    resolution = max(resolutions) if resolutions else None

    def result(status, summary, span):
        return CheckResult(name, title, status, summary, explanation, span, findings, series, resolution)

    if not judged:
        if small:
            first = small[0].message
            return result(TOO_SMALL, first if len(small) == 1 else f"{len(small)} too small to judge; first: {first}",
                          span_of(small))
        summary = findings[0].message if len(findings) == 1 else (
            f"{len(findings)} not judged; first: {findings[0].message}" if findings else "nothing to check")
        return result("n/a", summary, span_of(findings))
    if failed:
        return result("fail", f"{len(failed)} of {len(judged)} {bad}; first: {failed[0].message}", span_of(failed))
    if warned:
        return result(WARN, f"{len(warned)} of {len(judged)} unsure; first: {warned[0].message}", span_of(warned))
    summary = judged[0].message if len(judged) == 1 else f"{len(judged)} {ok}"
    if small:
        summary += f"; {len(small)} too small to judge"
    unjudged = [f for f in findings if f.status == "n/a"]
    if unjudged:  # say so: a pass over some phases is not a pass over all of them
        summary += f"; {len(unjudged)} not judged, first: {unjudged[0].message}"
    return result("pass", summary, span_of(judged))


def not_applicable(name: str, title: str, explanation: str, why: str) -> CheckResult:
    return CheckResult(name, title, "n/a", why, explanation)


class Tracks:
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


def window(track: Track, a: float, b: float) -> slice:
    """Samples with a < t <= b (their peaks fall in that span)."""
    return slice(int(np.searchsorted(track.t, a, "right")), int(np.searchsorted(track.t, b, "right")))


def nanmax(x: np.ndarray) -> float:
    return float(np.nanmax(x)) if len(x) and np.isfinite(x).any() else float("nan")


def nanmin(x: np.ndarray) -> float:
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


def still_open(row) -> bool:
    """Whether a phase instance (a row of phase_instances, as a Series or a namedtuple) has not ended."""
    return getattr(row, "status", None) == names.OPEN


def process_stopped(run, pid) -> bool:
    """Whether a process can no longer end a phase: its recorder wrote `end_time`, or the reader marked
    it dead (the run's `record` process ended while it had not: a kill -9, an OOM kill)."""
    meta = next((p for p in run.processes if p.get("pid") == pid), None)
    return meta is not None and bool(meta.get("end_time") or meta.get("died"))


def open_finding(label: str, where: dict, run=None, pid=None) -> Finding:
    """A phase with no end event: still running while its process records (judged once it ends), or
    never to end when its process stopped during it (given `run` and `pid`): not judged either way."""
    if run is not None and process_stopped(run, pid):
        return Finding("n/a", f"{label}: never ended: its process stopped during it", **where)
    return Finding("n/a", f"{label}: still open, judged once it ends", **where)


def size(n: float) -> str:
    """Bytes on screen: GiB, or MiB below 0.01 GiB, where 3 decimals of GiB would read 0.000."""
    if n is None or not np.isfinite(n):
        return "?"
    return f"{n / MiB:.1f} MiB" if abs(n) < 0.01 * 1024 ** 3 else f"{n / 1024 ** 3:.3f} GiB"


def track_resolution(track: Track) -> float:
    """Bytes a track resolves (resolution.py): the coarsest of the columns it reads; a device track names
    its columns in its label ("GPU memory (gpu0_proc+gpu1_proc) of ..."), a host track reads RSS."""
    columns = getattr(track, "columns", None)
    if not columns:
        columns = re.findall(r"gpu\d+_[a-z_]+", track.label) if track.name == "device" else ["rss", "rss_peak"]
    return resolution_of(columns or track.name)


def too_small(label: str, what: str, quantity: float, resolution: float, series: str, where: dict,
              numbers: dict | None = None, cause: str | None = None) -> Finding:
    """The contract's "too small to judge (X below the resolution Y of <series>)" finding."""
    return Finding(TOO_SMALL, f"{label}: too small to judge ({what} {size(quantity)} below the resolution "
                              f"{size(resolution)} of {series})",
                   numbers=dict(numbers or {}, resolution=resolution), cause=cause, series=series,
                   resolution=resolution, **where)


def tags_of(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)] if isinstance(value, str) else []




def lost_phases(run) -> str | None:
    """Why this run's phases are known to be lost, or None: a process whose meta plans phases (the
    trainer's `forecast` annotation) or whose samples name phases has no phase event (its events file was
    emptied or lost its lines). Such a run is no "run without phases" to judge by time (issue 30, class 9:
    an emptied events file beside a forecast printed PASS with no word)."""
    phases = run.phases
    have = set(phases["pid"].unique().tolist()) if len(phases) and "pid" in phases else set()
    for p in run.processes:
        annotations = p.get("annotations")
        plan = annotations.get("forecast") if isinstance(annotations, dict) else None
        planned = plan.get("phases") if isinstance(plan, dict) else None
        if isinstance(planned, list) and planned and p.get("pid") not in have:
            kinds = sorted({str(e.get("phase")) for e in planned if isinstance(e, dict)})
            rows = process_samples(run, p["pid"]) if isinstance(p.get("pid"), int) else None
            named = phase_named(rows["phase"]) if rows is not None and len(rows) and "phase" in rows else None
            return (f"pid {p.get('pid')}'s meta plans phases ({', '.join(kinds[:4])}: its forecast) but no phase of "
                    f"it was recorded: {why_no_events(named)}")
    samples = run.samples
    if len(samples) and "phase" in samples and "pid" in samples:
        labelled = set(samples.loc[rows_naming_a_phase(samples["phase"]), "pid"].unique().tolist()) - have
        if labelled:
            return (f"the samples of pid {min(labelled)} name phases but no phase of it was recorded: its events "
                    "file was emptied or lost its lines")
    return None
