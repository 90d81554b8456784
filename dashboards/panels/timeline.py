"""Timeline panel: the run's memory series with phase bands, re-reduced from the full data on every zoom.

One callback owns the figure, so the three things that redraw it cannot race: a zoom (relayout), a
poll that found new samples (live), and a click on a failed check (zoom to its span). The visible
window is kept in Unix seconds in `timeline-view`; a live redraw keeps it, so new samples never
reset the user's zoom.
"""
from __future__ import annotations

import re
import time

from dash import Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate

from dashboards.messages import describe, message
from miles_profile.report.figures import run_start, timeline_figure

_RANGE_KEY = re.compile(r"^xaxis\d*\.range\[([01])\]$")
_RANGE_LIST_KEY = re.compile(r"^xaxis\d*\.range$")
_AUTORANGE_KEY = re.compile(r"^xaxis\d*\.autorange$")
FOCUS_PAD = 0.15  # share of a check's span shown on each side of it
# Points per redraw, all series together. The report's default (1e5) suits a file; a page redrawn on
# every zoom and every second of a live run wants fewer: this is still ~2 extrema per pixel per series.
MAX_POINTS = 30_000


def layout() -> html.Section:
    return html.Section(className="panel timeline", children=[
        html.Div(className="timeline-head", children=[
            html.H2("Timeline", id="timeline-title"),
            html.Div(id="timeline-status", className="timeline-status"),
        ]),
        html.Div(id="timeline-message"),
        dcc.Graph(id="timeline-graph", className="timeline-graph", figure=_blank(),
                  config={"displaylogo": False, "scrollZoom": True,
                          "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"]}),
        dcc.Store(id="timeline-view"),
        dcc.Store(id="timeline-rendered"),
    ])


def _blank() -> dict:
    return {"data": [], "layout": {"xaxis": {"visible": False}, "yaxis": {"visible": False},
                                   "margin": {"l": 0, "r": 0, "t": 0, "b": 0}}}


def window_from_relayout(relayout: dict | None, run) -> tuple[float, float] | None | bool:
    """The x window (Unix seconds) a relayout asks for; None for 'show all'; False when it is no x change."""
    if not isinstance(relayout, dict):
        return False
    ends: dict[int, object] = {}
    for key, value in relayout.items():
        if _AUTORANGE_KEY.match(key) and value:
            return None
        if _RANGE_LIST_KEY.match(key) and isinstance(value, list) and len(value) == 2:
            ends = {0: value[0], 1: value[1]}
        elif (m := _RANGE_KEY.match(key)):
            ends[int(m.group(1))] = value
    if len(ends) != 2:
        return False
    try:
        t0 = run_start(run)  # the figure's x is seconds since the run started
        lo, hi = sorted((float(ends[0]) + t0, float(ends[1]) + t0))
    except (TypeError, ValueError):
        return False
    return (lo, hi) if hi > lo else False


def focus_window(span) -> tuple[float, float] | None:
    try:
        lo, hi = float(span[0]), float(span[1])
    except (TypeError, ValueError, IndexError):
        return None
    pad = max(hi - lo, 0.2) * FOCUS_PAD
    return lo - pad, hi + pad


def _status(run, live_run, window) -> str:
    n = len(run.samples)
    parts = [f"{n:,} samples", f"{len(run.phases):,} phases"]
    if window is not None:
        parts.append(f"showing {window[1] - window[0]:.3g} s")
    if n:
        age = time.time() - float(run.samples["t"].iloc[-1])
        parts.append(f"last sample {age:.1f} s ago" if age < 3600 else "finished")
    return " · ".join(parts)


def register(app, state) -> None:
    @app.callback(
        Output("timeline-graph", "figure"), Output("timeline-view", "data"), Output("timeline-rendered", "data"),
        Output("timeline-status", "children"), Output("timeline-message", "children"),
        Input("runs-selected", "data"), Input("timeline-graph", "relayoutData"), Input("page-poll", "n_intervals"),
        Input("checks-focus", "data"),
        State("timeline-view", "data"), State("timeline-rendered", "data"))
    def draw_timeline(run_id, relayout, _tick, focus, view, rendered):
        trigger = ctx.triggered_id
        if run_id is None:
            return _blank(), None, None, "", message("No run to show yet.", "info")
        try:
            live_run = state.cache.get(run_id)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            return _blank(), None, None, "", message(describe(exc))
        same_run = isinstance(rendered, dict) and rendered.get("run") == run_id
        window = tuple(view) if same_run and view else None
        if trigger == "page-poll":
            changed = live_run.refresh()
            if same_run and not changed and rendered.get("version") == live_run.version:
                raise PreventUpdate
        elif trigger == "timeline-graph":
            asked = window_from_relayout(relayout, live_run.current)
            if asked is False or not same_run:
                raise PreventUpdate
            window = asked
        elif trigger == "checks-focus" and isinstance(focus, dict):
            window = focus_window(focus.get("span")) or window
        run = live_run.current
        try:
            t0 = run_start(run)
            t_range = None if window is None else (window[0] - t0, window[1] - t0)
            figure = timeline_figure(run, max_points=MAX_POINTS, t_range=t_range)
        except Exception as exc:  # noqa: BLE001
            return _blank(), None, None, "", message(describe(exc))
        # Beside a training run the page is narrow: the legend goes above the plots, not beside them.
        figure.update_layout(uirevision=run_id, margin=dict(t=90, r=10),
                             legend=dict(orientation="h", x=0, y=0.99, yanchor="top", yref="container"))
        if t_range is None:
            figure.update_xaxes(autorange=True)
        else:
            figure.update_xaxes(range=list(t_range), autorange=False)
        figure.update_yaxes(fixedrange=True)  # zoom acts on time; each redraw fits the visible values
        rendered = {"run": run_id, "version": live_run.version}
        notes = message("; ".join(run.warnings), "warning") if run.warnings else None
        return figure, list(window) if window else None, rendered, _status(run, live_run, window), notes
