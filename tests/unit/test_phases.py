"""The phase API: free without a recorder, nesting, threads, errors and OOMs logged then re-raised."""
from __future__ import annotations

import threading
import time

import pytest

import miles_profile as mp
from miles_profile.phases import _NO_PHASE


def test_without_a_recorder_phase_is_a_shared_no_op(tmp_path):
    assert mp.phase("train", rollout_id=1) is _NO_PHASE
    with mp.phase("train"):
        mp.mark("nothing")
    start = time.perf_counter()
    for _ in range(100_000):
        with mp.phase("train"):
            pass
    per_call = (time.perf_counter() - start) / 100_000
    assert per_call < 20e-6  # a function call and a with-statement, nothing more
    assert list(tmp_path.iterdir()) == []


def test_nested_phases_record_parents_and_samples_at_both_ends(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=1000) as rec:
        with mp.phase("train", rollout_id=3):
            with mp.phase("offload_train", target="cpu", expected_bytes=5):
                pass
    run = mp.load(rec.run_dir)
    outer, inner = run.phases.iloc[0], run.phases.iloc[1]
    assert (outer["name"], inner["name"]) == ("train", "offload_train")
    assert inner["parent"] == outer["id"] and inner["depth"] == 1
    assert inner["expected_bytes"] == 5 and outer["rollout_id"] == 3
    s = run.samples
    for _, p in run.phases.iterrows():  # a measured before and after for each phase
        assert ((s["t"] <= p["start"])).any()
        closing = s[(s["t"] <= p["end"]) & (s["phase"] == p["name"])]
        assert len(closing) >= 1 and closing["t"].max() >= p["start"]


def test_phases_from_threads_each_keep_their_parent(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=1000) as rec:
        def worker(k):
            with mp.phase("generate", worker=k):
                with mp.phase("onload_kv", worker=k):
                    time.sleep(0.01)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    phases = mp.load(rec.run_dir).phases
    inner = phases[phases["name"] == "onload_kv"]
    outer = phases[phases["name"] == "generate"].set_index("id")
    assert len(inner) == 4
    for _, row in inner.iterrows():
        assert outer.loc[row["parent"], "worker"] == row["worker"]


def test_an_exception_is_an_error_event_and_is_reraised(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=1000) as rec:
        with pytest.raises(ValueError):
            with mp.phase("train"):
                with mp.phase("onload_train"):
                    raise ValueError("bad batch")
    run = mp.load(rec.run_dir)
    errors = run.events[run.events["kind"] == "error"]
    assert len(errors) == 1  # logged once, in the innermost phase
    assert errors.iloc[0]["attrs"]["message"] == "bad batch"
    assert run.phases["status"].tolist() == ["error", "error"]


def test_memory_error_is_an_oom_event(tmp_path):
    with mp.Recorder(tmp_path, interval_ms=1000) as rec:
        with pytest.raises(MemoryError):
            with mp.phase("generate", rollout_id=0):
                raise MemoryError()
    run = mp.load(rec.run_dir)
    oom = run.events[run.events["kind"] == "oom"]
    assert oom.iloc[0]["attrs"]["phase"] == "generate"
    assert run.phases.iloc[0]["status"] == "oom"


def test_marks_and_watched_dirs(tmp_path):
    offload = tmp_path / "offload"
    offload.mkdir()
    with mp.Recorder(tmp_path / "logs", interval_ms=1000) as rec:
        mp.watch_dir(offload)
        (offload / "chunk0").write_bytes(b"x" * 4096)
        with mp.phase("offload_train", target="disk"):
            pass
        mp.mark("checkpoint", step=2)
    run = mp.load(rec.run_dir)
    assert run.events[run.events["kind"] == "mark"].iloc[0]["attrs"] == {"step": 2}
    assert run.samples["disk"].max() == 4096


def test_annotate_merges_into_this_process_meta_and_survives_stop(tmp_path):
    mp.annotate(rollout_memory_backend="ignored")  # no recorder: nothing written anywhere
    assert list(tmp_path.iterdir()) == []
    with mp.Recorder(tmp_path, interval_ms=1000) as rec:
        mp.annotate(rollout_memory_backend="torch_memory_saver")
        mp.annotate(train_memory_backend="builtin", rollout_memory_backend="builtin")
        run_dir = rec.run_dir
    meta = mp.load(run_dir).processes[0]
    assert meta["annotations"] == {"rollout_memory_backend": "builtin", "train_memory_backend": "builtin"}
    assert "end_time" in meta and meta["pid"] > 0  # the recorder's own fields are untouched
