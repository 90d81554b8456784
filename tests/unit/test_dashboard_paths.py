"""A run id from the browser never reaches a file outside the log directory."""
from __future__ import annotations

import json
import os

import pytest

from dashboards.paths import LogRoot
from dashboards.runs import list_runs
from miles_profile.errors import MilesProfileError


def make_run(path, start_time=1000.0, ended=True):
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"format_version": 1, "start_time": start_time, "command": ["x"]}))
    meta = {"format_version": 1, "pid": 1}
    if ended:
        meta["end_time"] = start_time + 1
    (path / "h-1.meta.json").write_text(json.dumps(meta))
    (path / "h-1.samples.csv").write_text("t,phase,rss\n1.0,,10\n")
    return path


@pytest.fixture
def layout(tmp_path):
    root = tmp_path / "logs"
    make_run(root / "run-a", 1000.0)
    make_run(root / "run-b", 2000.0)
    outside = make_run(tmp_path / "secret-run", 3000.0)
    (tmp_path / "secret.txt").write_text("secret")
    return root, outside


@pytest.mark.parametrize("run_id", [
    "../secret-run", "..", ".", "", "run-a/../../secret-run", "/etc", "/etc/passwd", "run-a/meta.json",
    "..\\secret-run", "run-a\0", "nope", None, 3, ["run-a"], {"run": "run-a"}, "x" * 5000,
])
def test_resolve_refuses_anything_but_a_listed_run(layout, run_id):
    root, outside = layout
    with pytest.raises(MilesProfileError):
        LogRoot(root).resolve(run_id)


def test_resolve_finds_runs_by_name(layout):
    root, _ = layout
    assert LogRoot(root).resolve("run-a") == (root / "run-a").resolve()


def test_a_directory_linked_out_of_the_root_is_not_a_run(layout):
    root, outside = layout
    os.symlink(outside, root / "linked-run")
    log_root = LogRoot(root)
    assert "linked-run" not in log_root.run_dirs()
    with pytest.raises(MilesProfileError):
        log_root.resolve("linked-run")


def test_a_run_holding_a_link_out_is_refused(layout, tmp_path):
    root, _ = layout
    os.symlink(tmp_path / "secret.txt", root / "run-a" / "h-2.samples.csv")
    with pytest.raises(MilesProfileError, match="links outside"):
        LogRoot(root).resolve("run-a")
    assert LogRoot(root).resolve("run-b")  # the others stay readable


def test_a_run_meta_linked_out_is_not_a_run(layout, tmp_path):
    root, outside = layout
    run = root / "run-c"
    run.mkdir()
    os.symlink(outside / "meta.json", run / "meta.json")
    assert "run-c" not in LogRoot(root).run_dirs()


def test_the_root_itself_may_be_a_run(layout):
    root, _ = layout
    log_root = LogRoot(root / "run-a")
    assert list(log_root.run_dirs()) == ["run-a"]
    with pytest.raises(MilesProfileError):
        log_root.resolve("../run-b")


def test_root_must_be_a_directory(tmp_path):
    with pytest.raises(MilesProfileError):
        LogRoot(tmp_path / "missing")


def test_runs_are_listed_newest_first_and_live_runs_marked(layout):
    root, _ = layout
    make_run(root / "run-live", 4000.0, ended=False)
    (root / "damaged").mkdir()
    (root / "damaged" / "meta.json").write_text("{not json")
    runs = list_runs(LogRoot(root))
    by_id = {r.run_id: r for r in runs}
    assert [r.run_id for r in runs if r.run_id != "damaged"] == ["run-live", "run-b", "run-a"]
    assert by_id["run-live"].live and not by_id["run-a"].live
    assert by_id["damaged"].problem


def test_a_run_without_end_time_whose_files_went_quiet_is_not_live(layout):
    root, _ = layout
    run = make_run(root / "run-killed", 5000.0, ended=False)
    for path in run.iterdir():
        os.utime(path, (0, 0))
    assert not {r.run_id: r for r in list_runs(LogRoot(root))}["run-killed"].live


@pytest.mark.parametrize("command, shown", [
    (["/w/miles_profile/record.py", "--log-dir", "/l", "--exec", "--", "python", "train.py", "--lr", "1"],
     "python train.py --lr 1"),
    (["/w/miles_profile/record.py", "--heap", "--", "--preset", "cpu"], "python -m trainer.train --preset cpu"),
    (["python", "my_job.py"], "python my_job.py"),  # a Recorder started in the program itself
])
def test_the_run_list_shows_what_the_user_ran(tmp_path, command, shown):
    run = make_run(tmp_path / "logs" / "run-a")
    (run / "meta.json").write_text(json.dumps({"format_version": 1, "start_time": 1.0, "command": command}))
    assert list_runs(LogRoot(tmp_path / "logs"))[0].command == shown
