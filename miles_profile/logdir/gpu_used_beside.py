"""Each GPU's NVML used (host_reader.gpu_used_arrays: the 64 host.csv files of a 1,024-process fleet,
~0.6 s) read on the other core while this one parses the events, which do not need them.

    start(dirs, processes, lazy) -> SideProcess | None    # at load_run's start; None: not worth a child
    take(side, dirs, warnings) -> {(host, gpu_uuid): (t, used)}   # the child's, else read here

The child is forked before the events are parsed (pyarrow's thread pools not started yet: only
jemalloc's background thread and OpenBLAS's are running; see logdir/side_process.py). What it read is
used only when reading added no warning: a warning is the parent's to add, where and when it reads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from miles_profile.logdir import side_process
from miles_profile.logdir.host_reader import gpu_used_arrays

# The fleet view reads these for a run of many processes (report/fleet_report.py); forking and sending
# back the arrays cost ~0.05 s, so only where the read is large: 256 processes is 16 hosts' files.
SIDE_MIN_PROCESSES = 256


def start(dirs: list[Path], processes: list[dict[str, Any]], lazy: bool) -> side_process.SideProcess | None:
    """`lazy`: the run is read without its samples (a fleet: visualize's and the dashboard's preload)."""
    if not lazy or len(processes) < SIDE_MIN_PROCESSES:
        return None
    return side_process.start(_read, list(dirs))


def take(side: side_process.SideProcess | None, dirs: list[Path], warnings: list[str]):
    ok, value = side.result() if side is not None else (False, None)
    if ok and value is not None:
        return value
    return gpu_used_arrays(dirs, warnings)


def _read(dirs: list[Path]):
    warned: list[str] = []
    found = gpu_used_arrays(dirs, warned)
    return None if warned else found
