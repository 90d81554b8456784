"""Comparison of runs aligned by (iteration, phase), including runs whose phases differ."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

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


def test_figure_x_is_the_phase_slot_not_wall_clock():
    a, b = _run("a", 5 * GiB), _run("b", 5 * GiB, slow=2.0)
    fig = comparison_figure([a, b])
    for trace in (t for t in fig.data if t.legendgroup != "phase bands"):
        x = np.asarray(trace.x, dtype=float)
        x = x[np.isfinite(x)]
        assert x.min() >= 0 and x.max() <= len(slot_keys(a))  # within the slots, whatever the durations
        assert np.nanmax(np.asarray(trace.y, dtype=float)) == 5.0  # the generate peak, in GiB, exactly


def _many_phases(n: int, name: str, slow: float = 1.0):
    cycle = ["generate", "offload_rollout", "train", "offload_train", "onload_weights"]
    t = np.arange(0.0, n * slow, slow / 4)  # four samples per phase
    level = np.tile([1.0, 2.0, 3.0, 1.5], n) * GiB
    phases = [dict(name=cycle[k % len(cycle)], start=k * slow, end=(k + 0.99) * slow, rollout_id=k // len(cycle))
              for k in range(n)]
    return make_run({"t": t, "rss": level, "rss_peak": level}, phases, name=name)


def test_phase_bands_cover_each_slot_once_in_its_phase_colour():
    a, b = _run("a", 5 * GiB), _run("b", 5 * GiB, with_offload=False)
    fig = comparison_figure([a, b])
    bands = [t for t in fig.data if t.legendgroup == "phase bands"]
    assert not fig.layout.shapes
    covered = {}
    for band in bands:
        x = np.asarray(band.x, dtype=float).reshape(-1, 6)  # x0, x0, x1, x1, x0, gap per rectangle
        assert np.all(x[:, 2] - x[:, 0] == 1) and np.isnan(x[:, 5]).all()
        covered.update({int(x0): band.name for x0 in x[:, 0]})
    assert covered == {0: "generate", 1: "offload_rollout", 2: "train"}
    assert fig.data.index(bands[-1]) < min(fig.data.index(t) for t in fig.data if t not in bands)  # drawn below


def test_ten_thousand_phases_compare_in_linear_time_with_a_bounded_figure():
    # Was one add_vrect per phase slot: 2 x 280 phases took 86 s, 10,000 would take hours.
    runs = [_many_phases(10_000, "a"), _many_phases(10_000, "b", slow=1.5)]
    started = time.perf_counter()
    fig = comparison_figure(runs)
    elapsed = time.perf_counter() - started
    assert not fig.layout.shapes  # no shape per phase
    assert len(fig.data) == 5 + 2  # one band trace per phase name, one line per run (a host row only)
    assert elapsed < 60, elapsed  # about 2 s on an idle core; bound generous for a loaded 2-core machine
