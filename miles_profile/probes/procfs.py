"""Reads and writes of /proc files through kept-open descriptors, without releasing the GIL.

`os.pread`/`os.write` release the GIL around the system call. In the sampler thread every release
hands the GIL to the training loop and forces it back a moment later: a forced thread switch per
call, which cost the training loop more than the calls themselves (bench/bench_sampler.py). libc's
pread/write called through `ctypes.PyDLL` keep the GIL for their few microseconds instead.
"""
from __future__ import annotations

import ctypes
import os

try:
    _libc = ctypes.PyDLL(None, use_errno=True)
    _pread = _libc.pread
    _pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    _pread.restype = ctypes.c_ssize_t
    _write = _libc.write
    _write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    _write.restype = ctypes.c_ssize_t
except (OSError, AttributeError):  # no libc symbols in the main program: fall back to os
    _pread = _write = None


class ProcFile:
    """One /proc file kept open; `read()` regenerates its text, `write()` sends a command."""

    def __init__(self, path: str, writable: bool = False, size: int = 16384):
        self.fd = os.open(path, os.O_WRONLY if writable else os.O_RDONLY)
        self._buffer = ctypes.create_string_buffer(size)
        self._size = size

    def read(self) -> bytes:
        if _pread is None:
            return os.pread(self.fd, self._size, 0)
        n = _pread(self.fd, self._buffer, self._size, 0)
        if n < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return ctypes.string_at(self._buffer, n)

    def write(self, data: bytes) -> None:
        if _write is None:
            os.write(self.fd, data)
        elif _write(self.fd, data, len(data)) < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def close(self) -> None:
        os.close(self.fd)


def kib_fields(text: bytes, *keys: bytes) -> list[int | None]:
    """Values in bytes of `Key:   123 kB` lines, e.g. VmRSS in /proc/<pid>/status."""
    values: list[int | None] = []
    for key in keys:
        at = text.find(key)
        if at < 0:
            values.append(None)
            continue
        values.append(int(text[at + len(key):text.find(b"kB", at)]) * 1024)
    return values
