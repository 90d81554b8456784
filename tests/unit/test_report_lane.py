"""The phase lane: thin_bars keeps about max_bars bars per lane, each one exactly as recorded, and
timeline_figure draws the lane thinned, named only when readable, and shaded by the phases in view."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_profile.report.figures import NAMED_BARS_MAX, PHASE_BARS_MAX, SHADED_PHASES_MAX, timeline_figure
from miles_profile.runmodel.reduce import thin_bars
from tests.unit.test_report_fakes import GiB, make_run


def random_bars(n: int, kinds: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    start = rng.uniform(0, 1000, n)
    end = start + rng.uniform(0.01, 2.0, n)
    return start, end, (rng.random(n) < 0.2).astype(int), rng.integers(0, kinds, n)


def test_few_bars_are_left_alone():
    start, end, lane, kind = random_bars(100)
    assert list(thin_bars(start, end, lane, kind, 600)) == list(range(100))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(301, 3000), max_bars=st.integers(2, 400), seed=st.integers(0, 10))
def test_kept_bars_are_few_and_every_kind_keeps_some(n, max_bars, seed):
    start, end, lane, kind = random_bars(n, seed=seed)
    kept = thin_bars(start, end, lane, kind, max_bars)
    assert np.all(np.diff(kept) > 0) and len(kept) <= max(max_bars, 2) * 2  # two lanes
    assert set(kind[kept]) == set(kind)


def test_each_bucket_keeps_its_longest_bar():
    start = np.array([0.0, 1.0, 2.0, 50.0, 60.0])
    end = start + np.array([1.0, 5.0, 2.0, 0.5, 9.0])
    assert list(thin_bars(start, end, np.zeros(5), np.zeros(5), 2)) == [1, 4]


def long_run(iterations: int = 300):
    """Three top-level phases per iteration (900 > SHADED_PHASES_MAX), 1 s each, sampled every 0.1 s."""
    t = np.arange(0, 3.0 * iterations, 0.1) + 1000.0
    names = ["generate", "train", "update_weights"] * iterations
    phases = [{"name": name, "start": 1000.0 + k, "end": 1000.0 + k + 0.9} for k, name in enumerate(names)]
    return make_run({"t": t, "rss": np.full(len(t), 2 * GiB), "rss_peak": np.full(len(t), 2 * GiB)}, phases)


def bars_and_bands(figure):
    """The lane's traces (one per phase name; each bar a segment start, middle, end, gap), the number
    of bars drawn, and the shaded bands."""
    bars = [tr for tr in figure.data if tr.legendgroup == "phases" and tr.mode == "lines"]
    bands = [s for s in figure.layout.shapes if s.type == "rect"]
    return bars, sum(int(np.isnan(np.asarray(b.x, float)).sum()) for b in bars), bands


def names(figure) -> dict[str, int]:
    """Phase name -> how many of its bars carry the name (a text trace beside the segments)."""
    return {tr.name: len(tr.text) for tr in figure.data if tr.legendgroup == "phases" and tr.mode == "text"}


def test_the_whole_run_draws_a_thinned_unnamed_lane_and_no_bands():
    run = long_run()
    assert len(run.phases) > SHADED_PHASES_MAX
    bars, n_bars, bands = bars_and_bands(timeline_figure(run))
    assert NAMED_BARS_MAX < n_bars <= PHASE_BARS_MAX < len(run.phases)
    assert len(bars) == 3  # every phase name keeps bars, and its colour
    assert names(timeline_figure(run)) == {} and not bands  # too many bars to be named
    figure = timeline_figure(run, max_phase_bars=300)
    assert bars_and_bands(figure)[1] <= 300
    assert names(figure) == {}  # few enough to be named, but 0.9 s of 900 s is too narrow for a name
    # 0.9 s of 9 s is 100 px: "generate" and "train" fit, "update_weights" (14 letters) does not
    assert names(timeline_figure(long_run(3))) == {"generate": 3, "train": 3}


def test_a_zoom_into_a_long_run_draws_every_phase_in_view_named_and_shaded():
    run = long_run()
    bars, n_bars, bands = bars_and_bands(timeline_figure(run, t_range=(100.0, 120.0)))
    assert n_bars == 21  # the phases that overlap [100, 120] s
    assert n_bars <= NAMED_BARS_MAX <= PHASE_BARS_MAX
    # 0.9 s of 20 s is 45 px of a 1000 px plot: room for "train", not for "generate" (about 7 px a letter)
    assert names(timeline_figure(run, t_range=(100.0, 120.0))) == {"train": 7}
    assert len(bands) == 21  # one memory row: the host
    figure = timeline_figure(run, t_range=(100.0, 106.0))
    assert bars_and_bands(figure)[1] == 7 and sum(names(figure).values()) == 7  # 150 px each: all fit
