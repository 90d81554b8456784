"""A Miles dashboard import in the dashboard, in headless Chromium (issue 18 item 6): a dump without phase
events says why the fleet heatmap is empty instead of drawing a blank one, and still draws each GPU's
utilization and power; its ledger says why it has no rows. Every figure is drawn by the cartesian plotly.js
build (dashboards/plotly_js.py), plotly.py's full bundle never fetched. Screenshot in artifacts/."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from dashboards.serve import dashboard_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_miles_dashboard_import import write_miles_dashboard  # noqa: E402

pytestmark = pytest.mark.browser


def test_an_empty_fleet_view_says_why_and_the_utilization_is_drawn(browser, artifacts, tmp_path):
    dump = write_miles_dashboard(tmp_path / "dump" / "dashboard", iterations=2)
    shutil.rmtree(dump / "phases")
    (dump / "topology.jsonl").unlink()
    with dashboard_process(dump.parent) as url:
        context = browser.new_context(viewport={"width": 1500, "height": 1000})
        page = context.new_page()
        fetched: list[str] = []
        page.on("request", lambda request: fetched.append(request.url))
        try:
            page.goto(url)
            reason = page.locator("#fleet-message")
            reason.get_by_text("no phase events").wait_for(timeout=60_000)
            assert reason.is_visible() and "fleet heatmap has no columns" in reason.inner_text()
            assert not page.locator("#fleet-heatmap").is_visible()  # no blank heatmap under the reason
            page.wait_for_function("() => { const g = document.querySelector('#miles-series-graph .js-plotly-plot');"
                                   " return g && g._fullData && g._fullData.length >= 16; }", timeout=60_000)
            assert any("plotly-cartesian" in u for u in fetched)
            assert not any("package_data/plotly" in u for u in fetched), "plotly.py's 4.8 MB bundle was fetched"
            titles = page.locator("#miles-series-graph .annotation-text").all_text_contents()  # drawn in the SVG
            assert {"GPU utilization (%)", "GPU power (W)"} <= set(titles)
            assert "no SGLang engine series" in page.locator("#miles-series-note").inner_text()
            page.locator("#ledger-add-up").get_by_text("no phase events, so the ledger").wait_for(timeout=60_000)
            assert not page.locator("#ledger-graph").is_visible()
            page.locator("#fleet-panel").screenshot(path=str(artifacts / "miles-dump-no-phases-fleet.png"))
        finally:
            context.close()
