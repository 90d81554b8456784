"""Open a run's files only when they are regular files, and read them at a bounded cost.

A run directory is user input. A FIFO in it blocks `open()` (and `read()`) forever, a link to
/dev/zero never ends, a 2 GiB line without a newline is read whole into memory. So every file of a
run is checked with `os.stat` before it is opened (opening a FIFO blocks, opening a device may act),
opened with O_NONBLOCK and checked again with `fstat` on the open descriptor (the name may have been
replaced in between), and read with limits: a meta file over META_MAX_BYTES is refused, an events
line over EVENT_LINE_MAX is skipped without being held in memory. Links to regular files are followed
as before; what they point to must be a regular file too.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat
from pathlib import Path
from typing import Iterator

from miles_profile.errors import MilesProfileError

META_MAX_BYTES = 4 * 1024 * 1024  # a process meta is a few KiB; 4 MiB leaves room for any device list
EVENT_LINE_MAX = 1024 * 1024  # an event is under a KiB; a longer line is damage, dropped with a warning
# Data bytes (holes not counted) read of one host CSV or one Miles stream partition: a 64-GPU host
# sampled every 100 ms for a day writes ~1 GiB of host.csv; past the cap the file's tail is dropped.
DATA_MAX_BYTES = 2 * 1024 ** 3
_READ_CHUNK = 64 * 1024 * 1024


class NotRegularFile(MilesProfileError):
    """A run file that is a FIFO, device, socket or directory, or a meta file over its size limit."""


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of `path` (links followed) if it is a regular file; else NotRegularFile."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                return fd
            os.close(fd)
    except OSError as exc:
        raise NotRegularFile(f"{path.name}: unreadable ({exc.strerror or exc.__class__.__name__})") from None
    raise NotRegularFile(f"{path.name}: {_what(mode)}, not a regular file; not read")


def read_small(path: str | os.PathLike, limit: int = META_MAX_BYTES) -> bytes:
    """The whole of a small regular file (a meta file); NotRegularFile past `limit` bytes."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise NotRegularFile(f"{Path(path).name}: {max(size, len(data)):,} bytes, over the "
                                 f"{limit:,} a meta file may have; not read")
        return data
    finally:
        os.close(fd)


def bounded_lines(path: str | os.PathLike, max_line: int = EVENT_LINE_MAX,
                  too_long: list[int] | None = None) -> Iterator[bytes]:
    """The lines of the regular file `path`. A line over `max_line` bytes is skipped in pieces, never
    held whole, and counted in `too_long[0]`. Raises NotRegularFile before the first line."""
    file = os.fdopen(open_regular(path), "rb")
    return _lines(file, max_line, too_long if too_long is not None else [0])


def read_lines_bounded(path: str | os.PathLike, max_line: int = EVENT_LINE_MAX,
                       too_long: list[int] | None = None) -> bytes:
    """`b"".join(bounded_lines(path, max_line, too_long))`, a file of at most `max_line` bytes (which
    can hold no line over it) read in one call: reading a 1,024-process run's 276,000 event lines one
    `readline` at a time took a fifth of a second. A larger file line by line, as before."""
    too_long = too_long if too_long is not None else [0]
    file = os.fdopen(open_regular(path), "rb")
    with file:
        if os.fstat(file.fileno()).st_size <= max_line:
            data = file.read(max_line + 1)
            if len(data) <= max_line:  # else it grew since: line by line from its start
                return data
            file.seek(0)
        return b"".join(_lines(file, max_line, too_long))


def _lines(file, max_line: int, too_long: list[int]) -> Iterator[bytes]:
    with file:
        while line := file.readline(max_line + 1):
            if len(line) <= max_line or line.endswith(b"\n"):
                yield line
                continue
            too_long[0] += 1
            while line and not line.endswith(b"\n"):  # the rest of that line, a piece at a time
                line = file.readline(max_line)


def map_regular(path: str | os.PathLike) -> tuple[mmap.mmap | bytes, list[tuple[int, int]]]:
    """A read-only memory map of the regular file `path` (b"" when empty) and its data extents."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if not size:
            return b"", []
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ), data_extents(fd, size)
    except (OSError, ValueError) as exc:
        raise NotRegularFile(f"{Path(path).name}: unreadable ({exc.__class__.__name__})") from None
    finally:
        os.close(fd)  # the map holds its own reference to the file


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The [start, end) byte ranges of `fd` that hold data. A sparse file's holes (zero bytes never
    written) are left out, so a scan skips them at no cost; the whole file where the file system
    can't tell."""
    whole = [(0, size)] if size else []
    if not hasattr(os, "SEEK_DATA"):
        return whole
    extents, at = [], 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from `at` to the end
                break
            return whole
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        extents.append((start, end))
        at = end
    return extents


def read_data(path: str | os.PathLike, limit: int = DATA_MAX_BYTES) -> tuple[bytes, bool]:
    """(the bytes of the regular file `path` that hold data, whether `limit` cut them). A sparse
    file's holes are not read: the data extents are joined by a newline, so a line cut by a hole reads
    as a malformed line, never as gigabytes of zeros. NotRegularFile for a FIFO, device or directory."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        extents = data_extents(fd, size)
        extents_read, left = [], limit
        for start, end in extents:
            stop = start + min(end - start, left)
            chunks = [os.pread(fd, min(_READ_CHUNK, stop - at), at) for at in range(start, stop, _READ_CHUNK)]
            extents_read.append(b"".join(chunks) if len(chunks) != 1 else chunks[0])
            left -= stop - start
            if left <= 0:
                break
        cut = left <= 0 and sum(e - s for s, e in extents) > limit
        return (extents_read[0] if len(extents_read) == 1 else b"\n".join(extents_read)), cut
    except OSError as exc:
        raise NotRegularFile(f"{Path(path).name}: unreadable ({exc.strerror or exc.__class__.__name__})") from None
    finally:
        os.close(fd)
