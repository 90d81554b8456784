"""Per-phase panel: the report's per-phase table (count, durations, floor/mean/peak per series), GiB on screen."""
from __future__ import annotations

import pandas as pd
from dash import Input, Output, State, dash_table, dcc, html
from dash.exceptions import PreventUpdate

from dashboards.messages import message, problem
from dashboards.panels.refresh import due
from miles_profile.verdicts.selection import selection_for
from miles_profile.runmodel.series import GiB
from miles_profile.runmodel.stats import phase_table, stat_metrics

_FONT = "system-ui, -apple-system, Segoe UI, Roboto, sans-serif"
TABLE_STYLE = dict(
    style_table={"overflowX": "auto"},
    style_cell={"fontFamily": _FONT, "fontSize": "12px", "padding": "2px 8px"},
    style_header={"fontWeight": "600", "backgroundColor": "#f3f4f6", "textAlign": "center", "fontFamily": _FONT})
_KEYS = {"iteration": "iteration", "name": "phase", "count": "count", "total_s": "total s", "mean_s": "mean s"}


def layout() -> html.Section:
    return html.Section(className="panel phases", children=[
        html.Div(className="panel-head", children=[
            html.H2("Phases"),
            dcc.RadioItems(id="phases-grouping", className="phases-grouping", inline=True, value="overall",
                           options=[{"label": "overall", "value": "overall"},
                                    {"label": "per iteration", "value": "iteration"}]),
        ]),
        html.Div(id="phases-table"),
        dcc.Store(id="phases-rendered"),
    ])


def display_table(frame: pd.DataFrame, labels: dict[str, str], table_id: str) -> dash_table.DataTable:
    """A table of the report's: byte columns (`<metric>_<stat>`) shown in GiB under a merged header."""
    columns, records = [], [{} for _ in range(len(frame))]
    for column in frame.columns:
        metric, _, stat = str(column).rpartition("_")
        if metric in labels:
            name, values = [f"{labels[metric]} (GiB)", stat], [None if pd.isna(v) else round(int(v) / GiB, 3)
                                                            for v in frame[column]]
            kind = "numeric"
        else:
            name = ["", _KEYS.get(str(column), str(column))]
            values = [None if pd.isna(v) else (round(float(v), 3) if isinstance(v, float) else v) for v in frame[column]]
            kind = "numeric" if pd.api.types.is_numeric_dtype(frame[column]) else "text"
        columns.append({"name": name, "id": str(column), "type": kind})
        for record, value in zip(records, values):
            record[str(column)] = value
    return dash_table.DataTable(
        id=table_id, data=records, columns=columns, merge_duplicate_headers=True, sort_action="native",
        page_size=20, **TABLE_STYLE)


def compute(run, by_iteration: bool, phases: str | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """The report's per-phase table (of the phases `phases` selects, as visualize --phase; None: the
    run's recorded default) and the labels of its metrics."""
    table = phase_table(run, by_iteration=by_iteration)
    selection = selection_for(run, phases)
    if selection is not None and len(table):
        table = table[table["name"].astype(str).map(selection.matches)].reset_index(drop=True)
    return table, {m.name: m.label for m in stat_metrics(run)}


def register(app, state) -> None:
    @app.callback(
        Output("phases-table", "children"), Output("phases-rendered", "data"),
        Input("runs-selected", "data"), Input("page-poll", "n_intervals"), Input("phases-grouping", "value"),
        State("phases-rendered", "data"))
    def show_phases(run_id, _tick, grouping, rendered):
        if run_id is None:
            return None, None
        by_iteration = grouping == "iteration"
        try:
            live_run = state.cache.for_page(run_id)
            key = due(f"{run_id}\n{by_iteration}", live_run.version, rendered)
            if key is None:
                raise PreventUpdate
            frame, labels = live_run.memo(f"phases-{by_iteration}", lambda run: compute(run, by_iteration, state.phases))
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001
            return problem(exc), None
        if frame.empty:
            return message("No phases recorded yet.", "info"), key
        return display_table(frame, labels, "phases-datatable"), key
