"""Peak-preserving reduction of long memory series, on numpy arrays only (no plotly, no pandas).

The rule: a reduced series keeps, exactly as recorded,
  * the minimum and maximum of every time bucket (MinMax from tsdownsample, in Rust), so the global
    peak and floor are always kept,
  * the maximum of every given index range (one per phase instance), so every phase's peak is kept
    even when its bucket holds a higher neighbour,
  * the first and last finite samples, and
  * one NaN marker per gap (a run of absent values), so a plot draws the gap instead of a line across it.

Public API (stable; the Dash dashboard uses it too):

    reduce_series(t, y, n_out, ranges=None) -> np.ndarray   # sorted int64 indices into t and y
    phase_ranges(t, starts, ends) -> (i0, i1)               # index ranges of samples in (start, end]
    range_argmax(y, i0, i1) -> np.ndarray                   # index of each range's maximum
    minmax_indices(t, y, n_out) -> np.ndarray               # bucket min/max of the finite samples
    gap_indices(y) -> np.ndarray                            # first NaN of each NaN run

`t` must be sorted ascending (ties allowed). Values are float64 (integers below 2**53 are exact).
"""
from __future__ import annotations

import numpy as np

# Below this many finite points a series is kept whole.
_MIN_BUCKETED = 8


def phase_ranges(t: np.ndarray, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """For each phase, the index range [i0, i1) of samples with start < t <= end.

    A sample's peak covers the time since the previous sample, so these are the samples whose
    peaks fall inside the phase (the sample taken just before `begin` belongs to the phase before).
    """
    t = np.asarray(t, dtype=np.float64)
    i0 = np.searchsorted(t, np.asarray(starts, dtype=np.float64), side="right")
    i1 = np.searchsorted(t, np.asarray(ends, dtype=np.float64), side="right")
    return i0.astype(np.int64), np.maximum(i0, i1).astype(np.int64)


def range_argmax(y: np.ndarray, i0: np.ndarray, i1: np.ndarray) -> np.ndarray:
    """Index of the (first) maximum of y[i0:i1] for each non-empty range with a finite value."""
    y = np.asarray(y, dtype=np.float64)
    filled = np.where(np.isnan(y), -np.inf, y) if np.isnan(y).any() else y
    out = []
    argmax = np.argmax
    for a, b in zip(np.asarray(i0).tolist(), np.asarray(i1).tolist()):
        if b > a:
            k = a + int(argmax(filled[a:b]))
            if filled[k] != -np.inf:
                out.append(k)
    return np.asarray(out, dtype=np.int64)


def gap_indices(y: np.ndarray) -> np.ndarray:
    """The first index of each run of NaN values."""
    nan = np.isnan(np.asarray(y, dtype=np.float64))
    if not nan.any():
        return np.empty(0, dtype=np.int64)
    starts = np.flatnonzero(nan & ~np.concatenate(([False], nan[:-1])))
    return starts.astype(np.int64)


def minmax_indices(t: np.ndarray, y: np.ndarray, n_out: int) -> np.ndarray:
    """Indices of the minimum and maximum of each of n_out/2 equal-time buckets (finite values only)."""
    t = np.asarray(t, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n_out = max(2, int(n_out) // 2 * 2)
    bad = ~(np.isfinite(y) & np.isfinite(t))
    if bad.any():
        finite = np.flatnonzero(~bad)
        tf, yf = t[finite], y[finite]
    else:  # the common case: no gap, no copy
        finite = None
        tf, yf = t, y
    if len(yf) <= max(n_out, _MIN_BUCKETED):
        return np.arange(len(y), dtype=np.int64) if finite is None else finite.astype(np.int64)
    from tsdownsample import MinMaxDownsampler
    if tf[-1] <= tf[0]:  # all at one instant: time buckets are meaningless, keep the extremes
        picked = np.array([np.argmin(yf), np.argmax(yf)])
    else:
        picked = MinMaxDownsampler().downsample(tf, yf, n_out=n_out, parallel=len(yf) > 1_000_000)
        picked = np.concatenate((picked.astype(np.int64), [np.argmin(yf), np.argmax(yf)]))
    return picked.astype(np.int64) if finite is None else finite[picked]


def reduce_series(t: np.ndarray, y: np.ndarray, n_out: int,
                  ranges: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Sorted unique indices to plot: about n_out bucket extrema plus every range's maximum and gaps.

    The result can exceed n_out by the number of ranges and gaps; callers size n_out for that.
    """
    y = np.asarray(y, dtype=np.float64)
    if len(y) <= n_out:
        return np.arange(len(y), dtype=np.int64)
    parts = [minmax_indices(t, y, n_out)]
    if np.isnan(y[0]) or np.isnan(y[-1]):
        finite = np.flatnonzero(np.isfinite(y))
        if len(finite):
            parts.append(finite[[0, -1]])
    else:
        parts.append(np.array([0, len(y) - 1]))
    if ranges is not None:
        parts.append(range_argmax(y, *ranges))
    parts.append(_thin(gap_indices(y), t, max(1, n_out // 4)))
    return np.unique(np.concatenate(parts).astype(np.int64))


def _thin(indices: np.ndarray, t: np.ndarray, limit: int) -> np.ndarray:
    """At most about `limit` of `indices`: the first in each of `limit` equal-time buckets."""
    if len(indices) <= limit:
        return indices
    times = np.asarray(t, dtype=np.float64)[indices]
    span = times[-1] - times[0]
    if not span > 0:
        return indices[:limit]
    bucket = np.minimum(((times - times[0]) / span * limit).astype(np.int64), limit - 1)
    first = np.concatenate(([True], bucket[1:] != bucket[:-1]))
    return indices[first]
