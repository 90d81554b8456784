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
    EVENTS_SUFFIX, FORMAT_VERSION, PROCESS_META_SUFFIX, RUN_META, SAMPLES_SUFFIX, STATUS_BYTES, STATUS_SUFFIX,
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
        self._status: Path | None = None  # <stem>.status.json, once a writer has created it
        self._end_time: float | None = None

    def keep_status(self, run_dir: Path, stem: str) -> None:
        """Create this process's status file now, while the disk has room: later updates rewrite its
        blocks in place, so a full disk cannot lose the counts (see docs/log-format.md)."""
        if self._status is not None:
            return
        path = run_dir / f"{stem}{STATUS_SUFFIX}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, self._status_bytes())
            finally:
                os.close(fd)
            self._status = path
        except OSError:
            pass  # no status file: the meta is the only record, as before

    def finished(self) -> None:
        """The recording ended: its end time goes into the status file as well as (later) the meta."""
        self._end_time = time.time()
        self._write_status()

    def _status_bytes(self) -> bytes:
        status = {"format_version": FORMAT_VERSION, "dropped": dict(self.dropped),
                  "write_error": (self.error or "")[:80] or None, "end_time": self._end_time}
        data = json.dumps(status, separators=(",", ":")).encode()
        if len(data) >= STATUS_BYTES:  # an error text of escaped characters: the counts matter more
            data = json.dumps({**status, "write_error": "?"}, separators=(",", ":")).encode()
        return data.ljust(STATUS_BYTES - 1)[: STATUS_BYTES - 1] + b"\n"

    def _write_status(self) -> None:
        if self._status is None:
            return
        with self._lock:
            data = self._status_bytes()
        try:  # no O_CREAT, no O_TRUNC: the same blocks, overwritten
            fd = os.open(self._status, os.O_WRONLY)
            try:
                os.pwrite(fd, data, 0)
            finally:
                os.close(fd)
        except OSError:
            pass

    def failed(self, what: str, count: int, exc: BaseException) -> None:
        with self._lock:
            self.dropped[what] += count
            first, self.error = self.error is None, self.error or (
                getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}")
        self._write_status()
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


def private_tmp(path: Path) -> Path:
    """A temporary name beside `path` that no other process or thread writes: two writers of one meta (a
    Ray worker ending and its node's sampler ending it) once shared `<name>.tmp`, and the shorter write
    landed over the longer one: a meta of one JSON and the other's tail, unreadable, its process lost."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a meta file, whoever else writes it."""
    tmp = private_tmp(path)
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
        self.faults.keep_status(run_dir, stem)

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
        self.faults.finished()


class EventWriter:
    """JSON lines `{t, kind, name, pid, id, parent, attrs}`, written at once: events are rare."""

    def __init__(self, run_dir: Path, stem: str, faults: WriteFaults | None = None, *,
                 pid: int | None = None, host: str | None = None):
        """`pid`, `host`: whose events these are, when another process writes them (a Ray driver
        writing for a node's sampler that Ray killed: cluster/driver.py)."""
        self.path = run_dir / f"{stem}{EVENTS_SUFFIX}"
        self._file = _AppendFile(self.path)
        self._lock = threading.Lock()
        self._pid = os.getpid() if pid is None else pid
        self._host = host or host_name()  # pids repeat across hosts: (host, pid, id) names a phase
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
