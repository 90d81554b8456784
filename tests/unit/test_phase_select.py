"""--phase: families, names and patterns (phase_select.py), and what a selection does to checks,
tables and the timeline (report/phase_filter.py), on the real H200 log."""
from __future__ import annotations

import pytest

from miles_profile import names
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.reader import load_run
from miles_profile.phase_select import FAMILIES, parse_phases
from miles_profile.verdicts.checks import CheckResult, Finding, run_checks
from miles_profile.verdicts.selection import select_checks, select_run, selection_for
from tests.conftest import REPO


def selected(text, phases=names.PHASES):
    return parse_phases(text).split(phases)[0]


def test_miles_style_families_expand_to_our_phase_names():
    assert selected("offload") == ["offload_rollout", "offload_kv", "offload_weights", "offload_train"]
    assert selected("onload") == ["onload_weights", "onload_kv", "onload_train"]
    assert selected("rollout") == ["generate", "offload_rollout", "offload_kv", "offload_weights",
                                   "onload_weights", "onload_kv", "update_weights"]
    assert selected("train") == ["train"]  # the phase alone: the state's moves are in offload/onload
    assert selected("offload,train,rollout") == [p for p in names.PHASES if p not in
                                                 ("onload_train", "clear_memory", "eval")]
    assert selected("all") == list(names.PHASES)
    assert selected("*_kv") == ["offload_kv", "onload_kv"]
    # a family is a rule, not a list: an offload phase of the user's own is an offload too
    assert parse_phases("offload").matches("offload_optimizer")


def test_unknown_names_are_one_line_errors_listing_the_known_ones():
    with pytest.raises(MilesProfileError) as error:
        parse_phases("offload,trian")
    message = str(error.value)
    assert "unknown phase 'trian'" in message and "\n" not in message
    assert all(token in message for token in [*FAMILIES, *names.PHASES])
    # a run's own phase names are accepted where the run is known
    assert parse_phases("forward", extra_names=["forward"]).matches("forward")
    assert parse_phases(None) is None and parse_phases(" , ") is None


@pytest.fixture(scope="module")
def run():
    return load_run(REPO / "sample_logs/h200/4-both")


def test_checks_keep_only_findings_of_selected_phases(run):
    results = {r.name: r for r in run_checks(run)}
    chosen = {r.name: r for r in select_checks(list(results.values()), parse_phases("offload"))}
    spikes = chosen["transition_spikes"]
    assert spikes.findings and all(f.phase.startswith("offload_") for f in spikes.findings)
    assert len(spikes.findings) < len(results["transition_spikes"].findings)
    assert "in phases not selected (--phase offload)" in spikes.summary
    # a whole-run judgement (no phase) is kept as it was
    assert chosen["headroom"] == results["headroom"]


def test_a_failure_in_an_unselected_phase_no_longer_fails_the_check():
    result = CheckResult("x", "X", "fail", "1 of 2 failed", "", None, [
        Finding("fail", "generate spiked", phase="generate"), Finding("pass", "train fine", phase="train")])
    (kept,) = select_checks([result], parse_phases("train"))
    assert kept.status == "pass" and [f.phase for f in kept.findings] == ["train"]
    (kept,) = select_checks([result], parse_phases("rollout"))
    assert kept.status == "fail" and kept.summary.startswith("1 of 1 failed; first: generate spiked")


def test_a_selected_run_keeps_its_samples_and_drops_the_other_phases(run):
    chosen = select_run(run, parse_phases("offload,train"))
    assert set(chosen.phases["name"]) == {"offload_train", "offload_rollout", "train"}
    assert len(chosen.samples) == len(run.samples)
    assert set(chosen.phase_summaries["name"]) <= {"offload_train", "offload_rollout", "train"}


def test_the_run_meta_selection_is_the_default_and_an_option_overrides_it(run):
    run.meta["phase_selection"] = "offload"
    try:
        assert selection_for(run, None).text == "offload"
        assert selection_for(run, "train").text == "train"
    finally:
        del run.meta["phase_selection"]
    assert selection_for(run, None) is None
