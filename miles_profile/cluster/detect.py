"""Whether the recorded command ran a Ray driver: a process of its tree that loaded Ray's core library.

`record --exec` asks at 1 Hz (a few milliseconds per new process). A driver without cluster.json in the
run means our runtime-env hook never ran in it (a Ray that has none, `uv run`, which skips it, or a
program that replaced RAY_RUNTIME_ENV_HOOK): its workers were not recorded, and the report says so.
"""
from __future__ import annotations

import threading

import psutil

RAY_CORE = b"_raylet."  # ray/_raylet.so, mapped by every Ray driver and worker
LOOKS = 30  # a process that has not loaded Ray in its first 30 s of the run is left alone


class RayDriverWatch:
    def __init__(self, pid: int, interval_s: float = 1.0):
        self.pid, self.interval_s = pid, interval_s
        self.drivers: list[int] = []
        self._checked: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="miles_profile-raywatch", daemon=True)

    def start(self) -> "RayDriverWatch":
        self._thread.start()
        return self

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.drivers

    def _run(self) -> None:
        while not self.drivers and not self._stop.wait(self.interval_s):
            try:
                root = psutil.Process(self.pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in tree:
                # a process is looked at a few times (it may import Ray late), then left alone
                if self._checked.get(proc.pid, 0) >= LOOKS:
                    continue
                self._checked[proc.pid] = self._checked.get(proc.pid, 0) + 1
                if python_like(proc.pid) and maps_ray(proc.pid):
                    self.drivers.append(proc.pid)
                    return


def maps_ray(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            return any(RAY_CORE in line for line in handle)
    except OSError:
        return False


def python_like(pid: int) -> bool:
    """A Python interpreter (a script's shebang puts it first) or the `ray` CLI: the only processes whose
    maps are read (a torch process maps thousands of regions)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            first = handle.read(4096).split(b"\0", 1)[0].rsplit(b"/", 1)[-1]
    except OSError:
        return False
    return first.startswith(b"python") or first in (b"ray", b"uv")
