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

(The result types and thresholds are defined in types.py and re-exported here; each check lives in
a module of its own beside this one.)
"""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from miles_profile.verdicts.common import recording, unfinished_iterations  # noqa: F401 - public API
from miles_profile.verdicts.headroom import check_headroom
from miles_profile.verdicts.host_memory import check_disk_offload_host_flat, check_host_weight_copies
from miles_profile.verdicts.leak import check_leak
from miles_profile.verdicts.offload import check_offload_drop
from miles_profile.verdicts.serialized import check_serialized_peaks
from miles_profile.verdicts.spikes import check_transition_spikes
from miles_profile.verdicts.types import (  # noqa: F401 - re-exported: the public API above
    CheckResult, Finding, Status, Thresholds, gib, overall_status)

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
