"""Which processes of a run are judged, and each one's view of the run: pure pandas (no plotly), shared by
the verdict engine (verdicts/per_process.py) and the fleet report.

    is_fleet(run) -> bool                       # more than one process with phases, or processes on >1 GPU
    phase_processes(run) -> {(host, pid)}       # processes that recorded phases
    judged_processes(run) -> [(host, pid, meta)]
    process_view(run, host, pid, rows_of) -> Run   # one process (and the engine server it drives)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.logdir.reader import Run
from miles_profile.runmodel import engine_server
from miles_profile.logdir.samples_reader import merge_samples
from miles_profile.runmodel.series import columns_of, own_columns, pids, sample_store, take_rows

# "in_process": the trainer recorded in record's own process (no torchrun), the rank, engine server or not
_JUDGED_ROLES = ("actor", "in_process", "engine", "critic")


def phase_processes(run) -> set:
    phases = run.phases
    if phases.empty:
        return set()
    # asked 5 times a report: made once per phases frame (a live run's new frame is made again)
    cache = run.__dict__.setdefault("_report_cache", {})
    made = cache.get("phase_processes")
    if made is None or made[0] is not phases:
        # lists, not the str (Arrow) column: iterating that costs a microsecond a phase
        hosts = phases["host"].fillna("").astype(str).tolist() if "host" in phases else [""] * len(phases)
        made = cache["phase_processes"] = (phases, frozenset(zip(hosts, phases["pid"].astype(int).tolist())))
    return set(made[1])


def is_fleet(run) -> bool:
    """A run of more than one process with phases, or of processes on more than one GPU. One-process runs
    never are: their report is what it always was. Judged from the phases and whatever metas exist: a run
    being recorded may show its ranks' phases before every meta is read (the dashboard decides on it live)."""
    if len(phase_processes(run)) > 1:
        return True
    return len({(p.get("host"), p.get("gpu_uuid")) for p in run.processes if p.get("gpu_uuid")}) > 1


def process_view(run, host: str, pid: int, rows_of: dict, unidentified: frozenset | set = frozenset()):
    """A view of the run holding one process (its samples, phases, events, meta), plus the meta and
    samples of the engine server it drives where it has one (engine_server.engine_of): an offload it declares
    is done in that engine, and offload_drop judges it there. `unidentified`: the (host, pid) of processes
    with phases but no readable meta; where a non-engine process finds no engine server and such a process
    is on its host, its meta gets `engine_unreadable` (their pids): its engine may be one of them."""
    meta = [dict(p) for p in run.processes if int(p.get("pid", -1)) == pid and str(p.get("host") or "") == host]
    engine = engine_server.engine_of(run.processes, meta[0]) if meta else None
    if meta and engine is None and meta[0].get("role") != names.ROLE_ENGINE:
        maybe = sorted(p for h, p in unidentified if h == host)
        if maybe:
            meta[0]["engine_unreadable"] = maybe
    store = sample_store(run)
    if store is not None:
        samples = _stored_view(store, [p for p in (pid, engine and int(engine["pid"])) if p is not None])
    else:
        parts = [rows_of[p] for p in (pid, engine and int(engine["pid"])) if p is not None and p in rows_of]
        rows = np.sort(np.concatenate(parts)) if parts else None
        # only the columns these processes have values in (series.own_columns): the run's frame carries
        # every process's columns, and copying them all was most of the per-process checks' time
        columns = list(dict.fromkeys(c for p in (pid, engine and int(engine["pid"])) if p is not None and p in rows_of
                                     for c in own_columns(run, p)))
        samples = take_rows(run.samples, rows, columns) if rows is not None else run.samples.iloc[:0]
    ph = run.phases
    ph_host = ph["host"].fillna("").astype(str) if "host" in ph else pd.Series("", index=ph.index)
    phases = _inherit_rollout_ids(ph[(ph["pid"] == pid) & (ph_host == host)].reset_index(drop=True), run, meta)
    ev = run.events
    ev_host = ev["host"].fillna("").astype(str) if "host" in ev else pd.Series("", index=ev.index)
    events = ev[(ev["pid"] == pid) & (ev_host == host)].reset_index(drop=True)
    if meta and not meta[0].get("devices") and run.devices:
        meta[0]["devices"] = run.devices  # NVML's list is in the host sampler's meta only
    meta += [dict(engine, view_peer=True)] if engine is not None else []  # checks.check_headroom skips it
    return Run(run.path, run.meta, meta, samples, events, phases, [], run.directories)


def _stored_view(store, wanted: list[int]) -> pd.DataFrame:
    """The rows of `wanted` processes (a process and its engine server) of a run read per process, their own
    columns: the frame the merged path takes from `run.samples` (rows in its order, columns in the order
    asked), read from the processes' own frames."""
    have = [p for p in wanted if p in store.by_pid]
    if not have:
        return store.empty_merged()
    columns = list(dict.fromkeys(c for p in have for c in store.own_columns(p)))
    if len(have) == 1:
        return columns_of(store.by_pid[have[0]], columns)
    # in read order: rows at one time go in the order the merged frame has them
    order = sorted(have, key=lambda p: next(k for k, f in enumerate(store.frames) if int(f["pid"].iat[0]) == p))
    merged = merge_samples([columns_of(store.by_pid[p], store.own_columns(p)) for p in order])
    return columns_of(merged, columns)


def _inherit_rollout_ids(phases: pd.DataFrame, run, meta: list[dict]) -> pd.DataFrame:
    """An engine server's phases are requests and carry no rollout_id: each takes the rollout_id of the
    innermost phase of the process driving it (same host, GPU and rank; engine_server.engine_of) that encloses it
    in time, of the same name where one does; phases between them carry the last one forward
    (stats._iterations), and those before the first rollout get -1 (warm-up, weights still loading).
    Unchanged when the process has rollout_ids of its own or drives nothing it can inherit from."""
    if phases.empty or not meta or ("rollout_id" in phases and phases["rollout_id"].notna().any()):
        return phases
    drivers = {(str(p.get("host") or ""), int(p.get("pid", -1))) for p in run.processes
               if (e := engine_server.engine_of(run.processes, p)) is not None
               and int(e.get("pid", -1)) == int(meta[0].get("pid", -2))}
    ph = run.phases
    if not drivers or "rollout_id" not in ph:
        return phases
    hosts = ph["host"].fillna("").astype(str) if "host" in ph else pd.Series("", index=ph.index)
    mine = [(h, int(p)) in drivers for h, p in zip(hosts, ph["pid"])]
    outer = ph[np.array(mine, dtype=bool) & ph["rollout_id"].notna().to_numpy()]
    if outer.empty:
        return phases
    a0, a1 = outer["start"].to_numpy(float), outer["end"].to_numpy(float)
    a1 = np.where(np.isfinite(a1), a1, np.inf)  # an open phase encloses what started in it
    a_name, a_id = outer["name"].astype(str).to_numpy(), pd.to_numeric(outer["rollout_id"], errors="coerce").to_numpy()
    s0, s1 = phases["start"].to_numpy(float), phases["end"].to_numpy(float)
    s1 = np.where(np.isfinite(s1), s1, s0)
    names_ = phases["name"].astype(str).to_numpy()
    ids = np.full(len(phases), np.nan)
    for c in range(0, len(phases), 512):  # chunks: phases x enclosing phases stays small
        k = slice(c, c + 512)
        enclosing = (a0[None, :] <= s0[k, None]) & (a1[None, :] >= s1[k, None])
        same = enclosing & (a_name[None, :] == names_[k, None])
        pick = np.where(same.any(axis=1)[:, None], same, enclosing)
        innermost = np.where(pick, a0[None, :], -np.inf).argmax(axis=1)
        ids[k] = np.where(pick.any(axis=1), a_id[innermost], np.nan)
    return phases.assign(rollout_id=ids)


def judged_processes(run) -> list[tuple[str, int, dict]]:
    """(host, pid, meta) of the actor and engine processes with phases whose samples were read (every
    process with phases when no process has those roles)."""
    with_phases = phase_processes(run)
    have = set(pids(run))
    metas = [p for p in run.processes if (str(p.get("host") or ""), int(p.get("pid", -1))) in with_phases]
    chosen = [p for p in metas if p.get("role") in _JUDGED_ROLES] or metas
    return [(str(p.get("host") or ""), int(p["pid"]), p) for p in chosen if int(p["pid"]) in have]
