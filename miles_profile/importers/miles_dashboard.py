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
    (a v1 flat `<stream>.jsonl` reads as one more partition, as Miles does)

What the `Run` holds (docs/log-format.md, "Importing Miles' dashboard data"): one `actor` process per
training rank, one `engine` process per GPU of each rollout engine, their phases under canonical names
(MILES_PHASES), `gpu_samples` per (host, GPU) in bytes (MiB x 2**20), and the same NVML level in
`samples` as `gpu{i}_used` of the process that owns the GPU. Miles records no pid (pids here are
synthetic), no device totals, no true peaks, no allocator and no host memory: those are absent,
never zero, and the checks that need them say n/a.

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
from miles_profile.logdir.host_reader import GPU_PROC_COLUMNS, GPU_SAMPLE_COLUMNS, HOST_COLUMNS
from miles_profile.logdir.layout import FORMAT_VERSION
from miles_profile.logdir.reader import Run, events_frame, phase_timeline, phases_from_events

MIB = 2 ** 20  # gpu_sampler.py: `used >> 20`
OPEN_T1 = -1.0
TRAIN, ROLLOUT_MANAGER = "train", "rollout_manager"  # Miles' Role values
# Miles Timer names (the dashboard's phase palette) -> canonical names; names not listed are kept as they
# are. `sleep` / `wake_up` are the training ranks' release and resume of their GPU state; a rollout
# manager's are not mapped (which state they move is not recorded).
MILES_PHASES = {"rollout": names.GENERATE, "eval_rollout": names.EVAL, "actor_train": names.TRAIN,
                "update_weights": names.UPDATE_WEIGHTS}
TRAIN_ONLY = {"sleep": names.OFFLOAD_TRAIN, "wake_up": names.ONLOAD_TRAIN}
ACTOR_PID0, ENGINE_PID0 = 1_000_000, 2_000_000  # synthetic pids: Miles records none
SOURCE = "Miles dashboard (--use-miles-dashboard)"


def _meta(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
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


# -- streams -----------------------------------------------------------------------------------
def _stream_files(root: Path, stream: str) -> list[Path]:
    # Links are not followed: the dashboard serves what is under its root only (dashboards/paths.py).
    legacy = root / f"{stream}.jsonl"
    folder = root / stream
    parts = sorted(folder.glob("*.jsonl")) if folder.is_dir() and not folder.is_symlink() else []
    return [p for p in ([legacy] if legacy.is_file() else []) + parts if not p.is_symlink()]


def _records(root: Path, stream: str, warnings: list[str]) -> list[dict]:
    """Every complete JSON object line of a stream; a partial last line (a writer mid-append) and a
    malformed line are dropped and counted."""
    rows, bad = [], 0
    for path in _stream_files(root, stream):
        try:
            data = path.read_bytes()
        except OSError as exc:
            warnings.append(f"{stream}/{path.name}: unreadable ({exc.strerror or exc}), skipped")
            continue
        end = data.rfind(b"\n")
        if end + 1 < len(data):
            warnings.append(f"{stream}/{path.name}: dropped a truncated last line")
        for line in data[: end + 1].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
            elif line.strip():
                bad += 1
    if bad:
        warnings.append(f"{stream}: skipped {bad} malformed lines")
    return rows


def _gpu_frame(root: Path, warnings: list[str]) -> pd.DataFrame:
    rows = _records(root, "gpu_util", warnings)
    frame = pd.DataFrame(rows, columns=["ts", "node", "gpu", "mem_mb"])
    for column in ("ts", "gpu", "mem_mb"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    good = frame[["ts", "gpu", "mem_mb"]].notna().all(axis=1) & frame["node"].map(lambda n: isinstance(n, str))
    if (~good).any():
        warnings.append(f"gpu_util: skipped {int((~good).sum())} samples without ts, node, gpu or mem_mb")
    frame = frame[good].astype({"gpu": "int64", "mem_mb": "int64"})
    return frame.sort_values("ts", kind="stable").reset_index(drop=True)


def _phase_records(root: Path, warnings: list[str]) -> list[dict]:
    events, bad = [], 0
    for row in _records(root, "phases", warnings):
        try:
            event = {"name": str(row["name"]), "t0": float(row["t0"]), "t1": float(row["t1"]),
                     "node": str(row["node"]), "gpus": [int(g) for g in row.get("gpus") or []],
                     "rank": int(row.get("rank", -1)), "role": str(row.get("role", ""))}
        except (KeyError, TypeError, ValueError):
            bad += 1
            continue
        events.append(event)
    if bad:
        warnings.append(f"phases: skipped {bad} intervals without name, t0, t1 or node")
    # A closing event supersedes the open marker Timer.start wrote for the same interval.
    closed = {(e["node"], e["rank"], e["name"], e["t0"]) for e in events if e["t1"] != OPEN_T1}
    kept = [e for e in events if e["t1"] != OPEN_T1 or (e["node"], e["rank"], e["name"], e["t0"]) not in closed]
    unique = {(e["node"], e["rank"], e["role"], e["name"], e["t0"], e["t1"], tuple(e["gpus"])): e for e in kept}
    return sorted(unique.values(), key=lambda e: (e["t0"], -e["t1"]))


def _topology(root: Path, warnings: list[str]) -> list[dict]:
    """Snapshots with validity windows [t0, t1) and their engine workers (addr, node, gpu, uuid)."""
    snapshots = []
    for row in _records(root, "topology", warnings):
        try:
            workers = []
            for engine in row.get("engines") or []:
                uuids = list(engine.get("gpu_uuids") or [])
                for k, (node, gpu) in enumerate(engine.get("gpus") or []):
                    uuid = uuids[k] if k < len(uuids) and isinstance(uuids[k], str) and uuids[k] else None
                    workers.append({"addr": str(engine["addr"]), "engine_rank": int(engine.get("engine_rank", -1)),
                                    "node": str(node), "gpu": int(gpu), "uuid": uuid})
            snapshots.append({"t0": float(row["ts"]), "workers": workers})
        except (KeyError, TypeError, ValueError):
            warnings.append("topology: skipped a malformed snapshot")
    snapshots.sort(key=lambda s: s["t0"])
    for snapshot, after in zip(snapshots, snapshots[1:] + [None]):
        snapshot["t1"] = after["t0"] if after else np.inf
    return snapshots


# -- the run -----------------------------------------------------------------------------------
@dataclass
class ImportedRun(Run):
    """A `Run` whose host-level data come from the import, not from host sampler files."""
    imported_hosts: list[dict[str, Any]] = field(default_factory=list)
    imported_gpu_samples: pd.DataFrame | None = None

    @cached_property
    def _host_data(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        empty = {c: pd.Series(dtype=str if c in ("host", "gpu_uuid") else float) for c in GPU_PROC_COLUMNS}
        hosts = pd.DataFrame({c: pd.Series(dtype=str if c == "host" else float) for c in HOST_COLUMNS})
        gpus = self.imported_gpu_samples
        if gpus is None:
            gpus = pd.DataFrame({c: pd.Series(dtype=str if c in ("host", "gpu_uuid") else float)
                                 for c in GPU_SAMPLE_COLUMNS})
        return hosts, gpus, pd.DataFrame(empty)

    @cached_property
    def hosts(self) -> list[dict[str, Any]]:
        return self.imported_hosts


def _gpu_id(node: str, gpu: int, uuids: dict[tuple[str, int], str]) -> str:
    """The GPU's NVML UUID where the topology recorded it, else the stable `<node>:<index>` (Miles' lane key)."""
    return uuids.get((node, gpu)) or f"{node}:{gpu}"


def _canonical(name: str, role: str) -> str:
    if role == TRAIN and name in TRAIN_ONLY:
        return TRAIN_ONLY[name]
    return MILES_PHASES.get(name, name)


def load_miles_dashboard(path: str | Path) -> Run:
    given = Path(path)
    root = find_miles_dashboard(given)
    if root is None:
        raise MilesProfileError(f"{given}: not a Miles dashboard directory (no meta.json with run_name and start_ts)")
    meta_in = _meta(root) or {}
    warnings: list[str] = []
    gpu = _gpu_frame(root, warnings)
    intervals = _phase_records(root, warnings)
    snapshots = _topology(root, warnings)
    if gpu.empty and not intervals:
        raise MilesProfileError(f"{root}: the Miles dashboard holds no gpu_util samples and no phases")
    uuids = {(w["node"], w["gpu"]): w["uuid"] for s in snapshots for w in s["workers"] if w["uuid"]}
    stamps = [*gpu["ts"].iloc[[0, -1]].tolist()] if len(gpu) else []
    stamps += [t for e in intervals for t in (e["t0"], e["t1"]) if t != OPEN_T1]
    start = float(meta_in["start_ts"]) if isinstance(meta_in.get("start_ts"), (int, float)) else min(stamps)
    last = max([start, *stamps])

    # Processes: one actor per training rank (keyed by node and its first GPU: an interval written
    # before torch.distributed started says rank -1), one engine per GPU of each rollout engine.
    actors: dict[tuple[str, int], dict] = {}
    for e in intervals:
        if e["role"] == TRAIN:
            key = (e["node"], e["gpus"][0] if e["gpus"] else -1)
            actor = actors.setdefault(key, {"rank": -1})
            actor["rank"] = max(actor["rank"], e["rank"])
    processes: list[dict[str, Any]] = []
    pid_of_actor, owner_of_gpu = {}, {}
    world = sum(1 for a in actors.values() if a["rank"] >= 0)
    for n, ((node, index), actor) in enumerate(sorted(actors.items(), key=lambda kv: (kv[1]["rank"] < 0, kv[1]["rank"], kv[0]))):
        pid = ACTOR_PID0 + (actor["rank"] if actor["rank"] >= 0 else 100_000 + n)
        pid_of_actor[(node, index)] = pid
        processes.append(_process(pid, node, index, actor["rank"], "actor", world, uuids, start, last))
        if index >= 0:
            owner_of_gpu.setdefault((node, index), pid)
    rank_on_gpu = {(p["host"], p["gpu_index"]): p["rank"] for p in processes}
    pid_of_worker: dict[tuple[str, str, int], int] = {}
    for s in snapshots:
        for w in s["workers"]:
            key = (w["addr"], w["node"], w["gpu"])
            if key not in pid_of_worker:
                pid = ENGINE_PID0 + len(pid_of_worker)
                pid_of_worker[key] = pid
                p = _process(pid, w["node"], w["gpu"], rank_on_gpu.get((w["node"], w["gpu"]), -1), "engine", world,
                             uuids, start, last)
                p["engine"] = {"addr": w["addr"], "engine_rank": w["engine_rank"]}
                processes.append(p)
                owner_of_gpu.setdefault((w["node"], w["gpu"]), pid)

    # Phases: train intervals on their actor; rollout manager intervals on every engine GPU of the
    # topology window they overlap, clipped to it (Miles' phases_by_lane does the same).
    placed: list[tuple[int, str, dict, float, float]] = []
    unplaced = 0
    for e in intervals:
        t1 = e["t1"]
        if e["role"] == TRAIN:
            pid = pid_of_actor[(e["node"], e["gpus"][0] if e["gpus"] else -1)]
            placed.append((pid, e["node"], e, e["t0"], t1))
        elif e["role"] == ROLLOUT_MANAGER:
            hit = False
            for s in snapshots:
                a, b = max(e["t0"], s["t0"]), (s["t1"] if t1 == OPEN_T1 else min(t1, s["t1"]))
                if a >= b and t1 != OPEN_T1:
                    continue
                for w in s["workers"]:
                    hit = True
                    placed.append((pid_of_worker[(w["addr"], w["node"], w["gpu"])], w["node"], e, a,
                                   OPEN_T1 if t1 == OPEN_T1 else b))
            unplaced += not hit
        else:
            unplaced += 1
    if unplaced:
        warnings.append(f"phases: {unplaced} intervals of no training rank and no engine in the topology were left out")
    events = _events(placed, intervals)
    samples = _samples(gpu, owner_of_gpu, events)
    phases = phases_from_events(events, samples)
    gpu_samples = pd.DataFrame({
        "t": gpu["ts"].to_numpy(float), "host": gpu["node"].astype(str).to_numpy(),
        "gpu_uuid": [_gpu_id(n, g, uuids) for n, g in zip(gpu["node"], gpu["gpu"])],
        "used": gpu["mem_mb"].to_numpy(np.int64) * MIB,
    }).astype({"host": "category", "gpu_uuid": "category"})
    hosts = [{"host": node, "source": SOURCE,
              "gpus": [{"index": int(g), "uuid": _gpu_id(node, int(g), uuids), "name": None, "total": None}
                       for g in sorted(part["gpu"].unique())],
              "probes": [{"name": "nvml", "active": True}]}
             for node, part in gpu.groupby("node", sort=True)]
    interval = float(gpu.groupby(["node", "gpu"])["ts"].diff().median() * 1000) if len(gpu) > 1 else None
    meta = {"format_version": FORMAT_VERSION, "run_id": f"miles:{meta_in.get('run_name', root.name)}",
            "command": [f"imported from {root}"], "host": "", "start_time": start, "end_time": last,
            "interval_ms": interval if interval == interval else None, "source": SOURCE,
            "miles_run_name": meta_in.get("run_name"), "miles_schema_version": meta_in.get("schema_version")}
    warnings.append("imported from Miles' dashboard: NVML device memory every ~1 s; no true peaks between "
                    "samples, no allocator, no host memory and no device totals (checks that need them are n/a)")
    return ImportedRun(root, meta, processes, samples, events, phases, warnings, [root],
                       imported_hosts=hosts, imported_gpu_samples=gpu_samples)


def _process(pid, node, index, rank, role, world, uuids, start, last) -> dict[str, Any]:
    device = {"index": index, "uuid": _gpu_id(node, index, uuids), "name": None, "total": None}
    return {"pid": pid, "host": node, "rank": rank, "local_rank": index if index >= 0 else None,
            "world_size": world or None, "role": role, "gpu_uuid": device["uuid"] if index >= 0 else None,
            "gpu_index": index, "devices": [device] if index >= 0 else [],
            "probes": [{"name": "nvml", "active": True}], "start_time": start, "end_time": last,
            "stem": f"{node}-{pid}", "source": SOURCE}


def _iteration_anchors(intervals: list[dict]) -> np.ndarray:
    """Iteration k starts with the k-th rollout (the rollout manager's `rollout`); a run without one
    counts the first training rank's `actor_train` intervals."""
    starts = sorted({e["t0"] for e in intervals if e["role"] == ROLLOUT_MANAGER and e["name"] == "rollout"})
    if not starts:
        ranks = [e["rank"] for e in intervals if e["role"] == TRAIN and e["name"] == "actor_train"]
        first = min(ranks, default=None)
        starts = sorted({e["t0"] for e in intervals
                         if e["role"] == TRAIN and e["name"] == "actor_train" and e["rank"] == first})
    return np.asarray(starts, dtype=float)


def _events(placed: list[tuple[int, str, dict, float, float]], intervals: list[dict]) -> pd.DataFrame:
    anchors = _iteration_anchors(intervals)
    rows = []
    by_pid: dict[int, list] = {}
    for item in placed:
        by_pid.setdefault(item[0], []).append(item)
    for pid, items in by_pid.items():
        items.sort(key=lambda it: (it[3], -(np.inf if it[4] == OPEN_T1 else it[4])))
        stack: list[tuple[int, float]] = []  # (id, end) of the enclosing intervals
        for phase_id, (_, host, e, t0, t1) in enumerate(items, start=1):
            end = np.inf if t1 == OPEN_T1 else t1
            while stack and stack[-1][1] < end:
                stack.pop()
            parent = stack[-1][0] if stack else None
            iteration = int(np.searchsorted(anchors, t0 + 1e-9, side="right")) - 1
            attrs = {"miles_name": e["name"], "miles_role": e["role"]}
            if iteration >= 0:
                attrs["rollout_id"] = iteration
            name = _canonical(e["name"], e["role"])
            rows.append({"t": t0, "kind": names.BEGIN, "name": name, "pid": pid, "host": host, "id": phase_id,
                         "parent": parent, "attrs": attrs})
            if t1 != OPEN_T1:
                rows.append({"t": t1, "kind": names.END, "name": name, "pid": pid, "host": host, "id": phase_id,
                             "parent": parent, "attrs": {"status": "ok"}})
            stack.append((phase_id, end))
    return events_frame(rows)


def _samples(gpu: pd.DataFrame, owner_of_gpu: dict[tuple[str, int], int], events: pd.DataFrame) -> pd.DataFrame:
    """NVML used of each GPU as `gpu<index>_used` of the process that owns it (its actor, else its first
    engine worker), the innermost phase of that process as `phase`; GPUs nobody owns stay in gpu_samples."""
    pids = np.array([owner_of_gpu.get((n, g), -1) for n, g in zip(gpu["node"], gpu["gpu"])], dtype=np.int64)
    keep = pids >= 0
    t, pids, index = gpu["ts"].to_numpy(float)[keep], pids[keep], gpu["gpu"].to_numpy(np.int64)[keep]
    used = gpu["mem_mb"].to_numpy(np.int64)[keep].astype(float) * MIB
    frame = pd.DataFrame({"t": t, "phase": "", "pid": pids})
    for i in sorted(set(index.tolist())):
        frame[f"gpu{i}_used"] = np.where(index == i, used, np.nan)
    phase = np.full(len(frame), "", dtype=object)
    for pid in np.unique(pids):
        mine = np.flatnonzero(pids == pid)
        times, labels = phase_timeline(events[events["pid"] == pid])
        if len(times):
            at = np.searchsorted(times, t[mine], side="right") - 1
            phase[mine] = np.where(at >= 0, np.asarray(labels, dtype=object)[np.maximum(at, 0)], "")
    frame["phase"] = pd.Categorical(phase)
    return frame
