"""Fleet panel, for a run of several processes with phases or several GPUs: the GPU x (iteration, phase)
heatmap, the ranked outliers, one GPU's timeline opened by a click on either, and lanes the user picks.

Every figure and number comes from miles_profile.report (phase_table, fleet, fleet_figures); this module
only lays them out. Whole-run work reads the PhaseTable (one row per phase instance), computed once per
run version (`LiveRun.memo`); a GPU's timeline reads the samples of that GPU's processes only: NVML's
per-process bytes and device used from the host files, a process's own series where NVML has none
(rss on a CPU run).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from dash import ALL, Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate

from dashboards.live_run import RunLoading
from dashboards.messages import message, problem
from dashboards.panels.refresh import due
from miles_profile.errors import MilesProfileError
from miles_profile.words import counted
from miles_profile.names import instance_label
from miles_profile.report import fleet_figures
from miles_profile.runmodel import fleet
from miles_profile.report.figures import run_start
from miles_profile.runmodel.phase_table import phase_table
from miles_profile.runmodel.process_view import (
    is_fleet,  # the report's rule: both views open on the same view
)
from miles_profile.runmodel.reduce import reduce_series
from miles_profile.importers.miles_dashboard import SOURCE

ONE_LANE_EACH = 8  # up to this many lanes each gets its timeline; beyond, `worst:8` unless the user picks
MAX_COLUMNS = 600
HEATMAP_HEIGHT = 620  # heatmap columns before consecutive iterations merge (fleet.coarsen)
POINTS_PER_SERIES = 2_000  # an opened GPU's timeline
LANE_POINTS = 500  # each picked lane's whole-run timeline: up to 8 drawn together, kept light
WINDOW_PAD = 2.0  # a clicked phase's timeline carries this many phase lengths of data on each side (min 5 s)
_HIDDEN, _SHOWN = {"display": "none"}, {}


@dataclass(frozen=True)
class FleetView:
    table: pd.DataFrame  # normalized PhaseTable
    matrix: fleet.GpuMatrix  # coarsened as the heatmap draws it
    figure: object
    outliers: list[dict]
    t0: float  # the run's time origin: every x axis is seconds since it


def one_lane_each(run) -> bool:
    """Whether the run-wide timeline draws the run (one lane per GPU, as for one process). Past 16
    processes it would draw one line per process, and the fleet view replaces it, but only where the fleet
    panel shows (is_fleet): 5,000 processes that wrote a meta and nothing else are no fleet, and the
    timeline draws the one that has samples instead of pointing to a hidden view (issue 19 item 15)."""
    many = sum(p.get("role") != "exec_parent" for p in run.processes) > 2 * ONE_LANE_EACH
    return not many or not is_fleet(run)


def timeline_note(run) -> str:
    """What the run-wide timeline says where it gives way (one_lane_each is False): the fleet panel is
    shown then, with its heatmap and lanes or with why it has none yet."""
    return f"{len(run.processes):,} processes: the fleet view above replaces the run-wide timeline."


def compute(run) -> FleetView | None:
    if not is_fleet(run):
        return None
    table = fleet.normalize(phase_table(run))
    if table.empty:
        return None
    matrix = fleet.gpu_matrix(table)
    outliers = fleet_figures.outliers_table(fleet.rank_outliers(table, matrix=matrix))
    # Past 32 lanes a fixed height, so the outliers and an opened GPU stay in view below it.
    height = HEATMAP_HEIGHT if len(matrix.lanes) > 32 else None
    figure = fleet_figures.fleet_heatmap(matrix, max_columns=MAX_COLUMNS, height=height)
    if height is not None:  # at that height one row label in k, about 14 px apart, stays readable
        rows = list(figure.data[0].y)
        step = int(np.ceil(len(rows) / (height / 14)))
        figure.update_yaxes(tickvals=rows[::step], ticktext=rows[::step])
    figure.update_layout(uirevision="fleet")
    return FleetView(table, fleet.coarsen(matrix, MAX_COLUMNS), figure, outliers, run_start(run))


def empty_reason(run) -> str:
    """Why a run the fleet view is for (several GPUs or processes) has no heatmap, in words a user acts on."""
    miles = run.meta.get("source") == SOURCE
    if run.phases.empty:
        if miles:
            return ("This Miles dump has no phase events (no phases/ stream: Miles' Timer hooks wrote nothing), "
                    "so the fleet heatmap has no columns and there are no outliers. Each GPU's NVML memory is in "
                    "the timeline below, its utilization and the SGLang engine series under it.")
        return ("No phase has begun in this run yet, so the fleet heatmap has no columns: it has one per "
                "(iteration, phase), and fills in as the processes' phases end.")
    return ("No phase has ended with a summary yet, so the fleet heatmap has no cells: each column is a phase's "
            "peak, known at its end.")


def layout() -> html.Section:
    return html.Section(id="fleet-panel", className="panel fleet", style=_HIDDEN, children=[
        html.Div(className="panel-head", children=[html.H2("Fleet"), html.Div(id="fleet-status",
                                                                               className="timeline-status")]),
        html.Div(id="fleet-message"),
        html.Div(id="fleet-body", children=[  # hidden, with the reason in fleet-message, when there is nothing to draw
            dcc.Graph(id="fleet-heatmap", config={"displaylogo": False}),
            html.Div(className="fleet-row", children=[
                html.Div(className="fleet-outliers", children=[html.H2("Outliers (click to open)"),
                                                               html.Div(id="fleet-outliers")]),
                html.Div(className="fleet-gpu", children=[
                    html.Div(id="fleet-gpu-message", children=message("Click a cell or an outlier to open that "
                                                                       "GPU's timeline at that phase.", "info")),
                    dcc.Graph(id="fleet-gpu-graph", style=_HIDDEN, config={"displaylogo": False}),
                ]),
            ]),
            html.Div(className="fleet-lanes-head", children=[
                html.H2("Lanes"),
                dcc.Input(id="fleet-lanes-spec", type="text", debounce=True, placeholder="rank:0-7, host:node3, worst:5",
                          className="fleet-lanes-spec"),
                html.Div(id="fleet-lanes-message"),
            ]),
            html.Div(id="fleet-lanes", className="fleet-lanes"),
        ]),
        dcc.Store(id="fleet-rendered"),
        dcc.Store(id="fleet-due"),
        dcc.Store(id="fleet-outlier-links"),
        dcc.Store(id="fleet-gpu-lane"),  # the lane opened last: the ledger panel follows it
    ])


# -- one GPU's processes stacked -----------------------------------------------------------------
def _reduced(t: np.ndarray, y: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    keep = reduce_series(t, y.astype(float), points)
    return t[keep], y[keep].astype(float)


def _gpu_index(run) -> dict:
    """(host, gpu_uuid) -> row numbers of run.gpu_procs and run.gpu_samples: one grouping per run version."""
    procs, used = run.gpu_procs, run.gpu_samples
    return {"procs": procs.groupby(["host", "gpu_uuid"], observed=True).indices if len(procs) else {},
            "used": used.groupby(["host", "gpu_uuid"], observed=True).indices if len(used) else {}}


def lane_series(run, view: FleetView, index: dict, lane: str, window: tuple[float, float] | None,
                points: int = POINTS_PER_SERIES):
    """({label: (t, bytes)}, device used (t, bytes) or None, total, title) for one lane, from the samples
    of that lane's processes only, within `window` (Unix seconds; None: the whole run)."""
    rows = view.table[view.table["lane"] == lane]
    if rows.empty:
        raise MilesProfileError(f"no lane {lane!r} in this run")
    host, uuid = rows["host"].iloc[0], rows["gpu_uuid"].iloc[0]
    who = rows.drop_duplicates("pid").set_index("pid")
    label_of = {int(p): f"{role or 'process'} r{rank} pid {p}"
                for p, role, rank in zip(who.index, who["role"], who["rank"])}

    def clip(t, y):
        if window is None:
            return _reduced(t, y, points)
        a, b = np.searchsorted(t, window[0], "left"), np.searchsorted(t, window[1], "right")
        return _reduced(t[max(a - 1, 0):b + 1], y[max(a - 1, 0):b + 1], points)

    series, used = {}, None
    at = index["procs"].get((host, uuid)) if uuid else None
    if at is not None:
        g = run.gpu_procs.iloc[at]
        for pid, p in g.groupby("pid", sort=True):
            label = label_of.get(int(pid), f"other pid {int(pid)}")
            series[label] = clip(p["t"].to_numpy(float), p["bytes"].to_numpy(float))
    missing = [p for p in label_of if label_of[p] not in series]
    if missing:  # no NVML for these processes: their own series from their samples (rss on CPU)
        own = {int(p): s for p, s in zip(who.index, who["own_series"])}
        samples = run.samples[run.samples["pid"].isin(missing)]
        for pid, s in samples.groupby("pid", sort=True):
            column = _own_column(s, own.get(int(pid), "rss"))
            if column is not None:
                series[label_of[int(pid)]] = clip(s["t"].to_numpy(float), s[column].to_numpy(float))
    at = index["used"].get((host, uuid)) if uuid else None
    if at is not None:
        g = run.gpu_samples.iloc[at]
        used = clip(g["t"].to_numpy(float), g["used"].to_numpy(float))
    label = view.matrix.lanes.set_index("lane").loc[lane, "label"]
    return series, used, float(rows["gpu_total"].max()), label


def _own_column(samples: pd.DataFrame, own: str) -> str | None:
    candidates = ["rss"] if own in ("rss", "") else [c for c in samples.columns if c.endswith(f"_{own}")]
    return next((c for c in candidates if c in samples and samples[c].notna().any()), None)


def gpu_figure(run, view: FleetView, index: dict, lane: str, window: tuple[float, float] | None,
               zoom: tuple[float, float] | None = None, height: int = 320, points: int = POINTS_PER_SERIES):
    series, used, total, label = lane_series(run, view, index, lane, window, points)
    title = label if zoom is None else f"{label}: {zoom[1] - zoom[0]:.2f} s from {zoom[0] - view.t0:.2f} s"
    rows = view.table[view.table["lane"] == lane]
    phases = fleet_figures.lane_phases(run, set(zip(rows["host"].astype(str), rows["pid"].astype(int))), window)
    figure = fleet_figures.gpu_process_stack(series, used, device_total=total, t0=view.t0, title=title, phases=phases)
    figure.update_layout(height=height, uirevision=f"{lane}-{zoom}")
    if zoom is not None:
        figure.update_xaxes(range=[zoom[0] - view.t0, zoom[1] - view.t0], autorange=False)
    return figure


def padded(t0: float, t1: float) -> tuple[float, float]:
    pad = max(WINDOW_PAD * (t1 - t0), 5.0)
    return t0 - pad, t1 + pad


def cell_window(view: FleetView, lane: str, column: str) -> tuple[float, float]:
    """The clicked cell's phase window on that lane: its phase instances in the column's iterations."""
    cols = view.matrix.columns
    c = cols[cols["label"] == column]
    if c.empty:
        raise MilesProfileError(f"no column {column!r}")
    c = c.iloc[0]
    t = view.table
    rows = t[(t["lane"] == lane) & (t["phase"] == c["phase"]) & t["iteration"].between(c["iteration"],
                                                                                        c["iteration_last"])]
    return (float(rows["t0"].min()), float(rows["t1"].max())) if len(rows) else (float(c["t0"]), float(c["t1"]))


def _outlier_items(rows: list[dict]) -> list:
    items, kind = [], None
    for i, r in enumerate(rows):
        if r["kind"] != kind:
            kind = r["kind"]
            items.append(html.Div(kind, className="fleet-outlier-kind"))
        items.append(html.Button(
            id={"type": "fleet-outlier", "index": i}, className="checks-item fleet-outlier",
            title="Open this GPU's timeline at this phase",
            children=[html.Span(f"{r['rank']}. {r['label']}", className="checks-name"),
                      html.Span(f" {r['who']} · {instance_label(r['phase'], r['iteration'])} · {r['value']}",
                                className="checks-summary")]))
    return items or [message("No outliers.", "info")]


def source_of(cache, run_id):
    """The run once read (LiveRun); while it is read, its first look (FirstLook: metas, events, phase
    summaries, host files, no samples), which is all the heatmap, the outliers and a GPU's NVML timeline
    need: a fleet's first screen in seconds instead of after minutes of reading every process's samples."""
    try:
        return cache.for_page(run_id)
    except RunLoading:
        return cache.first_look(run_id)


def register(app, state) -> None:
    def view_of(run_id):
        live_run = source_of(state.cache, run_id)
        return live_run, live_run.memo("fleet", compute)

    @app.callback(
        Output("fleet-panel", "style"), Output("fleet-heatmap", "figure"), Output("fleet-outliers", "children"),
        Output("fleet-outlier-links", "data"), Output("fleet-status", "children"), Output("fleet-message", "children"),
        Output("fleet-rendered", "data"), Output("fleet-body", "style"),
        Input("runs-selected", "data"), Input("fleet-due", "data"), State("fleet-rendered", "data"))
    def draw_fleet(run_id, _due, rendered):
        if run_id is None:
            return _HIDDEN, {}, None, None, "", None, None, _SHOWN
        try:
            live_run = source_of(state.cache, run_id)
            live_run.refresh()
            key = due(run_id, live_run.version, rendered)
            if key is None:
                raise PreventUpdate
            view = live_run.memo("fleet", compute)
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - a message in the page, never a traceback
            return (_SHOWN, {}, None, None, "", problem(exc), {"run": run_id, "version": -1, "at": 0},
                    _HIDDEN)
        if view is None:
            if not is_fleet(live_run.current):
                return _HIDDEN, {}, None, None, "", None, {**key, "fleet": False}, _SHOWN
            # a fleet with nothing to draw: say why, not a blank heatmap
            return (_SHOWN, {}, None, None, "", message(empty_reason(live_run.current), "info"),
                    {**key, "fleet": False}, _HIDDEN)
        lanes = view.matrix.lanes
        status = (f"{counted(len(lanes), 'lanes')} · {counted(view.table['pid'].nunique(), 'processes')} · "
                  f"{counted(len(view.table), 'phase instances')}")
        links = {"run": run_id, "rows": [[r["lane"], r["t0"], r["t1"]] for r in view.outliers]}
        return (_SHOWN, view.figure, _outlier_items(view.outliers), links, status, None,
                {**key, "fleet": True, "lanes": len(lanes)}, _SHOWN)

    @app.callback(Output("fleet-due", "data"), Input("page-poll", "n_intervals"),
                  State("runs-selected", "data"), State("fleet-rendered", "data"), prevent_initial_call=True)
    def poll_fleet(_tick, run_id, rendered):
        """A poll asks for a redraw only once the drawn run has new data. Dash keeps a callback's latest
        request only: ticks that asked draw_fleet itself re-sent the ~0.7 MB figure while the first
        draw was on its way, each replacing the last, and delayed the first paint."""
        if run_id is None or not isinstance(rendered, dict) or rendered.get("run") != run_id:
            raise PreventUpdate  # the draw for this selection is on its way
        live_run = state.cache.loaded(run_id)  # None: still being read (a first look is drawn meanwhile)
        if live_run is None:
            raise PreventUpdate
        live_run.refresh()
        if due(run_id, live_run.version, rendered) is None:
            raise PreventUpdate
        return {"run": run_id, "version": live_run.version}

    @app.callback(
        Output("fleet-gpu-graph", "figure"), Output("fleet-gpu-graph", "style"),
        Output("fleet-gpu-message", "children"), Output("fleet-gpu-lane", "data"),
        Input("fleet-heatmap", "clickData"), Input({"type": "fleet-outlier", "index": ALL}, "n_clicks"),
        State("fleet-outlier-links", "data"), State("runs-selected", "data"), prevent_initial_call=True)
    def open_gpu(cell, _clicks, links, run_id):
        try:
            live_run, view = view_of(run_id)
            if view is None:
                raise PreventUpdate
            if ctx.triggered_id == "fleet-heatmap":
                point = (cell or {}).get("points", [{}])[0]
                lane = _lane_of_row(view, point.get("y"))
                zoom = cell_window(view, lane, point.get("x"))
            else:
                if not ctx.triggered or not ctx.triggered[0]["value"] or not isinstance(links, dict):
                    raise PreventUpdate
                lane, t0, t1 = links["rows"][ctx.triggered_id["index"]]
                zoom = (float(t0), float(t1))
            index = live_run.memo("fleet-gpu-index", _gpu_index)
            figure = gpu_figure(live_run.current, view, index, lane, padded(*zoom), zoom)
        except PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001
            return {}, _HIDDEN, problem(exc), no_update
        return figure, _SHOWN, None, {"run": run_id, "lane": lane}

    @app.callback(
        Output("fleet-lanes", "children"), Output("fleet-lanes-message", "children"),
        Input("fleet-lanes-spec", "value"), Input("fleet-rendered", "data"), State("runs-selected", "data"))
    def draw_lanes(spec, rendered, run_id):
        if not isinstance(rendered, dict) or not rendered.get("fleet"):
            return [], None
        try:
            live_run, view = view_of(run_id)
            default = f"worst:{ONE_LANE_EACH}" if len(view.matrix.lanes) > ONE_LANE_EACH else None
            spec = (spec or "").strip() or default
            picked = fleet.select_lanes(view.table, spec, view.matrix) if spec else list(view.matrix.lanes["lane"])
            index = live_run.memo("fleet-gpu-index", _gpu_index)
            graphs = [dcc.Graph(id={"type": "fleet-lane", "index": k}, config={"displaylogo": False},
                                figure=gpu_figure(live_run.current, view, index, lane, None, height=260,
                                                  points=LANE_POINTS))
                      for k, lane in enumerate(picked[:64])]
        except MilesProfileError as exc:
            return [], message(str(exc))
        except Exception as exc:  # noqa: BLE001
            return [], problem(exc)
        shown = (counted(len(picked), "lanes") + (f" ({spec})" if spec else "")
                 + (", first 64 drawn" if len(picked) > 64 else ""))
        return graphs, message(shown, "info")


def _lane_of_row(view: FleetView, row_label: object) -> str:
    rows = fleet_figures.row_labels(view.matrix.lanes)
    if row_label not in rows:
        raise MilesProfileError(f"no GPU row {row_label!r}")
    return view.matrix.lanes["lane"].iloc[rows.index(row_label)]


def preload(live_run) -> None:
    """Compute the fleet view (and the GPU index a click needs) before the page asks (of a LiveRun or
    a FirstLook)."""
    if live_run.memo("fleet", compute) is not None:
        live_run.memo("fleet-gpu-index", _gpu_index)
