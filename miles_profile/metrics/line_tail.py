"""Read only what a file gained since the last look, in whole lines (the recorder appends whole lines).

The exposition reads the run's files at scrape time and never between scrapes, so the job pays nothing
when no one scrapes; a scrape reads what was appended since the previous one, nothing twice.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

# A scrape reads at most this much of one file: a scraper that comes back after hours reads the
# backlog over several scrapes instead of stalling one.
MAX_READ_BYTES = 8 * 1024 * 1024


class LineTail:
    """Complete lines appended to `path` since the previous `read()`; a line being written waits."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def read(self) -> list[bytes]:
        data = _pread(self.path, self.offset, MAX_READ_BYTES)
        end = data.rfind(b"\n")
        if end < 0:
            # No newline in a whole read: damage, not a line in progress; skip it rather than re-read it.
            self.offset += len(data) if len(data) == MAX_READ_BYTES else 0
            return []
        self.offset += end + 1
        return data[:end].split(b"\n")


def _pread(path: Path, offset: int, limit: int) -> bytes:
    """Up to `limit` bytes from `offset` of a regular file; b"" for anything else or a vanished file (a
    run directory deleted during a scrape, a FIFO planted under a log's name: never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size <= offset:
            return b""
        return os.pread(fd, min(info.st_size - offset, limit), offset)
    except OSError:
        return b""
    finally:
        os.close(fd)
