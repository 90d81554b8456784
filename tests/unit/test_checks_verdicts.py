"""Each check on fake runs built to pass and to fail, CPU-only and with GPU columns."""
from __future__ import annotations

import numpy as np
import pytest

from miles_profile.verdicts.checks import (
    Thresholds, check_disk_offload_host_flat, check_headroom, check_host_weight_copies, check_leak,
    check_offload_drop, check_serialized_peaks, check_transition_spikes, overall_status, run_checks,
)
from test_report_fakes import GiB, MiB, make_run, steps

TH = Thresholds()
T = np.round(np.arange(0.0, 20.0, 0.1), 6)


def _offload_run(free_at: float, *, target="disk", expected=4 * GiB, gpu=False, heap=False):
    """`heap`: recorded with record --heap (glibc's heap beside RSS, which alone can't tell a kept
    reference from glibc's retention)."""
    level = steps(T, [(0, 1 * GiB), (1.0, 5 * GiB), (free_at, 1 * GiB)])
    phases = [dict(name="generate", start=1.0, end=3.0, rollout_id=0),
              dict(name="offload_rollout", start=3.0, end=4.0, rollout_id=0, tags=["kv_cache"],
                   expected_bytes=expected, target=target),
              dict(name="train", start=6.5, end=8.0, rollout_id=0)]
    if gpu:
        samples = {"t": T, "rss": np.full(len(T), 2 * GiB), "rss_peak": np.full(len(T), 2 * GiB),
                   "gpu0_alloc": level, "gpu0_alloc_peak": level, "gpu0_reserved": level}
        return make_run(samples, phases, devices=[{"index": 0, "name": "H200", "total": 140 * GiB}])
    return make_run({"t": T, "rss": level, "rss_peak": level, **({"heap_used": level} if heap else {})}, phases)


def test_offload_that_drops_inside_the_phase_passes():
    result = check_offload_drop(_offload_run(free_at=3.5), TH)
    assert result.status == "pass", result.summary
    assert result.series.startswith("host RSS")  # CPU-only: host series, and it says so
    assert result.span == (3.0, 4.0)


def test_offload_that_frees_after_returning_is_flagged():
    result = check_offload_drop(_offload_run(free_at=5.0, heap=True), TH)
    assert result.status == "fail"
    assert "only after the phase ended" in result.summary


def test_offload_that_never_frees_fails():
    result = check_offload_drop(_offload_run(free_at=99.0, heap=True), TH)
    assert result.status == "fail" and "expected more than" in result.summary
    # on RSS alone it is not judged: glibc may keep freed pages resident
    alone = check_offload_drop(_offload_run(free_at=99.0), TH)
    assert alone.status == "n/a" and "--heap" in alone.summary


def test_offload_on_gpu_columns_uses_device_memory():
    good = check_offload_drop(_offload_run(free_at=3.5, gpu=True), TH)
    assert good.status == "pass" and good.series.startswith("allocator allocated and the driver's series")
    bad = check_offload_drop(_offload_run(free_at=99.0, gpu=True), TH)
    assert bad.status == "fail"
    # allocated never fell: the declared tensors are still referenced, named on the allocator's series
    (finding,) = bad.findings
    assert finding.cause == "still_referenced" and "gpu0_alloc" in finding.series


def test_offload_threshold_is_overridable():
    run = _offload_run(free_at=3.5, expected=10 * GiB, heap=True)  # dropped 4 of 10 GiB
    assert check_offload_drop(run, TH).status == "fail"
    assert check_offload_drop(run, Thresholds(offload_min_drop_share=0.3)).status == "pass"


def test_offload_to_cpu_on_a_cpu_only_run_is_not_applicable():
    result = check_offload_drop(_offload_run(free_at=99.0, target="cpu"), TH)
    assert result.status == "n/a" and "CPU-only" in result.summary


def test_no_offload_phase_is_not_applicable():
    run = make_run({"t": T, "rss": np.ones(len(T))}, [dict(name="train", start=1, end=2)])
    assert check_offload_drop(run, TH).status == "n/a"


def _colocated(overlap: bool):
    # floor 10 GiB; training holds 20 GiB, rollout 30 GiB; overlapping means both at once.
    levels = [(0, 10 * GiB), (1, 40 * GiB), (3, 10 * GiB), (4, 30 * GiB), (6, 10 * GiB)]
    if overlap:
        levels = [(0, 10 * GiB), (1, 40 * GiB), (4, 60 * GiB), (6, 10 * GiB)]
    level = steps(T, levels)
    phases = [dict(name="generate", start=1, end=2.9, rollout_id=0),
              dict(name="offload_rollout", start=2.9, end=3.1, rollout_id=0, expected_bytes=30 * GiB),
              dict(name="train", start=4, end=5.9, rollout_id=0),
              dict(name="offload_train", start=5.9, end=6.1, rollout_id=0, expected_bytes=20 * GiB, target="cpu")]
    return make_run({"t": T, "gpu0_alloc": level, "gpu0_alloc_peak": level, "rss": np.full(len(T), GiB)}, phases,
                    devices=[{"index": 0, "name": "H200", "total": 140 * GiB}])


def test_serialized_peaks_pass_and_fail():
    assert check_serialized_peaks(_colocated(overlap=False), TH).status == "pass"
    result = check_serialized_peaks(_colocated(overlap=True), TH)
    assert result.status == "fail" and "both footprints" in result.summary


def test_serialized_peaks_ignore_a_train_phases_transient_activations():
    run = _colocated(overlap=False)
    peak = run.samples["gpu0_alloc_peak"].to_numpy().copy()
    peak[(run.samples["t"] > 4.5) & (run.samples["t"] < 5)] = 58 * GiB  # activations on top of the state
    run.samples["gpu0_alloc_peak"] = peak
    assert check_serialized_peaks(run, TH).status == "pass"


def test_serialized_peaks_needs_both_footprints():
    assert check_serialized_peaks(_offload_run(3.5), TH).status == "n/a"


def test_transition_spike_between_phases_fails():
    level = steps(T, [(0, GiB), (1, 2 * GiB)])
    peak = level.copy()
    peak[np.isclose(T, 3.5)] = 6 * GiB  # a spike in the gap between two phases
    phases = [dict(name="generate", start=1, end=3.0), dict(name="train", start=4.0, end=6.0)]
    run = make_run({"t": T, "rss": level, "rss_peak": peak}, phases)
    result = check_transition_spikes(run, TH)
    assert result.status == "fail" and "generate → train" in result.summary
    calm = make_run({"t": T, "rss": level, "rss_peak": level}, phases)
    assert check_transition_spikes(calm, TH).status == "pass"


def test_disk_offload_that_stages_in_host_memory_fails():
    level = steps(T, [(0, 2 * GiB), (3.2, 6 * GiB), (3.8, 2 * GiB)])  # a host copy during the offload
    phases = [dict(name="offload_train", start=3.0, end=4.0, target="disk", expected_bytes=4 * GiB)]
    run = make_run({"t": T, "rss": level, "rss_peak": level}, phases)
    assert check_disk_offload_host_flat(run, TH).status == "fail"
    flat = make_run({"t": T, "rss": np.full(len(T), 2 * GiB)}, phases)
    assert check_disk_offload_host_flat(flat, TH).status == "pass"


def test_second_host_copy_of_weights():
    rss = steps(T, [(0, 10 * GiB), (3.2, 18 * GiB), (3.8, 10 * GiB)])  # a whole 8 GiB copy appears
    samples = {"t": T, "rss": rss, "rss_peak": rss, "gpu0_alloc": np.full(len(T), GiB)}
    phases = [dict(name="offload_weights", start=1, end=2, tags=["weights"], expected_bytes=8 * GiB, target="cpu"),
              dict(name="update_weights", start=3, end=4)]
    run = make_run(samples, phases, devices=[{"index": 0, "total": 80 * GiB}])
    assert check_host_weight_copies(run, TH).status == "fail"
    cpu_only = make_run({"t": T, "rss": rss}, phases)
    result = check_host_weight_copies(cpu_only, TH)
    assert result.status == "n/a" and "CPU-only" in result.summary


def _iterations(floors):
    levels, phases = [], []
    for k, floor in enumerate(floors):
        start = 1 + 4 * k
        levels += [(start, floor), (start + 1, floor + 3 * GiB), (start + 2, floor)]
        phases += [dict(name="generate", start=start, end=start + 1.5, rollout_id=k),
                   dict(name="train", start=start + 1.5, end=start + 3.5, rollout_id=k)]
    level = steps(T, levels)
    return make_run({"t": T, "rss": level, "rss_peak": level}, phases)


def test_leak_of_the_iteration_floor():
    # 4 s iterations in 20 s: warm-up + 3 is below the 5 a trend needs, but a floor rising 1 GiB in every
    # one of them is a leak in a short run (issue 30); a flat one is not judged
    result = check_leak(_iterations([GiB, 2 * GiB, 3 * GiB, 4 * GiB]), TH)
    assert result.status == "fail" and "every iteration of a short run" in result.summary
    assert check_leak(_iterations([GiB, GiB, GiB, GiB]), TH).status == "n/a"
    assert check_leak(_iterations([GiB, GiB]), TH).status == "n/a"  # warm-up + one is not enough


# -- a run still being written: open phases and the unfinished last iteration are not judged -------
def _recorder(ended: bool) -> list[dict]:
    """The process meta of a recorder: `end_time` is written only by a clean stop."""
    meta = {"pid": 100, "role": "in_process", "rank": 0, "devices": [], "start_time": 0.0,
            "probes": [{"name": "host", "active": True, "total": 64 * GiB}]}
    return [{**meta, "end_time": 20.0}] if ended else [meta]


def test_an_offload_still_running_is_not_applicable_not_failed():
    t = T[T <= 3.45]  # recording reached 3.45 s; the offload began at 3.0 and frees at 3.5
    level = steps(t, [(0, GiB), (1.0, 5 * GiB), (3.5, GiB)])
    phases = [dict(name="generate", start=1.0, end=3.0, rollout_id=0),
              dict(name="offload_rollout", start=3.0, end=None, rollout_id=0, expected_bytes=4 * GiB, target="disk")]
    run = make_run({"t": t, "rss": level, "rss_peak": level}, phases, processes=_recorder(ended=False))
    assert run.phases["status"].tolist() == ["ok", "open"]
    result = check_offload_drop(run, TH)
    assert result.status == "n/a" and "still open" in result.summary
    assert check_disk_offload_host_flat(run, TH).status == "n/a"
    assert overall_status(run_checks(run)) != "fail"


def _iterations_high_first(floors, stop: float, open_last: bool, ended: bool):
    """4 s iterations: memory high (floor + 3 GiB) in generate, down to the floor in train; the
    recording stops at `stop`, inside the last iteration's generate."""
    levels, phases = [], []
    for k, floor in enumerate(floors):
        start = 4.0 * k
        levels += [(start, floor + 3 * GiB), (start + 2, floor)]
        phases += [dict(name="generate", start=start, end=start + 2, rollout_id=k),
                   dict(name="train", start=start + 2, end=start + 4, rollout_id=k)]
    if open_last:
        phases[-2]["end"] = None
    else:
        phases[-2]["end"] = stop - 0.05
    phases.pop()  # the last train has not begun
    t = np.round(np.arange(0.0, stop + 0.01, 0.1), 6)  # 8 iterations and more: the leak trend needs 5 after warm-up
    level = steps(t, levels)
    return make_run({"t": t, "rss": level, "rss_peak": level}, phases, processes=_recorder(ended))


def test_leak_ignores_an_iteration_with_an_open_phase():
    run = _iterations_high_first([GiB] * 8, stop=29.5, open_last=True, ended=False)
    result = check_leak(run, TH)
    assert result.status == "pass", result.summary  # judged on iterations 1 to 6
    assert result.findings[0].numbers["floors"] == [GiB] * 6


def test_leak_ignores_the_last_iteration_while_recording_but_judges_it_once_ended():
    live = _iterations_high_first([GiB] * 8, stop=29.5, open_last=False, ended=False)
    assert (live.phases["status"] == "ok").all()  # between phases: nothing open, yet unfinished
    result = check_leak(live, TH)
    assert result.status == "pass" and result.findings[0].numbers["floors"] == [GiB] * 6
    # The same samples from a recorder that stopped cleanly: its last iteration is what it is (its floor
    # is generate's 4 GiB). One high last floor is judged, yet is no sustained growth for a robust trend.
    ended = check_leak(_iterations_high_first([GiB] * 8, stop=29.5, open_last=False, ended=True), TH)
    assert ended.findings[0].numbers["floors"] == [GiB] * 6 + [4 * GiB]
    assert ended.status == "pass"


def test_a_real_leak_still_fails_mid_run():
    floors = [GiB, GiB, 2 * GiB, 3 * GiB, 4 * GiB, 5 * GiB, 6 * GiB, 6 * GiB]
    run = _iterations_high_first(floors, stop=29.5, open_last=True, ended=False)
    assert check_leak(run, TH).status == "fail"


def test_headroom_on_gpu_and_on_host():
    level = np.full(len(T), 139 * GiB)
    gpu = make_run({"t": T, "gpu0_used": level, "rss": np.full(len(T), GiB)},
                   devices=[{"index": 0, "name": "H200", "total": 140 * GiB}])
    assert check_headroom(gpu, TH).status == "fail"
    host = make_run({"t": T, "rss": np.full(len(T), GiB), "rss_peak": np.full(len(T), GiB)}, host_total=64 * GiB)
    result = check_headroom(host, TH)
    assert result.status == "pass" and "host" in result.summary


def test_run_checks_on_a_bare_cpu_run_never_raises_and_is_not_failing():
    run = make_run({"t": T, "rss": np.full(len(T), GiB)})
    results = run_checks(run)
    assert {r.name for r in results} == {"offload_drop", "serialized_peaks", "transition_spikes",
                                         "disk_offload_host_flat", "host_weight_copies", "leak", "headroom"}
    assert overall_status(results) in ("pass", "n/a")
    assert all(r.explanation for r in results)
