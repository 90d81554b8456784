"""Append-only writers for one process's samples and events.

Crash safety: rows are written with whole-line `os.write` calls (never a line split across two
writes), and samples are flushed at least every `flush_interval_s`, so `kill -9` loses at most
that much and the file always ends in a complete line or a single truncated one the reader drops.

A failed write (a full disk, a vanished file system) never reaches the recorded job: the rows are
dropped and counted in `WriteFaults`, one warning goes to stderr, and later writes try again.
"""
from __future__ import annotations

import contextlib
import json
import logging
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
log = logging.getLogger("miles_profile")


class WriteFaults:
    """What one process's recording failed to write: counted, warned about once."""

    def __init__(self) -> None:
        # Rows that did not reach the file; a batch cut short counts whole (an upper bound).
        self.dropped = {"samples": 0, "events": 0}
        self.error: str | None = None  # the first failure, for the meta and the warning
        self._lock = threading.Lock()  # the sampler thread and the job's threads both fail here

    def failed(self, what: str, count: int, exc: BaseException) -> None:
        with self._lock:
            self.dropped[what] += count
            first, self.error = self.error is None, self.error or (
                getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}")
        if first:
            log.warning("miles_profile: warning: cannot write the log (%s); recording continues degraded, "
                        "the job is unaffected, lost rows are counted", self.error)


class _AppendFile:
    """An O_APPEND file whose write either lands whole or raises. A write cut short by a full disk
    leaves a torn line; the next successful write first ends it, so the reader drops one bad line
    instead of gluing two rows together."""

    def __init__(self, path: Path):
        self._fd = _open_append(path)
        self._torn = False

    def write(self, data: bytes) -> None:
        if self._torn:
            data = b"\n" + data
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            self._torn = self._torn or len(view) < len(data)
            raise
        self._torn = False

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a meta file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=1, default=str))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # a full disk leaves no half-written .tmp behind
            tmp.unlink()
        raise


def write_run_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    write_json(run_dir / RUN_META, {"format_version": FORMAT_VERSION, **meta})


def write_process_meta(run_dir: Path, stem: str, meta: dict[str, Any]) -> None:
    write_json(run_dir / f"{stem}{PROCESS_META_SUFFIX}", {"format_version": FORMAT_VERSION, **meta})


def _cell(value: Any) -> str:
    # An absent source is an empty field, never a zero.
    return "" if value is None else str(value)


class SampleWriter:
    """CSV rows `t,phase,<columns...>`; bytes as integers."""

    def __init__(self, run_dir: Path, stem: str, columns: Sequence[str], flush_interval_s: float = 0.5,
                 faults: WriteFaults | None = None):
        self.path = run_dir / f"{stem}{SAMPLES_SUFFIX}"
        self._file = _AppendFile(self.path)
        self._pending: list[str] = []
        self._flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        self.faults = faults or WriteFaults()
        try:  # a file without its header is useless: this one may fail, and the recorder not start
            self._file.write((",".join(["t", "phase", *columns]) + "\n").encode())
        except OSError:
            self._file.close()
            raise

    def append(self, t: float, phase: str, values: Sequence[Any]) -> None:
        cells = ",".join(map(_cell, values))
        self._pending.append(f"{t:.6f},{phase.translate(_CSV_UNSAFE)},{cells}\n")
        if time.monotonic() - self._last_flush >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            try:
                self._file.write("".join(self._pending).encode())
            except OSError as exc:
                self.faults.failed("samples", len(self._pending), exc)
            self._pending.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()
        self._file.close()


class EventWriter:
    """JSON lines `{t, kind, name, pid, id, parent, attrs}`, written at once: events are rare."""

    def __init__(self, run_dir: Path, stem: str, faults: WriteFaults | None = None):
        self.path = run_dir / f"{stem}{EVENTS_SUFFIX}"
        self._file = _AppendFile(self.path)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._host = host_name()  # pids repeat across hosts: (host, pid, id) names a phase
        self.faults = faults or WriteFaults()

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
            try:
                self._file.write(line.encode())
            except OSError as exc:
                self.faults.failed("events", 1, exc)

    def close(self) -> None:
        self._file.close()
