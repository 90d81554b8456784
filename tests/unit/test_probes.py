"""Probes read real sources: this process's RSS and its true peak, host memory, files on disk."""
from __future__ import annotations

import psutil
import pytest
import torch

from miles_profile.probes.disk import DiskProbe
from miles_profile.probes.host import HostProbe
from miles_profile.probes.nvml import open_nvml
from miles_profile.probes.process import OwnProcessProbe
from miles_profile.probes.torch_allocator import open_torch_allocator

MiB = 1024 ** 2


def test_rss_matches_psutil():
    probe = OwnProcessProbe()
    rss, peak, *_ = probe.read()
    assert abs(rss - psutil.Process().memory_info().rss) < 16 * MiB
    assert peak >= rss


def test_rss_split_adds_up_and_sees_anonymous_and_shared_memory(tmp_path):
    import mmap
    probe = OwnProcessProbe()
    rss, _, anon, file, shmem = probe.read()
    assert anon + file + shmem == rss  # the kernel's own split of the same read
    heap = torch.ones(128 * MiB, dtype=torch.uint8)  # anonymous pages, touched
    shared = mmap.mmap(-1, 64 * MiB, flags=mmap.MAP_SHARED)  # shared anonymous: RssShmem
    shared.write(b"x" * (64 * MiB))
    _, _, anon2, _, shmem2 = probe.read()
    assert anon2 - anon >= 120 * MiB
    assert shmem2 - shmem >= 60 * MiB
    del heap
    shared.close()


def test_peak_since_last_read_sees_a_freed_spike_then_resets():
    probe = OwnProcessProbe()
    if not probe.peak_reset:
        pytest.skip("clear_refs not writable here")
    base, *_ = probe.read()
    spike = torch.ones(256 * MiB, dtype=torch.uint8)  # touched pages: resident
    del spike
    rss, peak, *_ = probe.read()
    assert peak - base >= 250 * MiB  # the spike, freed before the read, is in the peak
    assert rss - base < 64 * MiB
    _, peak_after, *_ = probe.read()
    assert peak_after - base < 64 * MiB  # reset: the next interval starts from the current RSS


def test_host_available_matches_psutil():
    (available,) = HostProbe().read()
    assert abs(available - psutil.virtual_memory().available) < 256 * MiB


def test_disk_probe_sums_files_below_watched_dirs(tmp_path):
    probe = DiskProbe()
    assert probe.read() == (None,)  # nothing watched: absent, not zero
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 24)
    probe.watch(str(tmp_path))
    assert probe.read() == (1024,)
    assert probe.read(full=False) == (None,)  # periodic rows skip the walk until 100 ms have passed
    assert probe.read(full=True) == (1024,)  # phase-boundary rows always read


def test_missing_gpu_sources_are_absent_with_a_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    nvml, nvml_meta = open_nvml(lambda: set())
    allocator, allocator_meta = open_torch_allocator()
    assert nvml is None and nvml_meta["active"] is False and nvml_meta["reason"]
    assert allocator is None and allocator_meta["active"] is False and allocator_meta["reason"]


@pytest.mark.gpu
def test_gpu_probes_read_the_device_and_agree_with_pynvml():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import os

    import pynvml
    block = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    allocator, _ = open_torch_allocator()
    values = dict(zip(allocator.columns, allocator.read()))
    assert values["gpu0_alloc"] >= 512 * MiB and values["gpu0_alloc_peak"] >= values["gpu0_alloc"]
    nvml, _ = open_nvml(lambda: {os.getpid()})
    used, proc = nvml.read()[:2]
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert abs(used - pynvml.nvmlDeviceGetMemoryInfo(handle).used) < 64 * MiB
    assert proc is not None and proc >= 512 * MiB
    del block


@pytest.mark.gpu
def test_a_boundary_only_nvml_probe_reads_its_own_gpu_at_boundaries_alone():
    """A process without the host role (probes/nvml.py): no periodic NVML read, and a boundary read
    fills only the GPU it names, with this process's bytes at that instant."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import os
    block = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    nvml, meta = open_nvml(lambda: {os.getpid()}, interval_s=None, which=lambda: (0,))
    assert "boundary" in meta["reads"]
    assert all(v is None for v in nvml.read(full=False))
    values = dict(zip(nvml.columns, nvml.read(full=True)))
    assert values["gpu0_boundary_proc"] >= 256 * MiB and values["gpu0_boundary_used"] >= values["gpu0_boundary_proc"]
    assert all(v is None for c, v in values.items() if not c.startswith("gpu0_"))
    nothing, _ = open_nvml(lambda: {os.getpid()}, interval_s=None, which=tuple)  # CUDA not yet initialised
    assert all(v is None for v in nothing.read(full=True))
    del block
