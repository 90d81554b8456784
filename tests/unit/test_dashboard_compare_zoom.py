"""A live comparison redraws with the user's last x zoom, never with garbage, and never edits the shared figure."""
from __future__ import annotations

import plotly.graph_objects as go

from dashboards.panels.compare import with_zoom


def figure() -> go.Figure:
    return go.Figure(go.Scatter(x=[0, 10], y=[1, 2]))


def test_the_zoom_is_applied_to_a_copy():
    shared = figure()
    shown = with_zoom(shared, {"range": [6, 2], "at": 1})
    assert list(shown.layout.xaxis.range) == [2, 6] and shown.layout.xaxis.autorange is False
    assert shared.layout.xaxis.range is None  # the cached comparison is untouched


def test_no_zoom_autorange_or_garbage_leaves_the_figure_as_it_is():
    shared = figure()
    for zoom in (None, {"auto": True, "at": 1}, {"range": [3, 3]}, {"range": ["a", 1]}, {"range": 5}, [1, 2], "x"):
        assert with_zoom(shared, zoom) is shared, zoom
