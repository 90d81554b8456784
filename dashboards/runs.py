"""The run list: what is under the log directory, newest first, and which runs are still being written.

A run is live when one of its processes has not written `end_time` into its meta (the recorder
does on a clean stop) and one of its files changed within `LIVE_WINDOW_S`: a recorder killed
without a clean stop leaves no `end_time`, but its files stop changing.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from miles_profile.errors import MilesProfileError
from miles_profile.logdir.files import read_small
from miles_profile.logdir.layout import PROCESS_META_SUFFIX, RUN_META
from dashboards.paths import LogRoot

LIVE_WINDOW_S = 10.0


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    start_time: float  # Unix seconds (the run meta's, else the directory's mtime)
    modified: float  # newest mtime among the run's files
    live: bool
    command: str
    processes: int
    problem: str = ""  # why the run can't be read, when its meta already says so


def _read_json(path: Path) -> dict:
    """A meta file, or {} when it is unreadable, too large or no regular file (a FIFO would block
    the request's thread forever)."""
    try:
        data = json.loads(read_small(path))
    except (MilesProfileError, OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _command_text(command: object) -> str:
    """What the user ran: after `record ... --exec --` the command itself, after `record ... --` the trainer
    with its arguments (the recorder's own path and options say nothing in a list of runs)."""
    if not isinstance(command, list):
        return str(command or "")
    parts = [str(part) for part in command]
    if parts and parts[0].endswith(("miles_profile/record.py", "miles_profile.record")) and "--" in parts:
        cut = parts.index("--")
        rest = parts[cut + 1:]
        return " ".join(rest if "--exec" in parts[:cut] else ["python -m trainer.train", *rest])
    return " ".join(parts)


@lru_cache(maxsize=1 << 16)
def _has_ended(path: str, mtime_ns: int, size: int, inode: int) -> bool:
    """Whether a process meta holds `end_time`, read once per version of the file: the run list is
    rebuilt at every poll, and a fleet run's 1,024 metas took 0.1-2 s to parse each time. Metas are
    replaced by rename, so a new version has a new inode."""
    return "end_time" in _read_json(Path(path))


def summarize(run_id: str, run_dir: Path, now: float | None = None) -> RunSummary:
    now = time.time() if now is None else now
    meta = _read_json(run_dir / RUN_META)
    mtimes, ended = [], []
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        entries = []
    for entry in entries:
        try:
            if entry.is_symlink() or entry.name.startswith("."):  # hidden: the reader's own cache files
                continue
            st = entry.stat()
        except OSError:
            continue
        mtimes.append(st.st_mtime)
        if entry.name.endswith(PROCESS_META_SUFFIX) and entry.name != RUN_META:
            ended.append(_has_ended(entry.path, st.st_mtime_ns, st.st_size, st.st_ino))
    modified = max(mtimes, default=0.0)
    start = meta.get("start_time", meta.get("start_ts"))  # start_ts: a Miles dashboard directory
    start = float(start) if isinstance(start, (int, float)) else modified
    live = bool(ended) and not all(ended) and now - modified <= LIVE_WINDOW_S
    problem = "" if meta else "damaged: run meta.json unreadable"
    command = _command_text(meta.get("command"))
    if "run_name" in meta and "format_version" not in meta:
        command = f"Miles dashboard: {meta['run_name']}"
    return RunSummary(run_id, start, modified, live, command, len(ended), problem)


def list_runs(root: LogRoot) -> list[RunSummary]:
    """Every run under the root, newest first."""
    now = time.time()
    runs = [summarize(run_id, path, now) for run_id, path in root.run_dirs().items()]
    return sorted(runs, key=lambda r: (r.start_time, r.run_id), reverse=True)
