"""Device memory as the driver sees it (NVML): used per GPU, and used by the recorded processes.

GPU columns are numbered in CUDA's order (honouring CUDA_VISIBLE_DEVICES), so `gpu{i}` of NVML and
of the torch allocator describe the same device.
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Callable, Iterable

from miles_profile.probes import absent


def _visible_handles(pynvml) -> list:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    handles = []
    for item in filter(None, (s.strip() for s in visible.split(","))):
        if item.isdigit():
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(item)))
        else:
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(item))
    return handles


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _GilHeldCalls:
    """The two NVML entry points the sampler calls, bound through `ctypes.PyDLL` so they keep the GIL.

    pynvml binds through `ctypes.CDLL`, which releases the GIL on every call, and its process query
    calls NVML twice and builds Python objects per process. In the sampler thread each release
    forces a thread switch with the training loop (see probes/procfs.py); these calls take
    microseconds, so holding the GIL through them is cheaper. Structs come from pynvml.
    """

    _INSUFFICIENT_SIZE = 7

    def __init__(self, pynvml):
        lib = ctypes.PyDLL(pynvml.nvmlLib._name)
        self._nvml = pynvml
        self._memory_info = lib.nvmlDeviceGetMemoryInfo
        self._processes = lib.nvmlDeviceGetComputeRunningProcesses_v3
        self._memory = pynvml.c_nvmlMemory_t()
        self._count = ctypes.c_uint(0)
        self._array = (pynvml.c_nvmlProcessInfo_v3_t * 64)()
        self._not_available = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value

    def used(self, handle) -> int:
        ret = self._memory_info(handle, ctypes.byref(self._memory))
        if ret:
            raise self._nvml.NVMLError(ret)
        return int(self._memory.used)

    def process_bytes(self, handle, pids: set[int]) -> int | None:
        self._count.value = len(self._array)
        ret = self._processes(handle, ctypes.byref(self._count), self._array)
        if ret == self._INSUFFICIENT_SIZE:  # more processes than slots: grow once, ask again
            self._array = (self._nvml.c_nvmlProcessInfo_v3_t * (2 * self._count.value + 8))()
            return self.process_bytes(handle, pids)
        if ret:
            return None
        total, found = 0, False
        for i in range(self._count.value):
            entry = self._array[i]
            if entry.pid in pids and entry.usedGpuMemory != self._not_available:
                total, found = total + entry.usedGpuMemory, True
        return int(total) if found else None


class NvmlProbe:
    """Driver-side bytes, read at every phase boundary and at most every INTERVAL_S in between (the
    columns are empty in the rows between). NVML has no peak to lose, and on the H200 its queries were
    the costliest part of a sample: with them in every 20 ms row a launch-bound loop slowed by 5%,
    without them by 0.5-1.6% (bench/bench_sampler.py, docs/benchmarks.md). The true peaks come from
    the allocator and /proc, which stay in every row.

    A process that leaves host-wide reads to its host's sampler (host_sampler.py) still reads its own
    GPU at its phase boundaries (`interval_s=None`, `which`), into `gpu{i}_boundary_used` and
    `gpu{i}_boundary_proc`: its NVML bytes then come from the same instant as its allocator's, which the
    ledger's add-up needs (the host sampler's list was up to 100 ms old, and a process that had just
    allocated GiBs showed them as negative memory outside PyTorch). Checks and timelines keep judging
    the host sampler's 100 ms series, which these few values would only thin out."""

    name = "nvml"
    partial_reads = True  # the sampler passes full=False to periodic reads
    INTERVAL_S = 0.1

    def __init__(self, pynvml, handles: list, pids: Callable[[], set[int]], interval_s: float | None = INTERVAL_S,
                 which: Callable[[], Iterable[int]] | None = None):
        """`interval_s`: the least time between periodic reads; None reads at phase boundaries only.
        `which`: the CUDA indices to read, asked at each read (the others stay empty); None: all."""
        self._nvml = pynvml
        self._handles = handles
        self._pids = pids
        self._interval_s = interval_s
        self._which = which
        try:
            self._direct: _GilHeldCalls | None = _GilHeldCalls(pynvml)
        except (AttributeError, OSError, TypeError):  # an nvidia-ml-py without these names
            self._direct = None
        self.devices = [
            {"index": i, "name": _text(pynvml.nvmlDeviceGetName(h)), "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
             "total": int(pynvml.nvmlDeviceGetMemoryInfo(h).total)}
            for i, h in enumerate(handles)
        ]
        # Boundary reads alone are no series to plot or judge between boundaries: their own names.
        kinds = ("used", "proc") if interval_s is not None else ("boundary_used", "boundary_proc")
        self.columns = tuple(f"gpu{i}_{kind}" for i in range(len(handles)) for kind in kinds)
        self._next_read = 0.0

    def read(self, full: bool = True) -> list[int | None]:
        now = time.monotonic()
        if not full and (self._interval_s is None or now < self._next_read):
            return [None] * len(self.columns)
        if self._interval_s is not None:
            self._next_read = now + self._interval_s
        pids, direct, handles = self._pids(), self._direct, self._handles
        indices = range(len(handles)) if self._which is None else [i for i in self._which() if 0 <= i < len(handles)]
        values: list[int | None] = [None] * len(self.columns)
        for i in indices:
            handle = handles[i]
            if direct is not None:
                values[2 * i], values[2 * i + 1] = direct.used(handle), direct.process_bytes(handle, pids)
            else:
                values[2 * i] = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
                values[2 * i + 1] = self._process_bytes(handle, pids)
        return values

    def _process_bytes(self, handle, pids: set[int]) -> int | None:
        # None (absent) when none of our pids is listed, e.g. a container whose pids NVML can't see.
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self._nvml.NVMLError:
            return None
        mine = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
        return int(sum(mine)) if mine else None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "devices": self.devices,
                "gil_held_calls": self._direct is not None,
                "reads": "every phase boundary" + ("" if self._interval_s is None else
                                                   f", and every {self._interval_s * 1000:g} ms in between")
                         + ("" if self._which is None else ", of this process's own GPU")}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def open_nvml(pids: Callable[[], set[int]], interval_s: float | None = NvmlProbe.INTERVAL_S,
              which: Callable[[], Iterable[int]] | None = None) -> tuple[NvmlProbe | None, dict[str, Any]]:
    """The probe (see NvmlProbe for `interval_s` and `which`), or None and why not."""
    try:
        import pynvml  # optional: without it the probe is absent (probes/__init__.py)
        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no GPU
        return None, absent("nvml", f"{type(exc).__name__}: {exc}")
    try:
        handles = _visible_handles(pynvml)
        if not handles:
            pynvml.nvmlShutdown()
            return None, absent("nvml", "no GPU visible")
        probe = NvmlProbe(pynvml, handles, pids, interval_s, which)
    except Exception as exc:
        return None, absent("nvml", f"{type(exc).__name__}: {exc}")
    return probe, probe.describe()
