"""Where a report, an export or a cache may be written: never through a link or into a FIFO.

A log directory is user input, often someone else's: a `report.html` in it that is a symbolic link
would have its target overwritten by `visualize D` (any file the user can write), and a FIFO there
blocks the write forever. So an output path whose last component is a link, a FIFO, a socket or a
device is refused with one line before anything is written. Paths under /dev/ are the user's own
streams (`--json /dev/stdout`, `/dev/null`, `/dev/fd/N`): links and pipes by nature, and allowed.
"""
from __future__ import annotations

import os
import stat

from miles_profile.errors import MilesProfileError


class UnsafeOutput(MilesProfileError):
    """An output path that is a symbolic link or not a regular file."""


def check_output_path(path: str | os.PathLike) -> None:
    """Raise UnsafeOutput when writing `path` would follow a link or block on a FIFO; a path that does
    not exist yet, or is a regular file, passes."""
    text = os.path.abspath(os.fspath(path))
    if text.startswith("/dev/"):
        return
    try:
        found = os.lstat(text)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UnsafeOutput(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(found.st_mode):
        try:
            target = os.readlink(text)
        except OSError:
            target = "?"
        raise UnsafeOutput(f"refusing to write {path}: it is a symbolic link (to {target}), which would overwrite "
                           "its target; remove the link or choose another file with -o")
    if not stat.S_ISREG(found.st_mode):
        what = "a FIFO" if stat.S_ISFIFO(found.st_mode) else "a directory" if stat.S_ISDIR(found.st_mode) \
            else "not a regular file"
        raise UnsafeOutput(f"cannot write {path}: it is {what} (refusing to write into it); choose another file")


def write_text_nofollow(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` (created 0o666 & ~umask) without following a link at its last component
    (O_NOFOLLOW: a link put there after check_output_path still fails, with ELOOP)."""
    check_output_path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    if not os.path.abspath(os.fspath(path)).startswith("/dev/"):
        flags |= os.O_NOFOLLOW | os.O_NONBLOCK  # O_NONBLOCK: a FIFO put there since fails (ENXIO), never blocks
    fd = os.open(path, flags, 0o666)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)

