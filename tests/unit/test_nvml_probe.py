"""probes/nvml.py's read schedule and columns, on a machine without NVML: a stand-in for the pynvml
module (NVML itself can't run here; tests/unit/test_probes.py reads the real one on the H200)."""
from __future__ import annotations

import os
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


class StandInForThisProcess(StandInNvml):
    """One GPU; this process holds 3 GiB on it (the pid the recorder's own-process probe asks for)."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 * GiB)]


def test_a_rank_without_the_host_role_reads_nvml_at_the_begin_of_its_first_phase_after_cuda_init(
        tmp_path, monkeypatch):
    # Item 4 of issue 21: a rank (or engine server) whose host is sampled by another process has NVML only
    # at its own phase boundaries; the begin row of its first phase after CUDA was initialised must have it,
    # else that phase (a torch_memory_saver offload, judged on NVML alone) has no level before it.
    from miles_profile import recorder as recorder_mod
    from miles_profile.host_sampler import HostRole
    from miles_profile.identity import host_name
    from miles_profile.logdir.reader import load_run

    cuda = {"initialised": False}
    identity = {"gpu_uuid": "GPU-0", "cuda_devices": [{"index": 0, "uuid": "GPU-0", "name": "stand-in",
                                                      "total": 80 * GiB}]}
    monkeypatch.setattr(recorder_mod, "cuda_identity", lambda: identity if cuda["initialised"] else None)
    monkeypatch.setattr(recorder_mod, "open_nvml", lambda pids, interval_s=None, which=None: (
        probe := NvmlProbe(StandInForThisProcess(), [0], pids, interval_s, which), probe.describe()))
    run_dir = recorder_mod.create_run(tmp_path, ["test"], 10.0)
    host_role = HostRole(run_dir, host_name())
    assert host_role.take(fallback=False)  # another process of the host holds the host role
    rec = recorder_mod.Recorder(run_dir=run_dir, interval_ms=10.0, disable=("torch_allocator",)).start()
    try:
        cuda["initialised"] = True  # the program initialised CUDA, then begins its first phase
        begin = rec.begin("offload_train", {"expected_bytes": GiB})
        rec.end(begin, "offload_train")
    finally:
        rec.stop()
        host_role.release()
    run = load_run(run_dir)
    start = float(run.phases["start"].iloc[0])
    rows = run.samples[run.samples["t"] <= start]
    assert rows["gpu0_boundary_proc"].iloc[-1] == 3 * GiB  # the "before" row has this process's NVML bytes
