"""Write a synthetic run directory in the real log format (docs/log-format.md), for benchmarks.

    python bench/make_synthetic_log.py bench/out/synthetic --samples 10000000

One process with one GPU, sampled every 20 ms: iterations of generate → offload_rollout → train →
offload_train → onload_weights → update_weights → onload_kv with realistic levels, noise, one-sample
spikes in the true-peak columns, and a stretch where NVML per-process memory is absent (NaN gaps).
Offloads really drop their expected_bytes, so every check has something to judge.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

GiB = 1024 ** 3
HOST, PID = "bench", 4242
INTERVAL_S = 0.02
COLUMNS = ["rss", "rss_peak", "host_available", "gpu0_used", "gpu0_proc", "gpu0_alloc", "gpu0_alloc_peak",
           "gpu0_reserved", "pinned", "disk"]
# (phase, samples, gpu allocated level, extra host RSS) per iteration; "" is time outside any phase.
PATTERN = [("generate", 4000, 60, 0), ("offload_rollout", 100, 20, 0), ("train", 4500, 50, 0),
           ("offload_train", 150, 5, 15), ("onload_weights", 100, 12, 15), ("update_weights", 500, 12, 15),
           ("onload_kv", 150, 20, 0), ("", 500, 20, 0)]
ATTRS = {"offload_rollout": {"tags": ["kv_cache"], "expected_bytes": 40 * GiB, "target": "cpu"},
         "offload_train": {"tags": ["weights"], "expected_bytes": 45 * GiB, "target": "cpu"},
         "onload_weights": {"tags": ["weights"]}, "onload_kv": {"tags": ["kv_cache"]}}
PER_ITERATION = sum(n for _, n, _, _ in PATTERN)


def _levels(n_samples: int, first: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Columns for samples [first, first + n_samples)."""
    k = np.arange(first, first + n_samples)
    offsets = np.cumsum([0] + [n for _, n, _, _ in PATTERN])
    slot = np.searchsorted(offsets, k % PER_ITERATION, side="right") - 1
    gpu = np.array([g for _, _, g, _ in PATTERN], dtype=np.int64)[slot] * GiB
    host = np.array([h for _, _, _, h in PATTERN], dtype=np.int64)[slot] * GiB
    noise = rng.integers(0, 256 * 1024 ** 2, n_samples)
    alloc = gpu + noise
    alloc_peak = alloc + rng.integers(0, 64 * 1024 ** 2, n_samples)
    spikes = rng.random(n_samples) < 2e-5  # one-sample spikes only the true peak sees
    alloc_peak[spikes] += rng.integers(1, 8, spikes.sum()) * GiB
    reserved = alloc + 2 * GiB
    rss = 8 * GiB + host + rng.integers(0, 128 * 1024 ** 2, n_samples)
    rss_peak = rss + rng.integers(0, 32 * 1024 ** 2, n_samples)
    proc = pa.array(reserved + GiB, mask=(k % 2_000_000) < 20_000)  # NVML per-process absent for a while
    return {"rss": rss, "rss_peak": rss_peak, "host_available": 512 * GiB - rss, "gpu0_used": reserved + 3 * GiB,
            "gpu0_proc": proc, "gpu0_alloc": alloc, "gpu0_alloc_peak": alloc_peak, "gpu0_reserved": reserved,
            "pinned": np.full(n_samples, 2 * GiB), "disk": pa.nulls(n_samples, pa.int64())}, slot


def write_log(out: Path, n_samples: int, seed: int = 0, chunk: int = 1_000_000) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    start = 1_700_000_000.0
    rng = np.random.default_rng(seed)
    stem = f"{HOST}-{PID}"
    meta = {"format_version": 1, "command": ["bench/make_synthetic_log.py", str(n_samples)], "host": HOST,
            "pid": PID, "start_time": start, "interval_ms": INTERVAL_S * 1000}
    (out / "meta.json").write_text(json.dumps(meta))
    process = {**meta, "stem": stem, "end_time": start + n_samples * INTERVAL_S, "rank": 0, "role": "in_process", "child_pid": None,
               "devices": [{"index": 0, "name": "NVIDIA H200 (synthetic)", "uuid": "GPU-bench", "total": 141 * GiB}],
               "probes": [{"name": "host", "active": True, "total": 520 * GiB}], "columns": COLUMNS}
    (out / f"{stem}.meta.json").write_text(json.dumps(process))
    names = pa.array([p for p, _, _, _ in PATTERN])
    with open(out / f"{stem}.samples.csv", "wb") as file:
        file.write((",".join(["t", "phase", *COLUMNS]) + "\n").encode())
        for first in range(0, n_samples, chunk):
            n = min(chunk, n_samples - first)
            columns, slot = _levels(n, first, rng)
            t = np.round(start + np.arange(first, first + n) * INTERVAL_S, 6)
            table = pa.table({"t": t, "phase": pa.DictionaryArray.from_arrays(pa.array(slot, pa.int32()), names),
                              **columns})
            pacsv.write_csv(table, file, pacsv.WriteOptions(include_header=False, quoting_style="none"))
    _write_events(out / f"{stem}.events.jsonl", n_samples, start)
    return out


def _write_events(path: Path, n_samples: int, start: float) -> None:
    lines, phase_id = [], 0
    for iteration in range(-(-n_samples // PER_ITERATION)):
        k = iteration * PER_ITERATION
        for name, n, _, _ in PATTERN:
            if name and k < n_samples:
                phase_id += 1
                # begin just after the sample before the phase, end just after its last sample (as the recorder does)
                t_begin = start + (k - 1) * INTERVAL_S + 0.001
                t_end = start + (min(k + n, n_samples) - 1) * INTERVAL_S + 0.001
                attrs = {"rollout_id": iteration, **ATTRS.get(name, {})}
                lines.append(json.dumps({"t": t_begin, "kind": "begin", "name": name, "pid": PID, "id": phase_id,
                                         "attrs": attrs}))
                lines.append(json.dumps({"t": t_end, "kind": "end", "name": name, "pid": PID, "id": phase_id,
                                         "attrs": {"status": "ok"}}))
            k += n
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    run = write_log(args.out, args.samples, args.seed)
    size = sum(f.stat().st_size for f in run.iterdir())
    print(f"wrote {args.samples:,} samples to {run} ({size / 1e9:.2f} GB) in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
