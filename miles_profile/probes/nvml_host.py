"""Every GPU of the host and every process on it, through an injectable NVML backend.

The host sampler reads this once per host (not once per rank). Unlike probes/nvml.py, which follows a
process's CUDA order, it lists all GPUs whatever CUDA_VISIBLE_DEVICES says and keys them by UUID: a GPU
is (host, UUID), never a CUDA index. The backend is an object with `devices()`, `used(handle)`,
`processes(handle)` and `close()` (miles/dashboard/gpu_sampler.py's design): `PynvmlBackend` is the
real one; tests pass a stand-in where no GPU exists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from miles_profile.probes import absent


@dataclass(frozen=True)
class Gpu:
    uuid: str
    name: str
    total: int          # bytes
    index: int          # NVML's index on this host (not a CUDA index)
    pci_bus_id: str
    handle: Any = None  # the backend's own reference


class NvmlBackend(Protocol):
    def devices(self) -> list[Gpu]: ...

    def used(self, handle: Any) -> int: ...

    def processes(self, handle: Any) -> list[tuple[int, int | None]]: ...  # (pid, bytes or None)

    def close(self) -> None: ...


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """nvidia-ml-py. Raises at construction when there is no library, driver or GPU."""

    def __init__(self):
        import pynvml  # optional: the caller turns its ImportError into an absent probe
        pynvml.nvmlInit()
        self._nvml = pynvml
        self._not_available = getattr(pynvml, "NVML_VALUE_NOT_AVAILABLE_ulonglong", None)
        self._not_available = getattr(self._not_available, "value", None)

    def devices(self) -> list[Gpu]:
        nvml, found = self._nvml, []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            found.append(Gpu(_text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h)),
                             int(nvml.nvmlDeviceGetMemoryInfo(h).total), i,
                             _text(nvml.nvmlDeviceGetPciInfo(h).busId), h))
        return found

    def used(self, handle) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)

    def processes(self, handle) -> list[tuple[int, int | None]]:
        # A process with compute and graphics contexts is listed by both with the same bytes.
        seen: dict[int, int | None] = {}
        for query in (self._nvml.nvmlDeviceGetComputeRunningProcesses,
                      self._nvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                listed = query(handle)
            except self._nvml.NVMLError:
                continue
            for p in listed:
                used = p.usedGpuMemory
                used = None if used is None or used == self._not_available else int(used)
                if p.pid not in seen or (used or 0) > (seen[p.pid] or 0):
                    seen[p.pid] = used
        return list(seen.items())

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


class HostGpuProbe:
    """One read: the bytes used on each GPU (wide, by UUID) and the bytes of each process on it."""

    name = "nvml_host"

    def __init__(self, backend: NvmlBackend, gpus: Sequence[Gpu]):
        self._backend = backend
        self.gpus = list(gpus)
        self.columns = tuple(f"gpu_used:{g.uuid}" for g in self.gpus)

    def read(self) -> tuple[list[int | None], list[tuple[str, int, int | None]]]:
        used: list[int | None] = []
        procs: list[tuple[str, int, int | None]] = []
        for gpu in self.gpus:
            try:
                used.append(self._backend.used(gpu.handle))
                procs.extend((gpu.uuid, pid, nbytes) for pid, nbytes in self._backend.processes(gpu.handle))
            except Exception:  # one GPU fallen off the bus: its cells go empty, the others go on
                used.append(None)
        return used, procs

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True,
                "gpus": [{"uuid": g.uuid, "name": g.name, "total": g.total, "index": g.index,
                          "pci_bus_id": g.pci_bus_id} for g in self.gpus]}

    def close(self) -> None:
        self._backend.close()


def open_host_gpus(backend: NvmlBackend | None = None) -> tuple[HostGpuProbe | None, dict[str, Any]]:
    """The probe over every GPU of the host, or None with the reason (no NVML, no GPU)."""
    try:
        backend = backend if backend is not None else PynvmlBackend()
    except Exception as exc:
        return None, absent("nvml_host", f"{type(exc).__name__}: {exc}")
    try:
        gpus = backend.devices()
    except Exception as exc:
        backend.close()
        return None, absent("nvml_host", f"{type(exc).__name__}: {exc}")
    if not gpus:
        backend.close()
        return None, absent("nvml_host", "no GPU on this host")
    probe = HostGpuProbe(backend, gpus)
    return probe, probe.describe()
