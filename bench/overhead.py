"""Step-time overhead of recording on a launch-bound and a compute-bound training loop.

Modes run interleaved, in a rotated order each round, so drift on a noisy machine hits all alike:
`off`, `recorder` (ours, default interval), `naive_100hz` (a thread calling the usual per-number
APIs at 100 Hz) and, on CUDA, `memory_history` (torch.cuda.memory._record_memory_history).
`off_again` records nothing either: its ratio to `off` is this run's noise floor, printed beside the
others so a ratio is read against the noise of the same minutes.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from bench.common import median, quartiles, sync
from bench.probe_cost import _naive_sample
from miles_profile.recorder import Recorder


def _loop(dev: torch.device, kind: str) -> tuple[Callable[[], None], int]:
    torch.manual_seed(0)
    if kind == "launch_bound":  # many small kernels: 24 layers of width 256
        width, depth, batch, dtype, steps = 256, 24, 64, torch.float32, 100 if dev.type == "cuda" else 20
    elif dev.type == "cuda":
        width, depth, batch, dtype, steps = 8192, 4, 8192, torch.bfloat16, 20
    else:
        width, depth, batch, dtype, steps = 1024, 3, 1024, torch.float32, 5
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.Sequential(*layers).to(dev, dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=dev, dtype=dtype)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        opt.step()
    return step, steps


class _NaiveSampler:
    def __init__(self, hz: float):
        self._stop = threading.Event()
        self._period = 1.0 / hz
        handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            pass
        self._handle = handle
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            _naive_sample(self._handle)

    def __enter__(self):
        self._thread.start()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class _MemoryHistory:
    def __enter__(self):
        torch.cuda.memory._record_memory_history(max_entries=100_000)

    def __exit__(self, *exc):
        torch.cuda.memory._record_memory_history(enabled=None)


def _context(mode: str, tmp: Path, interval_ms: float):
    if mode == "recorder":
        return Recorder(tmp / "overhead_logs", interval_ms=interval_ms)
    if mode.startswith("recorder_"):  # recorder_50ms, recorder_no_nvml, recorder_no_torch_allocator
        variant = mode[len("recorder_"):]
        if variant.endswith("ms"):
            return Recorder(tmp / "overhead_logs", interval_ms=float(variant[:-2]))
        return Recorder(tmp / "overhead_logs", interval_ms=interval_ms, disable=[variant[3:]])
    if mode == "naive_100hz":
        return _NaiveSampler(100.0)
    if mode == "memory_history":
        return _MemoryHistory()
    return _Nothing()


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _time_block(step: Callable[[], None], steps: int, dev: torch.device) -> float:
    step()
    sync(dev)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(dev)
    return (time.perf_counter() - start) / steps


def measure_overhead(dev: torch.device, tmp: Path, interval_ms: float, rounds: int,
                     variants: list[str] = ()) -> dict[str, Any]:
    """`variants`: extra recorder modes for diagnosis, e.g. recorder_50ms, recorder_no_nvml."""
    modes = ["off", "off_again", "recorder", *variants, "naive_100hz"] + (
        ["memory_history"] if dev.type == "cuda" else [])
    result: dict[str, Any] = {"interval_ms": interval_ms, "rounds": rounds, "loops": {}}
    for kind in ("launch_bound", "compute_bound"):
        step, steps = _loop(dev, kind)
        for _ in range(3):
            step()
        times: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                with _context(mode, tmp, interval_ms):
                    times[mode].append(_time_block(step, steps, dev))
        off = times["off"]
        per_round = {m: [t / o for t, o in zip(times[m], off)] for m in modes if m != "off"}
        result["loops"][kind] = {
            "steps_per_block": steps, "step_ms_off": round(median(off) * 1e3, 3),
            "ratio_vs_off": {m: round(median(r), 4) for m, r in per_round.items()},
            # The middle half of the per-round ratios: how far one round's ratio strays.
            "ratio_quartiles": {m: [round(q, 4) for q in quartiles(r)] for m, r in per_round.items()}}
    return result
