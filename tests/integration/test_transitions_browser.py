"""What moving memory cost, read in Chromium: the report's section after the summary and the dashboard's
panel show the same rows for a committed H200 log, and --json carries the same numbers."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dashboards.serve import dashboard_process
from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.transitions import transitions
from miles_profile.report.transitions_html import METER_COLUMNS, meter_rows
from miles_profile.runmodel.whatif import whatif
from miles_profile.visualize import main
from tests.conftest import REPO, table_cells

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LOG = REPO / "sample_logs" / "h200" / "5-both-gpu-peak"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("moving")
    assert main([str(LOG), "-o", str(out / "report.html"), "--json", str(out / "report.json")]) == 0
    return out / "report.html", json.loads((out / "report.json").read_text())["runs"][0]


def test_report_shows_the_meter_and_the_whatif_below_the_timeline(open_report, artifacts, report):
    page, requests, errors = open_report(report[0])
    assert not errors and not requests
    summary, moving, timeline = (page.locator(s).bounding_box() for s in ("#run-summary", "#moving", "#timeline-0"))
    # after the timeline and the checks: the first screen is the summary and where the peak is
    assert summary["y"] < timeline["y"] < moving["y"]
    expected = [[r[k] for k, _ in METER_COLUMNS] for r in meter_rows(transitions(load_run(LOG)))]
    assert table_cells(page, "#moving-table") == expected
    assert "ceiling not measured" in page.locator("#moving-table").inner_text()  # this log has no calibration
    assert page.locator(".share-bar span").count() >= 5
    kv = page.locator('#whatif-table tr[data-offload="offload_kv"][data-category="kv_cache"]')
    assert kv.get_attribute("data-fits") == "fits" and "onload_kv" in kv.inner_text()
    page.locator("#moving").screenshot(path=str(artifacts / "transitions-report.png"))


def test_json_carries_the_same_numbers(report):
    data, run = report[1], load_run(LOG)
    meter, result = transitions(run), whatif(run)
    assert data["transitions"]["share_of_step"] == pytest.approx(meter.share)
    assert data["transitions"]["calibrated"] is False and data["transitions"]["ceilings"] == {}
    onload = next(r for r in data["transitions"]["by_kind"] if r["phase"] == "onload_train" and not r["setup"])
    assert isinstance(onload["measured"], int) and onload["ratio"] is None
    kv = next(r for r in data["whatif"]["rows"] if r["offload"] == "offload_kv" and r["category"] == "kv_cache")
    assert kv["whatif_peak"] == round(result.table.set_index(["offload", "category"]).loc[("offload_kv", "kv_cache"),
                                                                                          "whatif_peak"])
    assert data["whatif"]["total"] == 150754820096 and kv["fits"] == "fits"


def test_dashboard_panel_shows_the_reports_rows(dashboard_page, artifacts, tmp_path):
    shutil.copytree(LOG, tmp_path / LOG.name)
    expected = [[r[k] for k, _ in METER_COLUMNS] for r in meter_rows(transitions(load_run(LOG)))]
    with dashboard_process(tmp_path) as url:
        page = dashboard_page({"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("#moving-table td", timeout=60_000)
        cells = table_cells(page, "#moving-table", "td")
        assert cells == expected
        assert "ceiling not measured" in page.locator("#moving-ceilings").inner_text()
        assert page.locator("#moving-whatif-table td").count() > 0
        assert float(page.locator("#moving-share").get_attribute("data-share")) == pytest.approx(
            transitions(load_run(LOG)).share, abs=1e-4)
        page.locator("#moving-section").screenshot(path=str(artifacts / "transitions-dashboard.png"))
