"""offload_drop under torch_memory_saver: a pause leaves the allocator's counters where they were, so
the check must judge the driver's series (NVML per process, else NVML device used) and say so."""
from __future__ import annotations

import numpy as np

from miles_profile.verdicts.checks import Thresholds, check_offload_drop
from test_report_fakes import GiB, PID, make_run, steps

T = np.round(np.arange(0.0, 10.0, 0.1), 6)
H200 = [{"index": 0, "name": "H200", "total": 140 * GiB}]


def _paused_run(*, attr: str | None, annotated: bool = False, proc: bool = True):
    """The driver's level falls from 5 to 1 GiB inside the offload; the allocator stays at 5 GiB."""
    driver = steps(T, [(0, 1 * GiB), (1.0, 5 * GiB), (3.5, 1 * GiB)])
    allocator = steps(T, [(0, 1 * GiB), (1.0, 5 * GiB)])
    samples = {"t": T, "rss": np.full(len(T), 2 * GiB), "gpu0_used": driver + 3 * GiB,
               "gpu0_alloc": allocator, "gpu0_alloc_peak": allocator, "gpu0_reserved": allocator}
    if proc:
        samples["gpu0_proc"] = driver
    offload = dict(name="offload_rollout", start=3.0, end=4.0, rollout_id=0, tags=["kv_cache"],
                   expected_bytes=4 * GiB)
    if attr:
        offload["backend"] = attr
    process = {"pid": PID, "role": "in_process", "rank": 0, "devices": H200, "probes": []}
    if annotated:
        process["annotations"] = {"rollout_memory_backend": "torch_memory_saver"}
    return make_run(samples, [dict(name="generate", start=1.0, end=3.0, rollout_id=0), offload],
                    devices=H200, processes=[process])


def test_a_pause_is_judged_on_nvml_per_process():
    result = check_offload_drop(_paused_run(attr="torch_memory_saver"), Thresholds())
    assert result.status == "pass", result.summary
    numbers = result.findings[0].numbers
    assert "gpu0_proc" in numbers["series"] and numbers["backend"] == "torch_memory_saver"


def test_without_nvml_per_process_the_device_used_is_judged():
    result = check_offload_drop(_paused_run(attr="torch_memory_saver", proc=False), Thresholds())
    assert result.status == "pass", result.summary
    assert "gpu0_used" in result.findings[0].numbers["series"]


def test_the_process_annotation_says_the_backend_when_the_phase_does_not():
    result = check_offload_drop(_paused_run(attr=None, annotated=True, proc=False), Thresholds())
    assert result.status == "pass" and "gpu0_used" in result.findings[0].numbers["series"]


def test_builtin_phases_keep_the_allocator_fallback():
    # Without a torch_memory_saver attribute or annotation the allocator (flat here) is judged: a
    # builtin release that left allocated full did not free the tensors (still referenced).
    result = check_offload_drop(_paused_run(attr="builtin", proc=False), Thresholds())
    assert result.status == "fail"
    finding = result.findings[0]
    assert finding.cause == "still_referenced" and "gpu0_alloc" in finding.numbers["series"]
    assert finding.numbers["backend"] == "builtin"
