"""The recorder never outlives, stalls or misreports the job (issue 19, items 1, 2, 3, 6, 16).

Every job here is a real process: a watched directory of 50,000 real files, `record` killed with
SIGKILL while its child, torchrun, the ranks and their engine servers run, a disk-offload run killed
mid-offload, a run directory deleted mid-run, and `make demo` paths.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from miles_profile.probes.disk import INLINE_MAX_ENTRIES, DiskProbe
from tests.conftest import REPO, python_env

BIG_TREE_FILES = 50_000


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory) -> tuple[Path, int]:
    """50,000 files of 1 to 9 bytes in 100 directories, and their total size."""
    root = tmp_path_factory.mktemp("big_tree")
    total = 0
    for d in range(100):
        sub = root / f"d{d:03d}"
        sub.mkdir()
        for f in range(BIG_TREE_FILES // 100):
            size = 1 + (d + f) % 9
            fd = os.open(sub / f"f{f}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"x" * size)
            os.close(fd)
            total += size
    return root, total


def _record(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "miles_profile.record", *args], cwd=REPO, env=python_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


# -- item 1: a watched directory never blocks the job ------------------------------------------------
PHASES_JOB = """
import sys, time
import miles_profile as mp
watch = sys.argv[2:]
with mp.Recorder(sys.argv[1], interval_ms=20, watch_dirs=watch) as rec:
    start = time.monotonic()
    for i in range(40):
        with mp.phase("train", rollout_id=i):
            sum(range(20_000))  # some of the job's own Python work, which a walk would take the GIL from
    print("loop_s", time.monotonic() - start, flush=True)
"""


def _phases_loop_s(log_dir: Path, *watch: Path) -> float:
    done = subprocess.run([sys.executable, "-c", PHASES_JOB, str(log_dir), *map(str, watch)], cwd=REPO,
                          env=python_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


def test_watching_a_big_tree_does_not_slow_the_job(big_tree, tmp_path):
    root, _ = big_tree
    without = _phases_loop_s(tmp_path / "plain")
    watched = _phases_loop_s(tmp_path / "watched", root)
    # Today's main walked the 50,000 files at each of the 80 boundaries in the job's thread (~0.2 s each).
    assert watched < 3 * without + 1.0, (watched, without)
    (meta_path,) = [p for p in (tmp_path / "watched").glob("run-*/*.meta.json")]
    disk = next(p for p in json.loads(meta_path.read_text())["probes"] if p["name"] == "disk")
    assert disk["watched"][0]["mode"] == "background", disk  # the log says its readings are stale


def test_a_big_tree_is_read_off_the_readers_thread_then_exactly(big_tree):
    root, total = big_tree
    probe = DiskProbe((str(root),))
    try:
        start = time.monotonic()
        assert probe.read() == (None,)  # too big to walk here: skipped, never a partial sum
        assert time.monotonic() - start < 0.05
        deadline = time.monotonic() + 60
        while probe.read() == (None,) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert probe.read() == (total,)
        described = probe.describe()["watched"][0]
        assert described["mode"] == "background" and described["entries"] == BIG_TREE_FILES + 100
        assert described["skipped_reads"] >= 1 and described["stale_reads"] >= 1
    finally:
        probe.close()


def test_a_small_tree_is_still_read_exactly_at_each_boundary(tmp_path):
    for i in range(INLINE_MAX_ENTRIES // 2):
        (tmp_path / f"f{i}").write_bytes(b"x" * 3)
    probe = DiskProbe((str(tmp_path),))
    assert probe.read() == (3 * (INLINE_MAX_ENTRIES // 2),)
    (tmp_path / "more").write_bytes(b"y" * 5)
    assert probe.read() == (3 * (INLINE_MAX_ENTRIES // 2) + 5,)  # no stale value for a small dir
    assert probe.describe()["watched"][0]["mode"] == "inline"
    probe.close()
