"""Cost of one read of each probe, and of one whole sample (all probes + the CSV row)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from miles_profile.logdir.writer import SampleWriter
from miles_profile.probes.disk import DiskProbe
from miles_profile.probes.host import HostProbe
from miles_profile.probes.nvml import open_nvml
from miles_profile.probes.process import OwnProcessProbe
from miles_profile.probes.torch_allocator import open_torch_allocator
from miles_profile.sampler import Sampler


def _per_call_us(fn, n: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def _naive_sample(nvml_handle) -> None:
    """What a straightforward sampler calls: one torch call per number, psutil, NVML."""
    import psutil
    psutil.Process().memory_info()
    if torch.cuda.is_available():
        torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.max_memory_allocated()
        torch.cuda.memory_stats()
    if nvml_handle is not None:
        import pynvml
        pynvml.nvmlDeviceGetMemoryInfo(nvml_handle)
        pynvml.nvmlDeviceGetComputeRunningProcesses(nvml_handle)


def measure_probe_cost(tmp: Path, n: int) -> dict[str, Any]:
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # initialise CUDA, as a training program has
    offload_dir = tmp / "offload"
    offload_dir.mkdir(exist_ok=True)
    for i in range(16):
        (offload_dir / f"chunk{i}.safetensors").write_bytes(b"x" * 1024)
    process = OwnProcessProbe()
    probes: list = [process, HostProbe()]
    nvml, _ = open_nvml(lambda: process.pids)
    allocator, _ = open_torch_allocator()
    probes += [p for p in (nvml, allocator) if p is not None]
    probes.append(DiskProbe((str(offload_dir),)))
    result: dict[str, Any] = {"reads": n, "per_probe_us": {}}
    for probe in probes:
        result["per_probe_us"][probe.name] = round(_per_call_us(probe.read, n), 1)
    writer = SampleWriter(tmp, "bench-cost", Sampler.columns_of(probes), flush_interval_s=0.5)
    sampler = Sampler(probes, writer, 1.0, lambda: "train")
    result["whole_sample_us"] = round(_per_call_us(sampler.sample, n), 1)
    handle = nvml._handles[0] if nvml is not None else None
    result["naive_sample_us"] = round(_per_call_us(lambda: _naive_sample(handle), n), 1)
    result["ratio_naive_over_ours"] = round(result["naive_sample_us"] / result["whole_sample_us"], 2)
    sampler.stop()
    return result
