"""The dashboard's --phase: the same selection as visualize's, in its checks, per-phase table and
timeline, on the real H200 log; a bad selection is one line and exit 2."""
from __future__ import annotations

import pytest

from dashboards.__main__ import main
from dashboards.panels import checks, phases, timeline
from miles_profile.logdir.reader import load_run
from tests.conftest import REPO


@pytest.fixture(scope="module")
def run():
    return load_run(REPO / "sample_logs/h200/4-both")


def test_checks_and_table_keep_only_the_selected_phases(run):
    everything, _ = checks.compute(run)
    chosen, _ = checks.compute(run, "offload")
    found = {f.phase for r in chosen for f in r.findings if f.phase}
    assert found and all(p.startswith("offload_") for p in found)
    assert sum(len(r.findings) for r in chosen) < sum(len(r.findings) for r in everything)
    table, _ = phases.compute(run, False, "offload,train")
    assert set(table["name"]) == {"offload_train", "offload_rollout", "train"}
    assert set(phases.compute(run, False)[0]["name"]) == set(run.phases["name"])


def test_the_timeline_draws_bands_only_for_the_selected_phases(run):
    def band_names(figure):
        return {t.name for t in figure.data if t.name in set(run.phases["name"])}
    assert band_names(timeline.build_figure(run, "r", None)) == set(run.phases["name"])
    assert band_names(timeline.build_figure(run, "r", None, "offload")) == {"offload_train", "offload_rollout"}


def test_the_runs_recorded_selection_is_the_default(run):
    run.meta["phase_selection"] = "train"
    try:
        assert set(phases.compute(run, False)[0]["name"]) == {"train"}
        assert set(phases.compute(run, False, "all")[0]["name"]) == set(run.phases["name"])
    finally:
        del run.meta["phase_selection"]


def test_an_unknown_phase_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path), "--phase", "trian"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dashboards: unknown phase 'trian' in --phase; known: offload") and err.count("\n") == 1
