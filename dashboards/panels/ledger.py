"""Ledger panel: where the bytes are at each phase's peak and end, per GPU and per process's RSS (the report's
stacked area and stacked bars, report/ledger_figures.py), and whether the categories add up. Past
LEDGER_MAX_PROCESSES processes (a fleet) it draws, on a button, the GPU opened in the fleet panel."""
from __future__ import annotations

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboards.messages import message, problem
from dashboards.panels.fleet import compute as fleet_compute
from dashboards.panels.refresh import due
from miles_profile.importers.miles_dashboard import SOURCE
from miles_profile.report.figures import run_start, time_range
from miles_profile.report.ledger_figures import ledger_area_figure, ledger_bar_figure
from miles_profile.report.ledger_html import add_up_text, peak_text, unsplit_reason
from miles_profile.runmodel.ledger import LEDGER_MAX_PROCESSES, fleet_ledger, ledger
from miles_profile.runmodel.ledger_sampling import sampled_iterations, sampled_text
from miles_profile.runmodel.process_view import is_fleet

_EMPTY = {"data": [], "layout": {}}
_HIDDEN, _SHOWN = {"display": "none"}, {}


def layout() -> html.Section:
    return html.Section(id="ledger-section", className="panel ledger", children=[
        html.Div(className="panel-head", children=[
            html.H2("Where the bytes are"),
            dcc.RadioItems(id="ledger-view", className="phases-grouping", inline=True, value="bars",
                           options=[{"label": "per phase", "value": "bars"},
                                    {"label": "over time", "value": "area"}]),
        ]),
        # A fleet's ledger is drawn per GPU on request: computed at every GPU opened, it took the CPU
        # from the next click's timeline (1.16 s instead of 0.2 s in bench/bench_dashboard_fleet.py).
        html.Button("Draw the ledger of the GPU opened in the fleet view", id="ledger-draw", n_clicks=0,
                    style=_HIDDEN),
        html.P(id="ledger-add-up", className="ledger-add-up"),
        dcc.Graph(id="ledger-graph", figure=_EMPTY, config={"displaylogo": False}),
        dcc.Store(id="ledger-rendered"),
        dcc.Store(id="ledger-request"),  # the GPU whose ledger was asked for: kept, so no poll loses it
    ])


def compute(run, processes=None):
    """The run's ledger frame and the figures of it (per phase, not per sample); with `processes`
    ((host, pid) of one fleet lane), the ledger of that lane's GPU."""
    chosen = sampled_iterations(run)  # a loop with a phase per step: some iterations, as in the report
    frame = (ledger(run, peaks=True, iterations=chosen) if processes is None
             else fleet_ledger(run, processes, peaks=True, iterations=chosen))
    # the timeline's seconds: the same origin and range as the timeline panel's x axis
    area = ledger_area_figure(frame, run_start(run), x_range=time_range(run))
    # one line each: separate findings, not one run-on
    lines = [t for t in (sampled_text(frame), peak_text(frame), add_up_text(frame)) if t]
    text = [part for k, line in enumerate(lines) for part in ([html.Br()] if k else []) + [line]]
    return frame, ledger_bar_figure(frame), area, text


def _no_rows(run) -> str:
    """Why the ledger has no rows: it is taken at phase ends and peaks."""
    if run.phases.empty and run.meta.get("source") == SOURCE:
        return ("This Miles dump has no phase events, so the ledger (bytes by category at each phase's peak "
                "and end) has no rows.")
    return "No phase has ended yet."


def _lane_processes(live_run, lane: str) -> set[tuple[str, int]]:
    view = live_run.memo("fleet", fleet_compute)
    rows = view.table[view.table["lane"] == lane] if view is not None else None
    if rows is None or rows.empty:
        raise PreventUpdate
    return {(str(h), int(p)) for h, p in zip(rows["host"], rows["pid"])}


def register(app, state) -> None:
    @app.callback(Output("ledger-request", "data"), Input("ledger-draw", "n_clicks"),
                  State("fleet-gpu-lane", "data"), prevent_initial_call=True)
    def request_ledger(_clicks, opened):
        if not isinstance(opened, dict):
            raise PreventUpdate
        return opened

    @app.callback(
        Output("ledger-graph", "figure"), Output("ledger-add-up", "children"), Output("ledger-rendered", "data"),
        Output("ledger-draw", "style"), Output("ledger-graph", "style"),
        Input("runs-selected", "data"), Input("page-poll", "n_intervals"), Input("ledger-view", "value"),
        Input("ledger-request", "data"), State("ledger-rendered", "data"))
    def show_ledger(run_id, _tick, view, requested, rendered):
        figure, text, key, button = _ledger_view(run_id, view, requested, rendered)
        return figure, text, key, button, _HIDDEN if figure is _EMPTY else _SHOWN  # no empty axes under a message

    def _ledger_view(run_id, view, requested, rendered):
        if run_id is None:
            return _EMPTY, None, None, _HIDDEN
        try:
            live_run = state.cache.for_page(run_id)
            # per GPU only where the fleet panel shows: 5,000 processes with no phases or GPU are no fleet
            fleet = len(live_run.current.processes) > LEDGER_MAX_PROCESSES and is_fleet(live_run.current)
            asked = isinstance(requested, dict) and requested.get("run") == run_id
            lane = requested.get("lane") if fleet and asked else None
            key = due(f"{run_id}\n{view}\n{lane}", live_run.version, rendered)
            if key is None:
                raise PreventUpdate
            button = _SHOWN if fleet else _HIDDEN
            if not fleet:
                frame, bars, area, text = live_run.memo("ledger", compute)
            elif lane is None:
                return _EMPTY, message(f"Past {LEDGER_MAX_PROCESSES} processes the ledger is drawn per GPU: open one "
                                       "in the fleet view (a cell or an outlier), then draw its ledger.",
                                       "info"), key, button
            else:
                processes = _lane_processes(live_run, lane)
                frame, bars, area, text = live_run.memo(f"ledger\n{lane}", lambda run: compute(run, processes))
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return _EMPTY, problem(exc), None, _HIDDEN
        if frame.empty:
            return _EMPTY, message(_no_rows(live_run.current), "info"), key, button
        if unsplit_reason(frame):  # one category: say why rather than draw it
            return _EMPTY, message(unsplit_reason(frame), "info"), key, button
        return (area if view == "area" else bars), text, key, button
