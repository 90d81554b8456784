"""Fleet figures: the heatmap's shape and values, the outliers table, one GPU's process stack."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from miles_profile.runmodel import fleet
from miles_profile.report.fleet_figures import (
    ROW_LABELS_MAX, fleet_heatmap, gpu_process_stack, outliers_table,
)
from miles_profile.runmodel.fleet_synthetic import synthetic_table
from test_fleet import GiB, row, table


def test_heatmap_is_one_trace_with_the_matrix_values():
    t = table([row("n", "G0", 1, 0, "actor", "train", 0, 0, 5, used=(40 * GiB, 0, 0, 0)),
               row("n", "G0", 2, 0, "engine", "generate", 0, 10, 15, used=(60 * GiB, 0, 0, 0)),
               row("n", "G1", 3, 1, "actor", "train", 0, 0, 5, used=(20 * GiB, 0, 0, 0))])
    figure = fleet_heatmap(fleet.gpu_matrix(t))
    assert len(figure.data) == 1 and figure.data[0].type == "heatmap"
    heat = figure.data[0]
    z, gib = np.asarray(heat.z, dtype=float), np.asarray(heat.customdata, dtype=float)
    assert z.shape == (2, 2)
    assert list(heat.x) == ["#0 train", "#0 generate"]
    assert heat.y[0].startswith("n:gpu0 r0 actor+engine") and heat.y[1].startswith("n:gpu1 r1 actor")
    np.testing.assert_allclose(z, [[0.5, 0.75], [0.25, np.nan]])
    np.testing.assert_allclose(gib, [[40, 60], [20, np.nan]])
    # colours span the data (25%-75%), not 0-100%: a rank a few percent above its peers stands out
    assert (heat.zmin, heat.zmax) == (0.25, 0.75)
    assert "GiB" in heat.hovertemplate and not figure.layout.annotations


def test_heatmap_of_512_gpus_thins_labels_and_columns():
    t = synthetic_table(64, 8, 12)
    figure = fleet_heatmap(fleet.gpu_matrix(t), max_columns=60)
    heat = figure.data[0]
    z = np.asarray(heat.z)
    assert z.shape[0] == 512 and z.shape[1] <= 60
    assert len(figure.layout.yaxis.tickvals) <= ROW_LABELS_MAX
    assert not figure.layout.annotations
    assert np.nanmax(z) == np.float32(np.nanmax(fleet.gpu_matrix(t).fraction))  # merging keeps the peak
    size = len(figure.to_json())
    assert size < 1_000_000, size  # typed arrays, not one string per cell


def test_outliers_table_rows_carry_links():
    t = synthetic_table(1, 4, 6, shortfall=(2, 3, 5 * GiB))
    rows = outliers_table(fleet.rank_outliers(t, top=2))
    short = [r for r in rows if r["kind"] == "largest offload shortfall"]
    assert short[0]["phase"] == "offload_kv" and short[0]["iteration"] == 3 and short[0]["bytes"] == 5 * GiB
    assert {"lane", "t0", "t1", "label", "value"} <= set(short[0])
    json.dumps(rows)  # plain values, ready for HTML or a DataTable


def test_process_stack_orders_actor_engine_others_under_the_device_line():
    t = np.array([0.0, 1.0, 2.0])
    figure = gpu_process_stack({"pid 9 other": (t, np.full(3, GiB)),
                                "engine pid 8": pd.Series([2 * GiB, 2 * GiB], index=[0.5, 1.5]),
                                "actor rank 0": (t, np.array([1, 3, 1]) * GiB)},
                               device_used=(t, np.array([5, 6, 5]) * GiB), device_total=8 * GiB, t0=0.0)
    stacked = [tr for tr in figure.data if tr.stackgroup]
    assert [tr.name for tr in stacked] == ["actor rank 0", "engine pid 8", "pid 9 other"]
    grid = list(stacked[0].x)
    assert grid == [0.0, 0.5, 1.0, 1.5, 2.0]
    # the engine holds 0 before its first sample, then its last value
    np.testing.assert_allclose(stacked[1].y, [0, 2, 2, 2, 2])
    np.testing.assert_allclose(stacked[0].y, [1, 1, 3, 3, 1])
    line = [tr for tr in figure.data if not tr.stackgroup]
    assert [tr.name for tr in line] == ["NVML used (device)"]
    assert figure.layout.shapes[0].y0 == 8.0
