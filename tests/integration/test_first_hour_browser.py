"""A new user's first hour in Chromium (issue 35): the dashboard fits a 1440 px window."""
from __future__ import annotations

import shutil

import pytest

from dashboards.serve import dashboard_process
from tests.conftest import REPO

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_dashboard_fits_1440_px_with_every_verdict_visible(dashboard_page, tmp_path, artifacts):
    """9-dist-engine-server: the peak's long detail line pushed the offload table, and its pass badges,
    to 1,494 px."""
    shutil.copytree(REPO / "sample_logs/h200/9-dist-engine-server", tmp_path / "logs" / "9-dist-engine-server")
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr, dashboard_process(tmp_path / "logs", stderr=stderr) as url:
        page = dashboard_page({"width": 1440, "height": 900})
        page.goto(url)
        page.wait_for_selector(".summary-offloads .badge")
        page.wait_for_selector("#fleet-status:not(:empty)", timeout=60_000)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1440
        rights = page.evaluate("[...document.querySelectorAll('.summary-offloads .badge')]"
                               ".map(b => b.getBoundingClientRect().right)")
        assert rights and max(rights) <= 1440, rights
        assert page.locator("#fleet-status").inner_text().startswith("1 lane ·")
        page.screenshot(path=str(artifacts / "dashboard-1440.png"))
    assert "Traceback" not in stderr_path.read_text()
