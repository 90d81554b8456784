"""A rank killed mid-run (kill -9): the other ranks stop with one line and a non-zero exit in bounded
time, and no engine process is left behind. Two launches: under torchrun (its agent SIGTERMs the
survivors) and ranks started by hand (the survivor's collective fails on the closed connection)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, python_env

TRAIN = ["-m", "trainer.train", "--preset", "tiny", "--num-rollout", "1000"]
STOP_WITHIN_S = 60  # after the kill: torchrun's monitor, our SIGTERM handler, engine shutdown


def _wait_for(root: Path, glob: str, pattern: str, procs: list[subprocess.Popen], timeout: float = 180) -> str:
    """The text of the file under `root` matching `glob` once it contains `pattern`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in root.glob(glob):
            text = path.read_text()
            if re.search(pattern, text):
                return text
        if any(p.poll() is not None for p in procs):
            pytest.fail("a rank exited before the kill")
        time.sleep(0.2)
    pytest.fail(f"{pattern!r} never appeared in {root / glob}")


def _engine_pids(text: str) -> list[int]:
    return [int(p) for p in re.findall(r"engine server \(pid (\d+)\)", text)]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)  # a zombie has exited
    except FileNotFoundError:
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_error_line(stderr: str, rank: int) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("trainer: error:")]
    assert len(errors) == 1 and f"rank {rank}" in errors[0], stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_torchrun_a_killed_rank_stops_the_others_with_one_line(tmp_path):
    logs = tmp_path / "ranks"
    env = dict(python_env(), TRAINER_DIST_TIMEOUT_S="30")
    run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "--redirects", "3", "--log-dir", str(logs), *TRAIN], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(logs, "*/attempt_0/0/stdout.log", r"rollout 2/", [run])
        victim = _wait_for(logs, "*/attempt_0/1/stdout.log", r"pid \d+", [run])
        engines = _engine_pids(victim) + _engine_pids(next(logs.glob("*/attempt_0/0/stdout.log")).read_text())
        os.kill(int(re.search(r"rank 1/2 pid (\d+)", victim).group(1)), signal.SIGKILL)
        killed = time.monotonic()
        run.communicate(timeout=STOP_WITHIN_S)
        assert time.monotonic() - killed < STOP_WITHIN_S
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0
    _one_error_line(next(logs.glob("*/attempt_0/0/stderr.log")).read_text(), rank=0)
    time.sleep(2)
    assert len(engines) == 2 and all(_gone(pid) for pid in engines)


@pytest.mark.slow
def test_ranks_by_hand_a_killed_peer_fails_the_survivor_s_collective(tmp_path):
    port = _free_port()
    ranks = []
    for rank in (0, 1):
        env = dict(python_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TRAINER_DIST_TIMEOUT_S="30")
        out = open(tmp_path / f"{rank}.out", "w")
        ranks.append(subprocess.Popen([sys.executable, *TRAIN], cwd=REPO, env=env, stdout=out,
                                      stderr=subprocess.PIPE, text=True))
    try:
        _wait_for(tmp_path, "0.out", r"rollout 2/", ranks)
        victim = (tmp_path / "1.out").read_text()
        engines = _engine_pids(victim) + _engine_pids((tmp_path / "0.out").read_text())
        ranks[1].kill()
        _, stderr = ranks[0].communicate(timeout=STOP_WITHIN_S)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    assert ranks[0].returncode == 1
    _one_error_line(stderr, rank=0)
    assert "failed, a peer rank died" in stderr
    time.sleep(2)
    assert len(engines) == 2 and all(_gone(pid) for pid in engines)


@pytest.mark.slow
def test_recorded_run_with_a_killed_rank_loads_and_marks_it_dead(tmp_path):
    import json

    import miles_profile as mp
    logs = tmp_path / "logs"
    env = dict(python_env(), TRAINER_DIST_TIMEOUT_S="30")
    rec = subprocess.Popen([sys.executable, "-m", "miles_profile.record", "--log-dir", str(logs), "--",
                            "--nproc-per-node", "2", *TRAIN[2:]], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, victim = time.monotonic() + 180, None
        while victim is None and time.monotonic() < deadline:
            for path in logs.glob("run-*/*.meta.json"):
                meta = json.loads(path.read_text() or "{}")
                if meta.get("role") == "actor" and meta.get("rank") == 1:
                    events = path.with_name(path.name.replace(".meta.json", ".events.jsonl"))
                    if events.exists() and events.read_text().count('"train"') >= 4:  # two trains done
                        victim = meta["pid"]
            if rec.poll() is not None:
                pytest.fail("the run ended before the kill")
            time.sleep(0.2)
        assert victim is not None, "rank 1 never trained"
        os.kill(victim, signal.SIGKILL)
        out, _ = rec.communicate(timeout=STOP_WITHIN_S)
    finally:
        if rec.poll() is None:
            rec.kill()
    assert rec.returncode != 0
    # the launcher's one line, not torchrun's ChildFailedError traceback and block (trainer/launch.py)
    assert "trainer: rank 1 was killed by SIGKILL; every rank stopped" in out and "Traceback" not in out, out
    run = mp.load(next(logs.glob("run-*")))
    dead = {(p["role"], p.get("rank")) for p in run.processes if p.get("died")}
    assert ("actor", 1) in dead and ("actor", 0) not in dead, run.warnings
    assert any("died before the run ended" in w and f"pid {victim}" in w for w in run.warnings), run.warnings
    assert (run.phases["name"] == "train").sum() >= 4  # what the dead rank recorded is still there
