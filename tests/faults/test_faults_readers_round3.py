"""Issue 19 (items 4, 5, 7-13, 15): no input hangs or crashes a reader, and nothing is lost without a
word. Each test builds a damaged run for real (files, a full tmpfs, FIFOs, sparse files) and reads it
with the real reader or CLI, in a child process with a timeout where a hang is possible."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import miles_profile as mp
from miles_profile.logdir.reader import load_run
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta
from tests.faults.test_faults_files import child, make_run
from tests.faults.test_faults_recorder import IN_PROCESS_JOB, run_job, small_disk  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


# -- item 4: a full disk ----------------------------------------------------------------------------
def test_a_full_disk_run_says_the_log_is_incomplete_and_how_much_was_lost(small_disk):
    done = run_job(IN_PROCESS_JOB, str(small_disk.path), "full", disk=small_disk)
    assert done.returncode == 7, done.stderr
    run_dir = Path(done.stdout.splitlines()[0])
    run = load_run(run_dir)
    lost = [w for w in run.warnings if "the log is incomplete" in w]
    assert len(lost) == 1, run.warnings
    assert "sample rows" in lost[0] and " 0 sample rows and 0 events" not in lost[0]
    process = run.processes[0]
    assert process["end_time"] and process["dropped"]["samples"] + process["dropped"]["events"] > 0
