"""The dashboard's plotly.js: the report's vendored cartesian build (miles_profile/report/plotly_bundle.py)
as `window.Plotly`, which dcc.Graph then uses instead of fetching plotly.py's 4.8 MB bundle. Every figure
the panels draw is a trace type of that build (tests/unit/test_dashboard_plotly_js.py holds it). Where the
build is missing or not plotly.py's version, nothing is added and Dash loads its own bundle as before.
"""
from __future__ import annotations

import dash
from flask import Response

from miles_profile.report.plotly_bundle import bundle_version, cartesian_build

# One day in the browser's cache: the version is in the path, so a plotly upgrade is a new URL.
_CACHE_S = 86_400


def route() -> str | None:
    """The path the page loads the build from, None where there is no usable build."""
    source = cartesian_build()
    return None if source is None else f"/_miles_profile/plotly-cartesian-{bundle_version(source)}.min.js"


def serve(app: dash.Dash, path: str) -> None:
    """Answer `path` (from route()) with the build."""
    body = (cartesian_build() or "").encode()

    def build() -> Response:
        return Response(body, mimetype="text/javascript", headers={"Cache-Control": f"public, max-age={_CACHE_S}"})

    app.server.add_url_rule(path, "plotly_cartesian", build)
