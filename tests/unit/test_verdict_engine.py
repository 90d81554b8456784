"""The verdict engine (verdicts/engine.py): one RunVerdict per run, whose status is the worst of its
checks and gates and whose exit code is 1 exactly when that status is "fail"; gates that never
silently pass. On synthetic verdicts, on the committed logs and on a small two-rank CPU recording."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from dashboards.panels.checks import compute as dashboard_checks
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.reader import load_run
from miles_profile.verdicts.checks import run_checks
from miles_profile.verdicts.oom import check_oom
from miles_profile.verdicts.engine import (
    STATUS_LABEL,
    RunVerdict,
    exit_code_of,
    judge,
    judge_test_limits,
    overall_of,
)
from miles_profile.verdicts.gate import (
    MEASURE_COLUMNS,
    RegressionThresholds,
    compare_runs,
)
from miles_profile.verdicts.memory_limit import judge_limits
from miles_profile.verdicts.per_process import _aggregate
from miles_profile.verdicts.types import STATUS_ORDER, TOO_SMALL, CheckResult, Finding
from tests.conftest import REPO

GiB, MiB = 1024 ** 3, 1024 ** 2
CPU = REPO / "sample_logs" / "cpu"
ENGINE_SERVER = REPO / "sample_logs" / "h200" / "9-dist-engine-server"
FLEET_CHECKS = {"rank_imbalance", "floor_trend_leak", "serialized_peaks_per_gpu"}


def _check(name: str, status: str) -> CheckResult:
    return CheckResult(name, name.title(), status, f"{name} is {status}", "why", findings=[Finding(status, "x")])


def _measures(before: float, now: float, key: str = "gpu|h|GPU-1", base_key: str | None = None):
    row = {"phase": "train", "iteration": -2, "rank_key": "gpu|ranks 0", "subject": "h:gpu0", "gpu": "h:gpu0",
           "memory": "GPU used (NVML, device)", "floor": float("nan")}
    return (pd.DataFrame([{**row, "exact_key": key, "peak": now}], columns=MEASURE_COLUMNS),
            pd.DataFrame([{**row, "exact_key": base_key or key, "peak": before}], columns=MEASURE_COLUMNS))


# -- the rule every view shares -------------------------------------------------------------------
@pytest.mark.parametrize("statuses, status", [
    (["pass", "n/a", TOO_SMALL], "pass"),
    (["pass", "warn", TOO_SMALL], "warn"),
    (["warn", "fail"], "fail"),
    # a run where nothing (or only headroom) judged anything warns: never a bare pass or n/a
    (["n/a", TOO_SMALL], "warn"),
    (["n/a"], "warn"),
    ([], "n/a"),
    (["pass", "fail", TOO_SMALL], "fail"),
])
def test_status_is_the_worst_check_and_exit_code_is_one_iff_it_fails(statuses, status):
    verdict = RunVerdict("r", [_check(f"c{k}", s) for k, s in enumerate(statuses)])
    assert verdict.status == status
    assert verdict.exit_code == (1 if status == "fail" else 0)
    assert verdict.exit_code_for(strict=True) == (1 if status in ("fail", "warn") else 0)
    assert STATUS_LABEL[status] in ("PASS", "FAIL", "WARN", "N/A", "SMALL")


def test_a_run_judged_by_headroom_alone_warns_and_says_what_was_judged():
    verdict = RunVerdict("r", [_check("offload_drop", "n/a"), _check("leak", "n/a"), _check("headroom", "pass"),
                               _check("oom", "n/a")])
    assert verdict.status == "warn" and verdict.exit_code == 0 and verdict.exit_code_for(True) == 1
    assert verdict.coverage.startswith("1 of 4 checks judged: headroom")
    assert ("coverage", verdict.coverage) in verdict.warnings()
    judged = RunVerdict("r", [_check("leak", "pass"), _check("headroom", "pass")])
    assert judged.status == "pass" and judged.coverage == "2 of 2 checks judged: leak, headroom"
    data = verdict.to_dict()
    assert data["status"] == "warn" and data["exit_code"] == 0 and data["exit_code_strict"] == 1


def test_a_failing_gate_fails_a_run_whose_checks_pass():
    gate = compare_runs(*_measures(10 * GiB, 11 * GiB), current_name="new", baseline_name="old")
    verdict = RunVerdict("r", [_check("offload_drop", "pass")], [gate])
    assert gate.status == "fail" and verdict.status == "fail" and verdict.exit_code == 1
    assert verdict.failures() == [("baseline", gate.summary)]
    passing = RunVerdict("r2", [_check("leak", "pass")])
    assert overall_of([passing, verdict]) == "fail" and exit_code_of([passing, verdict]) == 1
    assert exit_code_of([passing]) == 0


def test_to_dict_is_json_with_status_exit_code_checks_and_gates():
    gate = compare_runs(*_measures(10 * GiB, 10 * GiB), current_name="new", baseline_name="old")
    verdict = RunVerdict("r", [_check("headroom", TOO_SMALL)], [gate], run_path="/x")
    data = json.loads(json.dumps(verdict.to_dict()))
    assert data["status"] == "pass" and data["exit_code"] == 0
    assert [(c["name"], c["status"]) for c in data["checks"]] == [("headroom", TOO_SMALL)]
    assert data["gates"][0]["status"] == "pass" and data["gates"][0]["compared"][0]["growth"] == 0


# -- on committed logs ----------------------------------------------------------------------------
def test_one_process_log_is_judged_by_the_checks_and_the_dashboard_renders_it():
    run = load_run(CPU)
    verdict = judge(run)
    run_level = [check_oom(run)]  # the engine judges a death once per run, after the per-process checks
    assert [(c.name, c.status) for c in verdict.checks] == [(c.name, c.status) for c in run_checks(run) + run_level]
    assert verdict.exit_code == (1 if any(c.status == "fail" for c in verdict.checks) else 0)
    shown, _ = dashboard_checks(run)
    assert sorted((c.name, c.status) for c in shown) == sorted((c.name, c.status) for c in verdict.checks)


def test_many_processes_are_judged_per_process_and_across_the_fleet():
    run = load_run(ENGINE_SERVER)
    verdict = judge(run)
    names = [c.name for c in verdict.checks]
    assert FLEET_CHECKS <= set(names) and "offload_drop" in names
    offload = next(c for c in verdict.checks if c.name == "offload_drop")
    assert "processes" in offload.summary  # aggregated over the processes, naming the worst
    shown, _ = dashboard_checks(run)  # the dashboard shows the same, fleet checks included
    assert sorted((c.name, c.status) for c in shown) == sorted((c.name, c.status) for c in verdict.checks)
    ranks = [STATUS_ORDER[c.status] for c in shown]
    assert ranks == sorted(ranks)  # failures first


def test_a_phase_selection_filters_findings_and_one_matching_nothing_is_an_error():
    run = load_run(CPU)
    offloads = judge(run, selection="offload")
    drop = next(c for c in offloads.checks if c.name == "offload_drop")
    assert all(f.phase is None or f.phase.startswith("offload_") for f in drop.findings)
    assert any("not selected" in note for note in offloads.notes)
    with pytest.raises(MilesProfileError, match=r"--phase trian\* matches none of the phases this run recorded \("):
        judge(run, selection="trian*")
    with pytest.raises(MilesProfileError, match="unknown phase"):
        judge(run, selection="trian")


def test_a_recorded_default_selection_is_not_held_to_match():
    """`record --phase eval` on a run that has not opened `eval` yet: the dashboard shows its checks."""
    from dataclasses import replace

    from miles_profile.logdir.layout import PHASE_SELECTION_KEY
    run = load_run(CPU)
    waiting = replace(run, meta={**run.meta, PHASE_SELECTION_KEY: "eval"})
    assert judge(waiting).checks  # no error: judged, with every phased finding left out
    with pytest.raises(MilesProfileError, match="matches none"):
        judge(waiting, selection="eval")


def test_a_baseline_sharing_nothing_is_an_error_not_a_pass():
    current, baseline = _measures(10 * GiB, 10 * GiB, key="gpu|a|GPU-1", base_key="gpu|b|GPU-2")
    baseline["rank_key"] = "gpu|ranks 7"
    with pytest.raises(MilesProfileError, match="nothing to compare"):
        compare_runs(current, baseline, current_name="new", baseline_name="old")
    empty = pd.DataFrame(columns=MEASURE_COLUMNS)
    with pytest.raises(MilesProfileError, match="no phases in either run"):
        compare_runs(empty, empty)


def test_the_engine_gates_a_run_against_a_baseline():
    run = load_run(CPU)
    verdict = judge(run, baseline=run, baseline_thresholds=RegressionThresholds.parse("5%,0"))
    (gate,) = verdict.gates
    assert gate.status == "pass" and len(gate.compared) >= 20
    assert verdict.to_dict()["gates"][0]["thresholds"] == "5% and 0.0 MiB"


# -- threshold strings ----------------------------------------------------------------------------
@pytest.mark.parametrize("text, share, abs_bytes", [
    ("5%,0", 0.05, 0), ("0,5%", 0.05, 0), ("5%,256MiB", 0.05, 256 * MiB), ("10%", 0.10, 256 * MiB),
    ("1 GiB", 0.05, GiB), (" 2.5% , 1048576 ", 0.025, MiB),
])
def test_threshold_strings_are_read_as_written(text, share, abs_bytes):
    assert RegressionThresholds.parse(text) == RegressionThresholds(share, abs_bytes)


@pytest.mark.parametrize("text", ["", ",", "5%,", "5%,5%", "1GiB,2GiB", "0.05", "5%,lots", "abc", "5%,1GiB,3",
                                  "-5%", "5%,-1"])
def test_malformed_threshold_strings_are_refused(text):
    with pytest.raises(MilesProfileError, match="--baseline-threshold"):
        RegressionThresholds.parse(text)


def test_five_percent_and_zero_bytes_fails_a_ten_percent_growth():
    """The old parser read "5%,0" as 0% and 256 MiB and let +10% of 1 GiB (102 MiB) through."""
    result = compare_runs(*_measures(GiB, 1.1 * GiB), RegressionThresholds.parse("5%,0"))
    assert result.status == "fail"


# -- per-process aggregation ----------------------------------------------------------------------
def test_aggregation_keeps_too_small_and_each_findings_cause_series_and_resolution():
    small = CheckResult("offload_drop", "Offload", TOO_SMALL, "small", "why",
                        findings=[Finding(TOO_SMALL, "tiny", cause=None, series="host RSS", resolution=8 * MiB)],
                        resolution=8 * MiB)
    failed = CheckResult("offload_drop", "Offload", "fail", "bad", "why",
                         findings=[Finding("fail", "kept", cause="still_referenced", series="host RSS",
                                           resolution=8 * MiB, numbers={"needed": 1.0, "dropped_inside": 0.0})])
    meta = [{"pid": 1, "role": "actor", "rank": 0, "host": "h"}, {"pid": 2, "role": "actor", "rank": 1, "host": "h"}]
    assert _aggregate([(meta[0], small), (meta[1], small)], 2, 2).status == TOO_SMALL
    result = _aggregate([(meta[0], small), (meta[1], failed)], 2, 2)
    assert result.status == "fail" and result.resolution == 8 * MiB
    kept = next(f for f in result.findings if f.status == "fail")
    assert kept.cause == "still_referenced" and kept.series == "host RSS" and kept.numbers["pid"] == 2
    assert result.worst["pid"] == 2


# -- the pytest marker's limits -------------------------------------------------------------------
def test_memory_limits_are_verdicts_and_a_limit_checking_nothing_is_an_error():
    run = load_run(CPU)
    assert judge_test_limits(run, host="100 GiB").exit_code == 0
    over = judge_test_limits(run, host="1 MiB")
    assert over.status == "fail" and over.exit_code == 1
    assert over.checks[0].name == "memory_limit_host" and "> limit 1.0 MiB" in over.checks[0].summary
    # a CPU run: not checkable, never a pass; a limit that judged nothing warns (exit 0, 1 under --strict)
    assert judge_test_limits(run, gpu="1 GiB").checks[0].status == "n/a"
    assert judge_test_limits(run, gpu="1 GiB").status == "warn"
    with pytest.raises(MilesProfileError, match="both are None"):
        judge_limits(run, gpu=None, host=None)
    with pytest.raises(MilesProfileError, match="phase= takes"):
        judge_limits(run, host="1 GiB", phase=5)


# -- a real two-rank CPU recording ----------------------------------------------------------------
@pytest.mark.slow
def test_a_two_rank_recording_is_one_verdict_in_every_view(recorded_two_rank_run):
    (run_dir,) = recorded_two_rank_run.glob("run-*")
    run = load_run(run_dir)
    verdict = judge(run)
    assert FLEET_CHECKS <= {c.name for c in verdict.checks}
    shown, _ = dashboard_checks(run)
    assert sorted((c.name, c.status) for c in shown) == sorted((c.name, c.status) for c in verdict.checks)
    # against the one-process CPU log nothing matches (other roles, other phases): exit 2, not a pass
    with pytest.raises(MilesProfileError, match="nothing to compare"):
        judge(run, baseline=load_run(CPU))


# -- "too small to judge" in every emitter ---------------------------------------------------------
def test_too_small_to_judge_renders_in_the_cli_html_and_json():
    from types import SimpleNamespace

    from miles_profile.report.build import _verdict_lines
    from miles_profile.report.html import _checks_html
    verdict = RunVerdict("r", [_check("offload_drop", TOO_SMALL), _check("leak", "n/a")])
    no_summary = SimpleNamespace(lines=lambda failing=False: [])  # report/summary.py's block: not this test's
    lines = _verdict_lines([SimpleNamespace(verdict=verdict, summary=no_summary)])
    assert lines[0] == "r:" and any(line.startswith("  SMALL offload_drop") for line in lines)
    assert any(line.startswith("  N/A   leak") for line in lines)
    table = _checks_html(verdict.checks, 0.0, "checks")
    assert '<span class="badge small">TOO SMALL</span>' in table and 'data-status="too small to judge"' in table
    assert verdict.to_dict()["checks"][0]["status"] == TOO_SMALL
    assert verdict.to_dict()["status"] == "warn"  # nothing judged: the run warns, never a bare small or pass


def test_checks_that_cannot_apply_fold_into_one_row_of_the_html_table():
    """As in the CLI: several n/a checks are one row naming them, each one's reason folded under it."""
    from miles_profile.report.html import _checks_html
    checks = [_check("leak", "pass"), _check("offload_drop", "n/a"), _check("oom", "n/a"), _check("headroom", "fail")]
    table = _checks_html(checks, 0.0, "checks")
    assert table.count('data-status="n/a"') == 1 and table.count("<tr") == 4  # head, leak, headroom, the fold
    assert 'data-checks="offload_drop, oom"' in table and "offload_drop is n/a" in table and "oom is n/a" in table
    assert 'data-check="leak"' in table and 'data-check="headroom"' in table
    alone = _checks_html([_check("leak", "pass"), _check("oom", "n/a")], 0.0, "checks")
    assert 'data-check="oom" data-status="n/a"' in alone  # one n/a check keeps its own row, as in the CLI
