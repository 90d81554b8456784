"""Comparison panel: two or more runs overlaid, aligned by phase (the report's comparison builder)."""
from __future__ import annotations

from dash import Input, Output, dcc, html

from dashboards.messages import describe, message
from dashboards.runs import list_runs


def picker_layout() -> html.Section:
    return html.Section(className="panel compare-picker", children=[
        html.H2("Compare"),
        dcc.Dropdown(id="compare-runs", multi=True, placeholder="pick two or more runs"),
    ])


def layout() -> html.Section:
    return html.Section(id="compare-section", className="panel compare", children=[
        html.H2("Comparison, aligned by phase"),
        html.Div(id="compare-body"),
    ], style={"display": "none"})


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
            runs = [state.cache.get(run_id).current for run_id in run_ids[:6]]
        except Exception as exc:  # noqa: BLE001
            return message(describe(exc)), {}
        return message(f"{len(runs)} runs chosen; the comparison view is not available yet.", "info"), {}
