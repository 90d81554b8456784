"""Issue 19 items 12 and 15 in the live dashboard: two hosts' processes of one pid stay two processes
while the run is followed, and a run of thousands of empty process files never points the user at a view
the dashboard does not show. Real files, the real reader, the dashboard's own run and layout code."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from miles_profile.logdir.reader import load_run
from tests.unit.test_logdir_multihost import write_host_run

GiB = 1024 ** 3


# -- item 12: the same pid on two hosts that write into one run directory -----------------------------
def shared_run_dir(base: Path) -> Path:
    """One run directory that recorders on two hosts (containers, both pid 7) write on a shared file
    system: files named by host and pid, as each recorder names them."""
    run = write_host_run(base / "a", "node-a", "job", begin=1.0)
    other = write_host_run(base / "b", "node-b", "job", begin=1.2)
    for path in other.glob("node-b-7.*"):
        shutil.copy(path, run / path.name)
    return run


def _append_iterations(run: Path, host: str, level: int, begin: float, first_id: int) -> None:
    """Ten more `train` phases of one host's pid-7 process: its level while training, 1/8 of it between."""
    rows, events = [], []
    for k in range(10):
        t = begin + k
        rows += [f"{t},,{level // 8}\n", f"{t + 0.3},train,{level}\n", f"{t + 0.6},train,{level}\n"]
        events += [{"t": t + 0.2, "kind": "begin", "name": "train", "pid": 7, "id": first_id + k, "attrs": {}},
                   {"t": t + 0.7, "kind": "end", "name": "train", "pid": 7, "id": first_id + k,
                    "attrs": {"status": "ok"}}]
    with open(run / f"{host}-7.samples.csv", "a") as f:
        f.writelines(rows)
    with open(run / f"{host}-7.events.jsonl", "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def test_live_dashboard_keeps_one_pid_of_two_hosts_apart_as_the_report_does(tmp_path):
    from dashboards.live_run import LiveRun
    run_dir = shared_run_dir(tmp_path)
    live = LiveRun(run_dir)  # the dashboard's first look: the reader, which aliases node-b's pid
    pids = {p["host"]: p["pid"] for p in live.current.processes}
    assert pids["node-a"] == 7 and pids["node-b"] != 7
    _append_iterations(run_dir, "node-a", 1 * GiB, 4.0, 2)  # then both hosts write on
    _append_iterations(run_dir, "node-b", 8 * GiB, 4.1, 2)
    assert live.refresh()
    followed, fresh = live.current, load_run(run_dir)  # the report reads the whole directory once

    def rows(run):
        return run.samples[["t", "pid", "rss"]].sort_values(["t", "pid"]).reset_index(drop=True)

    pd.testing.assert_frame_equal(rows(followed), rows(fresh), check_dtype=False)
    assert followed.samples.loc[followed.samples["pid"] == 7, "rss"].max() == 1 * GiB  # node-b's 8 GiB never in pid 7

    def phases(run):
        return sorted(zip(run.phases["host"], run.phases["pid"], run.phases["start"], run.phases["status"]))

    assert phases(followed) == phases(fresh) and len(phases(fresh)) == 22  # the verdict judges these


def test_a_process_that_appears_later_on_a_second_host_gets_its_own_pid(tmp_path):
    from dashboards.live_run import LiveRun
    run_dir = write_host_run(tmp_path / "a", "node-a", "job", begin=1.0)
    live = LiveRun(run_dir)
    other = write_host_run(tmp_path / "b", "node-c", "job", begin=1.2)  # starts after the first look
    for path in other.glob("node-c-7.*"):
        shutil.copy(path, run_dir / path.name)
    _append_iterations(run_dir, "node-a", 1 * GiB, 4.0, 2)
    assert live.refresh()
    samples = live.current.samples
    assert samples.loc[samples["pid"] == 7, "rss"].max() == 1 * GiB
    assert sorted(samples.loc[samples["pid"] != 7, "rss"].tolist()) == [1, 2, 5]  # node-c's rows, apart
    (alias,) = set(samples["pid"]) - {7}
    assert alias % 2 ** 32 == 7


# -- item 15: thousands of empty processes, and the fleet view the timeline points to --------------------
def empty_processes_run(base: Path, count: int) -> Path:
    """One process that recorded, and `count` processes whose recorder wrote its meta and then nothing
    (empty samples and events files): no phases, no GPU, so no fleet."""
    from miles_profile.logdir.writer import write_process_meta
    from tests.faults.test_faults_files import make_run
    run = make_run(base / "logs")
    for k in range(count):
        stem = f"e-{k}"
        write_process_meta(run, stem, {"pid": 100 + k, "host": "e", "role": "actor", "stem": stem})
        (run / f"{stem}.samples.csv").write_bytes(b"")
        (run / f"{stem}.events.jsonl").write_bytes(b"")
    return run


def test_the_timeline_points_to_the_fleet_view_only_where_the_fleet_panel_shows(tmp_path):
    from bench.make_fleet_log import write_fleet_run
    from dashboards.live_run import LiveRun
    from dashboards.panels import fleet, timeline
    live = LiveRun(empty_processes_run(tmp_path, 40))
    run = live.current
    assert len(run.processes) == 41 and not fleet.is_fleet(run)  # the fleet panel stays hidden
    assert fleet.one_lane_each(run)  # so the run-wide timeline draws, instead of pointing to it
    figure = timeline.build_figure(run, "run", None, None)
    drawn = [[round(v * GiB) for v in t.y] for t in figure.data if t.name == "RSS"]  # GiB on screen
    assert drawn == [list(range(10, 30))]  # the process that recorded
    big = load_run(write_fleet_run(tmp_path / "fleet", hosts=1, gpus=9, minutes=0.2))  # 18 processes
    assert fleet.is_fleet(big) and not fleet.one_lane_each(big)  # a fleet: its panel replaces the timeline
    assert fleet.timeline_note(big) == "18 processes: the fleet view above replaces the run-wide timeline."


@pytest.mark.browser
@pytest.mark.slow
def test_empty_processes_in_the_page_draw_the_timeline_and_name_no_hidden_view(dashboard_page, tmp_path):
    """The issue's case in headless Chromium: with 5,000 empty processes the page said "5,001 processes: see
    the fleet view and its lanes above", and the ledger "open one in the fleet view", while the fleet panel
    was hidden (no phases, no GPU: no fleet). 300 processes take the same path past 16, in less time."""
    from dashboards.serve import dashboard_process
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    run = empty_processes_run(tmp_path, 300)
    graph = "document.querySelector('#timeline-graph .js-plotly-plot')"
    with open(tmp_path / "stderr.txt", "w") as stderr, \
            dashboard_process(run.parent, stderr=stderr, timeout_s=120) as url:
        page = dashboard_page({"width": 1400, "height": 1000})
        page.goto(url)
        drawn = f"{graph} && {graph}.data && {graph}.data.some(d => d.name === 'RSS')"
        # the run-wide timeline of the process that recorded. (Not "drawn or a message": the page says
        # "No run to show yet." until its run list arrives, and that once ended the wait.)
        try:
            page.wait_for_function(f"() => {drawn}", timeout=120_000)
        except PlaywrightTimeout:
            pytest.fail(f"no timeline; the page says: {page.locator('#timeline-message').inner_text()!r}")
        assert not page.locator("#fleet-panel").is_visible()
        assert "fleet view" not in page.locator("body").inner_text()  # the timeline's, the ledger's
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()
