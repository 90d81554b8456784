"""The reader's columnar cache of a large finished samples file: used when valid, ignored when stale."""
from __future__ import annotations

import json
import threading

import numpy as np
import pandas as pd
import pytest

from miles_profile.logdir import samples_cache
from miles_profile.logdir.reader import load_run


def _write_run(tmp_path, rows: int, finished: bool):
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"format_version": 1, "start_time": 1.0}))
    meta = {"format_version": 1, "pid": 7, "stem": "h-7", "role": "in_process"}
    if finished:
        meta["end_time"] = 2.0
    (run / "h-7.meta.json").write_text(json.dumps(meta))
    t = 1.0 + np.arange(rows) * 0.01
    frame = pd.DataFrame({"t": t, "phase": "train", "rss": np.arange(rows) * 1024, "rss_peak": np.arange(rows) * 1024})
    frame.to_csv(run / "h-7.samples.csv", index=False, float_format="%.6f")
    (run / "h-7.events.jsonl").write_text("")
    return run


def _wait_for_cache_writer():
    for thread in threading.enumerate():
        if thread.name == "miles_profile-cache":
            thread.join()


@pytest.fixture
def small_cache_threshold(monkeypatch):
    monkeypatch.setattr(samples_cache, "CACHE_MIN_BYTES", 1)
    monkeypatch.delenv("MILES_PROFILE_CACHE", raising=False)


def test_cache_is_written_once_finished_and_gives_the_same_samples(tmp_path, small_cache_threshold):
    run = _write_run(tmp_path, 1000, finished=True)
    first = load_run(run).samples
    _wait_for_cache_writer()
    cache = run / ".h-7.samples.csv.arrow"
    assert cache.is_file()
    second = load_run(run).samples
    pd.testing.assert_frame_equal(first.reset_index(drop=True), second.reset_index(drop=True), check_categorical=False)


def test_stale_cache_is_ignored(tmp_path, small_cache_threshold):
    run = _write_run(tmp_path, 100, finished=True)
    load_run(run)
    _wait_for_cache_writer()
    with open(run / "h-7.samples.csv", "a") as f:
        f.write("99.000000,train,5,5\n")  # the CSV changed after the cache was written
    samples = load_run(run).samples
    assert len(samples) == 101 and samples["rss"].iloc[-1] == 5


def test_no_cache_for_a_run_still_being_written_or_when_disabled(tmp_path, small_cache_threshold, monkeypatch):
    run = _write_run(tmp_path, 100, finished=False)
    load_run(run)
    _wait_for_cache_writer()
    assert not (run / ".h-7.samples.csv.arrow").exists()
    meta = json.loads((run / "h-7.meta.json").read_text())
    (run / "h-7.meta.json").write_text(json.dumps({**meta, "end_time": 2.0}))
    monkeypatch.setenv("MILES_PROFILE_CACHE", "0")
    load_run(run)
    assert not (run / ".h-7.samples.csv.arrow").exists()
