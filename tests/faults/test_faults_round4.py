"""Issue 33 (reliability round 4): the recorder never harms the job, a report never lies about broken
data. Each test builds the damaged input for real (files, links, FIFOs, a real HTTP server, real
processes) and failed before its fix."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.test_faults_files import make_run

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# -- item 3: a report.html link in a log dir someone sent you ----------------------------------------
@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_visualize_never_writes_through_a_link_or_into_a_fifo(tmp_path, kind):
    run = make_run(tmp_path / "logs")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    if kind == "link":
        (run / "report.html").symlink_to(victim)
    else:
        os.mkfifo(run / "report.html")
    done = cli("-m", "miles_profile.visualize", str(run), timeout=60)  # a FIFO hung here before
    line = one_line_error(done)
    assert "refusing to write" in line and str(run / "report.html") in line, line
    assert victim.read_text() == "precious"
    # an explicit --json link is refused too, and the report itself is still written
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "v.json").symlink_to(victim)
    done = cli("-m", "miles_profile.visualize", str(run), "-o", str(tmp_path / "out" / "r.html"),
               "--json", str(tmp_path / "out" / "v.json"))
    assert done.returncode == 2 and "refusing to write" in done.stderr and "Traceback" not in done.stderr
    assert victim.read_text() == "precious" and (tmp_path / "out" / "r.html").stat().st_size > 0
