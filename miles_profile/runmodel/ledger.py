"""Where every byte goes: per phase instance and per GPU (and per process on the host), bytes by
category, at the phase's end (and, asked, at its peak). A pure function of a Run; docs/ledger.md explains each category.

    ledger(run) -> DataFrame           # one row per (phase instance, device, category)
    ledger(run, peaks=True)            # ... also at each phase's peak (column `at`: end / peak)
    add_up(ledger_frame) -> AddUp      # do the categories add up to what NVML (or RSS) says?

Declared categories come from `miles_profile.account()` (Run.accounts); the rest are derived from the
series the recorder already writes, each the residual of the next larger measure:

    GPU:  activations = allocated - declared          allocator_cache = reserved - allocated
          non_pytorch = NVML per-process - reserved    other_processes = NVML device used - recorded processes
    host: other_anonymous = RssAnon - declared host    file_backed = RssFile    shared_memory = RssShmem
          (declared host bytes beyond RssAnon come out of RssShmem: pinned backups can be shared mappings)

A declared `paused` (torch_memory_saver: bytes the allocator still counts although a pause unmapped them)
is no category: it is subtracted from allocated and reserved first. The categories then add up to
NVML's device used (RSS on the host) by construction where every source was read at
the same instant; what does not add up shows as a negative residual (declared more than allocated,
NVML per-process under reserved), never clipped. `add_up` counts the negative bytes against the total.

With `peaks`, also at each phase's peak: per lane, the sample inside the phase where allocated (on
the host RSS) was highest, its true peak taken as that instant's allocated (RSS), so activations freed
before the phase ends show where they stood. Values at a phase's end are its closing row: the `last` of its summary (per phase, not per sample);
logs written before summaries fall back to that row of the samples. A GPU shared by several recorded
processes (an actor and its engine server) is summed over them, each at its own latest phase boundary
before that instant, with the NVML bytes it read itself at that boundary (`gpu{i}_boundary_*`), else
the host sampler's process list.

The parts: ledger_categories.py (the categories and their arithmetic), ledger_sources.py (what is read at
an instant), ledger_peaks.py (the rows at peaks), ledger_add_up.py (add_up); ledger_sampling.py picks
iterations of long runs.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from miles_profile.runmodel.ledger_add_up import AddUp, add_up  # noqa: F401 - public here since it began
from miles_profile.runmodel.ledger_categories import (  # noqa: F401 - the categories' names, public here
    ACTIVATIONS, ALLOCATOR_CACHE, AT_END, AT_PEAK, COLUMNS, FILE_BACKED, GPU_DERIVED, HOST, HOST_DERIVED, NON_PYTORCH,
    OTHER_ANONYMOUS, OTHER_PROCESSES, RSS_UNSPLIT, SHARED_MEMORY, UNDECLARED, _gpu_rows, _host_rows, at_peaks, ends)
from miles_profile.runmodel.ledger_peaks import _peak_rows, _samples_by_process
from miles_profile.runmodel.ledger_sources import _Context, _context, _gpu_indices, _member, _nvml, _row_at, _used_at
from miles_profile.runmodel.stats import process_iterations

# Up to this many processes the report accounts for all of them; past it (a fleet), for the processes
# of the GPUs it draws (its cost grows with their phase instances, 1.3 s at 32 processes).
LEDGER_MAX_PROCESSES = 16


def _phase_rows(ctx: _Context, host: str, pid: int, t: float) -> list[tuple]:
    """(device, label, category, source, bytes, total) of one phase end: this process's RSS, then
    every GPU it samples, with every recorded process on that GPU."""
    own = _row_at(ctx.states.get((host, pid)), t)
    host_declared = {c: v for (d, c), v in ctx.declared.at(host, pid, t).items() if d == HOST}
    rows, rss = _host_rows(own, host_declared)
    out = [(HOST, f"host RSS, pid {pid}", c, s, v, np.nan if rss is None else rss) for c, s, v in rows]
    for i in _gpu_indices(own):
        uuid = ctx.uuids((host, pid)).get(i, f"gpu{i}")
        members = [_member(ctx, who, uuid, t) for who in ctx.on_gpu.get((host, uuid), [])]
        used = _nvml(own, i, "used")
        if used is None:
            used = _used_at(ctx.run, host, uuid, t)
        if not members and used is None:
            continue
        label = f"gpu{i} ({uuid[:12]})" if uuid.startswith("GPU-") else f"gpu{i}"
        out += [(uuid, label, c, s, v, np.nan if used is None else used) for c, s, v in _gpu_rows(used, members)]
    return out


def phase_iterations(phases: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each phase's host and iteration (a pid's iterations are its own: pids repeat across hosts)."""
    hosts = phases["host"].fillna("").astype(str).to_numpy() if "host" in phases else np.array([""] * len(phases))
    return hosts, process_iterations(phases, hosts.tolist())


def ledger(run, processes: Iterable[tuple[str, int]] | None = None, *, peaks: bool = False,
           iterations: frozenset[int] | None = None) -> pd.DataFrame:
    """One row per (phase instance, device, category) at the phase's end: `device` is a GPU UUID (or
    `gpu<i>` when the log has none) or "host" (this process's RSS); `label` says which for a person;
    `source` is declared or derived; `total` is the reference the categories should add up to (NVML
    device used; RSS on the host), NaN where it was not measured. Bytes are floats (negatives kept).

    `processes`: (host, pid) of the processes to account for, e.g. those of the GPUs a fleet view
    draws (all processes sharing a GPU must be among them); None: every process. The cost grows with
    their phase instances, not with the fleet.

    `peaks`: also the rows at each phase's peak (`at` = "peak", `t` the instant): per lane, its highest
    sample inside the phase (allocated's true peak on a GPU, the RSS peak on the host), where a
    train phase's activations stand, though they are freed before its end.

    `iterations`: only the phase instances of these iterations (ledger_sampling.py); None: all."""
    only = None if processes is None else frozenset((str(h), int(p)) for h, p in processes)
    cache = run.__dict__.setdefault("_report_cache", {})  # the report and the comparison both ask
    key = ("ledger", only, peaks, iterations)
    if key not in cache:
        with_peaks = None if peaks else cache.get(("ledger", only, True, iterations))
        # the report's ledger (with peaks) holds the comparison's (without) as its end rows: not made twice
        cache[key] = _ledger(run, only, peaks, iterations) if with_peaks is None else ends(with_peaks)
    return cache[key]


def fleet_ledger(run, processes: Iterable[tuple[str, int]], *, peaks: bool = False,
                 iterations: frozenset[int] | None = None) -> pd.DataFrame:
    """The ledger of some processes' GPUs (a fleet's drawn lanes), without their host rows: those are
    in the lanes' timelines, and one ledger lane per process would be dozens. Host rows stay for a run
    without GPUs."""
    frame = ledger(run, processes, peaks=peaks, iterations=iterations)
    on_gpu = frame["device"] != HOST
    return frame[on_gpu] if on_gpu.any() else frame


def ends(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows at phase ends (a frame with peak rows, or one without the `at` column)."""
    return frame[frame["at"] == AT_END] if "at" in frame and len(frame) else frame


def at_peaks(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["at"] == AT_PEAK] if "at" in frame and len(frame) else frame.iloc[0:0]


def _ledger(run, only: frozenset[tuple[str, int]] | None = None, peaks: bool = False,
            chosen: frozenset[int] | None = None) -> pd.DataFrame:
    phases = run.phases
    if phases.empty:
        return pd.DataFrame(columns=COLUMNS)
    ctx = _context(run, None if only is None else set(only))
    hosts, iterations = phase_iterations(phases)
    all_iterations = iterations
    # the iterations above need every phase; the rows, only these processes' and iterations'
    keep = np.ones(len(phases), dtype=bool)
    if only is not None:
        keep &= pd.MultiIndex.from_arrays([hosts, phases["pid"].to_numpy(np.int64)]).isin(list(only))
    if chosen is not None:
        keep &= np.isin(iterations, list(chosen))
    if not keep.all():
        keep = np.flatnonzero(keep)
        phases, hosts, iterations = phases.iloc[keep], hosts[keep], iterations[keep]
    out = []
    samples = _samples_by_process(run, None if only is None else set(only)) if peaks else {}
    for k, phase in enumerate(phases.itertuples(index=False)):
        base = (hosts[k], int(phase.pid), int(phase.id) if phase.id == phase.id else -1, str(phase.name),
                int(iterations[k]), int(phase.depth))
        out += [(*base, float(phase.end), *row, AT_END)
                for row in _phase_rows(ctx, hosts[k], int(phase.pid), float(phase.end))]
        if peaks:
            out += [(*base, *row, AT_PEAK) for row in _peak_rows(ctx, samples, hosts[k], int(phase.pid),
                                                                 float(phase.start), float(phase.end))]
    frame = pd.DataFrame(out, columns=COLUMNS)
    frame["bytes"] = frame["bytes"].astype(float)
    frame["total"] = frame["total"].astype(float)
    if chosen is not None:  # what every view of it says: these iterations of how many
        frame.attrs["sampled"] = (len({i for i in chosen if i >= 0}), len({i for i in all_iterations if i >= 0}))
    return frame


def ledger_records(frame: pd.DataFrame) -> list[dict]:
    """The top-level phases' ledger for --json: one object per (phase instance, lane, category, at),
    bytes as integers (a negative residual stays negative), `total` null where not measured."""
    top = frame[frame["depth"] == 0] if len(frame) else frame
    out = []
    for r in top.itertuples(index=False):
        out.append({"phase": r.phase, "iteration": int(r.iteration), "host": r.host, "pid": int(r.pid), "id": int(r.id),
                    "at": getattr(r, "at", AT_END), "t": float(r.t), "device": r.device, "label": r.label,
                    "category": r.category, "source": r.source, "bytes": int(round(r.bytes)),
                    "total": None if r.total != r.total else int(round(r.total))})
    return out
