"""Which plotly.js a report inlines (report/plotly_bundle.py): the vendored cartesian build when every
figure of the page is drawn by it and its version is plotly.py's; plotly.py's own bundle otherwise."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from miles_profile.report import plotly_bundle
from miles_profile.report.build import VisualizeOptions, visualize
from miles_profile.report.plotly_bundle import bundle_version, figure_div, plotly_js
from tests.conftest import REPO

sys.path.insert(0, str(Path(__file__).parent))
from test_miles_dashboard_series import write_engine_series  # noqa: E402
from test_miles_dashboard_import import write_miles_dashboard  # noqa: E402

CARTESIAN_BANNER = "plotly.js (cartesian - minified) v"


def _bundle_of(page: str) -> str:
    return "cartesian" if CARTESIAN_BANNER in page[:20_000] else "full"


def test_the_vendored_build_is_plotly_pys_version():
    # fails when plotly is upgraded without the vendored build: reports would fall back to the 4.8 MB bundle
    vendored = plotly_bundle.CARTESIAN_BUILD.read_text(encoding="utf-8")
    assert bundle_version(vendored) == bundle_version(get_plotlyjs()) is not None


def test_a_report_of_our_logs_inlines_the_cartesian_build(tmp_path):
    out = tmp_path / "r.html"
    assert visualize(VisualizeOptions([str(REPO / "sample_logs" / "h200")], output=str(out)), echo=lambda _: None) in (0, 1)
    page = out.read_text()
    assert _bundle_of(page) == "cartesian" and get_plotlyjs()[:2000] not in page
    assert page.count("Plotly.newPlot(") == page.count("<!-- plotly traces: ") > 10  # timeline, ledger, heatmap...


def test_a_report_with_miles_imported_series_inlines_the_cartesian_build_too(tmp_path):
    dump = write_miles_dashboard(tmp_path / "dump" / "dashboard")
    write_engine_series(dump)
    out = tmp_path / "r.html"
    assert visualize(VisualizeOptions([str(dump)], output=str(out)), echo=lambda _: None) == 0
    page = out.read_text()
    traces = {t for mark in re.findall(r"<!-- plotly traces: ([a-z0-9 ]*) -->", page) for t in mark.split()}
    assert "GPU utilization" in page and traces == {"scatter", "heatmap"} and _bundle_of(page) == "cartesian"


@pytest.mark.parametrize("figure, expected", [
    (go.Figure(go.Scatter(y=[1, 2])), "cartesian"),
    (go.Figure([go.Bar(y=[1]), go.Heatmap(z=[[1]])]), "cartesian"),
    (go.Figure(go.Scattergl(y=[1, 2])), "full"),
    (go.Figure([go.Scatter(y=[1]), go.Scatter3d(x=[1], y=[1], z=[1])]), "full"),
])
def test_the_build_follows_the_trace_types(figure, expected):
    assert _bundle_of(plotly_js(figure_div(figure))) == expected


def test_a_figure_that_did_not_say_its_traces_gets_the_full_bundle():
    unmarked = go.Figure(go.Scatter(y=[1])).to_html(full_html=False, include_plotlyjs=False)
    assert _bundle_of(plotly_js(figure_div(go.Figure(go.Bar(y=[1]))) + unmarked)) == "full"


def test_a_vendored_build_of_another_version_is_not_used(tmp_path, monkeypatch):
    other = tmp_path / "plotly-cartesian.min.js"
    other.write_text("/**\n* plotly.js (cartesian - minified) v0.0.1\n*/\nvar Plotly = {};\n")
    monkeypatch.setattr(plotly_bundle, "CARTESIAN_BUILD", other)
    plotly_bundle.cartesian_build.cache_clear()
    try:
        assert plotly_js(figure_div(go.Figure(go.Scatter(y=[1])))) == get_plotlyjs()
        monkeypatch.setattr(plotly_bundle, "CARTESIAN_BUILD", tmp_path / "missing.js")
        plotly_bundle.cartesian_build.cache_clear()
        assert plotly_js(figure_div(go.Figure(go.Scatter(y=[1])))) == get_plotlyjs()
    finally:
        plotly_bundle.cartesian_build.cache_clear()
