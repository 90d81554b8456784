"""The dashboard's fleet panel in real headless Chromium, on a real run recorded on CPU: 2 (faked) hosts x
2 ranks, each rank an actor and an engine process (8 processes, 4 host-memory lanes). The fleet view
draws every lane's row; a click on an outlier opens that lane's timeline, zoomed exactly to the
outlier's phase window, stacking that lane's processes only; a lane spec picks lanes, a bad one says why.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

import miles_profile as mp
from dashboards.panels import fleet as fleet_panel
from dashboards.serve import dashboard_process
from miles_profile.identity import HOST_ENV, ROLE_ENV
from miles_profile.names import RUN_DIR_ENV
from miles_profile.recorder import create_run
from miles_profile.report import fleet_figures
from tests.conftest import REPO, python_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# One process of a rank: its role's phases for 3 iterations, holding `mib` MiB in its big phase.
PROGRAM = """
import sys, time
import miles_profile as mp
role, mib = sys.argv[1], int(sys.argv[2])
MiB = 1024 ** 2
for k in range(3):
    if role == "engine":
        with mp.phase("generate", rollout_id=k):
            kv = bytearray(mib * MiB); time.sleep(0.3)
        with mp.phase("offload_kv", rollout_id=k, tags=["kv_cache"], expected_bytes=len(kv)):
            del kv; time.sleep(0.1)
        time.sleep(0.5)
    else:
        time.sleep(0.45)
        with mp.phase("train", rollout_id=k):
            state = bytearray(mib * MiB); time.sleep(0.3)
        with mp.phase("offload_train", rollout_id=k, tags=["weights"], expected_bytes=len(state)):
            del state; time.sleep(0.1)
"""
HOT_RANK, HOT_MIB, MIB = 3, 320, 64
GPU_GRAPH = "document.querySelector('#fleet-gpu-graph .js-plotly-plot')"
HEATMAP = "document.querySelector('#fleet-heatmap .js-plotly-plot')"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet_logs")
    run_dir = create_run(root, ["fleet-test"], 20.0, run_id="fleet-browser")
    procs = []
    for rank in range(4):
        host = f"node{rank // 2}"
        for role in ("actor", "engine"):
            env = {**python_env(), RUN_DIR_ENV: str(run_dir), HOST_ENV: host, ROLE_ENV: role, "RANK": str(rank),
                   "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4"}
            mib = HOT_MIB if (rank, role) == (HOT_RANK, "actor") else MIB
            procs.append(subprocess.Popen([sys.executable, "-c", PROGRAM, role, str(mib)], env=env, cwd=REPO))
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    return run_dir


@pytest.fixture(scope="module")
def expected(run_dir):
    """What the page must show, from the same library functions the panel calls."""
    run = mp.load(run_dir)
    assert len(run.processes) == 8
    return fleet_panel.compute(run)


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    """One dashboard for the tests that read this run (a server costs ~2 CPU-s to start); each test its own page."""
    stderr_path = tmp_path_factory.mktemp("fleet_dashboard") / "stderr.txt"
    with open(stderr_path, "w") as stderr, dashboard_process(run_dir.parent, stderr=stderr) as url:
        yield url, stderr_path


@pytest.fixture
def page(dashboard_page, server):
    url, stderr_path = server
    page = dashboard_page({"width": 1400, "height": 1000})
    page.goto(url)
    yield page
    assert "Traceback" not in stderr_path.read_text()


def test_fleet_view_has_every_lane_and_an_outlier_click_opens_its_window(page, expected, artifacts):
    page.wait_for_function(f"() => {HEATMAP} && {HEATMAP}._fullData && {HEATMAP}._fullData.length > 0",
                           timeout=30_000)
    rows = page.evaluate(f"() => Array.from(new Set({HEATMAP}._fullData[0].y))")
    labels = fleet_figures.row_labels(expected.matrix.lanes)
    assert len(labels) == 4 and sorted(rows) == sorted(labels)
    # Outliers listed, the hot rank's lane first among the highest peaks.
    first = expected.outliers[0]
    assert first["kind"] == "highest peak" and first["label"] == "node1:rank3"
    page.wait_for_selector(".fleet-outlier")
    texts = page.locator(".fleet-outlier").all_inner_texts()
    assert len(texts) == len(expected.outliers) and "node1:rank3" in texts[0]

    page.locator(".fleet-outlier").first.click()
    page.wait_for_function(f"() => {GPU_GRAPH} && {GPU_GRAPH}._fullLayout && {GPU_GRAPH}.data.length > 0",
                           timeout=15_000)
    x_range = page.evaluate(f"() => {GPU_GRAPH}._fullLayout.xaxis.range")
    assert x_range == pytest.approx([first["t0"] - expected.t0, first["t1"] - expected.t0], abs=1e-6)
    names = [n for n in page.evaluate(f"() => {GPU_GRAPH}.data.map(d => d.name)")
             if re.search(r" pid \d+$", n or "")]  # the processes' traces, beside the lane's phase bands
    pids = {int(n.rsplit(" ", 1)[1]) for n in names}  # "actor r3 pid N": this lane's processes only
    lane_pids = set(expected.table.loc[expected.table["lane"] == first["lane"], "pid"])
    assert pids == lane_pids and len(pids) == 2
    assert any(n.startswith("actor r3") for n in names) and any(n.startswith("engine r3") for n in names)
    page.screenshot(path=str(artifacts / "dashboard-fleet-test.png"), full_page=True)


def test_lane_spec_picks_lanes_and_a_bad_spec_says_why(page):
    page.wait_for_selector(".fleet-outlier", timeout=30_000)
    page.wait_for_function("() => document.querySelectorAll('#fleet-lanes .js-plotly-plot').length === 4",
                           timeout=15_000)  # up to 8 lanes: one each
    page.fill("#fleet-lanes-spec", "host:node0")
    page.press("#fleet-lanes-spec", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#fleet-lanes .js-plotly-plot').length === 2")
    page.fill("#fleet-lanes-spec", "rank:9-2")
    page.press("#fleet-lanes-spec", "Enter")
    page.wait_for_selector("#fleet-lanes-message .message-error:has-text('bad rank range')")


def test_a_heatmap_cell_click_opens_that_lane_at_that_phase(page, expected):
    page.wait_for_function(f"() => {HEATMAP} && {HEATMAP}._fullLayout && {HEATMAP}._fullData.length",
                           timeout=30_000)
    first = expected.outliers[0]  # the hot lane and its hottest (iteration, phase)
    row = fleet_figures.row_labels(expected.matrix.lanes)[list(expected.matrix.lanes["lane"]).index(first["lane"])]
    column = expected.matrix.columns["label"][(expected.matrix.columns["phase"] == first["phase"])
                                              & (expected.matrix.columns["iteration"] == first["iteration"])].iloc[0]
    # A real mouse click at the cell's centre relative to the heatmap's plot area (its drag layer), from the
    # heatmap's own axes. The panels around it render after it, and a scrollbar or a resize can move the cells
    # between reading the axes and clicking: hover first, and click only once Plotly's own hit test names the
    # intended cell (positions re-read on each try).
    page.wait_for_load_state("networkidle")
    drag = page.locator("#fleet-heatmap .nsewdrag").first
    for _ in range(20):
        x, y = page.evaluate(f"""([col, row]) => {{ const L = {HEATMAP}._fullLayout;
            return [L.xaxis.d2p(col), L.yaxis.d2p(row)]; }}""", [column, row])
        drag.hover(position={"x": x, "y": y})
        page.wait_for_timeout(100)
        hovered = page.evaluate(f"() => ({HEATMAP}._hoverdata || []).map(p => [p.x, p.y])")
        if hovered == [[column, row]]:
            break
    else:
        pytest.fail(f"the heatmap never settled under the mouse at {column!r}, {row!r}: hovered {hovered}")
    drag.click(position={"x": x, "y": y})
    page.wait_for_function(f"() => {GPU_GRAPH} && {GPU_GRAPH}._fullLayout && {GPU_GRAPH}.data.length > 0",
                           timeout=15_000)
    t0, t1 = fleet_panel.cell_window(expected, first["lane"], column)
    x_range = page.evaluate(f"() => {GPU_GRAPH}._fullLayout.xaxis.range")
    assert x_range == pytest.approx([t0 - expected.t0, t1 - expected.t0], abs=1e-6)
    assert page.evaluate(f"() => {GPU_GRAPH}.layout.title.text").startswith(first["label"])


def test_the_fleet_view_follows_a_run_being_recorded(dashboard_page, tmp_path):
    """Opened while two ranks record, the heatmap is redrawn as their phases land: it ends with every
    phase instance of the finished run (the polls ask for a redraw only when the run has new data)."""
    root = tmp_path / "logs"
    run_dir = create_run(root, ["fleet-live"], 20.0, run_id="fleet-live")
    procs = []
    for rank in range(2):
        env = {**python_env(), RUN_DIR_ENV: str(run_dir), HOST_ENV: f"node{rank}", ROLE_ENV: "actor",
               "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
        slow = PROGRAM.replace("range(3)", "range(6)").replace("time.sleep(0.45)", "time.sleep(1.0)")
        procs.append(subprocess.Popen([sys.executable, "-c", slow, "actor", str(MIB)], env=env, cwd=REPO))
    status = "document.querySelector('#fleet-status').innerText"
    with dashboard_process(root) as url:
        page = dashboard_page({"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_function(f"() => {HEATMAP} && {HEATMAP}._fullData && {HEATMAP}._fullData.length",
                               timeout=30_000)
        first = page.evaluate(f"() => {status}")
        for proc in procs:
            assert proc.wait(timeout=120) == 0
        final = fleet_panel.compute(mp.load(run_dir))
        wanted = f"{len(final.table):,} phase instances"
        assert wanted not in first, first  # drawn before the run ended ...
        page.wait_for_function(f"() => {status}.includes({wanted!r})", timeout=30_000)  # ... and redrawn after


def test_past_16_processes_the_ledger_follows_the_gpu_opened(dashboard_page, tmp_path):
    """A 32-process GPU run in the real format (bench writer): the ledger panel asks for a GPU; once an
    outlier's GPU is open, its button draws that GPU's ledger, not the fleet's."""
    from bench.bench_fleet_visualize import write_run
    run_dir = write_run(tmp_path / "logs", 32, minutes=2.0)
    view = fleet_panel.compute(mp.load(run_dir))
    first = view.outliers[0]
    label = view.matrix.lanes.set_index("lane").loc[first["lane"], "label"]
    ledger_graph = "document.querySelector('#ledger-graph .js-plotly-plot')"
    with dashboard_process(run_dir.parent) as url:
        page = dashboard_page({"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("#ledger-section :text('open one in the fleet view')", timeout=60_000)
        page.wait_for_selector(".fleet-outlier", timeout=60_000)
        page.locator(".fleet-outlier").first.click()
        page.wait_for_function(f"() => {GPU_GRAPH} && {GPU_GRAPH}.data && {GPU_GRAPH}.data.length > 0",
                               timeout=15_000)
        assert page.evaluate(f"() => !{ledger_graph} || !{ledger_graph}.data || !{ledger_graph}.data.length")
        page.click("#ledger-draw")
        page.wait_for_function(f"() => {ledger_graph} && {ledger_graph}.data && {ledger_graph}.data.length > 0",
                               timeout=60_000)
        titles = page.evaluate(f"() => ({ledger_graph}.layout.annotations || []).map(a => a.text)")
        # one lane: the GPU opened, named as the fleet view names it (node0:gpu5), not by its UUID
        assert len(titles) == 1 and titles[0].startswith(f"{label}:"), (titles, label)
