"""The Dash app: one page, a run list on the left, the chosen run's timeline and panels on the right.

Every panel is a module under `dashboards/panels/` with a `layout()` and a `register(app, state)`.
The figures, the per-phase table and the checks come from `miles_profile.report` through
`dashboards/report_bridge.py`; nothing here draws or computes a memory statistic of its own.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import dash
from dash import dcc, html
from flask import request
from werkzeug.exceptions import HTTPException

from dashboards import plotly_js
from dashboards.hosts import HostPolicy
from dashboards.live_run import RunCache
from dashboards.panels import (
    checks, compare, fleet, ledger, miles_series, phases, runs, stacks, summary, timeline, transitions,
)
from dashboards.paths import LogRoot
from dashboards.runs import list_runs
from dashboards.verdicts import verdict_of
from miles_profile.logdir.layout import SAMPLES_SUFFIX

log = logging.getLogger("dashboards")


@dataclass
class State:
    """What callbacks share: the log root (the only source of paths) and the loaded runs."""
    root: LogRoot
    cache: RunCache
    poll_ms: int
    phases: str | None = None  # --phase (miles_profile.phase_select); None: each run's recorded default


def create_app(log_dir: str | Path, poll_ms: int = 1000, preload: bool = True,
               hosts: HostPolicy = HostPolicy(), phase_selection: str | None = None) -> dash.Dash:
    """`hosts`: which Host headers are answered (loopback names by default; see dashboards/hosts.py).
    `phase_selection`: the phases shown and judged (--phase, as visualize's)."""
    state = State(root=(root := LogRoot(log_dir)), cache=RunCache(root), poll_ms=poll_ms,
                  phases=phase_selection)
    plotly_path = plotly_js.route()  # the cartesian build as window.Plotly: a third of the bundle Dash loads
    app = dash.Dash(__name__, title="miles-profile", update_title=None,
                    assets_folder=str(Path(__file__).with_name("assets")),
                    external_scripts=[plotly_path] if plotly_path else [],
                    suppress_callback_exceptions=True, on_error=_on_error)
    if plotly_path:
        plotly_js.serve(app, plotly_path)
    app.layout = html.Div(className="page", children=[
        dcc.Interval(id="page-poll", interval=poll_ms),
        html.Header(className="page-header", children=[
            html.Span("miles-profile", className="page-title"),
            html.Span(f"runs under {root.path}", className="page-root"),
        ]),
        html.Div(className="page-body", children=[
            html.Aside(className="page-side", children=[runs.layout(), compare.picker_layout()]),
            html.Main(className="page-main", children=[
                summary.layout(),  # first: the verdict, the peak, the offloads, the failing checks
                fleet.layout(),
                timeline.layout(),
                miles_series.layout(),  # a Miles dump's utilization and SGLang series, under its memory
                html.Div(className="page-panels", children=[checks.layout(), phases.layout()]),
                ledger.layout(),
                transitions.layout(),
                stacks.layout(),  # record --stacks: which code made the peak (empty without stacks)
                compare.layout(),
            ]),
        ]),
    ])
    for panel in (runs, summary, fleet, timeline, miles_series, checks, phases, ledger, transitions, stacks, compare):
        panel.register(app, state)
    app.server.register_error_handler(Exception, _refuse_request)
    app.server.before_request(lambda: _refuse_foreign_host(hosts))
    if preload:
        threading.Thread(target=preload_default_run, args=(state,), name="dashboards-preload", daemon=True).start()
    return app


def preload_default_run(state: State) -> None:
    """Read the run the page opens on, and compute its figure, checks and table, before anyone asks:
    a 10-million-sample run takes seconds to read and reduce, a first paint from memory does not.
    A fleet's first screen (heatmap, outliers) first, from its first look (no samples): reading every
    process's samples takes minutes at 1,024 processes, and the page shows the first look meanwhile."""
    run_id = runs.default_run(list_runs(state.root))
    if run_id is None:
        return
    started = time.perf_counter()
    try:
        if state.cache.loaded(run_id) is None and _many_processes(state.root.resolve(run_id)):
            with state.cache.holding(run_id):
                first = state.cache.first_look(run_id)
                view = first.memo("fleet", fleet.compute)  # the GPU index a click needs: on demand
            if view is not None:
                log.info("first screen of %s ready in %.1f s (%s processes)", run_id, time.perf_counter() - started,
                         f"{len(first.current.processes):,}")
        live_run = state.cache.get(run_id)
        fleet.preload(live_run)  # first: a fleet run's page opens on it
        if fleet.one_lane_each(live_run.current):  # else the fleet view replaces the run-wide timeline
            live_run.memo("timeline-full", lambda run: timeline.build_figure(run, run_id, None, state.phases))
        verdict_of(live_run, state.phases)  # the one verdict: the summary and checks panels render it
        live_run.memo("phases-False", lambda run: phases.compute(run, False, state.phases))
    except Exception as exc:  # noqa: BLE001 - the page shows the error when it asks for the run
        log.warning("preloading %s failed: %s: %s", run_id, exc.__class__.__name__, exc)
        return
    log.info("preloaded %s (%s samples) in %.1f s", run_id, f"{len(live_run.current.samples):,}",
             time.perf_counter() - started)


def _many_processes(run_dir: Path) -> bool:
    """More processes than the run-wide timeline draws one by one: a fleet, whose samples take long to read."""
    return sum(1 for _ in run_dir.glob(f"*{SAMPLES_SUFFIX}")) > 2 * fleet.ONE_LANE_EACH


def _refuse_request(exc: Exception):
    """A request Dash could not handle (a malformed callback body, a bad resource path): 400 and one log line."""
    if isinstance(exc, HTTPException):
        return exc
    log.warning("refused %s %s: %s", request.method, request.path[:200], exc.__class__.__name__)
    return "bad request\n", 400


def _refuse_foreign_host(hosts: HostPolicy):
    """Every request, pages and callbacks alike: a Host the dashboard was not started for gets 403."""
    host = request.headers.get("Host")
    if hosts.allows(host):
        return None
    if len(_refused) < 100 and host not in _refused:  # one line per name: a page polling us can't flood the log
        _refused.add(host)
        log.warning("refused a request for Host %r (DNS rebinding?); start with --host NAME to serve NAME",
                    (host or "")[:100])
    return "forbidden host\n", 403


_refused: set[str | None] = set()


def _on_error(exc: Exception) -> None:
    """Last resort for an error a panel did not turn into a message: one log line, never a traceback."""
    log.warning("callback failed: %s: %s", exc.__class__.__name__, exc)
