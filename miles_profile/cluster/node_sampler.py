"""One host sampler per Ray node, as an actor pinned to the node (node affinity, no CPU), owned by the
job: Ray ends it with the job's driver, also after a `kill -9` of the driver, so nothing of ours stays.

On a node whose processes can't write the driver's run directory (MILES_PROFILE_NODE_LOG_DIR, or no
shared file system), the actor also hands the node's files to the driver (`pull`): appended files from
where the last pull stopped (whole lines only), rewritten ones (metas, status) whole when they changed.
It also lists the job's workers on its node that run without the run directory (`unreached`).
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import ray

from miles_profile import host_sampler, names
from miles_profile.cluster.env import RAY_JOB_ID_ENV, RAY_RAYLET_PID_ENV, node_run_dir
from miles_profile.identity import host_name
from miles_profile.logdir.layout import HOST_LOCK_SUFFIX, PROCESS_META_SUFFIX, RUN_META
from miles_profile.logdir.writer import EventWriter, write_json
from miles_profile.oom import RAY_OOM_KILL, alive

# Recorders flush their rows every 0.5 s (writer.py): the last pull waits that long, plus a margin.
FLUSH_S = 0.6
APPENDED = (".csv", ".jsonl")  # files a writer only appends to: sent from the last offset on
# Ray starts a worker with a runtime env as `python .../setup_worker.py ...`, which has the job's RAY_JOB_ID
# but not yet the env's variables (ray/_private/runtime_env/context.py sets them, then execs the worker
# under the same pid): caught in that moment, it looked like a worker without the run directory.
RAY_WORKER_LAUNCHER = b"setup_worker.py"


class NodeSampler:
    def __init__(self, run_dir: str, token: str):
        started = time.monotonic()
        self.run_dir = Path(run_dir)
        self.node_dir = node_run_dir(run_dir)
        self.shared = self.node_dir == self.run_dir and _holds_token(self.run_dir, token)
        self.sampler = host_sampler.HostSampler(self.node_dir, prefer=True).start()
        self.metrics = _serve_metrics(self.node_dir)
        self._sent: dict[str, tuple[int, int]] = {}
        self._offsets: dict[str, int] = {}
        self.job_id = os.environ.get(RAY_JOB_ID_ENV, "")
        self.raylet_pid = os.environ.get(RAY_RAYLET_PID_ENV, "")
        self.start_s = time.monotonic() - started

    def info(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "host": host_name(),
                "machine": socket.gethostname(), "sampler_pid": os.getpid(), "node_dir": str(self.node_dir),
                "shared": self.shared, "start_s": round(self.start_s, 4),
                "host_sampling": self.sampler.active}

    def pull(self) -> dict[str, Any]:
        """{"files": {name: (offset or None for whole, bytes)}, "unreached": [...]} since the last pull."""
        return {"files": {} if self.shared else self._changes(), "unreached": self._unreached()}

    def stop(self) -> dict[str, Any]:
        """The last pull, once the job's recorders on this node flushed what they hold (every FLUSH_S)."""
        self._end_live_workers()
        self.sampler.stop()
        if self.metrics is not None:
            self.metrics.stop()
        time.sleep(FLUSH_S)
        return self.pull()

    def vanished(self) -> list[int]:
        """Pids of the job's recorded workers on this node that are gone without an end: killed."""
        return [int(meta["pid"]) for meta in self._job_metas() if not meta.get("end_time") and not alive(int(meta["pid"]))]

    def _job_metas(self) -> list[dict[str, Any]]:
        found = []
        for path in self.node_dir.glob(f"{host_name()}-*{PROCESS_META_SUFFIX}"):
            try:
                meta = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(meta, dict) and meta.get("ray_job_id") == self.job_id and isinstance(meta.get("pid"), int):
                found.append({**meta, "_path": str(path)})
        return found

    def _end_live_workers(self) -> None:
        """The job's recorded workers on this node still running when the driver finishes: Ray ends them
        right after (SIGKILL when the driver's own local cluster shuts down), past the last pull and
        before their recorder can write its end. Their metas get the job's end, said so
        (`end_time_source`): a host sampler then sees an end, not a death. Dead ones are left as they are."""
        now = time.time()
        for meta in self._job_metas():
            path = Path(meta.pop("_path"))
            if not meta.get("end_time") and alive(meta["pid"]):
                try:  # the worker may be writing its own end right now: each write is whole, the last one stays
                    write_json(path, {**meta, "end_time": now, "end_time_source": "ray_job_end"})
                except OSError:
                    continue

    def record_ray_kills(self, kills: list[dict[str, Any]]) -> None:
        """Workers of this node that Ray's memory monitor killed (driver.py asks Ray's state API): one
        `oom` event each, cause `ray_oom_kill`, beside the vanishing the host sampler may have seen."""
        writer = EventWriter(self.node_dir, self.sampler.stem)
        try:
            for kill in kills:
                writer.write(names.OOM, "killed", {"process_pid": kill["pid"], "cause": RAY_OOM_KILL,
                                                   "detected_by": "ray", **kill.get("attrs", {})}, t=kill["t"])
        finally:
            writer.close()

    def _changes(self) -> dict[str, tuple[int | None, bytes]]:
        out: dict[str, tuple[int | None, bytes]] = {}
        try:
            paths = [p for p in self.node_dir.iterdir() if p.is_file()]
        except OSError:
            return out
        for path in paths:
            name = path.name
            if name == RUN_META or name.endswith(HOST_LOCK_SUFFIX):
                continue
            try:
                stat = path.stat()
                signature = (stat.st_size, stat.st_mtime_ns)
                if self._sent.get(name) == signature:
                    continue
                if name.endswith(APPENDED):
                    offset = self._offsets.get(name, 0)
                    with open(path, "rb") as handle:
                        handle.seek(offset)
                        data = handle.read()
                    data = data[: data.rfind(b"\n") + 1]  # a line being written waits for the next pull
                    self._offsets[name] = offset + len(data)
                    if data:
                        out[name] = (offset, data)
                else:
                    out[name] = (None, path.read_bytes())
                self._sent[name] = signature
            except OSError:
                continue
        return out

    def _unreached(self) -> list[dict[str, Any]]:
        """This job's worker processes on this node whose environment lacks the run directory (an actor's
        runtime env that replaced it): whatever phases they tag are not recorded.

        A job id alone does not make a worker ours: each cluster counts its jobs from 1, so another cluster
        on this machine (another user's, or a second node's raylet here) runs workers with the same
        RAY_JOB_ID. A worker is this job's on this node when its raylet (RAY_RAYLET_PID, set by the raylet
        that started it) is ours too."""
        found = []
        mine = [f"{RAY_JOB_ID_ENV}={self.job_id}".encode()]
        if self.raylet_pid:  # set by every Ray we know; without it, the job id alone (as before)
            mine.append(f"{RAY_RAYLET_PID_ENV}={self.raylet_pid}".encode())
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if not all(item in environ for item in mine):
                continue
            prefix = f"{names.RUN_DIR_ENV}=".encode()
            if any(item.startswith(prefix) and len(item) > len(prefix) for item in environ):
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                argv = [b"?"]
            if any(arg.endswith(RAY_WORKER_LAUNCHER) for arg in argv):
                continue  # a worker being started: it sets the runtime env's variables, then execs the worker
            found.append({"pid": int(entry), "title": argv[0].decode(errors="replace")})
        return found


def _serve_metrics(node_dir: Path):
    """This node's /metrics when `record --metrics-port` asked for one (docs/prometheus.md); the port in use
    (the head node, where record serves it) or prometheus-client missing is one warning there, never an error."""
    if not os.environ.get(names.METRICS_PORT_ENV):
        return None
    from miles_profile.metrics.server import serve_from_env  # only when a port was asked for
    return serve_from_env(node_dir)


def _holds_token(run_dir: Path, token: str) -> bool:
    """Whether this node sees the driver's own run directory (a shared file system): its cluster file
    carries the token the driver wrote."""
    from miles_profile.logdir.cluster import read_cluster
    return (read_cluster(run_dir) or {}).get("token") == token


def start_on(node_id: str, run_dir: str, token: str):
    """The sampler actor of one node: pinned there (hard affinity), no CPU taken from the job."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    actor = ray.remote(num_cpus=0, max_restarts=0)(NodeSampler)
    return actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                         name=None).remote(run_dir, token)
