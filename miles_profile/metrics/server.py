"""Serve one host's metrics on http://<host>:PORT/metrics while a run is recorded.

`serve()` is what `record --metrics-port` calls, and what a per-node host sampler elsewhere (the Ray
path) calls for its node. The endpoint is the standard library's threading HTTP server answering
OpenMetrics 1.0 to a scraper that asks for it (Prometheus does) and Prometheus text 0.0.4 otherwise,
rendered by exposition.py: nothing beyond the recorder's own dependencies is needed.
"""
from __future__ import annotations

import http.server
import logging
import os
import socket
import socketserver
import threading

from miles_profile import names
from miles_profile.identity import host_name
from miles_profile.metrics.exposition import OPENMETRICS_TYPE, TEXT_TYPE, render
from miles_profile.metrics.host_state import HostState
from miles_profile.metrics.readings import HostReading

log = logging.getLogger("miles_profile")

# `record --metrics-port` hands its port to the job's processes here, so that a per-node sampler the job
# starts on another host (Ray's node actor) serves that node on the same port: `serve_from_env`.
METRICS_PORT_ENV = names.METRICS_PORT_ENV
# A connection that sends half a request holds one thread this long at most (each has its own thread:
# it never delays another scrape).
_REQUEST_TIMEOUT_S = 30


class MetricsServer:
    """A running endpoint; `stop()` closes it (idempotent). `port` is the one bound (0 asks for any)."""

    def __init__(self, server: http.server.ThreadingHTTPServer, thread: threading.Thread, state: HostState):
        self._server, self._thread, self.state = server, thread, state
        self.port: int = server.server_address[1]

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()      # ends serve_forever; a scrape in flight finishes in its own thread
            server.server_close()
            self._thread.join(timeout=5)
            self.state.close()


def scrape(state: HostState, openmetrics: bool) -> bytes:
    """One scrape's body: the host's state read now (never between scrapes), rendered. A failed read
    must not touch the job: one line, and an exposition with no process in it."""
    try:
        reading = state.read()
    except Exception as exc:  # noqa: BLE001 - whatever the files hold, the endpoint answers
        log.warning("miles_profile: metrics scrape failed: %s", exc)
        reading = HostReading(hostname=state.host.lower())
    return render(reading, openmetrics)


def _wants_openmetrics(accept: str) -> bool:
    return any(part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(","))


class _Handler(http.server.BaseHTTPRequestHandler):
    state: HostState  # set on the subclass that serve() makes
    timeout = _REQUEST_TIMEOUT_S

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] == "/favicon.ico":
            self.send_error(404)
            return
        openmetrics = _wants_openmetrics(self.headers.get("Accept", ""))
        body = scrape(self.state, openmetrics)
        self.send_response(200)
        self.send_header("Content-Type", OPENMETRICS_TYPE if openmetrics else TEXT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        pass  # a line per scrape would fill the job's stderr


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a scraper that never reads holds its own thread, never stop()

    def server_bind(self) -> None:
        # HTTPServer's own asks DNS for the address's name (getfqdn): seconds on a host whose DNS is slow.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def handle_error(self, request, client_address) -> None:
        pass  # a scraper that hung up mid-answer: its problem, never a traceback in the job's output


def serve(run_dir: str | os.PathLike, port: int, addr: str = "0.0.0.0", hostname: str | None = None) -> MetricsServer | None:
    """Serve the metrics of `hostname` (default: this host) of the run in `run_dir` on `addr:port`.
    None, with one log line, when the port can't be bound: the job goes on recorded, unscraped."""
    state = HostState(run_dir, hostname or host_name())
    handler = type("Handler", (_Handler,), {"state": state})
    server_class = type("Server", (_Server,), {"address_family": socket.AF_INET6 if ":" in addr else socket.AF_INET})
    try:
        server = server_class((addr, port), handler)
    except OSError as exc:
        log.warning("miles_profile: warning: metrics not served on port %d: %s", port, exc.strerror or exc)
        return None
    thread = threading.Thread(target=server.serve_forever, name="miles_profile-metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread, state)


def serve_from_env(run_dir: str | os.PathLike, hostname: str | None = None) -> MetricsServer | None:
    """The endpoint of a per-node sampler started inside a job that `record --metrics-port` runs (the
    port in $MILES_PROFILE_METRICS_PORT), serving `run_dir` (its node's run directory); None, silently,
    when no port was asked for."""
    text = os.environ.get(METRICS_PORT_ENV, "")
    return serve(run_dir, int(text), hostname=hostname) if text.isdigit() else None
