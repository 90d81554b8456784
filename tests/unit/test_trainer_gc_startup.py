"""A trainer process leaves torch's import-time objects out of the cyclic collector (trainer/gc_startup.py):
frozen once imported, the default thresholds back for what the run makes. So does `record` running the
trainer in its own process."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, python_env

# python -m MODULE ARGS, with what the collector saw printed at exit
ENTRY = """
import atexit, gc, json, runpy, sys
atexit.register(lambda: print(json.dumps({"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
                                          "full_collections": gc.get_stats()[2]["collections"]})))
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
TRAINER = ["--preset", "tiny", "--num-rollout", "2"]


@pytest.mark.parametrize("entry", ["trainer.train", "miles_profile.record"])
def test_a_trainer_process_freezes_its_imports_and_collects_at_the_default_thresholds_after(entry, tmp_path):
    args = TRAINER if entry == "trainer.train" else ["--log-dir", str(tmp_path), "--", *TRAINER]
    proc = subprocess.run([sys.executable, "-c", ENTRY, entry, *args], cwd=REPO,
                          env=python_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["frozen"] > 100_000, seen  # torch's modules, functions, operator schemas
    assert tuple(seen["threshold"]) == (700, 10, 10), seen
    # no full collection while torch loaded (three with the default thresholds): one per clear_memory only
    assert seen["full_collections"] <= 2, seen
