"""Plotly figures of the fleet view, shared by the static report and the dashboard.

    fleet_heatmap(matrix, *, max_columns=600, height=None) -> go.Figure
        One Heatmap trace: rows are lanes (GPUs, labelled host:gpuN with ranks and roles), columns are
        (iteration, phase) in time order, colour is the peak as a share of the lane's total (0..1), hover
        gives the exact GiB. No per-cell annotations; past 64 rows only every k-th row is labelled (hover
        names every row). Past `max_columns` columns, consecutive iterations are merged (fleet.coarsen:
        each cell keeps the highest peak). z and customdata are float32 numpy arrays, which plotly writes
        as base64 typed arrays: 512 x 600 cells are about 2.5 MB of HTML.
    outliers_table(outliers) -> list[dict]
        Rows for an HTML table or a Dash DataTable: kind, rank, lane label, ranks/roles, phase,
        iteration, the value on screen (GiB), its exact bytes, and `lane`, `t0`, `t1` to link to.
    row_labels(lanes) -> list[str]           # the heatmap's row labels (the dashboard finds a clicked row)
    gpu_process_stack(samples_by_process, device_used=None, *, device_total=None, t0=0.0) -> go.Figure
        One GPU's timeline: its processes' (already reduced) series stacked as areas (actor first, then
        engine, then others), NVML's device used as a line over them and the device's total dashed
        (when within 2x of the data, else named in the title; the y axis fits the data). `phases`
        (lane_phases(run, processes)) are shaded behind, coloured as in the timeline.
    lane_phases(run, processes) -> DataFrame   # start, end, name of the phases to shade on one lane
        Inputs: {label: pd.Series indexed by Unix seconds | (t, bytes) numpy arrays}. Each process
        holds its last value until its next sample (the stack is summed on the union of the times).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from miles_profile.words import counted, role_text
from miles_profile.runmodel import fleet
from miles_profile.report.phase_style import loop_sorted, phase_color
from miles_profile.runmodel.series import GiB
from miles_profile.runmodel.timeline_marks import fitted_range

SHADED_PHASES_MAX = 400  # bands drawn up to this many phases in view (as in the timeline)

ROW_LABELS_MAX = 64
_COLORSCALE = "YlOrRd"


def _roles_text(roles: str) -> str:
    """A lane's roles ("actor+engine", "in_process") as a person reads them ("actor+engine", "trainer")."""
    return "+".join(role_text(r) for r in str(roles or "").split("+") if r)


def row_labels(lanes: pd.DataFrame) -> list[str]:
    ranks = lanes["ranks"].fillna("")
    roles = lanes["roles"].fillna("").map(_roles_text)
    return [f"{label} r{r} {ro}".rstrip() if r else f"{label} {ro}".rstrip()
            for label, r, ro in zip(lanes["label"], ranks, roles)]


def fleet_heatmap(matrix: fleet.GpuMatrix, *, max_columns: int = 600, height: int | None = None) -> go.Figure:
    matrix = fleet.coarsen(matrix, max_columns)
    rows = row_labels(matrix.lanes)
    cols = list(matrix.columns["label"])
    z = np.clip(matrix.fraction, 0, None).astype(np.float32)
    gib = (matrix.bytes / GiB).astype(np.float32)
    if not np.isfinite(z).any() and np.isfinite(gib).any():
        return _heatmap_in_gib(rows, cols, gib, height)
    # Colours fitted to the data, not to 0-100%: a rank 2% above its peers on a 140 GiB GPU is the
    # finding, and on a fixed scale it is the same pale cell as every other (the same in every view).
    finite = z[np.isfinite(z)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if high - low < 1e-3:
        low, high = max(0.0, low - 0.005), high + 0.005
    figure = go.Figure(go.Heatmap(
        z=z, x=cols, y=rows, customdata=gib, zmin=low, zmax=high, colorscale=_COLORSCALE,
        colorbar=dict(title="peak / total<br>(fitted)", tickformat=".1%"), xgap=0, ygap=0, hoverongaps=False,
        hovertemplate="%{y}<br>%{x}<br>peak %{customdata:.3f} GiB (%{z:.1%} of the total)<extra></extra>"))
    _heatmap_layout(figure, rows, cols, height, "Peak per GPU and phase")
    return figure


def _heatmap_in_gib(rows: list, cols: list, gib: np.ndarray, height: int | None) -> go.Figure:
    """No lane's total is known (a Miles dashboard import: NVML used without the total): the peak in GiB,
    colours fitted to the data, rather than a blank share of an unknown total."""
    finite = gib[np.isfinite(gib)]
    low, high = float(finite.min()), float(finite.max())
    figure = go.Figure(go.Heatmap(
        z=gib, x=cols, y=rows, zmin=low, zmax=max(high, low + 1e-3), colorscale=_COLORSCALE,
        colorbar=dict(title="peak GiB<br>(totals unknown)", tickformat=".1f"), xgap=0, ygap=0, hoverongaps=False,
        hovertemplate="%{y}<br>%{x}<br>peak %{z:.3f} GiB (device total unknown)<extra></extra>"))
    _heatmap_layout(figure, rows, cols, height, "Peak per GPU and phase, in GiB (device totals unknown)")
    return figure


def _heatmap_layout(figure: go.Figure, rows: list, cols: list, height: int | None, title: str) -> None:
    n = len(rows)
    step = max(1, int(np.ceil(n / ROW_LABELS_MAX)))
    x_step = max(1, int(np.ceil(len(cols) / 40)))
    figure.update_layout(
        height=height or int(min(900, max(260, 140 + 14 * min(n, ROW_LABELS_MAX)))),
        margin=dict(l=10, r=10, t=30, b=10),
        title=dict(text=f"{title}: {counted(n, 'lanes')} x {len(cols)} (iteration, phase)", x=0, font_size=13),
        yaxis=dict(autorange="reversed", tickmode="array", tickvals=rows[::step], ticktext=rows[::step],
                   tickfont_size=10, type="category"),
        xaxis=dict(tickmode="array", tickvals=cols[::x_step], ticktext=cols[::x_step], tickangle=-45,
                   tickfont_size=9, type="category"),
    )


_KINDS = (("peak", "highest peak"), ("floor_slope", "fastest-rising floor"), ("shortfall", "largest offload shortfall"))


def outliers_table(outliers: fleet.Outliers) -> list[dict]:
    rows = []
    for kind, title in _KINDS:
        frame = getattr(outliers, kind)
        for k, item in enumerate(frame.itertuples(index=False), start=1):
            value = float(item.value)
            if kind == "peak":
                share = "" if not np.isfinite(item.fraction) else f" ({item.fraction:.0%})"
                shown = f"{value / GiB:.3f} GiB{share}"
            elif kind == "floor_slope":
                shown = (f"{value / GiB:+.3f} GiB/iteration (95% interval {item.slope_low / GiB:+.3f} to "
                         f"{item.slope_high / GiB:+.3f}; {item.rise / GiB:+.3f} GiB over {int(item.n)}, {item.own_series})")
            else:
                shown = f"{value / GiB:.3f} GiB short of {item.expected_bytes / GiB:.3f} GiB"
            ranks = getattr(item, "ranks", None)
            if ranks is not None:  # a lane: its ranks (none for processes outside a process group) and roles
                who = " ".join(w for w in (f"ranks {ranks}" if ranks else "", _roles_text(item.roles)) if w)
            else:
                who = f"pid {item.pid} {role_text(item.role)}" + (f" rank {item.rank}" if item.rank >= 0 else "")
            rows.append(dict(kind=title, rank=k, lane=item.lane, label=item.label, who=who, phase=item.phase,
                             iteration=int(item.iteration), value=shown, bytes=int(round(value)),
                             t0=float(item.t0), t1=float(item.t1)))
    return rows


# -- one GPU, its processes stacked ------------------------------------------------------------
def _as_arrays(values) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(values, pd.Series):
        return values.index.to_numpy(dtype=float), values.to_numpy(dtype=float)
    t, y = values
    return np.asarray(t, dtype=float), np.asarray(y, dtype=float)


def _stack_order(label: str) -> tuple:
    low = label.lower()
    return (0 if "actor" in low else 1 if "engine" in low else 2,)


def _hold(t: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """y held from each sample to the next, on `grid`; 0 before the first sample and in NaN gaps."""
    order = np.argsort(t, kind="stable")
    t, y = t[order], np.nan_to_num(y[order])
    j = np.searchsorted(t, grid, "right") - 1
    return np.where(j >= 0, y[np.maximum(j, 0)], 0.0)


def lane_phases(run, processes, window: tuple[float, float] | None = None) -> pd.DataFrame:
    """The top-level phases (start, end, name; Unix seconds, by start) to shade behind one lane: those
    of every process on it (on a shared GPU the actor trains and the engine generates, so neither
    alone shows the loop). `processes`: (host, pid) pairs; `window` (Unix seconds): only the phases
    that overlap it."""
    phases = run.phases
    empty = pd.DataFrame({"start": [], "end": [], "name": []})
    if phases.empty:
        return empty
    top = phases[phases["depth"] == 0]
    if window is not None:
        top = top[(top["end"] >= window[0]) & (top["start"] <= window[1])]
    wanted = {(str(h), int(p)) for h, p in processes}
    hosts = top["host"].astype(str) if "host" in top else pd.Series("", index=top.index)
    # only rows of a wanted pid can match: those few are looked at one by one (each of a fleet's 8 lanes
    # iterated all 138,000 top-level phases: 1 of 19 CPU s of a 1,024-process report)
    pids_ = top["pid"].to_numpy()
    mine = np.zeros(len(top), dtype=bool)
    for k in np.flatnonzero(np.isin(pids_, [q for _, q in wanted])):
        h, p = hosts.iat[k], int(pids_[k])
        mine[k] = (h, p) in wanted or ("", p) in wanted or (h == "" and any(q == p for _, q in wanted))
    picked = top[mine] if len(top) else top
    return picked[["start", "end", "name"]].astype({"name": str}).sort_values("start").reset_index(drop=True)


def _phase_band_shapes(phases: pd.DataFrame | None, t0: float) -> tuple[list[dict], list[go.Scatter]]:
    """Bands behind the plot, one per phase, and one legend entry per phase name (loop order)."""
    if phases is None or phases.empty or len(phases) > SHADED_PHASES_MAX:
        return [], []
    shapes = [dict(type="rect", xref="x", yref="y domain", x0=float(s) - t0, x1=float(e) - t0, y0=0, y1=1,
                   fillcolor=phase_color(str(n)), opacity=0.2, line=dict(width=0), layer="below")
              for s, e, n in zip(phases["start"], phases["end"], phases["name"])]
    # the stacked areas cover the bands: a strip of full colour along the top names each phase still
    shapes += [dict(type="rect", xref="x", yref="y domain", x0=float(s) - t0, x1=float(e) - t0, y0=0.96, y1=1,
                    fillcolor=phase_color(str(n)), opacity=0.95, line=dict(width=0), layer="above")
               for s, e, n in zip(phases["start"], phases["end"], phases["name"])]
    # no legend group: in a horizontal legend a group is a column, and the phases belong on one line
    legend = [go.Scatter(x=[None], y=[None], mode="markers", name=name,
                         marker=dict(symbol="square", size=11, color=phase_color(name)),
                         hoverinfo="skip") for name in loop_sorted(phases["name"])]
    return shapes, legend


def gpu_process_stack(samples_by_process: Mapping[str, object], device_used=None, *, device_total: float | None = None,
                      t0: float = 0.0, title: str = "", phases: pd.DataFrame | None = None) -> go.Figure:
    """`phases` (start, end, name in Unix seconds; lane_phases): shaded behind the stack. The y axis
    fits the data; the total is a dashed line when within 2x of it, else named in the title."""
    series = {label: _as_arrays(v) for label, v in samples_by_process.items()}
    labels = sorted(series, key=_stack_order)  # stable: the caller's order within actor / engine / others
    grid = np.unique(np.concatenate([t for t, _ in series.values()])) if series else np.empty(0)
    figure = go.Figure()
    stacked = np.zeros(len(grid))
    for label in labels:
        t, y = series[label]
        held = _hold(t, y, grid)
        stacked += held
        figure.add_trace(go.Scatter(
            x=grid - t0, y=held / GiB, name=label, mode="lines", stackgroup="processes",
            line=dict(width=0.5, shape="hv"), hovertemplate=f"{label}: %{{y:.3f}} GiB<extra></extra>"))
    data_max = float(stacked.max()) if len(stacked) else 0.0
    if device_used is not None:
        t, y = _as_arrays(device_used)
        figure.add_trace(go.Scatter(x=t - t0, y=y / GiB, name="NVML used (device)", mode="lines",
                                    line=dict(color="#1f1f1f", width=1.5, shape="hv"),
                                    hovertemplate="device used: %{y:.3f} GiB<extra></extra>"))
        if np.isfinite(y).any():
            data_max = max(data_max, float(np.nanmax(y)))
    total = float(device_total) if device_total is not None and np.isfinite(device_total) else None
    top, shown = fitted_range(data_max, total)
    if shown is not None:
        figure.add_hline(y=shown / GiB, line=dict(color="#c62828", dash="dash", width=1),
                         annotation_text=f"total {shown / GiB:.1f} GiB", annotation_position="top left")
    elif total is not None:
        title = f"{title} · total {total / GiB:.1f} GiB (above the plotted range)"
    shapes, legend = _phase_band_shapes(phases, t0)
    figure.add_traces(legend)
    figure.update_layout(title=dict(text=title, x=0, font_size=13), hovermode="x unified", template="plotly_white",
                         yaxis=dict(title="GiB", range=[0, top / GiB], autorange=False), xaxis_title="seconds",
                         margin=dict(l=10, r=10, t=40, b=10), legend=dict(orientation="h", y=-0.2, traceorder="normal"))
    _add_shapes(figure, shapes)
    return figure


def _add_shapes(figure: go.Figure, shapes: list[dict]) -> None:
    """Append shapes built here from literals without plotly's validation of each: two bands per phase
    on each of a fleet report's lanes (4,300 shapes on 8 lanes) were half of building those figures.
    The figure's JSON is the same as update_layout(shapes=...) gives."""
    if not shapes:
        return
    existing = [s.to_plotly_json() for s in figure.layout.shapes]
    figure.layout._validate = False
    try:
        figure.layout.shapes = existing + shapes
    finally:
        figure.layout._validate = True
