"""What the ledger reads at an instant, built once per run: each process's series at its phase
boundaries (from the summaries, else the samples' rows at the phase ends), its declared bytes (account
events), the host sampler's NVML per-process list and device used, and which recorded processes share
each GPU (_Context). ledger.py and ledger_peaks.py ask it at phase ends and peaks."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from miles_profile.logdir.accounts import declared_at
from miles_profile.runmodel.ledger_categories import _Member, _value
from miles_profile.runmodel.series import own_columns, process_take, sample_count, series_arrays


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
    if run.phases.empty or not sample_count(run):
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
        columns = [c for c in own_columns(run, int(pid)) if c not in ("phase", "pid")]  # not every process's
        picked = process_take(run, int(pid), at, columns)
        states[(host, int(pid))] = picked.set_index("t").apply(pd.to_numeric, errors="coerce").astype(float)
    return states


def _row_at(state: pd.DataFrame | None, t: float) -> pd.Series | None:
    if state is None or state.empty:
        return None
    k = int(np.searchsorted(state.index.to_numpy(float), t, "right")) - 1
    return state.iloc[k] if k >= 0 else None


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
