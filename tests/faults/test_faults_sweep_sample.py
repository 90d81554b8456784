"""A short sample of the damaged-input sweep (tests/faults/sweep.py, issue 33): the full sweep of 1,000+
inputs is `python -m tests.faults.sweep` (minutes; its counts are in docs/reliability.md). This sample
damages a one-process run, its stacks snapshot, a Miles dump, a Miles CPU CSV and the calibration cache,
a few inputs each, with a fixed seed, and wants no traceback, hang, internal error, silent PASS or
false FAIL."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~25 CPU-s: one recorded run, four baselines and a dozen damaged reports
def test_a_sample_of_the_sweep_finds_nothing(tmp_path):
    out = tmp_path / "sweep.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "tests.faults.sweep", "--count", "10", "--seed", "7",
                           "--kinds", "one,stacks,miles,miles_csv,cache", "--jobs", "2", "--timeout", "120",
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    result = json.loads(out.read_text())
    assert result["inputs"] >= 10, done.stdout + done.stderr
    assert done.returncode == 0, json.dumps(result["examples"], indent=1)[-4000:]
