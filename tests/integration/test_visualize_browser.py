"""The report in real headless Chromium, offline: figures render, the checks table is there."""
from __future__ import annotations

import pytest

import miles_profile as mp
from miles_profile.verdicts.engine import judge
from miles_profile.visualize import main
from test_visualize_cli import record

pytestmark = pytest.mark.browser


def test_report_renders_offline_in_chromium(open_report, artifacts, tmp_path):
    logs = record(tmp_path, "late", rounds=3)  # a failing offload: the report must show it plainly
    out = tmp_path / "report.html"
    assert main([str(logs), "-o", str(out)]) == 1
    page, requests, errors = open_report(out)
    assert not errors, errors
    assert not requests, f"the report fetched {requests}"
    # The timeline drew its memory lines and the named phase bars (segments of the lane's traces).
    lane = page.evaluate("""() => {
      const g = document.querySelector('#timeline-0.js-plotly-plot, #timeline-0 .js-plotly-plot');
      return g._fullData.filter(d => d.legendgroup === 'phases' && d.mode === 'lines').map(d => Array.from(d.x).filter(isNaN).length); }""")
    assert len(lane) == 3 and sum(lane) >= 9  # three phase names, three rounds
    assert page.locator("#timeline-0 .scatterlayer .trace").count() >= 2 + len(lane)
    texts = page.eval_on_selector_all("#timeline-0 .scatterlayer .textpoint text", "els => els.map(e => e.textContent)")
    assert "generate" in texts
    # The checks table, with the failing check flagged.
    rows = page.locator("#checks tbody tr")
    statuses = [c.status for c in judge(mp.load(logs)).checks]
    folded = statuses.count("n/a") if statuses.count("n/a") >= 2 else 0  # several n/a checks: one row
    assert rows.count() == len(statuses) - folded + (folded > 0)  # one row per check of the one verdict
    failing = page.locator('#checks tr[data-check="offload_drop"] .badge')
    assert failing.inner_text() == "FAIL"
    assert page.locator("#overall").inner_text() == "FAIL"
    assert page.locator("#phases tbody tr").count() == 3
    page.screenshot(path=str(artifacts / "visualize_report.png"), full_page=True)
    page.locator("#timeline-0").screenshot(path=str(artifacts / "visualize_timeline.png"))


def test_comparison_renders(open_report, artifacts, tmp_path):
    good, late = record(tmp_path, "good"), record(tmp_path, "late")
    out = tmp_path / "cmp.html"
    main([str(good), "--compare", str(late), "-o", str(out)])
    page, requests, errors = open_report(out)
    assert not errors and not requests
    page.wait_for_selector("#comparison-figure .main-svg")
    assert page.locator("#comparison-figure .barlayer .trace").count() >= 2  # stacked ledger bars
    assert page.locator("#comparison-table tbody tr").count() >= 6
    # the overall line names each run with what it judged (two runs' check lists in a row named none)
    names = page.eval_on_selector_all('p a[href^="#run-"]', "els => els.map(e => e.textContent)")
    coverage = page.locator("#overall-coverage").inner_text().removeprefix("· per run: ")
    assert len(names) == 2 and [part.split(": ")[0] for part in coverage.split(" · ")] == names, coverage
    assert all(" checks judged" in part for part in coverage.split(" · ")), coverage
    page.locator("#comparison").screenshot(path=str(artifacts / "visualize_comparison.png"))


def test_png_export_through_kaleido_and_chromium(browser, artifacts, tmp_path):
    # `browser` only gates on Chromium being installed; kaleido starts its own instance of it.
    logs = record(tmp_path, "good", rounds=1)
    png = tmp_path / "timeline.png"
    assert main([str(logs), "-o", str(tmp_path / "r.html"), "--png", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    (artifacts / "visualize_export.png").write_bytes(data)
