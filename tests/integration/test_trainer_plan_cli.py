"""`python -m trainer.train --plan` and the stored forecast, as real processes and files."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import miles_profile as mp
from miles_profile.runmodel.forecast import compare, stored_plan
from tests.conftest import REPO, python_env
from miles_profile.runmodel.replan import plan_for_run

H200_CRITIC = ["--preset", "gpu", "--device", "cuda", "--num-rollout", "3", "--offload-train", "--offload-rollout",
               "--use-critic"]

# Runs --plan in a fresh interpreter, then reports what it left behind: the peak RSS of this process
# image (VmHWM), whether CUDA was initialised, and the largest tensor still alive.
_PROBE = """
import gc, json, sys, torch
from trainer.train import main
code = main(sys.argv[1:])
hwm = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:'))
largest = max((o.nbytes for o in gc.get_objects() if isinstance(o, torch.Tensor)), default=0)
print(json.dumps({"code": code, "hwm": hwm, "cuda": torch.cuda.is_initialized(), "largest": largest}))
"""


def _run(argv: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=python_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_plan_prints_every_phase_and_exits_0():
    result = _run(["-m", "trainer.train", "--plan", *H200_CRITIC])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("forecast for cuda: policy 1108.0M params, critic 1108.0M")
    phases = {(line.split()[0], line.split()[1]) for line in lines[2:-1]}
    for phase in ("offload_train", "update_weights", "generate", "offload_rollout", "onload_train", "train",
                  "onload_weights", "onload_kv"):
        assert (phase, "cuda") in phases and (phase, "host") in phases
    train = next(line for line in lines if line.startswith("train ") and " cuda " in line)
    assert 38 < float(train.split()[2]) < 41 and "activations" in train  # both models' state and activations
    assert not any(line.startswith("rollout ") for line in lines)  # no training happened


def test_plan_allocates_nothing():
    result = _run(["-c", _PROBE, "--plan", *H200_CRITIC])
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.splitlines()[-1])
    assert facts["code"] == 0 and facts["cuda"] is False
    assert facts["largest"] < 1024**2  # the configuration's training state alone is 33 GiB
    assert facts["hwm"] < 1024**3, facts  # an interpreter with torch imported, nothing of the model


def test_record_with_plan_prints_it_and_records_nothing(tmp_path):
    result = _run(["-m", "miles_profile.record", "--log-dir", str(tmp_path), "--", "--plan", *H200_CRITIC])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("forecast for cuda:") and list(tmp_path.iterdir()) == []


def test_plan_with_bad_flags_is_one_line_and_exit_2():
    result = _run(["-m", "trainer.train", "--plan", "--preset", "gpu", "--colocate-memory-peak-device", "gpu"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "needs --offload-train" in result.stderr


def test_record_stores_the_plan_of_the_phases_it_ran(tmp_path):
    rec = _run(["-m", "miles_profile.record", "--log-dir", str(tmp_path), "--", "--preset", "tiny",
                "--num-rollout", "1", "--offload-train", "--offload-rollout"])
    assert rec.returncode == 0, rec.stderr
    run = mp.load(next(tmp_path.glob("run-*")))
    found = stored_plan(run)
    assert found is not None
    pids, plan = found
    assert plan["device"] == "cpu" and plan["assumptions"]["num_params"] > 0
    assert pids == {"trainer": int(run.processes[0]["pid"])}
    assert {p["phase"] for p in plan["phases"]} == set(run.phases["name"])  # exactly the phases it went through
    # a CPU run has no allocator: its host rows are shown beside RSS growth, never judged
    comparison = compare(run, plan, pids)
    assert set(comparison["basis"]) == {"rss_growth"} and not comparison["judged"].any()


def _with_plan(tmp_path, source: str, scale_train: float):
    """A copy of a real H200 log whose trainer meta carries the plan of its flags, train's scaled."""
    run_dir = tmp_path / "run"
    shutil.copytree(REPO / source, run_dir)
    pids, plan = plan_for_run(mp.load(run_dir))
    for p in plan["phases"]:
        if p["phase"] == "train" and p["device"] == "cuda":
            p["allocator"] = int(p["allocator"] * scale_train)
    meta_path = run_dir / f"vm-{pids['trainer']}.meta.json"
    meta = json.loads(meta_path.read_text())
    meta.setdefault("annotations", {})["forecast"] = plan
    meta_path.write_text(json.dumps(meta))
    return run_dir


def _visualize(run_dir, out) -> subprocess.CompletedProcess:
    return _run(["-m", "miles_profile.visualize", str(run_dir), "-o", str(out), "--no-check"])


def test_the_report_shows_the_forecast_and_lists_a_wrong_one(tmp_path):
    good = _with_plan(tmp_path / "good", "sample_logs/h200/4-both", 1.0)
    vis = _visualize(good, tmp_path / "good.html")
    assert vis.returncode == 0, vis.stderr
    assert "forecast outside" not in vis.stdout
    page = (tmp_path / "good.html").read_text()
    assert 'id="forecast"' in page and 'id="forecast-outside"' not in page
    assert "Every judged phase (8) within 5%" in page

    bad = _with_plan(tmp_path / "bad", "sample_logs/h200/4-both", 1.2)  # 4 GiB of activations too many
    vis = _visualize(bad, tmp_path / "bad.html")
    assert vis.returncode == 0, vis.stderr
    listed = [line for line in vis.stdout.splitlines() if "forecast outside 5%" in line]
    assert len(listed) == 1 and "train on cuda" in listed[0] and "error +20" in listed[0]
    page = (tmp_path / "bad.html").read_text()
    outside = page.split('id="forecast-outside"')[1].split("</div>")[0]
    assert outside.count("<li>") == 1 and "<li>train on cuda" in outside
