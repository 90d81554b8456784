"""The exposition's reading of a run (miles_profile/metrics/host_state.py, process_state.py): true peaks
since the previous scrape and the live offload verdict, on files written with the recorder's own writers."""
from __future__ import annotations


import pytest

from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta
from miles_profile.metrics import process_state
from miles_profile.metrics.host_state import HostState

MiB = 1024**2
HOST = "metricshost"
COLUMNS = ["rss", "rss_peak", "gpu0_alloc", "gpu0_alloc_peak", "gpu0_reserved"]


def test_the_live_rule_is_the_reports():
    from miles_profile.verdicts.resolution import RESOLUTION_BYTES
    from miles_profile.verdicts.types import Thresholds
    assert process_state.DROP_SHARE == Thresholds().offload_min_drop_share
    assert process_state.RESOLUTION_BYTES == {"allocated": RESOLUTION_BYTES["alloc"], "resident": RESOLUTION_BYTES["rss"]}


@pytest.fixture
def run(tmp_path):
    write_run_meta(tmp_path, {"run_id": "m", "command": [], "host": HOST, "pid": 1, "start_time": 0, "interval_ms": 100})
    write_process_meta(tmp_path, f"{HOST}-77", {"host": HOST, "pid": 77, "rank": 3, "role": "actor"})
    samples = SampleWriter(tmp_path, f"{HOST}-77", COLUMNS, flush_interval_s=1e9)
    events = EventWriter(tmp_path, f"{HOST}-77")
    yield tmp_path, samples, events
    samples.close()
    events.close()


def _row(samples, t, phase, rss, rss_peak=None, alloc=None):
    samples.append(t, phase, [rss, rss_peak or rss, alloc, alloc, alloc])


def test_the_peak_is_the_true_peak_since_the_previous_scrape(run):
    run_dir, samples, _ = run
    state = HostState(run_dir, HOST)
    for k in range(10):  # a 500 MiB spike between two rows shows only in rss_peak
        _row(samples, 100 + k * 0.1, "train", 100 * MiB, rss_peak=500 * MiB if k == 4 else None)
    _row(samples, 101.0, "generate", 120 * MiB)
    samples.flush()
    first = state.read().processes[0]
    assert first.peaks == {"train": (None, 500 * MiB), "generate": (None, 120 * MiB)}
    assert first.resident == 120 * MiB and (first.rank, first.role) == ("3", "actor")
    _row(samples, 101.1, "generate", 110 * MiB)
    samples.flush()
    assert state.read().processes[0].peaks == {"generate": (None, 110 * MiB)}  # the spike was reported once
    assert state.read().processes[0].peaks == {"generate": (None, 110 * MiB)}  # no new row: the last level


@pytest.mark.parametrize("freed, verdict", [(120 * MiB, "pass"), (60 * MiB, "fail")])
def test_an_offload_is_judged_on_what_it_freed_inside_the_phase(run, freed, verdict):
    run_dir, samples, events = run
    _row(samples, 10.0, "", 50 * MiB, alloc=400 * MiB)  # the row right before the phase
    events.write("begin", "offload_train", {"expected_bytes": 120 * MiB, "rollout_id": 0}, t=10.01, id=1)
    _row(samples, 10.2, "offload_train", 50 * MiB, alloc=400 * MiB - freed)
    summary = {"rows": 1, "t_first": 10.2, "t_last": 10.2, "series": {
        "gpu0_alloc": {"peak": 400 * MiB, "floor": 400 * MiB - freed, "first": 400 * MiB - freed, "last": 400 * MiB - freed},
        "rss": {"peak": 50 * MiB, "floor": 50 * MiB, "first": 50 * MiB, "last": 50 * MiB}}}
    events.write("end", "offload_train", {"status": "ok", "summary": summary}, t=10.21, id=1)
    samples.flush()
    offload = HostState(run_dir, HOST).read().processes[0].offloads[("offload_train", "train_state")]
    assert (offload.declared, offload.freed, offload.series, offload.verdict) == (120 * MiB, freed, "allocated", verdict)


def test_a_small_offload_is_too_small_and_a_pause_is_not_judged():
    assert process_state.judge(1 * MiB, 1 * MiB, "allocated") == "too_small"
    assert process_state.judge(4 * MiB, 4 * MiB, "resident") == "too_small"
    assert process_state.judge(0, 0, "resident") == "n/a"


def test_a_recorded_death_is_counted_and_its_process_leaves(run):
    run_dir, samples, _ = run
    _row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    write_process_meta(run_dir, f"{HOST}-5", {"host": HOST, "pid": 5, "rank": 0, "role": "exec_parent"})
    witness = EventWriter(run_dir, f"{HOST}-5")
    witness.write("oom", "oom", {"cause": "oom_kill", "process_pid": 77, "detected_by": "host_sampler"})
    witness.write("oom", "oom", {"type": "OutOfMemoryError", "phase": "train"})  # an OOM error, no death
    witness.close()
    reading = HostState(run_dir, HOST).read()
    assert reading.kills == {"oom_kill": 1}
    assert [(p.rank, p.role) for p in reading.processes] == [("0", "exec_parent")]
