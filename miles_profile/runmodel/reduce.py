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
    thin_bars(start, end, lane, kind, max_bars) -> np.ndarray  # sorted indices of the bars to draw

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
    """Index of the (first) maximum of y[i0:i1] for each non-empty range with a finite value.

    NaN is ignored; indices come in the order of the ranges. No Python loop over the ranges: a run has
    thousands of phases and a wide zoom reduces every series again. Each range is cut into chunks of
    _CHUNK samples, one `np.fmax.reduceat` gives every chunk's maximum (hence every range's), and only
    the first chunk of each range that reaches the range's maximum is searched for its position.
    """
    y = np.asarray(y, dtype=np.float64)
    i0, i1 = np.asarray(i0, dtype=np.int64), np.asarray(i1, dtype=np.int64)
    live = np.flatnonzero(i1 > i0)
    if not len(live):
        return np.empty(0, dtype=np.int64)
    live = live[np.argsort(i0[live], kind="stable")]  # sorted, the gaps reduced in between sum to < len(y)
    first, end, owner, counts = _chunks(i0[live], i1[live])
    chunk_peak = _chunk_max(y, first, end, counts)
    peak = np.fmax.reduceat(chunk_peak, np.cumsum(counts) - counts)  # NaN where a range is all NaN
    reached = np.flatnonzero(chunk_peak >= peak[owner])  # NaN never compares true
    _, at = np.unique(owner[reached], return_index=True)
    chunk = reached[at]  # per range, the first chunk holding its maximum
    chunk = chunk[peak[owner[chunk]] > -np.inf]
    offsets = first[chunk][:, None] + np.arange(_CHUNK)
    values = y[np.minimum(offsets, len(y) - 1)]
    match = (offsets < end[chunk][:, None]) & (values >= peak[owner[chunk]][:, None])
    found = offsets[np.arange(len(chunk)), match.argmax(axis=1)]
    return found[np.argsort(live[owner[chunk]], kind="stable")]  # back to the caller's order


_CHUNK = 64  # fewer, longer chunks cost more searching; more, shorter ones cost reduceat per chunk


def _chunks(i0: np.ndarray, i1: np.ndarray):
    """Ranges (sorted by i0, non-empty) cut into chunks of at most _CHUNK: (first, end, owner, counts)."""
    counts = (i1 - i0 + _CHUNK - 1) // _CHUNK
    owner = np.repeat(np.arange(len(i0)), counts)
    step = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    first = i0[owner] + step * _CHUNK
    return first, np.minimum(first + _CHUNK, i1[owner]), owner, counts


def _chunk_max(y: np.ndarray, first: np.ndarray, end: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """max of y[first:end] per chunk, NaN ignored (NaN where all NaN), by one np.fmax.reduceat.

    A range's chunks are contiguous, so its bounds are its chunk starts then its end; the value reduced
    at each end (the gap up to the next range) is dropped. reduceat takes no bound at len(y): an end
    there is moved to the last sample, which is then folded into the chunk it ends.
    """
    n = len(y)
    last_of_range = np.cumsum(counts) - 1
    bounds = np.insert(first, last_of_range + 1, end[last_of_range])
    is_chunk = np.ones(len(bounds), dtype=bool)
    is_chunk[last_of_range + np.arange(1, len(counts) + 1)] = False
    peak = np.fmax.reduceat(y, np.minimum(bounds, n - 1))[is_chunk]
    clipped = (end == n) & (first < n - 1)
    peak[clipped] = np.fmax(peak[clipped], y[n - 1])
    return peak


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
    if _all_finite(y) and _all_finite(t):  # the common case: no gap, no mask, no copy
        finite = None
        tf, yf = t, y
    else:
        finite = np.flatnonzero(np.isfinite(y) & np.isfinite(t))
        tf, yf = t[finite], y[finite]
    if len(yf) <= max(n_out, _MIN_BUCKETED):
        return np.arange(len(y), dtype=np.int64) if finite is None else finite.astype(np.int64)
    from tsdownsample import MinMaxDownsampler  # the report extra's (Rust); only for a series long enough to reduce
    if tf[-1] <= tf[0]:  # all at one instant: time buckets are meaningless, keep the extremes
        picked = np.array([np.argmin(yf), np.argmax(yf)], dtype=np.int64)
    else:
        picked = MinMaxDownsampler().downsample(tf, yf, n_out=n_out, parallel=len(yf) > 1_000_000)
        picked = _with_extremes(picked.astype(np.int64), yf)
    return picked if finite is None else finite[picked]


def _all_finite(a: np.ndarray) -> bool:
    """True when every value is finite, without a temporary array: a NaN or an infinity makes the sum
    NaN or infinite (an overflowing sum of finite values only sends the caller down the slow path)."""
    return bool(np.isfinite(np.add.reduce(a)))


def _with_extremes(picked: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`picked` plus the global minimum and maximum of y where the buckets did not already hold them."""
    values = y[picked]
    extra = [np.argmin(y)] if values.min() != y.min() else []
    extra += [np.argmax(y)] if values.max() != y.max() else []
    return np.concatenate((picked, np.asarray(extra, dtype=np.int64))) if extra else picked


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


def thin_bars(start: np.ndarray, end: np.ndarray, lane: np.ndarray, kind: np.ndarray, max_bars: int) -> np.ndarray:
    """Sorted indices of the bars (phase instances) to draw: about `max_bars` per lane.

    Bars are reduced the way series are: all are kept up to `max_bars`; past it, per lane and per kind
    (phase name, so every phase keeps its colour along the run) the time axis is cut into
    max_bars / kinds equal buckets and each bucket keeps its longest bar, exactly as it was. `lane` and
    `kind` are integer codes. A 10-million-sample run has 7 000 phases, a thousand to a pixel column
    at full width, and a browser spends seconds laying them out; zooming in (a narrower window) keeps more.
    """
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    if len(start) <= max_bars:
        return np.arange(len(start), dtype=np.int64)
    lane, kind = np.asarray(lane, dtype=np.int64), np.asarray(kind, dtype=np.int64)
    buckets = max(1, int(max_bars) // len(np.unique(kind)))
    lo, hi = float(start.min()), float(end.max())
    bucket = np.clip(((start - lo) / max(hi - lo, 1e-12) * buckets).astype(np.int64), 0, buckets - 1)
    group = (lane * (int(kind.max()) + 1) + kind) * buckets + bucket
    order = np.lexsort((-(end - start), group))  # within each group, the longest first
    first = np.ones(len(order), dtype=bool)
    first[1:] = group[order][1:] != group[order][:-1]
    return np.sort(order[first]).astype(np.int64)
