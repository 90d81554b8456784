"""Plotly figure builders, shared by the static report and the Dash dashboard (neither builds its own).

Public API (stable):

    timeline_figure(run, *, max_points=100_000, t_range=None, height=None,
                    max_phase_bars=PHASE_BARS_MAX, phase_peaks=True) -> go.Figure
        One subplot per GPU (NVML used, allocator reserved/allocated, true-peak envelope), one for
        the host (RSS, its true-peak envelope, available, pinned, offload files on disk) and a phase
        lane under them whose bars are named (labels show where they fit; zoom in for more).
        x is seconds since the run started; y is GiB (bytes / 1024**3, exact); hover shows GiB.
        At most about `max_points` points in all, reduced by reduce.reduce_series so the global
        peak and every phase's peak are drawn exactly. `t_range=(t0, t1)` (seconds since start)
        draws only that window, at full budget: the dashboard calls it again on zoom.
        `phase_peaks=False` keeps only the min/max envelope: for a viewer that re-reduces on every
        zoom (the dashboard), where a budget of a few points per pixel already draws each bucket's
        maximum and thousands of phase peaks per trace would only slow every redraw.
        The lane holds about `max_phase_bars` bars per lane (reduce.thin_bars: the longest of each
        phase name per time bucket), named only when at most NAMED_BARS_MAX are drawn; the top-level
        phases in view are shaded behind the memory plots when at most SHADED_PHASES_MAX are in view.
    comparison_figure(runs, *, max_points=100_000) -> go.Figure   (in compare.py)
    PHASE_COLORS, phase_color(name) -> str

Plotly is imported only here and in html/export/compare: the recorder never needs it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from miles_profile.report.reduce import phase_ranges, reduce_series, thin_bars
from miles_profile.report.series import SPARSE_SUFFIXES
from miles_profile.report.series import GiB, Series, main_pid, series_arrays, timeline_series

PHASE_COLORS = {
    "generate": "#4C78A8", "offload_rollout": "#F58518", "offload_kv": "#F58518", "offload_weights": "#E45756",
    "onload_weights": "#72B7B2", "onload_kv": "#54A24B", "train": "#B279A2", "offload_train": "#FF9DA6",
    "onload_train": "#9D755D", "update_weights": "#EECA3B", "clear_memory": "#BAB0AC", "eval": "#79706E",
}
_EXTRA = ("#8CD17D", "#B6992D", "#499894", "#D37295", "#FABFD2", "#A0CBE8", "#FFBE7D", "#D4A6C8")
_LINE = {  # kind -> (color, dash, width)
    "used": ("#1f1f1f", "solid", 1.5), "proc": ("#7f7f7f", "dot", 1.2), "reserved": ("#2ca02c", "solid", 1.2),
    "alloc": ("#1f77b4", "solid", 1.2), "alloc_peak": ("#d62728", "solid", 1.0),
    "rss": ("#1f77b4", "solid", 1.4), "rss_peak": ("#d62728", "solid", 1.0),
    "host_available": ("#2ca02c", "dash", 1.2), "pinned": ("#9467bd", "solid", 1.0), "disk": ("#8c564b", "dot", 1.2),
}
# A 10-million-sample run has 7,000 phases. Chromium spends about 0.5 s laying out 7,000 bars (2.7 s with
# their names) on every paint, though at that density a thousand land on one pixel column.
PHASE_BARS_MAX = 600  # bars per lane: about one per two pixel columns; a narrower window keeps more
NAMED_BARS_MAX = 400  # past this many bars their names are unreadable anyway: not even laid out
SHADED_PHASES_MAX = 400  # top-level phases in view shaded behind the memory plots up to this many
_LANE_WIDTH_PX = 1000  # the plot width names are fitted to (a page's width is not known here)


def phase_color(name: str) -> str:
    if name in PHASE_COLORS:
        return PHASE_COLORS[name]
    return _EXTRA[sum(map(ord, name)) % len(_EXTRA)]


def run_start(run) -> float:
    """Time zero of the run's plots: its meta start time, else its first sample or event."""
    start = run.meta.get("start_time")
    candidates = [float(start)] if isinstance(start, (int, float)) and np.isfinite(start) else []
    if len(run.samples):
        candidates.append(float(run.samples["t"].iloc[0]))
    if len(run.phases):
        candidates.append(float(run.phases["start"].min()))
    return min(candidates) if candidates else 0.0


def _groups(series: list[Series]) -> list[str]:
    return list(dict.fromkeys(s.group for s in series))


def _group_title(group: str, run) -> str:
    if group == "host":
        return "Host memory (GiB)"
    index = int(group[3:])
    device = next((d for d in run.devices if int(d.get("index", -1)) == index), {})
    name = device.get("name", "")
    total = device.get("total")
    total_text = f", {total / GiB:.1f} GiB total" if isinstance(total, (int, float)) else ""
    return f"GPU {index}{' ' + name if name else ''}{total_text} (GiB)"


def _budget(series: list[Series], n_phases: int, max_points: int) -> int:
    # Each series also keeps one point per phase (its peak) and a few gap markers.
    per = max_points // max(1, len(series)) - n_phases
    return max(200, per)


def _is_outside(run, pid: int) -> bool:
    return any(p.get("pid") == pid and p.get("role") == "exec_parent" for p in run.processes)


def _reduced_trace(run, s: Series, t0: float, t_range, n_out: int, phase_bounds, outside: bool = False) -> go.Scatter:
    t, y = series_arrays(run, s.pid, s.column)
    if t_range is not None:  # the window first: a zoom copies only what it shows
        a, b = np.searchsorted(t, t0 + t_range[0], "left"), np.searchsorted(t, t0 + t_range[1], "right")
        t, y = t[a:b], y[a:b]
    if s.column.endswith(SPARSE_SUFFIXES):
        read = np.isfinite(y)
        if not read.all():  # a copy of the (windowed) series only when something is left out
            t, y = t[read], y[read]
    ranges = phase_ranges(t, *phase_bounds) if phase_bounds is not None else None
    keep = reduce_series(t, y, n_out, ranges)
    x = t[keep] - t0
    yy = y[keep]
    color, dash, width = _LINE.get(s.kind, ("#333333", "solid", 1.0))
    if outside:  # the whole process tree, sampled from outside: same colour, lighter and dashed
        dash, width = "dash", width * 0.9
        color = {"#1f77b4": "#7fb2dc", "#d62728": "#ec9a9a"}.get(color, color)
    return go.Scatter(
        x=x, y=yy / GiB, name=s.label, mode="lines",
        # A true peak covers the time since the previous sample: draw it over that interval (vh).
        line=dict(color=color, dash=dash, width=width, shape="vh" if s.kind.endswith("peak") else "linear"),
        connectgaps=False, legendgroup=s.group,
        hovertemplate="%{y:.4f} GiB<extra>" + s.label + "</extra>",
    )


def _in_view(phases: pd.DataFrame, t0: float, t_range) -> pd.DataFrame:
    if t_range is None:
        return phases
    return phases[(phases["end"] >= t0 + t_range[0]) & (phases["start"] <= t0 + t_range[1])]


def _lane_labels(phases: pd.DataFrame, many_pids: bool) -> list[str]:
    """Each phase's lane: its nesting depth, and its process when the run has several."""
    pids = [f"pid {p} · " if many_pids else "" for p in phases["pid"]]
    return [f"{pid}{'phases' if d == 0 else f'nested {d}'}" for pid, d in zip(pids, phases["depth"])]


def _lane_traces(run, t0: float, t_range, max_bars: int, line_px: float) -> list[go.Scatter]:
    """The phase lane: each phase a thick line segment on its lane (start, middle, end, gap).

    Segments, not go.Bar: Plotly recomputes every bar trace on each x-range change (0.2 s for 600 bars
    in Chromium, on every zoom), while line segments only move. Hover finds the nearest point, so
    each segment carries its text at both ends and in the middle. Names go where they fit."""
    phases = _in_view(run.phases, t0, t_range)
    if phases.empty:
        return []
    phases = phases.assign(_lane=_lane_labels(phases, many_pids=run.phases["pid"].nunique() > 1))
    lo = float(phases["start"].min()) if t_range is None else t0 + t_range[0]
    hi = float(phases["end"].max()) if t_range is None else t0 + t_range[1]
    span = max(hi - lo, 1e-9)
    min_width = span * 0.003  # a 1 ms offload still shows as a sliver; hover gives its true duration
    kept = thin_bars(phases["start"].to_numpy(float), phases["end"].to_numpy(float),
                     pd.factorize(phases["_lane"])[0], pd.factorize(phases["name"])[0], max_bars)
    phases = phases.iloc[kept]
    named = len(phases) <= NAMED_BARS_MAX
    traces = []
    for name, group in phases.groupby("name", sort=False):
        duration = np.maximum(group["duration"].to_numpy(float), 1e-9)
        shown = np.maximum(duration, min_width)
        start = group["start"].to_numpy(float) - t0
        iteration = group["rollout_id"] if "rollout_id" in group else None
        hover = [f"{name}<br>{s - t0:.3f} s → {e - t0:.3f} s ({d:.3f} s)" +
                 (f"<br>rollout {int(i)}" if iteration is not None and np.isfinite(i) else "") +
                 ("" if st == "ok" else f"<br>status: {st}")
                 for s, e, d, st, i in zip(group["start"], group["end"], duration, group["status"],
                                           iteration if iteration is not None else [np.nan] * len(group))]
        n = len(group)
        x = np.column_stack([start, start + shown / 2, start + shown, np.full(n, np.nan)]).ravel()
        y = np.repeat(group["_lane"].to_numpy(object), 4)
        y[3::4] = None
        hovertext = np.repeat(np.array(hover, dtype=object), 4)
        hovertext[3::4] = None
        traces.append(go.Scatter(
            x=x, y=y, mode="lines", name=str(name), line=dict(color=phase_color(str(name)), width=line_px),
            connectgaps=False, hovertext=hovertext, hoverinfo="text", legendgroup="phases",
            legendgrouptitle_text="phases", showlegend=True,
        ))
        fits = shown / span * _LANE_WIDTH_PX >= 7 * len(str(name)) + 8  # about 7 px a letter at 11 px
        if named and fits.any():  # names in a trace of their own: Plotly culls text on line points
            traces.append(go.Scatter(
                x=(start + shown / 2)[fits], y=group["_lane"].to_numpy(object)[fits], mode="text",
                text=[str(name)] * int(fits.sum()), textposition="middle center",
                textfont=dict(color="white", size=11), hoverinfo="skip", legendgroup="phases",
                showlegend=False, name=str(name),
            ))
    return traces


def timeline_figure(run, *, max_points: int = 100_000, t_range: tuple[float, float] | None = None,
                    height: int | None = None, max_phase_bars: int = PHASE_BARS_MAX,
                    phase_peaks: bool = True) -> go.Figure:
    series = timeline_series(run)
    groups = _groups(series)
    t0 = run_start(run)
    has_phases = not run.phases.empty
    rows = len(groups) + (1 if has_phases else 0)
    if rows == 0:
        fig = go.Figure()
        fig.update_layout(title="no samples and no phases to plot")
        return fig
    n_lanes = run.phases[["pid", "depth"]].drop_duplicates().shape[0] if has_phases else 0
    lane_share = min(0.3, 0.06 + 0.04 * n_lanes) if has_phases else 0
    memory_share = (1 - lane_share) / max(1, len(groups))
    specs = [[{"secondary_y": g == "host"}] for g in groups] + ([[{}]] if has_phases else [])
    fig = make_subplots(
        rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06 if rows > 1 else 0.02, specs=specs,
        subplot_titles=[_group_title(g, run) for g in groups] + (["Phases"] if has_phases else []),
        row_heights=[memory_share] * len(groups) + ([lane_share] if has_phases else []),
    )
    bounds = None
    if has_phases and phase_peaks:
        bounds = (run.phases["start"].to_numpy(float), run.phases["end"].to_numpy(float))
    n_out = _budget(series, len(run.phases) if bounds is not None else 0, max_points)
    for row, group in enumerate(groups, start=1):
        for s in (s for s in series if s.group == group):
            trace = _reduced_trace(run, s, t0, t_range, n_out, bounds, outside=_is_outside(run, s.pid))
            if group == "host":  # available memory is a different scale: its own axis on the right
                fig.add_trace(trace, row=row, col=1, secondary_y=s.kind == "host_available")
            else:
                fig.add_trace(trace, row=row, col=1)
        fig.update_yaxes(title_text="GiB", rangemode="tozero", row=row, col=1)
        if group == "host" and any(s.kind == "host_available" for s in series):
            fig.update_yaxes(title_text="available GiB", rangemode="tozero", showgrid=False,
                             title_font=dict(color=_LINE["host_available"][0]),
                             tickfont=dict(color=_LINE["host_available"][0]), row=row, col=1, secondary_y=True)
    total_height = height or (330 * len(groups) + (140 + 30 * n_lanes if has_phases else 0) + 80)
    if has_phases:
        lane_px = lane_share * (total_height - 100) / max(1, n_lanes)  # one lane's height in pixels
        for trace in _lane_traces(run, t0, t_range, max_phase_bars, line_px=max(4.0, 0.6 * lane_px)):
            fig.add_trace(trace, row=rows, col=1)
        fig.update_yaxes(autorange="reversed", row=rows, col=1, fixedrange=True)
    # Shapes are set at once: plotly's add_vrect/add_vline per shape cost quadratic time (400 bands: 50 s).
    bands = _phase_bands(fig, run, t0, t_range, len(groups)) if has_phases else []
    lines, notes = _marks(fig, run, t0, len(groups))
    fig.update_layout(shapes=bands + lines, annotations=list(fig.layout.annotations) + notes)
    fig.update_xaxes(title_text="seconds since the run started", row=rows, col=1)
    # Fixed margins, sized here, instead of Plotly's automargin: automargin measures and re-lays out
    # every axis on each redraw, half of a zoom's redraw in Chromium (72 -> 38 ms for a relayout).
    # Sized for every lane of the run, not the window's: the plot must not shift sideways on a zoom.
    longest = 0
    if has_phases:
        lanes = run.phases.drop_duplicates(["pid", "depth"])
        longest = max(map(len, _lane_labels(lanes, many_pids=lanes["pid"].nunique() > 1)))
    right_axis = any(s.kind == "host_available" for s in series)
    fig.update_xaxes(automargin=False)
    fig.update_yaxes(automargin=False)
    fig.update_layout(
        height=total_height,
        hovermode="closest", template="plotly_white",
        margin=dict(l=max(70, 7 * longest + 24), r=65 if right_axis else 20, t=50, b=50),
        legend=dict(groupclick="toggleitem", tracegroupgap=12),
    )
    return fig


def _row_axes(fig: go.Figure, rows: int) -> list[tuple[str, str]]:
    """(xref, yref) of the primary axes of rows 1..rows, for shapes spanning each row's height."""
    refs = []
    for row in range(1, rows + 1):
        subplot = fig.get_subplot(row, 1)
        refs.append((subplot.xaxis.plotly_name.replace("axis", ""),
                     subplot.yaxis.plotly_name.replace("axis", "") + " domain"))
    return refs


def _phase_bands(fig: go.Figure, run, t0: float, t_range, memory_rows: int) -> list[dict]:
    """Light bands behind the memory plots for the top-level phases of the main process in view.

    Decided by the phases in view, not the run's count: a zoom into a long run shows its bands."""
    pid = main_pid(run)
    top = _in_view(run.phases[(run.phases["depth"] == 0) & (run.phases["pid"] == pid)], t0, t_range)
    if memory_rows == 0 or len(top) > SHADED_PHASES_MAX:
        return []
    return [dict(type="rect", xref=xref, yref=yref, x0=start - t0, x1=end - t0, y0=0, y1=1,
                 fillcolor=phase_color(str(name)), opacity=0.10, line_width=0, layer="below")
            for start, end, name in zip(top["start"], top["end"], top["name"])
            for xref, yref in _row_axes(fig, memory_rows)]


MARK_LIMIT = 60


def _marks(fig: go.Figure, run, t0: float, memory_rows: int) -> tuple[list[dict], list[dict]]:
    """Marks, errors and OOMs as vertical lines across the memory plots (OOM and errors in red):
    (shapes, annotations)."""
    events = run.events
    if memory_rows == 0 or events.empty:
        return [], []
    marks = events[~events["kind"].isin(["begin", "end", "account"])]  # declarations are the ledger's, not marks
    severe = marks[marks["kind"].isin(["oom", "error"])]
    marks = pd.concat([severe, marks[~marks.index.isin(severe.index)]]).head(MARK_LIMIT)
    refs = _row_axes(fig, memory_rows)
    lines, notes = [], []
    for t, kind, name in zip(marks["t"], marks["kind"], marks["name"]):
        bad = kind in ("oom", "error")
        color = "#c62828" if bad else "#555555"
        lines += [dict(type="line", xref=xref, yref=yref, x0=float(t) - t0, x1=float(t) - t0, y0=0, y1=1,
                       line=dict(color=color, width=1.5 if bad else 1, dash="solid" if bad else "dot"))
                  for xref, yref in refs]
        notes.append(dict(x=float(t) - t0, y=1.0, xref=refs[0][0], yref=refs[0][1], showarrow=False,
                          text=f"{kind}: {name}" if bad else str(name), yanchor="bottom",
                          font=dict(size=10, color=color)))
    return lines, notes
