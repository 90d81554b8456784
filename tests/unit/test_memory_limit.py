"""The memory_limit verdict (report/memory_limit.py) on the real logs: the GPU path on the H200 runs
(this machine has no CUDA; the plugin's own CPU runs are in tests/integration/test_pytest_plugin.py)."""
from __future__ import annotations

import pytest

from miles_profile.errors import MilesProfileError
from miles_profile.logdir.reader import load_run
from miles_profile.verdicts.memory_limit import judge_limits
from tests.conftest import REPO

GiB = 1024 ** 3


@pytest.mark.parametrize("name", ["h200/4-both", "h200-tms/4-both"])
def test_the_gpu_limit_judges_the_allocator_true_peak_of_the_phase(name):
    run = load_run(REPO / "sample_logs" / name)
    rows = run.samples[run.samples["phase"] == "train"]
    true_peak = max(rows["gpu0_alloc"].max(), rows["gpu0_alloc_peak"].max())
    start = run.samples["gpu0_alloc"].iloc[0]
    expected = true_peak - (0 if start != start else start)  # the first row has no allocator value: from 0
    (verdict,) = judge_limits(run, gpu=int(expected) + 1, phase="train")
    assert verdict.status == "pass" and verdict.series == "GPU 0 allocator"
    assert verdict.measured == pytest.approx(expected, abs=1)
    (verdict,) = judge_limits(run, gpu=int(expected * 0.9), phase="train")
    assert verdict.status == "fail" and "(gpu, phase train)" in verdict.message


def test_offload_family_and_whole_test_and_host():
    run = load_run(REPO / "sample_logs/h200-tms/4-both")
    offloads = judge_limits(run, host="1 GiB", phase="offload")[0]
    assert offloads.where == "phase offload" and offloads.status == "fail"
    whole = judge_limits(run, host=f"{40 * GiB}")[0]
    assert whole.where == "the whole test" and whole.status == "pass"


def test_cpu_runs_cannot_check_a_gpu_limit_and_missing_phases_fail():
    run = load_run(REPO / "sample_logs/cpu")
    gpu, host = judge_limits(run, gpu="1 GiB", host="2 GiB", phase="train")
    assert gpu.status == "not checkable" and "no GPU memory was recorded" in gpu.message
    assert host.status == "pass" and host.series == "host RSS"
    (missing,) = judge_limits(run, host="2 GiB", phase="eval")
    assert missing.status == "fail" and "never opened it" in missing.message
    with pytest.raises(MilesProfileError, match="unknown phase"):
        judge_limits(run, host="2 GiB", phase="evaluate")
