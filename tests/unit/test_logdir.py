"""The log format: writer and reader round trip, damage tolerance, one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

import miles_profile as mp
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.layout import FORMAT_VERSION, find_runs, new_run_dir
from miles_profile.logdir.reader import phase_timeline
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta


def make_run(tmp_path, rows, events=(), columns=("rss", "rss_peak")):
    run = new_run_dir(tmp_path)
    write_run_meta(run, {"interval_ms": 20.0})
    write_process_meta(run, "h-7", {"pid": 7, "role": "in_process"})
    writer = SampleWriter(run, "h-7", columns)
    for t, phase, *values in rows:
        writer.append(t, phase, values)
    writer.close()
    ev = EventWriter(run, "h-7")
    for kind, name, t, pid_id, parent, attrs in events:
        ev.write(kind, name, attrs, t=t, id=pid_id, parent=parent)
    ev.close()
    return run


def test_round_trip_keeps_integers_and_absent_values(tmp_path):
    run = make_run(tmp_path, [(1.0, "", 10, 12), (2.0, "train", None, 2**40 + 3)])
    loaded = mp.load(run)
    assert loaded.samples["rss_peak"].tolist() == [12, 2**40 + 3]
    assert np.isnan(loaded.samples["rss"][1])  # absent stays absent, never zero
    assert loaded.samples["phase"].astype(str).tolist() == ["", "train"]
    assert loaded.samples["pid"].unique().tolist() == [7]


def test_truncated_last_line_is_dropped_with_a_warning(tmp_path):
    run = make_run(tmp_path, [(1.0, "", 10, 12), (2.0, "", 11, 13)])
    path = next(run.glob("*.samples.csv"))
    with open(path, "ab") as f:
        f.write(b"3.0,train,99")  # a writer killed mid-line
    loaded = mp.load(run)
    assert loaded.samples["t"].tolist() == [1.0, 2.0]
    assert any("truncated" in w for w in loaded.warnings)


def test_garbage_rows_and_unordered_times_are_reported(tmp_path):
    run = make_run(tmp_path, [(2.0, "", 10, 12), (1.0, "", 11, 13)])
    with open(next(run.glob("*.samples.csv")), "ab") as f:
        f.write(b"not,a,row,at,all,really\n")
    loaded = mp.load(run)
    assert loaded.samples["t"].tolist() == [1.0, 2.0]
    assert any("out of time order" in w for w in loaded.warnings)
    assert any("malformed" in w for w in loaded.warnings)


def test_garbage_inside_a_field_becomes_absent(tmp_path):
    run = make_run(tmp_path, [(1.0, "", 10, 12)])
    with open(next(run.glob("*.samples.csv")), "ab") as f:
        f.write(b"2.0,train,abc,14\n")
    loaded = mp.load(run)
    assert loaded.samples["rss_peak"].tolist() == [12, 14]
    assert np.isnan(loaded.samples["rss"][1])


def test_unknown_format_version_is_a_one_line_error(tmp_path):
    run = make_run(tmp_path, [(1.0, "", 1, 1)])
    meta = json.loads((run / "meta.json").read_text())
    meta["format_version"] = FORMAT_VERSION + 1
    (run / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(MilesProfileError, match="format version") as info:
        mp.load(run)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("setup, message", [
    (lambda p: p / "missing", "no such file"),
    (lambda p: p, "no miles-profile run"),
])
def test_missing_or_empty_paths_are_rejected(tmp_path, setup, message):
    with pytest.raises(MilesProfileError, match=message):
        mp.load(setup(tmp_path))


def test_a_directory_of_several_runs_names_them(tmp_path):
    make_run(tmp_path, [(1.0, "", 1, 1)])
    make_run(tmp_path, [(1.0, "", 1, 1)])
    assert len(find_runs(tmp_path)) == 2
    with pytest.raises(MilesProfileError, match="holds 2 runs"):
        mp.load(tmp_path)


def test_phases_pair_nest_and_an_unfinished_phase_is_open(tmp_path):
    events = [("begin", "train", 1.0, 1, None, {"rollout_id": 0}),
              ("begin", "offload_train", 1.5, 2, 1, {"target": "cpu"}),
              ("end", "offload_train", 1.8, 2, None, {"status": "ok"}),
              ("end", "train", 2.0, 1, None, {"status": "ok"}),
              ("begin", "generate", 3.0, 3, None, {})]
    run = make_run(tmp_path, [(1.0, "", 1, 1), (4.0, "generate", 1, 1)], events)
    phases = mp.load(run).phases
    assert phases["name"].tolist() == ["train", "offload_train", "generate"]
    assert phases["depth"].tolist() == [0, 1, 0]
    assert phases["status"].tolist() == ["ok", "ok", "open"]
    assert phases["end"].tolist() == [2.0, 1.8, 4.0]  # open phase ends at the last sample
    assert phases.loc[1, "target"] == "cpu" and phases.loc[0, "rollout_id"] == 0


def test_phase_timeline_names_the_innermost_open_phase(tmp_path):
    events = [("begin", "train", 1.0, 1, None, {}), ("begin", "offload_train", 2.0, 2, 1, {}),
              ("end", "offload_train", 3.0, 2, None, {}), ("end", "train", 4.0, 1, None, {})]
    run = make_run(tmp_path, [(1.0, "", 1, 1)], events)
    times, labels = phase_timeline(mp.load(run).events)
    assert times.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert labels == ["train", "offload_train", "train", ""]


def test_new_run_dirs_never_collide(tmp_path):
    dirs = {new_run_dir(tmp_path) for _ in range(5)}
    assert len(dirs) == 5


def test_runs_are_found_below_config_folders_but_not_inside_runs(tmp_path):
    outer = make_run(tmp_path / "1-no-offload", [(1.0, "", 1, 1)])
    make_run(tmp_path / "2-offload-train", [(1.0, "", 1, 1)])
    make_run(outer, [(1.0, "", 1, 1)])  # a folder inside a run is that run's business
    found = find_runs(tmp_path)
    assert sorted(p.parent.name for p in found) == ["1-no-offload", "2-offload-train"]


RACING_WRITER = """
import sys
from pathlib import Path
from miles_profile.logdir.writer import write_process_meta
run_dir, stem, size, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for k in range(n):
    write_process_meta(run_dir, stem, {"pid": 7, "k": k, "columns": ["x" * 20] * size})
"""


def test_two_processes_writing_one_meta_never_leave_it_unreadable(tmp_path):
    """A Ray worker writing its end while its node's sampler ends it: two writers of one meta. They shared a
    temporary file, and the shorter JSON landed over the longer one (one JSON and the other's tail, the
    process lost to the run: seen in a full suite run). Each write is whole now, whoever else writes."""
    import subprocess
    import sys
    from tests.conftest import REPO, python_env
    writers = [subprocess.Popen([sys.executable, "-c", RACING_WRITER, str(tmp_path), "w-7", str(size), "400"],
                                env=python_env(), cwd=REPO) for size in (120, 3)]
    path, unreadable, reads = tmp_path / "w-7.meta.json", 0, 0
    while any(w.poll() is None for w in writers):
        try:
            json.loads(path.read_text())
            reads += 1
        except FileNotFoundError:
            continue
        except ValueError:
            unreadable += 1
    assert all(w.wait() == 0 for w in writers)
    assert reads > 10 and unreadable == 0, (reads, unreadable)
    json.loads(path.read_text())
    assert not list(tmp_path.glob("*.tmp")), "a temporary file left behind"
