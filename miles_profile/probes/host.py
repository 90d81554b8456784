"""Host memory still available to new allocations (`MemAvailable`)."""
from __future__ import annotations

from typing import Any

import psutil

from miles_profile.probes.procfs import ProcFile, kib_fields


class HostProbe:
    name = "host"
    columns = ("host_available",)

    def __init__(self) -> None:
        try:
            self._meminfo: ProcFile | None = ProcFile("/proc/meminfo")
        except OSError:  # not Linux: psutil is slower but portable
            self._meminfo = None
        self.total = psutil.virtual_memory().total

    def read(self) -> tuple[int | None]:
        if self._meminfo is None:
            return (psutil.virtual_memory().available,)
        return tuple(kib_fields(self._meminfo.read(), b"MemAvailable:"))  # type: ignore[return-value]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "total": self.total}

    def close(self) -> None:
        if self._meminfo is not None:
            self._meminfo.close()
