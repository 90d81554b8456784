"""The dashboard draws with the report's vendored cartesian plotly.js (dashboards/plotly_js.py): every
trace type our figures use is in that build, and the app serves it to the page as window.Plotly."""
from __future__ import annotations

import re

import plotly.graph_objects as go
from plotly.basedatatypes import BaseTraceType

from dashboards import plotly_js
from dashboards.app import create_app
from miles_profile.report import plotly_bundle
from miles_profile.report.plotly_bundle import CARTESIAN_TRACES
from tests.conftest import REPO

_TRACE_CALL = re.compile(r"\bgo\.([A-Z]\w*)\(")


def test_every_trace_type_the_views_draw_is_in_the_cartesian_build():
    # The dashboard cannot see its figures before it draws them, and the build draws a trace type it lacks
    # as a plain scatter without a word (seen with scattergl): every go.<Trace>( of the views is held to it here.
    used = {}
    for path in [*REPO.joinpath("dashboards").rglob("*.py"), *REPO.joinpath("miles_profile", "report").rglob("*.py")]:
        for name in _TRACE_CALL.findall(path.read_text(encoding="utf-8")):
            cls = getattr(go, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseTraceType):
                used.setdefault(cls().type, path.name)
    assert {"scatter", "bar", "heatmap"} <= set(used)  # the scan found the figures
    assert {t: f for t, f in used.items() if t not in CARTESIAN_TRACES} == {}


def test_the_page_loads_the_build_from_the_app(tmp_path):
    client = create_app(tmp_path, preload=False).server.test_client()
    path = plotly_js.route()
    assert path is not None and path.endswith(f"-{plotly_bundle.bundle_version(plotly_bundle.cartesian_build())}.min.js")
    assert f'src="{path}"' in client.get("/").get_data(as_text=True)
    served = client.get(path)
    assert served.status_code == 200 and served.mimetype == "text/javascript"
    assert served.get_data(as_text=True) == plotly_bundle.CARTESIAN_BUILD.read_text(encoding="utf-8")


def test_without_a_usable_build_dash_loads_its_own_bundle(tmp_path, monkeypatch):
    monkeypatch.setattr(plotly_bundle, "CARTESIAN_BUILD", tmp_path / "missing.js")
    plotly_bundle.cartesian_build.cache_clear()
    try:
        page = create_app(tmp_path, preload=False).server.test_client().get("/").get_data(as_text=True)
        assert plotly_js.route() is None and "plotly-cartesian" not in page
    finally:
        plotly_bundle.cartesian_build.cache_clear()
