"""Comparison panel: two or more runs overlaid, aligned by phase, and each phase's peak per run (the report's)."""
from __future__ import annotations

import pandas as pd
from dash import Input, Output, dash_table, dcc, html

from dashboards.messages import describe, message
from dashboards.panels.phases import TABLE_STYLE
from dashboards.runs import list_runs
from miles_profile.report.compare import comparison_figure, phase_peak_comparison
from miles_profile.report.series import GiB

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
        html.Div(id="compare-body"),
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


def register(app, state) -> None:
    @app.callback(Output("compare-runs", "options"), Input("runs-signature", "data"))
    def list_choices(_signature):
        return [{"label": r.run_id, "value": r.run_id} for r in list_runs(state.root)]

    @app.callback(Output("compare-body", "children"), Output("compare-section", "style"),
                  Input("compare-runs", "value"))
    def compare(run_ids):
        if not isinstance(run_ids, list) or len(run_ids) < 2:
            return None, {"display": "none"}
        try:
            runs = [state.cache.get(run_id).current for run_id in run_ids[:MAX_RUNS]]
            figure = comparison_figure(runs, max_points=MAX_POINTS)
            peaks = phase_peak_comparison(runs)
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return message(describe(exc)), {}
        note = message(f"showing the first {MAX_RUNS} runs", "info") if len(run_ids) > MAX_RUNS else None
        return [note, dcc.Graph(id="compare-graph", figure=figure, config={"displaylogo": False}),
                peak_table(peaks)], {}
