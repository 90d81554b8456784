"""visualize end to end on logs written by the real recorder: verdicts, exit codes, exports, comparison."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, python_env
from miles_profile.visualize import main

# A program with a real recorder: "generate" fills a buffer, "offload_rollout" claims to free it.
# MODE good: freed inside the offload; late: freed after the offload returned; never: not freed.
PROGRAM = textwrap.dedent("""
    import sys, time
    import miles_profile as mp
    log_dir, mode, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    MiB = 1024 ** 2
    with mp.Recorder(log_dir, interval_ms=10, heap=True):  # the heap tells a kept reference from glibc retention
        for k in range(rounds):
            with mp.phase("generate", rollout_id=k):
                kv = bytearray(192 * MiB)
                time.sleep(0.1)
            with mp.phase("offload_rollout", rollout_id=k, tags=["kv_cache"], expected_bytes=len(kv)):
                if mode == "good":
                    del kv
            time.sleep(0.1)
            kv = None  # "late" and "never" free here, after the phase returned ...
            if mode == "never":
                hold = bytearray(192 * MiB)  # ... and "never" takes it right back
            with mp.phase("train", rollout_id=k):
                time.sleep(0.1)
            if mode == "never":
                del hold
        mp.mark("done")
""")


def record(tmp_path: Path, mode: str, rounds: int = 2) -> Path:
    log_dir = tmp_path / f"logs-{mode}"
    subprocess.run([sys.executable, "-c", PROGRAM, str(log_dir), mode, str(rounds)], check=True,
                   env=python_env(), cwd=REPO, timeout=120)
    return log_dir


def visualize(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "miles_profile.visualize", *args], capture_output=True,
                          text=True, env=python_env(), cwd=REPO, timeout=120)


def test_offloads_that_drop_pass_with_exit_0(tmp_path):
    logs = record(tmp_path, "good", rounds=3)
    out = tmp_path / "report.html"
    result = visualize(str(logs), "-o", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS  offload_drop" in result.stdout
    assert f"report written to {out}" in result.stdout
    html = out.read_text()
    # Offline: plotly.js is inlined, nothing is fetched (the browser test also blocks the network).
    assert not re.search(r"<script[^>]*\bsrc=", html) and "<link" not in html
    assert "Plotly.newPlot" in html
    assert 'id="checks"' in html and 'id="timeline-0"' in html and 'id="phases"' in html


def test_an_offload_that_frees_only_after_returning_fails_with_exit_1(tmp_path):
    logs = record(tmp_path, "late")
    result = visualize(str(logs), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL  offload_drop" in result.stdout
    assert "only after the phase ended" in result.stdout


def test_an_offload_that_never_drops_fails_with_exit_1(tmp_path):
    logs = record(tmp_path, "never")
    result = visualize(str(logs), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL  offload_drop" in result.stdout


def test_no_check_exits_0_even_for_a_failing_log(tmp_path):
    logs = record(tmp_path, "never", rounds=1)
    assert main([str(logs), "-o", str(tmp_path / "r.html"), "--no-check"]) == 0


def test_several_runs_are_compared_by_phase(tmp_path, capsys):
    good, late = record(tmp_path, "good"), record(tmp_path, "late")
    out = tmp_path / "cmp.html"
    code = main([str(good), "--compare", str(late), "-o", str(out)])
    assert code == 1  # the late run fails its offload check
    html = out.read_text()
    assert 'id="comparison-figure"' in html and 'id="comparison-table"' in html
    assert html.count('class="run"') == 2
    assert "0:generate" in html  # aligned slots are labelled (iteration:phase)


def test_exports_trace_csv_json(tmp_path):
    logs = record(tmp_path, "good")
    trace, table, data = tmp_path / "t.json", tmp_path / "p.csv", tmp_path / "c.json"
    assert main([str(logs), "-o", str(tmp_path / "r.html"), "--trace", str(trace), "--csv", str(table),
                 "--json", str(data)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in slices} == {"generate", "offload_rollout", "train"}
    assert all(e["dur"] >= 0 and "pid" in e and "tid" in e for e in slices)
    assert counters and all(isinstance(e["args"]["GiB"], float) for e in counters)
    assert any(e["ph"] == "i" and "done" in e["name"] for e in events)
    lines = table.read_text().splitlines()
    assert lines[0].startswith("run,iteration,name,count,total_s,mean_s,rss_floor")
    assert any(",all,generate," in line for line in lines) and any(",1,train," in line for line in lines)
    checks = json.loads(data.read_text())["runs"][0]["checks"]
    assert {c["name"]: c["status"] for c in checks}["offload_drop"] == "pass"


def test_threshold_override_and_bad_threshold(tmp_path, capsys):
    logs = record(tmp_path, "good", rounds=1)
    # Asking for more than was expected makes a good offload fail.
    assert main([str(logs), "-o", str(tmp_path / "r.html"), "--threshold", "offload_min_drop_share=1.5"]) == 1
    assert main([str(logs), "--threshold", "nonsense=1"]) == 2
    assert "unknown threshold" in capsys.readouterr().err


def test_miles_cpu_profiler_csv_is_visualized(tmp_path):
    csv = tmp_path / "cpu_memory_profile.csv"
    csv.write_text("time_s,used_gb,available_gb,percent,marker\n"
                   "0.0,10.0,50.0,16.7,\n0.5,10.1,49.9,16.8,step_0/generate_start\n1.0,30.0,30.0,50.0,\n"
                   "1.5,30.2,29.8,50.3,step_0/generate_end;step_0/offload_rollout_start\n"
                   "2.0,11.0,49.0,18.3,step_0/offload_rollout_end;step_0/train_start\n"
                   "2.5,20.0,40.0,33.3,\n3.0,20.0,40.0,33.3,step_0/train_end;saved\n")
    result = visualize(str(csv))
    assert result.returncode == 0, result.stdout + result.stderr
    html = (tmp_path / "cpu_memory_profile.report.html").read_text()
    assert "host used memory (Miles CPU profiler)" in html
    for phase in ("generate", "offload_rollout", "train"):
        assert f"{phase}</td>" in html
