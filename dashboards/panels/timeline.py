"""Timeline panel: the run's memory series with phase bands, re-reduced from the full data on every zoom.

One callback owns the figure, so the three things that redraw it cannot race: a zoom (a relayout,
filtered in the browser by assets/timeline.js), a poll that found new samples (live), and a click on a
failed check (zoom to its span). The visible
window is kept in Unix seconds in `timeline-view`; a live redraw keeps it, so new samples never
reset the user's zoom.
"""
from __future__ import annotations

import time

from dash import ClientsideFunction, Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from dashboards.messages import message, problem
from dashboards.panels.fleet import one_lane_each, timeline_note
from miles_profile.report.figures import run_start, timeline_figure
from miles_profile.verdicts.selection import select_run, selection_for

FOCUS_PAD = 0.15  # share of a check's span shown on each side of it
# Points per redraw, all series together. The report's default (1e5) suits a file; a page redrawn on
# every zoom and every second of a live run wants fewer: this is still ~2 extrema per pixel per series.
MAX_POINTS = 18_000


def layout() -> html.Section:
    return html.Section(className="panel timeline", children=[
        html.Div(className="timeline-head", children=[
            html.H2("Timeline", id="timeline-title"),
            html.Div(id="timeline-status", className="timeline-status"),
        ]),
        html.Div(id="timeline-message"),
        dcc.Loading(type="dot", delay_show=800, children=dcc.Graph(  # a spinner only while a big run loads
            id="timeline-graph", className="timeline-graph", figure=_blank(),
            config={"displaylogo": False, "scrollZoom": True,
                    "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"]})),
        dcc.Store(id="timeline-zoom"),  # the last x zoom the user asked for, in axis units (set in the browser)
        dcc.Store(id="timeline-view"),
        dcc.Store(id="timeline-rendered"),
    ])


def _blank() -> dict:
    return {"data": [], "layout": {"xaxis": {"visible": False}, "yaxis": {"visible": False},
                                   "margin": {"l": 0, "r": 0, "t": 0, "b": 0}}}


def window_from_zoom(zoom: object, run) -> tuple[float, float] | None | bool:
    """The window (Unix seconds) a `timeline-zoom` asks for; None: show all; False: nothing usable."""
    if not isinstance(zoom, dict):
        return False
    if zoom.get("auto"):
        return None
    try:
        lo, hi = sorted(float(v) for v in zoom["range"])
    except (KeyError, TypeError, ValueError):
        return False
    t0 = run_start(run)  # the figure's x is seconds since the run started
    return (lo + t0, hi + t0) if hi > lo else False


def focus_window(span) -> tuple[float, float] | None:
    try:
        lo, hi = float(span[0]), float(span[1])
    except (TypeError, ValueError, IndexError):
        return None
    pad = max(hi - lo, 0.2) * FOCUS_PAD
    return lo - pad, hi + pad


def _stamp(request: object) -> object:
    return request.get("at") if isinstance(request, dict) else None


def plan_window(run_id: str, version: int, zoom: object, focus: object, view: object, rendered: object,
                triggers: set[str], zoom_window) -> tuple[tuple[float, float] | None, dict] | None:
    """The window to draw and the new `timeline-rendered`, or None when nothing changed.

    Decided from state, not from which input fired: the browser drops the answer to a request when a
    newer one for the same callback is sent (a poll right after a zoom), so a zoom or a focus not yet
    drawn is recognized by its stamp (`at`) differing from the one recorded in `rendered`.
    """
    rendered = rendered if isinstance(rendered, dict) else {}
    key = {"run": run_id, "version": version, "zoom_at": _stamp(zoom), "focus_at": _stamp(focus)}
    # A check clicked for this run, not yet drawn; it may arrive before the run's first drawing does.
    new_focus = (isinstance(focus, dict) and focus.get("run") == run_id
                 and _stamp(focus) != rendered.get("focus_at"))
    if rendered.get("run") != run_id:  # a new run starts unzoomed; older zooms are spent
        return (focus_window(focus.get("span")) if new_focus else None), key
    window = tuple(view) if isinstance(view, list) and len(view) == 2 else None
    new_zoom = _stamp(zoom) != rendered.get("zoom_at")
    if new_zoom and not (new_focus and "checks-focus" in triggers):
        asked = zoom_window(zoom)
        if asked is not False:
            window = asked
    if new_focus and (not new_zoom or "checks-focus" in triggers):
        window = focus_window(focus.get("span")) or window
    if not new_zoom and not new_focus and rendered.get("version") == version:
        return None
    return window, key


def _status(run, window) -> str:
    n = len(run.samples)
    parts = [f"{n:,} samples", f"{len(run.phases):,} phases"]
    if window is not None:
        parts.append(f"showing {window[1] - window[0]:.3g} s")
    if n:
        age = time.time() - float(run.samples["t"].iloc[-1])
        parts.append(f"last sample {age:.1f} s ago" if age < 3600 else "finished")
    return " · ".join(parts)


def build_figure(run, run_id: str, window: tuple[float, float] | None, phases: str | None = None):
    """The report's timeline of `run` over `window` (Unix seconds; None: all), set up for the page;
    phase bands only of the phases `phases` selects (--phase; None: the run's recorded default).

    The figure, its reduction and its phase lane (thinned, names hidden when crowded, bands shaded by
    the phases in view) are the report's; only the page's layout is set here."""
    t0 = run_start(run)
    t_range = None if window is None else (window[0] - t0, window[1] - t0)
    shown = select_run(run, selection_for(run, phases))
    figure = timeline_figure(shown, max_points=MAX_POINTS, t_range=t_range, phase_peaks=False)
    # Beside a training run the page is narrow: the legend goes above the plots, not beside them.
    # Items flow in rows (traceorder "normal"), not one column per legend group.
    # Room for the legend's rows above the plots: a run of several processes has twice the entries of one,
    # and a fixed margin let the rows run over the first plot's title. About two entries fit a row.
    entries = sum(1 for trace in figure.data if trace.showlegend is not False and trace.name)
    figure.update_layout(uirevision=run_id, margin=dict(t=max(115, 45 + 18 * -(-entries // 2)), r=20),
                         legend=dict(orientation="h", x=0, y=0.995, yanchor="top", yref="container",
                                     traceorder="normal", entrywidth=0))
    if t_range is None:
        figure.update_xaxes(autorange=True)
    else:
        figure.update_xaxes(range=list(t_range), autorange=False)
    figure.update_yaxes(fixedrange=True)  # zoom acts on time; each redraw fits the visible values
    return figure


def register(app, state) -> None:
    # In the browser: only a relayout that moves the x axis reaches the server. Others (autosize, legend
    # clicks) would otherwise fire the figure callback again and cancel a zoom's redraw in flight.
    app.clientside_callback(ClientsideFunction("timeline", "zoomFromRelayout"),
                            Output("timeline-zoom", "data"), Input("timeline-graph", "relayoutData"),
                            prevent_initial_call=True)

    @app.callback(
        Output("timeline-graph", "figure"), Output("timeline-view", "data"), Output("timeline-rendered", "data"),
        Output("timeline-status", "children"), Output("timeline-message", "children"),
        Input("runs-selected", "data"), Input("timeline-zoom", "data"), Input("page-poll", "n_intervals"),
        Input("checks-focus", "data"),
        State("timeline-view", "data"), State("timeline-rendered", "data"),
        # The page polls again only after a redraw lands: the browser drops an answer when a newer request
        # for the same callback goes out, so on a loaded machine redraws slower than the poll never landed.
        running=[(Output("page-poll", "disabled"), True, False)])
    def draw_timeline(run_id, zoom, _tick, focus, view, rendered):
        triggers = {key.rsplit(".", 1)[0] for key in ctx.triggered_prop_ids}
        if run_id is None:
            return _blank(), None, None, "", message("No run to show yet.", "info")
        try:
            live_run = state.cache.for_page(run_id)
            live_run.refresh()  # every redraw shows the newest samples
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            return _blank(), None, None, "", problem(exc)
        if not one_lane_each(live_run.current):
            return _blank(), None, None, "", message(timeline_note(live_run.current), "info")
        planned = plan_window(run_id, live_run.version, zoom, focus, view, rendered, triggers,
                              lambda z: window_from_zoom(z, live_run.current))
        if planned is None:
            raise PreventUpdate  # a poll that found nothing new, or a relayout that moved no x axis
        window, rendered = planned
        run = live_run.current
        try:
            # Once per version and window: polls that arrive while a zoom is reduced wait for it.
            key = "timeline-full" if window is None else f"timeline-{window[0]!r}-{window[1]!r}"
            figure = live_run.memo(key, lambda r: build_figure(r, run_id, window, state.phases))
        except Exception as exc:  # noqa: BLE001
            return _blank(), None, None, "", problem(exc)
        notes = message("; ".join(run.warnings), "warning") if run.warnings else None
        return figure, list(window) if window else None, rendered, _status(run, window), notes
