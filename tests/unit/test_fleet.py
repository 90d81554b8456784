"""Fleet view analysis on hand-built PhaseTables whose answers are known by construction."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_profile.errors import MilesProfileError
from miles_profile.runmodel import fleet

GiB = 1024 ** 3
MiB = 1024 ** 2


def row(host, uuid, pid, rank, role, phase, iteration, t0, t1, total=80 * GiB, **series) -> dict:
    """One phase instance; series given as e.g. used=(peak, floor, first, last) or proc_peak=..."""
    out = dict(host=host, gpu_uuid=uuid, gpu_total=total, pid=pid, rank=rank, role=role, phase=phase,
               phase_id=f"{phase}{iteration}", iteration=iteration, t0=t0, t1=t1,
               expected_bytes=series.pop("expected", np.nan))
    for name, value in series.items():
        if isinstance(value, tuple):
            for stat, v in zip(fleet.STATS, value):
                out[f"{name}_{stat}"] = float(v)
        else:
            out[name] = value
    return out


def table(rows) -> pd.DataFrame:
    return pd.DataFrame(rows)


def peers(values: dict[str, float], iterations=2, phase="train") -> pd.DataFrame:
    """One actor per GPU on host n0, GPU i (and its actor) peaking at values[uuid] in every iteration."""
    rows = []
    for i, (uuid, v) in enumerate(values.items()):
        for it in range(iterations):
            rows.append(row("n0", uuid, 100 + i, i, "actor", phase, it, 10.0 * it, 10.0 * it + 5,
                            used=(v, v / 2, v / 2, v / 2), proc=(v, v / 2, v / 2, v / 2)))
    return table(rows)


# -- lanes and the matrix ----------------------------------------------------------------------
def test_lanes_are_labelled_by_host_and_rank_order_with_their_ranks_and_roles():
    t = table([row("node10", "GPU-b", 1, 9, "actor", "train", 0, 0, 1, used=(GiB,) * 4),
               row("node2", "GPU-z", 2, 1, "actor", "train", 0, 0, 1, used=(GiB,) * 4),
               row("node2", "GPU-a", 3, 3, "actor", "train", 0, 0, 1, used=(GiB,) * 4),
               row("node2", "GPU-a", 4, 3, "engine", "generate", 0, 1, 2, used=(GiB,) * 4)])
    lanes = fleet.lanes(t)
    # node2 before node10 (natural order); on node2 the GPU of rank 1 is gpu0, of rank 3 gpu1
    assert list(lanes["label"]) == ["node2:gpu0", "node2:gpu1", "node10:gpu0"]
    assert list(lanes["gpu_uuid"]) == ["GPU-z", "GPU-a", "GPU-b"]
    assert lanes.loc[1, "roles"] == "actor+engine" and lanes.loc[1, "ranks"] == "3"


def test_host_lanes_group_a_rank_and_its_engine():
    t = table([row("h", "", 1, 0, "actor", "train", 0, 0, 1, rss=(GiB,) * 4),
               row("h", "", 2, 0, "engine", "generate", 0, 1, 2, rss=(GiB,) * 4),
               row("h", "", 3, 1, "actor", "train", 0, 0, 1, rss=(GiB,) * 4)])
    lanes = fleet.lanes(t)
    assert list(lanes["label"]) == ["h:rank0", "h:rank1"]
    assert lanes.loc[0, "pids"] == (1, 2)


def test_matrix_takes_nvml_used_and_orders_columns_in_time():
    t = table([row("n", "G0", 1, 0, "actor", "train", 1, 20, 25, used=(30 * GiB, 0, 0, 0)),
               row("n", "G0", 1, 0, "actor", "train", 0, 0, 5, used=(20 * GiB, 0, 0, 0)),
               row("n", "G0", 2, 0, "engine", "generate", 0, 10, 15, used=(40 * GiB, 0, 0, 0)),
               row("n", "G1", 3, 1, "actor", "train", 0, 0, 5, used=(8 * GiB, 0, 0, 0))])
    m = fleet.gpu_matrix(t)
    assert list(m.columns["label"]) == ["#0 train", "#0 generate", "#1 train"]
    assert m.bytes.shape == (2, 3)
    assert m.bytes[0].tolist() == [20 * GiB, 40 * GiB, 30 * GiB]
    assert m.bytes[1, 0] == 8 * GiB and np.isnan(m.bytes[1, 1:]).all()
    assert m.fraction[0, 1] == pytest.approx(0.5)
    assert set(m.lanes["source"]) == {fleet.SOURCE_USED}


def test_matrix_without_nvml_used_sums_processes_including_an_idle_one():
    # the engine has no phase during train: it holds what its offload left (3 GiB)
    t = table([row("n", "G0", 2, 0, "engine", "offload_kv", 0, 0, 1, proc=(10 * GiB, 3 * GiB, 10 * GiB, 3 * GiB)),
               row("n", "G0", 1, 0, "actor", "train", 0, 2, 5, proc=(20 * GiB, 5 * GiB, 5 * GiB, 5 * GiB))])
    m = fleet.gpu_matrix(t)
    assert m.lanes.loc[0, "source"] == fleet.SOURCE_SUM
    col = list(m.columns["phase"]).index("train")
    assert m.bytes[0, col] == 23 * GiB


def test_levels_during_overlap_nesting_and_idle_gaps():
    # phases: A [0, 10] peak 5 holding B [1, 2] peak 3; C [12, 14] peak 7, last 2
    t0, t1 = [0, 1, 12], [10, 2, 14]
    peak, last = [5, 3, 7], [4, 1, 2]
    got = fleet.levels_during(t0, t1, peak, last, [5, 10.5, 13, 20, -5], [6, 11, 13.5, 21, -4])
    assert got[0] == 5          # inside A
    assert got[1] == 4          # idle after A: what A left
    assert got[2] == 7          # inside C (and after A: max)
    assert got[3] == 2          # after C
    assert np.isnan(got[4])     # before anything


def test_coarsen_keeps_every_peak():
    m = fleet.gpu_matrix(peers({f"G{i}": (i + 1) * GiB for i in range(3)}, iterations=50))
    m.bytes[2, 37] = 70 * GiB
    small = fleet.coarsen(m, 10)
    assert len(small.columns) <= 10
    assert np.nanmax(small.bytes) == 70 * GiB
    assert small.columns["iteration_last"].max() == 49


def test_missing_column_is_a_one_line_error():
    with pytest.raises(MilesProfileError, match="lacks column"):
        fleet.gpu_matrix(pd.DataFrame({"host": ["a"], "pid": [1]}))


# -- outliers ----------------------------------------------------------------------------------
def test_largest_shortfall_is_ranked_first_with_its_link():
    rows = []
    for i, (short, it) in enumerate([(0.5 * GiB, 0), (3 * GiB, 2), (1 * GiB, 1)]):
        first = 10 * GiB
        rows.append(row("n0", f"G{i}", 10 + i, i, "engine", "offload_kv", it, 100.0 + it, 101.0 + it,
                        expected=8 * GiB, proc=(first, first - 8 * GiB + short, first, first - 8 * GiB + short)))
    rows.append(row("n0", "G3", 13, 3, "engine", "offload_kv", 0, 100, 101, expected=8 * GiB,
                    proc=(10 * GiB, 2 * GiB, 10 * GiB, 2 * GiB)))  # dropped all it said: not listed
    out = fleet.rank_outliers(table(rows)).shortfall
    assert list(out["value"]) == [3 * GiB, 1 * GiB, 0.5 * GiB]
    first = out.iloc[0]
    assert (first["host"], first["gpu_uuid"], first["phase"], first["iteration"], first["t0"], first["t1"]) == \
        ("n0", "G1", "offload_kv", 2, 102.0, 103.0)


def test_hottest_gpu_and_fastest_floor_are_ranked_first():
    rows = []
    for g in range(3):
        for it in range(6):
            floor = 2 * GiB + (100 * MiB * it if g == 1 else 0)
            peak = 30 * GiB if (g == 2 and it == 4) else 20 * GiB
            rows.append(row("n0", f"G{g}", g, g, "actor", "train", it, 10.0 * it, 10.0 * it + 5,
                            used=(peak, floor, floor, floor), proc=(peak, floor, floor, floor)))
    out = fleet.rank_outliers(table(rows))
    assert out.peak.iloc[0]["gpu_uuid"] == "G2" and out.peak.iloc[0]["iteration"] == 4
    assert out.peak.iloc[0]["value"] == 30 * GiB
    slope = out.floor_slope.iloc[0]
    assert slope["gpu_uuid"] == "G1" and slope["value"] == pytest.approx(100 * MiB)
    assert slope["rise"] == pytest.approx(400 * MiB)  # iterations 1..5: the first is warm-up
    assert slope["n"] == 5


# -- lane specs --------------------------------------------------------------------------------
def _fleet():
    rows = []
    for h in range(3):
        for g in range(4):
            r = 4 * h + g
            v = (20 + r) * GiB
            rows.append(row(f"node{h}", f"GPU-{h}{g}ab", 100 + r, r, "actor", "train", 0, 0, 5, used=(v, v, v, v)))
    return table(rows)


@pytest.mark.parametrize("spec, labels", [
    ("rank:0-1", ["node0:gpu0", "node0:gpu1"]),
    ("rank:5", ["node1:gpu1"]),
    ("host:node2", ["node2:gpu0", "node2:gpu1", "node2:gpu2", "node2:gpu3"]),
    ("worst:2", ["node2:gpu2", "node2:gpu3"]),
    ("gpu:GPU-03", ["node0:gpu3"]),
    ("rank:0, gpu:GPU-11,worst:1", ["node0:gpu0", "node1:gpu1", "node2:gpu3"]),
    ("host:node[01]", ["node0:gpu0", "node0:gpu1", "node0:gpu2", "node0:gpu3",
                       "node1:gpu0", "node1:gpu1", "node1:gpu2", "node1:gpu3"]),
])
def test_lane_specs_pick_lanes(spec, labels):
    t = _fleet()
    by_id = dict(zip(*fleet.lanes(t)[["lane", "label"]].to_numpy().T))
    assert [by_id[lane] for lane in fleet.select_lanes(t, spec)] == labels


@pytest.mark.parametrize("spec, message", [
    ("", "empty lane spec"), ("rank:7-3", "bad rank range"), ("rank:x", "bad rank range"),
    ("nodes:3", "bad lane spec term"), ("worst:0", "positive integer"), ("host:node9", "matches no lane"),
    ("gpu:GPU-99", "matches no lane"), ("rank:0,,rank:1", "bad lane spec term"),
])
def test_bad_lane_specs_are_one_line_errors(spec, message):
    with pytest.raises(MilesProfileError, match=message) as caught:
        fleet.select_lanes(_fleet(), spec)
    assert "\n" not in str(caught.value)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(0.01, 5), st.floats(0, 100), st.floats(0, 100)),
                min_size=1, max_size=12),
       st.lists(st.tuples(st.floats(-5, 80), st.floats(0, 10)), min_size=1, max_size=8))
def test_levels_during_matches_brute_force_on_sequential_phases(phases, windows):
    # phases one after another: (gap before, duration, peak, last), last <= peak
    t, t0, t1, peak, last = 0.0, [], [], [], []
    for gap, duration, p, l in phases:
        t0.append(t + gap)
        t1.append(t + gap + duration)
        t = t1[-1]
        peak.append(max(p, l))
        last.append(l)
    w0 = np.array([a for a, _ in windows])
    w1 = w0 + np.array([d for _, d in windows])
    got = fleet.levels_during(t0, t1, peak, last, w0, w1)
    for k in range(len(w0)):
        over = [peak[i] for i in range(len(t0)) if t0[i] < w1[k] and t1[i] > w0[k]]
        ended = [i for i in range(len(t0)) if t1[i] <= w0[k]]
        held = [last[max(ended, key=lambda i: t1[i])]] if ended else []
        want = max(over + held) if over + held else np.nan
        assert (np.isnan(want) and np.isnan(got[k])) or got[k] == want
