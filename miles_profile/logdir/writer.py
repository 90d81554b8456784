"""Append-only writers for one process's samples and events.

Crash safety: rows are written with whole-line `os.write` calls (never a line split across two
writes), and samples are flushed at least every `flush_interval_s`, so `kill -9` loses at most
that much and the file always ends in a complete line or a single truncated one the reader drops.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from miles_profile.identity import host_name
from miles_profile.logdir.layout import (
    EVENTS_SUFFIX, FORMAT_VERSION, PROCESS_META_SUFFIX, RUN_META, SAMPLES_SUFFIX,
)

_CSV_UNSAFE = str.maketrans({",": "_", '"': "_", "\n": "_", "\r": "_"})


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a meta file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def write_run_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    write_json(run_dir / RUN_META, {"format_version": FORMAT_VERSION, **meta})


def write_process_meta(run_dir: Path, stem: str, meta: dict[str, Any]) -> None:
    write_json(run_dir / f"{stem}{PROCESS_META_SUFFIX}", {"format_version": FORMAT_VERSION, **meta})


def _cell(value: Any) -> str:
    # An absent source is an empty field, never a zero.
    return "" if value is None else str(value)


class SampleWriter:
    """CSV rows `t,phase,<columns...>`; bytes as integers."""

    def __init__(self, run_dir: Path, stem: str, columns: Sequence[str], flush_interval_s: float = 0.5):
        self.path = run_dir / f"{stem}{SAMPLES_SUFFIX}"
        self._fd = _open_append(self.path)
        self._pending: list[str] = []
        self._flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        os.write(self._fd, (",".join(["t", "phase", *columns]) + "\n").encode())

    def append(self, t: float, phase: str, values: Sequence[Any]) -> None:
        cells = ",".join(map(_cell, values))
        self._pending.append(f"{t:.6f},{phase.translate(_CSV_UNSAFE)},{cells}\n")
        if time.monotonic() - self._last_flush >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            os.write(self._fd, "".join(self._pending).encode())
            self._pending.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()
        os.close(self._fd)


class EventWriter:
    """JSON lines `{t, kind, name, pid, id, parent, attrs}`, written at once: events are rare."""

    def __init__(self, run_dir: Path, stem: str):
        self.path = run_dir / f"{stem}{EVENTS_SUFFIX}"
        self._fd = _open_append(self.path)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._host = host_name()  # pids repeat across hosts: (host, pid, id) names a phase

    def write(self, kind: str, name: str, attrs: dict[str, Any] | None = None, *,
              t: float | None = None, id: int | None = None, parent: int | None = None) -> None:
        event = {"t": time.time() if t is None else t, "kind": kind, "name": name, "pid": self._pid,
                 "host": self._host}
        if id is not None:
            event["id"] = id
        if parent is not None:
            event["parent"] = parent
        event["attrs"] = attrs or {}
        line = json.dumps(event, default=str, separators=(",", ":")) + "\n"
        with self._lock:
            os.write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)
