"""A report inlining the cartesian plotly.js build draws every figure in Chromium, as one inlining plotly.py's
bundle does (report/plotly_bundle.py): a trace type the build lacked would leave a figure without its svg
and raise a page error. A comparison's folded runs draw their figures when opened (report/run_fold.py): each
fold is opened, as a reader clicks it, before the figures are counted."""
from __future__ import annotations

import pytest

from miles_profile.report.build import VisualizeOptions, visualize
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def _drawn(open_report, page_file):
    page, _, errors = open_report(page_file, width=1440)
    for summary in page.locator("details.run-fold > summary").all():
        summary.click()
    figures = page.locator(".plotly-graph-div")
    # every figure drawn (plotly.js makes three .main-svg per figure: a count of them is met at a third of the figures)
    page.wait_for_function("[...document.querySelectorAll('.plotly-graph-div')]"
                           ".every(d => d.querySelector('.main-svg') && d._fullData)", timeout=60_000)
    # a trace type the build lacks still gets an svg, and plotly.js makes that trace an invisible scatter
    drawn = page.evaluate("[...document.querySelectorAll('.plotly-graph-div')].filter(d => d.querySelector('.main-svg')"
                          " && d._fullData && d._fullData.length === d.data.length"
                          " && d._fullData.every(t => t.type === (d.data[t.index].type || 'scatter'))).length")
    return figures.count(), drawn, page.evaluate("Plotly.version"), list(errors)


@pytest.mark.parametrize("logs", ["h200", "h200-tms-dist", "cpu"])
def test_every_figure_of_a_cartesian_report_is_drawn(open_report, tmp_path, logs):
    out = tmp_path / "r.html"
    visualize(VisualizeOptions([str(REPO / "sample_logs" / logs)], output=str(out)), echo=lambda _: None)
    assert "plotly.js (cartesian - minified)" in out.read_text()[:20_000]
    figures, drawn, version, errors = _drawn(open_report, out)
    assert figures >= 3 and drawn == figures and version and errors == [], (figures, drawn, errors)
