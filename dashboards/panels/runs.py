"""Runs panel: the runs under the log directory, newest first, live ones marked; polled, so new runs appear."""
from __future__ import annotations

import time

from dash import ALL, ClientsideFunction, Input, Output, State, dcc, html, no_update

from dashboards.runs import RunSummary, list_runs

# The page polls every --poll-ms while the run shown can change (live, or still being read); once it is
# finished and read, every panel's poll answers "unchanged" (about nine requests a poll: 0.18 machine
# CPU-s a second for an idle page of sample_logs/cpu, and a fleet's refresh of its file tails each time),
# so it polls this often instead: a new run still appears in the list within it.
QUIET_POLL_MS = 5000


def layout() -> html.Section:
    return html.Section(className="panel runs", children=[
        html.H2("Runs"),
        html.Div(id="runs-list", className="runs-list"),
        dcc.Store(id="runs-clicked"),  # {run, at}: the last run clicked (set in the browser)
        dcc.Store(id="runs-selected"),
        dcc.Store(id="runs-signature"),
    ])


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _item(run: RunSummary, selected: bool) -> html.Button:
    badges = [html.Span("● live", className="badge badge-live")] if run.live else []
    if run.problem:
        badges.append(html.Span("damaged", className="badge badge-fail"))
    return html.Button(
        id={"type": "runs-item", "run": run.run_id},
        className="runs-item" + (" runs-item-selected" if selected else "") + (" runs-item-live" if run.live else ""),
        title=run.command or run.run_id,
        children=[
            html.Div([html.Span(_when(run.start_time), className="runs-when"), *badges], className="runs-line"),
            html.Div(run.run_id, className="runs-id"),
            html.Div(run.command, className="runs-command"),
        ])


def default_run(runs: list[RunSummary]) -> str | None:
    """What the page shows before the user picks: a live run, else the newest readable one."""
    for wanted in (lambda r: r.live, lambda r: not r.problem, lambda r: True):
        chosen = next((r.run_id for r in runs if wanted(r)), None)
        if chosen is not None:
            return chosen
    return None


def register(app, state) -> None:
    app.clientside_callback(ClientsideFunction("runs", "clicked"), Output("runs-clicked", "data"),
                            Input({"type": "runs-item", "run": ALL}, "n_clicks"), prevent_initial_call=True)

    @app.callback(
        Output("runs-list", "children"), Output("runs-selected", "data"), Output("runs-signature", "data"),
        Output("page-poll", "interval"),
        Input("page-poll", "n_intervals"), Input("runs-clicked", "data"),
        State("runs-selected", "data"), State("runs-signature", "data"), State("page-poll", "interval"))
    def show_runs(_tick, clicked, selected, signature, interval):
        runs = list_runs(state.root)
        previous = selected
        signature = signature if isinstance(signature, list) and len(signature) == 3 else [None, None, None]
        click_at = clicked.get("at") if isinstance(clicked, dict) else None
        if click_at is not None and click_at != signature[2]:  # a click not applied yet
            selected = clicked.get("run")
        ids = [r.run_id for r in runs]
        if selected not in ids:
            selected = default_run(runs)
        listed = [[r.run_id, r.live, r.problem] for r in runs]  # lists: compared with JSON
        new_signature = [selected, listed, click_at]
        poll = _poll_ms(state, runs, selected)
        poll = poll if poll != interval else no_update
        if new_signature == signature:
            return no_update, no_update, no_update, poll
        if not runs:
            empty = html.Div(f"No runs yet under {state.root.path}. Start one with "
                             "python -m miles_profile.record --log-dir DIR ...", className="runs-empty")
            return empty, None if previous is not None else no_update, new_signature, poll
        # Re-sending an unchanged selection would reset the timeline's zoom.
        chosen = selected if selected != previous else no_update
        return [_item(r, r.run_id == selected) for r in runs], chosen, new_signature, poll


def _poll_ms(state, runs: list[RunSummary], selected: str | None) -> int:
    """How often the page polls: --poll-ms while the run shown can change, QUIET_POLL_MS (or --poll-ms
    where that is longer) once it is finished and read (nothing of it left to show)."""
    shown = next((r for r in runs if r.run_id == selected), None)
    if shown is None or shown.live or state.cache.loaded(selected) is None:
        return state.poll_ms
    return max(state.poll_ms, QUIET_POLL_MS)
