"""visualize --baseline and --phase end to end (real logs, a real `record` process, the CLI as a user
runs it): exit codes, the lines printed, the report's baseline table, the recorded default selection."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, python_env
from tests.synthetic_regression import raise_phase

H200 = REPO / "sample_logs" / "h200" / "4-both"


def visualize(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "miles_profile.visualize", *map(str, args)], env=python_env(),
                          capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.slow
def test_baseline_gate_exits_1_naming_phases_and_gpus_and_0_when_unchanged(tmp_path):
    raised = raise_phase(H200, tmp_path / "raised", "train")
    same = shutil.copytree(H200, tmp_path / "same")
    failed = visualize(raised, "--baseline", H200, "-o", tmp_path / "r1.html", "--json", tmp_path / "r1.json")
    assert failed.returncode == 1, failed.stderr
    gate = json.loads((tmp_path / "r1.json").read_text())["runs"][0]["baseline"]  # CI reads why
    assert gate["status"] == "fail" and gate["thresholds"] == "5% and 256.0 MiB"
    grown = [c for c in gate["compared"] if c["regressed"]]
    assert grown and {c["phase"] for c in grown} == {"train"}
    assert all(c["growth"] == c["current"] - c["baseline"] > 0 for c in grown)
    verdict = [line for line in failed.stdout.splitlines() if "baseline" in line and "FAIL" in line]
    assert len(verdict) == 1 and "phases train; GPUs vm:gpu0" in verdict[0]
    assert "regressed: train: GPU own (proc) peak of trainer rank 0 on vm:gpu0" in failed.stdout
    html = (tmp_path / "r1.html").read_text()
    assert 'id="baseline"' in html and "table class=\"data baseline\"" in html and html.count("+10.0%") == 6  # device used, own NVML, RSS: peak and floor

    passed = visualize(same, "--baseline", H200, "-o", tmp_path / "r2.html")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "PASS  baseline  48 values within 5% and 256.0 MiB" in passed.stdout
    # a threshold above the 10% lets the raised run through
    loose = visualize(raised, "--baseline", H200, "--baseline-threshold", "11%,256MiB", "-o", tmp_path / "r3.html")
    assert loose.returncode == 0, loose.stdout


def test_a_gate_limited_to_unraised_phases_passes(tmp_path):
    raised = raise_phase(H200, tmp_path / "raised", "train")
    result = visualize(raised, "--baseline", H200, "--phase", "rollout", "-o", tmp_path / "r.html")
    assert result.returncode == 0, result.stdout
    assert "phases not selected (--phase): offload_train, onload_train, train" in result.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, message in [(["--phase", "trian"], "unknown phase 'trian' in --phase; known: offload, onload"),
                          (["--baseline", tmp_path / "none"], "no such file or directory"),
                          (["--baseline", H200, "--baseline-threshold", "5%,lots"], "not a size: 'lots'")]:
        result = visualize(H200, *args, "-o", tmp_path / "r.html")
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


PROGRAM = textwrap.dedent("""
    import miles_profile as mp
    for k in range(2):
        with mp.phase("generate", rollout_id=k):
            pass
        with mp.phase("offload_kv", rollout_id=k, expected_bytes=0):
            pass
        with mp.phase("train", rollout_id=k):
            pass
""")


def test_record_phase_is_stored_and_is_the_reports_default(tmp_path):
    logs = tmp_path / "logs"
    recorded = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", logs, "--phase", "offload",
                               "--exec", "--", sys.executable, "-c", PROGRAM], env=python_env(),
                              capture_output=True, text=True, timeout=120)
    assert recorded.returncode == 0, recorded.stderr
    (run_dir,) = logs.iterdir()
    assert json.loads((run_dir / "meta.json").read_text())["phase_selection"] == "offload"
    default = visualize(run_dir, "-o", tmp_path / "r.html")
    assert "phases not selected (--phase offload), neither shown nor judged: generate, train" in default.stdout
    everything = visualize(run_dir, "--phase", "all", "-o", tmp_path / "r.html")
    assert "not selected" not in everything.stdout
    refused = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", logs, "--phase", "bogus",
                              "--exec", "--", "true"], env=python_env(), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unknown phase 'bogus'" in refused.stderr
    assert len(list(logs.iterdir())) == 1  # refused before a run directory was made
