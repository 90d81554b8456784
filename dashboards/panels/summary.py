"""Summary panel, above everything on the run page: the verdict, where the peak is, whether every offload
worked, the failing checks first (report/summary.py: the same block as the HTML report and the CLI). A
click on a failing check or on the peak zooms the timeline to exactly that window."""
from __future__ import annotations

from dash import ALL, Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from dashboards.messages import message, problem
from dashboards.panels.checks import focus_of_click
from dashboards.panels.refresh import due
from dashboards.verdicts import verdict_of
from miles_profile.report.figures import run_start
from miles_profile.runmodel.peak import iteration_text
from miles_profile.runmodel.series import GiB
from miles_profile.report.summary import Summary, summarize

_CLASS = {"pass": "badge-pass", "fail": "badge-fail", "warn": "badge-warn", "too small to judge": "badge-small"}


def layout() -> html.Section:
    return html.Section(className="panel summary", children=[
        html.Div(id="summary-block"),
        dcc.Store(id="summary-spans"),
        dcc.Store(id="summary-rendered"),
    ])


def compute(run, verdict) -> tuple[Summary, float]:
    coverage = verdict.coverage if verdict.checked and verdict.checks else ""
    return summarize(run, verdict.checks, verdict.status, coverage), run_start(run)


def _link(index: int, text: str) -> html.Button:
    return html.Button(text, id={"type": "summary-link", "index": index}, className="summary-link",
                       title="show this window on the timeline")


def _peak(summary: Summary, t0: float, spans: list) -> html.Div:
    peak = summary.peak
    if peak is None:
        return html.Div([html.Div("Highest peak", className="summary-label"), html.Div("–")], className="summary-fact")
    where = f"{peak.phase} · {iteration_text(peak.iteration)}" if peak.phase else peak.outside
    spans.append(list(peak.span or (peak.t - 0.5, peak.t + 0.5)))
    left = f"{peak.share:.0%} of {peak.total / GiB:.1f} GiB {peak.limit}".rstrip() if peak.total else "device total unknown"
    if summary.headroom is not None:  # the headroom check's figure, as in the report
        left += f" · {summary.headroom.left / GiB:.2f} GiB left ({summary.headroom.series})"
    return html.Div(className="summary-fact", id="summary-peak", **{"data-peak-bytes": str(int(peak.bytes))}, children=[
        html.Div(f"Highest peak · {peak.where}", className="summary-label"),
        html.Div(f"{peak.bytes / GiB:.2f} GiB", className="summary-value"),
        _link(len(spans) - 1, f"{where}, at {peak.t - t0:.2f} s"),
        html.Div(left, className="summary-detail"),
    ])


def _offloads(summary: Summary, spans: list) -> html.Div:
    if not summary.offloads:
        return html.Div([html.Div("Offloads", className="summary-label"),
                         html.Div("no offload_* phase in this run", className="summary-detail")],
                        className="summary-fact")
    rows = []
    for kind in summary.offloads:
        state = "fail" if kind.failed else ("pass" if kind.count > kind.too_small + kind.not_judged else
                                            ("too small to judge" if kind.too_small else "n/a"))
        freed = kind.freed_text()
        worst = ""
        if kind.failed and kind.worst is not None and kind.worst.span:
            spans.append(list(kind.worst.span))
            worst = _link(len(spans) - 1, kind.worst.message)
        rows.append(html.Tr([html.Td(f"{kind.name} ×{kind.count}"), html.Td(freed, className="num"),
                             html.Td([html.Span(state, className=f"badge {_CLASS.get(state, 'badge-na')}"), worst])],
                            **{"data-offload": kind.name, "data-status": state}))
    return html.Div(className="summary-fact summary-wide", children=[
        html.Div("Did every offload work? (freed / declared, median)", className="summary-label"),
        html.Table(html.Tbody(rows), className="summary-offloads")])


def _failing(summary: Summary, spans: list) -> html.Div | None:
    if not summary.failing:
        return None
    items = []
    for check, finding in summary.failing:
        span = finding.span if finding is not None and finding.span else check.span
        text = f"{check.name}: {finding.message if finding else check.summary}"
        if span:
            spans.append(list(span))
            items.append(html.Li(_link(len(spans) - 1, text), **{"data-check": check.name}))
        else:
            items.append(html.Li(text, **{"data-check": check.name}))
    return html.Div([html.Div("Failing checks", className="summary-label"), html.Ol(items)], className="summary-failing")


def _warning(summary: Summary) -> html.Div | None:
    """Checks whose evidence is ambiguous (WARN), as the HTML report lists them."""
    if not summary.warning:
        return None
    items = [html.Li(f"{c.name}: {f.message if f else c.summary}", **{"data-check": c.name}) for c, f in summary.warning]
    return html.Div([html.Div("Unsure (WARN: exit 0, 1 with --strict)", className="summary-label"), html.Ol(items)],
                    id="summary-warning", className="summary-warning")


def _killed(summary: Summary, spans: list) -> html.Div | None:
    """Killed processes first (verdicts/oom.py), each a link to the seconds before its death."""
    if not summary.killed:
        return None
    items = []
    for finding in summary.killed:
        spans.append(list(finding.span))
        grew = [html.Li(f"{g['what']}: +{g['growth'] / GiB:.3f} GiB") for g in finding.numbers.get("grew", [])]
        items.append(html.Li([_link(len(spans) - 1, finding.message), html.Ul(grew) if grew else None],
                             **{"data-cause": finding.cause or "", "data-pid": str(finding.numbers.get("pid"))}))
    return html.Div([html.Div("Killed", className="summary-label"), html.Ol(items)],
                    id="summary-killed", className="summary-killed")


def _command_failed(summary: Summary) -> html.Div | None:
    text = summary.exit_text()
    return None if text is None else html.Div(f"Command failed: {text}", id="summary-command-exit",
                                              className="summary-command-exit")


def render(summary: Summary, t0: float) -> tuple[list, list]:
    spans: list = []
    killed = _killed(summary, spans) or _command_failed(summary)
    badge = html.Span(summary.status.upper(), id="summary-status", **{"data-status": summary.status},
                      className=f"badge summary-badge {_CLASS.get(summary.status, 'badge-na')}")
    coverage = html.Span(summary.coverage, id="summary-coverage", className="summary-coverage")
    facts = html.Div([_peak(summary, t0, spans), _offloads(summary, spans)], className="summary-row")
    return [killed, badge, coverage, facts, _failing(summary, spans), _warning(summary)], spans


def register(app, state) -> None:
    @app.callback(
        Output("summary-block", "children"), Output("summary-spans", "data"), Output("summary-rendered", "data"),
        Input("runs-selected", "data"), Input("page-poll", "n_intervals"), State("summary-rendered", "data"))
    def show_summary(run_id, _tick, rendered):
        if run_id is None:
            return None, None, None
        try:
            live_run = state.cache.for_page(run_id)
            key = due(run_id, live_run.version, rendered)
            if key is None:
                raise PreventUpdate
            verdict = verdict_of(live_run, state.phases)
            summary, t0 = live_run.memo("summary", lambda run: compute(run, verdict))
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return problem(exc), None, None
        children, spans = render(summary, t0)
        return children, {"run": run_id, "spans": spans}, key

    @app.callback(
        Output("checks-focus", "data", allow_duplicate=True),
        Input({"type": "summary-link", "index": ALL}, "n_clicks"),
        State("summary-spans", "data"), prevent_initial_call=True)
    def focus_summary(_clicks, listed):
        return focus_of_click(listed)
