"""What the timeline points at: the highest peak of each memory plot (with its phase and iteration),
each phase's peaks for its hover text, the device or host total as a reference, and y ranges fitted
to the data. Numbers only here (numpy, pandas); figures.py draws them.

    PeakMark(x, y, label, series)                        # x in seconds since the run started, y bytes
    highest_peak(traces_xy, run, t0) -> PeakMark | None  # over one plot's drawn series
    phase_at(run, t) -> (name, iteration) | None         # the innermost phase of the main process at t
    phase_peak_lines(run, phases, rows) -> list[str]     # "GPU 0 peak 20.123 GiB" per phase, for hover
    fitted_range(data_max, total) -> (y_max, total_drawn)  # GiB; total drawn only within 2x the data
    device_total(run, index) / host_total(run) -> bytes or None
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from miles_profile.names import iteration_text
from miles_profile.runmodel.reduce import phase_ranges
from miles_profile.runmodel.series import GiB, main_pid, series_arrays
from miles_profile.runmodel.stats import _iterations, range_stats

TOTAL_WITHIN = 2.0  # draw the total as a line only when it is at most this many times the data's maximum
HEADROOM = 1.08     # the y axis ends this much above the highest value drawn


@dataclass(frozen=True)
class PeakMark:
    x: float      # seconds since the run started
    y: float      # bytes
    label: str    # "peak 20.1 GiB · phase train · iteration 2"
    series: str   # the series that holds it


def with_iterations(phases: pd.DataFrame) -> pd.DataFrame:
    """`phases` with an `iteration` column (-1 before the first rollout_id: the setup)."""
    if phases.empty:
        return phases.assign(iteration=pd.Series(dtype=np.int64))
    return phases.assign(iteration=_iterations(phases))


def phase_at(run, t: float) -> tuple[str, int] | None:
    """(name, iteration) of the deepest phase of the main process whose (start, end] holds t."""
    phases = run.phases
    if phases.empty:
        return None
    phases = with_iterations(phases[phases["pid"] == main_pid(run)])
    holding = phases[(phases["start"] < t) & (phases["end"] >= t)]
    if holding.empty:
        return None
    row = holding.sort_values(["depth", "start"]).iloc[-1]
    return str(row["name"]), int(row["iteration"])


def highest_peak(traces_xy: list[tuple[str, np.ndarray, np.ndarray]], run, t0: float) -> PeakMark | None:
    """The highest point among (name, x seconds, y bytes) series, and the phase it fell in."""
    best = None
    for name, x, y in traces_xy:
        y = np.asarray(y, dtype=float)
        if not np.isfinite(y).any():
            continue
        i = int(np.nanargmax(y))
        if best is None or y[i] > best[2]:
            best = (name, float(x[i]), float(y[i]))
    if best is None:
        return None
    name, x, y = best
    where = phase_at(run, x + t0)
    label = f"peak {y / GiB:.2f} GiB"
    if where is not None:
        label += f" · phase {where[0]} · iteration {iteration_text(where[1])}"
    return PeakMark(x, y, label, name)


def phase_peak_lines(run, phases: pd.DataFrame, rows: list[tuple[str, int, str, str]]) -> list[str]:
    """For each phase (start, end), one hover line per memory plot: "<plot> peak X GiB (<series>)".

    `rows`: (plot title, pid, level column, peak column or "") of the series each plot is judged by."""
    lines = [[] for _ in range(len(phases))]
    for title, pid, column, peak_column in rows:
        t, y = series_arrays(run, pid, column)
        if not len(t):
            continue
        top = series_arrays(run, pid, peak_column)[1] if peak_column else None
        i0, i1 = phase_ranges(t, phases["start"].to_numpy(float), phases["end"].to_numpy(float))
        peaks = range_stats(y, i0, i1, top)[2]
        for k, peak in enumerate(peaks):
            if np.isfinite(peak):
                lines[k].append(f"{title} peak {peak / GiB:.3f} GiB")
    # a phase shorter than the sampling interval holds no sample: its peak is in the next sample's
    return ["<br>".join(parts) if parts else "no sample inside (shorter than the sampling interval): its "
            "true peak is in the next sample's" for parts in lines]


def fitted_range(data_max: float, total: float | None) -> tuple[float, float | None]:
    """(top of the y axis, the total to draw or None), both in bytes: the data fills the plot; the
    total is a reference line only when it is within TOTAL_WITHIN times the data's maximum."""
    data_max = float(data_max) if np.isfinite(data_max) and data_max > 0 else 0.0
    shown = total if total is not None and data_max > 0 and total <= TOTAL_WITHIN * data_max else None
    top = max(data_max, shown or 0.0) * HEADROOM
    return (top if top > 0 else 1.0), shown


def device_total(run, index: int) -> float | None:
    device = next((d for d in run.devices if int(d.get("index", -1)) == index), {})
    total = device.get("total")
    return float(total) if isinstance(total, (int, float)) and total > 0 else None


def host_total(run) -> float | None:
    for meta in [run.meta, *run.processes]:
        for probe in meta.get("probes") or []:
            if probe.get("name") == "host" and isinstance(probe.get("total"), (int, float)) and probe["total"] > 0:
                return float(probe["total"])
    return None
