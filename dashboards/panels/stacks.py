"""Stacks panel (record --stacks): per recorded process, the top allocation sites at its snapshot's peak and
how to open the snapshot in memory_viz, as the text rows the HTML report renders (report/stacks_html.py).
Empty, heading included, for a run without stacks."""
from __future__ import annotations

from dash import dash_table, dcc, html

from dashboards.panels.phases import TABLE_STYLE
from dashboards.panels.refresh import register_whole_run_panel
from miles_profile.runmodel.stacks import stacks_of
from miles_profile.report.stacks_html import SITE_COLUMNS, device_text, heading_text, site_rows, status_text


def layout() -> html.Section:
    return html.Section(id="stacks-section", className="panel stacks", children=[
        html.Div(id="stacks-body"),
        dcc.Store(id="stacks-rendered"),
    ])


def _table(rows: list[dict], table_id: str) -> dash_table.DataTable:
    return dash_table.DataTable(id=table_id, data=[{k: r[k] for k, _ in SITE_COLUMNS} for r in rows],
                                columns=[{"name": h, "id": k} for k, h in SITE_COLUMNS],
                                tooltip_data=[{"site": {"value": r["_stack"] or r["site"], "type": "text"}} for r in rows],
                                style_cell_conditional=[{"if": {"column_id": c}, "textAlign": "left"}
                                                        for c in ("site", "function")],
                                page_size=20, **TABLE_STYLE)


def body(found) -> list:
    if not found:
        return []
    children = [html.Div(className="panel-head", children=[html.H2("Which code made the peak")])]
    for k, snapshot in enumerate(found):
        children.append(html.H3(heading_text(snapshot)))
        for dev in snapshot.devices:
            children.append(html.P(device_text(snapshot, dev), className="small"))
            if dev.sites:
                children.append(_table(site_rows(dev), f"stacks-table-{k}-{dev.device}"))
        children.append(html.P(status_text(snapshot), className="muted small" if snapshot.status == "written" else "warn",
                               **{"data-status": snapshot.status}))
    return children


def register(app, state) -> None:
    register_whole_run_panel(app, state, "stacks-body", "stacks-rendered",
                             lambda live_run: body(live_run.memo("stacks", stacks_of)))
