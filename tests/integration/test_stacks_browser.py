"""Which code made the peak, read in Chromium: the report's section and the dashboard's panel show the same
site rows for a real run carrying a snapshot beside its log (test_stacks_record.record_run_with_snapshot)."""
from __future__ import annotations

import pytest

from dashboards.serve import dashboard_process
from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.stacks import MEMORY_VIZ_URL, stacks_of
from miles_profile.report.stacks_html import SITE_COLUMNS, site_rows
from miles_profile.visualize import main
from test_stacks_record import record_run_with_snapshot
from tests.conftest import table_cells

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_report_and_dashboard_show_the_same_sites(open_report, dashboard_page, artifacts, tmp_path):
    run_dir = record_run_with_snapshot(tmp_path / "logs")
    (found,) = stacks_of(load_run(run_dir))
    expected = [[r[k] for k, _ in SITE_COLUMNS] for r in site_rows(found.top)]
    assert expected[0][0] == "/home/u/train.py:77"
    out = tmp_path / "report.html"
    assert main([str(run_dir), "-o", str(out)]) == 0
    page, requests, errors = open_report(out)
    assert not errors and not requests
    assert table_cells(page, "#stacks-table-0-0") == expected
    section = page.locator("#stacks").inner_text()
    assert "Which code made the peak" in section and MEMORY_VIZ_URL in section and "train #1" in section
    page.locator("#stacks").screenshot(path=str(artifacts / "stacks-report.png"))
    with dashboard_process(tmp_path / "logs") as url:
        dash_page = dashboard_page({"width": 1400, "height": 1000})
        dash_page.goto(url)
        dash_page.wait_for_selector("#stacks-table-0-0 td", timeout=60_000)
        cells = table_cells(dash_page, "#stacks-table-0-0", "td")
        assert cells == expected
        assert MEMORY_VIZ_URL in dash_page.locator("#stacks-section").inner_text()
        dash_page.locator("#stacks-section").screenshot(path=str(artifacts / "stacks-dashboard.png"))
