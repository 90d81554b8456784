"""Phases one process declares and another does: a rank driving its rollout engine as a server (an
SGLang-style process on the same GPU, role `engine`) declares `offload_kv`/`offload_weights` with their
`expected_bytes`, while the memory they move is the engine's. Pure functions over metas and tracks.

    engine_of(processes, meta) -> dict | None      # the engine server a process drives, if any
    moves_rollout(tags) -> bool                    # the phase moves rollout engine memory
    holder_track(run, own, holder) -> Track | None # the series to judge such a phase on
"""
from __future__ import annotations

from dataclasses import replace

from miles_profile import names
from miles_profile.runmodel.series import Track


def moves_rollout(tags: list[str]) -> bool:
    """Its tags are all rollout tags (kv_cache, weights, cuda_graph)."""
    return bool(tags) and set(tags) <= set(names.TAGS)


def engine_of(processes: list[dict], meta: dict | None) -> dict | None:
    """The engine process serving `meta`'s process from another process (an SGLang-style server on the
    same GPU): role engine, same host, GPU UUID and rank; on a run without GPUs (no UUID on either) the
    same host and rank, which must then be known. None for an engine itself or an in-process engine (no
    such meta): then the phase's own process holds the memory."""
    if not meta or meta.get("role") == names.ROLE_ENGINE:
        return None
    uuid, rank = meta.get("gpu_uuid") or "", meta.get("rank")
    if not uuid and not (isinstance(rank, int) and rank >= 0):
        return None
    for p in processes:
        if (p.get("role") == names.ROLE_ENGINE and p.get("pid") != meta.get("pid")
                and (p.get("gpu_uuid") or "") == uuid and str(p.get("host") or "") == str(meta.get("host") or "")
                and p.get("rank", rank) == rank):
            return p
    return None


def holder_track(run, own: Track | None, holder: dict) -> Track | None:
    """What the engine server moved: `own` (its device track, as checks.py picks it for the backend)
    where it is the engine's own, else NVML used of the GPU from the host sampler, else None."""
    pid = int(holder["pid"])
    if own is not None and own.pid == pid:  # device_track falls back to another process: not that one
        return replace(own, label=f"{own.label}, the engine server that holds it")
    if not holder.get("gpu_uuid"):  # a run without GPUs: the engine's own RSS or nothing
        return None
    used = (getattr(run, "gpu_used", None) or {}).get((str(holder.get("host") or ""), str(holder["gpu_uuid"])))
    if used is None or not len(used[0]):
        return None
    return Track("device", f"NVML used of GPU {holder['gpu_uuid']} (host sampler), where its engine server (pid "
                           f"{pid}) holds it", pid, used[0], used[1], used[1])
