"""glibc's heap in use: the bytes malloc has handed out and not had back: at every phase boundary by
default, at every sample too with `record --heap`.

A CPU process has no allocator counter like CUDA's `memory_allocated`, and RSS holds more than
tensors (library pages, thread stacks, freed heap glibc keeps). torch's CPU tensors are malloc'd, so
`mallinfo2()`'s `uordblks` (in the arenas) + `hblkhd` (in mmapped chunks) is the CPU analogue; the
report judges the trainer's host forecast against it (runmodel/forecast.py).

Every sample is opt-in because of its cost: mallinfo2 walks every free chunk of every arena under that arena's lock.
In the cpu-preset trainer a call took 183-192 us median, 4-7 ms at p99 and 11-20 ms at worst
(bench/heap_probe_cost.py, docs/forecast.md), and 19.9 ms in a process holding 100,000 freed blocks,
with the job's mallocs waiting meanwhile. No true peak either: read at each sample and at each phase boundary, with
`heap_used_peak` the higher of this read and the one before (so the interval's start counts: an
offload's phase, whose peak is the level entering it, sees that level), never what lay between.
Linux with glibc 2.33 or later; elsewhere `heap_in_use()` is None and the probe is absent.

By default (no flag) the heap is read at phase boundaries only (the rows a phase's begin and end take,
`partial_reads`): what offload_drop needs to tell a kept reference from glibc keeping freed pages in
RSS (the level before an offload, at its end, and in the next phase), at two reads per phase
(bench/heap_boundary_cost.py measures it). `record --no-heap` turns even that off, and a process with GPU
columns does not read it at boundaries at all (`boundary_heap_unread`: offload_drop judges the allocator and
NVML there).
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Iterable

from miles_profile.probes import absent


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None
    function.restype, function.argtypes = _Mallinfo2, []
    return function


_MALLINFO2 = _mallinfo2()


def heap_in_use() -> int | None:
    """Bytes malloc has handed out and not had back, or None without glibc's mallinfo2."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


class HeapProbe:
    name = "heap"
    columns = ("heap_used", "heap_used_peak")
    partial_reads = True  # the sampler passes full=False to periodic reads

    def __init__(self, every_sample: bool = True) -> None:
        self._last: int | None = None  # the previous read (the sampler reads under its lock, one at a time)
        self.every_sample = every_sample

    def read(self, full: bool = True) -> tuple[int | None, int | None]:
        if not (full or self.every_sample):  # boundaries only: a periodic row leaves the heap empty
            return None, None
        now = heap_in_use()
        peak = now if self._last is None or now is None else max(now, self._last)
        self._last = now
        return now, peak

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "source": "glibc mallinfo2 (uordblks + hblkhd)",
                "peak": "the higher of each read and the one before (no true peak)",
                "reads": "every sample" if self.every_sample else "phase boundaries"}

    def close(self) -> None:
        pass


GPU_HEAP_UNREAD = ("a process with GPU columns: offload_drop judges its allocator and NVML there, not glibc's heap "
                   "(record --heap reads it at every sample)")


def boundary_heap_unread(columns: Iterable[str]) -> str:
    """Why a process whose rows have `columns` reads no heap at its phase boundaries, or "" where something
    uses it. A GPU column in any process's rows makes the run's `gpu_indices` non-empty, and on such a run
    offload_drop judges the allocator and NVML, never the heap (verdicts/offload_series.py); the forecast
    reads only a heap read at every sample (`record --heap`). Nothing would read those two mallinfo2 walks
    a phase, the largest part of a Ray actor's boundary cost (16 malloc arenas to walk; docs/ray.md, "Cost")."""
    return GPU_HEAP_UNREAD if any(c.startswith("gpu") for c in columns) else ""


def open_heap(every_sample: bool = True) -> tuple[HeapProbe | None, dict[str, Any]]:
    if _MALLINFO2 is None:
        return None, absent("heap", "glibc's mallinfo2 is not available (not glibc 2.33+)")
    probe = HeapProbe(every_sample)
    return probe, probe.describe()
