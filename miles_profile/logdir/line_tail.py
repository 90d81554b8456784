"""Read only what a log file gained since the last look, in whole lines (the recorder appends whole lines).

Shared by the live views: the dashboard's `tail.py` (rows into frames) and the metrics endpoint
(`LineTail`, at scrape time only). Never blocks and never follows a link: a FIFO or a device planted
under a log's name reads as empty, and so does a vanished file (a run directory deleted under a view).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO's open returns at once
# What one look at a busy file usually gains; more is read in a second call. Below glibc's mmap threshold
# (128 KiB): a 256 KiB buffer costs an mmap, page faults and a munmap at each read (60 us, not 0.3 us).
_FIRST_READ = 64 * 1024


def read_regular(path: Path, offset: int, limit: int) -> bytes:
    """Up to `limit` bytes from `offset` of the regular file `path`; b"" for anything else. A device
    node is never even opened (lstat first: opening some has effects)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return b""
        fd = os.open(path, _OPEN_FLAGS)
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


def whole_lines(data: bytes, limit: int) -> tuple[bytes, int]:
    """(`data` up to its last complete line, bytes consumed). A whole read of `limit` bytes without a
    newline is damage (no log line is that long): consumed and dropped, so it is not read again at each
    look; the rest of that line then reads as one malformed line."""
    end = data.rfind(b"\n")
    if end < 0:
        return b"", len(data) if len(data) >= limit else 0
    return data[: end + 1], end + 1


class LineTail:
    """Complete lines appended to `path` since the previous `read()`; a line being written waits.

    The file stays open between reads (one `pread` a look instead of lstat, open, fstat and close: a
    scrape reads two files of each of 64 processes); `close()` ends that. A file that is not there yet
    is looked for again at the next read.
    """

    def __init__(self, path: Path, limit: int):
        self.path = path
        self.limit = limit     # at most this much a read: a backlog of hours is read over several
        self.offset = 0
        self._fd: int | None = None

    def _open(self) -> bool:
        try:
            if not stat.S_ISREG(os.lstat(self.path).st_mode):
                return False
            fd = os.open(self.path, _OPEN_FLAGS)
        except OSError:
            return False
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for something else between lstat and open
            os.close(fd)
            return False
        self._fd = fd
        return True

    def read(self, last: int | None = None) -> bytes:
        """The new complete lines (newline-terminated), b"" when none. `last`: only the lines within
        the last `last` bytes of what was appended (a reader that wants the latest rows alone skips
        the rest unread; the first line of the window, likely cut, is dropped)."""
        if self._fd is None and not self._open():
            return b""
        try:
            if last is not None:
                size = os.fstat(self._fd).st_size
                if size - self.offset > last:
                    data, consumed = whole_lines(os.pread(self._fd, last, size - last), last)
                    cut = data.find(b"\n") + 1
                    self.offset = size - last + consumed
                    return data[cut:]
            data = os.pread(self._fd, min(_FIRST_READ, self.limit), self.offset)
            if len(data) == _FIRST_READ and self.limit > _FIRST_READ:
                data += os.pread(self._fd, self.limit - _FIRST_READ, self.offset + _FIRST_READ)
        except OSError:
            return b""
        data, consumed = whole_lines(data, self.limit)
        self.offset += consumed
        return data

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
