"""A real two-node Ray cluster on this machine for tests and benchmarks, stopped by its own pids.

Never `ray stop`: it ends every Ray process of the machine, other people's clusters included. Each node
gets its own --temp-dir (short: Ray's unix sockets live under it), its own ports and a custom resource
(`head`, `node2`) that a job uses to place an actor on it.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
# Ray's command line, also where ray was unpacked without its `ray` script (scripts/ray_gpu.sh on the GPU machine)
RAY_CLI = [RAY] if Path(RAY).is_file() else [sys.executable, "-c",
                                               "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Cluster:
    address: str
    dashboard: str
    temp_dirs: list[Path]
    env: dict[str, str]
    node_env: list[dict[str, str]] = field(default_factory=list)

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: the daemons (their command lines name our temp dirs, or, for the
        head's Ray Client server, which `ray start` leaves an orphan naming neither, our GCS port) and all
        their descendants (workers rename themselves `ray::...`)."""
        marks = [str(d) for d in self.temp_dirs]
        our_gcs = re.compile(rf"--(?:gcs-)?address=\S*:{self.address.rsplit(':', 1)[1]}(?!\d)")
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or ())
            if any(mark in cmdline for mark in marks) or our_gcs.search(cmdline):
                found[proc.pid] = proc
                try:
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
                except psutil.Error:
                    pass
        return list(found.values())

    def node_processes(self, index: int) -> list[psutil.Process]:
        mark = str(self.temp_dirs[index])
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            if mark in " ".join(proc.info["cmdline"] or ()):
                found[proc.pid] = proc
                try:
                    found.update({c.pid: c for c in proc.children(recursive=True)})
                except psutil.Error:
                    pass
        return list(found.values())

    def cpu_s(self) -> float:
        """CPU seconds its processes have used so far (the daemons are not our children: pytest's own
        accounting misses them)."""
        total = 0.0
        for proc in self.processes():
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total

    def stop(self) -> None:
        kill(self.processes())
        for folder in self.temp_dirs:
            shutil.rmtree(folder, ignore_errors=True)


def kill(procs: list[psutil.Process], grace_s: float = 3.0) -> None:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def _start(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([*RAY_CLI, "start", *args], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"ray start failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")


def node_args(temp_dir: Path, resources: str, num_cpus: int) -> list[str]:
    return [f"--temp-dir={temp_dir}", f"--resources={resources}", f"--num-cpus={num_cpus}",
            "--node-ip-address=127.0.0.1", f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}", "--disable-usage-stats"]


def start_cluster(env: dict[str, str], node2_env: dict[str, str] | None = None, num_cpus: int = 2) -> Cluster:
    """`ray start --head` and a second node (`ray start --address`) with `node2_env` added to its
    environment (what every worker of that node inherits), each with its own temp dir."""
    temp_dirs = [Path(tempfile.mkdtemp(prefix="rh")), Path(tempfile.mkdtemp(prefix="rn"))]
    # A HOME of its own: Ray reads ~/.ray (an auth token someone generated on this machine made the
    # second node's `ray start` fail to authenticate with the head)
    env = dict(env, RAY_USAGE_STATS_ENABLED="0", HOME=str(temp_dirs[0]))
    port, dashboard_port = free_port(), free_port()
    cluster = Cluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}", temp_dirs, env)
    try:
        _start(["--head", f"--port={port}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
                f"--ray-client-server-port={free_port()}", *node_args(temp_dirs[0], '{"head": 1}', num_cpus)], env)
        _start([f"--address={cluster.address}", *node_args(temp_dirs[1], '{"node2": 1}', num_cpus)],
               dict(env, **(node2_env or {})))
        wait_nodes(cluster, 2)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def add_node(cluster: Cluster, resources: str, env: dict[str, str], num_cpus: int = 1) -> Path:
    """One more node (`ray start --address`) with `env` added; stopped with the cluster. Its temp dir."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rx"))
    cluster.temp_dirs.append(temp_dir)
    _start([f"--address={cluster.address}", *node_args(temp_dir, resources, num_cpus)], dict(cluster.env, **env))
    wait_nodes(cluster, len(cluster.temp_dirs))
    return temp_dir


def wait_nodes(cluster: Cluster, count: int, timeout_s: float = 60.0) -> None:
    """Until the cluster has `count` alive nodes (a node's raylet registers a moment after `ray start`)."""
    probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR');"
             "print(sum(1 for n in ray.nodes() if n['Alive']))")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = subprocess.run([sys.executable, "-c", probe, cluster.address], env=cluster.env,
                              capture_output=True, text=True, timeout=60)
        if done.stdout.strip().isdigit() and int(done.stdout.strip()) >= count:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the cluster at {cluster.address} did not reach {count} nodes")


if __name__ == "__main__":  # a cluster by hand: python tests/ray_cluster.py, Enter stops it
    c = start_cluster(dict(os.environ))
    print(c.address, c.dashboard, [p.pid for p in c.processes()])
    try:
        input()
    finally:
        c.stop()
