"""For benchmarks that measure the recorder as a user's trainer meets it: the script runs itself again as the
child of `record --exec`. No torch here: the parent only launches."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile


def rerun_under_record(script: str, prefix: str, argv: list[str] | None) -> int | None:
    """Run `script` again under `record --exec` (with --in-process) and return its exit code; None when this
    process is already recorded (it then measures)."""
    if "MILES_PROFILE_RUN_DIR" in os.environ:
        return None
    logs = tempfile.mkdtemp(prefix=prefix)
    try:
        argv = sys.argv[1:] if argv is None else argv
        return subprocess.call([sys.executable, "-m", "miles_profile.record", "--log-dir", logs, "--exec", "--",
                                sys.executable, os.path.abspath(script), "--in-process", *argv])
    finally:
        shutil.rmtree(logs, ignore_errors=True)
