"""Per-phase statistics on fake runs: exact floors, means and true peaks; iterations."""
from __future__ import annotations

import numpy as np
import pytest

from miles_profile.runmodel.stats import phase_instances, phase_table, range_stats
from test_report_fakes import GiB, make_run


def _run():
    t = np.arange(0.0, 10.0, 0.5)  # 20 samples
    rss = np.full(len(t), 1 * GiB, dtype=float)
    rss[(t > 2) & (t <= 4)] = 3 * GiB
    peak = rss.copy()
    peak[t == 3.0] = 5 * GiB + 1  # a spike between two samples, seen only by the true peak
    phases = [dict(name="generate", start=2.0, end=4.0, rollout_id=0),
              dict(name="train", start=4.0, end=6.0, rollout_id=0),
              dict(name="generate", start=6.0, end=8.0, rollout_id=1),
              dict(name="update_weights", start=8.0, end=9.0)]
    return make_run({"t": t, "rss": rss, "rss_peak": peak}, phases)


def test_phase_instances_floor_mean_peak_are_exact():
    inst = phase_instances(_run())
    gen = inst.iloc[0]
    assert gen["name"] == "generate"
    assert gen["rss_floor"] == 3 * GiB and gen["rss_peak"] == 5 * GiB + 1 and gen["rss_mean"] == 3 * GiB
    train = inst.iloc[1]
    assert train["rss_floor"] == 1 * GiB and train["rss_peak"] == 1 * GiB


def test_iterations_follow_rollout_id_and_carry_forward():
    inst = phase_instances(_run())
    assert list(inst["iteration"]) == [0, 0, 1, 1]


def test_iterations_without_rollout_id_count_occurrences():
    run = make_run({"t": np.arange(10.0), "rss": np.ones(10)},
                   [dict(name="a", start=0, end=1), dict(name="b", start=1, end=2), dict(name="a", start=3, end=4)])
    assert list(phase_instances(run)["iteration"]) == [0, 0, 1]


def test_phase_table_overall_and_by_iteration():
    run = _run()
    overall = phase_table(run)
    assert list(overall["name"]) == ["generate", "train", "update_weights"]
    gen = overall.iloc[0]
    assert gen["count"] == 2 and gen["total_s"] == pytest.approx(4.0) and gen["rss_peak"] == 5 * GiB + 1
    by_it = phase_table(run, by_iteration=True)
    assert list(zip(by_it["iteration"], by_it["name"])) == [(0, "generate"), (0, "train"), (1, "generate"),
                                                             (1, "update_weights")]


def test_range_stats_empty_and_overlapping_ranges():
    y = np.array([1.0, 5.0, np.nan, 2.0])
    floor, mean, peak = range_stats(y, np.array([0, 1, 4, 2]), np.array([4, 2, 4, 3]))
    assert floor[0] == 1 and peak[0] == 5 and mean[0] == pytest.approx(8 / 3)
    assert peak[1] == 5 and np.isnan(peak[2]) and np.isnan(floor[3])


def test_a_run_without_phases_has_empty_tables():
    run = make_run({"t": np.arange(5.0), "rss": np.ones(5)})
    assert phase_instances(run).empty and phase_table(run).empty


def test_without_rollout_id_a_periodic_phase_belongs_to_the_step_before_it():
    # a setup phase, a `train` per step, an `eval` after every third step, a `log` inside step 4's time
    phases = [dict(name="load", start=0.0, end=0.5)]
    for step in range(9):
        phases.append(dict(name="train", start=1.0 + step, end=1.4 + step))
        if step % 3 == 2:
            phases.append(dict(name="eval", start=1.5 + step, end=1.9 + step))
    phases.append(dict(name="log", start=5.1, end=5.2, parent=None))
    run = make_run({"t": np.arange(0.0, 12.0, 0.1), "rss": np.ones(120)}, phases)
    inst = phase_instances(run).sort_values("start")
    by_name = {name: list(group["iteration"]) for name, group in inst.groupby("name", sort=False)}
    assert by_name["load"] == [-1] and by_name["train"] == list(range(9))
    assert by_name["eval"] == [2, 5, 8]  # not [0, 1, 2]
    assert by_name["log"] == [4]
