"""probes/nvml.py's read schedule and columns, on a machine without NVML: a stand-in for the pynvml
module (NVML itself can't run here; tests/unit/test_probes.py reads the real one on the H200)."""
from __future__ import annotations

from types import SimpleNamespace

from miles_profile.probes.nvml import NvmlProbe

GiB = 1024 ** 3


class StandInNvml:
    """The pynvml calls NvmlProbe makes, over two GPUs; pid 7 holds 1 GiB on each."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.memory_reads = 0

    def nvmlDeviceGetName(self, handle):
        return b"stand-in"

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.memory_reads += 1
        return SimpleNamespace(total=80 * GiB, used=(handle + 2) * GiB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=7, usedGpuMemory=GiB), SimpleNamespace(pid=8, usedGpuMemory=3 * GiB)]


def test_the_host_role_reads_every_gpu_at_boundaries_and_when_due():
    nvml = StandInNvml()
    probe = NvmlProbe(nvml, [0, 1], lambda: {7})
    assert probe.columns == ("gpu0_used", "gpu0_proc", "gpu1_used", "gpu1_proc")
    assert probe.read(full=False) == [2 * GiB, GiB, 3 * GiB, GiB]  # the first periodic read is due
    assert probe.read(full=False) == [None] * 4  # then not before 100 ms
    assert probe.read(full=True) == [2 * GiB, GiB, 3 * GiB, GiB]  # a boundary always


def test_a_process_without_the_host_role_reads_its_own_gpu_at_its_boundaries_only():
    nvml = StandInNvml()
    own: tuple[int, ...] = ()
    probe = NvmlProbe(nvml, [0, 1], lambda: {7}, interval_s=None, which=lambda: own)
    assert probe.columns == ("gpu0_boundary_used", "gpu0_boundary_proc", "gpu1_boundary_used", "gpu1_boundary_proc")
    assert probe.read(full=True) == [None] * 4 and nvml.memory_reads == 2  # CUDA not initialised: nothing read
    own = (1,)
    assert probe.read(full=False) == [None] * 4  # never between boundaries
    assert probe.read(full=True) == [None, None, 3 * GiB, GiB]  # its GPU only
    assert "boundary" in probe.describe()["reads"] and "own GPU" in probe.describe()["reads"]
