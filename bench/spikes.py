"""Spike capture: short allocation spikes between samples, caught by our per-sample true peak
against a polling sampler of the same interval (the current value at each sample, no peak reset).

A spike counts as caught when the recorded peak above the value before it is within 1% of its size.
Both rates come from the same recorded run: the polling baseline reads the `current` column.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import miles_profile as mp
from bench.common import sync

MiB = 1024 ** 2


def _spike_schedule(n: int, low: int, high: int, seed: int) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [(rng.randint(low // MiB, high // MiB) * MiB, rng.uniform(0.001, 0.005)) for _ in range(n)]


def _run_spikes(alloc: Callable[[int], Any], schedule, interval_s: float, dev) -> list[tuple[float, float]]:
    spans = []
    rng = random.Random(1)
    for size, hold in schedule:
        time.sleep(interval_s * rng.uniform(2.2, 3.5))  # isolated: at least two samples apart
        start = time.time()
        block = alloc(size)
        sync(dev)
        time.sleep(hold)
        del block
        sync(dev)
        spans.append((start, time.time()))
    return spans


def _rates(run, spans, schedule, current: str, peak: str) -> dict[str, Any]:
    s = run.samples
    t = s["t"].to_numpy()
    cur, pk = s[current].to_numpy(dtype=float), s[peak].to_numpy(dtype=float)
    ours = polled = ours_5pct = 0
    errors, abs_errors = [], []
    starts = [a for a, _ in spans] + [np.inf]
    for k, ((start, _end), (size, _)) in enumerate(zip(spans, schedule)):
        before = np.searchsorted(t, start, side="right") - 1
        window = (t > start) & (t < starts[k + 1])
        if before < 0 or not window.any():
            continue
        base = cur[before]
        seen_peak = np.nanmax(pk[window]) - base
        seen_poll = np.nanmax(cur[window]) - base
        errors.append(abs(seen_peak - size) / size)
        abs_errors.append(abs(seen_peak - size))
        ours += abs(seen_peak - size) <= 0.01 * size
        ours_5pct += abs(seen_peak - size) <= 0.05 * size
        polled += abs(seen_poll - size) <= 0.01 * size
    n = len(spans)
    return {"spikes": n, "caught_true_peak": int(ours), "caught_polling": int(polled),
            "rate_true_peak": round(ours / n, 4), "rate_polling": round(polled / n, 4),
            "rate_true_peak_within_5pct": round(ours_5pct / n, 4),
            "max_size_error": round(float(max(errors)), 5) if errors else None,
            "max_abs_error_mib": round(float(max(abs_errors)) / MiB, 3) if abs_errors else None}


def measure_spikes(dev: torch.device, tmp: Path, interval_ms: float, spikes: int) -> dict[str, Any]:
    interval_s = interval_ms / 1000
    result: dict[str, Any] = {"interval_ms": interval_ms}
    targets = [("host", "cpu", 64 * MiB, 512 * MiB, "rss", "rss_peak")]
    if dev.type == "cuda":
        torch.zeros(1, device=dev)
        targets.append(("gpu", "cuda", 64 * MiB, 1024 * MiB, "gpu0_alloc", "gpu0_alloc_peak"))
    for name, where, low, high, current, peak in targets:
        schedule = _spike_schedule(spikes, low, high, seed=len(name))
        alloc = (lambda n: torch.ones(n, dtype=torch.uint8)) if where == "cpu" else \
                (lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"))
        # Host fills run on one thread: Linux keeps RSS in per-CPU counters that /proc reads with a
        # slack of up to 32 pages per CPU (2 MiB on 16 cores, 3% of a 64 MiB spike), and faults spread
        # over many CPUs move that slack between two reads. One faulting CPU keeps it below 128 KiB.
        threads = torch.get_num_threads()
        torch.set_num_threads(1 if where == "cpu" else threads)
        with mp.Recorder(tmp / f"spikes_{name}", interval_ms=interval_ms) as rec:
            spans = _run_spikes(alloc, schedule, interval_s, dev)
        torch.set_num_threads(threads)
        result[name] = _rates(mp.load(rec.run_dir), spans, schedule, current, peak)
        result[name]["sizes_mib"] = [low // MiB, high // MiB]
    return result
