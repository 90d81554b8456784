"""Which plotly.js a report inlines: the cartesian build when every figure of the page is drawn by it, else
plotly.py's own bundle.

plotly.py ships one bundle with every trace type (4.8 MB), and running it is most of what opening a report
costs: `python bench/page_open_cost.py` (2026-12-06, the 2-core VM) gives 2.5-2.65 machine CPU-s for that
bundle and one small figure, 1.8 for the cartesian build of the same version, 3.2-3.5 for a whole report.
The cartesian build (`vendor/plotly-cartesian.min.js`: npm's plotly.js-cartesian-dist-min, MIT, unchanged)
draws bar, box, contour, heatmap, histogram, histogram2d(contour), image, pie, scatter, scatterternary and
violin: every figure of ours, the report's and the dashboard's (dashboards/plotly_js.py). A figure div says
its trace types in a comment (`figure_div`); a page with a figure not made here, a trace type outside the
build, or a build of another version than plotly.py's (plotly upgraded, the vendored file not) gets
plotly.py's bundle.
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from plotly.offline import get_plotlyjs

CARTESIAN_BUILD = Path(__file__).with_name("vendor") / "plotly-cartesian.min.js"
CARTESIAN_TRACES = frozenset({"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
                              "image", "pie", "scatter", "scatterternary", "violin"})
_MARK = re.compile(r"<!-- plotly traces: ([a-z0-9 ]*) -->")
_VERSION = re.compile(r"plotly\.js[^\n]*? v(\d+\.\d+\.\d+)")  # the banner's first lines


def figure_div(figure, **to_html) -> str:
    """The figure as plotly.py writes it into a page (no bundle), after a comment naming its trace types."""
    types = " ".join(sorted({trace.type for trace in figure.data}))
    return f"<!-- plotly traces: {types} -->" + figure.to_html(full_html=False, include_plotlyjs=False, **to_html)


def bundle_version(source: str) -> str | None:
    found = _VERSION.search(source[:400])
    return found.group(1) if found else None


@cache
def cartesian_build() -> str | None:
    """The vendored build, None where it is missing or not plotly.py's version."""
    try:
        source = CARTESIAN_BUILD.read_text(encoding="utf-8")
    except OSError:
        return None
    version = bundle_version(source)
    return source if version is not None and version == bundle_version(get_plotlyjs()) else None


def plotly_js(page: str) -> str:
    """The bundle for a page whose figures are the `figure_div`s in `page`."""
    marks = _MARK.findall(page)
    if len(marks) != page.count("Plotly.newPlot("):  # a figure that did not say its traces
        return get_plotlyjs()
    if any(t not in CARTESIAN_TRACES for mark in marks for t in mark.split()):
        return get_plotlyjs()
    return cartesian_build() or get_plotlyjs()
