"""Who was killed: the OOM killer's counter of the cgroup, and recorded processes that vanished.

A SIGKILL leaves no dump, so the evidence is taken from outside the victim, as it happens, and written
at once as one `oom` event (an appended JSON line: crash-safe):

- `record --exec` gets the child's exit status (`exec_death`): killed by SIGKILL (-9), or any non-zero
  exit while the cgroup's `oom_kill` counter moved (a launcher whose worker was OOM-killed). A child
  that exits 0 is never a death.
- the host sampler (`DeathWatch.poll`, every host sample) sees a recorded process of its host vanish
  without having written its `end_time` (no `atexit` ran: SIGKILL, an OOM kill, a segfault, `os._exit`),
  and the `oom_kill` counter move (attributed to a process that vanished within ATTRIBUTE_S of it).

The counter is the sampling process's own cgroup's (`/proc/self/cgroup`): v2 `memory.events` (hierarchical:
a kill in a child cgroup counts), v1 `memory.oom_control` (this cgroup only). `$MILES_PROFILE_MEMORY_EVENTS`
names another file of the same `key value` lines (tests; a job whose processes live in another cgroup).

    OomCounter(path=None).read() -> int | None         # oom_kill so far; None: no counter here
    cgroup_limit() -> int | None                         # memory.max (v1 limit_in_bytes); None: unlimited
    exec_death(pid, returncode, oom_delta, ...) -> dict | None   # the event's attrs, or None
    DeathWatch(run_dir, host, own_pid, counter).poll(now) -> list[dict]
    write_death(writer, attrs)                           # one `oom` event
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from miles_profile import names
from miles_profile.logdir.files import NotRegularFile, read_small
from miles_profile.logdir.layout import PROCESS_META_SUFFIX, STATUS_SUFFIX
from miles_profile.probes.cgroup import CgroupProbe, cgroup_dir, own_cgroups

MEMORY_EVENTS_ENV = "MILES_PROFILE_MEMORY_EVENTS"
# A recorded process that vanishes this long after the counter moved is the one it counted.
ATTRIBUTE_S = 2.0
# Causes an `oom` event names (attrs["cause"]).
OOM_KILL, SIGKILL, VANISHED = "oom_kill", "sigkill", "vanished"
# A Ray worker that Ray's memory monitor killed (its own OOM killer, before the kernel's): cluster/driver.py.
RAY_OOM_KILL = "ray_oom_kill"


def find_counter(root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup") -> Path | None:
    """This process's cgroup file that holds `oom_kill` (v2 memory.events, v1 memory.oom_control)."""
    if os.environ.get(MEMORY_EVENTS_ENV):
        return Path(os.environ[MEMORY_EVENTS_ENV])
    root, own = Path(root), own_cgroups(Path(proc_cgroup))
    v1 = root / "memory"
    if v1.is_dir():
        where = cgroup_dir(v1, own.get("memory", "/"))
        if (where / "memory.oom_control").exists():
            return where / "memory.oom_control"
    for mount in (root, root / "unified"):
        if (mount / "cgroup.controllers").exists():
            where = cgroup_dir(mount, own.get("", "/"))
            for directory in (where, *where.parents):
                if (directory / "memory.events").exists():
                    return directory / "memory.events"
                if directory == mount:
                    break
    return None


def parse_oom_kill(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


class OomCounter:
    """The cgroup's `oom_kill` count; `path` injectable (tests), else found from our own cgroup."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else find_counter()

    def read(self) -> int | None:
        if self.path is None:
            return None
        try:
            return parse_oom_kill(self.path.read_text())
        except OSError:
            return None


def cgroup_limit() -> int | None:
    """The tightest memory limit of our cgroup chain (what the OOM killer enforces); None: unlimited."""
    probe = CgroupProbe()
    try:
        return probe.read()[1]
    finally:
        probe.close()


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def exec_death(pid: int, returncode: int, oom_delta: int | None, *, command: list[str] | None = None,
               limit: int | None = None, counter: str | None = None) -> dict[str, Any] | None:
    """The `oom` event's attrs for `record --exec`'s child, or None: it exited normally (0), or
    failed by itself (a non-zero code or another signal, with no OOM kill counted)."""
    if returncode == 0:
        return None
    if oom_delta:
        cause = OOM_KILL
    elif returncode == -signal.SIGKILL:
        cause = SIGKILL
    else:
        return None
    return {"process_pid": pid, "cause": cause, "returncode": returncode,
            "signal": -returncode if returncode < 0 else None, "oom_kill_delta": oom_delta,
            "memory_max": limit, "counter": counter, "role": "exec_child", "detected_by": "record_exec",
            "command": list(command or [])[:8]}


def write_death(writer, attrs: dict[str, Any]) -> None:
    """One `oom` event (`writer`: an EventWriter, or a Recorder's `event`)."""
    name = "oom_kill" if attrs.get("cause") == OOM_KILL else "killed"
    if hasattr(writer, "write"):
        writer.write(names.OOM, name, attrs)
    else:
        writer(names.OOM, name, attrs)


def alive(pid: int) -> bool:
    """Running (a zombie is dead: it was killed, only not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return _signalable(pid)


def zombie_status(pid: int) -> int | None:
    """The wait status of a dead process its parent has not reaped yet (/proc/<pid>/stat's exit_code,
    Linux >= 3.5), or None: gone already, or still running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
        return int(fields[-1]) if fields[0] in (b"Z", b"X") and len(fields) >= 50 else None
    except (OSError, ValueError, IndexError):
        return None


def parent_of(pid: int) -> int | None:
    """The parent pid of a running process (/proc/<pid>/stat), or None: gone, or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _meta_of(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_small(path) or b"{}")  # guarded: a FIFO or a huge file never hangs the sampler
    except (OSError, ValueError, NotRegularFile):
        return {}
    return data if isinstance(data, dict) else {}


def _ended(run_dir: Path, stem: str) -> tuple[bool, dict[str, Any]]:
    """(whether the process wrote its end_time, its meta)."""
    meta: dict[str, Any] = {}
    for suffix in (PROCESS_META_SUFFIX, STATUS_SUFFIX):
        try:
            data = json.loads(read_small(run_dir / f"{stem}{suffix}") or b"{}")
        except (OSError, ValueError, NotRegularFile):
            continue
        if isinstance(data, dict):
            if data.get("end_time"):
                return True, data
            meta = meta or data
    return False, meta


class DeathWatch:
    """The host sampler's eyes: the recorded processes of `host` in `run_dir` (from their meta files'
    names, `<host>-<pid>`), and the cgroup's `oom_kill` counter. `poll` returns the deaths seen since
    the last poll as `oom` event attrs (each process once)."""

    SCAN_S = 0.5  # how often the directory is listed for new processes

    def __init__(self, run_dir: str | Path, host: str, own_pid: int | None = None,
                 counter: OomCounter | None = None):
        self.run_dir, self.host = Path(run_dir), host
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.counter = counter or OomCounter()
        self._oom_seen = self.counter.read()
        self._pending: list[tuple[float, int]] = []   # (when the counter moved, by how much), unattributed
        self._watched: dict[int, str] = {}             # pid -> stem
        self._ours: set[int] = set()                   # watched processes whose parent is this process
        self._done: set[int] = set()
        self._scan_due = 0.0

    def _scan(self) -> None:
        prefix = f"{self.host}-"
        try:
            paths = list(self.run_dir.glob(f"{prefix}*{PROCESS_META_SUFFIX}"))
        except OSError:
            return
        for path in paths:
            stem = path.name[: -len(PROCESS_META_SUFFIX)]
            pid_text = stem[len(prefix):]
            pid = int(pid_text) if pid_text.isdigit() else None
            if pid is not None and pid not in self._done and pid != self.own_pid and pid not in self._watched:
                self._watched[pid] = stem
                # its parent: from /proc while it runs, else from its meta (one that lived less than a scan)
                if (parent_of(pid) or _meta_of(path).get("ppid")) == self.own_pid:
                    self._ours.add(pid)

    def poll(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        if now >= self._scan_due:
            self._scan()
            self._scan_due = now + self.SCAN_S
        count = self.counter.read()
        moved = _delta(self._oom_seen, count)
        if moved:
            self._pending.append((now, moved))
        if count is not None:
            self._oom_seen = count
        deaths = [d for d in (self._check(pid, stem, now) for pid, stem in list(self._watched.items())) if d]
        deaths += self._expired(now)
        return deaths

    def _check(self, pid: int, stem: str, now: float) -> dict[str, Any] | None:
        if alive(pid):
            return None
        status = zombie_status(pid)  # caught before its parent reaped it: how it ended
        del self._watched[pid]
        self._done.add(pid)
        ended, meta = _ended(self.run_dir, stem)
        if ended:  # a normal exit: the recorder wrote its end_time on the way out
            return None
        if status is None and pid in self._ours:
            # Reaped by this very process: the program (or record --exec, which reports its child from
            # the exit status) waited for it and holds how it ended; a forked worker's os._exit is no death.
            return None
        pending = next((p for p in self._pending if now - p[0] <= ATTRIBUTE_S), None)
        if pending is not None:
            self._pending.remove(pending)
        elif status is not None and not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            return None  # it ended by itself (os._exit in a forked worker, a crash of its own): no kill
        killed = status is not None and os.WIFSIGNALED(status)
        return {"process_pid": pid, "cause": OOM_KILL if pending else (SIGKILL if killed else VANISHED),
                "signal": os.WTERMSIG(status) if killed else None,
                "oom_kill_delta": pending[1] if pending else None, "memory_max": cgroup_limit(),
                "counter": str(self.counter.path) if self.counter.path else None,
                "role": meta.get("role"), "rank": meta.get("rank"), "detected_by": "host_sampler"}

    def _expired(self, now: float) -> list[dict[str, Any]]:
        """Counter moves no recorded process claimed within ATTRIBUTE_S: a process of the cgroup we do
        not record (record --exec's child says which, from its exit status) was OOM-killed."""
        old = [p for p in self._pending if now - p[0] > ATTRIBUTE_S]
        self._pending = [p for p in self._pending if now - p[0] <= ATTRIBUTE_S]
        return [{"process_pid": None, "cause": OOM_KILL, "oom_kill_delta": moved, "memory_max": cgroup_limit(),
                 "counter": str(self.counter.path) if self.counter.path else None, "t_counted": t,
                 "detected_by": "host_sampler"} for t, moved in old]

    def finish(self, now: float | None = None) -> list[dict[str, Any]]:
        """At stop: every pending counter move is reported now (no later poll will), and the directory
        is listed once more: a process that started and died since the last scan is still seen."""
        self._scan_due = 0.0
        deaths = self.poll(now)
        return deaths + self._expired(float("inf"))
