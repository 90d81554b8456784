"""Processes of one program that no launcher numbered, recorded under a plain `record --exec`: an actor and a
reference model started by multiprocessing (each said "trainer rank 0": one lane, their memory summed, and
a verdict naming "trainer rank 0" twice), and data-parallel ranks started by torch.multiprocessing.spawn
(no RANK variable: each said rank 0 of a world of one)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.phase_table import phase_table
from miles_profile.verdicts.engine import judge
from tests.conftest import REPO

PROGRAM = REPO / "tests" / "corpus" / "class_programs.py"
pytestmark = pytest.mark.slow


def _recorded(tmp_path, mode: str):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(logs), "--exec", "--",
                           sys.executable, str(PROGRAM), mode], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = load_run(next(logs.glob("run-*")))
    return run, [p for p in run.processes if p.get("role") == "in_process"]


def test_an_actor_and_a_reference_process_are_named_apart_with_a_lane_each(tmp_path):
    run, metas = _recorded(tmp_path, "two_processes")
    by_name = {p.get("process_name") or "main": p for p in metas}
    assert set(by_name) == {"main", "reference"}, by_name
    table = phase_table(run)
    assert table.groupby("pid")["rank"].first().to_dict() == {p["pid"]: -1 for p in by_name.values()}
    leak = next(c for c in judge(run).checks if c.name == "leak")
    assert "1 process reference" in leak.summary and "1 trainer" in leak.summary, leak.summary
    assert any(f.message.startswith(f"process reference (pid {by_name['reference']['pid']},") for f in leak.findings)


def test_ranks_started_by_spawn_take_their_rank_from_torch_distributed(tmp_path):
    _, metas = _recorded(tmp_path, "spawn_ranks")
    assert sorted((p["rank"], p["world_size"]) for p in metas) == [(0, 2), (1, 2)], metas
    assert not any("process_name" in p for p in metas)  # the target is spawn's own wrapper: no name of the program's
