"""What one scrape reports for a host: plain data, built by host_state.py and rendered by families.py.

Bytes are integers; a value nobody measured is None (its series is left out, never a zero).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The live offload verdict's states; the exposition labels the last offload's with it.
VERDICTS = ("pass", "fail", "too_small", "n/a")


@dataclass
class Offload:
    """The last instance of one offload (phase, tag) of a process, and how many ended."""
    declared: int | None       # the phase's expected_bytes
    freed: int | None          # level before the phase minus level at its end (negative: it grew)
    series: str                # the series judged: "allocated" (GPU allocator) or "resident" (host RSS)
    verdict: str               # one of VERDICTS
    count: int = 0


@dataclass
class ProcessReading:
    rank: str
    role: str
    pid: int
    gpu: str = ""               # NVML index of the process's GPU on this host ("" before CUDA, or none)
    uuid: str = ""
    phase: str = "none"         # innermost open phase now
    allocated: int | None = None
    reserved: int | None = None
    nvml_used: int | None = None
    resident: int | None = None
    # Per phase, the true peak over the rows since the previous scrape: (allocator allocated, RSS).
    peaks: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    floor_allocated: int | None = None   # the lowest level of the last complete iteration
    floor_resident: int | None = None
    iterations: int = 0                  # complete iterations seen
    offloads: dict[tuple[str, str], Offload] = field(default_factory=dict)  # (phase, tag) -> last
    transitions: dict[str, float] = field(default_factory=dict)  # phase -> seconds of its last instance


@dataclass
class GpuReading:
    index: str
    uuid: str
    total: int | None
    used: int | None


@dataclass
class HostReading:
    hostname: str
    gpus: list[GpuReading] = field(default_factory=list)
    processes: list[ProcessReading] = field(default_factory=list)
    kills: dict[str, int] = field(default_factory=dict)  # cause -> deaths seen on this host
