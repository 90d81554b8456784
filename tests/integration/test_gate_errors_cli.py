"""Gates that never silently pass, as a user meets them on the command line: a --phase matching none of
a run's phases, a --baseline that shares nothing with the run, a malformed --baseline-threshold each
exit 2 with one line and no traceback; a reader that stops reading (`| head`) leaves the exit code the
verdict's; the HTML header and --json say what the exit code says."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, python_env

CPU = REPO / "sample_logs" / "cpu"
H200 = REPO / "sample_logs" / "h200" / "4-both"
PREFIX = "miles_profile.visualize: error: "


def visualize(*args, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "miles_profile.visualize", *map(str, args)], env=python_env(),
                          cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120, check=False)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), done.stderr
    return lines[0]


def test_a_phase_selection_matching_nothing_exits_2_naming_the_recorded_phases(tmp_path):
    line = one_line_error(visualize(CPU, "--phase", "trian*", "-o", tmp_path / "r.html"))
    assert "--phase trian* matches none of the phases this run recorded" in line
    assert "offload_train" in line and "generate" in line
    assert not (tmp_path / "r.html").exists()  # refused before any work


def _eval_only_run(run_dir) -> None:
    """A finished one-process run whose only phase is `eval`: the CPU log never opened one."""
    run_dir.mkdir(parents=True)
    start = 1_700_000_000.0
    (run_dir / "meta.json").write_text(json.dumps({"format_version": 1, "start_time": start,
                                                   "command": ["synthetic"], "interval_ms": 10.0}))
    (run_dir / "h-7.meta.json").write_text(json.dumps({"format_version": 1, "pid": 7, "role": "in_process",
                                                       "start_time": start, "end_time": start + 1}))
    rows = "".join(f"{start + k / 10:.3f},,{1 << 30},{1 << 30}\n" for k in range(10))
    (run_dir / "h-7.samples.csv").write_text("t,phase,rss,rss_peak\n" + rows)
    events = [{"t": start + 0.2, "kind": "begin", "name": "eval", "pid": 7, "id": 1, "attrs": {}},
              {"t": start + 0.6, "kind": "end", "name": "eval", "pid": 7, "id": 1, "attrs": {"status": "ok"}}]
    (run_dir / "h-7.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_a_baseline_sharing_nothing_exits_2(tmp_path):
    """A baseline with none of the run's phases: the old gate said n/a and exited 0."""
    _eval_only_run(tmp_path / "eval-only")
    line = one_line_error(visualize(CPU, "--baseline", tmp_path / "eval-only", "-o", tmp_path / "r.html"))
    assert "shares no measured phase, GPU or process" in line and "nothing to compare" in line


@pytest.mark.parametrize("text", ["5%,lots", "0.05", "5%,5%", "5%,1GiB,3", "banana"])
def test_a_malformed_threshold_exits_2(tmp_path, text):
    line = one_line_error(visualize(CPU, "--baseline", CPU, "--baseline-threshold", text, "-o", tmp_path / "r.html"))
    assert f"--baseline-threshold {text!r}" in line


def test_a_closed_stdout_keeps_the_verdicts_exit_code(tmp_path):
    """`visualize D | head`: the reader has gone (here before the first line: a pipe whose read end is
    closed, so every write fails); the exit code is still the verdict's, without a word on stderr."""
    expected = visualize(CPU, "-o", tmp_path / "a.html", "--json", tmp_path / "a.json")
    assert expected.returncode in (0, 1)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = visualize(CPU, "-o", tmp_path / "b.html", stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == expected.returncode, done.stderr
    assert done.stderr == ""
    assert json.loads((tmp_path / "a.json").read_text())["exit_code"] == expected.returncode


def test_header_json_and_exit_code_agree_under_a_threshold_that_fails_the_gate(tmp_path):
    """--no-check leaves only the gate: 5%,0 against a copy raised 10% fails, and every view says so."""
    from tests.synthetic_regression import raise_phase
    raised = raise_phase(CPU, tmp_path / "raised", "train")
    done = visualize(raised, "--no-check", "--baseline", CPU, "--baseline-threshold", "5%,0",
                     "-o", tmp_path / "r.html", "--json", tmp_path / "r.json")
    assert done.returncode == 1, done.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["status"] == "fail" and data["exit_code"] == 1 and data["runs"][0]["checks"] == []
    assert 'id="overall" data-status="fail">FAIL' in (tmp_path / "r.html").read_text()
