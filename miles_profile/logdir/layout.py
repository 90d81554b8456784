"""File names and the format version of a run directory."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

FORMAT_VERSION = 1
RUN_META = "meta.json"  # one per run: marks a directory as a run
SAMPLES_SUFFIX = ".samples.csv"
EVENTS_SUFFIX = ".events.jsonl"
PROCESS_META_SUFFIX = ".meta.json"


def process_stem(host: str | None = None, pid: int | None = None) -> str:
    """Per-process file prefix: ranks and children never share a file."""
    return f"{host or socket.gethostname()}-{pid or os.getpid()}"


def is_run_dir(path: Path) -> bool:
    return (path / RUN_META).is_file()


def find_runs(path: Path) -> list[Path]:
    """Run directories at `path` or one level below it, oldest first."""
    path = Path(path)
    if is_run_dir(path):
        return [path]
    if not path.is_dir():
        return []
    runs = [p for p in path.iterdir() if p.is_dir() and is_run_dir(p)]
    return sorted(runs, key=lambda p: (p.stat().st_mtime, p.name))


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
