"""Many recording processes as real processes: ranks on one host with exactly one host sampler, two
(faked) hosts of one run in two directories loaded as one run. (A killed host sampler:
tests/faults/test_faults_host_sampler.py.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import miles_profile as mp
from miles_profile.errors import MilesProfileError
from miles_profile.identity import HOST_ENV, ROLE_ENV, RUN_ID_ENV
from miles_profile.names import RUN_DIR_ENV
from miles_profile.recorder import create_run
from miles_profile.report.build import load_inputs
from tests.conftest import REPO, python_env

# A rank: phases for `seconds`, allocating a little in each (its run dir or log dir from argv).
RANK_PROGRAM = """
import sys, time
import miles_profile as mp
where, seconds = sys.argv[1], float(sys.argv[2])
rec = None if where == "-" else mp.Recorder(where, interval_ms=20).start()
print("started", flush=True)
end = time.time() + seconds
k = 0
while time.time() < end:
    with mp.phase("train", rollout_id=k):
        block = bytearray(4 * 1024 * 1024)
        time.sleep(0.05)
        del block
    k += 1
if rec is not None:
    rec.stop()
"""


def start_rank(where: str, seconds: float, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, where, str(seconds)],
                            env={**python_env(), **env}, cwd=REPO, stdout=subprocess.PIPE, text=True)


def rank_env(rank: int, world: int, run_dir: Path | None = None, **extra: str) -> dict[str, str]:
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), ROLE_ENV: "actor", **extra}
    if run_dir is not None:
        env[RUN_DIR_ENV] = str(run_dir)
    return env


def wait_all(procs, timeout=60):
    for proc in procs:
        assert proc.wait(timeout=timeout) == 0


@pytest.mark.slow
def test_ranks_of_one_host_have_exactly_one_host_sampler(tmp_path):
    run_dir = create_run(tmp_path, ["test"], 20.0, run_id="job-one-host")
    procs = [start_rank("-", 2.5, **rank_env(r, 4, run_dir)) for r in range(4)]  # all at once
    wait_all(procs)
    run = mp.load(run_dir)
    assert sorted(p["rank"] for p in run.processes) == [0, 1, 2, 3]
    assert {p["world_size"] for p in run.processes} == {4} and {p["role"] for p in run.processes} == {"actor"}
    assert {p["run_id"] for p in run.processes} == {"job-one-host"}
    holders = [p for p in run.processes if p["host_sampler"]]
    assert len(holders) <= 1 and len(run.hosts) == 1  # one host sampler for the four ranks
    assert run.hosts[0]["pid"] in {p["pid"] for p in run.processes}
    host = run.host_samples
    assert host["t"].diff().dropna().median() < 0.2 and len(host) >= 10  # about every 100 ms
    # Host-wide columns are not repeated in every rank's rows.
    assert sum("host_available" in p["columns"] for p in run.processes) <= 1
    # Every rank's phases, each with its summary.
    assert set(run.phase_summaries["pid"]) == {p["pid"] for p in run.processes}


@pytest.mark.slow
def test_two_hosts_in_two_directories_load_as_one_run(tmp_path):
    env = {RUN_ID_ENV: "job-two-hosts"}
    a = start_rank(str(tmp_path / "a"), 1.5, **{**rank_env(0, 2), **env, HOST_ENV: "node-a"})
    b = start_rank(str(tmp_path / "b"), 1.5, **{**rank_env(0, 2), **env, HOST_ENV: "node-b", "RANK": "1"})
    other = start_rank(str(tmp_path / "c"), 0.5, **rank_env(0, 1), **{RUN_ID_ENV: "another-job"})
    wait_all([a, b, other])
    run = mp.load(tmp_path / "a", tmp_path / "b")
    assert sorted(p["host"] for p in run.processes) == ["node-a", "node-b"]
    assert sorted(p["rank"] for p in run.processes) == [0, 1]
    assert sorted(h["host"] for h in run.hosts) == ["node-a", "node-b"]
    assert set(run.host_samples["host"].astype(str)) == {"node-a", "node-b"}
    assert set(run.phases["host"]) == {"node-a", "node-b"} and (run.phases["status"] == "ok").all()
    assert run.samples["pid"].nunique() == 2 and len(run.directories) == 2
    with pytest.raises(MilesProfileError, match="holds 2 runs"):
        mp.load(tmp_path / "a", tmp_path / "c")  # another run id stays another run
    runs, _ = load_inputs([str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")])  # visualize's loader
    assert sorted(len(r.processes) for r in runs) == [1, 2]
    assert len(mp.load(tmp_path / "a").processes) == 1  # one directory alone still loads


def test_record_exec_is_the_host_sampler_and_hands_the_run_id_down(tmp_path):
    child = ("import miles_profile as mp, os, time\n"
             "with mp.phase('generate'):\n    time.sleep(0.3)\n"
             "print(os.environ['MILES_PROFILE_RUN_ID'])\n")
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--run-id",
                           "job-exec", "--interval-ms", "10", "--exec", "--", sys.executable, "-c", child],
                          env=python_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "job-exec"
    run = mp.load(tmp_path)
    assert run.meta["run_id"] == "job-exec"
    parent = next(p for p in run.processes if p["role"] == "exec_parent")
    inner = next(p for p in run.processes if p["role"] == "in_process")
    assert parent["host_sampler"] and not inner["host_sampler"]
    assert [h["pid"] for h in run.hosts] == [parent["pid"]]  # record took the role before the child ran


def test_two_hosts_in_one_shared_run_directory_each_sample_their_own_host(tmp_path):
    run_dir = create_run(tmp_path, ["test"], 20.0)
    procs = [start_rank("-", 1.0, **{**rank_env(0, 2, run_dir), HOST_ENV: host, "RANK": str(r)})
             for r, host in enumerate(["node-a", "node-b"])]
    wait_all(procs)
    run = mp.load(run_dir)
    assert sorted(h["host"] for h in run.hosts) == ["node-a", "node-b"]  # one lock per host
    assert sorted(run_dir.glob("*.host.lock")) == [run_dir / "node-a.host.lock", run_dir / "node-b.host.lock"]
    assert all(p["host_sampler"] for p in run.processes)
