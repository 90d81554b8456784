"""The trainer under a real torchrun on CPU (gloo), and `record` of such a run in one command.

Each run starts N ranks and N engine processes, each importing torch: tens of seconds on a loaded
2-core machine, hence `slow`."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import miles_profile as mp
from tests.conftest import REPO, python_env

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
GPU_ORDER = ["--offload-train", "--offload-rollout", "--colocate-memory-peak-device", "gpu",
             "--offload-rollout-level", "kv_cache", "weight", "--optimizer-cpu-offload"]
CPU_ORDER = ["--offload-train", "--offload-rollout", "--use-critic", "--optimizer-cpu-offload"]


def _run(argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=timeout)


def _check_ranks(result: subprocess.CompletedProcess, n: int, rollouts: int) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = re.findall(r"trainer: rank (\d+)/(\d+) pid \d+, engine server \(pid \d+\)", result.stdout)
    assert sorted(ranks) == [(str(r), str(n)) for r in range(n)], result.stdout
    progress = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("rollout ")]
    assert progress == [f"{i}/{rollouts}" for i in range(1, rollouts + 1)]  # rank 0 alone prints them


@pytest.mark.slow
@pytest.mark.parametrize("flags", [GPU_ORDER, CPU_ORDER], ids=["gpu_order_all_offloads", "cpu_order_critic"])
def test_two_ranks_under_torchrun(flags):
    result = _run([*TORCHRUN, "--nproc-per-node", "2", "-m", "trainer.train", "--preset", "tiny",
                   "--num-rollout", "2", *flags])
    _check_ranks(result, 2, 2)


@pytest.mark.slow
def test_four_ranks_under_torchrun():
    result = _run([*TORCHRUN, "--nproc-per-node", "4", "-m", "trainer.train", "--preset", "tiny",
                   "--num-rollout", "2", "--offload-train", "--offload-rollout"])
    _check_ranks(result, 4, 2)


def test_a_batch_that_does_not_split_over_the_ranks_is_one_line_and_exit_2(tmp_path):
    result = _run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--",
                   "--nproc-per-node", "3", "--preset", "tiny", "--rollout-batch-size", "32"])
    assert result.returncode == 2 and "does not split evenly over 3 ranks" in result.stderr
    assert result.stderr.count("\n") == 1 and not list(tmp_path.iterdir())  # no run directory was made


def _engines_and_ranks(run) -> tuple[list[dict], list[dict]]:
    script = lambda p: Path((p.get("command") or [""])[0]).name  # noqa: E731  (python -m X: X's file)
    return ([p for p in run.processes if script(p) == "engine_server.py"],
            [p for p in run.processes if script(p) == "train.py"])


@pytest.mark.slow
@pytest.mark.parametrize("form", ["nproc", "exec_torchrun"])
def test_record_of_two_ranks_has_every_rank_and_engine(request, tmp_path, form):
    if form == "nproc":  # `record -- --nproc-per-node 2 --preset tiny --num-rollout 2`, recorded once per session
        log_dir = request.getfixturevalue("recorded_two_rank_run")
    else:
        log_dir = tmp_path
        result = _run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--exec", "--",
                       *TORCHRUN, "--nproc-per-node", "2", "-m", "trainer.train", "--preset", "tiny", "--num-rollout", "2"])
        assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = [p for p in log_dir.iterdir() if p.is_dir()]
    run = mp.load(run_dir)
    engines, ranks = _engines_and_ranks(run)
    assert sorted(p["rank"] for p in ranks) == [0, 1] and sorted(p["rank"] for p in engines) == [0, 1]
    for p in ranks + engines:  # role: set through MILES_PROFILE_ROLE once the recorder reads it
        assert p.get("role") in ("in_process", "actor" if p in ranks else "engine")
    pids = set(run.samples["pid"])
    assert {p["pid"] for p in ranks + engines} <= pids  # every one of them sampled itself
    phases = run.phases
    for p in engines:  # the engine's requests ran in phases named after the rank's
        names = set(phases.loc[phases["pid"] == p["pid"], "name"])
        assert {"generate", "update_weights"} <= names
    assert len(list(Path(run_dir).glob("*.samples.csv"))) == 5  # record, 2 ranks, 2 engines


@pytest.mark.slow
def test_record_in_process_with_an_engine_server_records_the_engine_too(tmp_path):
    """One process under `record` (no torchrun): the engine server joins the recorder's run."""
    result = _run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--",
                   "--preset", "tiny", "--num-rollout", "1", "--rollout-engine", "server"])
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = mp.load(run_dir)
    engines, _ = _engines_and_ranks(run)
    assert len(engines) == 1 and len(run.processes) == 2
    assert {"generate", "update_weights"} <= set(run.phases.loc[run.phases["pid"] == engines[0]["pid"], "name"])


def test_the_launcher_leaves_nothing_in_the_temp_dir(tmp_path):
    """torchrun alone leaves a torchelastic_* directory in $TMPDIR on every run; trainer.launch keeps its logs
    in its own temporary directory, removed when it ends."""
    script, tmp = tmp_path / "hello.py", tmp_path / "tmp"
    script.write_text("import os\nprint('rank', os.environ['RANK'])\n")
    tmp.mkdir()
    result = subprocess.run([sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "1",
                             str(script)], cwd=REPO, env=dict(python_env(), TMPDIR=str(tmp)), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "rank 0" in result.stdout, result.stderr[-2000:]
    assert list(tmp.iterdir()) == []
