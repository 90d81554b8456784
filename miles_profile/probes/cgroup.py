"""The container's memory limit and usage from its cgroup (v2 `memory.max`/`memory.current`, v1
`memory.limit_in_bytes`/`memory.usage_in_bytes`), as the kernel's OOM killer sees them.

The cgroup is the sampling process's own (`/proc/self/cgroup`), which inside a container is the
container's. Usage is that cgroup's `memory.current` (v1 `memory.usage_in_bytes`). v2: the limit is
the tightest `memory.max` from that cgroup up to the mount root; v1: the effective (hierarchical)
limit from `memory.stat`. No limit ("max", or v1's near-2**63 value) reads as None: unlimited, shown
as empty. The usage file stays open (one pread a read); limits, which rarely change, are re-read every
LIMIT_REFRESH_S (parsing them every time was most of a 190 us host sample on the dev VM).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from miles_profile.probes.procfs import ProcFile

_UNLIMITED = 2 ** 62  # v1 writes PAGE_COUNTER_MAX * page size (~2**63) for "no limit"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


def own_cgroups(proc_cgroup: Path) -> dict[str, str]:
    """controller ('' for v2) -> path, from /proc/self/cgroup."""
    found = {}
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                found[controller] = parts[2]
    return found


def cgroup_dir(mount: Path, path: str) -> Path:
    """The cgroup's directory; a cgroup namespace shows its own cgroup as the mount root."""
    candidate = mount / path.lstrip("/")
    return candidate if candidate.is_dir() else mount


class CgroupProbe:
    name = "cgroup"
    columns = ("cgroup_usage", "cgroup_limit")
    LIMIT_REFRESH_S = 5.0

    def __init__(self, root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup"):
        root = Path(root)
        own = own_cgroups(Path(proc_cgroup))
        self.version: int | None = None
        self._usage: Path | None = None
        self._limits: list[Path] = []
        self._v1_stat: Path | None = None
        v1 = root / "memory"
        where = cgroup_dir(v1, own.get("memory", "/")) if v1.is_dir() else v1
        if (where / "memory.usage_in_bytes").exists():
            self.version, self._usage = 1, where / "memory.usage_in_bytes"
            self._limits, self._v1_stat = [where / "memory.limit_in_bytes"], where / "memory.stat"
        else:
            for mount in (root, root / "unified"):
                if (mount / "cgroup.controllers").exists():
                    where = cgroup_dir(mount, own.get("", "/"))
                    chain = [where, *[p for p in where.parents if p == mount or mount in p.parents]]
                    self._limits = [p / "memory.max" for p in chain if (p / "memory.max").exists()]
                    owner = next((p for p in chain if (p / "memory.current").exists()), None)
                    if owner is not None:
                        self.version, self._usage = 2, owner / "memory.current"
                        break
        self.reason = "" if self.version else "no cgroup memory controller found"
        self._usage_file: ProcFile | None = None
        if self._usage is not None:
            try:
                self._usage_file = ProcFile(str(self._usage), size=64)
            except OSError:
                pass
        self._limit: int | None = None
        self._limit_due = 0.0

    @property
    def active(self) -> bool:
        return self.version is not None

    def _v1_hierarchical_limit(self) -> int | None:
        try:
            for line in self._v1_stat.read_text().splitlines():
                if line.startswith("hierarchical_memory_limit "):
                    value = int(line.split()[1])
                    return None if value >= _UNLIMITED else value
        except (OSError, ValueError, AttributeError):
            pass
        return None

    def _read_limit(self) -> int | None:
        limits = [v for v in (_read_int(p) for p in self._limits) if v is not None]
        if self.version == 1:
            hierarchical = self._v1_hierarchical_limit()
            if hierarchical is not None:
                limits.append(hierarchical)
        return min(limits) if limits else None

    def _read_usage(self) -> int | None:
        if self._usage_file is None:
            return _read_int(self._usage)
        try:
            return int(self._usage_file.read())
        except (OSError, ValueError):
            return None

    def read(self) -> tuple[int | None, int | None]:
        if not self.active:
            return (None, None)
        now = time.monotonic()
        if now >= self._limit_due:
            self._limit, self._limit_due = self._read_limit(), now + self.LIMIT_REFRESH_S
        return (self._read_usage(), self._limit)

    def describe(self) -> dict[str, Any]:
        if not self.active:
            return {"name": self.name, "active": False, "reason": self.reason}
        return {"name": self.name, "active": True, "version": self.version, "usage_file": str(self._usage),
                "note": "cgroup_limit empty: no limit"}

    def close(self) -> None:
        if self._usage_file is not None:
            self._usage_file.close()
            self._usage_file = None
