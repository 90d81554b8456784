"""A stand-in for nvidia-ml-py on this CPU machine (tests/integration/test_prometheus.py): one 80 GiB GPU
whose processes are the recorded trainer ranks and the stand-in GPU rank, each holding its RSS.

Only `record` (the host sampler's process) sees it; every other process gets NVML's "library not
found", as on a machine without a driver, so the ranks record what they would on CPU.
"""
import os
import sys
import time
from types import SimpleNamespace

import psutil

UUID = "GPU-0e4b1a2c-fake-4d6e-9b1a-000000000001"
TOTAL = 80 * 1024**3
_CONTEXT = 512 * 1024**2  # what the device holds besides the listed processes
_WATCHED = ("trainer.train", "metrics_gpu_rank")
_listed: tuple[float, list] = (0.0, [])


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


NVML_VALUE_NOT_AVAILABLE_ulonglong = SimpleNamespace(value=2**64 - 1)


def nvmlInit():
    if not sys.argv[0].endswith(os.path.join("miles_profile", "record.py")):
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(i):
    if i != 0:
        raise NVMLError("invalid index")
    return 0


def nvmlDeviceGetHandleByUUID(uuid):
    return 0


def nvmlDeviceGetUUID(handle):
    return UUID


def nvmlDeviceGetName(handle):
    return "Fake GPU 80GB"


def nvmlDeviceGetPciInfo(handle):
    return SimpleNamespace(busId="00000000:01:00.0")


def _processes():
    global _listed
    when, procs = _listed
    if time.monotonic() - when > 0.5:  # a process scan per host sample would load the shared machine
        procs = []
        for p in psutil.process_iter(["pid", "cmdline", "memory_info"]):
            cmdline = " ".join(p.info["cmdline"] or ())
            if any(w in cmdline for w in _WATCHED) and p.info["memory_info"] is not None:
                procs.append(SimpleNamespace(pid=p.info["pid"], usedGpuMemory=p.info["memory_info"].rss))
        _listed = (time.monotonic(), procs)
    return procs


def nvmlDeviceGetComputeRunningProcesses(handle):
    return _processes()


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return []


def nvmlDeviceGetMemoryInfo(handle):
    used = _CONTEXT + sum(p.usedGpuMemory for p in _processes())
    return SimpleNamespace(total=TOTAL, used=used, free=TOTAL - used)
