"""Start the dashboard in a child process on a free port and wait until it answers (tests, benchmark)."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def dashboard_process(log_dir: str | os.PathLike, poll_ms: int = 1000, timeout_s: float = 30.0,
                      stderr=None, args: Sequence[str] = (),
                      python_args: Sequence[str] = ("-m", "dashboards")) -> Iterator[str]:
    """`python -m dashboards log_dir [args]` on a free port; yields its URL; stops it on exit.
    `python_args`: what runs instead of `-m dashboards` (a benchmark's variant of it)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    child = subprocess.Popen(
        [sys.executable, *python_args, str(log_dir), "--port", str(port), "--poll-ms", str(poll_ms), *args],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"dashboard exited with code {child.returncode}")
            try:
                with urllib.request.urlopen(url + "_dash-layout", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("dashboard did not answer") from None
                time.sleep(0.1)
        yield url
    finally:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
