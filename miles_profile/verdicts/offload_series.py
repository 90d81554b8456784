"""Which series offload_drop reads for a process, as tracks of measured samples only.

Two questions, two series (docs/checks.md, offload_drop):

- `allocated`: did the declared tensors leave the allocator? The torch allocator's `gpu{i}_alloc`; on a
  run without GPU columns glibc's heap in use (`heap_used`, with `record --heap`).
- `driver`: did the memory go back to the driver (or the OS)? NVML per process (`gpu{i}_proc`, read every
  100 ms by the process holding the host role, and at every phase boundary), else the same NVML read at
  the process's own phase boundaries only (`gpu{i}_boundary_proc`: a rank or engine server whose host is
  sampled by another process), else the allocator's `gpu{i}_reserved`; on CPU host RSS.

A torch_memory_saver pause unmaps memory behind the allocator's back: its counters (allocated, reserved)
do not move, so a paused offload is judged on the driver's series alone (NVML per process, at boundaries,
else NVML device used). Where the two questions have one series (CPU without the heap probe) it is read
once, as `level`.

    offload_series(run, pid, paused, others=True) -> list[OffloadSeries]
    pids_with_heap(run) -> list[int]      # processes that sampled glibc's heap
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from miles_profile.runmodel.series import Track, pids, pids_with, process_label, series_arrays
from miles_profile.verdicts.resolution import resolution_of

ALLOCATED, DRIVER, LEVEL = "allocated", "driver", "level"
# Per GPU, the driver's columns in order of preference.
BUILTIN_DRIVER_KINDS = ("proc", "boundary_proc", "reserved")
PAUSED_DRIVER_KINDS = ("proc", "boundary_proc", "used", "boundary_used")
KIND_TEXT = {"alloc": "allocator allocated", "reserved": "allocator reserved", "proc": "NVML per process",
             "boundary_proc": "NVML per process at its phase boundaries", "used": "NVML device used",
             "boundary_used": "NVML device used at its phase boundaries", "heap_used": "glibc heap in use",
             "rss": "host RSS"}


@dataclass(frozen=True)
class OffloadSeries:
    role: str                   # ALLOCATED, DRIVER or LEVEL (one series answering both)
    track: Track                # measured samples only: at_or_before() is the last reading
    columns: tuple[str, ...]    # what was summed (one per GPU)
    resolution: float           # bytes (verdicts/resolution.py)
    boundary_only: bool         # read at phase boundaries only: its last read is a phase's own end row


def _kind(column: str) -> str:
    return column.split("_", 1)[1] if column.startswith("gpu") else column


def _own_columns(run, pid: int, kinds: tuple[str, ...], per_gpu: bool) -> list[str]:
    """Per GPU (or once, on the host) the first of `kinds` this process recorded a positive value in."""
    groups = [[f"gpu{i}_{k}" for k in kinds] for i in run.gpu_indices] if per_gpu else [list(kinds)]
    chosen = []
    for candidates in groups:
        for column in candidates:
            if column in run.samples:
                y = series_arrays(run, pid, column)[1]
                if np.isfinite(y).any() and np.nanmax(y) > 0:
                    chosen.append(column)
                    break
    return chosen


def _series(run, pid: int, role: str, columns: list[str]) -> OffloadSeries | None:
    """The columns summed, on the rows where every one was read (NVML columns are empty in between)."""
    if not columns:
        return None
    t = series_arrays(run, pid, columns[0])[0]
    value = np.zeros(len(t))
    for column in columns:
        value = value + series_arrays(run, pid, column)[1]
    measured = np.isfinite(value)
    t, value = t[measured], value[measured]
    kinds = {_kind(c) for c in columns}
    text = " + ".join(KIND_TEXT.get(k, k) for k in dict.fromkeys(_kind(c) for c in columns))
    label = f"{text} ({'+'.join(columns)}) of {process_label(run, pid)}"
    return OffloadSeries(role, Track("device" if columns[0].startswith("gpu") else "host", label, pid, t, value,
                                     value), tuple(columns), resolution_of(columns),
                         kinds <= {"boundary_proc", "boundary_used"})


def _gpu_series(run, pid: int, paused: bool) -> list[OffloadSeries]:
    found = [] if paused else [_series(run, pid, ALLOCATED, _own_columns(run, pid, ("alloc",), True))]
    kinds = PAUSED_DRIVER_KINDS if paused else BUILTIN_DRIVER_KINDS
    found.append(_series(run, pid, DRIVER, _own_columns(run, pid, kinds, True)))
    return [s for s in found if s is not None]


def _heap_at_boundaries(run, pid: int) -> bool:
    """The process read its heap at phase boundaries only (the default without `record --heap`)."""
    meta = next((p for p in run.processes if p.get("pid") == pid), {})
    probe = next((p for p in meta.get("probes") or [] if isinstance(p, dict) and p.get("name") == "heap"), {})
    return probe.get("reads") == "phase boundaries"


def _host_series(run, pid: int) -> list[OffloadSeries]:
    heap = _series(run, pid, ALLOCATED, _own_columns(run, pid, ("heap_used",), False))
    if heap is not None and _heap_at_boundaries(run, pid):
        heap = replace(heap, boundary_only=True)
    rss = _series(run, pid, DRIVER, _own_columns(run, pid, ("rss",), False))
    if heap is None or rss is None:
        return [OffloadSeries(LEVEL, *_fields(s)) for s in (heap or rss,) if s is not None]
    return [heap, rss]


def _fields(s: OffloadSeries) -> tuple:
    return s.track, s.columns, s.resolution, s.boundary_only


def offload_series(run, pid: int, paused: bool, others: bool = True) -> list[OffloadSeries]:
    """The series to judge an offload of process `pid` on (allocated first). With `others`, a process
    that recorded none of its own (phases sent from a program without samples) is judged on the first
    process that has them, the outside sampler (record --exec) first; otherwise none. Kept with the run:
    every offload of a process reads the same series (1,440 offloads re-chose and re-summed them, 60 %
    of a 32-process run's checks)."""
    cache = run.__dict__.setdefault("_offload_series", {})
    key = (pid, paused, others)
    if key not in cache:
        cache[key] = _offload_series(run, pid, paused, others)
    return cache[key]


def _offload_series(run, pid: int, paused: bool, others: bool) -> list[OffloadSeries]:
    def of(p: int) -> list[OffloadSeries]:
        return _gpu_series(run, p, paused) if run.gpu_indices else _host_series(run, p)

    own = of(pid)
    if own or not others:
        return own
    roles = {p.get("pid"): p.get("role") for p in run.processes}
    order = sorted((p for p in pids(run) if p != pid), key=lambda p: roles.get(p) != "exec_parent")
    for candidate in order:
        found = of(candidate)
        if found:  # another process's memory: one level, not two questions about the phase's tensors
            return [OffloadSeries(LEVEL, *_fields(found[-1]))]
    return []


def pids_with_heap(run) -> list[int]:
    return pids_with(run, "heap_used")
