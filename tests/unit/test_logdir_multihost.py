"""Reading one run from several directories (one per host): merging by run id, phases named by
(host, pid, id) even where pids repeat across hosts, version-1 logs without run ids."""
from __future__ import annotations

import json

import pytest

import miles_profile as mp
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.layout import new_run_dir


def write_host_run(parent, host, run_id, pid=7, begin=1.0):
    """A run directory as a recorder on `host` writes it (files named by host and pid)."""
    run = new_run_dir(parent)
    meta = {"format_version": 1, "interval_ms": 20.0, "start_time": begin}
    if run_id is not None:
        meta["run_id"] = run_id
    (run / "meta.json").write_text(json.dumps(meta))
    stem = f"{host}-{pid}"
    (run / f"{stem}.meta.json").write_text(json.dumps({"format_version": 1, "pid": pid, "host": host,
                                                       "role": "actor", "stem": stem}))
    (run / f"{stem}.samples.csv").write_text(f"t,phase,rss\n{begin},,1\n{begin + 1},train,5\n{begin + 2},,2\n")
    events = [{"t": begin + 0.5, "kind": "begin", "name": "train", "pid": pid, "id": 1, "attrs": {}},
              {"t": begin + 1.5, "kind": "end", "name": "train", "pid": pid, "id": 1,
               "attrs": {"status": "ok", "summary": {"rows": 1, "t_first": begin + 1, "t_last": begin + 1,
                                                     "series": {"rss": {"peak": 5, "floor": 5, "first": 5,
                                                                        "last": 5}}}}}]
    (run / f"{stem}.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))  # no "host": from the name
    return run


def test_directories_of_one_run_id_merge_and_repeated_pids_stay_apart(tmp_path):
    a = write_host_run(tmp_path / "a", "node-a", "job", begin=1.0)
    b = write_host_run(tmp_path / "b", "node-b", "job", begin=1.2)
    run = mp.load(a, b)
    assert [p["host"] for p in run.processes] == ["node-a", "node-b"]
    assert sorted(run.phases["host"]) == ["node-a", "node-b"]
    assert run.phases["status"].tolist() == ["ok", "ok"]  # each end paired with its own host's begin
    assert sorted(run.phases["start"]) == [1.5, 1.7] and run.phases["duration"].round(6).tolist() == [1.0, 1.0]
    assert len(run.samples) == 6 and run.samples["t"].is_monotonic_increasing
    assert sorted(run.phase_summaries["host"]) == ["node-a", "node-b"]
    assert any("several hosts" in w for w in run.warnings)
    assert run.meta["directories"] == [str(a.resolve()), str(b.resolve())]
    assert len(mp.load(tmp_path).processes) == 2  # the folder above both: one run id, one run


def test_different_run_ids_are_different_runs(tmp_path):
    a = write_host_run(tmp_path, "node-a", "job-1")
    b = write_host_run(tmp_path, "node-b", "job-2")
    with pytest.raises(MilesProfileError, match="holds 2 runs") as info:
        mp.load(a, b)
    assert "\n" not in str(info.value)


def test_version_1_logs_without_run_ids_are_each_their_own_run(tmp_path):
    a = write_host_run(tmp_path, "node-a", None)
    write_host_run(tmp_path, "node-a", None)
    with pytest.raises(MilesProfileError, match="holds 2 runs"):
        mp.load(tmp_path)
    run = mp.load(a)
    assert len(run.processes) == 1 and run.host_samples.empty and run.hosts == []


def test_damaged_host_files_are_read_with_warnings(tmp_path):
    run = write_host_run(tmp_path, "node-a", "job")
    (run / "node-a-9.host.json").write_text(json.dumps({"format_version": 1, "host": "node-a", "pid": 9}))
    (run / "node-a-9.host.csv").write_text("t,host_available,host_total,cgroup_usage,cgroup_limit,gpu_used:GPU-x\n"
                                           "1.0,5,10,3,,7\n2.0,4,10,x3,,8\n3.0,4,1")  # garbage, then cut
    (run / "node-a-9.gpu_procs.csv").write_text("t,gpu_uuid,pid,bytes\n1.0,GPU-x,7,6\n1.0,GPU-x,8,\nbroken\n")
    loaded = mp.load(run)
    assert loaded.host_samples["t"].tolist() == [1.0, 2.0]
    assert loaded.host_samples["cgroup_usage"].isna().tolist() == [False, True]
    assert loaded.host_samples["cgroup_limit"].isna().all()  # unlimited stays empty
    assert loaded.gpu_samples["used"].tolist() == [7, 8]
    assert loaded.gpu_procs["pid"].tolist() == [7, 8] and loaded.gpu_procs["bytes"].isna().tolist() == [False, True]
    assert any("truncated" in w for w in loaded.warnings) and any("malformed" in w for w in loaded.warnings)
