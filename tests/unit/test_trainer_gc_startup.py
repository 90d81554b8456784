"""A trainer process leaves torch's import-time objects out of the cyclic collector (trainer/gc_startup.py):
frozen once imported, the default thresholds back for what the run makes."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO, python_env

# python -m trainer.train, with what the collector saw printed at exit
ENTRY = """
import atexit, gc, json, runpy, sys
atexit.register(lambda: print(json.dumps({"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
                                          "full_collections": gc.get_stats()[2]["collections"]})))
sys.argv = ["trainer.train", *sys.argv[1:]]
runpy.run_module("trainer.train", run_name="__main__", alter_sys=True)
"""


def test_a_trainer_process_freezes_its_imports_and_collects_at_the_default_thresholds_after():
    proc = subprocess.run([sys.executable, "-c", ENTRY, "--preset", "tiny", "--num-rollout", "2"], cwd=REPO,
                          env=python_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["frozen"] > 100_000, seen  # torch's modules, functions, operator schemas
    assert tuple(seen["threshold"]) == (700, 10, 10), seen
    # no full collection while torch loaded (three with the default thresholds): one per clear_memory only
    assert seen["full_collections"] <= 2, seen
