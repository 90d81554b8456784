"""Peak-preserving reduction: adversarial series (spikes, plateaus, NaN gaps) and properties."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from miles_profile.runmodel.reduce import gap_indices, minmax_indices, phase_ranges, range_argmax, reduce_series


def test_one_sample_spike_survives_a_million_points():
    rng = np.random.default_rng(0)
    t = np.arange(1_000_000, dtype=float) * 0.02
    y = rng.integers(10 * 2**30, 11 * 2**30, size=len(t)).astype(float)
    y[123_457] = 40 * 2**30 + 7  # one sample, odd byte count
    keep = reduce_series(t, y, 10_000)
    assert len(keep) <= 10_000 + 2
    assert y[keep].max() == 40 * 2**30 + 7
    assert 123_457 in keep


def test_each_phase_peak_is_kept_even_when_a_neighbour_is_higher():
    t = np.arange(100_000, dtype=float)
    y = np.full(len(t), 5.0)
    y[50_000] = 1000.0  # global peak
    starts = np.arange(0, 100_000, 1000) - 0.5
    ends = starts + 999.0
    rng = np.random.default_rng(1)
    peaks = starts.astype(int) + 1 + rng.integers(0, 998, len(starts))
    y[peaks] = 6.0 + np.arange(len(peaks)) * 1e-3  # a small peak in every phase
    y[50_000] = 1000.0
    ranges = phase_ranges(t, starts, ends)
    keep = reduce_series(t, y, 20, ranges)  # each bucket spans ten phases
    kept = set(keep.tolist())
    for a, b in zip(*ranges):
        assert y[a:b].max() in y[[k for k in kept if a <= k < b]]
    assert y[keep].max() == 1000.0


def test_plateau_keeps_its_value_and_both_ends():
    t = np.arange(50_000, dtype=float)
    y = np.full(len(t), 7.0)
    keep = reduce_series(t, y, 100)
    assert keep[0] == 0 and keep[-1] == len(t) - 1
    assert set(np.unique(y[keep])) == {7.0}
    assert len(keep) <= 102


def test_nan_gaps_are_drawn_as_gaps_and_never_hide_a_peak():
    t = np.arange(20_000, dtype=float)
    y = np.sin(t / 100.0) * 100 + 200
    y[5_000:6_000] = np.nan
    y[12_000] = 1e6
    y[12_001:12_010] = np.nan
    keep = reduce_series(t, y, 500)
    assert 5_000 in keep and 12_001 in keep  # first NaN of each gap
    assert np.nanmax(y[keep]) == 1e6


def test_all_nan_and_empty_and_tiny_series():
    t = np.arange(10, dtype=float)
    assert list(reduce_series(t, np.full(10, np.nan), 4)) == [0]
    assert len(reduce_series(np.empty(0), np.empty(0), 100)) == 0
    assert list(reduce_series(t[:3], np.array([1.0, 5.0, 2.0]), 100)) == [0, 1, 2]


def test_equal_times_do_not_break_bucketing():
    t = np.zeros(10_000)
    y = np.arange(10_000, dtype=float)
    keep = reduce_series(t, y, 100)
    assert 9_999 in keep and 0 in keep


def test_gap_indices_and_range_argmax():
    y = np.array([1, np.nan, np.nan, 3, np.nan, 2], dtype=float)
    assert list(gap_indices(y)) == [1, 4]
    assert list(range_argmax(y, np.array([0, 1, 5]), np.array([4, 3, 5]))) == [3]  # all-NaN and empty skipped


def _argmax_by_loop(y, i0, i1):
    """The obvious reference: the first maximum of each range with a finite value, in range order."""
    out = []
    for a, b in zip(i0, i1):
        part = np.where(np.isnan(y[a:b]), -np.inf, y[a:b])
        if b > a and part.max() > -np.inf:
            out.append(a + int(np.argmax(part)))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_range_argmax_matches_a_loop_on_nested_unsorted_ranges_with_ties_and_nans(seed):
    rng = np.random.default_rng(seed)
    n = 5_000
    y = rng.integers(0, 40, n).astype(float)  # many ties: the first maximum must win
    y[rng.random(n) < 0.2] = np.nan
    y[n - 1] = 100.0  # a range ending at len(y) keeps the last sample
    y[300:700] = np.nan  # all-NaN ranges are skipped
    i0 = rng.integers(0, n, 300)
    i1 = np.minimum(i0 + rng.integers(-3, 900, 300), n)  # empty, nested, overlapping, unsorted
    i0[:3], i1[:3] = [n - 50, 310, 0], [n, 690, n]
    assert list(range_argmax(y, i0, i1)) == _argmax_by_loop(y, i0, i1)


def test_minmax_keeps_the_extremes_of_finite_samples_only():
    t = np.arange(10_000, dtype=float)
    y = np.sin(t / 50.0) + 2
    y[4_000] = np.inf  # not a sample value: dropped, as NaN is
    y[7_000] = -5.0
    picked = minmax_indices(t, y, 100)
    assert 4_000 not in picked and 7_000 in picked
    assert np.isfinite(y[picked]).all() and y[picked].max() == np.nanmax(np.where(np.isinf(y), np.nan, y))


@st.composite
def series_and_ranges(draw):
    n = draw(st.integers(1, 3000))
    y = draw(hnp.arrays(np.float64, n, elements=st.one_of(
        st.floats(0, 2**40, allow_nan=False), st.just(np.nan)), fill=st.nothing()))
    t = np.cumsum(draw(hnp.arrays(np.float64, n, elements=st.sampled_from([0.0, 0.01, 0.02, 1.0]))))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=20)))
    starts = t[np.minimum(np.asarray(cuts, dtype=np.int64), n - 1)] - 0.001
    ends = starts + draw(st.floats(0, 5))
    return t, y, (starts, ends), draw(st.integers(4, 400))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(series_and_ranges())
def test_reduction_properties(case):
    t, y, (starts, ends), n_out = case
    ranges = phase_ranges(t, starts, ends)
    keep = reduce_series(t, y, n_out, ranges)
    assert np.all(np.diff(keep) > 0) and (len(keep) == 0 or (keep[0] >= 0 and keep[-1] < len(y)))
    if np.isfinite(y).any():
        assert np.nanmax(y[keep]) == np.nanmax(y)  # the global peak, exactly
        assert np.nanmin(y[keep]) == np.nanmin(y)
    for a, b in zip(*ranges):
        part = y[a:b]
        if np.isfinite(part).any():
            inside = keep[(keep >= a) & (keep < b)]
            assert np.nanmax(y[inside]) == np.nanmax(part)  # every phase's peak, exactly
    assert len(keep) <= max(len(y) if len(y) <= n_out else 0, n_out + 4 + len(starts) + n_out // 4 + 1)
