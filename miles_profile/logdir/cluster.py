"""`cluster.json`: what a Ray job's recording knows about its nodes (docs/log-format.md, docs/ray.md).

Written by the job's driver (miles_profile/cluster/driver.py) and read by the reader, which says in
`Run.warnings` what the run lacks because of Ray: a node lost mid-run (its processes named), a node
whose logs were never gathered, workers that ran without the run directory, a node without a sampler.

    {"format_version": 1, "hook_ran": true, "connected": true, "token": "...", "ray_version": "2.60.0", "job_id": "02000000", "driver_pid": N,
     "finished": true,
     "nodes": [{"node_id", "host", "machine", "sampler_pid", "node_dir", "shared", "start_s",
                "state": "running" | "stopped" | "lost" | "sampler_killed" | "failed", "lost_at", "error", "stems": [...]}],
     "unreached": [{"node_id", "pid", "title"}]}

The hook writes `{"hook_ran": true, "connected": false, "driver_pid": N, "nodes": []}` before `ray.init`
connects (a driver that never reaches its cluster leaves just that). Where a Ray driver ran in the recorded command but the hook never ran in it (so none of its workers
could be recorded), `record --exec` writes `{"format_version": 1, "hook_ran": false, "drivers": [pid]}`.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from miles_profile.logdir.writer import write_json

CLUSTER_FILE = "cluster.json"
CLUSTER_FORMAT = 1


def write_cluster(run_dir: Path, doc: dict[str, Any]) -> None:
    write_json(Path(run_dir) / CLUSTER_FILE, {"format_version": CLUSTER_FORMAT, **doc})


def read_cluster(run_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((Path(run_dir) / CLUSTER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _node(n: dict[str, Any]) -> str:
    return f"Ray node {str(n.get('node_id', '?'))[:8]} ({n.get('host', '?')})"


def _clock(t: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "?"


def cluster_warnings(run_dir: Path, processes: list[dict[str, Any]]) -> list[str]:
    """What the run lacks because of Ray, one line each (empty for a run that is not a Ray job's)."""
    warnings: list[str] = []
    doc = read_cluster(run_dir)
    if doc is None:
        return warnings
    if doc.get("hook_ran") is False:
        warnings.append(hook_missing_text(doc.get("drivers") or []))
    elif doc.get("connected") is False:
        warnings.append(f"the Ray driver (pid {doc.get('driver_pid', '?')}) never connected to its cluster: "
                        f"no worker of the job was recorded")
    by_stem = {p.get("stem"): p for p in processes}
    for n in doc.get("nodes", []):
        state = n.get("state")
        if state == "lost":
            stems = [s for s in n.get("stems", []) if s in by_stem] or n.get("stems", [])
            who = ", ".join(stems) if stems else "no recorded process seen"
            warnings.append(f"{_node(n)} was lost at {_clock(n.get('lost_at'))}: its processes ({who}) are "
                            f"recorded only up to their last gathered rows; the other nodes are complete")
        elif state == "sampler_killed":
            warnings.append(f"{_node(n)}: Ray's memory monitor killed our sampler there at {_clock(n.get('lost_at'))} "
                            f"(with the job's workers); the node's host memory and logs end there")
        elif state == "failed":
            warnings.append(f"{_node(n)}: no sampler started ({n.get('error', '?')}); its host memory is missing")
        elif state == "running" and not n.get("shared"):
            warnings.append(f"{_node(n)}: its logs were not all gathered (the driver ended without finishing, "
                            f"e.g. kill -9); the rest is on that node under {n.get('node_dir')}")
    seen = doc.get("unreached") or []
    if seen:
        listed = ", ".join(f"{u.get('title', '?')} (pid {u.get('pid')})" for u in seen[:4])
        more = f" and {len(seen) - 4} more" if len(seen) > 4 else ""
        warnings.append(f"{len(seen)} worker process(es) of the Ray job ran without the run directory (an "
                        f"actor's runtime env replaced {'MILES_PROFILE_RUN_DIR'}): {listed}{more}; phases "
                        f"they tagged were not recorded")
    return warnings


def hook_missing_text(drivers: list[int]) -> str:
    pids = ", ".join(str(p) for p in drivers) or "?"
    return (f"a Ray driver ran (pid {pids}) but the recorder's runtime-env hook never ran in it (a Ray "
            f"without RAY_RUNTIME_ENV_HOOK, `uv run`, or a program that replaced it): phases its workers "
            f"tagged were not recorded (docs/ray.md)")


def mark_ray_restarts(processes: list[dict[str, Any]]) -> list[str]:
    """A Ray actor restarted by Ray (`max_restarts`) is two processes (or more) under one actor id: each
    but the last gets `ray_restarted_as` (the pid that took over), so the reader and the `oom` check say
    killed and restarted, never a rank that ended or was lost. One line per restarted actor."""
    by_actor: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for p in processes:
        if p.get("ray_actor_id"):
            by_actor.setdefault((p.get("ray_job_id"), p["ray_actor_id"]), []).append(p)
    lines = []
    for (_, actor_id), procs in by_actor.items():
        if len(procs) < 2:
            continue
        procs.sort(key=lambda p: (p.get("start_time") or 0.0, bool(p.get("ray_restarted"))))
        for before, after in zip(procs, procs[1:]):
            before["ray_restarted_as"] = after.get("pid")
        name = f" {procs[0]['ray_actor_name']!r}" if procs[0].get("ray_actor_name") else ""
        chain = " -> ".join(f"pid {p.get('pid')} ({p.get('host', '?')})" for p in procs)
        lines.append(f"Ray restarted actor {procs[0].get('ray_actor_class') or '?'}{name} (actor "
                     f"{str(actor_id)[:8]}) {len(procs) - 1} time(s): {chain}, one actor id; each process but the "
                     f"last ended without its end (killed) and Ray started the next (the oom check says how)")
    return lines
