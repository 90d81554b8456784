"""The ledger's categories, its frame's columns, and their arithmetic at one instant: what one GPU's recorded processes and
one process's RSS split into (docs/ledger.md), given the values read. No reading here: ledger_sources.py
finds the values, ledger.py and ledger_peaks.py ask at phase ends and peaks."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from miles_profile import names

ACTIVATIONS, ALLOCATOR_CACHE, NON_PYTORCH, OTHER_PROCESSES = (
    "activations", "allocator_cache", "non_pytorch", "other_processes")
# What a process that never declared anything has allocated: calling all of it activations would name a
# model's weights and KV cache wrongly (every log recorded before account() existed).
UNDECLARED = "allocated_undeclared"
OTHER_ANONYMOUS, FILE_BACKED, SHARED_MEMORY, RSS_UNSPLIT = (
    "other_anonymous", "file_backed", "shared_memory", "rss_unsplit")
GPU_DERIVED = (ACTIVATIONS, UNDECLARED, ALLOCATOR_CACHE, NON_PYTORCH, OTHER_PROCESSES)
HOST_DERIVED = (OTHER_ANONYMOUS, FILE_BACKED, SHARED_MEMORY, RSS_UNSPLIT)
HOST = names.ACCOUNT_HOST

# `at`: "end" (the phase's closing row) or "peak" (the instant of its highest sample, `t`)
COLUMNS = ["host", "pid", "id", "phase", "iteration", "depth", "t", "device", "label", "category", "source",
           "bytes", "total", "at"]
AT_END, AT_PEAK = "end", "peak"


def _value(row: pd.Series | None, column: str) -> float | None:
    if row is None or column not in row.index:
        return None
    v = row[column]
    return None if pd.isna(v) else float(v)


@dataclass
class _Member:
    """One recorded process on a GPU, at one instant."""
    alloc: float | None
    reserved: float | None
    proc: float | None
    declared: dict[str, int]
    declares: bool = True  # False: a process without account() calls


def _held(m: _Member) -> float:
    """What a recorded process holds on its GPU by its best measure: NVML's per-process bytes, else the
    allocator's reserved bytes, else what it declared."""
    if m.proc is not None:
        return m.proc
    if m.reserved is not None:
        return m.reserved - m.declared.get(names.PAUSED, 0)
    return float(sum(v for c, v in m.declared.items() if c != names.PAUSED))


def _gpu_rows(used: float | None, members: list[_Member]) -> list[tuple[str, str, float]]:
    """(category, source, bytes) of one GPU at one instant."""
    rows: dict[tuple[str, str], float] = {}
    for m in members:
        held = {c: v for c, v in m.declared.items() if c != names.PAUSED}
        # paused regions stay in the allocator's counters though they left the device
        paused = float(m.declared.get(names.PAUSED, 0))
        alloc = None if m.alloc is None else m.alloc - paused
        reserved = None if m.reserved is None else m.reserved - paused
        for category, nbytes in held.items():
            rows[(category, "declared")] = rows.get((category, "declared"), 0.0) + nbytes
        declared = float(sum(held.values()))
        if alloc is not None:
            residual = ACTIVATIONS if m.declares else UNDECLARED
            rows[(residual, "derived")] = rows.get((residual, "derived"), 0.0) + alloc - declared
        if reserved is not None and alloc is not None:
            rows[(ALLOCATOR_CACHE, "derived")] = rows.get((ALLOCATOR_CACHE, "derived"), 0.0) + reserved - alloc
        if m.proc is not None:
            below = reserved if reserved is not None else declared
            rows[(NON_PYTORCH, "derived")] = rows.get((NON_PYTORCH, "derived"), 0.0) + m.proc - below
    if used is not None:
        rows[(OTHER_PROCESSES, "derived")] = used - sum(_held(m) for m in members)
    return [(c, s, v) for (c, s), v in rows.items()]


def _host_rows(row: pd.Series | None, declared: dict[str, int]) -> tuple[list[tuple[str, str, float]], float | None]:
    rss = _value(row, "rss")
    rows = [(c, "declared", float(v)) for c, v in declared.items()]
    anon, file, shmem = (_value(row, c) for c in ("rss_anon", "rss_file", "rss_shmem"))
    if None not in (anon, file, shmem):
        # Declared host buffers are anonymous memory (malloc, torch's pinned host allocator) or shared
        # mappings (torch_memory_saver's pinned CPU backup is RssShmem on the H200): taken out of the
        # anonymous pages first, the rest out of the shared ones, where a shortfall stays negative.
        in_anon = min(float(sum(declared.values())), max(anon, 0.0))
        rows += [(OTHER_ANONYMOUS, "derived", anon - in_anon), (FILE_BACKED, "derived", file),
                 (SHARED_MEMORY, "derived", shmem - (sum(declared.values()) - in_anon))]
    elif rss is not None:  # a log written before the RSS split
        rows.append((RSS_UNSPLIT, "derived", rss - sum(declared.values())))
    return rows, rss


def ends(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows at phase ends (a frame with peak rows, or one without the `at` column)."""
    return frame[frame["at"] == AT_END] if "at" in frame and len(frame) else frame


def at_peaks(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["at"] == AT_PEAK] if "at" in frame and len(frame) else frame.iloc[0:0]
