"""File names and the format version of a run directory."""
from __future__ import annotations

import os
import time
from pathlib import Path

from miles_profile.identity import host_name

FORMAT_VERSION = 1
RUN_META = "meta.json"  # one per run: marks a directory as a run
# Run meta key written by `record --phase`: the phases its report and dashboard show by default.
PHASE_SELECTION_KEY = "phase_selection"
SAMPLES_SUFFIX = ".samples.csv"
EVENTS_SUFFIX = ".events.jsonl"
PROCESS_META_SUFFIX = ".meta.json"
# Per process, created at start at a fixed size and rewritten in place: what the recording lost and
# when it ended, where a full disk can't stop it (the meta is replaced by a new file: that can fail).
STATUS_SUFFIX = ".status.json"
STATUS_BYTES = 512
# Host-level files, written by the one process per host that holds `<host>.host.lock` (host_sampler.py).
HOST_LOCK_SUFFIX = ".host.lock"
HOST_META_SUFFIX = ".host.json"
HOST_SAMPLES_SUFFIX = ".host.csv"
GPU_PROCS_SUFFIX = ".gpu_procs.csv"
# Per process, opt-in (record --stacks): torch.cuda.memory._snapshot() around one phase (miles_profile/stacks.py).
STACKS_SUFFIX = ".stacks.pickle"


def process_stem(host: str | None = None, pid: int | None = None) -> str:
    """Per-process file prefix: ranks and children never share a file."""
    return f"{host or host_name()}-{pid or os.getpid()}"


def is_run_dir(path: Path) -> bool:
    return (path / RUN_META).is_file()


def find_runs(path: Path, max_depth: int = 3) -> list[Path]:
    """Run directories at `path` or up to `max_depth` levels below it (e.g. <logs>/<config>/<run>),
    oldest first. A run's own subdirectories are not searched."""
    path = Path(path)
    if is_run_dir(path):
        return [path]
    runs: list[Path] = []
    level = [path] if path.is_dir() else []
    for _ in range(max_depth):
        below = []
        for folder in level:
            try:
                children = [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()]
            except OSError:
                continue
            for child in children:
                (runs if is_run_dir(child) else below).append(child)
        level = below
    return sorted(runs, key=lambda p: (p.stat().st_mtime, str(p)))


def new_run_dir(log_dir: Path) -> Path:
    """A fresh subdirectory per run, so a new run never mixes with an earlier one's files."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"run-{stamp}-{process_stem()}"
    for attempt in range(1000):
        candidate = log_dir / (base if attempt == 0 else f"{base}-{attempt}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a run directory under {log_dir}")


def pid_of(path: Path, suffix: str) -> int:
    """The pid in a process file's name (`<host>-<pid><suffix>`); -1 when it holds none."""
    stem = path.name[: -len(suffix)]
    try:
        return int(stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1
