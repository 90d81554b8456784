"""Serve one host's metrics on http://<host>:PORT/metrics while a run is recorded.

`serve()` is what `record --metrics-port` calls, and what a per-node host sampler elsewhere (the Ray
path) calls for its node. prometheus_client renders and serves the exposition: a custom collector
(families.py) reads the host's state at scrape time (what the follower, started by the first scrape,
left unread: host_state.py), and its WSGI app answers OpenMetrics or Prometheus text 0.0.4, whichever the
scraper asks for: with the bytes the follower rendered ahead in that format after its last pass when they
are still the answer, else rendered by the scrape. It is imported here only, when a port is asked for:
the recorder runs on GPU hosts without it, and then says so in one line and records as before.
"""
from __future__ import annotations

import collections
import logging
import os
import socketserver
import threading
from typing import Any

from miles_profile import names
from miles_profile.identity import host_name
from miles_profile.metrics.host_state import COLLECT_INTERVAL_S, IDLE_STOP_S, HostState
from miles_profile.metrics.readings import HostReading

log = logging.getLogger("miles_profile")

# `record --metrics-port` hands its port to the job's processes here, so that a per-node sampler the job
# starts on another host (Ray's node actor) serves that node on the same port: `serve_from_env`.
METRICS_PORT_ENV = names.METRICS_PORT_ENV
# A connection that sends half a request holds one thread this long at most (each has its own thread:
# it never delays another scrape).
_REQUEST_TIMEOUT_S = 30
# prometheus_client's names of the escaping schemes (openmetrics.exposition's UNDERSCORES and ALLOWUTF8),
# spelled here so that this module imports without it.
UNDERSCORES, ALLOW_UTF8 = "underscores", "allow-utf-8"
# The follower renders ahead the formats the latest this many scrapes asked for: Prometheus' OpenMetrics
# always, a `curl`'s text 0.0.4 for the next few scrapes after it, then no more.
ASKED_SCRAPES = 4


class MetricsServer:
    """A running endpoint; `stop()` closes it and stops its follower, joined (idempotent). `port` is the
    one bound (0 asks for any)."""

    def __init__(self, server: Any, thread: threading.Thread, state: HostState):
        self._server, self._thread, self.state = server, thread, state
        self.port: int = server.server_address[1]

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()      # ends serve_forever; a scrape in flight finishes in its own thread
            server.server_close()
            self._thread.join(timeout=5)
            self.state.close()


def _scrape(state: HostState, content_type: str | None) -> bytes | HostReading:
    try:
        return state.scrape(content_type)
    except Exception as exc:  # noqa: BLE001 - whatever the files hold, the endpoint answers
        log.warning("miles_profile: metrics scrape failed: %s", exc)
        return HostReading(hostname=state.host.lower())


class _Families:
    """A registry of one reading's families, built once (prometheus_client's encoders and FamilyCache
    only call collect())."""

    def __init__(self, reading: HostReading):
        from miles_profile.metrics.families import families
        self._families = list(families(reading))

    def collect(self) -> list:
        return self._families


def collector(state: HostState):
    """A prometheus_client collector that reads the host's state at scrape time (the first one starts
    the state's follower, which reads the files between scrapes)."""

    class _Collector:
        def collect(self):
            reading = _scrape(state, None)
            assert isinstance(reading, HostReading)
            return _Families(reading).collect()

    return _Collector()


def _openmetrics_unescaped(accept: str) -> str | None:
    """`accept` with the OpenMetrics entry prometheus_client answers (its first one with a version of
    1.0.0 or later) asking for `allow-utf-8` escaping instead of `underscores` (Prometheus 2.x names no
    scheme, which means `underscores`); None when that entry asks for another scheme, or there is none."""
    from prometheus_client.utils import parse_version

    entries = accept.split(",")
    for i, entry in enumerate(entries):
        media, *params = (p.strip() for p in entry.split(";"))
        if media != "application/openmetrics-text":
            continue
        version = next((p.split("=", 1)[1] for p in params if p.startswith("version=")), "")
        if not version:
            return None  # answered with underscores whatever it asks (choose_encoder)
        try:
            if parse_version(version) < (1, 0, 0):
                continue  # passed over by choose_encoder
        except TypeError:  # "version=x": prometheus_client's to answer
            return None
        escaping = [p for p in params if p.startswith("escaping=")]
        if escaping not in ([], [f"escaping={UNDERSCORES}"]):
            return None  # a scheme that changes legal names too (dots, values), or allow-utf-8 already
        entries[i] = ";".join([media, *(p for p in params if not p.startswith("escaping=")), f"escaping={ALLOW_UTF8}"])
        return ",".join(entries)
    return None


def metrics_app(registry, state: HostState | None = None):
    """The endpoint's WSGI app over `registry`: prometheus_client's encoders and content negotiation,
    with savings that change no byte of the answer (docs/prometheus.md, Cost).

    - Prometheus 2.x asks for OpenMetrics naming no escaping scheme, i.e. `underscores`, and
      prometheus_client then writes each sample's name through a character-by-character walk that
      replaces what is illegal: two thirds of its encoder. Every metric and label name of families.py is
      legal (and has no colon, which `underscores` replaces in a sample's name), so its `allow-utf-8`
      encoder, which checks a name with one regular expression instead, writes the very same bytes; the
      answer's Content-Type is put back to the `underscores` the scraper asked for.
    - A family whose samples did not change since the previous scrape is answered with the bytes
      prometheus_client's encoder gave it then; a sample whose value alone moved keeps its line's
      prefix as that encoder wrote it, the value after it through prometheus_client's floatToGoString
      (family_cache.py).
    - With `state` (the host `registry`'s collector reads), a scrape is answered from `state.scrape()`:
      the bytes its follower rendered ahead in the scrape's format (`render_ahead`, set here: the formats
      the latest ASKED_SCRAPES scrapes asked for, through the same cache) when nothing was read or taken
      since, else its reading rendered here.

    Anything but a plain GET of the exposition (OPTIONS, another method, a `name[]` filter) is
    prometheus_client's own app's to answer. tests/unit/test_metrics_exposition.py holds status, headers
    and bytes equal to that app's, scrape after scrape."""
    from urllib.parse import parse_qs

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import choose_encoder

    from miles_profile.metrics.family_cache import FamilyCache

    # Not gzipped even when the scraper accepts it (Prometheus does): 3 to 5 ms of CPU a scrape of 64
    # processes, to save bytes on the network between the host and Prometheus (docs/prometheus.md).
    theirs = make_wsgi_app(registry, disable_compression=True)
    cache = FamilyCache()
    formats: collections.deque = collections.deque(maxlen=ASKED_SCRAPES)  # (content type, encoder) a scrape

    def render_ahead(reading: HostReading) -> dict[str, bytes]:
        built = _Families(reading)
        return {content_type: cache.encode(built, encoder, content_type)
                for content_type, encoder in dict(list(formats)).items()}

    if state is not None:
        state.render_ahead = render_ahead

    def app(environ, start_response):
        if (environ.get("REQUEST_METHOD") != "GET" or environ.get("PATH_INFO") == "/favicon.ico"
                or "name[]" in parse_qs(environ.get("QUERY_STRING", ""))):
            return theirs(environ, start_response)
        asked = environ.get("HTTP_ACCEPT") or ""
        unescaped = _openmetrics_unescaped(asked)
        encoder, content_type = choose_encoder(unescaped or asked)
        if state is None:
            body = cache.encode(registry, encoder, content_type)
        else:
            formats.append((content_type, encoder))
            answer = _scrape(state, content_type)
            body = answer if isinstance(answer, bytes) else cache.encode(_Families(answer), encoder, content_type)
        if unescaped is not None:
            content_type = content_type.replace(f"escaping={ALLOW_UTF8}", f"escaping={UNDERSCORES}")
        start_response("200 OK", [("Content-Type", content_type)])
        return [body]

    return app


def _http_server(addr: str, port: int, app):
    """prometheus_client's threading WSGI server (a thread per scrape, daemon threads: a scraper that
    never reads holds its own thread, never `stop()`), without a DNS look-up at bind, a log line per
    scrape or a traceback for a scraper that hung up."""
    import socket
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer

    class Handler(WSGIRequestHandler):
        timeout = _REQUEST_TIMEOUT_S

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
            pass  # a line per scrape would fill the job's stderr

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

        def server_bind(self) -> None:
            # HTTPServer's own asks DNS for the address's name (getfqdn): seconds on a host whose DNS is slow.
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
            self.setup_environ()

        def handle_error(self, request, client_address) -> None:
            pass  # a scraper that hung up mid-answer: its problem, never a traceback in the job's output

    return make_server(addr, port, app, Server, handler_class=Handler)


def serve(run_dir: str | os.PathLike, port: int, addr: str = "0.0.0.0", hostname: str | None = None,
          collect_interval_s: float | None = COLLECT_INTERVAL_S,
          idle_stop_s: float = IDLE_STOP_S, render_ahead: bool = True) -> MetricsServer | None:
    """Serve the metrics of `hostname` (default: this host) of the run in `run_dir` on `addr:port`.
    None, with one log line, when prometheus_client is missing or the port can't be bound: the job
    goes on recorded, unscraped. `collect_interval_s` and `idle_stop_s`: the follower's (HostState);
    `render_ahead` False: every scrape renders its answer itself (the follower only reads)."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        log.warning("miles_profile: warning: --metrics-port ignored: prometheus_client is not installed "
                    "(pip install prometheus-client)")
        return None
    state = HostState(run_dir, hostname or host_name(), collect_interval_s, idle_stop_s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector(state))
    try:
        server = _http_server(addr, port, metrics_app(registry, state if render_ahead else None))
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
