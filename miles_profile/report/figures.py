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
        Each memory plot marks its highest peak ("peak X GiB · phase P · iteration i"); its y axis is
        fitted to the data, with the device (host) total as a dashed line when within 2x of the data,
        else named in the plot's title; host available has a small plot of its own. The x axis spans
        time_range(run) (or t_range): the ledger-over-time figure uses the same range.
        Phase bars are at least MIN_BAR_PX wide at the default width; hover gives each phase's peaks.
    time_range(run) -> (0.0, seconds)   # the x range of a run's whole timeline
    comparison_figure(runs, *, max_points=100_000) -> go.Figure   (in compare.py)
    PHASE_COLORS, phase_color(name) -> str   (phase_style.py: palette, families, loop order)

Plotly is imported only here and in html/export/compare: the recorder never needs it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from miles_profile.runmodel import timeline_marks as marks
from miles_profile.report.phase_style import PHASE_COLORS, iteration_text, loop_sorted, phase_color, text_color  # noqa: F401
from miles_profile.runmodel.reduce import phase_ranges, reduce_series, thin_bars
from miles_profile.runmodel.series import SPARSE_SUFFIXES
from miles_profile.runmodel.series import (
    GiB, Series, first_and_last_t, has_column, main_pid, series_arrays, timeline_series,
)

_LINE = {  # kind -> (color, dash, width)
    "used": ("#1f1f1f", "solid", 1.5), "proc": ("#7f7f7f", "dot", 1.2), "reserved": ("#2ca02c", "solid", 1.2),
    "alloc": ("#1f77b4", "solid", 1.2), "alloc_peak": ("#d62728", "solid", 1.0),
    "rss": ("#1f77b4", "solid", 1.4), "rss_peak": ("#d62728", "solid", 1.0),
    "host_available": ("#2ca02c", "solid", 1.2), "pinned": ("#9467bd", "solid", 1.0), "disk": ("#8c564b", "dot", 1.2),
}
# A 10-million-sample run has 7,000 phases. Chromium spends about 0.5 s laying out 7,000 bars (2.7 s with
# their names) on every paint, though at that density a thousand land on one pixel column.
PHASE_BARS_MAX = 600  # bars per lane: about one per two pixel columns; a narrower window keeps more
NAMED_BARS_MAX = 400  # past this many bars their names are unreadable anyway: not even laid out
SHADED_PHASES_MAX = 400  # top-level phases in view shaded behind the memory plots up to this many
_LANE_WIDTH_PX = 1000  # the plot width names are fitted to (a page's width is not known here)


def run_start(run) -> float:
    """Time zero of the run's plots: its meta start time, else its first sample or event."""
    start = run.meta.get("start_time")
    candidates = [float(start)] if isinstance(start, (int, float)) and np.isfinite(start) else []
    if (span := first_and_last_t(run)) is not None:
        candidates.append(span[0])
    if len(run.phases):
        candidates.append(float(run.phases["start"].min()))
    return min(candidates) if candidates else 0.0


AVAILABLE = "available"  # host available: a scale of its own, in a small plot under the host's
MIN_BAR_PX = 4  # the narrowest phase bar at the default width: a 5 ms offload stays visible and hoverable
_ROW_PX = {AVAILABLE: 110}  # plot heights in pixels; other plots 300
_GAP_PX = 60
# The legend's room on the right, fixed: a legend that sized the margin would give the timeline and
# the ledger over time (its own legend) different plot widths, and their seconds would not line up.
LEGEND_PX = 290


def _group_of(s: Series) -> str:
    return AVAILABLE if s.kind == "host_available" else s.group


def _groups(series: list[Series]) -> list[str]:
    return list(dict.fromkeys(_group_of(s) for s in series))


def _group_title(group: str, run) -> str:
    if group == "host":
        return "Host memory (GiB)"
    if group == AVAILABLE:
        return "Host available (GiB)"
    index = int(group[3:])
    device = next((d for d in run.devices if int(d.get("index", -1)) == index), {})
    name = device.get("name", "")
    return f"GPU {index}{' ' + name if name else ''} (GiB)"


def _group_total(group: str, run) -> tuple[float | None, str]:
    if group == "host":
        return marks.host_total(run), "host total"
    if group.startswith("gpu"):
        return marks.device_total(run, int(group[3:])), "device total"
    return None, ""


def time_range(run) -> tuple[float, float]:
    """(0, seconds) from the run's start to its last sample or phase end: the x range of its timeline
    and of its ledger over time, so the two line up."""
    t0 = run_start(run)
    ends = [span[1]] if (span := first_and_last_t(run)) is not None else []
    if len(run.phases) and np.isfinite(run.phases["end"].to_numpy(float)).any():
        ends.append(float(np.nanmax(run.phases["end"].to_numpy(float))))
    end = max(ends) - t0 if ends else 0.0
    return 0.0, end if end > 0 else 1.0


def _budget(series: list[Series], n_phases: int, max_points: int) -> int:
    # Each series also keeps one point per phase (its peak) and a few gap markers.
    per = max_points // max(1, len(series)) - n_phases
    return max(200, per)


def _is_outside(run, pid: int) -> bool:
    return any(p.get("pid") == pid and p.get("role") == "exec_parent" for p in run.processes)


def _reduced_trace(run, s: Series, t0: float, t_range, n_out: int, phase_bounds,
                   outside: bool = False) -> tuple[go.Scatter, np.ndarray, np.ndarray]:
    """The series reduced for drawing, and its drawn points: (trace, x seconds, y bytes)."""
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
    ), x, yy


def _in_view(phases: pd.DataFrame, t0: float, t_range) -> pd.DataFrame:
    if t_range is None:
        return phases
    return phases[(phases["end"] >= t0 + t_range[0]) & (phases["start"] <= t0 + t_range[1])]


def _lane_labels(phases: pd.DataFrame, many_pids: bool) -> list[str]:
    """Each phase's lane: its nesting depth, and its process when the run has several."""
    pids = [f"pid {p} · " if many_pids else "" for p in phases["pid"]]
    return [f"{pid}{'phases' if d == 0 else f'nested {d}'}" for pid, d in zip(pids, phases["depth"])]


def _judged_columns(run, series: list[Series], pid: int) -> list[tuple[str, int, str, str]]:
    """Per memory plot, the series a phase's hover quotes: (title, pid, column, peak column or "").
    The phase's own process where it has the series, else the plot's first owner."""
    rows = []
    for group in (g for g in _groups(series) if g != AVAILABLE):
        mine = [s for s in series if s.group == group and s.kind in ("alloc", "reserved", "proc", "used", "rss")]
        mine.sort(key=lambda s: (("alloc", "reserved", "proc", "used", "rss").index(s.kind), s.pid != pid))
        if not mine:
            continue
        s = mine[0]
        peak = f"{s.column}_peak" if has_column(run, f"{s.column}_peak") else ""
        what = "host RSS" if group == "host" else f"GPU {group[3:]} {dict(alloc='allocated').get(s.kind, s.kind)}"
        rows.append((what, s.pid, s.column, peak))
    return rows


def _hover_texts(run, phases: pd.DataFrame, series: list[Series], t0: float) -> list[str]:
    """Each phase's name, times, iteration and its peak on every memory plot (exact, not reduced)."""
    peaks = pd.Series("", index=phases.index, dtype=object)
    for pid, group in phases.groupby("pid", sort=False):
        peaks[group.index] = marks.phase_peak_lines(run, group, _judged_columns(run, series, int(pid)))
    return [f"<b>{name}</b> · iteration {iteration_text(it)}<br>{s - t0:.3f} s → {e - t0:.3f} s "
            f"({max(e - s, 0):.3f} s)" + (f"<br>{pk}" if pk else "") + ("" if st == "ok" else f"<br>status: {st}")
            for name, it, s, e, st, pk in zip(phases["name"], phases["iteration"], phases["start"],
                                              phases["end"], phases["status"], peaks)]


def _lane_traces(run, series: list[Series], t0: float, x_range: tuple[float, float], t_range, max_bars: int,
                 line_px: float) -> list[go.Scatter]:
    """The phase lane: each phase a thick line segment on its lane (start, middle, end, gap).

    Segments, not go.Bar: Plotly recomputes every bar trace on each x-range change (0.2 s for 600 bars
    in Chromium, on every zoom), while line segments only move. Hover finds the nearest point, so
    each segment carries its text at both ends and in the middle. Names go where they fit; a phase
    too short to see is drawn MIN_BAR_PX wide (its hover gives its true duration)."""
    phases = _in_view(marks.with_iterations(run.phases), t0, t_range)
    if phases.empty:
        return []
    phases = phases.assign(_lane=_lane_labels(phases, many_pids=run.phases["pid"].nunique() > 1))
    span = max(x_range[1] - x_range[0], 1e-9)
    min_width = span * MIN_BAR_PX / _LANE_WIDTH_PX
    kept = thin_bars(phases["start"].to_numpy(float), phases["end"].to_numpy(float),
                     pd.factorize(phases["_lane"])[0], pd.factorize(phases["name"])[0], max_bars)
    phases = phases.iloc[kept]
    phases = phases.assign(_hover=_hover_texts(run, phases, series, t0))
    named = len(phases) <= NAMED_BARS_MAX
    traces = []
    for name in loop_sorted(phases["name"]):
        group = phases[phases["name"].astype(str) == name]
        shown = np.maximum(np.maximum(group["duration"].to_numpy(float), 0.0), min_width)
        start = group["start"].to_numpy(float) - t0
        n = len(group)
        x = np.column_stack([start, start + shown / 2, start + shown, np.full(n, np.nan)]).ravel()
        y = np.repeat(group["_lane"].to_numpy(object), 4)
        y[3::4] = None
        hovertext = np.repeat(group["_hover"].to_numpy(object), 4)
        hovertext[3::4] = None
        color = phase_color(name)
        traces.append(go.Scatter(
            x=x, y=y, mode="lines", name=name, line=dict(color=color, width=line_px),
            connectgaps=False, hovertext=hovertext, hoverinfo="text", legendgroup="phases",
            legendgrouptitle_text="phases", showlegend=True,
        ))
        fits = shown / span * _LANE_WIDTH_PX >= 7 * len(name) + 8  # about 7 px a letter at 11 px
        if named and fits.any():  # names in a trace of their own: Plotly culls text on line points
            traces.append(go.Scatter(
                x=(start + shown / 2)[fits], y=group["_lane"].to_numpy(object)[fits], mode="text",
                text=[name] * int(fits.sum()), textposition="middle center",
                textfont=dict(color=text_color(color), size=11), hoverinfo="skip", legendgroup="phases",
                showlegend=False, name=name,
            ))
    return traces


def _layout_px(groups: list[str], n_lanes: int, has_phases: bool, height: int | None) -> tuple[int, list[float], float]:
    """(figure height, row height shares, vertical spacing) from plot heights in pixels."""
    rows_px = [_ROW_PX.get(g, 300) for g in groups] + ([50 + 28 * n_lanes] if has_phases else [])
    gaps = _GAP_PX * (len(rows_px) - 1)
    total = height or int(sum(rows_px) + gaps + 100)
    inner = max(1.0, total - 100.0)
    spacing = min(0.3, _GAP_PX / inner) if len(rows_px) > 1 else 0.02
    return total, [px / sum(rows_px) for px in rows_px], spacing


def _memory_row(fig: go.Figure, run, row: int, group: str, traces_xy: list, t0: float) -> tuple[list, list]:
    """Fit the row's y axis to its data; the total as a dashed line (or in the title); the highest
    peak marked and labelled. Returns (shapes, annotations)."""
    xref, yref = _row_axes(fig, row)[-1]
    data_max = max((float(np.nanmax(y)) for _, _, y in traces_xy if np.isfinite(y).any()), default=0.0)
    total, what = _group_total(group, run)
    top, shown = marks.fitted_range(data_max, total)
    fig.update_yaxes(range=[0, top / GiB], autorange=False, title_text="GiB", row=row, col=1)
    shapes, notes = [], []
    data_ref = yref.replace(" domain", "")
    if shown is not None:
        shapes.append(dict(type="line", xref=f"{xref} domain", x0=0, x1=1, yref=data_ref, y0=shown / GiB,
                           y1=shown / GiB, line=dict(color="#c62828", dash="dash", width=1.2)))
        notes.append(dict(text=f"{what} {shown / GiB:.1f} GiB", xref=f"{xref} domain", x=1, xanchor="right",
                          yref=data_ref, y=shown / GiB, yanchor="bottom", showarrow=False,
                          font=dict(size=10, color="#c62828")))
    elif total is not None:
        title = fig.layout.annotations[row - 1]
        title.text = f"{title.text} · {what} {total / GiB:.1f} GiB (above the plotted range)"
    if group == AVAILABLE:
        return shapes, notes
    peak = marks.highest_peak(traces_xy, run, t0)
    if peak is not None:
        fig.add_trace(go.Scatter(x=[peak.x], y=[peak.y / GiB], mode="markers", name="highest peak",
                                 marker=dict(symbol="diamond", size=11, color="#111111", line=dict(color="white", width=1)),
                                 hovertext=[f"{peak.label}<br>{peak.series}"], hoverinfo="text", showlegend=False),
                      row=row, col=1)
        lo, hi = fig.layout[xref.replace("x", "xaxis")].range or (0, 1)
        right = peak.x > lo + 0.6 * (hi - lo)
        notes.append(dict(text=peak.label, x=peak.x, y=peak.y / GiB, xref=xref, yref=data_ref, showarrow=True,
                          arrowhead=2, arrowsize=1, ax=-40 if right else 40, ay=22,
                          xanchor="right" if right else "left", bgcolor="rgba(255,255,255,0.85)",
                          bordercolor="#111111", borderwidth=1, font=dict(size=11, color="#111111")))
    return shapes, notes


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
    total_height, shares, spacing = _layout_px(groups, n_lanes, has_phases, height)
    fig = make_subplots(
        rows=rows, cols=1, shared_xaxes=True, vertical_spacing=spacing, row_heights=shares,
        subplot_titles=[_group_title(g, run) for g in groups] + (["Phases"] if has_phases else []),
    )
    x_range = tuple(t_range) if t_range is not None else time_range(run)
    fig.update_xaxes(range=list(x_range), autorange=False)
    bounds = None
    if has_phases and phase_peaks:
        bounds = (run.phases["start"].to_numpy(float), run.phases["end"].to_numpy(float))
    n_out = _budget(series, len(run.phases) if bounds is not None else 0, max_points)
    shapes, notes = [], []
    for row, group in enumerate(groups, start=1):
        drawn = []
        for s in (s for s in series if _group_of(s) == group):
            trace, x, y = _reduced_trace(run, s, t0, t_range, n_out, bounds, outside=_is_outside(run, s.pid))
            fig.add_trace(trace, row=row, col=1)
            drawn.append((s.label, x, y))
        more_shapes, more_notes = _memory_row(fig, run, row, group, drawn, t0)
        shapes += more_shapes
        notes += more_notes
    if has_phases:
        lane_px = shares[-1] * (total_height - 100) / max(1, n_lanes)  # one lane's height in pixels
        for trace in _lane_traces(run, series, t0, x_range, t_range, max_phase_bars, line_px=max(6.0, 0.6 * lane_px)):
            fig.add_trace(trace, row=rows, col=1)
        fig.update_yaxes(autorange="reversed", row=rows, col=1, fixedrange=True)
    memory_rows = len([g for g in groups if g != AVAILABLE])
    # Shapes are set at once: plotly's add_vrect/add_vline per shape cost quadratic time (400 bands: 50 s).
    bands = _phase_bands(fig, run, t0, t_range, len(groups)) if has_phases else []
    lines, mark_notes = _marks(fig, run, t0, memory_rows)
    fig.update_layout(shapes=bands + lines + shapes, annotations=list(fig.layout.annotations) + mark_notes + notes)
    fig.update_xaxes(title_text="seconds since the run started", row=rows, col=1)
    # Fixed margins, sized here, instead of Plotly's automargin: automargin measures and re-lays out
    # every axis on each redraw, half of a zoom's redraw in Chromium (72 -> 38 ms for a relayout).
    # Sized for every lane of the run, not the window's: the plot must not shift sideways on a zoom.
    fig.update_xaxes(automargin=False)
    fig.update_yaxes(automargin=False)
    fig.update_layout(
        height=total_height, hovermode="closest", template="plotly_white",
        margin=dict(l=left_margin(run), r=LEGEND_PX, t=50, b=50),
        legend=dict(groupclick="toggleitem", tracegroupgap=12, x=1.01, xanchor="left"),
    )
    return fig


def left_margin(run) -> int:
    """The timeline's left margin in pixels (its lane names): the ledger over time uses it too."""
    if run.phases.empty:
        return 70
    lanes = run.phases.drop_duplicates(["pid", "depth"])
    return max(70, 7 * max(map(len, _lane_labels(lanes, many_pids=lanes["pid"].nunique() > 1))) + 24)


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
                 fillcolor=phase_color(str(name)), opacity=0.18, line_width=0, layer="below")
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
        # Inside the plot, along its line: above the plot they were drawn over the subplot's title,
        # and a mark per step overlapped its neighbours.
        notes.append(dict(x=float(t) - t0, y=1.0, xref=refs[0][0], yref=refs[0][1], showarrow=False,
                          text=f"{kind}: {name}" if bad else str(name), yanchor="top", xanchor="right",
                          textangle=-90, bgcolor="rgba(255,255,255,0.7)", font=dict(size=10, color=color)))
    return lines, notes
