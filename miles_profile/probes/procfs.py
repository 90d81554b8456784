"""Fast reads of /proc files through kept-open descriptors (pread regenerates the text)."""
from __future__ import annotations

import os


def open_read(path: str) -> int:
    return os.open(path, os.O_RDONLY)


def read_kib_fields(fd: int, *keys: bytes) -> list[int | None]:
    """Values in bytes of `Key:   123 kB` lines, e.g. VmRSS in /proc/<pid>/status."""
    text = os.pread(fd, 16384, 0)
    values: list[int | None] = []
    for key in keys:
        at = text.find(key)
        if at < 0:
            values.append(None)
            continue
        end = text.find(b"kB", at)
        values.append(int(text[at + len(key):end]) * 1024)
    return values
