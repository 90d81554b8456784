"""Ledger panel: where the bytes are at each phase end, per GPU and per process's RSS (the report's
stacked area and stacked bars, report/ledger_figures.py), and whether the categories add up."""
from __future__ import annotations

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboards.messages import describe, message
from dashboards.panels.refresh import due
from miles_profile.report.figures import run_start
from miles_profile.report.ledger import LEDGER_MAX_PROCESSES, ledger
from miles_profile.report.ledger_figures import ledger_area_figure, ledger_bar_figure
from miles_profile.report.ledger_html import add_up_text

_EMPTY = {"data": [], "layout": {}}


def layout() -> html.Section:
    return html.Section(id="ledger-section", className="panel ledger", children=[
        html.Div(className="panel-head", children=[
            html.H2("Where the bytes are"),
            dcc.RadioItems(id="ledger-view", className="phases-grouping", inline=True, value="bars",
                           options=[{"label": "per phase", "value": "bars"},
                                    {"label": "over time", "value": "area"}]),
        ]),
        html.P(id="ledger-add-up", className="ledger-add-up"),
        dcc.Graph(id="ledger-graph", figure=_EMPTY, config={"displaylogo": False}),
        dcc.Store(id="ledger-rendered"),
    ])


def compute(run):
    """The run's ledger frame and the figures of it (per phase, not per sample)."""
    frame = ledger(run)
    return frame, ledger_bar_figure(frame), ledger_area_figure(frame, run_start(run)), add_up_text(frame)


def register(app, state) -> None:
    @app.callback(
        Output("ledger-graph", "figure"), Output("ledger-add-up", "children"), Output("ledger-rendered", "data"),
        Input("runs-selected", "data"), Input("page-poll", "n_intervals"), Input("ledger-view", "value"),
        State("ledger-rendered", "data"))
    def show_ledger(run_id, _tick, view, rendered):
        if run_id is None:
            return _EMPTY, None, None
        try:
            live_run = state.cache.get(run_id)
            key = due(f"{run_id}\n{view}", live_run.version, rendered)
            if key is None:
                raise PreventUpdate
            if len(live_run.current.processes) > LEDGER_MAX_PROCESSES:  # as the report: not for a large fleet yet
                return _EMPTY, message(f"The ledger is computed for runs of up to {LEDGER_MAX_PROCESSES} processes.",
                                       "info"), key
            frame, bars, area, text = live_run.memo("ledger", compute)
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return _EMPTY, message(describe(exc)), None
        if frame.empty:
            return _EMPTY, message("No phase has ended yet.", "info"), key
        return (area if view == "area" else bars), text, key
