"""Import the directory Miles' `--use-miles-dashboard` writes (`{dump_details}/dashboard/`) as a multi-GPU run.

The schema was read from radixark/miles `miles/dashboard/store.py` at commit
0e33f812698c0ddaa4d43ae0e0da1d3c8679eabe (writers: `gpu_sampler.py` at 3e08b1bf, `hooks.py` and
`collector.py` at 1310a866); no real Miles run was read. What is used:

    meta.json                       {run_name, start_ts, args, schema_version}
    phases/<YYYYMMDD_HH>.jsonl      {name, t0, t1, node, gpus, rank, role}: one Timer interval of one
                                    process; t1 == -1 marks an interval still open when written, superseded
                                    by its closing twin (same node, rank, name, t0); role "train" (a
                                    training rank, `gpus` its GPUs) or "rollout_manager" (no GPUs: the
                                    interval covers every GPU of every rollout engine in the topology)
    gpu_util/<YYYYMMDD_HH>.jsonl    {ts, node, gpu, util, mem_mb, power_w}: NVML, one GPU, every second;
                                    mem_mb = nvmlDeviceGetMemoryInfo(...).used >> 20 (MiB, rounded down)
    topology.jsonl                  {ts, engines: [{addr, worker_type, engine_rank, gpus: [[node, gpu]],
                                    gpu_uuids: [uuid or null]}]}: snapshot N holds until snapshot N+1
    gpu_processes/<YYYYMMDD_HH>.jsonl   {ts, node, gpu, pid, name, mem_mb}: NVML per process every 5 s,
                                    only in a later store.py (GpuProcessSample; gpu_sampler.py at 3e08b1bf
                                    writes it); read when present, into `gpu_procs`
    (a v1 flat `<stream>.jsonl` reads as one more partition, as Miles does)

What the `Run` holds (docs/report.md, "Importing Miles' dashboard data"): one `actor` process per
training rank, one `engine` process per GPU of each rollout engine, their phases under canonical names
(MILES_PHASES), `gpu_samples` per (host, GPU) in bytes (MiB x 2**20), and the same NVML level in
`samples` as `gpu{i}_used` of every process on that GPU. Miles records no pid (pids here are
synthetic; `gpu_procs` keeps the real pids of the host), no device totals, no true peaks, no allocator
and no host memory: those are absent, never zero, and the checks that need them say n/a.

    is_miles_dashboard(path) -> bool
    find_miles_dashboard(path) -> Path | None     # the directory itself or its `dashboard/`
    load_miles_dashboard(path) -> Run
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.errors import MilesProfileError
from miles_profile.importers.miles_dashboard_streams import (
    OPEN_T1, gpu_frame, phase_frame, proc_frame, stream_files,
)
from miles_profile.importers.miles_topology import topology
from miles_profile.logdir.files import read_small
from miles_profile.logdir.host_reader import GPU_PROC_COLUMNS, GPU_SAMPLE_COLUMNS, HOST_COLUMNS
from miles_profile.logdir.layout import FORMAT_VERSION
from miles_profile.logdir.lost_phases import add_lost_span
from miles_profile.logdir.reader import EVENT_COLUMNS, PHASE_COLUMNS, Run

MIB = 2 ** 20  # gpu_sampler.py: `used >> 20`
TRAIN, ROLLOUT_MANAGER = "train", "rollout_manager"  # Miles' Role values
# Miles Timer names (the dashboard's phase palette) -> canonical names; names not listed are kept as they
# are. `sleep` / `wake_up` are the training ranks' release and resume of their GPU state; a rollout
# manager's are not mapped (which state they move is not recorded).
MILES_PHASES = {"rollout": names.GENERATE, "eval_rollout": names.EVAL, "actor_train": names.TRAIN,
                "update_weights": names.UPDATE_WEIGHTS}
TRAIN_ONLY = {"sleep": names.OFFLOAD_TRAIN, "wake_up": names.ONLOAD_TRAIN}
ACTOR_PID0, ENGINE_PID0, GPU_PID0 = 1_000_000, 2_000_000, 3_000_000  # synthetic pids: Miles records none
SOURCE = "Miles dashboard (--use-miles-dashboard)"


def _meta(path: Path) -> dict[str, Any] | None:
    try:  # the guarded open: a FIFO or a 2 GiB sparse meta.json is refused at once
        data = json.loads(read_small(path / "meta.json"))
    except (MilesProfileError, OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or "format_version" in data:
        return None
    return data if "run_name" in data and "start_ts" in data else None


def is_miles_dashboard(path: str | Path) -> bool:
    """A directory with Miles' dashboard meta.json (run_name, start_ts; no miles-profile format_version)."""
    path = Path(path)
    return path.is_dir() and _meta(path) is not None


def find_miles_dashboard(path: str | Path) -> Path | None:
    path = Path(path)
    for candidate in (path, path / "dashboard"):
        if is_miles_dashboard(candidate):
            return candidate
    return None


# -- the run -----------------------------------------------------------------------------------
@dataclass
class ImportedRun(Run):
    """A `Run` whose host-level data come from the import, not from host sampler files."""
    imported_hosts: list[dict[str, Any]] = field(default_factory=list)
    imported_gpu_samples: pd.DataFrame | None = None
    imported_gpu_procs: pd.DataFrame | None = None

    @cached_property
    def _host_data(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        def empty(columns):
            return pd.DataFrame({c: pd.Series(dtype=str if c in ("host", "gpu_uuid") else float) for c in columns})
        gpus = self.imported_gpu_samples if self.imported_gpu_samples is not None else empty(GPU_SAMPLE_COLUMNS)
        procs = self.imported_gpu_procs if self.imported_gpu_procs is not None else empty(GPU_PROC_COLUMNS)
        return empty(HOST_COLUMNS), gpus, procs

    @cached_property
    def _gpu_procs(self) -> pd.DataFrame:
        return self._host_data[2]

    @cached_property
    def gpu_used(self) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
        self._host_data  # noqa: B018 - imported frames: the base class splits them instead of reading files
        return Run.gpu_used.func(self)

    def gpu_procs_of(self, hosts) -> pd.DataFrame:
        procs = self._gpu_procs
        return procs[procs["host"].astype(str).isin([str(h) for h in hosts])]

    @cached_property
    def hosts(self) -> list[dict[str, Any]]:
        return self.imported_hosts


def _gpu_id(node: str, gpu: int, uuids: dict[tuple[str, int], str]) -> str:
    """The GPU's NVML UUID where the topology recorded it, else the stable `<node>:<index>` (Miles' lane key)."""
    return uuids.get((node, gpu)) or f"{node}:{gpu}"


def _process(pid, node, index, rank, role, world, uuids, start, last) -> dict[str, Any]:
    device = {"index": index, "uuid": _gpu_id(node, index, uuids), "name": None, "total": None}
    return {"pid": pid, "host": node, "rank": rank, "local_rank": index if index >= 0 else None,
            "world_size": world or None, "role": role, "gpu_uuid": device["uuid"] if index >= 0 else None,
            "gpu_index": index, "devices": [device] if index >= 0 else [],
            "probes": [{"name": "nvml", "active": True}], "start_time": start, "end_time": last,
            "stem": f"{node}-{pid}", "source": SOURCE}


def _processes(ph: pd.DataFrame, snapshots: list[dict], uuids, start: float, last: float):
    """One actor per training rank (keyed by node and first GPU: an interval written before
    torch.distributed started says rank -1), one engine per GPU of each rollout engine."""
    train = ph[ph["role"] == TRAIN]
    ranks = train.groupby(["node", "gpu"], sort=False)["rank"].max()
    world = int((ranks >= 0).sum())
    order = sorted(ranks.items(), key=lambda kv: (kv[1] < 0, kv[1], kv[0]))
    processes, actor_pid, on_gpu = [], {}, {}
    for n, ((node, index), rank) in enumerate(order):
        pid = ACTOR_PID0 + (int(rank) if rank >= 0 else 100_000 + n)
        actor_pid[(node, int(index))] = pid
        processes.append(_process(pid, node, int(index), int(rank), "actor", world, uuids, start, last))
        if index >= 0:
            on_gpu.setdefault((node, int(index)), []).append(pid)
    rank_on_gpu = {(p["host"], p["gpu_index"]): p["rank"] for p in processes}
    worker_pid: dict[tuple[str, str, int], int] = {}
    for snapshot in snapshots:
        for w in snapshot["new"]:  # each worker once, not once per snapshot that lists it
            key = (w["addr"], w["node"], w["gpu"])
            if key in worker_pid:
                continue
            pid = worker_pid[key] = ENGINE_PID0 + len(worker_pid)
            p = _process(pid, w["node"], w["gpu"], rank_on_gpu.get((w["node"], w["gpu"]), -1), "engine", world,
                         uuids, start, last)
            p["engine"] = {"addr": w["addr"], "engine_rank": w["engine_rank"]}
            processes.append(p)
            on_gpu.setdefault((w["node"], w["gpu"]), []).append(pid)
    return processes, actor_pid, worker_pid, on_gpu


def _place(ph: pd.DataFrame, snapshots, actor_pid, worker_pid, warnings) -> pd.DataFrame:
    """Intervals on processes: a training rank's on its actor; a rollout manager's on every engine GPU of
    the topology windows it overlaps, clipped to them (Miles' phases_by_lane does the same)."""
    train = ph[ph["role"] == TRAIN]
    placed = [train.assign(pid=[actor_pid[k] for k in zip(train["node"], train["gpu"])])]
    rows, unplaced = [], 0
    for e in ph[ph["role"] == ROLLOUT_MANAGER].itertuples(index=False):
        hit, fields = False, e._asdict()  # once per interval, not per worker: 3,000 engines x N rollouts
        for snapshot in snapshots:
            a = max(e.t0, snapshot["t0"])
            b = OPEN_T1 if e.t1 == OPEN_T1 else min(e.t1, snapshot["t1"])
            if b != OPEN_T1 and a >= b:
                continue
            for w in snapshot["workers"]:
                hit = True
                rows.append({**fields, "t0": a, "t1": b, "node": w["node"], "gpu": w["gpu"],
                             "pid": worker_pid[(w["addr"], w["node"], w["gpu"])]})
        unplaced += not hit
    unplaced += int((~ph["role"].isin([TRAIN, ROLLOUT_MANAGER])).sum())
    if unplaced:
        warnings.append(f"phases: {unplaced} intervals of no training rank and no engine in the topology were left out")
    placed.append(pd.DataFrame(rows, columns=[*ph.columns, "pid"]))
    return pd.concat(placed, ignore_index=True)


def _iteration_anchors(ph: pd.DataFrame) -> np.ndarray:
    """Iteration k starts with the k-th rollout (the rollout manager's `rollout`); a run without one
    counts the lowest training rank's `actor_train` intervals."""
    rollouts = ph[(ph["role"] == ROLLOUT_MANAGER) & (ph["name"] == "rollout")]
    if rollouts.empty:
        trains = ph[(ph["role"] == TRAIN) & (ph["name"] == "actor_train")]
        rollouts = trains[trains["rank"] == trains["rank"].min()] if len(trains) else trains
    return np.unique(rollouts["t0"].to_numpy(float))


def _phases_and_events(placed: pd.DataFrame, anchors: np.ndarray, last: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The reader's phases table (logdir/reader.py: PHASE_COLUMNS, then the attrs as columns) and the
    begin/end events, built directly: the reader's phases_from_events loops in Python per phase (seconds
    on a 512-GPU hour). A test checks both agree. Nesting: the parent is the innermost enclosing interval."""
    placed = placed.assign(end=np.where(placed["t1"] == OPEN_T1, np.inf, placed["t1"]))
    placed = placed.sort_values(["pid", "t0", "end"], ascending=[True, True, False], kind="stable")
    pid, t0, end = placed["pid"].to_numpy(np.int64), placed["t0"].to_numpy(float), placed["end"].to_numpy(float)
    n = len(placed)
    ids, parents, depths = np.zeros(n, np.int64), np.full(n, -1, np.int64), np.zeros(n, np.int64)
    stack: list[tuple[int, float]] = []
    next_id, current = 1, None
    for k in range(n):
        if pid[k] != current:
            current, next_id, stack = pid[k], 1, []
        while stack and stack[-1][1] < end[k]:
            stack.pop()
        ids[k], parents[k], depths[k] = next_id, stack[-1][0] if stack else -1, len(stack)
        stack.append((next_id, end[k]))
        next_id += 1
    iteration = np.searchsorted(anchors, t0 + 1e-9, side="right") - 1
    miles_name, role = placed["name"].to_numpy(object), placed["role"].to_numpy(object)
    name = np.array([TRAIN_ONLY[m] if r == TRAIN and m in TRAIN_ONLY else MILES_PHASES.get(m, m)
                     for m, r in zip(miles_name, role)], dtype=object)
    is_open = ~np.isfinite(end)
    stop = np.where(is_open, np.maximum(last, t0), end)
    attrs = [{"miles_name": m, "miles_role": r, **({"rollout_id": int(i)} if i >= 0 else {})}
             for m, r, i in zip(miles_name, role, iteration)]
    host = placed["node"].to_numpy(object)
    phases = pd.DataFrame({
        "name": name, "start": t0.astype(float), "end": stop, "duration": stop - t0, "pid": pid.astype(np.int64),
        "host": host, "id": ids, "parent": parents, "depth": depths,
        "status": np.where(is_open, names.OPEN, "ok").astype(object), "attrs": attrs,
    })[PHASE_COLUMNS]
    phases = pd.concat([phases, pd.DataFrame(attrs, index=phases.index)], axis=1)  # attrs as columns, as the reader
    phases = phases.sort_values(["start", "depth"], kind="stable").reset_index(drop=True)
    closed = ~is_open
    parent_col = pd.array(np.where(parents >= 0, parents, 0), dtype="Int64")
    parent_col[parents < 0] = pd.NA
    begin = pd.DataFrame({"t": t0.astype(float), "kind": names.BEGIN, "name": name, "pid": pid, "host": host,
                          "id": ids, "parent": parent_col, "attrs": attrs})
    finish = pd.DataFrame({"t": end[closed].astype(float), "kind": names.END, "name": name[closed], "pid": pid[closed],
                           "host": host[closed], "id": ids[closed], "parent": parent_col[closed],
                           "attrs": [{"status": "ok"} for _ in range(int(closed.sum()))]})
    events = pd.concat([begin, finish], ignore_index=True)[EVENT_COLUMNS]
    return phases, events.sort_values("t", kind="stable").reset_index(drop=True)


def _innermost(start, end, depth, phase_id, name) -> tuple[np.ndarray, list[str]]:
    """Step function of one process's innermost open phase: from times[k] on it is labels[k]."""
    edges = sorted([(t, 1, d, i, n) for t, d, i, n in zip(start, depth, phase_id, name)]
                   + [(t, 0, d, i, n) for t, d, i, n in zip(end, depth, phase_id, name)])
    open_now: dict[int, tuple[int, str]] = {}
    times, labels = [], []
    for t, begins, d, i, n in edges:
        if begins:
            open_now[i] = (d, n)
        else:
            open_now.pop(i, None)
        times.append(t)
        labels.append(max(open_now.values())[1] if open_now else "")
    return np.asarray(times, dtype=float), labels


def _by_pid(pids: np.ndarray) -> dict[int, np.ndarray]:
    """Row indices of each pid, in row order."""
    order = np.argsort(pids, kind="stable")
    unique, first = np.unique(pids[order], return_index=True)
    return {int(p): rows for p, rows in zip(unique, np.split(order, first[1:]))}


def _samples(gpu: pd.DataFrame, lane: np.ndarray, pids_of_lane: list[list[int]], phases: pd.DataFrame) -> pd.DataFrame:
    """NVML used of each GPU as `gpu<index>_used` of every process on it (its actor and engine workers),
    as each of our own processes records its device's level, with that process's innermost phase.
    GPUs no process is known on stay in gpu_samples only."""
    rows_of_lane = _by_pid(lane)
    picks = [(rows_of_lane[k], p) for k, pids in enumerate(pids_of_lane) if k in rows_of_lane for p in pids]
    take = np.concatenate([rows for rows, _ in picks]) if picks else np.zeros(0, np.int64)
    pids = np.concatenate([np.full(len(rows), p, np.int64) for rows, p in picks]) if picks else np.zeros(0, np.int64)
    order = np.argsort(gpu["ts"].to_numpy(float)[take], kind="stable")  # samples are in time order, as the reader's
    take, pids = take[order], pids[order]
    t, index = gpu["ts"].to_numpy(float)[take], gpu["gpu"].to_numpy(np.int64)[take]
    used = gpu["mem_mb"].to_numpy(np.int64)[take].astype(float) * MIB
    frame = pd.DataFrame({"t": t, "phase": "", "pid": pids})
    for i in np.unique(index):
        frame[f"gpu{i}_used"] = np.where(index == i, used, np.nan)
    phase = np.full(len(frame), "", dtype=object)
    columns = [phases[c].to_numpy(object if c == "name" else None) for c in ("start", "end", "depth", "id", "name")]
    of_pid = _by_pid(phases["pid"].to_numpy(np.int64))
    for p, rows in _by_pid(pids).items():
        if p not in of_pid:
            continue
        times, labels = _innermost(*(c[of_pid[p]] for c in columns))
        at = np.searchsorted(times, t[rows], side="right") - 1
        phase[rows] = np.asarray(labels + [""], dtype=object)[at]  # at == -1: before any phase, ""
    frame["phase"] = pd.Categorical(phase)
    return frame


def _no_gpu_samples(root: Path, warnings: list[str]) -> str:
    """Why a dashboard with phases has no memory: damaged gpu_util files, or no NVML for Miles' sampler."""
    damage = [w for w in warnings if w.startswith("gpu_util")]
    if damage:
        return (f"{root}: the Miles dashboard's gpu_util stream holds no readable sample "
                f"({'; '.join(damage[:3])}): no memory to report")
    if stream_files(root, "gpu_util"):
        return f"{root}: the Miles dashboard's gpu_util files hold no sample: no memory to report"
    return (f"{root}: the Miles dashboard holds phases but no gpu_util samples "
            "(NVML was unavailable to Miles' GPU sampler): no memory to report")


def load_miles_dashboard(path: str | Path) -> Run:
    given = Path(path)
    root = find_miles_dashboard(given)
    if root is None:
        raise MilesProfileError(f"{given}: not a Miles dashboard directory (no meta.json with run_name and start_ts)")
    meta_in = _meta(root) or {}
    warnings: list[str] = []
    lost: list = []  # where an interval or its samples were lost: transition_spikes judges no boundary there
    gpu = gpu_frame(root, warnings, lost)
    ph = phase_frame(root, warnings, lost)
    for row in ph[~ph["role"].isin([TRAIN, ROLLOUT_MANAGER])].itertuples(index=False):  # _place leaves them out
        lost.append((row.t0, row.t0 if row.t1 == OPEN_T1 else row.t1))
    snapshots = topology(root, warnings)
    if gpu.empty and ph.empty:
        raise MilesProfileError(f"{root}: the Miles dashboard holds no gpu_util samples and no phases")
    if gpu.empty:
        raise MilesProfileError(_no_gpu_samples(root, warnings))
    uuids = {(w["node"], w["gpu"]): w["uuid"] for s in snapshots for w in s["new"] if w["uuid"]}
    stamps = [*gpu["ts"].iloc[[0, -1]]] if len(gpu) else []
    stamps += [float(ph["t0"].min()), float(ph.loc[ph["t1"] != OPEN_T1, "t1"].max())] if len(ph) else []
    stamps = [t for t in stamps if np.isfinite(t)]
    start = float(meta_in["start_ts"]) if isinstance(meta_in.get("start_ts"), (int, float)) else min(stamps)
    last = max([start, *stamps])

    processes, actor_pid, worker_pid, on_gpu = _processes(ph, snapshots, uuids, start, last)
    placed = _place(ph, snapshots, actor_pid, worker_pid, warnings)
    phases, events = _phases_and_events(placed, _iteration_anchors(ph), last)

    # One code per (node, GPU) lane: identity and processes are looked up once per lane, not per sample.
    lanes = gpu[["node", "gpu"]].drop_duplicates().reset_index(drop=True)
    lane = pd.MultiIndex.from_frame(lanes).get_indexer(pd.MultiIndex.from_frame(gpu[["node", "gpu"]]))
    lane_ids = [_gpu_id(n, int(g), uuids) for n, g in zip(lanes["node"], lanes["gpu"])]
    for n, g in zip(lanes["node"], lanes["gpu"]):  # a GPU Miles sampled but no phase or engine names: its own lane
        if (n, int(g)) not in on_gpu:
            pid = GPU_PID0 + len(processes)
            processes.append(_process(pid, n, int(g), -1, "gpu", None, uuids, start, last))
            on_gpu[(n, int(g))] = [pid]
    pids_of_lane = [on_gpu[(n, int(g))] for n, g in zip(lanes["node"], lanes["gpu"])]
    samples = _samples(gpu, lane, pids_of_lane, phases)
    gpu_samples = pd.DataFrame({
        "t": gpu["ts"].to_numpy(float),
        "host": pd.Categorical(gpu["node"].to_numpy(object)),
        "gpu_uuid": (pd.Categorical.from_codes(lane, categories=lane_ids) if len(set(lane_ids)) == len(lane_ids)
                     else pd.Categorical(np.asarray(lane_ids, dtype=object)[lane])),  # one UUID on two lanes: damage
        "used": gpu["mem_mb"].to_numpy(np.int64) * MIB,
    })
    procs = proc_frame(root, warnings)
    gpu_procs = pd.DataFrame({  # real pids of the host, not the synthetic ones of `processes`
        "t": procs["ts"].to_numpy(float), "host": pd.Categorical(procs["node"].to_numpy(object)),
        "gpu_uuid": pd.Categorical([_gpu_id(n, int(g), uuids) for n, g in zip(procs["node"], procs["gpu"])]),
        "pid": procs["pid"].to_numpy(np.int64),
        # 0 is how Miles wrote a usage NVML did not report (None); a process with a CUDA context holds more
        "bytes": np.where(procs["mem_mb"].to_numpy(float) > 0, procs["mem_mb"].to_numpy(float) * MIB, np.nan),
    })
    hosts = [{"host": node, "source": SOURCE,
              "gpus": [{"index": int(g), "uuid": _gpu_id(node, int(g), uuids), "name": None, "total": None}
                       for g in sorted(part["gpu"].unique())],
              "probes": [{"name": "nvml", "active": True}]}
             for node, part in lanes.groupby("node", sort=True)]
    interval = float(gpu.groupby(lane)["ts"].diff().median() * 1000) if len(gpu) > 1 else float("nan")
    meta = {"format_version": FORMAT_VERSION, "run_id": f"miles:{meta_in.get('run_name', root.name)}",
            "command": [f"imported from {root}"], "start_time": start, "end_time": last,
            "host": f"{len(hosts)} hosts: " + ", ".join(h["host"] for h in hosts[:8]) + (" ..." if len(hosts) > 8 else ""),
            "interval_ms": interval if np.isfinite(interval) else None, "source": SOURCE,
            "miles_run_name": meta_in.get("run_name"), "miles_schema_version": meta_in.get("schema_version")}
    for lo, hi in lost:
        add_lost_span(meta, lo, hi)
    warnings.append("imported from Miles' dashboard: NVML device memory every ~1 s; no true peaks between "
                    "samples, no allocator, no host memory and no device totals (checks that need them are n/a)")
    return ImportedRun(root, meta, processes, samples, events, phases, warnings, [root],
                       imported_hosts=hosts, imported_gpu_samples=gpu_samples, imported_gpu_procs=gpu_procs)
