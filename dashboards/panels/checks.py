"""Checks panel: each check's verdict and numbers; a click on a failed check zooms the timeline to its span."""
from __future__ import annotations

from dash import ALL, Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from dashboards import report_bridge as bridge
from dashboards.messages import describe, message

_VERDICT_CLASS = {"pass": "badge-pass", "fail": "badge-fail"}


def layout() -> html.Section:
    return html.Section(className="panel checks", children=[
        html.H2("Checks"),
        html.Div(id="checks-list", className="checks-list"),
        dcc.Store(id="checks-spans"),
        dcc.Store(id="checks-rendered"),
        dcc.Store(id="checks-focus"),
    ])


def _item(index: int, check: bridge.CheckView) -> html.Div:
    verdict = html.Span(check.verdict, className=f"badge {_VERDICT_CLASS.get(check.verdict, 'badge-na')}")
    body = [html.Div([verdict, html.Span(check.name, className="checks-name")], className="checks-line"),
            html.Div(check.summary, className="checks-summary")]
    if check.verdict == "fail" and check.span is not None:
        return html.Button(body, id={"type": "checks-item", "index": index}, className="checks-item checks-failed",
                           title="show this span on the timeline")
    return html.Div(body, className="checks-item")


def register(app, state) -> None:
    @app.callback(
        Output("checks-list", "children"), Output("checks-spans", "data"), Output("checks-rendered", "data"),
        Input("runs-selected", "data"), Input("timeline-rendered", "data"),
        State("checks-rendered", "data"))
    def show_checks(run_id, timeline_rendered, rendered):
        if run_id is None:
            return None, None, None
        try:
            live_run = state.cache.get(run_id)
            key = {"run": run_id, "version": live_run.version}
            if key == rendered:
                raise PreventUpdate
            checks = bridge.check_views(live_run.current)
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return message(describe(exc)), None, None
        if not checks:
            return message("No checks apply to this run.", "info"), [], key
        spans = [list(c.span) if c.span else None for c in checks]
        return [_item(i, c) for i, c in enumerate(checks)], spans, key

    @app.callback(
        Output("checks-focus", "data"),
        Input({"type": "checks-item", "index": ALL}, "n_clicks"),
        State("checks-spans", "data"), prevent_initial_call=True)
    def focus_check(clicks, spans):
        clicked = ctx.triggered_id
        if not isinstance(clicked, dict) or not ctx.triggered[0]["value"] or not isinstance(spans, list):
            raise PreventUpdate
        index = clicked.get("index")
        if not isinstance(index, int) or not 0 <= index < len(spans) or spans[index] is None:
            raise PreventUpdate
        return {"span": spans[index], "index": index, "clicks": ctx.triggered[0]["value"]}
