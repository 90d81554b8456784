"""The exposition's reading of a run (miles_profile/metrics/host_state.py, process_state.py): true peaks
since the previous scrape and the live offload verdict, on files written with the recorder's own writers.
The reading alone: no follower (collect_interval_s=None), so no test leaves a thread behind
(tests/unit/test_metrics_follower_schedule.py holds the follower)."""
from __future__ import annotations

import pytest

from miles_profile.logdir.writer import EventWriter, write_process_meta
from miles_profile.metrics import process_state
from miles_profile.metrics.host_state import HostState
from tests.metrics_run import HOST, MiB, row, run  # noqa: F401 - run is a fixture


def test_the_live_rule_is_the_reports():
    from miles_profile.verdicts.resolution import RESOLUTION_BYTES
    from miles_profile.verdicts.types import Thresholds
    assert process_state.DROP_SHARE == Thresholds().offload_min_drop_share
    assert process_state.RESOLUTION_BYTES == {"allocated": RESOLUTION_BYTES["alloc"], "resident": RESOLUTION_BYTES["rss"]}


def test_the_peak_is_the_true_peak_since_the_previous_scrape(run):
    run_dir, samples, _ = run
    state = HostState(run_dir, HOST, collect_interval_s=None)
    for k in range(10):  # a 500 MiB spike between two rows shows only in rss_peak
        row(samples, 100 + k * 0.1, "train", 100 * MiB, rss_peak=500 * MiB if k == 4 else None)
    row(samples, 101.0, "generate", 120 * MiB)
    samples.flush()
    first = state.read().processes[0]
    assert first.peaks == {"train": (None, 500 * MiB), "generate": (None, 120 * MiB)}
    assert first.resident == 120 * MiB and (first.rank, first.role) == ("3", "actor")
    row(samples, 101.1, "generate", 110 * MiB)
    samples.flush()
    assert state.read().processes[0].peaks == {"generate": (None, 110 * MiB)}  # the spike was reported once
    assert state.read().processes[0].peaks == {"generate": (None, 110 * MiB)}  # no new row: the last level


@pytest.mark.parametrize("batch", [False, True], ids=["own-fold", "host-batch"])
@pytest.mark.parametrize("freed, verdict", [(120 * MiB, "pass"), (60 * MiB, "fail")])
def test_an_offload_is_judged_on_what_it_freed_inside_the_phase(run, freed, verdict, batch, monkeypatch):
    """The level before the phase is the row before its begin, found by the rows' times: those a process
    reads itself and those the host's batch (row_peaks.fold) gives back."""
    from miles_profile.metrics import host_state
    monkeypatch.setattr(host_state, "BATCH_ROWS", 1 if batch else 10**9)
    run_dir, samples, events = run
    row(samples, 10.0, "", 50 * MiB, alloc=400 * MiB)  # the row right before the phase
    events.write("begin", "offload_train", {"expected_bytes": 120 * MiB, "rollout_id": 0}, t=10.01, id=1)
    row(samples, 10.2, "offload_train", 50 * MiB, alloc=400 * MiB - freed)
    summary = {"rows": 1, "t_first": 10.2, "t_last": 10.2, "series": {
        "gpu0_alloc": {"peak": 400 * MiB, "floor": 400 * MiB - freed, "first": 400 * MiB - freed, "last": 400 * MiB - freed},
        "rss": {"peak": 50 * MiB, "floor": 50 * MiB, "first": 50 * MiB, "last": 50 * MiB}}}
    events.write("end", "offload_train", {"status": "ok", "summary": summary}, t=10.21, id=1)
    samples.flush()
    offload = HostState(run_dir, HOST, collect_interval_s=None).read().processes[0].offloads[("offload_train", "train_state")]
    assert (offload.declared, offload.freed, offload.series, offload.verdict) == (120 * MiB, freed, "allocated", verdict)


def test_a_small_offload_is_too_small_and_a_pause_is_not_judged():
    assert process_state.judge(1 * MiB, 1 * MiB, "allocated") == "too_small"
    assert process_state.judge(4 * MiB, 4 * MiB, "resident") == "too_small"
    assert process_state.judge(0, 0, "resident") == "n/a"


def test_a_recorded_death_is_counted_and_its_process_leaves(run):
    run_dir, samples, _ = run
    row(samples, 1.0, "train", 100 * MiB)
    samples.flush()
    write_process_meta(run_dir, f"{HOST}-5", {"host": HOST, "pid": 5, "rank": 0, "role": "exec_parent"})
    witness = EventWriter(run_dir, f"{HOST}-5")
    witness.write("oom", "oom", {"cause": "oom_kill", "process_pid": 77, "detected_by": "host_sampler"})
    witness.write("oom", "oom", {"type": "OutOfMemoryError", "phase": "train"})  # an OOM error, no death
    witness.close()
    reading = HostState(run_dir, HOST, collect_interval_s=None).read()
    assert reading.kills == {"oom_kill": 1}
    assert [(p.rank, p.role) for p in reading.processes] == [("0", "exec_parent")]


def test_rows_read_by_column_or_row_by_row_give_the_same_peaks(run):
    """A scrape folds its rows column by column when every needed cell is a number, row by row when one
    is empty: the same peaks either way, a phase's runs before and after another phase folded together."""
    run_dir, samples, _ = run
    layout = [("train", 300), ("generate", 900), ("train", 700), ("train", 200)]
    for gap in (False, True):
        for k, (phase, mib) in enumerate(layout):
            alloc = None if gap and k == 1 else 2 * mib * MiB  # an empty cell: row by row
            row(samples, 10 * gap + k * 0.1, phase, mib * MiB, alloc=alloc)
        samples.flush()
        if not gap:
            state = HostState(run_dir, HOST, collect_interval_s=None)
        peaks = state.read().processes[0].peaks
        assert peaks == {"train": (1400 * MiB, 700 * MiB), "generate": (None if gap else 1800 * MiB, 900 * MiB)}


@pytest.mark.parametrize("batch_bytes", [16 * MiB, 1], ids=["one-batch", "a-batch-a-process"])
def test_rows_of_all_processes_folded_at_once_stay_each_process_own(run, monkeypatch, batch_bytes):
    """A scrape with many new rows folds those of every process of a host in one batch (row_peaks.py;
    here from the first row on): a phase that
    ends one process's rows and begins the next one's is two runs, and the peaks are those each process
    folds alone; a torn row sends the batch back to each process's own fold, which drops that row."""
    from miles_profile.logdir.writer import SampleWriter
    from miles_profile.metrics.process_state import ProcessState
    from tests.metrics_run import COLUMNS
    from miles_profile.metrics import host_state
    monkeypatch.setattr(host_state, "BATCH_ROWS", 1)
    monkeypatch.setattr(host_state, "BATCH_BYTES", batch_bytes)  # 1: a scraper back after hours, 8 MiB a process
    from miles_profile.metrics import row_peaks
    batches: list[int] = []

    def fold(chunks, *args, real=row_peaks.fold):
        batches.append(len(chunks))
        return real(chunks, *args)
    monkeypatch.setattr(row_peaks, "fold", fold)
    run_dir, first, _ = run
    write_process_meta(run_dir, f"{HOST}-78", {"host": HOST, "pid": 78, "rank": 4, "role": "actor"})
    second = SampleWriter(run_dir, f"{HOST}-78", COLUMNS, flush_interval_s=1e9)
    for k, (phase, mib) in enumerate([("generate", 300), ("train", 900)]):
        row(first, k, phase, mib * MiB, alloc=2 * mib * MiB)
    for k, (phase, mib) in enumerate([("train", 100), ("train", 200), ("generate", 50), ("train", 70)]):
        row(second, k, phase, mib * MiB, alloc=2 * mib * MiB)
    first.flush()
    second.flush()
    state = HostState(run_dir, HOST, collect_interval_s=None)
    expected = {"3": {"generate": (600 * MiB, 300 * MiB), "train": (1800 * MiB, 900 * MiB)},
                "4": {"train": (400 * MiB, 200 * MiB), "generate": (100 * MiB, 50 * MiB)}}
    assert {p.rank: p.peaks for p in state.read().processes} == expected
    assert batches == ([2] if batch_bytes > 1 else [1, 1])
    alone = {}
    for pid in (77, 78):
        process = ProcessState(run_dir, f"{HOST}-{pid}")
        process.refresh()  # its own rows, folded by itself
        alone[process.reading.rank] = process.take_peaks()
    assert alone == expected
    row(first, 5, "train", 950 * MiB, alloc=1900 * MiB)
    first.flush()
    second.close()
    with open(run_dir / f"{HOST}-78.samples.csv", "ab") as f:
        f.write(b"6.0,train,5\n7.0,generate,20971520,20971520,41943040,41943040,41943040\n")
    assert {p.rank: p.peaks for p in state.read().processes} == {
        "3": {"train": (1900 * MiB, 950 * MiB)}, "4": {"generate": (40 * MiB, 20 * MiB)}}


def _offload_round(events, samples, t0: float, rollout: int, level: int):
    events.write("begin", "train", {"rollout_id": rollout}, t=t0, id=2 * rollout + 1)
    row(samples, t0 + 0.1, "train", level, alloc=level)
    summary = {"rows": 1, "t_first": t0 + 0.1, "t_last": t0 + 0.1, "series": {
        "gpu0_alloc": {"peak": level, "floor": level - MiB, "first": level, "last": level},
        "rss": {"peak": level, "floor": level - 2 * MiB, "first": level, "last": level}}}
    events.write("end", "train", {"status": "ok", "summary": summary}, t=t0 + 0.2, id=2 * rollout + 1)
    events.write("begin", "offload_train", {"rollout_id": rollout, "expected_bytes": 64 * MiB, "tags": ["w"]},
                 t=t0 + 0.3, id=2 * rollout + 2)
    row(samples, t0 + 0.4, "offload_train", level, alloc=level - 64 * MiB)
    summary = {"rows": 1, "t_first": t0 + 0.4, "t_last": t0 + 0.4, "series": {
        "gpu0_alloc": {"peak": level - 64 * MiB, "floor": level - 64 * MiB, "first": level - 64 * MiB,
                       "last": level - 64 * MiB}, "rss": {"peak": level, "floor": level, "first": level, "last": level}}}
    events.write("end", "offload_train", {"status": "ok", "summary": summary}, t=t0 + 0.5, id=2 * rollout + 2)


@pytest.fixture(params=["orjson", "json"])
def json_parser(request, monkeypatch):
    """process_state as imported with orjson, and as imported on a host without it (the stdlib's json)."""
    import importlib
    import sys
    if request.param == "json":
        monkeypatch.setitem(sys.modules, "orjson", None)  # `import orjson` raises ImportError
    importlib.reload(process_state)  # in place: HostState's ProcessState reads the module's `loads`
    yield process_state.loads.__module__
    monkeypatch.undo()
    importlib.reload(process_state)


def test_events_read_the_same_with_orjson_or_json_in_any_key_order(run, json_parser):
    """The events of the recorder's writer, and the same events with their keys in another order (another
    writer), give the same iterations, floors, transitions and verdicts, parsed by orjson or, where it is
    not installed, by the stdlib's json; a damaged line costs that line."""
    import json
    assert json_parser == ("orjson" if process_state.loads is not json.loads else "json")
    run_dir, samples, events = run
    for rollout in range(3):
        _offload_round(events, samples, 100.0 + rollout, rollout, (1000 + 100 * rollout) * MiB)
    events.write("begin", 'odd "name"', {}, t=104.0, id=99)  # an escape in a name
    samples.flush()
    events.close()
    with open(run_dir / f"{HOST}-77.events.jsonl", "ab") as f:
        f.write(b'{"t":105,"kind":"begin","name":"torn",\n[1,2]\n{"t":"x","kind":"end","id":99}\n')
    stem = f"{HOST}-78"
    write_process_meta(run_dir, stem, {"host": HOST, "pid": 78, "rank": 4, "role": "actor"})
    (run_dir / f"{stem}.samples.csv").write_bytes((run_dir / f"{HOST}-77.samples.csv").read_bytes())
    lines = (run_dir / f"{HOST}-77.events.jsonl").read_text().splitlines()[:-3]
    (run_dir / f"{stem}.events.jsonl").write_text("".join(json.dumps(json.loads(line), sort_keys=True) + "\n"
                                                          for line in lines))
    first, second = sorted(HostState(run_dir, HOST, collect_interval_s=None).read().processes, key=lambda p: p.rank)
    assert second.rank == "4"
    for process in (first, second):
        assert (process.iterations, process.floor_allocated, process.floor_resident) == (2, 1036 * MiB, 1098 * MiB)
        assert process.transitions == {"offload_train": pytest.approx(0.2)}
        offload = process.offloads[("offload_train", "w")]
        assert (offload.declared, offload.freed, offload.verdict, offload.count) == (64 * MiB, 64 * MiB, "pass", 3)
        assert process.phase == 'odd "name"'


def test_a_host_without_pyarrow_folds_each_process_rows_itself(run, monkeypatch):
    """pyarrow is imported at the first scrape of many rows; where it is missing (a GPU host without
    network) the scrape reads the same peaks, each process folding its own rows."""
    import sys
    from miles_profile.metrics import host_state
    monkeypatch.setattr(host_state, "BATCH_ROWS", 1)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    monkeypatch.delitem(sys.modules, "miles_profile.metrics.row_peaks", raising=False)
    run_dir, samples, _ = run
    for k, (phase, mib) in enumerate([("train", 300), ("train", 900), ("generate", 100)]):
        row(samples, k, phase, mib * MiB, alloc=2 * mib * MiB)
    samples.flush()
    assert HostState(run_dir, HOST, collect_interval_s=None).read().processes[0].peaks == {"train": (1800 * MiB, 900 * MiB),
                                                                  "generate": (200 * MiB, 100 * MiB)}
