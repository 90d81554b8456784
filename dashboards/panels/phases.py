"""Per-phase panel: the report's per-phase table (count, durations, floor/mean/peak per series)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from dash import Input, Output, State, dash_table, dcc, html
from dash.exceptions import PreventUpdate

from dashboards import report_bridge as bridge
from dashboards.messages import describe, message


def layout() -> html.Section:
    return html.Section(className="panel phases", children=[
        html.H2("Phases"),
        html.Div(id="phases-table"),
        dcc.Store(id="phases-rendered"),
    ])


def table(frame: pd.DataFrame, table_id: str) -> dash_table.DataTable:
    """A DataFrame as a compact, sortable table (the frame is already formatted for display)."""
    frame = frame.reset_index() if not isinstance(frame.index, pd.RangeIndex) else frame
    frame = frame.replace({np.nan: None})
    return dash_table.DataTable(
        id=table_id, data=frame.to_dict("records"),
        columns=[{"name": str(c), "id": str(c)} for c in frame.columns],
        sort_action="native", page_size=25, style_table={"overflowX": "auto"},
        style_cell={"fontFamily": "inherit", "fontSize": "12px", "padding": "3px 8px", "textAlign": "right"},
        style_header={"fontWeight": "600", "backgroundColor": "#f3f4f6"})


def register(app, state) -> None:
    @app.callback(
        Output("phases-table", "children"), Output("phases-rendered", "data"),
        Input("runs-selected", "data"), Input("timeline-rendered", "data"),
        State("phases-rendered", "data"))
    def show_phases(run_id, _timeline_rendered, rendered):
        if run_id is None:
            return None, None
        try:
            live_run = state.cache.get(run_id)
            key = {"run": run_id, "version": live_run.version}
            if key == rendered:
                raise PreventUpdate
            frame = bridge.phase_table(live_run.current)
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001
            return message(describe(exc)), None
        if frame.empty:
            return message("No phases recorded yet.", "info"), key
        return table(frame, "phases-datatable"), key
