"""Figures redrawn on every zoom: keep the phase lane as light as the memory series.

`figures.timeline_figure` draws every phase instance in view as a bar. A 10-million-sample run has
7,000 of them: Chromium spends about half a second laying them out (2.7 s with their names), on the
first paint and again on every zoom, though at that density a thousand land on one pixel column.
`thin_phase_bars` reduces them the way `reduce` reduces a series: per lane and per phase name (so every
phase keeps its colour along the run), the time axis is cut into equal buckets, `max_bars` in all,
and each bucket keeps its longest bar, exactly as the figure had it (start, width, hover text).
Zooming in brings the others back, since the figure is rebuilt for the window.

Public API:

    thin_phase_bars(figure, max_bars=600) -> int   # bars kept; the figure is changed in place
"""
from __future__ import annotations

import numpy as np

DEFAULT_MAX_BARS = 600


def _bars(figure) -> list:
    return [t for t in figure.data if t.type == "bar" and t.orientation == "h" and t.x is not None]


def thin_phase_bars(figure, max_bars: int = DEFAULT_MAX_BARS) -> int:
    """Keep, per lane, phase name and time bucket, the longest phase bar. Returns the bars kept."""
    traces = _bars(figure)
    sizes = [len(t.x) for t in traces]
    if sum(sizes) <= max_bars:
        return sum(sizes)
    buckets = max(1, max_bars // max(1, sum(1 for n in sizes if n)))
    width = np.concatenate([np.asarray(t.x, dtype=float) for t in traces])
    start = np.concatenate([np.broadcast_to(np.asarray(t.base if t.base is not None else 0.0, dtype=float), n)
                            for t, n in zip(traces, sizes)])
    lanes = np.concatenate([np.asarray(t.y, dtype=object).astype(str) for t in traces])
    lo, hi = float(start.min()), float((start + width).max())
    bucket = np.minimum(((start - lo) / max(hi - lo, 1e-12) * buckets).astype(np.int64), buckets - 1)
    lane_codes = np.unique(lanes, return_inverse=True)[1].astype(np.int64)
    trace_codes = np.repeat(np.arange(len(traces), dtype=np.int64), sizes)
    group = (lane_codes * len(traces) + trace_codes) * buckets + bucket
    order = np.lexsort((-width, group))  # within each group, the longest first
    first = np.ones(len(order), dtype=bool)
    first[1:] = group[order][1:] != group[order][:-1]
    keep = np.zeros(len(width), dtype=bool)
    keep[order[first]] = True
    offset = 0
    for trace, n in zip(traces, sizes):
        mine = keep[offset:offset + n]
        offset += n
        _select(trace, mine)
    return int(keep.sum())


def _select(trace, mask: np.ndarray) -> None:
    """Keep the bars of one trace where `mask` is true, in every per-bar array it carries."""
    n = len(mask)
    for name in ("x", "y", "base", "text", "hovertext", "customdata"):
        values = getattr(trace, name)
        if values is None or isinstance(values, (str, int, float)):
            continue
        array = np.asarray(values, dtype=object if name in ("y", "text", "hovertext") else None)
        if len(array) == n:
            trace[name] = array[mask].tolist() if array.dtype == object else array[mask]
