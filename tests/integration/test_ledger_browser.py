"""The ledger's stacked views in real headless Chromium: the report of a recorded trainer run, the
comparison of the H200 sample logs, and the dashboard's ledger panel. Screenshots go to artifacts/."""
from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.serve import dashboard_process
from miles_profile.logdir.reader import load_run
from miles_profile.report.ledger_html import peak_text
from miles_profile.runmodel.ledger import ledger
from miles_profile.visualize import main
from tests.conftest import REPO

pytestmark = pytest.mark.browser

H200 = REPO / "sample_logs" / "h200"
FULL_DATA = "(sel) => { const g = document.querySelector(sel + ' .js-plotly-plot') || document.querySelector(sel);" \
            " return g._fullData.map(d => [d.type, d.name, Array.from(d.x || []).length]); }"


@pytest.fixture(scope="module")
def trainer_logs(recorded_cpu_run) -> Path:
    return recorded_cpu_run


@pytest.mark.slow
def test_report_shows_the_ledger_as_stacked_area_and_bars(open_report, artifacts, trainer_logs, tmp_path):
    out = tmp_path / "report.html"
    assert main([str(trainer_logs), "-o", str(out), "--no-check"]) == 0
    page, requests, errors = open_report(out)
    assert not errors and not requests
    page.wait_for_selector("#ledger-bars .main-svg")
    bars = page.evaluate(FULL_DATA, "#ledger-bars")
    names = {name for kind, name, _ in bars if kind == "bar"}
    assert {"weights", "gradients", "optimizer state", "KV cache", "other anonymous", "file-backed"} <= names
    # two bars per top-level phase of 2 rollouts, at its peak and at its end: a trace of each per category
    assert all(n == 18 for kind, _, n in bars if kind == "bar")
    assert sum(1 for kind, name, _ in bars if kind == "bar" and name == "weights") == 2
    # the sentence is there when a phase's peak held more than its end: a run recorded under load (the
    # suite's first minutes) may have sampled every in-phase rise at the phase's end row, and then says nothing
    (run_dir,) = trainer_logs.glob("run-*")
    expected = peak_text(ledger(load_run(run_dir), peaks=True))
    if expected:
        assert page.locator("#ledger-peak").inner_text() == expected
    else:
        assert page.locator("#ledger-peak").count() == 0
    assert page.locator("#ledger-bars .barlayer .point path").count() >= 2 * 18 * 5  # drawn, not only in data
    area = page.evaluate(FULL_DATA, "#ledger-area")
    assert {"weights", "KV cache"} <= {name for _, name, _ in area}
    assert page.locator("#ledger-area .scatterlayer .trace .fills path").count() >= 6  # stacked fills
    assert "within 0.00% at worst" in page.locator("#ledger-add-up").inner_text()
    page.locator("#ledger-area").screenshot(path=str(artifacts / "ledger-area.png"))
    page.locator("#ledger-bars").screenshot(path=str(artifacts / "ledger-bars.png"))


def test_h200_comparison_is_stacked_bars_per_configuration(open_report, artifacts, h200_report):
    page, requests, errors = open_report(h200_report, width=1700)
    assert not errors and not requests
    page.wait_for_selector("#comparison-figure .main-svg")
    traces = page.evaluate(FULL_DATA, "#comparison-figure")
    assert not [t for t in traces if t[0] == "scatter" and t[1] != "measured total (NVML used / RSS)"]
    configs = page.evaluate("() => { const g = document.getElementById('comparison-figure');"
                            " return [...new Set(g._fullData.filter(d => d.type === 'bar').flatMap(d => Array.from(d.y)))]; }")  # horizontal bars: runs on y
    assert len(configs) == len([d for d in H200.iterdir() if d.is_dir()]) == 9  # a README report.html may lie beside the runs
    assert page.locator("#comparison-figure .barlayer .point path").count() >= 9 * 10
    page.locator("#comparison-figure").screenshot(path=str(artifacts / "ledger-comparison-h200.png"))


def test_dashboard_ledger_panel_draws_the_same_bars(dashboard_page, artifacts, trainer_logs):
    with dashboard_process(trainer_logs) as url:
        page = dashboard_page({"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_function("() => { const g = document.querySelector('#ledger-graph .js-plotly-plot');"
                               " return g && g._fullData && g._fullData.some(d => d.name === 'KV cache'); }",
                               timeout=30_000)
        assert page.locator("#ledger-graph .barlayer .point path").count() >= 18 * 5
        assert "GPU" not in page.locator("#ledger-add-up").inner_text()  # a CPU run: the host ledger only
        page.click("#ledger-view label:has-text('over time')")
        page.wait_for_function("() => document.querySelector('#ledger-graph .js-plotly-plot')"
                               "._fullData.some(d => d.stackgroup)", timeout=20_000)
        page.locator("#ledger-section").screenshot(path=str(artifacts / "dashboard-ledger.png"))
