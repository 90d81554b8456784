"""The transition meter (runmodel/transitions.py) on the committed H200 and CPU logs, and the link
ceilings of record --calibrate (miles_profile/calibrate.py) measured for real on this machine."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from miles_profile import calibrate
from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.series import GiB
from miles_profile.runmodel.transitions import GB, NO_COPY, transitions
from tests.conftest import REPO

LOGS = REPO / "sample_logs"


@pytest.fixture(scope="module")
def meters() -> dict:
    found = {}
    def meter(path: str):
        if path not in found:
            found[path] = transitions(load_run(LOGS / path))
        return found[path]
    return meter


def _loop(meter, phase: str):
    rows = meter.by_kind[(meter.by_kind["phase"] == phase) & ~meter.by_kind["setup"].astype(bool)]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def test_pinned_onload_on_the_h200_moves_what_it_declared_at_the_pinned_rate(meters):
    meter = meters("h200/5-both-gpu-peak")
    onload = _loop(meter, "onload_train")
    assert onload["link"] == "pinned_h2d" and onload["count"] == 3
    assert abs(onload["measured"] / onload["declared"] - 1) < 0.001  # the ledger saw every declared byte arrive
    assert 40 * GB < onload["rate"] < 60 * GB  # docs/benchmarks.md: one pinned copy 55.1 GB/s on this H200
    # no calibration in this log: no ceiling, no ratio, never an invented one
    assert meter.ceilings == {} and np.isnan(onload["ceiling"]) and np.isnan(onload["ratio"])
    # the first offload, before the loop, allocates and pins its buffers: apart, and much slower
    setup = meter.by_kind[(meter.by_kind["phase"] == "offload_train") & meter.by_kind["setup"].astype(bool)].iloc[0]
    assert setup["rate"] < _loop(meter, "offload_train")["rate"] / 5


def test_a_kv_release_copies_nothing_and_the_step_share_adds_up(meters):
    meter = meters("h200/5-both-gpu-peak")
    kv = _loop(meter, "offload_kv")
    assert kv["link"] == NO_COPY and kv["tags"] == "kv_cache+cuda_graph"
    assert abs(kv["measured"] / 3 - 12 * GiB) < 0.01 * GiB  # the 12 GiB pool, three times
    steps = meter.steps
    assert list(steps["iteration"]) == [0, 1, 2]
    assert ((steps["transition_seconds"] > 0) & (steps["transition_seconds"] < steps["seconds"])).all()
    assert meter.share == pytest.approx(steps["transition_seconds"].sum() / steps["seconds"].sum())
    loop = meter.by_kind[~meter.by_kind["setup"].astype(bool)]
    assert loop["share_of_step"].sum() == pytest.approx(meter.share, rel=0.01)  # phases don't overlap here


def test_disk_offload_is_measured_against_disk_links(meters):
    meter = meters("h200/6-gpu-peak-disk")
    write, read = _loop(meter, "offload_train"), _loop(meter, "onload_train")
    assert (write["link"], read["link"]) == ("disk_write", "disk_read")
    assert 0.5 * GB < write["rate"] < 3 * GB and 0.5 * GB < read["rate"] < 3 * GB


def test_an_engine_servers_side_of_a_call_is_not_counted_twice(meters):
    meter = meters("h200/9-dist-engine-server")
    updates = meter.table[meter.table["phase"] == "update_weights"]
    assert len(updates) == 4 and updates["pid"].nunique() == 1  # the actor's 4, not the server's 88 requests


def test_cpu_run_uses_host_and_disk_links(meters):
    meter = meters("cpu")
    assert _loop(meter, "offload_train")["link"] == "disk_write"
    assert _loop(meter, "offload_kv")["link"] == NO_COPY


@pytest.mark.parametrize("path, link", [("h200/1-no-offload", "device_copy"), ("h200/5-both-gpu-peak", "pinned_h2d"),
                                        ("h200/6-gpu-peak-disk", "disk_read"), ("cpu", "disk_read")])
def test_update_weights_reads_from_where_the_training_state_is(meters, path, link):
    assert _loop(meters(path), "update_weights")["link"] == link  # trainer/actor.py weight_chunks


def test_a_calibrated_log_gets_ratios_from_its_own_ceilings(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(LOGS / "h200" / "5-both-gpu-peak", run_dir)
    meta = json.loads((run_dir / "meta.json").read_text())
    meta[calibrate.CALIBRATION_KEY] = {"version": 1, "links": {"pinned_h2d": 55.1e9, "pinned_d2h": -1}}
    (run_dir / "meta.json").write_text(json.dumps(meta))
    meter = transitions(load_run(run_dir))
    assert meter.ceilings == {"pinned_h2d": 55.1e9}  # a negative ceiling is no ceiling
    onload = _loop(meter, "onload_train")
    assert onload["ratio"] == pytest.approx(onload["rate"] / 55.1e9) and 0.7 < onload["ratio"] < 1.1
    assert np.isnan(_loop(meter, "offload_train")["ratio"])  # its link was not measured
    assert meter.to_dict()["calibrated"] is True


def test_ranks_moving_memory_at_once_are_each_metered_and_shared_per_process(tmp_path):
    from bench.make_fleet_log import write_fleet_run
    write_fleet_run(tmp_path / "fleet", hosts=1, gpus=4, minutes=1.0)
    run = load_run(tmp_path / "fleet")
    meter = transitions(run)
    offloads = meter.table[meter.table["phase"] == "offload_train"]
    actors = {p["pid"] for p in run.processes if p.get("role") == "actor"}
    assert set(offloads["pid"]) == actors and len(actors) == 4  # overlapping ranks: none taken for a server side
    assert meter.steps.groupby(["host", "pid"]).ngroups == 8  # every actor and engine process that moved memory
    assert 0 < meter.share < 1  # per process: four ranks offloading at once are not four times the step


def test_the_calibrated_h200_logs_hold_pinned_copies_near_the_measured_link(meters):
    """sample_logs/h200-calibrated: recorded with `record --calibrate` on the H200 (pinned 55.2 GB/s both ways,
    disk 1.80 write / 1.67 read): the loop's pinned offload and onload run at 0.9-1.0 of the link; a disk
    offload faster than the calibrated disk went through the page cache, and says so."""
    from miles_profile.report.transitions_html import meter_rows
    pinned = meters("h200-calibrated/5-both-gpu-peak")
    assert pinned.ceilings["pinned_d2h"] == pytest.approx(55.2e9, rel=0.01)
    for phase in ("offload_train", "onload_train"):
        assert 0.85 < _loop(pinned, phase)["ratio"] <= 1.0, _loop(pinned, phase)
    disk = meters("h200-calibrated/6-gpu-peak-disk")
    onload = _loop(disk, "onload_train")
    assert onload["link"] == "disk_read" and onload["ratio"] > 1.0
    texts = {r["phase"] + ("" if r["when"] == "setup" else " loop"): r["ratio"] for r in meter_rows(disk)}
    assert texts["onload_train loop"].endswith("(page cache)"), texts
    assert not any(t.endswith("(page cache)") for t in (r["ratio"] for r in meter_rows(pinned)))
