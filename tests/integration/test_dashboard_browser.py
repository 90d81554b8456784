"""The dashboard in real headless Chromium: runs listed, a run chosen and drawn, zoom re-reduced from the
full data with a one-sample spike kept, a failed check focusing the timeline, comparison, a damaged run.

Screenshots go to artifacts/ (look at them). The live run is in test_dashboard_live.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dashboards.panels.timeline import focus_window
from dashboards.serve import dashboard_process

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
GiB = 1024 ** 3
GRAPH = "document.querySelector('#timeline-graph .js-plotly-plot')"
# Per trace of the timeline: [name, points, first x, last x, max y] (y in GiB, as drawn).
TRACES_JS = f"""() => {{ const g = {GRAPH}; if (!g || !g._fullData) return [];
  return g._fullData.filter(d => (d.type === 'scatter' || d.type === 'scattergl') && d.legendgroup !== 'phases').map(d => {{
    const x = Array.from(d.x), y = Array.from(d.y).filter(v => v !== null && !isNaN(v));
    return [d.name, x.length, x[0], x[x.length - 1], y.length ? Math.max(...y) : null]; }}); }}"""

SPIKE_INDEX, SYNTHETIC_SAMPLES, SYNTHETIC_INTERVAL_S = 123_457, 300_000, 0.001

LEAKY_PROGRAM = '''
import time
import miles_profile as mp
MiB = 1024 ** 2
kept = []
for rollout_id in range(3):
    with mp.phase("generate", rollout_id=rollout_id):
        kv_cache = bytearray(192 * MiB)
        time.sleep(0.25)
    with mp.phase("offload_rollout", rollout_id=rollout_id, tags=["kv_cache"], expected_bytes=len(kv_cache)):
        kept.append(kv_cache)  # the bug under test: a reference survives the offload
    del kv_cache
    with mp.phase("train", rollout_id=rollout_id):
        time.sleep(0.25)
'''


def record(log_dir: Path, *command: str) -> subprocess.Popen:
    from tests.conftest import python_env  # noqa: PLC0415 - the shared source-tree environment
    # --heap: on the host only glibc's heap tells a kept reference from retention (RSS never fails an offload)
    return subprocess.Popen([sys.executable, "-m", "miles_profile.record", "--log-dir", str(log_dir), "--heap",
                             "--exec", "--", sys.executable, *command], cwd=REPO, env=python_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def write_synthetic_run(run_dir: Path, n: int, spike_index: int, start: float = 1_700_000_000.0) -> None:
    """A finished run of `n` samples (1 ms apart) with one 5 GiB spike and ten `generate` phases."""
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"format_version": 1, "start_time": start,
                                                   "command": ["synthetic"], "interval_ms": 1.0}))
    (run_dir / "h-7.meta.json").write_text(json.dumps({"format_version": 1, "pid": 7, "role": "in_process",
                                                       "start_time": start, "end_time": start + n / 1000}))
    rss = (1 << 30) + np.random.default_rng(0).integers(0, 1 << 20, n)
    rss[spike_index] = 5 * GiB
    t = start + np.arange(n) * SYNTHETIC_INTERVAL_S
    rows = "\n".join(f"{a:.6f},,{b},{b}" for a, b in zip(t.tolist(), rss.tolist()))
    (run_dir / "h-7.samples.csv").write_text("t,phase,rss,rss_peak\n" + rows + "\n")
    span = n * SYNTHETIC_INTERVAL_S / 10
    events = []
    for k in range(10):
        events.append({"t": start + k * span, "kind": "begin", "name": "generate", "pid": 7, "id": k + 1,
                       "attrs": {"rollout_id": k}})
        events.append({"t": start + (k + 0.5) * span, "kind": "end", "name": "generate", "pid": 7, "id": k + 1,
                       "attrs": {"status": "ok"}})
    (run_dir / "h-7.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dashboard_logs")
    program = root.parent / "leaky_offload.py"
    program.write_text(LEAKY_PROGRAM)
    recorders = [record(root, "examples/phased_allocations.py", "--rounds", "3")]
    time.sleep(1.1)  # run directories are named by the second they start in
    recorders.append(record(root, str(program)))
    write_synthetic_run(root / "run-synthetic", SYNTHETIC_SAMPLES, SPIKE_INDEX)
    (root / "run-damaged").mkdir()
    (root / "run-damaged" / "meta.json").write_text('{"format_version": 1, "start_')
    for child in recorders:
        assert child.wait(timeout=60) == 0
    return root


@pytest.fixture(scope="module")
def server(logs, tmp_path_factory):
    stderr_path = tmp_path_factory.mktemp("dashboard_server") / "stderr.txt"
    with open(stderr_path, "w") as stderr, dashboard_process(logs, stderr=stderr) as url:
        yield url
    log = stderr_path.read_text()
    assert "Traceback" not in log, log


@pytest.fixture
def page(dashboard_page, server):
    page = dashboard_page({"width": 1400, "height": 900})
    page.goto(server)
    return page


def drawn(page, timeout_ms: int = 20_000) -> list:
    page.wait_for_function(f"() => ({TRACES_JS})().length > 0", timeout=timeout_ms)
    return page.evaluate(TRACES_JS)


def choose(page, run_id: str) -> None:
    page.click(f"#runs-list button:has(.runs-id:text-is('{run_id}'))")
    page.wait_for_selector(f".runs-item-selected .runs-id:text-is('{run_id}')")


def run_ids(page) -> list[str]:
    page.wait_for_function("() => document.querySelectorAll('#runs-list .runs-item').length === 4")
    return page.locator("#runs-list .runs-id").all_inner_texts()


def test_runs_listed_newest_first_and_the_newest_drawn(page, artifacts):
    ids = run_ids(page)
    assert ids[-1] == "run-synthetic" and "run-damaged" in ids
    recorded = [i for i in ids if i.startswith("run-2")]  # named by start time; the damaged one by its mtime
    assert len(recorded) == 2 and recorded == sorted(recorded, reverse=True)
    traces = drawn(page)
    assert any(name.startswith("RSS") for name, *_ in traces)
    page.wait_for_selector("#checks-list .checks-item")
    page.wait_for_selector("#phases-table .dash-spreadsheet")
    page.screenshot(path=str(artifacts / "dashboard-overview.png"), full_page=True)


def test_zoom_reduces_the_visible_range_again_and_keeps_a_one_sample_spike(page, artifacts):
    choose(page, "run-synthetic")
    page.wait_for_function(f"() => ({TRACES_JS})().some(t => t[1] > 1000 && t[3] > 290)")
    overview = {name: rest for name, *rest in page.evaluate(TRACES_JS)}
    points, _, last_x, peak = overview["RSS"]
    assert points < SYNTHETIC_SAMPLES / 5  # reduced...
    assert peak == pytest.approx(5.0)     # ...and the spike is drawn exactly

    spike_x = SPIKE_INDEX * SYNTHETIC_INTERVAL_S
    window = [spike_x - 3.0, spike_x + 3.0]
    page.evaluate(f"() => Plotly.relayout({GRAPH}, {{'xaxis.range': {window}}})")
    page.wait_for_function(f"() => ({TRACES_JS})().some(t => t[0] === 'RSS' && t[2] >= {window[0] - 0.01})")
    zoomed = {name: rest for name, *rest in page.evaluate(TRACES_JS)}
    points_in_window, first_x, last_x, peak = zoomed["RSS"]
    assert first_x >= window[0] - 0.01 and last_x <= window[1] + 0.01
    assert points_in_window >= 6.0 / SYNTHETIC_INTERVAL_S  # every sample of the window, from the full data
    assert peak == pytest.approx(5.0)
    page.screenshot(path=str(artifacts / "dashboard-zoomed.png"), full_page=True)

    away = [10.0, 40.0]  # no spike there: the drawn peak is the data's, not the overview's
    page.evaluate(f"() => Plotly.relayout({GRAPH}, {{'xaxis.range': {away}}})")
    page.wait_for_function(f"() => ({TRACES_JS})().some(t => t[0] === 'RSS' && t[2] >= 9.99 && t[3] <= 40.01)")
    assert {name: rest for name, *rest in page.evaluate(TRACES_JS)}["RSS"][3] < 1.01

    page.evaluate(f"() => Plotly.relayout({GRAPH}, {{'xaxis.autorange': true}})")
    page.wait_for_function(f"() => ({TRACES_JS})().some(t => t[0] === 'RSS' && t[3] > 290)")


def test_clicking_a_failed_check_zooms_the_timeline_to_its_span(page, artifacts):
    leaky = [i for i in run_ids(page) if i.startswith("run-2")][0]  # the newest recorded
    choose(page, leaky)
    failed = page.locator("#checks-list .checks-failed").first
    failed.wait_for(timeout=15_000)
    assert "Offload" in page.locator("#checks-list .checks-failed").all_inner_texts()[0]
    span_text = failed.locator(".checks-span").inner_text()  # "a–b s", seconds since start, 2 decimals
    lo, hi = (float(v) for v in span_text.rstrip(" s").split("–"))
    failed.click()  # at once: a click before the run's first drawing must count too
    # The check's span with its margins, whatever the run's length (the span may be most of it).
    want_lo, want_hi = focus_window((lo, hi))
    page.wait_for_function(f"() => {{ const r = {GRAPH}._fullLayout.xaxis.range;"
                           f" return Math.abs(r[0] - {want_lo}) < 0.02 && Math.abs(r[1] - {want_hi}) < 0.02; }}")
    page.screenshot(path=str(artifacts / "dashboard-failed-check.png"), full_page=True)


def test_comparison_aligns_two_runs_by_phase(page, artifacts):
    drawn(page)
    recorded = [i for i in run_ids(page) if i.startswith("run-2")]
    page.click("#compare-runs")
    for run_id in recorded[:2]:
        page.get_by_role("option", name=run_id).click()
    page.keyboard.press("Escape")
    page.wait_for_function("() => { const g = document.querySelector('#compare-graph .js-plotly-plot');"
                           " return g && g._fullData && g._fullData.filter(d => d.legendgroup !== 'phase bands').length >= 2; }",
                           timeout=20_000)  # one line per run, besides the phase bands
    page.wait_for_selector("#compare-table .dash-spreadsheet")
    page.locator("#compare-section").screenshot(path=str(artifacts / "dashboard-comparison.png"))


@pytest.mark.slow
def test_a_damaged_run_is_a_message_in_the_page(page):
    drawn(page)
    choose(page, "run-damaged")
    message = page.locator("#timeline-message .message-error")
    message.wait_for(timeout=10_000)
    assert "meta" in message.inner_text()
