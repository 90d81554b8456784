"""Following a growing run by its appended bytes gives what a full re-read gives."""
from __future__ import annotations

import pandas as pd

import miles_profile
from dashboards.live_run import LiveRun
from miles_profile.logdir.tail import SamplesTail
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta


def start_run(run_dir, stems=("h-11",)):
    run_dir.mkdir()
    write_run_meta(run_dir, {"start_time": 100.0, "command": ["test"], "interval_ms": 10.0})
    writers = {}
    for stem in stems:
        write_process_meta(run_dir, stem, {"pid": int(stem.split("-")[1]), "role": "in_process"})
        writers[stem] = (SampleWriter(run_dir, stem, ["rss", "rss_peak"], flush_interval_s=0),
                         EventWriter(run_dir, stem))
    return writers


def write_rows(samples, t0, n, phase=""):
    for i in range(n):
        samples.append(t0 + i * 0.01, phase, [1000 + i, 2000 + i])
    samples.flush()


def assert_same_as_full_read(live: LiveRun):
    full = miles_profile.load(live.run_dir)
    pd.testing.assert_frame_equal(live.current.samples.reset_index(drop=True), full.samples,
                                  check_categorical=False)
    pd.testing.assert_frame_equal(live.current.phases, full.phases)


def test_appended_rows_and_phases_appear_after_refresh(tmp_path):
    run_dir = tmp_path / "run"
    (samples, events), = start_run(run_dir).values()
    write_rows(samples, 100.0, 50)
    live = LiveRun(run_dir)
    assert len(live.current.samples) == 50 and not live.refresh()
    events.write("begin", "generate", {}, t=100.6, id=1)
    write_rows(samples, 100.5, 30, "generate")
    assert live.refresh() and live.version == 1
    assert len(live.current.samples) == 80
    assert list(live.current.phases["name"]) == ["generate"] and live.current.phases["status"][0] == "open"
    events.write("end", "generate", {"status": "ok"}, t=100.75, id=1)
    assert live.refresh()
    assert_same_as_full_read(live)


def test_a_line_being_written_waits_for_its_end(tmp_path):
    run_dir = tmp_path / "run"
    (samples, _), = start_run(run_dir).values()
    write_rows(samples, 100.0, 5)
    live = LiveRun(run_dir)
    with open(samples.path, "a") as file:
        file.write("100.5,,12")
    assert not live.refresh()
    with open(samples.path, "a") as file:
        file.write("34,5678\n")
    assert live.refresh()
    assert live.current.samples["rss"].iloc[-1] == 1234


def test_tail_starting_mid_line_skips_rows_already_loaded(tmp_path):
    run_dir = tmp_path / "run"
    (samples, _), = start_run(run_dir).values()
    write_rows(samples, 100.0, 10)
    size = samples.path.stat().st_size
    tail = SamplesTail(samples.path, offset=size - 7, after_t=100.09)
    assert tail.read() is None
    write_rows(samples, 100.1, 3)
    assert list(tail.read()["rss"]) == [1000, 1001, 1002]


def test_two_processes_flushing_at_different_times_stay_in_time_order(tmp_path):
    run_dir = tmp_path / "run"
    writers = start_run(run_dir, ("h-11", "h-12"))
    write_rows(writers["h-11"][0], 100.0, 20)
    write_rows(writers["h-12"][0], 100.005, 5)
    live = LiveRun(run_dir)
    write_rows(writers["h-12"][0], 100.055, 15)  # earlier than h-11's last row
    write_rows(writers["h-11"][0], 100.2, 5)
    assert live.refresh()
    assert live.current.samples["t"].is_monotonic_increasing
    assert_same_as_full_read(live)


def test_a_process_that_starts_later_is_picked_up(tmp_path):
    run_dir = tmp_path / "run"
    writers = start_run(run_dir)
    write_rows(writers["h-11"][0], 100.0, 5)
    live = LiveRun(run_dir)
    late = SampleWriter(run_dir, "h-13", ["rss", "rss_peak"], flush_interval_s=0)
    write_rows(late, 100.02, 4)
    assert live.refresh()
    assert sorted(live.current.samples["pid"].unique()) == [11, 13]


def test_memo_computes_once_per_version_and_forgets_old_windows(tmp_path):
    from dashboards import live_run as live_run_module
    run_dir = tmp_path / "run"
    (samples, _), = start_run(run_dir).values()
    write_rows(samples, 100.0, 5)
    live = LiveRun(run_dir)
    calls = []
    compute = lambda run: calls.append(len(run.samples)) or len(run.samples)  # noqa: E731
    assert live.memo("full", compute) == 5 and live.memo("full", compute) == 5 and calls == [5]
    write_rows(samples, 100.1, 2)
    live.refresh()
    assert live.memo("full", compute) == 7 and calls == [5, 7]
    for k in range(live_run_module.MEMO_KEYS + 3):
        live.memo(f"window-{k}", compute)
        live.memo("full", compute)  # used all along: kept
    assert calls.count(7) == 1 + live_run_module.MEMO_KEYS + 3
    assert len(live._memo) <= live_run_module.MEMO_KEYS


def test_panels_asking_during_a_refresh_share_it(tmp_path):
    """The page's panels poll together: those that ask while one refresh reads the files wait for it and
    read nothing again; the run they then see holds what that refresh read."""
    import threading
    run_dir = tmp_path / "run"
    (samples, _), = start_run(run_dir).values()
    write_rows(samples, 100.0, 5)
    live = LiveRun(run_dir)
    write_rows(samples, 100.1, 7)
    reads, inside, release = [], threading.Event(), threading.Event()
    real_read = live._read_appended

    def held_read():  # the real read, held open until every other panel has asked
        reads.append(1)
        inside.set()
        release.wait(10)
        return real_read()

    live._read_appended = held_read
    first = threading.Thread(target=live.refresh)
    first.start()
    assert inside.wait(10)
    answers = []
    others = [threading.Thread(target=lambda: answers.append(live.refresh())) for _ in range(3)]
    for thread in others:
        thread.start()
    release.set()
    for thread in (first, *others):
        thread.join(10)
    assert len(reads) == 1 and answers == [False] * 3
    assert len(live.current.samples) == 12
    write_rows(samples, 100.2, 1)  # a later ask reads again
    assert live.refresh() and len(reads) == 2 and len(live.current.samples) == 13


def test_a_process_that_stops_finishes_its_last_iteration_as_a_full_read_does(tmp_path):
    """The recorder's stop rewrites its meta (end_time); no appended row says so. A dashboard that
    followed the run counted one iteration fewer than the CLI until restarted (issue 35)."""
    from miles_profile.verdicts.common import unfinished_iterations
    run_dir = tmp_path / "run"
    (samples, events), = start_run(run_dir).values()
    write_process_meta(run_dir, "h-11", {"pid": 11, "role": "in_process", "start_time": 100.0})
    for it in range(3):
        events.write("begin", "train", {"rollout_id": it}, t=100.0 + it, id=it + 1)
        write_rows(samples, 100.0 + it, 20, "train")
        events.write("end", "train", {"status": "ok"}, t=100.5 + it, id=it + 1)
    live = LiveRun(run_dir)
    assert unfinished_iterations(live.current) == {2}  # still recording: the last iteration may go on
    write_process_meta(run_dir, "h-11", {"pid": 11, "role": "in_process", "start_time": 100.0, "end_time": 104.0})
    assert live.refresh() and live.version == 1
    assert unfinished_iterations(live.current) == set() == unfinished_iterations(miles_profile.load(run_dir))
    assert_same_as_full_read(live)
    assert not live.refresh()
