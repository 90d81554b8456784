"""scripts/ray_gpu.sh, the GPU machine's Ray run, in its CPU mode: the same script starts its own Ray
head node, runs the recorded trainer with --launcher ray (2 ranks, critics and engines as actors), writes
the run tarred and a summary, and stops the cluster by its pids. RAY_SHIP empty: the ray of this
environment instead of the carried one (scripts/ray_pack.sh needs the network; its install path was run
by hand, docs/ray.md)."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import python_env

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_ray_gpu_script_cpu_mode_records_every_actor_and_leaves_nothing(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "out"
    env = dict(python_env(), RAY_SHIP="", PYTHON=sys.executable)
    done = subprocess.run(["bash", "scripts/ray_gpu.sh", str(out), "--cpu"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert sorted(p.name for p in out.iterdir()) == ["install.log", "logs.tar.gz", "ray_start.log", "summary.json",
                                                     "train.log"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["left_running"] == [] and "error" not in summary
    run = summary["runs"]["critic"]
    roles = sorted((p["role"], p["rank"], p["ray_actor_class"]) for p in run["processes"] if p["role"] != "exec_parent")
    assert roles == [("actor", 0, "RankActor"), ("actor", 1, "RankActor"), ("critic", 0, "CriticActor"),
                     ("critic", 1, "CriticActor"), ("engine", 0, None), ("engine", 1, None)]
    assert {f["status"] for f in run["offload_drop"]} <= {"pass", "n/a"} and run["offload_drop"]
    assert [n["state"] for n in run["cluster"]["nodes"]] == ["stopped"]
    with tarfile.open(out / "logs.tar.gz") as tar:  # the run, flat: every recorded process's meta in it
        metas = [n for n in tar.getnames() if n.endswith(".meta.json")]
    assert len(metas) == len(run["processes"]) and all(n.startswith(f"critic/{run['run_dir']}/") for n in metas)
