"""The fleet part of `visualize` for a run of many processes: which samples to read, the checks across
processes, the per-GPU timelines and the report's Fleet section.

    is_fleet(run) -> bool                      # more than one process with phases, or processes on >1 GPU
    FULL_READ_MAX_PROCESSES = 64               # up to this many, every process's samples are read
    FleetView(run, table, matrix, outliers, lanes, picked, figures)
    build_fleet(run, spec="worst:8", max_points=100_000) -> FleetView
        reads the samples of the processes in the picked lanes only (when the run was loaded without
        samples: load_run(sample_pids=set())); the heatmap, outliers and fleet checks read the
        PhaseTable (phase summaries), never the samples.
    judged_processes(run), process_view(...)   # which processes the per-process checks judge, and
        each one's view of the run (verdicts/per_process.py aggregates the checks over them)
    fleet_html(view, t0) -> str

Up to 8 lanes are drawn whatever the spec; past that the fleet view plus the lanes of `--lanes`.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from miles_profile.names import instance_label
from miles_profile.report import fleet_figures
from miles_profile.runmodel import fleet
from miles_profile.runmodel.phase_table import phase_table
from miles_profile.runmodel.process_view import (  # noqa: F401 - re-exported
    is_fleet,
    judged_processes,
    phase_processes,
)
from miles_profile.runmodel.reduce import reduce_series
from miles_profile.runmodel.series import has_column, pids as recorded_pids, sample_columns, series_arrays
from miles_profile.words import counted
from miles_profile.logdir.reader import with_samples
from miles_profile.report.figures import run_start
from miles_profile.report.plotly_bundle import figure_div

FULL_READ_MAX_PROCESSES = 64
DEFAULT_LANES = "worst:8"
MAX_LANES_DRAWN = 8
_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


def drawn_processes(view: "FleetView") -> set[tuple[str, int]]:
    """(host, pid) of every process on the lanes the view draws."""
    shown = view.lanes[view.lanes["lane"].isin(view.picked)]
    return {(str(host), int(pid)) for host, pids in zip(shown["host"], shown["pids"]) for pid in pids}




@dataclass
class FleetView:
    run: object                     # the run, with the samples of the picked lanes' processes read
    table: pd.DataFrame             # normalized PhaseTable
    matrix: fleet.GpuMatrix
    outliers: fleet.Outliers
    lanes: pd.DataFrame             # every lane (fleet.lanes)
    picked: list[str]               # lane ids drawn, display order
    figures: list[tuple[dict, go.Figure]] = field(default_factory=list)
    spec: str = DEFAULT_LANES


def build_fleet(run, spec: str | None = None, *, max_points: int = 100_000) -> FleetView:
    """The fleet's tables and drawn lanes; its checks are the verdict engine's (verdicts/engine.py), which
    takes this view's table and matrix so that nothing is computed twice."""
    table = fleet.normalize(phase_table(run))
    if table.empty:
        return FleetView(run, table, None, None, pd.DataFrame(), [], [], spec or "")
    matrix = fleet.gpu_matrix(table)
    all_lanes = matrix.lanes
    if spec is None and len(all_lanes) <= MAX_LANES_DRAWN:
        picked = list(all_lanes["lane"])
    else:
        picked = fleet.select_lanes(table, spec or DEFAULT_LANES, matrix)
    shown = all_lanes[all_lanes["lane"].isin(picked)]
    if getattr(run, "sample_pids", None) is not None:  # read lazily: now the samples in view
        pids = {int(p) for ps in shown["pids"] for p in ps}
        run = with_samples(run, pids)
    view = FleetView(run, table, matrix, fleet.rank_outliers(table, matrix=matrix), all_lanes, picked,
                     spec=spec or DEFAULT_LANES)
    view.figures = [(lane, lane_figure(run, table, lane, max_points=max(2000, max_points // max(1, len(shown)))))
                    for lane in shown.to_dict("records")]
    return view


# -- one lane: its processes stacked ------------------------------------------------------------
def _own_column(run, pid: int, kind: str, gpu_index: int) -> str | None:
    if kind == "host":
        return "rss" if has_column(run, "rss") else None
    for series in fleet.OWN_GPU_SERIES:
        column = f"gpu{gpu_index}_{series}"
        if has_column(run, column) and np.isfinite(series_arrays(run, pid, column)[1]).any():
            return column
    return None


def _gpu_procs_by_gpu(run, host: str) -> dict[str, pd.DataFrame]:
    """A host's NVML process rows split per GPU, read once per run: each of its 8 lanes read the whole
    host file again (27 s of a 32-process report)."""
    cache = run.__dict__.setdefault("_report_cache", {}).setdefault("gpu_procs_by_gpu", {})
    if host not in cache:
        procs = run.gpu_procs_of([host])
        cache[host] = ({str(u): f for u, f in procs.groupby("gpu_uuid", sort=False, observed=True)}
                       if len(procs) else {})
    return cache[host]


def _reduced(t: np.ndarray, y: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    keep = reduce_series(t, y, n)
    return t[keep], y[keep]


def lane_figure(run, table: pd.DataFrame, lane: dict, *, max_points: int = 20_000) -> go.Figure:
    """One lane: each recorded process's own memory (reduced), the GPU's other NVML processes, the
    device's NVML used and its total. On a host lane: the ranks' processes' RSS under the host total."""
    rows = table[table["lane"] == lane["lane"]]
    who = rows.drop_duplicates("pid").set_index("pid")
    pids = [int(p) for p in lane["pids"]]
    n = max(500, max_points // max(1, len(pids) + 2))
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    have = set(recorded_pids(run))
    on_gpu = lane["kind"] == "gpu"
    drawn = set()
    for pid in pids:
        info = who.loc[pid]
        label = f"{info['role'] or 'process'} rank {info['rank']} (pid {pid})" if info["rank"] >= 0 else \
            f"{info['role'] or 'process'} (pid {pid})"
        index = int(info["gpu_index"]) if "gpu_index" in who and info["gpu_index"] >= 0 else 0
        column = _own_column(run, pid, "gpu" if on_gpu else "host", index) if pid in have else None
        if column is None and on_gpu:
            column = next((c for c in sample_columns(run) if pid in have and c.startswith("gpu") and
                           c.rsplit("_", 1)[-1] in fleet.OWN_GPU_SERIES and
                           np.isfinite(series_arrays(run, pid, c)[1]).any()), None)
        if column is not None:
            t, y = series_arrays(run, pid, column)
            series[label] = _reduced(t, y, n)
            drawn.add(pid)
    used, others = None, {}
    if on_gpu:
        device = run.gpu_used.get((lane["host"], lane["gpu_uuid"])) if hasattr(run, "gpu_used") else None
        if device is not None and len(device[0]):
            used = _reduced(device[0], device[1], n)
        procs = _gpu_procs_by_gpu(run, lane["host"]) if run.hosts else {}
        mine = procs.get(str(lane["gpu_uuid"]))
        if mine is not None and len(mine):
            for pid, rows_ in mine.groupby("pid", sort=True):
                if int(pid) in drawn:
                    continue
                label = f"pid {int(pid)} (NVML, not recorded)" if int(pid) not in pids else \
                    f"{who.loc[int(pid), 'role']} (pid {int(pid)}, NVML)"
                others[label] = _reduced(rows_["t"].to_numpy(float), rows_["bytes"].to_numpy(float), n)
    total = float(lane["total"]) if np.isfinite(lane["total"]) else None
    what = f"{lane['label']} — ranks {lane['ranks'] or '?'} ({lane['roles'] or '?'})"
    # a total far above the data (a host's RAM under a few ranks' RSS) is named in the title, not drawn
    phases = fleet_figures.lane_phases(run, {(str(lane["host"]), pid) for pid in pids})
    return fleet_figures.gpu_process_stack({**series, **others}, used, device_total=total, t0=run_start(run),
                                           title=what, phases=phases)




# -- HTML ---------------------------------------------------------------------------------------
def _e(x) -> str:
    return html.escape(str(x))


def lane_anchor(k: int, lane_index: int) -> str:
    return f"lane-{k}-{lane_index}"


def fleet_html(view: FleetView, k: int, t0: float) -> str:
    """The Fleet section: heatmap, ranked outliers (each a link to its lane at that phase), lanes."""
    if view.matrix is None:
        return '<p class="muted">No phases: nothing to compare across processes.</p>'
    heatmap = fleet_figures.fleet_heatmap(view.matrix)
    top = float(np.nanmax(view.matrix.fraction)) if np.isfinite(view.matrix.fraction).any() else 1.0
    host_only = not (view.matrix.lanes["kind"] == "gpu").any()
    if host_only and 0 < top < 0.5:  # ranks' RSS against a host's total: scale the colours to what is there
        heatmap.update_traces(zmax=top, colorbar_tickformat=".1%")
        heatmap.update_layout(title_text=heatmap.layout.title.text + f" (colours up to the highest share, {top:.1%})")
    heat = figure_div(heatmap, div_id=f"fleet-heatmap-{k}", config=_CONFIG)
    position = {lane: i for i, lane in enumerate(view.picked)}
    rows = []
    for r in fleet_figures.outliers_table(view.outliers):
        i = position.get(r["lane"])
        where = _e(r["label"])
        if i is not None:
            where = (f'<a href="#{lane_anchor(k, i)}" class="lane-link" data-target="lane-fig-{k}-{i}" '
                     f'data-t0="{r["t0"] - t0:.3f}" data-t1="{r["t1"] - t0:.3f}">{where}</a>')
        else:
            where += ' <span class="muted small">(not drawn: add it with --lanes)</span>'
        rows.append(f'<tr><td>{_e(r["kind"])}</td><td class="num">{r["rank"]}</td><td>{where}</td>'
                    f'<td>{_e(r["who"])}</td><td>{_e(instance_label(r["phase"], r["iteration"]))}</td>'
                    f'<td class="num" title="{r["bytes"]:,} B">{_e(r["value"])}</td></tr>')
    table = (f'<table class="data outliers" id="outliers-{k}"><thead><tr><th>outlier</th><th>#</th><th>lane</th>'
             f'<th>who</th><th>phase</th><th>value</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
             if rows else '<p class="muted">No outliers.</p>')
    n_lanes = len(view.lanes)
    lanes_note = (f"all {counted(n_lanes, 'lanes')}" if len(view.picked) == n_lanes else
                  f"{len(view.picked)} of {n_lanes} lanes (--lanes {_e(view.spec)})")
    figures = []
    for i, (lane, figure) in enumerate(view.figures):
        div = figure_div(figure, div_id=f"lane-fig-{k}-{i}", config=_CONFIG)
        figures.append(f'<div class="lane" id="{lane_anchor(k, i)}"><h4>{_e(lane["label"])}</h4>'
                       f'<div class="figure">{div}</div></div>')
    processes = len(set(zip(view.table["host"].tolist(), view.table["pid"].tolist())))
    return f"""
  <h3>Fleet</h3>
  <p class="muted small">{counted(processes, "processes")} with phases on {counted(n_lanes, "lanes")} (a lane is a GPU; on a run without
  GPUs a rank's host memory). Colour: each lane's peak in each (iteration, phase) as a share of its total, from the
  phase summaries. Click an outlier to jump to its lane zoomed on that phase.</p>
  <div class="figure">{heat}</div>
  <h4>Outliers</h4>
  {table}
  <h4>Lanes: {lanes_note}</h4>
  <p class="muted small">{_lanes_note(view)}</p>
  {''.join(figures)}"""


def _lanes_note(view: FleetView) -> str:
    if (view.lanes["kind"] == "gpu").any():
        return ("Each process's own memory stacked (actor, engine, then other processes NVML lists on the GPU), "
                "NVML's device used as a line and the device total dashed; samples reduced keeping every peak.")
    return ("No GPU in this run: a lane is a rank's host memory, its processes' RSS stacked (actor, then engine); "
            "samples reduced keeping every peak.")


ZOOM_SCRIPT = """
document.addEventListener('click', function (ev) {
  var a = ev.target.closest && ev.target.closest('a.lane-link');
  if (!a) return;
  var fig = document.getElementById(a.dataset.target);
  if (fig && window.Plotly) {
    var t0 = parseFloat(a.dataset.t0), t1 = parseFloat(a.dataset.t1), pad = Math.max(0.5, (t1 - t0) * 0.25);
    Plotly.relayout(fig, {'xaxis.range': [t0 - pad, t1 + pad]});
  }
});
"""


def report_data(view: FleetView) -> dict:
    """What the report's JSON block says of the fleet (tests read it)."""
    return {"lanes": len(view.lanes), "picked": [str(x) for x in view.picked],
            "outliers": len(fleet_figures.outliers_table(view.outliers)) if view.outliers is not None else 0}
