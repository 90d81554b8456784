"""record --stacks on this CPU machine: a real `record --stacks --exec` run says in one line that stacks
need CUDA and records on; and a real run carrying a snapshot beside its log (written in PyTorch's format,
since no CUDA snapshot can be made here) reaches the HTML report, --json and the dashboard panel."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from miles_profile import Recorder, phase
from miles_profile.logdir.reader import load_run
from miles_profile.runmodel.stacks import MEMORY_VIZ_URL, stacks_of
from miles_profile.stacks import NO_CUDA_NOTICE
from tests.conftest import REPO, python_env

MiB = 1024 ** 2
PROGRAM = textwrap.dedent("""
    import torch
    import miles_profile as mp
    for i in range(3):
        with mp.phase("train", rollout_id=i):
            x = torch.ones(1 << 20)
        with mp.phase("offload_train", rollout_id=i):
            del x
    print("job done", flush=True)
""")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA notice needs a machine without CUDA")
def test_record_stacks_without_cuda_is_one_line_and_the_run_goes_on(tmp_path):
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--stacks",
                           "--stacks-max-entries", "5000", "--exec", "--", sys.executable, "-c", PROGRAM],
                          cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "job done" in done.stdout and "Traceback" not in done.stderr
    assert done.stderr.count(NO_CUDA_NOTICE) == 1, done.stderr
    run_dir = next(tmp_path.glob("run-*"))
    run = load_run(run_dir)
    assert len(run.phases) == 6 and not list(run_dir.glob("*.stacks.pickle"))
    (found,) = stacks_of(run)
    assert (found.status, found.rule, found.reason) == ("not_recorded", "peak", "no CUDA in this process")
    out = tmp_path / "report.json"
    shown = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run_dir), "--json", str(out),
                            "-o", str(tmp_path / "report.html")], cwd=REPO, env=python_env(),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    (record,) = json.loads(out.read_text())["runs"][0]["stacks"]
    assert record["status"] == "not_recorded" and record["open_with"] is None
    assert "Stacks not recorded: no CUDA in this process." in (tmp_path / "report.html").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA notice needs a machine without CUDA")
def test_recorder_stacks_without_cuda_in_process(tmp_path, capfd):
    """Recorder(stacks=...) in code: the same one line at the first phase (torch is imported, CUDA is not)."""
    with Recorder(tmp_path, interval_ms=20, stacks="train") as rec:
        with phase("generate"):
            pass
        assert capfd.readouterr().err.count(NO_CUDA_NOTICE) == 1
        with phase("train"):
            pass
    assert NO_CUDA_NOTICE not in capfd.readouterr().err  # said once
    (found,) = stacks_of(load_run(rec.run_dir))
    assert (found.status, found.rule, found.reason) == ("not_recorded", "named", "no CUDA in this process")


def test_record_refuses_a_bad_max_entries(tmp_path):
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--stacks",
                           "--stacks-max-entries", "0", "--exec", "--", "true"], cwd=REPO, env=python_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "a positive integer" in done.stderr and "Traceback" not in done.stderr


def _snapshot(here: str, line: int) -> dict:
    frames = [{"filename": "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py", "line": 10, "name": "f"},
              {"filename": here, "line": line, "name": "train_step"}]
    trace = [{"action": "alloc", "addr": 4096, "size": 64 * MiB, "stream": 0, "frames": frames},
             {"action": "free_requested", "addr": 4096, "size": 64 * MiB, "stream": 0, "frames": frames},
             {"action": "free_completed", "addr": 4096, "size": 64 * MiB, "stream": 0, "frames": frames}]
    return {"segments": [{"device": 0, "address": 4096, "total_size": 64 * MiB, "blocks": [
        {"address": 4096, "size": 64 * MiB, "requested_size": 64 * MiB, "state": "inactive", "frames": []}]}],
        "device_traces": [trace]}


def record_run_with_snapshot(log_dir):
    """A real recorded run; its `stacks` event and pickle written as miles_profile/stacks.py writes them."""
    with Recorder(log_dir, interval_ms=20) as rec:
        with phase("train", rollout_id=0):
            pass
        with phase("train", rollout_id=1):
            pass
        phase_id = int(load_run(rec.run_dir).events.query("kind == 'begin'")["id"].iloc[-1])
        path = rec.run_dir / f"{rec._stem}.stacks.pickle"
        path.write_bytes(pickle.dumps(_snapshot("/home/u/train.py", 77)))
        rec.event("stacks", "stacks", {"status": "written", "phase": "train", "phase_id": phase_id, "rule": "peak",
                                       "file": path.name, "path": str(path), "max_entries": 100})
    return rec.run_dir


@pytest.fixture(scope="module")
def run_with_snapshot(tmp_path_factory):
    return record_run_with_snapshot(tmp_path_factory.mktemp("stacks-run"))


@pytest.mark.slow
def test_a_snapshot_reaches_the_report_json_and_dashboard(run_with_snapshot, tmp_path):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    shown = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run_with_snapshot), "--json", str(out),
                            "-o", str(page)], cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    (record,) = json.loads(out.read_text())["runs"][0]["stacks"]
    assert record["status"] == "written" and record["iteration"] == 1 and record["phase"] == "train"
    (device,) = record["devices"]
    (site,) = device["sites"]
    assert (site["site"], site["bytes"], site["count"]) == ("/home/u/train.py:77", 64 * MiB, 1)
    assert device["peak_bytes"] == 64 * MiB and device["end_bytes"] == 0
    assert MEMORY_VIZ_URL in record["open_with"] and record["path"].endswith(".stacks.pickle")
    text = page.read_text()
    assert "Which code made the peak" in text and "/home/u/train.py:77" in text and "train #1" in text
    from dashboards.panels.stacks import body
    shown = body(stacks_of(load_run(run_with_snapshot)))
    table = next(c for c in shown if getattr(c, "id", "") == "stacks-table-0-0")
    assert table.data[0]["site"] == "/home/u/train.py:77" and table.data[0]["mib"] == "64.0"
    assert body([]) == []


def test_a_snapshot_missing_from_the_log_is_said(run_with_snapshot, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(run_with_snapshot, copy, ignore=shutil.ignore_patterns("*.stacks.pickle"))
    (found,) = stacks_of(load_run(copy))
    assert found.status == "missing" and "not beside the log" in found.reason
