"""Moving-memory panel: the share of each step spent in transitions, the transition meter per phase kind
and tag, and "what you could keep on the GPU" (runmodel/transitions.py, runmodel/whatif.py), as the text
rows the HTML report renders (report/transitions_html.py, report/whatif_html.py)."""
from __future__ import annotations

from dash import dash_table, dcc, html

from dashboards.messages import message
from dashboards.panels.phases import TABLE_STYLE
from dashboards.panels.refresh import register_whole_run_panel
from miles_profile.runmodel.ledger import LEDGER_MAX_PROCESSES, ledger
from miles_profile.runmodel.transitions import transitions
from miles_profile.report.transitions_html import METER_COLUMNS, ceilings_text, meter_rows, share_text
from miles_profile.runmodel.whatif import whatif
from miles_profile.report.whatif_html import WHATIF_COLUMNS, basis_text, title_text, whatif_rows


def layout() -> html.Section:
    return html.Section(id="moving-section", className="panel moving", children=[
        html.Div(className="panel-head", children=[html.H2("What moving memory cost")]),
        html.Div(id="moving-body"),
        dcc.Store(id="moving-rendered"),
    ])


def compute(run):
    """(meter, what-if) of the run, over the ledger's phase ends (the ledger panel's frame, with its peaks:
    computed once per run for both panels)."""
    frame = ledger(run, peaks=True)
    return transitions(run, frame), whatif(run, frame)


def _table(rows: list[dict], columns: list[tuple[str, str]], table_id: str) -> dash_table.DataTable:
    return dash_table.DataTable(id=table_id, data=[{k: r[k] for k, _ in columns} for r in rows],
                                columns=[{"name": h, "id": k} for k, h in columns], page_size=20, **TABLE_STYLE)


def body(meter, result) -> list:
    if meter.empty:
        return [message("No offload, onload or weight update in this run yet.", "info")]
    children = [html.P(share_text(meter), id="moving-share",
                       **{"data-share": "" if meter.share is None else f"{meter.share:.4f}"}),
                html.P(ceilings_text(meter), className="muted small", id="moving-ceilings"),
                _table(meter_rows(meter), METER_COLUMNS, "moving-table")]
    if not result.empty:
        children += [html.H3(title_text(result)), html.P(basis_text(result), className="muted small"),
                     _table(whatif_rows(result), WHATIF_COLUMNS, "moving-whatif-table")]
    return children


def register(app, state) -> None:
    register_whole_run_panel(app, state, "moving-body", "moving-rendered", _render)


def _render(live_run) -> list:
    if len(live_run.current.processes) > LEDGER_MAX_PROCESSES:
        return [message(f"Past {LEDGER_MAX_PROCESSES} processes the transition meter is in the report "
                        "(python -m miles_profile.visualize), not here.", "info")]
    return body(*live_run.memo("moving", compute))
