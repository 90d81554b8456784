"""Bytes in files under watched directories (offload dirs), e.g. an `--offload-train-disk-dir`."""
from __future__ import annotations

import os
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
    """Always present so that dirs can be watched after the recorder started; empty until then."""

    name = "disk"
    columns = ("disk",)

    def __init__(self, dirs: tuple[str, ...] = ()):
        self.dirs: tuple[str, ...] = tuple(dirs)

    def watch(self, path: str) -> None:
        path = os.path.abspath(path)
        if path not in self.dirs:
            self.dirs = self.dirs + (path,)  # replaced, not mutated: the sampler thread reads it

    def read(self) -> tuple[int | None]:
        dirs = self.dirs
        if not dirs:
            return (None,)
        return (sum(_tree_bytes(d) for d in dirs),)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "dirs": list(self.dirs)}

    def close(self) -> None:
        pass
