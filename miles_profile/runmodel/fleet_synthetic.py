"""Synthetic PhaseTables (see fleet.py) for tests and benchmarks: H hosts x G GPUs, on each GPU one
actor rank and the engine process serving it, N iterations of the canonical colocated loop.

    synthetic_table(hosts=2, gpus=8, iterations=20, *, hot_rank=None, creep_rank=None,
                    shortfall=None, keep_kv_rank=None, with_used=True, seed=0) -> DataFrame

One iteration, phases strictly one after another (engine: generate, offload_kv, offload_weights,
onload_weights, onload_kv; actor: onload_train, train, offload_train, update_weights), 13.5 s in all,
so 30 minutes are 133 iterations, about 600 phases per process. Memory (bytes, per process, its own
NVML series `proc`; the device's `used` is both processes plus 300 MiB outside them):
actor: 1 GiB context, 12 GiB training state while onloaded, 8 GiB activations in train;
engine: 1 GiB context, 4 GiB weights, 20 GiB KV cache; peaks carry +-0.5 % seeded noise.

Injections (each names an actor rank; the GPU is that rank's):
  hot_rank=(rank, extra_bytes)     its train phases peak `extra_bytes` higher
  creep_rank=(rank, bytes_per_it)  its floor (and every level) rises by that much each iteration
  shortfall=(rank, iteration, b)   its engine's offload_kv of that iteration frees `b` less
  keep_kv_rank=rank                its engine never releases the KV cache (both footprints held)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile import names

GiB = 1024 ** 3
MiB = 1024 ** 2
T_START = 1_780_000_000.0
GPU_TOTAL = 80 * GiB
_GAP = 0.05
CTX, STATE, ACT, UPDATE = 1 * GiB, 12 * GiB, 8 * GiB, 2 * GiB
WEIGHTS, KV = 4 * GiB, 20 * GiB
OUTSIDE = 300 * MiB

# (phase, role, seconds, first, floor, peak, last, expected) in bytes above the process's context.
_E_FULL, _E_W = WEIGHTS + KV, WEIGHTS
_SLOTS = (
    (names.GENERATE, "engine", 4.0, _E_FULL, _E_FULL, _E_FULL + GiB, _E_FULL, np.nan),
    (names.OFFLOAD_KV, "engine", 0.5, _E_FULL, _E_W, _E_FULL, _E_W, KV),
    (names.OFFLOAD_WEIGHTS, "engine", 0.5, _E_W, 0, _E_W, 0, WEIGHTS),
    (names.ONLOAD_TRAIN, "actor", 0.5, 0, 0, STATE, STATE, np.nan),
    (names.TRAIN, "actor", 4.0, STATE, STATE, STATE + ACT, STATE, np.nan),
    (names.OFFLOAD_TRAIN, "actor", 0.5, STATE, 0, STATE, 0, STATE),
    (names.ONLOAD_WEIGHTS, "engine", 0.5, 0, 0, _E_W, _E_W, np.nan),
    (names.UPDATE_WEIGHTS, "actor", 1.5, 0, 0, UPDATE, 0, np.nan),
    (names.ONLOAD_KV, "engine", 0.5, _E_W, _E_W, _E_FULL, _E_FULL, np.nan),
)
# What the other process of the GPU holds (above its context) during each slot.
_OTHER = {names.GENERATE: 0, names.OFFLOAD_KV: 0, names.OFFLOAD_WEIGHTS: 0, names.ONLOAD_TRAIN: 0,
          names.TRAIN: 0, names.OFFLOAD_TRAIN: 0, names.ONLOAD_WEIGHTS: 0, names.UPDATE_WEIGHTS: _E_W,
          names.ONLOAD_KV: 0}
# Slots during which a KV cache that was never released is still held by the engine.
_KV_HELD = (names.OFFLOAD_WEIGHTS, names.ONLOAD_TRAIN, names.TRAIN, names.OFFLOAD_TRAIN,
            names.ONLOAD_WEIGHTS, names.UPDATE_WEIGHTS)
ITERATION_S = sum(s[2] + _GAP for s in _SLOTS)


def iterations_for(minutes: float) -> int:
    return max(1, int(minutes * 60 // ITERATION_S))


def _uuid(h: int, g: int) -> str:
    return f"GPU-{h:08x}-{g:04x}-4000-8000-{h * 64 + g:012x}"


def synthetic_table(hosts: int = 2, gpus: int = 8, iterations: int = 20, *, hot_rank=None, creep_rank=None,
                    shortfall=None, keep_kv_rank=None, with_used: bool = True, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    slots = pd.DataFrame(list(_SLOTS), columns=["phase", "role", "dur", "first", "floor", "peak", "last", "expected"])
    offsets = np.cumsum(np.r_[0.0, (slots["dur"] + _GAP).to_numpy()[:-1]])
    n_gpu, n_slot = hosts * gpus, len(slots)
    # one row per (gpu, iteration, slot), flattened in that order
    gpu = np.repeat(np.arange(n_gpu), iterations * n_slot)
    it = np.tile(np.repeat(np.arange(iterations), n_slot), n_gpu)
    slot = np.tile(np.arange(n_slot), n_gpu * iterations)
    s = {c: slots[c].to_numpy()[slot] for c in slots.columns}
    engine = s["role"] == "engine"
    t0 = T_START + it * ITERATION_S + offsets[slot]
    own = {k: s[k].astype(float).copy() for k in ("first", "floor", "peak", "last")}
    other = np.array([_OTHER[p] for p in s["phase"]], dtype=float)
    if keep_kv_rank is not None:
        on = gpu == keep_kv_rank
        held = np.isin(s["phase"], _KV_HELD)
        for k in own:
            own[k][on & engine & held] += KV
        own["floor"][on & (s["phase"] == names.OFFLOAD_KV)] += KV
        own["last"][on & (s["phase"] == names.OFFLOAD_KV)] += KV
        own["first"][on & (s["phase"] == names.ONLOAD_KV)] += KV
        own["floor"][on & (s["phase"] == names.ONLOAD_KV)] += KV
        other[on & ~engine & held] += KV
    if hot_rank is not None:
        on = (gpu == hot_rank[0]) & (s["phase"] == names.TRAIN)
        own["peak"][on] += hot_rank[1]
    if shortfall is not None:
        on = (gpu == shortfall[0]) & (it == shortfall[1]) & (s["phase"] == names.OFFLOAD_KV)
        own["last"][on] += shortfall[2]
        own["floor"][on] += shortfall[2]
    creep = np.zeros(len(gpu))
    if creep_rank is not None:
        creep = np.where(gpu == creep_rank[0], it * float(creep_rank[1]), 0.0)
    # the creeping process is the actor: its own rows, and the "other" of its engine's rows
    creep_own, creep_other = np.where(engine, 0.0, creep), np.where(engine, creep, 0.0)
    noise = 1 + rng.uniform(-0.005, 0.005, len(gpu))
    own["peak"] = np.maximum(own["peak"] * noise, own["first"]) + CTX + creep_own
    for k in ("first", "floor", "last"):
        own[k] = own[k] + CTX + creep_own
    other_level = other + CTX + creep_other
    host = gpu // gpus
    rank = gpu
    pid = 10_000 + 2 * gpu + engine.astype(int)
    frame = pd.DataFrame({
        "host": np.array([f"node{h}" for h in range(hosts)])[host],
        "gpu_uuid": np.array([_uuid(h, g) for h in range(hosts) for g in range(gpus)])[gpu],
        "gpu_total": float(GPU_TOTAL), "gpu_index": gpu % gpus, "pid": pid, "rank": rank,
        "role": s["role"], "phase": s["phase"], "phase_id": it * n_slot + slot, "iteration": it,
        "t0": t0, "t1": t0 + s["dur"], "expected_bytes": s["expected"].astype(float),
    })
    for k, v in own.items():
        frame[f"proc_{k}"] = v
        frame[f"used_{k}"] = (v + other_level + OUTSIDE) if with_used else np.nan
    return frame
