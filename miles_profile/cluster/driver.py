"""The driver's side of a recorded Ray job: one sampler actor per node, node logs gathered, cluster.json.

Started by the runtime-env hook right after `ray.init` connects (Ray's post-init hooks). A thread then
starts a sampler on every node that joins and, every GATHER_S, pulls the files of the nodes that can't
write the driver's run directory. `finish` (at `ray.shutdown()` or interpreter exit, before Ray's own
shutdown) stops the samplers and pulls what is left. A sampler that can't be reached any more is a lost
node: its processes are named in cluster.json and the report. A `kill -9` of the driver ends the job,
and Ray ends its actors with it: nothing of ours keeps running.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from miles_profile.cluster import node_sampler
from miles_profile import names
from miles_profile.logdir.cluster import write_cluster
from miles_profile.logdir.writer import EventWriter, private_tmp
from miles_profile.oom import RAY_OOM_KILL
from miles_profile.logdir.layout import PROCESS_META_SUFFIX

log = logging.getLogger("miles_profile")

GATHER_S = 2.0        # node logs reach the driver's run this often while the job runs (the live dashboard)
KILL_LAG_S = 5.0       # how long a vanished worker waits for Ray's tables to say whether Ray killed it
CALL_TIMEOUT_S = 10.0  # a sampler that answers nothing for this long is lost (a pull takes milliseconds)


class ClusterRecording:
    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.token = uuid.uuid4().hex
        self.nodes: dict[str, dict[str, Any]] = {}   # node id -> its cluster.json entry
        self.actors: dict[str, Any] = {}
        self.unreached: dict[tuple[str, int], dict[str, Any]] = {}
        self._pending: dict[str, Any] = {}  # node id -> its sampler's `info` reference, until it answers
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="miles_profile-ray", daemon=True)
        self._finished = False
        self.started_at = time.time()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "ClusterRecording":
        """Returns at once: `ray.init` is the job's, and the samplers start from our thread."""
        self._write()  # the token first: a node that sees it shares the driver's file system
        self._thread.start()
        return self

    def finish(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=CALL_TIMEOUT_S)
        if ray.is_initialized():
            self._settle(timeout_s=CALL_TIMEOUT_S)
            self._note_ray_kills()
            self._collect({nid: a.stop.remote() for nid, a in self.actors.items()}, final=True)
            for actor in self.actors.values():
                try:
                    ray.kill(actor)
                except Exception:  # already gone with its node
                    pass
        self._write(finished=True)

    def _run(self) -> None:
        try:
            self._add_new_nodes()
        except Exception as exc:  # noqa: BLE001 - the job goes on unsampled; the report says no node was
            log.warning("miles_profile: warning: no per-node samplers: %s", _one_line(exc))
        while not self._stop.wait(GATHER_S):
            try:
                self._add_new_nodes()
                self._settle()
                self._collect({nid: a.pull.remote() for nid, a in self.actors.items()
                               if self.nodes[nid]["state"] == "running"}, final=False)
                self._write()
            except Exception as exc:  # noqa: BLE001 - the job goes on; its logs stay on its nodes
                if not ray.is_initialized():
                    return
                log.warning("miles_profile: warning: gathering Ray node logs failed: %s", exc)

    # -- nodes ----------------------------------------------------------------------------------
    def _add_new_nodes(self) -> None:
        """A sampler for every node that joined; never waits for one to start (a worker process takes
        seconds to start on a busy node): `_settle` takes their answers as they come."""
        for n in ray.nodes():
            nid = n["NodeID"]
            if not n.get("Alive") or nid in self.nodes:
                continue
            self.nodes[nid] = {"node_id": nid, "ip": n.get("NodeManagerAddress"), "state": "starting",
                               "asked_at": time.time(), "stems": []}
            self.actors[nid] = node_sampler.start_on(nid, str(self.run_dir), self.token)
            self._pending[nid] = self.actors[nid].info.remote()

    def _settle(self, timeout_s: float = 0.0) -> None:
        """The answers of samplers that started (their node's entry), or why one could not."""
        if not self._pending:
            return
        ready, _ = ray.wait(list(self._pending.values()), num_returns=len(self._pending), timeout=timeout_s)
        for nid, ref in list(self._pending.items()):
            if ref not in ready:
                continue
            del self._pending[nid]
            node = self.nodes[nid]
            try:
                node.update(ray.get(ref), state="running")
                node["ready_s"] = round(time.time() - node["asked_at"], 3)
            except Exception as exc:  # noqa: BLE001 - e.g. miles_profile not importable on that node
                node.update(state="failed", error=_one_line(exc))
                self.actors.pop(nid, None)

    def _collect(self, refs: dict[str, Any], final: bool) -> None:
        for nid, ref in refs.items():
            node = self.nodes[nid]
            try:
                got = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - its actor died with its node, or never answers
                self._sampler_gone(nid, exc)
                continue
            for name, (offset, data) in got["files"].items():
                self._store(name, offset, data)
                if name.endswith(PROCESS_META_SUFFIX) and name[: -len(PROCESS_META_SUFFIX)] not in node["stems"]:
                    node["stems"].append(name[: -len(PROCESS_META_SUFFIX)])
            for item in got["unreached"]:
                self.unreached[(nid, item["pid"])] = {"node_id": nid, **item}
            if final:
                node["state"] = "stopped"

    def _note_ray_kills(self) -> None:
        """Workers of our nodes that Ray's memory monitor killed during the job, as `oom` events written
        by their node's sampler (Ray's state API, through the dashboard; without it, none are named)."""
        gone: set[int] = set()  # the job's recorded workers that died: Ray's verdict on them may lag
        unknown = False         # a node whose sampler is gone can't say which of its workers died
        for nid, actor in list(self.actors.items()):
            try:
                gone.update(ray.get(actor.vanished.remote(), timeout=CALL_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 - Ray's memory monitor may have killed the sampler too
                self._sampler_gone(nid, exc)
                unknown = True
        job_id = ray.get_runtime_context().get_job_id()
        deadline = time.monotonic() + KILL_LAG_S
        kills = ray_oom_kills(self.started_at, job_id)
        while (gone - {k["pid"] for k in kills} or unknown and not kills) and time.monotonic() < deadline:
            time.sleep(0.5)  # an actor's death reaches Ray's tables a moment after its caller's error
            kills = ray_oom_kills(self.started_at, job_id)
        ours = {n.get("sampler_pid") for n in self.nodes.values()}  # our own sampler's kill: its node's state says it
        by_node: dict[str, list[dict[str, Any]]] = {}
        for kill in kills:
            if kill["node_id"] in self.nodes and kill["pid"] not in ours:
                by_node.setdefault(kill.pop("node_id"), []).append(kill)
        for nid, found in by_node.items():
            try:
                ray.get(self.actors[nid].record_ray_kills.remote(found), timeout=CALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - its sampler is gone: written here, in its name
                self._write_kills_for(self.nodes[nid], found)

    def _sampler_gone(self, nid: str, exc: BaseException) -> None:
        """A sampler that died: killed by Ray's memory monitor (its node lives on), else its node is lost."""
        node = self.nodes[nid]
        self.actors.pop(nid, None)
        if node["state"] in ("running", "starting"):
            oom = "OutOfMemoryError" in type(exc).__name__ or "low on memory" in str(exc)
            node.update(state="sampler_killed" if oom else "lost", lost_at=time.time(), error=_one_line(exc))

    def _write_kills_for(self, node: dict[str, Any], kills: list[dict[str, Any]]) -> None:
        """Ray's kills on a node whose sampler is gone, as the events of that sampler (its stem, host, pid)."""
        if not node.get("sampler_pid") or not node.get("host"):
            return
        writer = EventWriter(self.run_dir, f"{node['host']}-{node['sampler_pid']}", pid=node["sampler_pid"],
                             host=node["host"])
        try:
            for kill in kills:
                writer.write(names.OOM, "killed", {"process_pid": kill["pid"], "cause": RAY_OOM_KILL,
                                                   "detected_by": "ray", **kill.get("attrs", {})}, t=kill["t"])
        finally:
            writer.close()

    def _store(self, name: str, offset: int | None, data: bytes) -> None:
        path = self.run_dir / Path(name).name  # a bare file name: never a path out of the run
        if offset is None:
            tmp = private_tmp(path)
            tmp.write_bytes(data)
            os.replace(tmp, path)
            return
        with open(path, "r+b" if path.exists() else "wb") as handle:
            handle.seek(offset)
            handle.write(data)

    def _write(self, finished: bool = False) -> None:
        try:
            write_cluster(self.run_dir, {
                "hook_ran": True, "connected": True, "token": self.token, "ray_version": ray.__version__, "driver_pid": os.getpid(),
                "job_id": ray.get_runtime_context().get_job_id(), "finished": finished,
                "nodes": list(self.nodes.values()), "unreached": list(self.unreached.values())})
        except OSError as exc:
            log.warning("miles_profile: warning: cannot write %s/cluster.json: %s", self.run_dir, exc)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


_current: ClusterRecording | None = None


def start(run_dir: str) -> None:
    """After `ray.init` in the driver: record the cluster into `run_dir`; finish before Ray shuts down."""
    global _current
    if _current is not None and not _current._finished:
        return
    _current = ClusterRecording(run_dir).start()
    atexit.register(_current.finish)  # after ray's own atexit shutdown was registered: runs before it
    _wrap_shutdown()


def _wrap_shutdown() -> None:
    """`ray.shutdown()` ends the job and its actors: gather the nodes' logs first."""
    original = ray.shutdown
    if getattr(original, "_miles_profile", False):
        return

    def shutdown(*args, **kwargs):
        if _current is not None:
            _current.finish()
        return original(*args, **kwargs)

    shutdown._miles_profile = True
    shutdown.__wrapped__ = original
    ray.shutdown = shutdown


_RAY_NUMBERS = re.compile(r"Memory usage (\d+)B exceeded threshold of (\d+)B")


def ray_oom_kills(since: float, job_id: str | None = None) -> list[dict[str, Any]]:
    """Workers Ray's memory monitor killed after `since`: [{node_id, pid, t, attrs}]. Dead actors of the
    job carry it in their death cause as soon as their owner learns of it; task workers, in the workers
    table once their raylet reported them. Empty without Ray's state API (ray without its dashboard)."""
    try:
        from ray.util.state import list_actors, list_workers
        options = {"detail": True, "limit": 10000, "timeout": int(CALL_TIMEOUT_S), "raise_on_missing_output": False}
        actors = list_actors(filters=[("state", "=", "DEAD")], **options)
        workers = list_workers(filters=[("exit_type", "=", "NODE_OUT_OF_MEMORY")], **options)
    except Exception as exc:  # noqa: BLE001 - no dashboard, or it does not answer
        log.warning("miles_profile: warning: Ray's OOM kills not read (Ray's state API: %s)", _one_line(exc))
        return []
    kills: dict[int, dict[str, Any]] = {}
    for actor in map(_as_dict, actors):
        oom = ((actor.get("death_cause") or {}).get("oom_context") or {}) if isinstance(actor.get("death_cause"), dict) else {}
        if oom and actor.get("pid") and (job_id is None or actor.get("job_id") == job_id):
            end = (actor.get("end_time") or 0) / 1000.0
            kills[int(actor["pid"])] = _kill(actor.get("node_id"), int(actor["pid"]), end or time.time(),
                                             str(oom.get("error_message") or ""))
    for worker in map(_as_dict, workers):
        end = (worker.get("end_time_ms") or 0) / 1000.0
        other_job = job_id is not None and worker.get("job_id") not in (None, "", job_id)  # the cluster's other jobs
        if worker.get("pid") and end >= since and int(worker["pid"]) not in kills and not other_job:
            kills[int(worker["pid"])] = _kill(worker.get("node_id"), int(worker["pid"]), end,
                                              str(worker.get("exit_detail") or ""))
    return list(kills.values())


def _as_dict(item) -> dict[str, Any]:
    return item if isinstance(item, dict) else vars(item)


def _kill(node_id, pid: int, t: float, detail: str) -> dict[str, Any]:
    found = _RAY_NUMBERS.search(detail)
    attrs: dict[str, Any] = {"ray_detail": detail.splitlines()[0][:300] if detail else None}
    if found:
        attrs.update(ray_memory_used=int(found.group(1)), ray_memory_threshold=int(found.group(2)))
    return {"node_id": node_id, "pid": pid, "t": t, "attrs": attrs}
