"""Comparison of runs aligned by (iteration, phase), including runs whose phases differ."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from miles_profile.report.compare import comparison_figure, comparison_html, phase_peak_comparison, slot_keys
from test_report_fakes import GiB, make_run, steps

T = np.round(np.arange(0.0, 10.0, 0.1), 6)


def _run(name, peak_generate, with_offload=True, slow=1.0):
    level = steps(T, [(0, GiB), (1 * slow, peak_generate), (3 * slow, GiB)])
    phases = [dict(name="generate", start=1 * slow, end=3 * slow, rollout_id=0)]
    if with_offload:
        phases.append(dict(name="offload_rollout", start=3 * slow, end=3.2 * slow, rollout_id=0,
                           expected_bytes=int(peak_generate - GiB)))
    phases.append(dict(name="train", start=3.5 * slow, end=4.5 * slow, rollout_id=0))
    return make_run({"t": T, "rss": level, "rss_peak": level}, phases, name=name)


def test_peak_table_aligns_by_phase_and_leaves_missing_phases_empty():
    a, b = _run("cpu", 5 * GiB), _run("gpu", 3 * GiB, with_offload=False, slow=2.0)  # b is slower, no offload
    table = phase_peak_comparison([a, b])
    assert list(zip(table["iteration"], table["phase"])) == [(0, "generate"), (0, "offload_rollout"), (0, "train")]
    assert table["cpu: host peak"].tolist()[0] == 5 * GiB and table["gpu: host peak"].tolist()[0] == 3 * GiB
    assert pd.isna(table["gpu: host peak"].iloc[1])
    html = comparison_html([a, b])  # a missing cell renders as a dash, not an error
    assert 'id="comparison-table"' in html and "–" in html


def test_figure_is_a_stacked_bar_per_phase_and_configuration():
    a, b = _run("a", 5 * GiB), _run("b", 3 * GiB, slow=2.0)
    fig = comparison_figure([a, b])
    assert fig.layout.barmode == "relative" and not [t for t in fig.data if t.type == "scatter" and t.mode == "lines"]
    bars = [t for t in fig.data if t.type == "bar"]
    # horizontal bars (issue 18: run names read left to right): one per configuration in every phase's plot
    assert {tuple(t.y) for t in bars} == {("a", "b")} and {t.orientation for t in bars} == {"h"}
    # a bar is the state at the phase's end (both runs' generate ends back at 1 GiB; its 5 and 3 GiB
    # peaks are the table's), whatever the durations
    generate = [t for t in bars if "generate" in t.hovertemplate]
    assert np.allclose(sum(np.asarray(t.x, float) for t in generate), [1.0, 1.0])
    train_axis = {t.xaxis for t in bars if "train" in t.hovertemplate}
    assert len(train_axis) == 1 and train_axis != {t.xaxis for t in generate}  # one column per phase


def _many_phases(n: int, name: str, slow: float = 1.0):
    cycle = ["generate", "offload_rollout", "train", "offload_train", "onload_weights"]
    t = np.arange(0.0, n * slow, slow / 4)  # four samples per phase
    level = np.tile([1.0, 2.0, 3.0, 1.5], n) * GiB
    phases = [dict(name=cycle[k % len(cycle)], start=k * slow, end=(k + 0.99) * slow, rollout_id=k // len(cycle))
              for k in range(n)]
    return make_run({"t": t, "rss": level, "rss_peak": level}, phases, name=name)


@pytest.mark.slow
def test_ten_thousand_phases_compare_in_linear_time_with_a_bounded_figure():
    # Was one add_vrect per phase slot: 2 x 280 phases took 86 s, 10,000 would take hours.
    runs = [_many_phases(10_000, "a"), _many_phases(10_000, "b", slow=1.5)]
    started = time.perf_counter()
    fig = comparison_figure(runs)
    elapsed = time.perf_counter() - started
    assert not fig.layout.shapes  # no shape per phase
    # one bar trace per category and phase name (RSS not split: one category) and a total marker each
    assert len(fig.data) == 5 * 2
    assert elapsed < 60, elapsed
