"""Comparison panel: two or more runs side by side, phase by phase (the report's small multiples of the
ledger), and each phase's highest peak per run (the report's run x phase matrices).

A compared run that is still being recorded is followed like the timeline follows it: every
SUMMARY_EVERY_S the panel reads what the runs appended and redraws when one changed. The comparison is
computed once per (runs, versions) and shared: the browser drops an answer when a newer request for
the same callback is sent, so a request must find a slow computation's result, not start it again."""
from __future__ import annotations

import threading

import pandas as pd
import plotly.graph_objects as go
from dash import ClientsideFunction, Input, Output, State, ctx, dash_table, dcc, html, no_update
from dash.exceptions import PreventUpdate

from dashboards.messages import message, problem
from dashboards.panels.phases import TABLE_STYLE
from dashboards.panels.refresh import SUMMARY_EVERY_S, due
from dashboards.runs import list_runs
from miles_profile.report.compare import comparison_figure, peak_matrix
from miles_profile.runmodel.series import GiB

MAX_RUNS = 6
MAX_POINTS = 30_000


def picker_layout() -> html.Section:
    return html.Section(className="panel compare-picker", children=[
        html.H2("Compare"),
        dcc.Dropdown(id="compare-runs", multi=True, placeholder="pick two or more runs"),
    ])


def layout() -> html.Section:
    return html.Section(id="compare-section", className="panel compare", style={"display": "none"}, children=[
        html.H2("Comparison, aligned by phase"),
        html.Div(id="compare-note"),
        dcc.Graph(id="compare-graph", figure={"data": [], "layout": {}}, config={"displaylogo": False}),
        html.Div(id="compare-body"),
        dcc.Store(id="compare-rendered"),
        dcc.Store(id="compare-zoom"),  # the user's last x zoom, re-applied when a live comparison redraws
        dcc.Interval(id="compare-poll", interval=int(SUMMARY_EVERY_S * 1000)),
    ])


def peak_table(frame: pd.DataFrame) -> dash_table.DataTable:
    """`<run>: <kind> peak` byte columns shown in GiB, one header group per run."""
    columns, data = [], frame.copy()
    for column in frame.columns:
        run, sep, what = str(column).partition(": ")
        if sep:
            data[column] = [None if pd.isna(v) else round(int(v) / GiB, 3) for v in frame[column]]
            columns.append({"name": [run, f"{what} (GiB)"], "id": column, "type": "numeric"})
        else:
            columns.append({"name": ["", str(column)], "id": column})
    return dash_table.DataTable(id="compare-table", data=data.astype(object).where(data.notna(), None).to_dict("records"),
                                columns=columns, sort_action="native",
                                page_size=20, **TABLE_STYLE)


def matrix_table(matrix: pd.DataFrame, table_id: str) -> dash_table.DataTable:
    """compare.peak_matrix (runs x phases in loop order, bytes) in GiB: one row per run, its name
    first and readable, one column per phase."""
    data = [{"run": str(name), **{str(p): None if pd.isna(v) else round(int(v) / GiB, 2) for p, v in row.items()}}
            for name, row in matrix.iterrows()]
    columns = [{"name": "run", "id": "run"}] + [{"name": str(p), "id": str(p), "type": "numeric"} for p in matrix.columns]
    return dash_table.DataTable(id=table_id, data=data, columns=columns, sort_action="native", **TABLE_STYLE)


def peak_tables(runs) -> html.Div:
    """The highest peak of each phase per run, GPU then host (GiB), as in the report."""
    parts = []
    for kind, what in (("device", "GPU memory of the main process"), ("host", "host RSS of the main process")):
        matrix = peak_matrix(runs, kind)
        if not matrix.empty:
            parts += [html.H3(f"{what}: highest peak per phase (GiB)"), matrix_table(matrix, f"compare-table-{kind}")]
    return html.Div(parts, id="compare-table")


def with_zoom(figure: go.Figure, zoom: object) -> go.Figure:
    """`figure` showing the x range of `zoom` (from compare-zoom), or as it is (no zoom, autorange, garbage).
    A copy: the comparison is shared between requests."""
    try:
        lo, hi = sorted(float(v) for v in zoom["range"]) if not zoom.get("auto") else (None, None)
    except (AttributeError, KeyError, TypeError, ValueError):
        return figure
    if lo is None or not hi > lo:
        return figure
    return go.Figure(figure).update_xaxes(range=[lo, hi], autorange=False)


def register(app, state) -> None:
    newest: dict = {}  # "key": (run ids, versions), "value": (figure, peaks) of the newest comparison
    computing = threading.Lock()

    def comparison(chosen: list[str], live_runs) -> tuple:
        with computing:  # a second request waits for the first's result instead of computing it again
            key = (tuple(chosen), tuple(live_run.version for live_run in live_runs))
            if newest.get("key") != key:
                runs = [live_run.current for live_run in live_runs]
                figure = comparison_figure(runs, max_points=MAX_POINTS)
                # For legend clicks across redraws. The x zoom is put back by with_zoom: uirevision alone
                # lost it on these redraws (seen in the browser test with a real drag).
                figure.update_layout(uirevision="compare")
                newest.update(key=key, value=(figure, peak_tables(runs)))
            return newest["value"]

    # The timeline's browser-side filter: only a relayout that moves the x axis is kept.
    app.clientside_callback(ClientsideFunction("timeline", "zoomFromRelayout"),
                            Output("compare-zoom", "data"), Input("compare-graph", "relayoutData"),
                            prevent_initial_call=True)

    @app.callback(Output("compare-runs", "options"), Input("runs-signature", "data"))
    def list_choices(_signature):
        return [{"label": r.run_id, "value": r.run_id} for r in list_runs(state.root)]

    @app.callback(Output("compare-note", "children"), Output("compare-graph", "figure"),
                  Output("compare-body", "children"), Output("compare-section", "style"),
                  Output("compare-rendered", "data"), Output("compare-zoom", "data", allow_duplicate=True),
                  Input("compare-runs", "value"), Input("compare-poll", "n_intervals"),
                  State("compare-rendered", "data"), State("compare-zoom", "data"), prevent_initial_call=True)
    def compare(run_ids, _tick, rendered, zoom):
        chosen_now = ctx.triggered_id == "compare-runs"  # other runs: the old zoom does not apply
        if chosen_now:
            zoom = None
        if not isinstance(run_ids, list) or len(run_ids) < 2:
            return None, {"data": [], "layout": {}}, None, {"display": "none"}, None, None
        chosen = [str(run_id) for run_id in run_ids[:MAX_RUNS]]
        try:
            live_runs = [state.cache.for_page(run_id) for run_id in chosen]
            for live_run in live_runs:
                live_run.refresh()  # a run being recorded grows here too
            key = due("\n".join(chosen), [live_run.version for live_run in live_runs], rendered)
            if key is None:
                raise PreventUpdate
            figure, peaks = comparison(chosen, live_runs)
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return problem(exc), {"data": [], "layout": {}}, None, {}, None, None
        note = message(f"showing the first {MAX_RUNS} runs", "info") if len(run_ids) > MAX_RUNS else None
        return note, with_zoom(figure, zoom), peaks, {}, key, None if chosen_now else no_update
