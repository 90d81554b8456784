"""Bytes in files under watched directories (offload dirs), e.g. an `--offload-train-disk-dir`."""
from __future__ import annotations

import os
import time
from typing import Any


def _tree_bytes(path: str) -> int:
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    total += _tree_bytes(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:  # removed or unreadable meanwhile
        pass
    return total


class DiskProbe:
    """Always present so that dirs can be watched after the recorder started; empty until then.

    Like NVML, read at every phase boundary and at most every INTERVAL_S in between: walking a
    directory costs 20-50 us a sample (16 files, docs/benchmarks.md) and file sizes have no peak to
    lose, while the boundary rows give each offload's exact before and after."""

    name = "disk"
    columns = ("disk",)
    partial_reads = True  # the sampler passes full=False to periodic reads
    INTERVAL_S = 0.1

    def __init__(self, dirs: tuple[str, ...] = ()):
        self.dirs: tuple[str, ...] = tuple(dirs)
        self._next_read = 0.0

    def watch(self, path: str) -> None:
        path = os.path.abspath(path)
        if path not in self.dirs:
            self.dirs = self.dirs + (path,)  # replaced, not mutated: the sampler thread reads it

    def read(self, full: bool = True) -> tuple[int | None]:
        dirs, now = self.dirs, time.monotonic()
        if not dirs or (not full and now < self._next_read):
            return (None,)
        self._next_read = now + self.INTERVAL_S
        return (sum(_tree_bytes(d) for d in dirs),)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "dirs": list(self.dirs)}

    def close(self) -> None:
        pass
