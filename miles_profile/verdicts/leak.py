"""leak: the per-iteration floor does not grow."""
from __future__ import annotations

import numpy as np

from miles_profile.report.series import main_pid
from miles_profile.report.stats import phase_instances
from miles_profile.verdicts.types import CheckResult, Finding, Thresholds, gib
from miles_profile.verdicts.common import (
    Tracks, nanmax, nanmin, not_applicable, unfinished_iterations, verdict,
    window)


def check_leak(run, th: Thresholds) -> CheckResult:
    name, title = "leak", "No leak across iterations"
    explanation = ("The lowest level of each iteration must not grow: from the first iteration after warm-up to the "
                   f"last it may rise by at most {th.leak_share:.0%} of the peak plus {gib(th.leak_abs_bytes)}.")
    inst = phase_instances(run)
    if inst.empty:
        return not_applicable(name, title, explanation, "no phases in this run")
    tracks = Tracks(run)
    pid = main_pid(run)
    mine = inst[(inst["pid"] == pid) & (inst["iteration"] >= 0)]
    spans = mine.groupby("iteration").agg(start=("start", "min"), end=("end", "max")).sort_index()
    spans = spans.iloc[th.leak_skip_iterations:]
    # An unfinished iteration has not reached its floor yet: judging it would report a leak mid-run.
    spans = spans[~spans.index.isin(list(unfinished_iterations(run)))]
    if len(spans) < 2:
        return not_applicable(name, title, explanation, f"needs at least {th.leak_skip_iterations + 2} finished iterations")
    findings = []
    for track in filter(None, (tracks.device(pid), tracks.host(pid))):
        written = track.measured_times()
        reached = written[-1] if len(written) else -np.inf  # an iteration past it has not its floor on disk
        floors = np.array([nanmin(track.value[window(track, s, e)]) if e <= reached else np.nan
                           for s, e in zip(spans["start"], spans["end"])])
        ok = np.isfinite(floors)
        if ok.sum() < 2:
            continue
        first, last = floors[ok][0], floors[ok][-1]
        limit = th.leak_share * nanmax(track.peak) + th.leak_abs_bytes
        growth = last - first
        findings.append(Finding("fail" if growth > limit else "pass",
                                f"{track.name}: floor {gib(first)} → {gib(last)} over {int(ok.sum())} iterations "
                                f"(allowed growth {gib(limit)})",
                                (float(spans['start'].iloc[0]), float(spans['end'].iloc[-1])),
                                numbers=dict(floors=[float(f) for f in floors], growth=growth, limit=limit,
                                             series=track.label)))
    if not findings:
        return not_applicable(name, title, explanation, "no memory series")
    return verdict(name, title, explanation, findings, " and ".join(f.numbers["series"] for f in findings),
                    "series with a flat floor", "series leaked")

