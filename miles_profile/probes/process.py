"""Resident memory of this process, or of a process tree, with the true peak since the last read.

The peak is Linux `VmHWM`, reset after each read by writing `5` to `/proc/<pid>/clear_refs`, so
`rss_peak` is the highest RSS between two samples, however short the spike. Where the reset is not
permitted the peak is since process start, and meta says so.
"""
from __future__ import annotations

import os
import time
from typing import Any

import psutil

from miles_profile.probes.procfs import ProcFile, kib_fields

_RSS, _HWM = b"VmRSS:", b"VmHWM:"
# RSS split by kind of page (Linux >= 4.5): anonymous (heaps, tensors), file-backed (libraries, mmapped
# files), shared memory (shm, memfd). Same status read as VmRSS: the split costs a few parses.
_SPLIT = (b"RssAnon:", b"RssFile:", b"RssShmem:")
COLUMNS = ("rss", "rss_peak", "rss_anon", "rss_file", "rss_shmem")


class _PidReader:
    """Reads (rss, hwm, anon, file, shmem) of one pid and resets its hwm."""

    def __init__(self, pid: int | str):
        self.status = ProcFile(f"/proc/{pid}/status")
        try:
            self.clear_refs: ProcFile | None = ProcFile(f"/proc/{pid}/clear_refs", writable=True)
        except OSError:
            self.clear_refs = None

    def read(self) -> tuple[int, int, int | None, int | None, int | None]:
        rss, hwm, anon, file, shmem = kib_fields(self.status.read(), _RSS, _HWM, *_SPLIT)
        if self.clear_refs is not None:
            self.clear_refs.write(b"5")  # VmHWM := current RSS
        return rss or 0, max(hwm or 0, rss or 0), anon, file, shmem

    def close(self) -> None:
        self.status.close()
        if self.clear_refs is not None:
            self.clear_refs.close()


class OwnProcessProbe:
    """This process (the in-process recorder)."""

    name = "process"
    columns = COLUMNS

    def __init__(self) -> None:
        self._reader = _PidReader("self")
        self.peak_reset = self._reader.clear_refs is not None

    @property
    def pids(self) -> set[int]:
        return {os.getpid()}

    def read(self) -> tuple[int, int, int | None, int | None, int | None]:
        return self._reader.read()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "scope": "self", "peak_reset": self.peak_reset,
                "note": "" if self.peak_reset else "clear_refs not writable: rss_peak is since start"}

    def close(self) -> None:
        self._reader.close()


class ProcessTreeProbe:
    """A child and all its descendants, seen from outside (`record --exec`).

    `rss` is the sum of their RSS; `rss_peak` the sum of their per-process peaks, an upper bound
    of the tree's true peak (the peaks of two processes need not coincide).
    """

    name = "process"
    columns = COLUMNS

    def __init__(self, root_pid: int, refresh_s: float = 0.5):
        self.root_pid = root_pid
        self._refresh_s = refresh_s
        self._readers: dict[int, _PidReader] = {}
        self._next_refresh = 0.0
        self.peak_reset = True

    @property
    def pids(self) -> set[int]:
        return set(self._readers)

    def _refresh(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
            live = {self.root_pid} | {c.pid for c in root.children(recursive=True)}
        except psutil.Error:
            live = set()
        for pid in set(self._readers) - live:
            self._readers.pop(pid).close()
        for pid in live - set(self._readers):
            try:
                reader = _PidReader(pid)
            except OSError:
                continue
            self.peak_reset &= reader.clear_refs is not None
            self._readers[pid] = reader

    def read(self) -> tuple[int | None, ...]:
        now = time.monotonic()
        if now >= self._next_refresh:
            self._refresh()
            self._next_refresh = now + self._refresh_s
        totals: list[int | None] | None = None
        for pid, reader in list(self._readers.items()):
            try:
                values = reader.read()
            except OSError:  # exited since the last refresh
                self._readers.pop(pid).close()
                continue
            # a split field a kernel lacks stays absent for the whole tree
            totals = list(values) if totals is None else [None if a is None or b is None else a + b
                                                          for a, b in zip(totals, values)]
        return tuple(totals) if totals is not None else (None,) * len(COLUMNS)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "scope": "tree", "root_pid": self.root_pid,
                "peak_reset": self.peak_reset,
                "note": "rss_peak is the sum of per-process peaks (an upper bound)"}

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
