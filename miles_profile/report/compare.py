"""Several runs side by side, aligned by phase (iteration k, phase p) rather than by wall clock.

Each top-level phase instance of a run's main process gets a slot keyed by (iteration, phase name,
occurrence within the iteration); slots are ordered by iteration, then by when each phase first
appeared. A sample at time t inside slot j is drawn at x = j + (t - start) / (end - start), so the
same phase of every run lines up, whatever its duration.

Public API (stable; shared with the Dash dashboard):

    slot_keys(run) -> DataFrame            # start, end, key per top-level phase of the main process
    phase_peak_comparison(runs) -> DataFrame
        # one row per (iteration, phase); per run "<run>: device peak" and "<run>: host peak" (bytes)
    comparison_figure(runs, *, max_points=100_000) -> go.Figure
    comparison_html(runs, *, max_points=100_000) -> str   # figure + peak table, for the report
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from miles_profile.report.figures import phase_color
from miles_profile.report.reduce import phase_ranges, reduce_series
from miles_profile.report.series import GiB, device_track, host_track, main_pid
from miles_profile.report.stats import phase_instances, range_stats

_RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def iteration_label(iteration) -> str:
    """Phases before the first rollout_id (iteration -1) are the run's setup."""
    return "setup" if int(iteration) < 0 else str(int(iteration))


def slot_keys(run) -> pd.DataFrame:
    inst = phase_instances(run)
    pid = main_pid(run)
    top = inst[(inst["depth"] == 0) & (inst["pid"] == pid)].sort_values("start").reset_index(drop=True)
    occurrence = top.groupby(["iteration", "name"]).cumcount()
    top = top.assign(occurrence=occurrence.to_numpy())
    top["key"] = list(zip(top["iteration"], top["name"], top["occurrence"]))
    return top


def _slot_order(runs) -> list[tuple]:
    seen: dict[tuple, tuple] = {}
    for r, run in enumerate(runs):
        for pos, key in enumerate(slot_keys(run)["key"]):
            seen.setdefault(key, (key[0], pos, r))
    return sorted(seen, key=lambda k: seen[k])


def _run_names(runs) -> list[str]:
    parents = {run.path.parent.name for run in runs}
    names = [f"{run.path.parent.name}/{run.name}" if len(parents) > 1 else run.name for run in runs]
    return [n if names.count(n) == 1 else f"{n} ({k})" for k, n in enumerate(names)]


def _tracks(run):
    pid = main_pid(run)
    return {"device": device_track(run, pid), "host": host_track(run, pid)}


def phase_peak_comparison(runs) -> pd.DataFrame:
    order = _slot_order(runs)
    table = pd.DataFrame({"iteration": [k[0] for k in order], "phase": [k[1] for k in order]})
    names = _run_names(runs)
    for name, run in zip(names, runs):
        slots = slot_keys(run)
        position = {key: j for j, key in enumerate(order)}
        for kind, track in _tracks(run).items():
            values = np.full(len(order), np.nan)
            if track is not None and len(slots):
                i0, i1 = phase_ranges(track.t, slots["start"], slots["end"])
                peaks = range_stats(track.value, i0, i1, track.peak)[2]
                for key, peak in zip(slots["key"], peaks):
                    values[position[key]] = peak
            if np.isfinite(values).any():
                table[f"{name}: {kind} peak"] = pd.array(np.where(np.isfinite(values), np.round(values), np.nan),
                                                         dtype="Float64").astype("Int64")
    return table


def _aligned(track, slots, position) -> tuple[np.ndarray, np.ndarray]:
    """Samples in (start, end] of each slot at x = slot + fraction of it, each slot followed by a break
    (NaN) at its end: never a line across slots. Vectorised: 10,000 slots in a few milliseconds."""
    start, end = slots["start"].to_numpy(float), slots["end"].to_numpy(float)
    a, b = np.searchsorted(track.t, start, "right"), np.searchsorted(track.t, end, "right")
    full = b > a
    if not full.any():
        return np.empty(0), np.empty(0)
    a, b, start, end = a[full], b[full], start[full], end[full]
    slot = np.array([position[key] for key in slots["key"]], dtype=float)[full]
    count = b - a + 1  # the slot's samples and its break
    first = np.cumsum(count) - count  # where each slot's block starts in the output
    block = np.repeat(np.arange(len(count)), count)
    within = np.arange(len(block)) - first[block]
    is_break = within == count[block] - 1
    index = np.minimum(a[block] + within, len(track.t) - 1)
    span = np.maximum(end - start, 1e-9)[block]
    x = np.where(is_break, slot[block] + 1.0, slot[block] + np.clip((track.t[index] - start[block]) / span, 0, 1))
    y = np.where(is_break, np.nan, track.peak[index])
    return x, y


def band_traces(order: list[tuple], top: float) -> list[go.Scatter]:
    """A light band behind each phase slot, from 0 to `top` (GiB): one filled trace per phase name, its
    rectangles separated by gaps. One add_vrect per slot cost quadratic time in plotly (2 x 280 phases:
    86 s); traces per name keep the figure's size and build time linear in slots, its trace count
    bounded by the names."""
    corners: dict[str, list] = {}
    for j, key in enumerate(order):
        corners.setdefault(str(key[1]), []).append(j)
    traces = []
    for name, slots in corners.items():
        j = np.asarray(slots, dtype=float)[:, None]
        x = np.hstack([j, j, j + 1, j + 1, j, np.full_like(j, np.nan)]).ravel()
        y = np.tile([0.0, top, top, 0.0, 0.0, np.nan], len(slots))
        traces.append(go.Scatter(x=x, y=y, mode="lines", fill="toself", fillcolor=phase_color(name), opacity=0.10,
                                 line=dict(width=0), hoverinfo="skip", showlegend=False, name=name,
                                 legendgroup="phase bands"))
    return traces


def comparison_figure(runs, *, max_points: int = 100_000) -> go.Figure:
    order = _slot_order(runs)
    position = {key: j for j, key in enumerate(order)}
    kinds = [k for k in ("device", "host") if any(_tracks(run)[k] is not None for run in runs)]
    fig = make_subplots(rows=max(1, len(kinds)), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[f"{'GPU memory' if k == 'device' else 'host RSS'}: true peak (GiB)"
                                        for k in kinds])
    names = _run_names(runs)
    n_out = max(200, max_points // max(1, len(runs) * len(kinds)) - len(order))
    for row, kind in enumerate(kinds, start=1):
        lines = []
        for k, (name, run) in enumerate(zip(names, runs)):
            track = _tracks(run)[kind]
            if track is None:
                continue
            x, y = _aligned(track, slot_keys(run), position)
            if not len(x):
                continue
            sort = np.argsort(x, kind="stable")
            keep = reduce_series(np.arange(len(x), dtype=float), y[sort], n_out,
                                 (np.searchsorted(x[sort], np.arange(len(order)), "left"),
                                  np.searchsorted(x[sort], np.arange(1, len(order) + 1), "right")))
            xx, yy = x[sort][keep], y[sort][keep]
            # short phases hold a single sample: markers make them visible where the data is small
            mode = "lines+markers" if len(xx) <= 20_000 else "lines"
            lines.append(go.Scatter(x=xx, y=yy / GiB, mode=mode, marker=dict(size=3), name=name, legendgroup=name,
                                    showlegend=row == 1, connectgaps=False,
                                    line=dict(color=_RUN_COLORS[k % len(_RUN_COLORS)], width=1.4),
                                    hovertemplate="%{y:.4f} GiB<extra>" + html.escape(name) + "</extra>"))
        top = max((np.nanmax(t.y) for t in lines if np.isfinite(t.y).any()), default=1.0) * 1.05
        for trace in band_traces(order, top) + lines:  # bands first: drawn below the lines
            fig.add_trace(trace, row=row, col=1)
        fig.update_yaxes(title_text="GiB", rangemode="tozero", row=row, col=1)
    step = max(1, len(order) // 40)
    fig.update_xaxes(tickmode="array", tickvals=[j + 0.5 for j in range(0, len(order), step)],
                     ticktext=[f"{iteration_label(key[0])}:{key[1]}" for key in order[::step]], tickangle=-45,
                     row=max(1, len(kinds)), col=1)
    fig.update_layout(height=300 * max(1, len(kinds)) + 160, template="plotly_white", hovermode="closest",
                      margin=dict(l=70, r=20, t=50, b=120),
                      title="Runs aligned by (iteration : phase); each phase spans one unit")
    return fig


def comparison_html(runs, *, max_points: int = 100_000) -> str:
    fig = comparison_figure(runs, max_points=max_points)
    table = phase_peak_comparison(runs)
    value_columns = [c for c in table.columns if c not in ("iteration", "phase")]
    head = "<tr><th>iteration</th><th>phase</th>" + "".join(f"<th>{html.escape(c)} (GiB)</th>" for c in value_columns)
    rows = []
    for r in table.to_dict("records"):
        cells = [f'<td class="num">{iteration_label(r["iteration"])}</td><td>{html.escape(str(r["phase"]))}</td>']
        for c in value_columns:
            v = r[c]
            cells.append('<td class="num muted">–</td>' if v is None or pd.isna(v) else
                         f'<td class="num" title="{int(v):,} B">{int(v) / GiB:.3f}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    figure = fig.to_html(full_html=False, include_plotlyjs=False, div_id="comparison-figure",
                         config={"displaylogo": False, "responsive": True})
    return (f'<div class="figure">{figure}</div><h3>Peak of each phase, per run</h3>'
            f'<table id="comparison-table" class="data"><thead>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')
