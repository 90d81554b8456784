"""A new user's first hour (issue 35): the mistakes the README's quick start invites get one line that
says what to do."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO, python_env


def test_record_without_exec_says_add_exec_and_makes_no_run(tmp_path):
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(logs), "--",
                           "my_script.py", "--lr", "1e-4"],
                          cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "add --exec" in lines[0], done.stderr
    assert "record --exec -- python my_script.py --lr 1e-4" in lines[0]
    assert "Traceback" not in done.stderr and "unrecognized arguments" not in done.stderr
    assert not logs.exists() or not any(logs.iterdir())
