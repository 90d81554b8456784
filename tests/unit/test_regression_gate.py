"""The regression gate (report/regression.py) on the real logs in sample_logs/, with a synthetic
regression made by raising one phase's recorded memory 10% in a copy (tests/synthetic_regression.py)."""
from __future__ import annotations

import shutil

import pandas as pd
import pytest

from miles_profile.errors import MilesProfileError
from miles_profile.logdir.reader import load_run
from miles_profile.phase_select import parse_phases
from miles_profile.verdicts.gate import (
    MEASURE_COLUMNS, RegressionThresholds, compare_runs, phase_measures,
)
from tests.conftest import REPO
from tests.synthetic_regression import raise_phase

GiB, MiB = 1024 ** 3, 1024 ** 2
GPU_RUNS = ["h200/4-both", "h200-tms/4-both", "h200/9-dist-engine-server"]


@pytest.mark.parametrize("name", GPU_RUNS)
def test_a_phase_ten_percent_higher_fails_naming_the_phase_and_the_gpu(tmp_path, name):
    source = REPO / "sample_logs" / name
    result = compare_runs(load_run(raise_phase(source, tmp_path / "raised", "train")), load_run(source))
    assert result.status == "fail"
    assert {c.phase for c in result.regressions} == {"train"}
    assert {c.gpu for c in result.regressions} == {"vm:gpu0"}
    for c in result.regressions:  # every regressed value is the 10% the copy added
        assert c.share == pytest.approx(0.10, abs=0.002)
    assert "phases train; GPUs vm:gpu0" in result.summary
    # the device's own total is judged where the log has it (the host sampler's or the process's NVML)
    memories = {c.memory for c in result.regressions}
    assert "host RSS" in memories and any(m.startswith("GPU") for m in memories)


@pytest.mark.parametrize("name", [*GPU_RUNS, "cpu"])
def test_an_unchanged_run_passes(tmp_path, name):
    source = REPO / "sample_logs" / name
    copy = shutil.copytree(source, tmp_path / "copy")
    result = compare_runs(load_run(copy), load_run(source))
    assert result.status == "pass" and len(result.compared) >= 20
    assert all(c.growth == 0 for c in result.compared)
    assert result.not_compared == () and result.matched_by == "identity"


def test_both_thresholds_must_be_exceeded_on_the_cpu_log(tmp_path):
    """The CPU run's train peak is 727 MiB: 10% more is 73 MiB, under the default 256 MiB."""
    source = REPO / "sample_logs" / "cpu"
    raised, base = load_run(raise_phase(source, tmp_path / "raised", "train")), load_run(source)
    assert compare_runs(raised, base).status == "pass"
    tight = compare_runs(raised, base, RegressionThresholds.parse("5%,32MiB"))
    assert tight.status == "fail" and {c.phase for c in tight.regressions} == {"train"}
    assert {c.gpu for c in tight.regressions} == {""} and "host memory only" in tight.summary
    assert compare_runs(raised, base, RegressionThresholds.parse("11%,32MiB")).status == "pass"


def _measures(peak_before: float, peak_now: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    row = dict(phase="train", iteration=-2, exact_key="gpu|h|GPU-1", rank_key="gpu|ranks 0", subject="h:gpu0",
               gpu="h:gpu0", memory="GPU used (NVML, device)", floor=float("nan"))
    return (pd.DataFrame([{**row, "peak": peak_now}], columns=MEASURE_COLUMNS),
            pd.DataFrame([{**row, "peak": peak_before}], columns=MEASURE_COLUMNS))


@pytest.mark.parametrize("before, now, status", [
    (10 * GiB, 10 * GiB * 1.04, "pass"),   # +410 MiB but 4%: under the share
    (1 * GiB, 1 * GiB * 1.10, "pass"),     # +10% but 102 MiB: under the bytes
    (10 * GiB, 10 * GiB * 1.10, "fail"),   # both
    (10 * GiB, 9 * GiB, "pass"),           # a drop is never a regression
])
def test_a_value_regresses_only_above_both_thresholds(before, now, status):
    current, baseline = _measures(before, now)
    result = compare_runs(current, baseline, current_name="new", baseline_name="old")
    assert result.status == status and len(result.compared) == 1


def test_thresholds_parse_and_refuse_nonsense():
    assert RegressionThresholds.parse("5%,256MiB") == RegressionThresholds(0.05, 256 * MiB)
    assert RegressionThresholds.parse("10%") == RegressionThresholds(0.10, 256 * MiB)
    assert RegressionThresholds.parse("1 GiB") == RegressionThresholds(0.05, GiB)
    with pytest.raises(MilesProfileError, match="not a size"):
        RegressionThresholds.parse("5%,lots")


def test_a_baseline_of_another_shape_says_what_it_could_not_compare():
    current, baseline = load_run(REPO / "sample_logs/h200/4-both"), load_run(REPO / "sample_logs/h200/1-no-offload")
    result = compare_runs(current, baseline, selection=parse_phases("offload,train,rollout"))
    only_here = {line for line in result.not_compared if line.startswith("phase ")}
    assert {"phase offload_rollout: only in 4-both", "phase offload_train: only in 4-both",
            "phase onload_weights: only in 4-both", "phase onload_kv: only in 4-both"} <= only_here
    assert set(result.not_selected) == {"onload_train", "clear_memory"}
    assert all(c.phase not in ("onload_train", "clear_memory") for c in result.compared)


def test_gpus_are_matched_by_rank_when_their_uuids_differ():
    """The same configuration recorded on two different H200s (another GPU UUID)."""
    result = compare_runs(load_run(REPO / "sample_logs/h200-tms/4-both"), load_run(REPO / "sample_logs/h200/4-both"))
    assert result.matched_by == "rank"
    assert len(result.compared) >= 20
    # NVML device used exists only in the newer log: said, not dropped silently
    assert any(line.startswith("GPU used (NVML, device) of vm:gpu0: only in") for line in result.not_compared)


def test_per_iteration_comparison_names_each_iteration(tmp_path):
    source = REPO / "sample_logs/h200/4-both"
    result = compare_runs(load_run(raise_phase(source, tmp_path / "raised", "train")), load_run(source),
                          by_iteration=True)
    assert {c.where for c in result.regressions} == {"train #0", "train #1", "train #2"}


def test_measures_come_from_the_phase_table_one_row_per_subject_and_phase():
    measures = phase_measures(load_run(REPO / "sample_logs/h200/9-dist-engine-server"))
    assert not measures.duplicated(["phase", "iteration", "exact_key", "memory"]).any()
    train = measures[measures["phase"] == "train"]
    assert set(train["memory"]) == {"GPU used (NVML, device)", "GPU own (proc)", "host RSS"}
