"""`python -m dashboards LOG_DIR --phase offload` in headless Chromium, on the real H200 log: the checks
panel, the per-phase table and the timeline's phase bands hold only the selected phases."""
from __future__ import annotations

import shutil

import pytest

from dashboards.serve import dashboard_process
from tests.conftest import REPO

pytestmark = pytest.mark.browser

PHASE_BANDS_JS = """() => { const g = document.querySelector('#timeline-graph .js-plotly-plot');
  if (!g || !g._fullData) return null;
  return [...new Set(g._fullData.filter(d => d.legendgroup === 'phases' || (d.name || '').match(/^(on|off)load_|^train$|^generate$|^update_weights$/)).map(d => d.name))]; }"""


def test_the_page_shows_and_judges_only_the_selected_phases(dashboard_page, tmp_path, artifacts):
    shutil.copytree(REPO / "sample_logs/h200/4-both", tmp_path / "logs" / "4-both")
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr, dashboard_process(tmp_path / "logs", stderr=stderr,
                                                             args=["--phase", "offload"]) as url:
        page = dashboard_page({"width": 1400, "height": 900})
        page.goto(url)
        page.wait_for_selector("#checks-list .checks-item")
        checks = page.locator("#checks-list").inner_text()
        assert "in phases not selected (--phase offload)" in checks
        page.wait_for_selector("#phases-table .dash-spreadsheet")
        table = page.locator("#phases-table").inner_text()
        assert "offload_train" in table and "offload_rollout" in table
        assert "generate" not in table and "onload_kv" not in table
        page.wait_for_function(f"() => ({PHASE_BANDS_JS})() !== null && ({PHASE_BANDS_JS})().length > 0")
        bands = page.evaluate(PHASE_BANDS_JS)
        assert set(bands) == {"offload_train", "offload_rollout"}
        page.screenshot(path=str(artifacts / "dashboard-phase-offload.png"), full_page=True)
    assert "Traceback" not in stderr_path.read_text()
