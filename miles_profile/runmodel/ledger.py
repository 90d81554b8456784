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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.logdir.accounts import declared_at
from miles_profile.runmodel.series import own_columns, pids, process_rows, process_samples, series_arrays, take_rows
from miles_profile.runmodel.stats import _iterations

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

# Up to this many processes the report accounts for all of them; past it (a fleet), for the processes
# of the GPUs it draws (its cost grows with their phase instances, 1.3 s at 32 processes).
LEDGER_MAX_PROCESSES = 16

# `at`: "end" (the phase's closing row) or "peak" (the instant of its highest sample, `t`)
COLUMNS = ["host", "pid", "id", "phase", "iteration", "depth", "t", "device", "label", "category", "source",
           "bytes", "total", "at"]
AT_END, AT_PEAK = "end", "peak"


def _process_states(run, only: set[tuple[str, int]] | None = None) -> dict[tuple[str, int], pd.DataFrame]:
    """Per recording process (those in `only`, else all), its series at each phase boundary: index t
    (the closing row's time), one column per series. From the summaries; else from the samples' rows
    at the phase ends."""
    states: dict[tuple[str, int], pd.DataFrame] = {}
    summaries = run.phase_summaries
    if only is not None and len(summaries):
        keys = pd.MultiIndex.from_arrays([summaries["host"].astype(str).to_numpy(),
                                          summaries["pid"].to_numpy(np.int64)])
        summaries = summaries[keys.isin(list(only))]
    if len(summaries):
        wide = summaries.pivot_table(index=["host", "pid", "t_last"], columns="series", values="last",
                                     aggfunc="last")
        for (host, pid), frame in wide.groupby(level=[0, 1], sort=False):
            states[(str(host), int(pid))] = frame.droplevel([0, 1]).astype(float).sort_index()
    samples = run.samples
    if run.phases.empty or samples.empty:
        return states
    for (host, pid), ends in run.phases.groupby([run.phases["host"].fillna("").astype(str), "pid"]):
        if (host, int(pid)) in states or only is not None and (host, int(pid)) not in only:
            continue
        # the run's one index of every process's rows (not a mask per process), and of those only the
        # rows at the phase ends are copied
        t, _ = series_arrays(run, int(pid), "t")
        if not len(t):
            continue
        at = np.searchsorted(t, np.sort(ends["end"].to_numpy(float)), "right") - 1
        at = np.unique(at[at >= 0])
        positions = process_rows(run, int(pid))
        columns = [c for c in own_columns(run, int(pid)) if c not in ("phase", "pid")]  # not every process's
        picked = take_rows(samples, at if positions is None else positions[at], columns)
        states[(host, int(pid))] = picked.set_index("t").apply(pd.to_numeric, errors="coerce").astype(float)
    return states


def _row_at(state: pd.DataFrame | None, t: float) -> pd.Series | None:
    if state is None or state.empty:
        return None
    k = int(np.searchsorted(state.index.to_numpy(float), t, "right")) - 1
    return state.iloc[k] if k >= 0 else None


def _value(row: pd.Series | None, column: str) -> float | None:
    if row is None or column not in row.index:
        return None
    v = row[column]
    return None if pd.isna(v) else float(v)


def _nvml(row: pd.Series | None, index: int | None, kind: str) -> float | None:
    """A process's own NVML read (`used` or `proc`) in its row: periodic, else at its boundaries alone."""
    found = _value(row, f"gpu{index}_{kind}")
    return found if found is not None else _value(row, f"gpu{index}_boundary_{kind}")


def _uuid_by_index(run, process: dict) -> dict[int, str]:
    """This process's CUDA index -> GPU UUID (its own view); else, for a process that names its GPU and
    samples one, that one; else NVML's order; else `gpu<i>`."""
    # a meta is a file someone may have edited: entries of another type are no devices or columns
    devices, columns = process.get("cuda_devices"), process.get("columns")
    found = {d["index"]: str(d["uuid"]) for d in (devices if isinstance(devices, list) else ())
             if isinstance(d, dict) and d.get("uuid") and type(d.get("index")) is int}
    own = {int(c[3:].split("_")[0]) for c in (columns if isinstance(columns, list) else ())
           if isinstance(c, str) and c.startswith("gpu") and c[3:].split("_")[0].isdigit()}
    if not found and process.get("gpu_uuid") and len(own) == 1:
        found = {own.pop(): str(process["gpu_uuid"])}
    if not found:
        found = {int(d["index"]): str(d["uuid"]) for d in run.devices if d.get("uuid")}
    return found


def _gpu_indices(row: pd.Series | None) -> list[int]:
    if row is None:
        return []
    return sorted({int(c[3:].split("_")[0]) for c in row.index if c.startswith("gpu") and "_" in c
                   and c[3:].split("_")[0].isdigit()})


class _Declared:
    """Declared values of one process at any instant, from its `account` events."""

    def __init__(self, accounts: pd.DataFrame):
        self._by_process = {key: (frame, frame["t"].to_numpy(float))
                            for key, frame in accounts.groupby(["host", "pid"], sort=False)}
        self._seen: dict[tuple[str, int, int], dict] = {}

    def at(self, host: str, pid: int, t: float) -> dict[tuple[str, str], int]:
        found = self._by_process.get((host, pid))
        if found is None:
            return {}
        # the same events before t, the same answer: a process declares a few times and is asked at
        # every phase end and peak (most of the ledger's time on the engine-server run before this)
        frame, times = found
        key = (host, pid, int(np.searchsorted(times, t, "right")))
        if key not in self._seen:
            self._seen[key] = declared_at(frame, t)
        return self._seen[key]

    def declares(self, host: str, pid: int) -> bool:
        """Whether the process declared anything at all (its residual is then activations)."""
        return (host, pid) in self._by_process


class _Procs:
    """NVML bytes per process on a GPU at an instant, from the host sampler's process list (of `hosts`
    only, when given: a fleet's lists are millions of rows). Read at the first question: a process
    with its own NVML reads never asks."""

    def __init__(self, run, hosts: set[str] | None = None):
        self._run, self._hosts = run, hosts
        self._frames: dict | None = None
        self.listed: set[tuple[str, int]] = set()

    def _read(self) -> dict:
        run, empty = self._run, pd.DataFrame(columns=["t", "host", "gpu_uuid", "pid", "bytes"])
        try:
            if not run.hosts:
                procs = empty
            elif self._hosts is not None and hasattr(run, "gpu_procs_of"):
                procs = run.gpu_procs_of(sorted(self._hosts))
            else:
                procs = run.gpu_procs
        except Exception:  # noqa: BLE001 - a log without host files: no per-process list
            procs = empty
        self.listed = {(str(h), int(p)) for h, p in zip(procs["host"], procs["pid"])}
        return {(str(h), str(u)): (np.unique(f["t"].to_numpy(float)), f)
                for (h, u), f in procs.groupby(["host", "gpu_uuid"], sort=False, observed=True)}

    def at(self, host: str, uuid: str, pid: int, t: float) -> float | None:
        if self._frames is None:
            self._frames = self._read()
        found = self._frames.get((host, uuid))
        if found is None or (host, pid) not in self.listed:
            return None
        times, frame = found
        k = int(np.searchsorted(times, t, "right")) - 1
        if k < 0:
            return None
        now = frame[(frame["t"] == times[k]) & (frame["pid"] == pid)]["bytes"]
        return float(now.sum()) if len(now) else 0.0  # listed before, not now: it holds nothing here


def _used_at(run, host: str, uuid: str, t: float) -> float | None:
    found = run.gpu_used.get((host, uuid)) if run.hosts else None
    if found is None:
        return None
    times, used = found
    k = int(np.searchsorted(times, t, "right")) - 1
    return float(used[k]) if k >= 0 and np.isfinite(used[k]) else None


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


@dataclass
class _Context:
    """What every phase end of a run is read against (built once per run)."""
    run: object
    states: dict[tuple[str, int], pd.DataFrame]
    declared: _Declared
    procs: _Procs
    roles: dict[tuple[str, int], dict]
    on_gpu: dict[tuple[str, str], list[tuple[str, int]]]  # (host, uuid) -> recorded processes on it

    def uuids(self, key: tuple[str, int]) -> dict[int, str]:
        return _uuid_by_index(self.run, self.roles.get(key, {}))


def _context(run, only: set[tuple[str, int]] | None = None) -> _Context:
    states = _process_states(run, only)
    roles = {(str(p.get("host", "")), int(p.get("pid", -1))): p for p in run.processes}
    on_gpu: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for key, state in states.items():
        if roles.get(key, {}).get("role") == "exec_parent":  # the whole tree, seen from outside: not a member
            continue
        uuids = _uuid_by_index(run, roles.get(key, {}))
        for i in _gpu_indices(state.iloc[-1] if len(state) else None):
            if any(c in state.columns for c in (f"gpu{i}_alloc", f"gpu{i}_reserved", f"gpu{i}_proc",
                                                f"gpu{i}_boundary_proc")):
                on_gpu.setdefault((key[0], uuids.get(i, f"gpu{i}")), []).append(key)
    return _Context(run, states, _Declared(run.accounts), _Procs(run, None if only is None else {h for h, _ in only}),
                    roles, on_gpu)


def _member(ctx: _Context, who: tuple[str, int], uuid: str, t: float, row: pd.Series | None = None) -> _Member:
    """One recorded process on GPU `uuid` as it stood at t (its latest phase boundary at or before t,
    or `row`: its sample at a phase's peak)."""
    row = _row_at(ctx.states.get(who), t) if row is None else row
    uuids = ctx.uuids(who)
    index = next((j for j, u in uuids.items() if u == uuid), None)
    if index is None and uuid.startswith("gpu"):
        index = int(uuid[3:])
    declared = {c: v for (d, c), v in ctx.declared.at(who[0], who[1], t).items()
                if d.startswith("cuda:") and uuids.get(int(d[5:]), f"gpu{d[5:]}") == uuid}
    proc = _nvml(row, index, "proc")  # its own NVML bytes, where it read them
    state = ctx.states.get(who)
    reads_own = state is not None and any(c in state.columns for c in (f"gpu{index}_proc", f"gpu{index}_boundary_proc"))
    if proc is None and not reads_own:  # the host sampler's list, for a process that reads no NVML itself
        proc = ctx.procs.at(who[0], uuid, who[1], t)
    return _Member(_value(row, f"gpu{index}_alloc"), _value(row, f"gpu{index}_reserved"), proc, declared,
                   ctx.declared.declares(*who))


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


# The series whose highest sample inside a phase marks its peak instant, best first: on a GPU the
# allocator's true peak (where activations live), then the levels; on the host the true RSS peak
# (VmHWM since the previous sample), then RSS.
HOST_PEAK_SERIES = ("rss_peak", "rss")


def _gpu_peak_series(i: int) -> tuple[str, ...]:
    return (f"gpu{i}_alloc_peak", f"gpu{i}_alloc", f"gpu{i}_reserved", f"gpu{i}_proc", f"gpu{i}_used")


def _highest(window: pd.DataFrame, series: tuple[str, ...]) -> tuple[int, str, float] | None:
    """(row, series, value) of the highest sample of the first series measured in the window."""
    for column in series:
        if column in window.columns:
            values = pd.to_numeric(window[column], errors="coerce").to_numpy(float)
            if np.isfinite(values).any():
                k = int(np.nanargmax(values))
                return k, column, float(values[k])
    return None


def _carry_nvml(frame: pd.DataFrame) -> pd.DataFrame:
    """NVML read less often than the samples (a Miles import, logs without an allocator): a row without
    its own read takes the latest one. With an allocator, a peak's NVML comes from the phase boundary
    before it instead (_gpu_peak)."""
    rest = [c for c in frame.columns if c.startswith("gpu") and c.endswith(("_used", "_proc"))]
    frame[rest] = frame[rest].ffill()
    return frame


def _samples_by_process(run, only: set[tuple[str, int]] | None) -> dict[int, pd.DataFrame]:
    """Each recorded pid's samples in time order (samples carry no host: pids are unique in a run),
    NVML carried between its reads (_carry_nvml)."""
    samples = run.samples
    if samples.empty:
        return {}
    wanted = pids(run) if only is None else sorted({int(p) for _, p in only} & set(pids(run)))
    # Each process's rows from the run's one index (series.process_rows: already in time order), not
    # a groupby that copies and sorts the whole frame again.
    return {pid: _carry_nvml(process_samples(run, pid).reset_index(drop=True)) for pid in wanted}


def _host_peak(ctx: _Context, host: str, pid: int, window: pd.DataFrame) -> list[tuple] | None:
    found = _highest(window, HOST_PEAK_SERIES)
    if found is None:
        return None
    k, _, peak = found
    row = window.iloc[k].copy()
    t = float(row["t"])
    rss = _value(row, "rss")
    if rss is not None and _value(row, "rss_anon") is not None:
        # the true peak's excess over the row's RSS was allocated and freed between two samples: anonymous
        row["rss_anon"] = row["rss_anon"] + max(peak - rss, 0.0)
    row["rss"] = peak
    declared = {c: v for (d, c), v in ctx.declared.at(host, pid, t).items() if d == HOST}
    rows, total = _host_rows(row, declared)
    return [(t, HOST, f"host RSS, pid {pid}", c, s, v, np.nan if total is None else total) for c, s, v in rows]


def _at_peak(state: pd.Series | None, row: pd.Series, i: int, peak: float) -> tuple[pd.Series, float | None]:
    """This process's row at its allocated peak, made of one instant: allocated = the true peak,
    reserved at least that; NVML per-process = reserved plus what it held beyond reserved at the
    phase boundary before (context, NCCL: they barely move), device used = that boundary's plus this
    process's change since. NVML and the allocator are read at different instants inside a phase:
    taken as read, an onload's peak showed -10.6 GiB of non-PyTorch memory and an offload's +14 GiB
    (sample_logs/h200/9-dist-engine-server), the latest periodic read 19 GiB of a finished generate
    under other processes (h200/4-both). Returns the row and device used (None: unknown)."""
    row = row.copy()
    row[f"gpu{i}_alloc"] = peak
    reserved = _value(row, f"gpu{i}_reserved")
    if reserved is not None:
        reserved = row[f"gpu{i}_reserved"] = max(reserved, peak)
    before = {k: _nvml(state, i, k) for k in ("proc", "used")}
    before_reserved = _value(state, f"gpu{i}_reserved")
    for name in (f"gpu{i}_proc", f"gpu{i}_boundary_proc", f"gpu{i}_used", f"gpu{i}_boundary_used"):
        row[name] = np.nan
    if before["proc"] is None:
        return row, before["used"]
    proc = before["proc"] if reserved is None or before_reserved is None else reserved + before["proc"] - before_reserved
    row[f"gpu{i}_proc"] = proc
    return row, None if before["used"] is None else before["used"] + proc - before["proc"]


def _gpu_peak(ctx: _Context, host: str, pid: int, i: int, window: pd.DataFrame) -> list[tuple] | None:
    found = _highest(window, _gpu_peak_series(i))
    if found is None:
        return None
    k, column, peak = found
    row = window.iloc[k]
    t = float(row["t"])
    uuid = ctx.uuids((host, pid)).get(i, f"gpu{i}")
    state = _row_at(ctx.states.get((host, pid)), t)
    if column.endswith(("_alloc_peak", "_alloc")) and state is not None:
        row, used = _at_peak(state, row, i, peak)
    else:  # no allocator (or no boundary yet): the row's own reads, the latest carried
        used = _nvml(row, i, "used")
    members = [_member(ctx, who, uuid, t, row if who == (host, pid) else None)
               for who in ctx.on_gpu.get((host, uuid), [])]
    if used is not None and state is not None and column.endswith(("_alloc_peak", "_alloc")):
        # the others' change since this process's boundary is on the device too (an engine server that
        # freed its KV cache during the actor's offload_kv call), or it lands in "other processes"
        others = [who for who in ctx.on_gpu.get((host, uuid), []) if who != (host, pid)]
        used += sum(_held(_member(ctx, who, uuid, t)) - _held(_member(ctx, who, uuid, float(state.name)))
                    for who in others)
    if used is None:
        used = _used_at(ctx.run, host, uuid, t)
    if not members and used is None:
        return None
    label = f"gpu{i} ({uuid[:12]})" if uuid.startswith("GPU-") else f"gpu{i}"
    return [(t, uuid, label, c, s, v, np.nan if used is None else used) for c, s, v in _gpu_rows(used, members)]


def _peak_rows(ctx: _Context, samples: dict[int, pd.DataFrame], host: str, pid: int, start: float,
               end: float) -> list[tuple]:
    """(t, device, label, category, source, bytes, total) at each lane's peak inside [start, end]:
    this process's RSS at its highest sample, each GPU it samples at its highest allocated (the other
    processes on that GPU as they stood then). A phase without a sample inside has none."""
    own = samples.get(pid)
    if own is None:
        return []
    t = own["t"].to_numpy(float)
    window = own.iloc[int(np.searchsorted(t, start, "left")):int(np.searchsorted(t, end, "right"))]
    if window.empty:
        return []
    out = _host_peak(ctx, host, pid, window) or []
    for i in _gpu_indices(window.iloc[-1]):
        out += _gpu_peak(ctx, host, pid, i, window) or []
    return out


def phase_iterations(phases: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each phase's host and iteration (a pid's iterations are its own: pids repeat across hosts)."""
    hosts = phases["host"].fillna("").astype(str).to_numpy() if "host" in phases else np.array([""] * len(phases))
    return hosts, _iterations(phases.assign(pid=[f"{h}:{p}" for h, p in zip(hosts, phases["pid"])]))


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
        cache[key] = _ledger(run, only, peaks, iterations)
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


@dataclass
class AddUp:
    """How far the categories, negatives counted as errors, are from the reference at each boundary."""
    worst_error: float | None  # relative: sum of |negative residuals| / total; None: nothing to judge
    worst: dict | None  # the boundary with the worst error: phase, iteration, pid, device, t, total, negatives
    boundaries: int  # boundaries judged (phase end x device with a measured total)
    table: pd.DataFrame  # one row per boundary: host, pid, id, phase, iteration, device, t, total, sum, error

    def passes(self, tolerance: float = 0.02) -> bool | None:
        return None if self.worst_error is None else self.worst_error <= tolerance


def add_up(frame: pd.DataFrame, device_kind: str = "gpu") -> AddUp:
    """At each phase end and device (`gpu`: every GPU; `host`: every process's RSS), the categories
    summed with every negative residual counted as missing memory: |sum of positives - total| / total.
    By construction the signed sum equals the total when all sources were read in one row, so the error
    is exactly what the sources disagree on (stale per-process NVML, pauses the allocator can't see,
    declarations larger than the allocations)."""
    if frame.empty:
        return AddUp(None, None, 0, pd.DataFrame())
    frame = ends(frame)  # a peak's row mixes a true peak with levels read a moment later: not judged
    picked = frame[(frame["device"] == HOST) if device_kind == "host" else (frame["device"] != HOST)]
    picked = picked[picked["total"].notna() & (picked["total"] > 0)]
    if picked.empty:
        return AddUp(None, None, 0, pd.DataFrame())
    keys = ["host", "pid", "id", "phase", "iteration", "device", "t"]
    picked = picked.assign(positive=picked["bytes"].clip(lower=0), negative=(-picked["bytes"]).clip(lower=0))
    table = picked.groupby(keys, sort=False).agg(total=("total", "first"), signed=("bytes", "sum"),
                                                 positive=("positive", "sum"), negative=("negative", "sum")).reset_index()
    table["error"] = (table["positive"] - table["total"]).abs() / table["total"]
    worst = table.loc[table["error"].idxmax()]
    return AddUp(float(worst["error"]), {k: (v.item() if hasattr(v, "item") else v) for k, v in worst.items()},
                 len(table), table)
