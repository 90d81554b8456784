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
import time
from pathlib import Path

import psutil
import pytest

from miles_profile.probes.disk import INLINE_MAX_ENTRIES, DiskProbe
from tests.conftest import REPO, python_env

BIG_TREE_FILES = 10_000  # 40 times INLINE_MAX_ENTRIES: an inline walk at each boundary costs the job seconds


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory) -> tuple[Path, int]:
    """BIG_TREE_FILES files of 1 to 9 bytes in 100 directories, and their total size."""
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
    done = subprocess.run([sys.executable, "-c", PHASES_JOB, str(log_dir), *map(str, watch)], cwd=REPO, check=False,
                          env=python_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


def test_watching_a_big_tree_does_not_slow_the_job(big_tree, tmp_path):
    root, _ = big_tree
    without = _phases_loop_s(tmp_path / "plain")
    watched = _phases_loop_s(tmp_path / "watched", root)
    # The walk at each of the 80 boundaries in the job's thread (before 2026-11): 10,000 files, ~0.04 s each.
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


# -- item 2: children die with their recorder ---------------------------------------------------------
def _alive(processes: list[psutil.Process]) -> list[str]:
    alive = []
    for p in processes:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.pid} {' '.join(p.cmdline()[:4])}")
        except psutil.NoSuchProcess:
            pass
    return alive


def _descendants_once(parent: subprocess.Popen, count: int, timeout: float = 240) -> list[psutil.Process]:
    """`parent`'s descendants once there are `count` of them (torchrun, its ranks, their engines)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = psutil.Process(parent.pid).children(recursive=True)
        if len(found) >= count:
            return found
        assert parent.poll() is None, parent.stderr.read()
        time.sleep(0.2)
    pytest.fail(f"never {count} descendants of {parent.args}")


def _kill_all(processes: list[psutil.Process]) -> None:
    for p in processes:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _all_gone_within(processes: list[psutil.Process], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while _alive(processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive(processes)


def test_kill_9_of_record_ends_its_exec_child(tmp_path):
    record = _record("--log-dir", str(tmp_path), "--exec", "--", sys.executable, "-c", "import time; time.sleep(120)")
    children = _descendants_once(record, 1)
    try:
        os.kill(record.pid, signal.SIGKILL)
        record.wait(10)
        assert _all_gone_within(children, 5) == []
    finally:
        _kill_all(children)


DIST = ["--", "--nproc-per-node", "2", "--preset", "tiny", "--num-rollout", "1000", "--rollout-engine", "server"]


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["record", "torchrun"])
def test_kill_9_of_record_or_its_torchrun_leaves_no_rank_or_engine(tmp_path, victim):
    record = _record("--log-dir", str(tmp_path), *DIST)
    family = _descendants_once(record, 5)  # the launcher, two ranks, two engine servers
    try:
        launcher = next(p for p in family if p.ppid() == record.pid)
        os.kill(record.pid if victim == "record" else launcher.pid, signal.SIGKILL)
        record.wait(30)
        assert _all_gone_within(family, 10) == []
        if victim == "torchrun":  # `record` reports the launcher's death as its exit code
            assert record.returncode == 128 + signal.SIGKILL
    finally:
        _kill_all(family)


@pytest.mark.slow
def test_sigterm_of_a_distributed_run_is_143_and_one_line(tmp_path):
    record = _record("--log-dir", str(tmp_path), *DIST)
    family = _descendants_once(record, 5)
    try:
        time.sleep(1.0)  # the ranks past their start
        record.send_signal(signal.SIGTERM)
        _, stderr = record.communicate(timeout=120)
        assert record.returncode == 143, stderr
        assert "Traceback" not in stderr and "trainer: error" not in stderr, stderr
        assert "death signal" not in stderr and "closing signal" not in stderr, stderr  # torchrun's warnings
        stops = [line for line in stderr.splitlines() if "stopped" in line or "interrupted" in line]
        assert stops == ["trainer: stopped by SIGTERM; every rank stopped"], stderr
        assert _all_gone_within(family, 10) == []
    finally:
        _kill_all(family)


# -- item 6: a run directory deleted mid-run is said, not reported as written --------------------------
def test_exec_run_whose_directory_was_deleted_says_the_log_is_gone(tmp_path):
    job = "import os, shutil; shutil.rmtree(os.environ['MILES_PROFILE_RUN_DIR'])"
    record = _record("--log-dir", str(tmp_path), "--exec", "--", sys.executable, "-c", job)
    _, stderr = record.communicate(timeout=120)
    # issue 33 item 2: the job succeeded, so we exit 0 (a scheduler that retries failures must not rerun it)
    assert record.returncode == 0, stderr
    assert "log written" not in stderr and "the log is gone" in stderr, stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_trainer_run_whose_directory_was_deleted_says_the_log_is_gone(tmp_path):
    import shutil
    record = _record("--log-dir", str(tmp_path), "--", "--preset", "tiny", "--num-rollout", "40")
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("run-*/*.samples.csv")) and time.monotonic() < deadline:
        time.sleep(0.05)
    (run_dir,) = tmp_path.glob("run-*")
    shutil.rmtree(run_dir)
    _, stderr = record.communicate(timeout=300)
    assert record.returncode == 0, stderr  # issue 33 item 2: all 40 rollouts ran: the job's exit code is 0
    assert "log written" not in stderr and f"the log is gone: its run directory {run_dir} was deleted" in stderr, stderr
    assert "Traceback" not in stderr, stderr


# -- item 3: offload directories of killed trainers don't stay forever ---------------------------------
DISK_TRAIN = ["-m", "trainer.train", "--preset", "tiny", "--offload-train", "--offload-train-target", "disk"]


@pytest.mark.slow
def test_a_killed_disk_offload_run_leaves_a_directory_the_next_run_removes(tmp_path):
    offload = tmp_path / "offload"
    killed = subprocess.Popen([sys.executable, *DISK_TRAIN, "--num-rollout", "1000", "--offload-train-disk-dir",
                               str(offload)], cwd=REPO, env=python_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    left = offload / f"trainer-{killed.pid}"
    deadline = time.monotonic() + 120
    while not list(left.glob("*.safetensors")) and time.monotonic() < deadline:
        assert killed.poll() is None
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    assert list(left.glob("*.safetensors"))  # SIGKILL: nothing could remove them
    done = subprocess.run([sys.executable, *DISK_TRAIN, "--num-rollout", "1", "--offload-train-disk-dir",
                           str(offload)], cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert not left.exists()
    assert f"trainer: removed {left} (" in done.stdout and f"pid {killed.pid}, which is gone" in done.stdout
    assert list(offload.iterdir()) == []  # and its own, on the way out


def test_only_directories_of_gone_owners_are_removed(tmp_path):
    from trainer import offload_dirs
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(sleeper.pid).create_time()

        def owned(pid: int, start_time: float | None, size: int) -> Path:
            path = tmp_path / f"trainer-{pid}"
            path.mkdir()
            (path / "chunk").write_bytes(b"x" * size)
            if start_time is not None:
                (path / offload_dirs.OWNER_FILE).write_text(json.dumps(
                    {"pid": pid, "start_time": start_time, "host": os.uname().nodename}))
            return path

        live = owned(sleeper.pid, started, 10)
        reused = owned(os.getppid(), psutil.Process(os.getppid()).create_time() - 3600, 20)  # pid now another's
        gone_pid = sleeper.pid  # reused below once the sleeper is dead
        unknown_live = owned(other.pid, None, 30)  # no owner file, its pid alive: may be a newcomer's
        reused_bytes = sum(f.stat().st_size for f in reused.iterdir())  # its chunk and owner file
        stale = offload_dirs.remove_stale(tmp_path)
        assert [(s.path, s.removable, s.nbytes) for s in stale] == [(reused, True, reused_bytes)]
        assert live.exists() and unknown_live.exists() and not reused.exists()
        sleeper.kill()
        sleeper.wait()
        (live / offload_dirs.OWNER_FILE).unlink()  # a directory from before owners were recorded
        stale = offload_dirs.remove_stale(tmp_path)
        assert [(s.path, s.pid, s.removable, s.nbytes) for s in stale] == [(live, gone_pid, False, 10)]
        assert live.exists()  # named with its size, never removed: it may be another host's
    finally:
        sleeper.kill()
        other.kill()


# -- item 16: `make demo` keeps to its checkout and never deletes a run ---------------------------------
def test_make_demo_writes_only_under_its_checkout_and_deletes_nothing():
    import shutil
    if shutil.which("make") is None:
        pytest.skip("needs make")
    plan = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert plan.returncode == 0, plan.stderr
    recipe = plan.stdout
    # The checkout itself may lie under the system temp directory (a fresh clone in /tmp): only paths
    # outside it count as shared.
    assert "/tmp" not in recipe.replace(str(REPO), "<checkout>") and "rm -" not in recipe, recipe  # shared paths, or another run's deletion
    assert f"--offload-train-disk-dir {REPO}/.demo/offload" in recipe, recipe
    # A new log directory per demo, and the report of that directory alone.
    assert f"logs=$(mktemp -d {REPO}/.demo/logs-XXXXXX)" in recipe, recipe
    assert "--log-dir $logs --" in recipe and "visualize $logs -o $logs/report.html" in recipe, recipe
