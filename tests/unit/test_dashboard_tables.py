"""The report's tables on screen: bytes become GiB under a header naming the metric; nothing else changes."""
from __future__ import annotations

import pandas as pd

from dashboards.panels.compare import peak_table
from dashboards.panels.phases import display_table

GiB = 1024 ** 3


def test_phase_table_columns_in_gib_under_the_metric_label():
    frame = pd.DataFrame({"name": ["generate", "train"], "count": [3, 3], "total_s": [1.23456, 2.0],
                          "rss_floor": pd.array([GiB, None], dtype="Int64"),
                          "rss_peak": pd.array([3 * GiB // 2, 2 * GiB], dtype="Int64")})
    table = display_table(frame, {"rss": "host RSS"}, "t")
    headers = {c["id"]: c["name"] for c in table.columns}
    assert headers["rss_peak"] == ["host RSS (GiB)", "peak"] and headers["name"] == ["", "phase"]
    assert table.data[0] == {"name": "generate", "count": 3, "total_s": 1.235, "rss_floor": 1.0, "rss_peak": 1.5}
    assert table.data[1]["rss_floor"] is None and table.data[1]["rss_peak"] == 2.0


def test_peak_comparison_one_column_group_per_run():
    frame = pd.DataFrame({"iteration": [0], "phase": ["train"],
                          "run-a: host peak": pd.array([GiB], dtype="Int64"),
                          "run-b: host peak": pd.array([None], dtype="Int64")})
    table = peak_table(frame)
    assert [c["name"] for c in table.columns][2:] == [["run-a", "host peak (GiB)"], ["run-b", "host peak (GiB)"]]
    assert table.data == [{"iteration": 0, "phase": "train", "run-a: host peak": 1.0, "run-b: host peak": None}]
