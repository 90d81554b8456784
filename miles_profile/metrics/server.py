"""Serve one host's metrics on http://<host>:PORT/metrics while a run is recorded.

`serve()` is what `record --metrics-port` calls, and what a per-node host sampler elsewhere (the Ray
path) calls for its node. prometheus_client is imported here only, when a port is asked for: the
recorder runs on GPU hosts without it, and then says so in one line and records as before.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from miles_profile import names
from miles_profile.identity import host_name
from miles_profile.metrics.host_state import HostState

log = logging.getLogger("miles_profile")

# `record --metrics-port` hands its port to the job's processes here, so that a per-node sampler the job
# starts on another host (Ray's node actor) serves that node on the same port: `serve_from_env`.
METRICS_PORT_ENV = names.METRICS_PORT_ENV


class MetricsServer:
    """A running endpoint; `stop()` closes it (idempotent). `port` is the one bound (0 asks for any)."""

    def __init__(self, server: Any, thread: threading.Thread, state: HostState):
        self._server, self._thread, self.state = server, thread, state
        self.port: int = server.server_address[1]

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()      # ends serve_forever; a scrape in flight finishes in its own thread
            server.server_close()
            self._thread.join(timeout=5)


def collector(state: HostState):
    """A prometheus_client collector that reads the host's state at scrape time, never in between."""
    from miles_profile.metrics.families import families

    class _Collector:
        def collect(self):
            try:
                reading = state.read()
            except Exception as exc:  # noqa: BLE001 - a broken scrape must not touch the job: serve nothing
                log.warning("miles_profile: metrics scrape failed: %s", exc)
                return
            yield from families(reading)

    return _Collector()


def serve(run_dir: str | os.PathLike, port: int, addr: str = "0.0.0.0", hostname: str | None = None) -> MetricsServer | None:
    """Serve the metrics of `hostname` (default: this host) of the run in `run_dir` on `addr:port`.
    None, with one log line, when prometheus_client is missing or the port can't be bound: the job
    goes on recorded, unscraped."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        log.warning("miles_profile: warning: --metrics-port ignored: prometheus_client is not installed "
                    "(pip install prometheus-client)")
        return None
    state = HostState(run_dir, hostname or host_name())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector(state))
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        log.warning("miles_profile: warning: metrics not served on port %d: %s", port, exc.strerror or exc)
        return None
    return MetricsServer(server, thread, state)


def serve_from_env(run_dir: str | os.PathLike, hostname: str | None = None) -> MetricsServer | None:
    """The endpoint of a per-node sampler started inside a job that `record --metrics-port` runs (the
    port in $MILES_PROFILE_METRICS_PORT), serving `run_dir` (its node's run directory); None, silently,
    when no port was asked for."""
    text = os.environ.get(METRICS_PORT_ENV, "")
    return serve(run_dir, int(text), hostname=hostname) if text.isdigit() else None
