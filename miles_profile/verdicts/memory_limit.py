"""Judge one recorded test against memory limits (the pytest plugin's verdict, pytest_plugin.py).

    judge_limits(run, gpu=None, host=None, phase=None) -> list[LimitVerdict]
    limit_results(run, gpu=None, host=None, phase=None) -> list[CheckResult]   # the same, as verdicts

What is measured, in the test's own process (the run holds that one process):

- host: the true RSS peak (`rss` with `rss_peak`, VmHWM between rows);
- gpu: per GPU, the torch allocator's true peak (`gpu{i}_alloc` with `gpu{i}_alloc_peak`); where the
  allocator has no column (torch without CUDA initialised, memory the allocator does not see),
  NVML's bytes of this process (`gpu{i}_proc`). The highest GPU is judged. Under torch_memory_saver
  the allocator still counts paused regions as allocated: it can overstate, never miss.

Both **above the level when the test started** (the recorder's first row, taken before the test body):
a limit is on what the test itself adds, as pytest-memray's `limit_memory` counts the test's own
allocations, not the interpreter, torch and the fixtures that were there before.

With `phase`, only the rows of the selected phases count (from their phase summaries: the true peak
of each instance); without, every row of the test. A GPU limit on a run without GPU series (CPU only)
is "not checkable"; a `phase` the test never opened fails: a limit that silently checks nothing would
pass forever.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from miles_profile.errors import MilesProfileError
from miles_profile.phase_select import parse_phases
from miles_profile.sizes import format_size, parse_size
from miles_profile.verdicts.types import CheckResult, Finding

_GPU = re.compile(r"^gpu(\d+)_(alloc|proc)$")


@dataclass(frozen=True)
class LimitVerdict:
    kind: Literal["gpu", "host"]
    status: Literal["pass", "fail", "not checkable"]
    limit: int
    measured: int | None  # bytes above the test's start
    series: str           # "host RSS", "GPU 0 allocator", "GPU 0 NVML (this process)"
    where: str            # "phase train" or "the whole test"

    @property
    def message(self) -> str:
        if self.measured is None:
            what = "not checked" if self.status == "fail" else "not checkable"
            return f"memory_limit: {self.kind} limit {format_size(self.limit)} {what} in {self.where}: {self.series}"
        relation = ">" if self.status == "fail" else "<="
        return (f"memory_limit: {self.series} peak {format_size(self.measured)} above the test's start "
                f"{relation} limit {format_size(self.limit)} ({self.kind}, {self.where})")


def _start_levels(samples: pd.DataFrame) -> dict[str, float]:
    """Each column's first value (the row taken when the recorder started, before the test body)."""
    first = {}
    for column in samples.columns:
        if column in ("t", "phase", "pid"):
            continue
        values = pd.to_numeric(samples[column], errors="coerce").to_numpy(float)
        first[column] = float(values[0]) if len(values) and np.isfinite(values[0]) else 0.0  # absent: from 0
    return first


def _whole_test_peaks(samples: pd.DataFrame) -> dict[str, float]:
    """Each level column's true peak over every row (its `_peak` column included)."""
    peaks = {}
    for column in samples.columns:
        if column in ("t", "phase", "pid") or column.endswith("_peak"):
            continue
        values = pd.to_numeric(samples[column], errors="coerce").to_numpy(float)
        if f"{column}_peak" in samples:
            values = np.fmax(values, pd.to_numeric(samples[f"{column}_peak"], errors="coerce").to_numpy(float))
        if np.isfinite(values).any():
            peaks[column] = float(np.nanmax(values))
    return peaks


def _phase_peaks(run, names: list[str]) -> dict[str, float]:
    """Each series' highest true peak over the named phases' instances: from their summaries, or, in a
    log written before summaries, from their rows (start < t <= end of each instance)."""
    summaries = run.phase_summaries
    rows = summaries[summaries["name"].isin(names)]
    if len(rows):
        return {series: float(group["peak"].max()) for series, group in rows.groupby("series")
                if group["peak"].notna().any()}
    phases = run.phases[run.phases["name"].isin(names) & (run.phases["status"].astype(str) != "open")]
    t = run.samples["t"].to_numpy(float)
    inside = np.zeros(len(t), dtype=bool)
    for start, end in zip(phases["start"], phases["end"]):
        inside |= (t > start) & (t <= end)
    return _whole_test_peaks(run.samples[inside])


def _gpu_series(peaks: dict[str, float]) -> list[tuple[str, str]]:
    """(column, label) of each GPU's series to judge: the allocator's where present, else NVML's."""
    found: dict[int, dict[str, str]] = {}
    for column in peaks:
        if m := _GPU.match(column):
            found.setdefault(int(m.group(1)), {})[m.group(2)] = column
    out = []
    for index, kinds in sorted(found.items()):
        if "alloc" in kinds:
            out.append((kinds["alloc"], f"GPU {index} allocator"))
        else:
            out.append((kinds["proc"], f"GPU {index} NVML (this process)"))
    return out


def judge_limits(run, gpu=None, host=None, phase=None) -> list[LimitVerdict]:
    """The verdict of each limit given (sizes as bytes or "20 GiB"); `phase`: a --phase selection."""
    limits = {k: parse_size(v) for k, v in (("gpu", gpu), ("host", host)) if v is not None}
    if not limits:  # a limit that checks nothing would pass forever
        raise MilesProfileError("memory_limit needs gpu= or host= (a size such as '20 GiB'); both are None")
    if phase is not None and not isinstance(phase, (str, list, tuple)):
        raise MilesProfileError(f"memory_limit phase= takes a phase name or selection such as 'train', got {phase!r}")
    start = _start_levels(run.samples)
    if phase is None:
        peaks, where = _whole_test_peaks(run.samples), "the whole test"
    else:
        recorded = run.phases["name"].astype(str).unique().tolist() if len(run.phases) else []
        selection = parse_phases(phase, extra_names=recorded)
        chosen = selection.split(recorded)[0] if selection else recorded
        where = f"phase {selection.text if selection else phase}"
        if not chosen:
            return [LimitVerdict(kind, "fail", limit, None, f"the test never opened it (phases recorded: "
                                                            f"{', '.join(recorded) or 'none'})", where)
                    for kind, limit in limits.items()]
        peaks = _phase_peaks(run, chosen)
    verdicts = []
    for kind, limit in limits.items():
        series = [("rss", "host RSS")] if kind == "host" else _gpu_series(peaks)
        series = [(c, label) for c, label in series if c in peaks]
        if not series:
            why = "no GPU memory was recorded (no CUDA device, or CUDA never initialised)" if kind == "gpu" \
                else "no host RSS was recorded"
            verdicts.append(LimitVerdict(kind, "not checkable", limit, None, why, where))
            continue
        above = [(max(0.0, peaks[c] - start.get(c, 0.0)), label) for c, label in series]
        measured, label = max(above)
        verdicts.append(LimitVerdict(kind, "fail" if measured > limit else "pass", limit, int(measured), label, where))
    return verdicts


def limit_results(run, gpu=None, host=None, phase=None) -> list[CheckResult]:
    """Each limit's verdict in the engine's vocabulary (verdicts/engine.py renders it as any other check):
    "not checkable" is status "n/a"; a phase the test never opened fails."""
    return [_as_result(v) for v in judge_limits(run, gpu, host, phase)]


def _as_result(v: LimitVerdict) -> CheckResult:
    status = "n/a" if v.status == "not checkable" else v.status
    numbers = {"limit": v.limit, "measured": v.measured, "where": v.where}
    finding = Finding(status, v.message, numbers=numbers, series=v.series)
    explanation = (f"the {v.kind} memory the test adds above its start, in {v.where}, must stay within "
                   f"{format_size(v.limit)}")
    return CheckResult(f"memory_limit_{v.kind}", f"Memory limit ({v.kind})", status, v.message, explanation,
                       findings=[finding], series=v.series)
