"""thin_phase_bars: at most about max_bars phase bars, each kept one exactly as the figure had it."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_profile.report.live import thin_phase_bars


def lane_figure(n_per_name: int, names=("generate", "train"), seed: int = 0) -> go.Figure:
    rng = np.random.default_rng(seed)
    figure = go.Figure()
    for k, name in enumerate(names):
        base = np.sort(rng.uniform(0, 1000, n_per_name))
        width = rng.uniform(0.01, 2.0, n_per_name)
        lanes = np.where(rng.random(n_per_name) < 0.2, "nested 1", "phases")
        figure.add_trace(go.Bar(x=width, base=base, y=lanes, orientation="h", name=name,
                                text=[name] * n_per_name, hovertext=[f"{name} {b:.6f}" for b in base]))
    return figure


def bars(figure):
    return {t.name: list(zip(np.asarray(t.base, float), np.asarray(t.x, float), t.y, t.hovertext))
            for t in figure.data}


def test_few_bars_are_left_alone():
    figure = lane_figure(50)
    before = bars(figure)
    assert thin_phase_bars(figure, max_bars=600) == 100
    assert bars(figure) == before


@settings(max_examples=30, deadline=None)
@given(n=st.integers(301, 3000), max_bars=st.integers(2, 400), seed=st.integers(0, 10))
def test_kept_bars_are_original_and_every_name_keeps_some(n, max_bars, seed):
    figure = lane_figure(n, seed=seed)
    before = {name: set(rows) for name, rows in bars(figure).items()}
    kept = thin_phase_bars(figure, max_bars=max_bars)
    after = bars(figure)
    lanes = 2
    assert kept == sum(len(rows) for rows in after.values()) <= max(max_bars, 2) * lanes
    for name, rows in after.items():
        assert rows and set(rows) <= before[name]  # exact bars, nothing invented or moved
        assert len({r[3] for r in rows}) == len(rows)  # hover text stayed with its bar


def test_each_bucket_keeps_its_longest_bar():
    figure = go.Figure(go.Bar(x=[1.0, 5.0, 2.0, 0.5, 9.0], base=[0.0, 1.0, 2.0, 50.0, 60.0],
                              y=["phases"] * 5, orientation="h", name="train"))
    thin_phase_bars(figure, max_bars=2)
    assert list(np.asarray(figure.data[0].x)) == [5.0, 9.0]
