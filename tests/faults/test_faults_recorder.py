"""The job comes first: a full disk, a deleted run directory, signals, the terminal and fork() never
harm the recorded job (issue 11, items 1-4). Every job here is a real process writing real files.

A full disk is a real 1 MiB tmpfs (mounted when we may: root), filled by the job itself once it has
started, so the recorder meets ENOSPC mid-run. Where mounting is not allowed, the job runs with
RLIMIT_FSIZE of 8 KiB instead (SIGXFSZ ignored, so writes fail with EFBIG): another real write error.
"""
from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import miles_profile as mp
from miles_profile.errors import MilesProfileError
from tests.conftest import REPO, python_env


# -- a disk that fills up --------------------------------------------------------------------------
@dataclass
class SmallDisk:
    path: Path
    tmpfs: bool
    env: dict = field(default_factory=dict)

    def preexec(self) -> None:
        if not self.tmpfs:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    yield SmallDisk(path, mounted, {"FILL_DIR": str(path)} if mounted else {})
    if mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


# Jobs get `fill()` (take every free byte of the tmpfs, as another writer would) and `free()`.
PRELUDE = """
import os, sys, time
def fill():
    if not os.environ.get("FILL_DIR"):
        return
    fd = os.open(os.path.join(os.environ["FILL_DIR"], "filler"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError:
        pass
    os.close(fd)
def free():
    if os.environ.get("FILL_DIR"):
        os.unlink(os.path.join(os.environ["FILL_DIR"], "filler"))
"""


def run_job(code: str, *args: str, disk: SmallDisk | None = None, timeout: float = 120,
            record: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run `code` (after PRELUDE) as a job, under `record --exec` when `record` gives its options."""
    command = [sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args]
    if record is not None:
        command = [sys.executable, "-m", "miles_profile.record", *record, "--exec", "--", *command]
    env = dict(python_env(), **(disk.env if disk else {}))
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=disk.preexec if disk else None)


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "miles_profile" in line and "warning" in line]


def dropped_in_meta(run_dir: Path) -> dict:
    """The `dropped` counts of every process meta that has them."""
    found = {}
    for path in run_dir.glob("*.meta.json"):
        meta = json.loads(path.read_text())
        if "pid" in meta and meta.get("dropped"):
            found[meta["pid"]] = meta["dropped"]
    return found


# -- item 1: a full disk or a deleted run directory degrades recording, never the job ---------------
IN_PROCESS_JOB = """
from miles_profile import Recorder, phase, mark
log_dir, free_before_stop = sys.argv[1], sys.argv[2] == "free"
done = 0
with Recorder(log_dir, interval_ms=1) as rec:
    print(rec.run_dir, flush=True)
    for i in range(400):
        with phase("train", i=i):
            time.sleep(0.001)
        mark("step", i=i)
        done += 1
        if i == 0:
            fill()
    if free_before_stop:
        free()
print("done", done, flush=True)
sys.exit(7)
"""


@pytest.mark.parametrize("free_before_stop", [False, True], ids=["still_full", "freed_before_stop"])
def test_in_process_recorder_on_a_full_disk_keeps_the_job_alive(small_disk, free_before_stop):
    done = run_job(IN_PROCESS_JOB, str(small_disk.path), "free" if free_before_stop else "full", disk=small_disk)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 7 and "done 400" in done.stdout, done.stderr
    warnings = warnings_of(done.stderr)
    run_dir = Path(done.stdout.splitlines()[0])
    counted = dropped_in_meta(run_dir)
    if counted:  # in the log when it can be written ...
        assert len(warnings) == 1, warnings
        assert counted[next(iter(counted))]["samples"] + counted[next(iter(counted))]["events"] > 0
    else:  # ... else on stderr
        assert len(warnings) == 2 and "dropped" in warnings[1], warnings
        assert not (free_before_stop and small_disk.tmpfs)  # freed space takes the counts
    assert "cannot write" in warnings[0]
    mp.load(run_dir)  # what was written still reads


EXEC_CHILD_JOB = """
import miles_profile as mp
done = 0
for i in range(400):
    with mp.phase("train", i=i):
        time.sleep(0.001)
    done += 1
    if i == 0:
        fill()
print("done", done, flush=True)
sys.exit(7)
"""


def test_record_exec_on_a_full_disk_returns_the_childs_exit_code(small_disk):
    done = run_job(EXEC_CHILD_JOB, disk=small_disk,
                   record=["--log-dir", str(small_disk.path), "--interval-ms", "1"])
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 7 and "done 400" in done.stdout, done.stderr
    # One warning per recording process (the exec parent and the child), plus a count where no log takes it.
    assert 1 <= len(warnings_of(done.stderr)) <= 4, done.stderr


DELETES_ITS_RUN_DIR = """
import shutil
import miles_profile as mp
shutil.rmtree(os.environ["MILES_PROFILE_RUN_DIR"])
with mp.phase("train"):
    mp.mark("inside")
print("done", flush=True)
sys.exit(7)
"""


def test_a_deleted_run_directory_is_a_warning_in_a_child_not_an_error(tmp_path):
    done = run_job(DELETES_ITS_RUN_DIR, record=["--log-dir", str(tmp_path), "--interval-ms", "10"])
    assert "Traceback" not in done.stderr and "error" not in done.stderr, done.stderr
    assert done.returncode == 7 and "done" in done.stdout
    assert 1 <= len(warnings_of(done.stderr)) <= 2, done.stderr


IN_PROCESS_DELETED = """
import shutil
from miles_profile import Recorder, phase
with Recorder(sys.argv[1], interval_ms=5) as rec:
    with phase("train"):
        pass
    shutil.rmtree(rec.run_dir)
    with phase("train"):
        time.sleep(0.05)
print("done", flush=True)
"""


def test_a_run_directory_deleted_under_an_in_process_recorder_keeps_the_job_alive(tmp_path):
    done = run_job(IN_PROCESS_DELETED, str(tmp_path))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0 and "done" in done.stdout
    assert len(warnings_of(done.stderr)) >= 1


def test_a_recorder_that_cannot_start_is_a_one_line_error_not_an_oserror(tmp_path):
    missing = tmp_path / "gone"
    with pytest.raises(MilesProfileError):
        mp.Recorder(run_dir=missing).start()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(MilesProfileError):
        mp.Recorder(blocker / "logs").start()


def test_a_disk_full_before_the_start_runs_the_job_unrecorded(small_disk):
    if not small_disk.tmpfs:
        pytest.skip("needs a tmpfs to fill before the start")
    done = run_job("fill(); sys.exit(0)", disk=small_disk)  # the disk is full before anything starts
    assert done.returncode == 0
    done = run_job("print('ran', flush=True); sys.exit(7)", disk=small_disk,
                   record=["--log-dir", str(small_disk.path / "logs")])
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 7 and "ran" in done.stdout
    assert "not recording" in done.stderr and "No space left" in done.stderr
    assert "log written" not in done.stderr  # no promise of a report that can't exist
    with pytest.raises(MilesProfileError, match="No space left"):  # the library call says why, in one line
        mp.Recorder(small_disk.path / "logs2").start()


# -- item 2: the terminal and signals behave as without `record` ------------------------------------
needs_script = pytest.mark.skipif(shutil.which("script") is None, reason="needs script(1) from util-linux")


def in_a_terminal(command: list[str], tmp_path: Path) -> subprocess.Popen:
    """`command` under script(1): on a pseudo-terminal, as the terminal's foreground job."""
    # `exec`: script(1) runs the line with $SHELL -c; dash (CI's /bin/sh) stays as a parent in the
    # foreground group and dies of the terminal's Ctrl-C itself (exit 130), whatever `record` does.
    line = "exec " + shlex.join([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path / "logs"),
                                 "--interval-ms", "10", "--exec", "--", *command])
    env = dict(python_env(), SHELL="/bin/sh")  # the same shell whatever the user's login shell is
    return subprocess.Popen(["script", "-qec", line, "/dev/null"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def read_until(proc: subprocess.Popen, needle: bytes, timeout: float) -> bytes:
    """Output of `proc` until `needle` shows or `timeout` passes (then the whole session is killed)."""
    os.set_blocking(proc.stdout.fileno(), False)
    seen, deadline = b"", time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            seen += chunk
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.05)
    if needle not in seen:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return seen


@needs_script
def test_a_child_reading_the_terminal_gets_its_input(tmp_path):
    # The repro: in its own process group the child stopped on SIGTTIN and the recorder waited forever.
    proc = in_a_terminal(["sh", "-c", "read x; echo GOT:$x"], tmp_path)
    proc.stdin.write(b"hello\n")
    proc.stdin.flush()
    out = read_until(proc, b"GOT:hello", timeout=20)
    assert b"GOT:hello" in out, out
    proc.stdin.close()
    assert proc.wait(timeout=20) == 0


@needs_script
def test_ctrl_c_in_the_terminal_reaches_the_child_once(tmp_path):
    counter = tmp_path / "sigints"
    child = textwrap.dedent(f"""
        import signal, sys, time
        count = []
        signal.signal(signal.SIGINT, lambda s, f: count.append(s))
        print("ready", flush=True)
        while not count:
            time.sleep(0.01)
        time.sleep(1.0)  # a forwarded duplicate would land here
        open({str(counter)!r}, "w").write(str(len(count)))
        sys.exit(5)
    """)
    proc = in_a_terminal([sys.executable, "-c", child], tmp_path)
    assert b"ready" in read_until(proc, b"ready", timeout=20)
    proc.stdin.write(b"\x03")  # the terminal's interrupt character: the kernel signals the foreground group
    proc.stdin.flush()
    assert proc.wait(timeout=20) == 5
    assert counter.read_text() == "1"


PRINTS_PID_AND_WAITS = ["sh", "-c", "echo $$; exec sleep 30"]


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1,
                                 signal.SIGALRM], ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_the_recorder_reaches_the_child_and_leaves_no_orphan(tmp_path, sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--interval-ms", "10",
         "--exec", "--", *PRINTS_PID_AND_WAITS], env=python_env(), cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    child_pid = int(proc.stdout.readline())
    time.sleep(0.3)  # the recorder is past its start and waiting
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=20)
    finally:
        try:
            os.kill(child_pid, signal.SIGKILL)
            orphan = True
        except ProcessLookupError:
            orphan = False
    assert not orphan
    assert code == 128 + sig, proc.stderr.read()  # the child's fate, reported as a shell would
    assert "Traceback" not in proc.stderr.read()


def test_a_child_that_stops_stops_the_recorder_and_both_continue(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path), "--exec", "--",
         "sh", "-c", "echo $$; kill -STOP $$; echo resumed"], env=python_env(), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child_pid = int(proc.stdout.readline())
    pid, deadline = 0, time.monotonic() + 10
    while not pid and time.monotonic() < deadline:  # as a shell with job control sees it
        pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
        time.sleep(0.02)
    stopped = bool(pid) and os.WIFSTOPPED(status)
    if not stopped:
        os.kill(child_pid, signal.SIGKILL)
        if not pid:
            proc.kill()
            proc.wait()
    assert stopped
    os.kill(proc.pid, signal.SIGCONT)  # `fg`/`bg` continue the recorder; it continues the child
    assert proc.stdout.readline().strip() == "resumed"
    assert proc.wait(timeout=20) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)


# -- item 3: fork() after the parent's first phase() -------------------------------------------------
FORKS = """
import json
import miles_profile as mp
n, exit_how = int(sys.argv[1]), sys.argv[2]
def work():
    for j in range(20):
        with mp.phase("child_work", j=j):
            pass
    mp.mark("child_done")
    if exit_how == "sys":
        sys.exit(0)  # runs the atexit handlers and the `with` exits inherited from the parent
    os._exit(0)
def parent():
    with mp.phase("parent_first"):
        pass
    pids = []
    with mp.phase("parent_outer"):
        for i in range(n):
            pid = os.fork()
            if pid == 0:
                work()
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
    with mp.phase("parent_last"):
        pass
    print(json.dumps({"parent": os.getpid(), "children": pids}), flush=True)
if len(sys.argv) > 3:  # in-process recorder
    with mp.Recorder(sys.argv[3], interval_ms=5):
        parent()
else:  # a child of record --exec
    parent()
"""


@pytest.mark.parametrize("exit_how", ["sys", "os"])
@pytest.mark.parametrize("how", ["in_process", "exec"])
def test_forked_children_record_as_themselves_never_into_the_parents_files(tmp_path, how, exit_how):
    n = 4
    if how == "in_process":
        done = run_job(FORKS, str(n), exit_how, str(tmp_path))
    else:
        done = run_job(FORKS, str(n), exit_how, record=["--log-dir", str(tmp_path), "--interval-ms", "5"])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    pids = json.loads(done.stdout.splitlines()[-1])
    parent, children = pids["parent"], pids["children"]
    run = mp.load(tmp_path)
    events = run.events
    from_parent = events[events["pid"] == parent]
    assert set(from_parent["name"]) == {"parent_first", "parent_outer", "parent_last"}
    for child in children:
        own = events[events["pid"] == child]
        assert (own["name"] == "child_work").sum() == 40 and (own["name"] == "child_done").sum() == 1
    # Each process's events lie in its own file, under its own pid.
    for path in tmp_path.glob("*/*.events.jsonl"):
        stem_pid = int(path.name.split(".")[0].rsplit("-", 1)[1])
        assert {json.loads(line)["pid"] for line in path.read_text().splitlines()} <= {stem_pid}
    meta = {p["pid"]: p for p in run.processes}
    assert set(children) <= set(meta) and "end_time" in meta[parent]
    assert meta[parent]["pid"] == parent
    # A worker that ends with os._exit (as every multiprocessing fork worker does) writes no end: that is
    # no death, and the healthy run must not fail for it (it did: "vanished", verdict FAIL).
    from miles_profile.verdicts.engine import judge
    (oom,) = [c for c in judge(run).checks if c.name == "oom"]
    assert oom.status == "n/a", oom.summary
    assert not any("died" in w for w in run.warnings), run.warnings  # nor does the reader call them dead


# -- item 4: the sampling interval is bounded ---------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "nan", "1e-9", "0", "-5", "1e9", "ten"])
def test_an_interval_out_of_range_is_a_one_line_error(tmp_path, value):
    done = subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path),
                           f"--interval-ms={value}", "--exec", "--", sys.executable, "-c", "pass"],
                          env=python_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "interval" in done.stderr.strip().splitlines()[-1]
    assert not list(tmp_path.iterdir())  # refused before any run was made


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e-9, 0.0, -5.0, 1e9, True, "20", None])
def test_the_recorder_refuses_an_interval_out_of_range(tmp_path, value):
    with pytest.raises(MilesProfileError, match="interval"):
        mp.Recorder(tmp_path, interval_ms=value)
    mp.Recorder(tmp_path, interval_ms=1.0)
    mp.Recorder(tmp_path, interval_ms=60_000.0)


@pytest.mark.parametrize("interval", [True, False, "20", None, float("nan"), float("inf"), 0, 0.5, 120_000])
def test_a_recorder_refuses_an_interval_that_is_no_number_of_milliseconds(tmp_path, interval):
    """Issue 19 item 15: `Recorder(interval_ms=True)` was accepted (a bool is an int: 1 ms)."""
    with pytest.raises(MilesProfileError, match="interval must be"):
        mp.Recorder(log_dir=tmp_path, interval_ms=interval)
    assert not any(tmp_path.iterdir())  # refused before anything was written
