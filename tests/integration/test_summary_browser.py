"""The first screen, read in Chromium at 1500x1000 as a user sees it: the report's summary block and the
dashboard's summary panel state the same peak, phase, offloads and verdict as `--json` (issue 18)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dashboards.serve import dashboard_process
from miles_profile.visualize import main

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
# The committed CPU log, an H200 log and a run recorded in this repo's own session (the tiny preset on
# CUDA, all of whose offloads are too small to judge), plus a planted defect that fails.
LOGS = ["sample_logs/cpu", "sample_logs/h200/4-both", "sample_logs/h200-tiny",
        "sample_logs/corpus/h200/llama-grads_kept-cuda"]
VIEWPORT = {"width": 1500, "height": 1000}


def _report(tmp_path: Path, log: str) -> tuple[Path, dict, int]:
    out, js = tmp_path / "report.html", tmp_path / "report.json"
    code = main([str(REPO / log), "-o", str(out), "--json", str(js)])
    return out, json.loads(js.read_text()), code


@pytest.mark.parametrize("log", LOGS)
def test_the_reports_summary_is_on_the_first_screen_and_says_what_json_says(open_report, tmp_path, log):
    out, data, code = _report(tmp_path, log)
    summary = data["runs"][0]["summary"]
    page, requests, errors = open_report(out, **VIEWPORT)
    assert not errors and not requests
    block = page.locator("#run-summary")
    box = block.bounding_box()
    assert box is not None and box["y"] + box["height"] <= VIEWPORT["height"], box  # inside 1500x1000
    assert block.get_attribute("data-status") == summary["status"] == data["status"]
    assert (summary["status"] == "fail") == (code == 1)
    peak = page.locator("#run-peak")
    assert int(peak.get_attribute("data-peak-bytes")) == summary["peak"]["bytes"]
    assert peak.get_attribute("data-peak-phase") == (summary["peak"]["phase"] or "")
    assert f'{summary["peak"]["bytes"] / 1024 ** 3:.2f} GiB' in peak.inner_text()
    rows = page.locator("#run-summary tr[data-offload]")
    shown = {rows.nth(k).get_attribute("data-offload"): rows.nth(k).get_attribute("data-status")
             for k in range(rows.count())}
    assert set(shown) == {o["name"] for o in summary["offloads"]}
    for offload in summary["offloads"]:
        assert (shown[offload["name"]] == "fail") == (offload["failed"] > 0)
    failing = page.locator("#run-summary .failing li")
    assert failing.count() == len(summary["failing"])
    assert [failing.nth(k).get_attribute("data-check") for k in range(failing.count())] == \
        [f["check"] for f in summary["failing"]]


def test_a_failing_checks_link_zooms_the_timeline_to_its_window(open_report, tmp_path):
    out, data, _ = _report(tmp_path, "sample_logs/corpus/h200/llama-grads_kept-cuda")
    first = data["runs"][0]["summary"]["failing"][0]
    page, requests, errors = open_report(out, **VIEWPORT)
    assert not errors and not requests
    page.wait_for_selector("#timeline-0 .main-svg")
    page.locator("#run-summary .failing a.zoom-link").first.click()
    t0 = float(page.locator("#run-summary .failing a.zoom-link").first.get_attribute("data-t0"))
    t1 = float(page.locator("#run-summary .failing a.zoom-link").first.get_attribute("data-t1"))
    shown = page.evaluate("() => document.getElementById('timeline-0').layout.xaxis.range")
    pad = (t1 - t0) * 0.02
    assert shown == pytest.approx([t0 - pad, t1 + pad], abs=1e-3)
    assert t1 - t0 == pytest.approx(first["span"][1] - first["span"][0], abs=1e-3)  # its window, not the run's


@pytest.mark.slow
def test_the_dashboard_shows_the_same_summary(dashboard_page, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(REPO / "sample_logs" / "h200" / "4-both", logs / "4-both")
    _, data, _ = _report(tmp_path, "sample_logs/h200/4-both")
    summary = data["runs"][0]["summary"]
    with dashboard_process(logs) as url:
        page = dashboard_page(VIEWPORT)
        page.goto(url)
        page.wait_for_selector("#summary-peak", timeout=60_000)
        assert page.locator("#summary-status").get_attribute("data-status") == summary["status"]
        assert int(page.locator("#summary-peak").get_attribute("data-peak-bytes")) == summary["peak"]["bytes"]
        box = page.locator("#summary-peak").bounding_box()
        assert box is not None and box["y"] + box["height"] <= VIEWPORT["height"]
        rows = page.locator("tr[data-offload]")
        assert {rows.nth(k).get_attribute("data-offload") for k in range(rows.count())} == \
            {o["name"] for o in summary["offloads"]}
