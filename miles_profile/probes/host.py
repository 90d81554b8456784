"""Host memory still available to new allocations (`MemAvailable`)."""
from __future__ import annotations

from typing import Any

import psutil

from miles_profile.probes.procfs import open_read, read_kib_fields


class HostProbe:
    name = "host"
    columns = ("host_available",)

    def __init__(self) -> None:
        try:
            self._fd: int | None = open_read("/proc/meminfo")
        except OSError:  # not Linux: psutil is slower but portable
            self._fd = None
        self.total = psutil.virtual_memory().total

    def read(self) -> tuple[int | None]:
        if self._fd is None:
            return (psutil.virtual_memory().available,)
        return tuple(read_kib_fields(self._fd, b"MemAvailable:"))  # type: ignore[return-value]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "total": self.total}

    def close(self) -> None:
        if self._fd is not None:
            import os
            os.close(self._fd)
