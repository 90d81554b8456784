"""Comparison of runs aligned by (iteration, phase), including runs whose phases differ."""
from __future__ import annotations

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
    for trace in fig.data:
        x = np.asarray(trace.x, dtype=float)
        x = x[np.isfinite(x)]
        assert x.min() >= 0 and x.max() <= len(slot_keys(a))  # within the slots, whatever the durations
        assert np.nanmax(np.asarray(trace.y, dtype=float)) == 5.0  # the generate peak, in GiB, exactly
