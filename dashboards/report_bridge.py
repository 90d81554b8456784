"""The one module through which the dashboard uses `miles_profile.report` (figures, table, checks).

INTERIM: until the report package lands, `timeline_figure` here is a stand-in with the same
signature (a MinMax reduction of the visible window, one line per series, phase bands); it is
replaced by the report's builders, and nothing else in the dashboard changes when that happens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from tsdownsample import NaNMinMaxDownsampler

from miles_profile.logdir.reader import Run

GiB = 1024 ** 3
POINTS_PER_SERIES = 4000


@dataclass(frozen=True)
class CheckView:
    name: str
    verdict: str  # "pass" | "fail" | "n/a"
    summary: str
    span: tuple[float, float] | None  # Unix seconds the check looked at


def t0_of(run: Run) -> float:
    """Time origin of the figures' x axis (seconds since run start)."""
    start = run.meta.get("start_time")
    if isinstance(start, (int, float)):
        return float(start)
    return float(run.samples["t"].iloc[0]) if len(run.samples) else 0.0


def _window(t: np.ndarray, window: tuple[float, float] | None) -> slice:
    if window is None:
        return slice(0, len(t))
    lo, hi = np.searchsorted(t, window[0], side="left"), np.searchsorted(t, window[1], side="right")
    return slice(max(0, lo - 1), min(len(t), hi + 1))  # one point beyond each edge: lines reach the border


def _reduced(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(x) <= POINTS_PER_SERIES:
        return x, y
    index = NaNMinMaxDownsampler().downsample(x, y, n_out=POINTS_PER_SERIES)
    return x[index], y[index]


def timeline_figure(run: Run, window: tuple[float, float] | None = None) -> go.Figure:
    """Host (and GPU) series of `run`, reduced over `window` (Unix seconds; None: the whole run)."""
    samples, t0 = run.samples, t0_of(run)
    t = samples["t"].to_numpy()
    part = _window(t, window)
    x = t[part] - t0
    figure = go.Figure()
    series = [c for c in samples.columns if c not in ("t", "phase", "pid")]
    for column in series:
        y = samples[column].to_numpy(dtype=float)[part]
        if not np.isfinite(y).any():
            continue
        xr, yr = _reduced(x, y)
        figure.add_trace(go.Scattergl(x=xr, y=yr / GiB, name=column, mode="lines"))
    for phase in run.phases.itertuples():
        if window is None or (phase.end >= window[0] and phase.start <= window[1]):
            figure.add_vrect(x0=phase.start - t0, x1=phase.end - t0, opacity=0.08, line_width=0,
                             fillcolor="#4C78A8" if phase.name.startswith("offload") else "#F58518")
    figure.update_layout(xaxis_title="seconds since start", yaxis_title="GiB", margin=dict(l=50, r=10, t=20, b=40))
    return figure


def phase_table(run: Run) -> pd.DataFrame:
    return pd.DataFrame()


def check_views(run: Run) -> list[CheckView]:
    return []


def comparison(runs: list[Run]) -> tuple[go.Figure, pd.DataFrame]:
    return go.Figure(), pd.DataFrame()


def axis_value(run: Run, t: float) -> float:
    """Unix seconds -> the timeline's x-axis value."""
    return t - t0_of(run)


def unix_time(run: Run, value) -> float:
    """A timeline x-axis value, as the browser reports it in a relayout -> Unix seconds."""
    return float(value) + t0_of(run)
