"""Whose disk-offload directory is whose: each trainer process writes under <dir>/trainer-<pid> and
removes it on its way out, which a process killed with SIGKILL can't do (its directory, 113 MB at the
cpu preset, stayed forever, unmentioned). So each directory names its owner (pid, the process's start
time, host), and a trainer that starts removes those whose owner is gone. A pid alone can't say so:
it may have been reused by another process since, hence the start time. A directory it can't judge
(written before owners were recorded, or by another host sharing the directory) is named with its size.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

PREFIX = "trainer-"
OWNER_FILE = "owner.json"
START_TIME_TOLERANCE_S = 1.0  # psutil's create_time is rounded to clock ticks


@dataclass(frozen=True)
class Stale:
    path: Path
    pid: int
    nbytes: int
    removable: bool  # False: its owner can't be judged from here; named, never removed


def claim(root: Path) -> Path:
    """This process's directory under `root`, created, with its owner recorded before any chunk."""
    directory = root / f"{PREFIX}{os.getpid()}"
    directory.mkdir(parents=True, exist_ok=True)
    owner = {"pid": os.getpid(), "start_time": psutil.Process().create_time(), "host": socket.gethostname()}
    (directory / OWNER_FILE).write_text(json.dumps(owner))
    return directory


def find_stale(root: Path) -> list[Stale]:
    """The trainer-<pid> directories under `root` whose owner is gone."""
    found = []
    for path in sorted(root.glob(f"{PREFIX}*")):
        pid_text = path.name[len(PREFIX):]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or not path.is_dir():
            continue
        pid, owner = int(pid_text), _owner(path)
        if owner is not None and owner.get("host") != socket.gethostname():
            continue  # another host's: its pids say nothing here
        if _alive(pid, owner):
            continue
        found.append(Stale(path, pid, _tree_bytes(path), removable=owner is not None))
    return found


def remove_stale(root: Path) -> list[Stale]:
    """Remove the removable stale directories under `root`; returns every stale one found."""
    stale = find_stale(root)
    for s in stale:
        if s.removable:
            shutil.rmtree(s.path, ignore_errors=True)  # another starting rank may be removing it too
    return stale


def _owner(path: Path) -> dict | None:
    try:
        owner = json.loads((path / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("start_time"), (int, float)) else None


def _alive(pid: int, owner: dict | None) -> bool:
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # exists, but we may not look at it: not ours to judge
        return True
    # Without an owner file the pid's process may be a newcomer: alive, as far as we can tell.
    return owner is None or abs(started - owner["start_time"]) < START_TIME_TOLERANCE_S


def _tree_bytes(path: Path) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return total
