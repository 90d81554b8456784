"""A Miles dashboard import's series that are not memory, as lanes of their own under the timeline: each
GPU's utilization and power, then one lane per SGLang engine metric (importers/miles_dashboard_series.py).
Shared by the HTML report and the dashboard.

    miles_series_figure(gpus, engines, t0, ...) -> go.Figure | None   # None: nothing to draw
    miles_series_html(run, suffix, align_to) -> str                   # the report's section ("" for our own logs)
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from miles_profile.importers.miles_dashboard_series import engine_series, gpu_series, is_miles, series_note
from miles_profile.report.figures import run_start
from miles_profile.report.ledger_html import alignment
from miles_profile.runmodel.reduce import reduce_series
from miles_profile.report.plotly_bundle import figure_div

LINES_MAX = 16  # past this many GPUs or engines a lane draws their median and range, not one line each
# Per line, extremes kept (reduce_series): at most 16 x 1,500 points a lane, which SVG draws (go.Scatter) as well
# as WebGL would, without a GL context or plotly.py's full bundle (report/plotly_bundle.py).
POINTS = 1_500
# Miles' scraper whitelist (sglang_scraper.py), in its order, with words for a person
METRIC_TEXT = {
    "num_running_reqs": "running requests", "num_queue_reqs": "queued requests",
    "gen_throughput": "generation throughput (tokens/s)", "token_usage": "KV cache token usage (share)",
    "cache_hit_rate": "prefix cache hit rate", "num_prefill_prealloc_queue_reqs": "prefill prealloc queue",
    "num_prefill_inflight_queue_reqs": "prefill in-flight queue", "num_decode_prealloc_queue_reqs":
    "decode prealloc queue", "num_decode_transfer_queue_reqs": "decode transfer queue",
    "kv_transfer_speed_gb_s": "KV transfer speed (GB/s)", "kv_transfer_latency_ms": "KV transfer latency (ms)",
}
_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


def _lanes(gpus: pd.DataFrame | None, engines: pd.DataFrame | None) -> list[tuple[str, pd.DataFrame]]:
    """(title, frame of t, who, value) per lane, in the order drawn."""
    lanes = []
    if gpus is not None and len(gpus):
        who = gpus["host"].astype(str) + ":gpu" + gpus["gpu"].astype(str)
        for column, title in (("util", "GPU utilization (%)"), ("power_w", "GPU power (W)")):
            part = pd.DataFrame({"t": gpus["t"], "who": who, "value": gpus[column]}).dropna()
            if len(part):
                lanes.append((title, part))
    if engines is not None and len(engines):
        known = list(METRIC_TEXT)
        metrics = sorted(engines["metric"].unique(), key=lambda m: (known.index(m) if m in known else len(known), m))
        for metric in metrics:
            part = engines[engines["metric"] == metric]
            who = part["engine"].str.replace(r"^https?://", "", regex=True)
            who = who.where(part["engine_type"] == "", who + " (" + part["engine_type"] + ")")
            lanes.append((f"SGLang: {METRIC_TEXT.get(metric, metric.replace('_', ' '))}",
                          pd.DataFrame({"t": part["t"], "who": who, "value": part["value"]})))
    return lanes


def _reduced(t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = reduce_series(t, y, POINTS) if len(t) > POINTS else np.arange(len(t))
    return t[keep], y[keep]


# Tableau 20: a GPU or an engine keeps its colour in every lane
_COLORS = ("#4E79A7", "#F28E2B", "#59A14F", "#E15759", "#76B7B2", "#EDC948", "#B07AA1", "#FF9DA7", "#9C755F",
           "#BAB0AC", "#A0CBE8", "#FFBE7D", "#8CD17D", "#B6992D", "#F1CE63", "#86BCB6", "#FABFD2", "#D37295")


def _lane_traces(part: pd.DataFrame, t0: float, lane: int, seen: set) -> list:
    """One line per GPU or engine (named in the legend once); past LINES_MAX, their median and
    min-max range per instant."""
    whos = sorted(part["who"].unique())
    if len(whos) <= LINES_MAX:
        traces = []
        for k, who in enumerate(whos):
            mine = part[part["who"] == who].sort_values("t", kind="stable")
            t, y = _reduced(mine["t"].to_numpy(float) - t0, mine["value"].to_numpy(float))
            traces.append(go.Scatter(x=t, y=y, mode="lines", name=who, legendgroup=who, showlegend=who not in seen,
                                       line=dict(width=1.4, color=_COLORS[k % len(_COLORS)]),
                                       hovertemplate=f"{html.escape(who)}: %{{y:.3g}}<extra></extra>"))
            seen.add(who)
        return traces
    stats = part.assign(t=part["t"].round(0)).groupby("t")["value"].agg(["min", "median", "max"])
    t = stats.index.to_numpy(float) - t0
    band = f"lane{lane}-range"
    return [go.Scatter(x=t, y=stats["max"].to_numpy(float), mode="lines", line=dict(width=0), showlegend=False,
                       legendgroup=band, hoverinfo="skip"),
            go.Scatter(x=t, y=stats["min"].to_numpy(float), mode="lines", line=dict(width=0), fill="tonexty",
                       fillcolor="rgba(78,121,167,0.25)", name=f"min-max of {len(whos)}", showlegend=False,
                       legendgroup=band, hoverinfo="skip"),
            go.Scatter(x=t, y=stats["median"].to_numpy(float), mode="lines", line=dict(color="#4E79A7", width=1.5),
                       name=f"median of {len(whos)}", showlegend=False,
                       hovertemplate=f"median of {len(whos)}: %{{y:.3g}}<extra></extra>")]


def miles_series_figure(gpus: pd.DataFrame | None, engines: pd.DataFrame | None, t0: float, *,
                        x_range: tuple[float, float] | None = None, margin_left: int | None = None,
                        margin_right: int | None = None) -> go.Figure | None:
    """One lane per series kind, seconds since t0 on a shared x axis (the timeline's range and margins
    where given, so they line up); None when the dump holds none of them."""
    lanes = _lanes(gpus, engines)
    if not lanes:
        return None
    height = 170 * len(lanes) + 90
    fig = make_subplots(rows=len(lanes), cols=1, shared_xaxes=True, vertical_spacing=min(0.08, 50 / height),
                        subplot_titles=[title for title, _ in lanes])
    traces, rows, seen = [], [], set()
    for row, (_, part) in enumerate(lanes, start=1):
        lane = _lane_traces(part, t0, row, seen)
        traces += lane
        rows += [row] * len(lane)
    fig.add_traces(traces, rows=rows, cols=[1] * len(rows))  # one call: plotly copies the figure per add
    for row, (title, _) in enumerate(lanes, start=1):
        if title.startswith("GPU utilization"):  # a percentage: its whole scale, so 50% reads as half busy
            fig.update_yaxes(range=[0, 105], row=row, col=1)
        else:
            fig.update_yaxes(rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="seconds since the run started", row=len(lanes), col=1)
    if x_range is not None:
        fig.update_xaxes(range=list(x_range), autorange=False)
    legend_rows = -(-len(seen) // 6)  # below the plots, so their width (and seconds) stay the timeline's
    height += 22 * legend_rows
    fig.update_layout(template="plotly_white", height=height, hovermode="x unified",
                      legend=dict(orientation="h", yanchor="top", y=-85 / height, x=0, font=dict(size=11)),
                      margin=dict(l=margin_left or 70, r=margin_right if margin_right is not None else 20, t=60,
                                  b=95 + 22 * legend_rows),
                      title=dict(text="Besides memory: GPU utilization and power, SGLang engine series (Miles dump)",
                                 font=dict(size=14), x=0))
    return fig


def miles_series_html(run, suffix: str = "", align_to=None) -> str:
    """The report's section for a Miles dashboard import: the lanes above, or why there are none."""
    if not is_miles(run):
        return ""
    note = series_note(run)
    note_html = f'\n  <p class="small" id="miles-series-note{suffix}">{html.escape(note)}</p>' if note else ""
    fig = miles_series_figure(gpu_series(run), engine_series(run), run_start(run), **alignment(align_to))
    body = "" if fig is None else ('\n  <div class="figure">'
                                   + figure_div(fig, div_id=f"miles-series{suffix}", config=_CONFIG) + "</div>")
    return f"""<h3>GPU utilization and SGLang engine series</h3>{note_html}{body}"""
