"""When a panel that summarizes the whole run recomputes: on a new run, else on new data, at most every few seconds."""
from __future__ import annotations

import time

from dash import Input, Output, State
from dash.exceptions import PreventUpdate

from dashboards.messages import message, problem

SUMMARY_EVERY_S = 3.0  # checks and tables of a live run: recomputed at most this often


def due(run_id: str, version: int, rendered: object, now: float | None = None) -> dict | None:
    """The new `rendered` key when the panel should recompute, else None."""
    now = time.time() if now is None else now
    key = {"run": run_id, "version": version, "at": now}
    if not isinstance(rendered, dict) or rendered.get("run") != run_id:
        return key
    if rendered.get("version") == version:
        return None
    return key if now - float(rendered.get("at", 0)) >= SUMMARY_EVERY_S else None


def register_whole_run_panel(app, state, body_id: str, rendered_id: str, render) -> None:
    """The callback of a panel that summarizes the whole run: `render(live_run)` -> its children,
    recomputed when `due`; a failure becomes a message in the page, never a traceback."""
    @app.callback(Output(body_id, "children"), Output(rendered_id, "data"),
                  Input("runs-selected", "data"), Input("page-poll", "n_intervals"), State(rendered_id, "data"))
    def show(run_id, _tick, rendered):
        if run_id is None:
            return [], None
        try:
            live_run = state.cache.for_page(run_id)
            key = due(run_id, live_run.version, rendered)
            if key is None:
                raise PreventUpdate
            return render(live_run), key
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001
            return [problem(exc)], None
