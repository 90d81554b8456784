"""Checks panel: the verdict engine's checks (verdicts/engine.judge: on a run of many processes the
per-process checks aggregated and the fleet checks, as visualize judges them), failures first; a click
on a failed check zooms the timeline to its span."""
from __future__ import annotations

import time

from dash import ALL, Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from dashboards.messages import message, problem
from dashboards.panels.refresh import due
from dashboards.runs import summarize
from dashboards.verdicts import verdict_of
from miles_profile.report.figures import run_start
from miles_profile.verdicts.engine import judge
from miles_profile.verdicts.types import STATUS_ORDER, TOO_SMALL, CheckResult

_VERDICT_CLASS = {"pass": "badge-pass", "fail": "badge-fail", "warn": "badge-warn", TOO_SMALL: "badge-small"}


def layout() -> html.Section:
    return html.Section(className="panel checks", children=[
        html.H2("Checks"),
        html.Div(id="checks-list", className="checks-list"),
        dcc.Store(id="checks-spans"),
        dcc.Store(id="checks-rendered"),
        dcc.Store(id="checks-focus"),
    ])


def _item(index: int, check: CheckResult, t0: float) -> html.Div | html.Button:
    verdict = html.Span(check.status, className=f"badge {_VERDICT_CLASS.get(check.status, 'badge-na')}",
                        **{"data-status": check.status})
    where = f"{check.span[0] - t0:.2f}–{check.span[1] - t0:.2f} s" if check.span else ""
    body = [html.Div([verdict, html.Span(check.title, className="checks-name", **{"data-check": check.name}),
                      html.Span(where, className="checks-span")], className="checks-line"),
            html.Div(check.summary, className="checks-summary")]
    if check.status == "fail" and check.span is not None:
        return html.Button(body, id={"type": "checks-item", "index": index}, className="checks-item checks-failed",
                           title=f"{check.explanation}\nClick to show this span on the timeline.")
    return html.Div(body, className="checks-item", title=check.explanation)


def compute(run, phases: str | None = None) -> tuple[list[CheckResult], float]:
    """The engine's checks of the run, failures first, and the run's time origin (for the spans shown).
    `phases`: --phase (None: the run's recorded default); a selection matching no phase is an error."""
    return failures_first(judge(run, selection=phases).checks), run_start(run)


def failures_first(results: list[CheckResult]) -> list[CheckResult]:
    return sorted(results, key=lambda r: STATUS_ORDER.get(r.status, 9))


def register(app, state) -> None:
    @app.callback(
        Output("checks-list", "children"), Output("checks-spans", "data"), Output("checks-rendered", "data"),
        Input("runs-selected", "data"), Input("page-poll", "n_intervals"),
        State("checks-rendered", "data"))
    def show_checks(run_id, _tick, rendered):
        if run_id is None:
            return None, None, None
        try:
            live_run = state.cache.for_page(run_id)
            recording = summarize(run_id, live_run.run_dir).live
            key = due(run_id, live_run.version, rendered)
            if key is None and rendered.get("recording") == recording:
                raise PreventUpdate
            key = {**(key or rendered), "recording": recording}
            # the verdict the summary panel renders too: judged once per version of the run
            results = failures_first(verdict_of(live_run, state.phases).checks)
            t0 = run_start(live_run.current)
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return problem(exc), None, None
        # Tagged with the run: a click on a list not yet redrawn for a newly chosen run is not that run's.
        spans = {"run": run_id, "spans": [list(r.span) if r.span else None for r in results]}
        items = [_item(i, r, t0) for i, r in enumerate(results)]
        if recording:  # the iteration in progress is judged as it stands
            items.insert(0, message("Still recording: verdicts are provisional until the run ends.", "info"))
        return items, spans, key

    @app.callback(
        Output("checks-focus", "data"),
        Input({"type": "checks-item", "index": ALL}, "n_clicks"),
        State("checks-spans", "data"), prevent_initial_call=True)
    def focus_check(_clicks, listed):
        return focus_of_click(listed)


def focus_of_click(listed) -> dict:
    """The timeline's focus for the clicked item of a list of spans ({"run", "spans"}), shared by the
    checks and summary panels; PreventUpdate for a click that names no span of the run shown."""
    clicked = ctx.triggered_id
    if not isinstance(clicked, dict) or not ctx.triggered[0]["value"] or not isinstance(listed, dict):
        raise PreventUpdate
    spans, index = listed.get("spans") or [], clicked.get("index")
    if not isinstance(index, int) or not 0 <= index < len(spans) or spans[index] is None:
        raise PreventUpdate
    return {"run": listed.get("run"), "span": spans[index], "index": index, "at": time.time()}
