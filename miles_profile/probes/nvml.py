"""Device memory as the driver sees it (NVML): used per GPU, and used by the recorded processes.

GPU columns are numbered in CUDA's order (honouring CUDA_VISIBLE_DEVICES), so `gpu{i}` of NVML and
of the torch allocator describe the same device.
"""
from __future__ import annotations

import os
from typing import Any, Callable

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


class NvmlProbe:
    name = "nvml"

    def __init__(self, pynvml, handles: list, pids: Callable[[], set[int]]):
        self._nvml = pynvml
        self._handles = handles
        self._pids = pids
        self.devices = [
            {"index": i, "name": _text(pynvml.nvmlDeviceGetName(h)), "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
             "total": int(pynvml.nvmlDeviceGetMemoryInfo(h).total)}
            for i, h in enumerate(handles)
        ]
        self.columns = tuple(c for i in range(len(handles)) for c in (f"gpu{i}_used", f"gpu{i}_proc"))

    def read(self) -> list[int | None]:
        nvml, pids, values = self._nvml, self._pids(), []
        for handle in self._handles:
            values.append(int(nvml.nvmlDeviceGetMemoryInfo(handle).used))
            values.append(self._process_bytes(handle, pids))
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
        return {"name": self.name, "active": True, "devices": self.devices}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def open_nvml(pids: Callable[[], set[int]]) -> tuple[NvmlProbe | None, dict[str, Any]]:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no GPU
        return None, absent("nvml", f"{type(exc).__name__}: {exc}")
    try:
        handles = _visible_handles(pynvml)
        if not handles:
            pynvml.nvmlShutdown()
            return None, absent("nvml", "no GPU visible")
        probe = NvmlProbe(pynvml, handles, pids)
    except Exception as exc:
        return None, absent("nvml", f"{type(exc).__name__}: {exc}")
    return probe, probe.describe()
