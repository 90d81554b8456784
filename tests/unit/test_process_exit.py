"""exit_now: the code comes out, our threads' work is finished, buffered output is not lost."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO, python_env

PROGRAM = """
import sys, threading, time
from pathlib import Path
from miles_profile.process_exit import exit_now
def later():
    time.sleep(0.3)
    Path(sys.argv[1]).write_text("written")
threading.Thread(target=later).start()
print("buffered line", end="")  # no newline, stdout a pipe: still in the buffer
exit_now(3)
"""


def test_exit_now_keeps_the_code_waits_for_our_threads_and_flushes(tmp_path):
    marker = tmp_path / "marker"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(marker)], cwd=REPO, env=python_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered line"
    assert marker.read_text() == "written"
