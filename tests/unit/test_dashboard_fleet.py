"""The fleet panel's data side on a small fleet run written in the real log format (2 hosts x 2 GPUs x
(actor, engine)): a GPU's timeline reads that GPU's processes only and NVML's device used of that GPU,
the stand-in phase table's device peaks are the host files' maxima, the run-wide timeline gives way."""
from __future__ import annotations

import numpy as np
import pytest

import miles_profile as mp
from bench.make_fleet_log import write_fleet_run
from dashboards.panels import fleet as panel


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return mp.load(write_fleet_run(tmp_path_factory.mktemp("fleet") / "run", hosts=2, gpus=2, minutes=0.5))


@pytest.fixture(scope="module")
def view(run):
    return panel.compute(run)


def test_a_gpu_timeline_holds_that_gpus_processes_and_device_only(run, view):
    index = panel._gpu_index(run)
    for lane, host, uuid in view.matrix.lanes[["lane", "host", "gpu_uuid"]].itertuples(index=False):
        series, used, total, _ = panel.lane_series(run, view, index, lane, None)
        on_gpu = set(run.gpu_procs.loc[(run.gpu_procs["host"] == host) & (run.gpu_procs["gpu_uuid"] == uuid), "pid"])
        assert {int(label.rsplit(" ", 1)[1]) for label in series} == on_gpu and len(on_gpu) == 2
        device = run.gpu_samples[(run.gpu_samples["host"] == host) & (run.gpu_samples["gpu_uuid"] == uuid)]
        assert used[1].max() == device["used"].max()  # the reduction keeps the peak
        assert total == 80 * 1024 ** 3


def test_window_clips_to_the_padded_phase_and_a_cell_window_is_the_lanes_phase(run, view):
    index = panel._gpu_index(run)
    first = view.outliers[0]
    w0, w1 = panel.padded(first["t0"], first["t1"])
    series, used, _, _ = panel.lane_series(run, view, index, first["lane"], (w0, w1))
    interval = 0.1  # host samples: one before and one after the window are kept, so the edges are drawn
    for t, _ in [*series.values(), used]:
        assert t[0] >= w0 - interval - 1e-6 and t[-1] <= w1 + interval + 1e-6
    column = view.matrix.columns["label"].iloc[3]
    t0, t1 = panel.cell_window(view, first["lane"], column)
    c = view.matrix.columns.iloc[3]
    rows = view.table[(view.table["lane"] == first["lane"]) & (view.table["phase"] == c["phase"])
                      & (view.table["iteration"] == c["iteration"])]
    assert (t0, t1) == (rows["t0"].min(), rows["t1"].max())


def test_stand_in_phase_table_device_peak_is_the_host_files_maximum(run, view):
    table = view.table
    row = table.iloc[len(table) // 2]
    g = run.gpu_samples[(run.gpu_samples["host"] == row["host"]) & (run.gpu_samples["gpu_uuid"] == row["gpu_uuid"])]
    inside = g[(g["t"] >= row["t0"]) & (g["t"] <= row["t1"])]["used"]
    assert row["used_peak"] == inside.max()
    assert np.isfinite(table["reserved_peak"]).all() and (table["iteration"] >= 0).all()


def test_fleet_runs_are_recognized_and_small_ones_keep_the_run_wide_timeline(run):
    assert panel.is_fleet(run) and panel.one_lane_each(run)  # 8 processes: <= 16


def test_a_live_run_gets_a_new_fleet_view_when_its_events_grow(tmp_path):
    """The panel's cache is per run version: a phase appended to a process's events shows on the next refresh."""
    import json

    from dashboards.live_run import LiveRun
    run_dir = write_fleet_run(tmp_path / "run", hosts=1, gpus=2, minutes=0.5)
    live = LiveRun(run_dir)
    before = live.memo("fleet", panel.compute)
    assert live.memo("fleet", panel.compute) is before  # no new data: the same object, nothing recomputed
    events = sorted(run_dir.glob("*.events.jsonl"))[0]
    last = json.loads(events.read_text().splitlines()[-1])
    t, stats = last["t"] + 1.0, {"peak": 70 * 1024 ** 3, "floor": 0, "first": 0, "last": 0}
    base = {"name": "eval", "pid": last["pid"], "host": last["host"], "id": 10_000, "parent": None}
    summary = {"rows": 1, "t_first": t, "t_last": t + 0.5, "series": {"gpu0_reserved": stats}}
    with events.open("a") as f:
        f.write(json.dumps({"t": t, "kind": "begin", **base, "attrs": {"rollout_id": 99}}) + "\n")
        f.write(json.dumps({"t": t + 0.5, "kind": "end", **base, "attrs": {"status": "ok", "summary": summary}}) + "\n")
    assert live.refresh()
    after = live.memo("fleet", panel.compute)
    assert after is not before and len(after.matrix.columns) == len(before.matrix.columns) + 1
    assert "#99 eval" in set(after.matrix.columns["label"])


def test_a_fleets_first_screen_comes_from_its_first_look_while_the_run_is_read(run, view):
    """Issue 35: while the whole run is read (minutes at 1,024 processes), the panels say so at once and
    the fleet panel draws the heatmap and outliers from the run's first look (no samples), the same as
    the whole run's; a page's request starts no whole read while the first screen is computed."""
    import pandas as pd

    from dashboards.live_run import FirstLook, RunCache, RunLoading
    from dashboards.paths import LogRoot
    root = LogRoot(run.path.parent)
    cache, run_id = RunCache(root), next(iter(root.run_dirs()))
    with cache.holding(run_id):
        with pytest.raises(RunLoading, match="Reading this run"):
            cache.for_page(run_id)
        assert cache.loaded(run_id) is None and not cache._loading  # nothing read behind the first screen
        first = panel.source_of(cache, run_id)
        assert isinstance(first, FirstLook) and first.current.samples.empty
        drawn = first.memo("fleet", panel.compute)
    assert drawn.outliers == view.outliers
    pd.testing.assert_frame_equal(drawn.table, view.table)
    live = cache.get(run_id)  # once released, a page's request reads the whole run
    assert panel.source_of(cache, run_id) is live and len(live.current.samples) == len(run.samples)
