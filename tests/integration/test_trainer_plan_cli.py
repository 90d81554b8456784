"""`python -m trainer.train --plan` and the stored forecast, as real processes and files."""
from __future__ import annotations

import json
import subprocess
import sys

import miles_profile as mp
from tests.conftest import REPO, python_env

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


def test_plan_with_bad_flags_is_one_line_and_exit_2():
    result = _run(["-m", "trainer.train", "--plan", "--preset", "gpu", "--colocate-memory-peak-device", "gpu"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "needs --offload-train" in result.stderr


def test_record_stores_the_plan_and_the_report_lists_a_wrong_one(tmp_path):
    rec = _run(["-m", "miles_profile.record", "--log-dir", str(tmp_path), "--", "--preset", "tiny",
                "--num-rollout", "1", "--offload-train", "--offload-rollout"])
    assert rec.returncode == 0, rec.stderr
    run_dir = next(tmp_path.glob("run-*"))
    meta_path = next(p for p in run_dir.glob("*.meta.json") if p.name != "meta.json")
    meta = json.loads(meta_path.read_text())
    plan = meta["annotations"]["forecast"]
    assert plan["device"] == "cpu" and plan["assumptions"]["num_params"] > 0
    stored = {p["phase"] for p in plan["phases"]}
    recorded = set(mp.load(run_dir).phases["name"])
    assert stored == recorded  # the plan names exactly the phases the run went through

    # A plan that forecasts 2 GiB for the train peak: the CLI and the HTML both name that phase.
    for p in plan["phases"]:
        if p["phase"] == "train":
            p["peak"] = p["allocator"] = 2 * 1024**3
    meta_path.write_text(json.dumps(meta))
    out = tmp_path / "r.html"
    vis = _run(["-m", "miles_profile.visualize", str(run_dir), "-o", str(out), "--no-check"])
    assert vis.returncode == 0, vis.stderr
    listed = [line for line in vis.stdout.splitlines() if "forecast outside 5%: train on host" in line]
    assert len(listed) == 1
    error = float(listed[0].rsplit("error ", 1)[1].rstrip("%"))
    assert error > 300  # the wrong plan, not the RSS noise of a tiny CPU run (which reads low, never high)
    page = out.read_text()
    assert 'id="forecast"' in page and 'id="forecast-outside"' in page
    outside = page.split('id="forecast-outside"')[1].split("</div>")[0]
    assert "<li>train on host" in outside
