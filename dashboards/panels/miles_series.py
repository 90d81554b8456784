"""Panel of a Miles dashboard import's series that are not memory: each GPU's utilization and power, the
SGLang engine series as lanes of their own (report/miles_series.py, the report's figure), or why the dump
has none. Hidden for our own logs."""
from __future__ import annotations

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboards.messages import message, problem
from dashboards.panels.refresh import due
from miles_profile.importers.miles_dashboard_series import engine_series, gpu_series, is_miles, series_note
from miles_profile.report.figures import run_start, time_range
from miles_profile.report.miles_series import miles_series_figure

_EMPTY = {"data": [], "layout": {}}
_HIDDEN, _SHOWN = {"display": "none"}, {}


def layout() -> html.Section:
    return html.Section(id="miles-series-section", className="panel miles-series", style=_HIDDEN, children=[
        html.Div(className="panel-head", children=[html.H2("GPU utilization and SGLang engine series")]),
        html.Div(id="miles-series-note"),
        dcc.Graph(id="miles-series-graph", figure=_EMPTY, style=_HIDDEN, config={"displaylogo": False}),
        dcc.Store(id="miles-series-rendered"),
    ])


def compute(run):
    """(figure or None, note): the timeline's seconds, so the lanes line up with it."""
    figure = miles_series_figure(gpu_series(run), engine_series(run), run_start(run), x_range=time_range(run))
    return figure, series_note(run)


def register(app, state) -> None:
    @app.callback(
        Output("miles-series-section", "style"), Output("miles-series-graph", "figure"),
        Output("miles-series-graph", "style"), Output("miles-series-note", "children"),
        Output("miles-series-rendered", "data"),
        Input("runs-selected", "data"), Input("page-poll", "n_intervals"), State("miles-series-rendered", "data"))
    def show_series(run_id, _tick, rendered):
        if run_id is None:
            return _HIDDEN, _EMPTY, _HIDDEN, None, None
        try:
            live_run = state.cache.for_page(run_id)
            key = due(run_id, live_run.version, rendered)
            if key is None:
                raise PreventUpdate
            if not is_miles(live_run.current):
                return _HIDDEN, _EMPTY, _HIDDEN, None, key
            figure, note = live_run.memo("miles-series", compute)
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return _SHOWN, _EMPTY, _HIDDEN, problem(exc), None
        note = message(note, "info") if note else None
        if figure is None:
            return _SHOWN, _EMPTY, _HIDDEN, note, key
        return _SHOWN, figure, _SHOWN, note, key
