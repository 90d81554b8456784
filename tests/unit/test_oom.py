"""OOM detection (miles_profile/oom.py): the counter's formats, which exits are deaths, and the host
sampler's watch over real processes that vanish (a synthetic memory.events file stands in for the
cgroup, its path injected)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from miles_profile import oom

V2 = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
V1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"


def test_the_counter_reads_both_cgroup_versions_and_says_none_without_one(tmp_path):
    assert oom.parse_oom_kill(V2) == 2 and oom.parse_oom_kill(V1) == 5
    assert oom.parse_oom_kill("oom 1\n") is None  # 'oom' (the limit was hit) is not a kill
    path = tmp_path / "memory.events"
    path.write_text(V2)
    assert oom.OomCounter(path).read() == 2
    assert oom.OomCounter(tmp_path / "absent").read() is None


def test_the_counter_path_is_injectable_through_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(oom.MEMORY_EVENTS_ENV, str(tmp_path / "events"))
    assert oom.OomCounter().path == tmp_path / "events"


def test_the_own_cgroup_counter_is_found_in_a_v2_tree(tmp_path):
    group = tmp_path / "cg" / "job.slice" / "run"
    group.mkdir(parents=True)
    (tmp_path / "cg" / "cgroup.controllers").write_text("memory\n")
    (group / "memory.events").write_text(V2)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job.slice/run\n")
    assert oom.find_counter(tmp_path / "cg", proc) == group / "memory.events"


@pytest.mark.parametrize("code, delta, cause", [
    (0, 1, None),            # exited normally: never a death, whatever else the cgroup saw
    (1, None, None),         # failed by itself
    (-signal.SIGSEGV, 0, None),
    (-signal.SIGKILL, 0, oom.SIGKILL),
    (-signal.SIGKILL, 1, oom.OOM_KILL),
    (1, 1, oom.OOM_KILL),    # a launcher whose worker the OOM killer took
])
def test_which_exits_are_deaths(code, delta, cause):
    attrs = oom.exec_death(123, code, delta, command=["python", "x.py"], limit=1 << 30)
    assert (attrs and attrs["cause"]) == cause
    if attrs:
        assert attrs["process_pid"] == 123 and attrs["memory_max"] == 1 << 30


def _recorded(run_dir, host, proc, end=False):
    meta = {"pid": proc.pid, "host": host, "role": "actor", "rank": 1}
    if end:
        meta["end_time"] = time.time()
    (run_dir / f"{host}-{proc.pid}.meta.json").write_text(json.dumps(meta))


@pytest.fixture
def watch(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 0\n")
    return oom.DeathWatch(tmp_path, "h", own_pid=-1, counter=oom.OomCounter(events)), events


def _dead(proc):
    proc.kill()
    proc.wait()


def test_a_recorded_process_killed_is_seen_vanishing(tmp_path, watch):
    w, _ = watch
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _recorded(tmp_path, "h", proc)
    assert w.poll() == []
    _dead(proc)
    deaths = w.poll()
    assert [(d["process_pid"], d["cause"], d["rank"]) for d in deaths] == [(proc.pid, oom.VANISHED, 1)]
    assert w.poll() == []  # once


def test_a_process_that_started_and_died_between_scans_is_seen_at_finish(tmp_path, watch):
    w, _ = watch
    assert w.poll() == []  # the directory listed: nothing yet; the next listing is SCAN_S away
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _recorded(tmp_path, "h", proc)
    _dead(proc)
    assert w.poll() == []  # too soon to list again
    assert [d["process_pid"] for d in w.finish()] == [proc.pid]


def test_a_child_this_process_reaped_is_its_programs_to_judge_a_grandchild_is_not(tmp_path):
    """A forked worker ending with os._exit writes no end; when the watching process itself waited for
    it (it holds the exit status; record --exec reports its child from it) it is no death. A process
    someone else reaped, of unknown end, still is one."""
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 0\n")
    w = oom.DeathWatch(tmp_path, "h", counter=oom.OomCounter(events))  # own_pid: this process
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # a grandchild: its parent (the shell) reaps it, not us
    shell = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' & echo $!; wait"],
                             stdout=subprocess.PIPE, text=True)
    grandchild = int(shell.stdout.readline())
    for pid in (child.pid, grandchild):
        (tmp_path / f"h-{pid}.meta.json").write_text(json.dumps({"pid": pid, "host": "h"}))
    assert w.poll() == []
    _dead(child)
    os.kill(grandchild, signal.SIGKILL)
    shell.wait(timeout=30)  # the shell reaped the grandchild
    deaths = w.poll()
    assert [d["process_pid"] for d in deaths] == [grandchild], deaths


def test_a_vanishing_right_after_the_counter_moved_is_an_oom_kill(tmp_path, watch):
    w, events = watch
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _recorded(tmp_path, "h", proc)
    w.poll()
    events.write_text("oom_kill 1\n")
    _dead(proc)
    (death,) = w.poll()
    assert death["cause"] == oom.OOM_KILL and death["oom_kill_delta"] == 1


def test_a_process_that_ended_its_recording_is_no_death_nor_one_of_another_host(tmp_path, watch):
    w, _ = watch
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    other = subprocess.Popen([sys.executable, "-c", "pass"])
    _recorded(tmp_path, "h", done, end=True)
    _recorded(tmp_path, "other-host", other)
    done.wait()
    other.wait()
    assert w.poll() == []


def test_a_counter_move_no_recorded_process_claims_is_reported_at_finish(tmp_path, watch):
    w, events = watch
    w.poll()
    events.write_text("oom_kill 2\n")
    assert w.poll() == []  # it may still be claimed
    (death,) = w.finish()
    assert death["process_pid"] is None and death["cause"] == oom.OOM_KILL and death["oom_kill_delta"] == 2


def test_an_out_of_memory_error_the_process_survived_is_no_death(tmp_path):
    import miles_profile as mp
    from miles_profile.recorder import Recorder
    from miles_profile.verdicts.oom import check_oom
    rec = Recorder(tmp_path, interval_ms=50).start()
    try:
        with pytest.raises(MemoryError):
            with mp.phase("train", rollout_id=0):
                raise MemoryError("planted")
    finally:
        rec.stop()
    run = mp.load(rec.run_dir)
    assert (run.events["kind"] == "oom").sum() == 1  # the phase's own oom event is there ...
    assert check_oom(run).status == "n/a"  # ... and is not a killed process


def test_a_zombie_tells_how_it_ended(tmp_path, watch):
    w, _ = watch
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited = subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(0.3); os._exit(0)"])
    _recorded(tmp_path, "h", killed)
    _recorded(tmp_path, "h", exited)
    w.poll()
    killed.kill()
    deadline = time.monotonic() + 10
    while (oom.alive(killed.pid) or oom.alive(exited.pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert oom.zombie_status(exited.pid) == 0  # not reaped yet: its status is still readable
    deaths = w.poll()  # both unreaped zombies
    assert [(d["process_pid"], d["cause"], d["signal"]) for d in deaths] == [(killed.pid, oom.SIGKILL, 9)]
    killed.wait()
    exited.wait()
