"""Figures of the ledger (runmodel/ledger.py), shared by the HTML report and the dashboard.

    ledger_area_figure(frame, t0) -> go.Figure     # stacked area per device over time (phase ends, peaks)
    ledger_bar_figure(frame) -> go.Figure          # stacked bar per phase instance (peak, end), per device
    ledger_comparison_figure(frames, names) -> go.Figure  # stacked bars per phase and configuration

A negative residual (declared more than allocated, NVML per-process under reserved) is never clipped:
it is drawn below zero, hatched, and named "(negative)" in the legend.
"""
from __future__ import annotations

import html
from collections import Counter

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from miles_profile import names
from miles_profile.runmodel import ledger as L
from miles_profile.report.phase_style import iteration_text
from miles_profile.runmodel.series import GiB

# Declared first (bottom of the stack), then what is derived from the measured series.
CATEGORY_COLORS = {
    names.WEIGHTS: "#1f77b4", names.GRADIENTS: "#ff7f0e", names.OPTIMIZER_STATE: "#2ca02c",
    names.KV_CACHE: "#9467bd", names.CUDA_GRAPH_POOL: "#8c564b", names.PINNED_BUFFERS: "#e377c2",
    names.OFFLOADED_STATE: "#17becf",
    L.ACTIVATIONS: "#d62728", L.UNDECLARED: "#9edae5", L.ALLOCATOR_CACHE: "#ff9896", L.NON_PYTORCH: "#bcbd22", L.OTHER_PROCESSES: "#7f7f7f",
    L.OTHER_ANONYMOUS: "#c49c94", L.FILE_BACKED: "#c7c7c7", L.SHARED_MEMORY: "#dbdb8d", L.RSS_UNSPLIT: "#aec7e8",
}
CATEGORY_TEXT = {
    names.OPTIMIZER_STATE: "optimizer state", names.KV_CACHE: "KV cache", names.CUDA_GRAPH_POOL: "CUDA graph pools",
    names.PINNED_BUFFERS: "pinned buffers", names.OFFLOADED_STATE: "offloaded state",
    L.ACTIVATIONS: "activations and temporaries", L.UNDECLARED: "allocated (nothing declared)",
    L.ALLOCATOR_CACHE: "allocator cache",
    L.NON_PYTORCH: "non-PyTorch (context, NCCL, ...)", L.OTHER_PROCESSES: "other processes and driver",
    L.OTHER_ANONYMOUS: "other anonymous", L.FILE_BACKED: "file-backed", L.SHARED_MEMORY: "shared memory",
    L.RSS_UNSPLIT: "RSS (not split)",
}
_EXTRA_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")


def category_order(categories) -> list[str]:
    known = list(CATEGORY_COLORS)
    return sorted(set(categories), key=lambda c: (known.index(c) if c in known else len(names.DECLARED_CATEGORIES) - 0.5, c))


def category_color(category: str) -> str:
    return CATEGORY_COLORS.get(category) or _EXTRA_COLORS[sum(map(ord, category)) % len(_EXTRA_COLORS)]


def category_text(category: str) -> str:
    return CATEGORY_TEXT.get(category, category.replace("_", " "))


def _devices(frame: pd.DataFrame) -> list[str]:
    """Device lanes: every GPU first, then each process's host RSS (labels are unique per lane)."""
    labels = frame.drop_duplicates("label")[["label", "device"]]
    gpus = sorted(labels[labels["device"] != L.HOST]["label"])
    hosts = sorted(labels[labels["device"] == L.HOST]["label"])
    return gpus + hosts


def lane_name(frame: pd.DataFrame, label: str) -> str:
    """The lane as the fleet view names it: "node0:gpu5" for a GPU (its UUID dropped), "node0: RSS of
    pid 12" for a process's host memory; without a host name, "gpu5" and "RSS of pid 12"."""
    hosts = frame.loc[frame["label"] == label, "host"].astype(str) if "host" in frame else pd.Series(dtype=str)
    host = hosts.iloc[0] if len(hosts) and hosts.iloc[0] not in ("", "nan", "None") else ""
    if label.startswith("host RSS, "):
        return f"{host + ': ' if host else ''}RSS of {label[len('host RSS, '):]}"
    return f"{host + ':' if host else ''}{label.split(' ')[0]}"


def _lane_title(frame: pd.DataFrame, label: str) -> str:
    return f"{lane_name(frame, label)}: by category (GiB)"


def _wide(lane: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, pd.Series]:
    """Bytes per category (columns) at each boundary (rows, in time order), and the reference total."""
    lane = lane.drop_duplicates([*keys, "category"], keep="last")
    wide = lane.pivot_table(index=keys, columns="category", values="bytes", aggfunc="sum", sort=False)
    total = lane.groupby(keys, sort=False)["total"].first().reindex(wide.index)
    order = np.argsort(lane.groupby(keys, sort=False)["t"].first().reindex(wide.index).to_numpy(), kind="stable")
    return wide.iloc[order], total.iloc[order]


class _Batch:
    """Traces gathered with their subplot, added in one call: plotly validates and copies the figure
    on every add_trace, which made the nine-run comparison take seconds."""

    def __init__(self) -> None:
        self.traces, self.rows, self.cols = [], [], []

    def add(self, traces: list, row: int, col: int) -> None:
        self.traces += traces
        self.rows += [row] * len(traces)
        self.cols += [col] * len(traces)

    def into(self, fig: go.Figure) -> None:
        if self.traces:
            fig.add_traces(self.traces, rows=self.rows, cols=self.cols)


def _numbered(labels: list[str]) -> list[str]:
    total, seen, out = Counter(labels), Counter(), []
    for label in labels:
        seen[label] += 1
        out.append(f"{label} #{seen[label]}" if total[label] > 1 else label)
    return out


def _bar_traces(x, wide: pd.DataFrame, total: pd.Series, show_legend: bool, seen: set, hover_x: str) -> list:
    traces = []
    for category in category_order(wide.columns):
        y = wide[category].to_numpy(float)
        for negative in (False, True):
            if not ((y < 0) if negative else (y >= 0)).any():
                continue
            # zeros, not NaN, where the other sign or nothing was measured: a NaN breaks plotly's stacking
            part = np.where(y < 0, y, 0.0) if negative else np.where(y >= 0, y, 0.0)
            name = category_text(category) + (" (negative)" if negative else "")
            traces.append(go.Bar(
                x=x, y=part / GiB, name=name, legendgroup=name, showlegend=show_legend and name not in seen,
                marker=dict(color=category_color(category), pattern=dict(shape="/" if negative else "")),
                hovertemplate=f"{html.escape(name)}: %{{y:.3f}} GiB<br>{hover_x}<extra></extra>"))
            seen.add(name)
    if total.notna().any():
        name = "measured total (NVML used / RSS)"
        traces.append(go.Scatter(x=x, y=total.to_numpy(float) / GiB, mode="markers", name=name, legendgroup=name,
                                 showlegend=show_legend and name not in seen,
                                 marker=dict(symbol="line-ew-open", size=18, color="#111111", line=dict(width=2)),
                                 hovertemplate=f"{name}: %{{y:.3f}} GiB<br>{hover_x}<extra></extra>"))
        seen.add(name)
    return traces


_AT_TEXT = {L.AT_PEAK: " ▲ peak", L.AT_END: " end"}
_TICKS_MAX = 60  # phase labels per lane (the engine-server run has 135 phase ends on its GPU; hover names each)


def _paired_traces(wide: pd.DataFrame, total: pd.Series, names_of: dict, instances: list, seen: set) -> list:
    """Bars of a ledger with peaks: instance j's peak at x = 3j (dotted), its end at 3j + 1, a gap at
    3j + 2 between pairs; hover names the instance and which bar ("0:train ▲ peak"). The ends carry the
    legend (solid swatches); the peaks join their category's legend group."""
    order = {k: j for j, k in enumerate(instances)}
    traces = []
    for at in (L.AT_PEAK, L.AT_END):
        rows = [k[5] == at for k in wide.index]
        if not any(rows):
            continue
        keys = [k for k, r in zip(wide.index, rows) if r]
        x = [3 * order[k[:5]] + (0 if at == L.AT_PEAK else 1) for k in keys]
        part = _bar_traces(x, wide[rows], total[rows], at == L.AT_END, seen if at == L.AT_END else set(),
                           "%{customdata}")
        for trace in part:
            trace.customdata = [names_of[k[:5]] + _AT_TEXT[at] for k in keys]
            if at == L.AT_PEAK and isinstance(trace, go.Bar) and not trace.marker.pattern.shape:
                trace.marker.pattern = dict(shape=".", fgcolor="#ffffff", solidity=0.3)  # negatives keep "/"
        traces += part
    return traces


def ledger_bar_figure(frame: pd.DataFrame, *, top_level_only: bool = True) -> go.Figure:
    """One stacked bar per phase instance (its end; with the ledger's peak rows, its peak beside it),
    one row per device lane; a dash marks the measured total the categories should reach."""
    picked = frame[frame["depth"] == 0] if top_level_only and len(frame) else frame
    lanes = _devices(picked) if len(picked) else []
    height = 380 * max(1, len(lanes)) + 120
    # about 170 px between lanes: the rotated phase labels of one lane above the next lane's title
    fig = make_subplots(rows=max(1, len(lanes)), cols=1, vertical_spacing=min(0.3, 170 / height) if len(lanes) > 1 else 0.1,
                        subplot_titles=[_lane_title(picked, lane) for lane in lanes] or ["no ledger in this run"])
    seen: set = set()
    batch = _Batch()
    peaks = "at" in picked and (picked["at"] == L.AT_PEAK).any()
    for row, lane in enumerate(lanes, start=1):
        part = picked[picked["label"] == lane]
        wide, total = _wide(part.assign(at=part["at"] if "at" in part else L.AT_END),
                            ["host", "pid", "id", "phase", "iteration", "at"])
        instances = list(dict.fromkeys(k[:5] for k in wide.index))  # in time order: a phase's peak, then its end
        names_of = dict(zip(instances, _numbered([  # two setup update_weights stay two bars
            f"{iteration_text(it)}:{phase}" + (f" ({pid})" if picked["pid"].nunique() > 1 else "")
            for (_, pid, _, phase, it) in instances])))
        if not peaks:
            x = [names_of[k[:5]] for k in wide.index]
            batch.add(_bar_traces(x, wide, total, True, seen, "%{x}"), row, 1)
        else:
            batch.add(_paired_traces(wide, total, names_of, instances, seen), row, 1)
            step = -(-len(instances) // _TICKS_MAX)  # rotated labels 14 px apart at most: every step-th pair
            fig.update_xaxes(tickmode="array", tickvals=[3 * j + 0.5 for j in range(0, len(instances), step)],
                             ticktext=[names_of[k] for k in instances[::step]], row=row, col=1)
        fig.update_yaxes(title_text="GiB", row=row, col=1)
        fig.update_xaxes(tickangle=-45, row=row, col=1)
    batch.into(fig)
    fig.update_layout(barmode="relative", template="plotly_white", height=height,
                      margin=dict(l=70, r=20, t=60, b=110), bargap=0.15,
                      title="Where the bytes are at each phase's peak (left bar, dotted) and at its end (right)" if peaks
                      else "Where the bytes are at the end of each phase")
    return fig


def ledger_area_figure(frame: pd.DataFrame, t0: float, *, x_range: tuple[float, float] | None = None,
                       margin_left: int | None = None, margin_right: int | None = None) -> go.Figure:
    """Stacked areas per device lane over time (seconds since t0), one step per phase boundary:
    the ledger as it stood after each phase ended, until the next boundary; with the ledger's peak
    rows, a step at each phase's peak as well (so a train phase's activations rise and fall). `x_range` and the margins:
    the timeline's (figures.time_range, figures.left_margin), so the two figures line up."""
    lanes = _devices(frame) if len(frame) else []
    # 60 px between lanes whatever their number (a fixed share of the height breaks past 13 lanes)
    fig = make_subplots(rows=max(1, len(lanes)), cols=1, shared_xaxes=True,
                        vertical_spacing=min(0.08, 60 / (260 * max(1, len(lanes)) + 120)),
                        subplot_titles=[_lane_title(frame, lane) for lane in lanes] or ["no ledger in this run"])
    seen: set = set()
    batch = _Batch()
    for row, lane in enumerate(lanes, start=1):
        part = frame[frame["label"] == lane]
        wide, total = _wide(part, ["t"])
        x = wide.index.to_numpy(float) - t0
        for category in category_order(wide.columns):
            y = wide[category].to_numpy(float)
            name = category_text(category)
            batch.add([go.Scatter(
                x=x, y=np.where(y >= 0, y, 0) / GiB, mode="lines", stackgroup=f"lane{row}", line=dict(width=0.5, shape="hv"),
                fillcolor=category_color(category), line_color=category_color(category), name=name, legendgroup=name,
                showlegend=name not in seen, hovertemplate=f"{html.escape(name)}: %{{y:.3f}} GiB<extra></extra>")],
                row, 1)
            seen.add(name)
            if (y < 0).any():
                neg = f"{name} (negative)"
                batch.add([go.Scatter(x=x, y=np.minimum(y, 0) / GiB, mode="lines", fill="tozeroy",
                                      line=dict(width=1, shape="hv", color=category_color(category), dash="dot"),
                                      fillpattern=dict(shape="/"), name=neg, legendgroup=neg,
                                      showlegend=neg not in seen,
                                      hovertemplate=f"{html.escape(neg)}: %{{y:.3f}} GiB<extra></extra>")], row, 1)
                seen.add(neg)
        if total.notna().any():
            name = "measured total (NVML used / RSS)"
            batch.add([go.Scatter(x=x, y=total.to_numpy(float) / GiB, mode="lines", name=name, legendgroup=name,
                                  showlegend=name not in seen, line=dict(color="#111111", width=1.2, dash="dash",
                                                                         shape="hv"),
                                  hovertemplate=f"{name}: %{{y:.3f}} GiB<extra></extra>")], row, 1)
            seen.add(name)
        fig.update_yaxes(title_text="GiB", row=row, col=1)
    batch.into(fig)
    fig.update_xaxes(title_text="seconds since the run started", row=max(1, len(lanes)), col=1)
    if x_range is not None:
        fig.update_xaxes(range=list(x_range), autorange=False)
    fig.update_layout(template="plotly_white", height=260 * max(1, len(lanes)) + 120, hovermode="x unified",
                      margin=dict(l=margin_left or 70, r=margin_right if margin_right is not None else 20, t=60, b=50),
                      title="Ledger over time: bytes by category at each phase's peak and after its end"
                      if "at" in frame and (frame["at"] == L.AT_PEAK).any()
                      else "Ledger over time: bytes by category after each phase boundary")
    return fig


def _worst_instances(frame: pd.DataFrame, pid: int) -> pd.DataFrame:
    """Per phase name and lane kind (gpu/host), the top-level instance of `pid` whose measured total
    was highest at its end (its worst iteration)."""
    top = L.ends(frame)
    top = top[(top["depth"] == 0) & (top["pid"] == pid)]
    if top.empty:
        return top
    top = top.assign(kind=np.where(top["device"] == L.HOST, "host", "gpu"))
    gpus = sorted(top.loc[top["kind"] == "gpu", "device"].unique())
    top = top[(top["kind"] == "host") | (top["device"] == (gpus[0] if gpus else None))]  # the process's first GPU
    keys = ["kind", "phase", "id"]
    totals = top.groupby(keys, sort=False).agg(total=("total", "first"), positive=("bytes", lambda b: b[b > 0].sum()))
    totals["score"] = totals["total"].fillna(totals["positive"])
    best = totals.reset_index().sort_values("score", kind="stable").groupby(["kind", "phase"], sort=False).tail(1)
    return top.merge(best[keys], on=keys)


# Tableau 10 (designed to be told apart, also by most colour-blind readers); the last is "other".
COMPARISON_COLORS = ("#4E79A7", "#F28E2B", "#59A14F", "#B07AA1", "#E15759", "#76B7B2", "#EDC948", "#9C755F",
                     "#FF9DA7", "#BAB0AC")
COMPARISON_CATEGORIES_MAX = len(COMPARISON_COLORS)  # past this, the smallest merge into "other"
OTHER = "other"
_GRID_COLUMNS = 4  # phases per row of small multiples


def merge_rare_categories(frame: pd.DataFrame, keep: int = COMPARISON_CATEGORIES_MAX) -> pd.DataFrame:
    """`frame` with at most `keep` categories: those holding the most bytes in any bar stay, the rest are
    summed into "other" (per bar), so every colour on screen is told apart at a glance."""
    if frame.empty or frame["category"].nunique() <= keep:
        return frame
    largest = frame.assign(size=frame["bytes"].abs()).groupby("category")["size"].max()
    kept = set(largest.sort_values(ascending=False, kind="stable").index[:keep - 1])
    return frame.assign(category=frame["category"].where(frame["category"].isin(kept), OTHER))


def _hbar_traces(runs: list[str], wide: pd.DataFrame, total: pd.Series, colors: dict, seen: set, phase: str) -> list:
    """Horizontal stacked bars, one per run (y), one trace per category (and sign); the measured total as a tick."""
    traces = []
    for category in category_order(wide.columns):
        x = wide[category].to_numpy(float)
        for negative in (False, True):
            if not ((x < 0) if negative else (x >= 0)).any():
                continue
            part = np.where(x < 0, x, 0.0) if negative else np.where(x >= 0, x, 0.0)
            name = category_text(category) + (" (negative)" if negative else "")
            traces.append(go.Bar(
                y=runs, x=part / GiB, orientation="h", name=name, legendgroup=name, showlegend=name not in seen,
                marker=dict(color=colors[category], pattern=dict(shape="/" if negative else "")),
                hovertemplate=f"{html.escape(name)}: %{{x:.3f}} GiB<br>{html.escape(phase)}, %{{y}}<extra></extra>"))
            seen.add(name)
    if total.notna().any():
        name = "measured total (NVML used / RSS)"
        traces.append(go.Scatter(y=runs, x=total.to_numpy(float) / GiB, mode="markers", name=name, legendgroup=name,
                                 showlegend=name not in seen,
                                 marker=dict(symbol="line-ns-open", size=14, color="#111111", line=dict(width=2)),
                                 hovertemplate=f"{name}: %{{x:.3f}} GiB<br>{html.escape(phase)}, %{{y}}<extra></extra>"))
        seen.add(name)
    return traces


def _comparison_cells(both: pd.DataFrame, kinds: list[str], phases: list[str],
                      columns: int = _GRID_COLUMNS) -> list[tuple[str, str, int, int]]:
    """(kind, phase, row, col) of each small multiple: per kind, its phases in rows of `columns`."""
    cells, row = [], 0
    for kind in kinds:
        present = [p for p in phases if ((both["kind"] == kind) & (both["phase"] == p)).any()]
        for k, phase in enumerate(present):
            cells.append((kind, phase, row + 1 + k // columns, 1 + k % columns))
        row += -(-len(present) // columns)
    return cells


def _grid_titles(cells: list, rows: int, columns: int) -> list[str]:
    """Titles in make_subplots' order (row by row, every position): an empty grid cell gets ""."""
    named = {(row, col): f"{'GPU' if kind == 'gpu' else 'host RSS'} · {phase}" for kind, phase, row, col in cells}
    return [named.get((r, c), "") for r in range(1, rows + 1) for c in range(1, columns + 1)]


def ledger_comparison_figure(frames: list[pd.DataFrame], run_names: list[str], main_pids: list[int | None],
                             phase_order: list[str]) -> go.Figure:
    """Several runs as small multiples, one per phase (in loop order) and lane kind (GPU of the main
    process, then its RSS): in each, one horizontal stacked bar per run (names read left to right, in
    the same order everywhere) of its ledger at the end of that phase's worst iteration (the instance
    with the highest measured total). At most COMPARISON_CATEGORIES_MAX colours (rare ones in "other");
    one x scale per kind, so bars compare across phases."""
    picked = [(_worst_instances(f, pid) if pid is not None and len(f) else pd.DataFrame()) for f, pid in zip(frames, main_pids)]
    picked = [p.assign(run=name) for p, name in zip(picked, run_names) if len(p)]
    both = pd.concat(picked, ignore_index=True) if picked else pd.DataFrame(columns=["kind", "phase", "run", "category"])
    both = merge_rare_categories(both)
    kinds = [k for k in ("gpu", "host") if (both["kind"] == k).any()]
    phases = [p for p in phase_order if (both["phase"] == p).any()]
    phases += sorted(set(both["phase"]) - set(phases))
    # up to _GRID_COLUMNS plots a row; fewer phases take the width between them
    widest = max((both.loc[both["kind"] == k, "phase"].nunique() for k in kinds), default=1)
    columns = max(1, min(_GRID_COLUMNS, widest))
    cells = _comparison_cells(both, kinds, phases, columns)
    rows = max([c[2] for c in cells], default=1)
    runs = [n for n in run_names if (both["run"] == n).any()]
    row_px = 46 + 20 * max(1, len(runs))
    height = rows * row_px + 190
    fig = make_subplots(rows=rows, cols=columns, horizontal_spacing=0.025,
                        vertical_spacing=min(0.2, 46 / height) if rows > 1 else 0.1,
                        subplot_titles=_grid_titles(cells, rows, columns) or None)
    for note in fig.layout.annotations:  # titles of small multiples: they name a phase, not a figure
        note.font = dict(size=12)
    colors = {c: COMPARISON_COLORS[k] if c != OTHER else COMPARISON_COLORS[-1]
              for k, c in enumerate(category_order(set(both["category"]) - {OTHER}))}
    colors[OTHER] = COMPARISON_COLORS[-1]
    seen: set = set()
    batch = _Batch()
    first_axis: dict[str, str] = {}
    for kind, phase, row, col in cells:
        part = both[(both["kind"] == kind) & (both["phase"] == phase)]
        keys = ["run", "iteration"]
        wide = part.pivot_table(index=keys, columns="category", values="bytes", aggfunc="sum", sort=False)
        total = part.groupby(keys, sort=False)["total"].first().reindex(wide.index)
        # every run in every plot, in one order (empty where a run lacks the phase): the run names are
        # written once per row of plots, so the bars of all its plots must line up with them
        at = {k[0]: k for k in wide.index}
        index = pd.MultiIndex.from_tuples([at.get(n, (n, -1)) for n in runs])
        wide, total = wide.reindex(index), total.reindex(index)
        traces = _hbar_traces(runs, wide.fillna(0.0), total, colors, seen, phase)
        for trace in traces:
            trace.customdata = [iteration_text(i) if n in at else "–" for n, i in wide.index]
            trace.hovertemplate = trace.hovertemplate.replace("<extra>", " (iteration %{customdata})<extra>")
        batch.add(traces, row, col)
        axis = fig.get_subplot(row, col)
        x_name = axis.xaxis.plotly_name.replace("axis", "")
        first_axis.setdefault(kind, x_name)
        fig.update_yaxes(categoryorder="array", categoryarray=runs[::-1], showticklabels=col == 1,
                         tickfont=dict(size=11), fixedrange=True, row=row, col=col)
        fig.update_xaxes(matches=None if first_axis[kind] == x_name else first_axis[kind], fixedrange=True,
                         tickfont=dict(size=10), row=row, col=col)
    batch.into(fig)
    fig.update_layout(barmode="relative", template="plotly_white", height=height, bargap=0.25,
                      margin=dict(l=10 + 7 * max((len(n) for n in runs), default=8), r=20, t=120, b=40),
                      legend=dict(orientation="h", yanchor="top", y=1 - 34 / height, yref="container", x=0),
                      title=dict(text="What fills memory at the end of each phase (its worst iteration), per run, in GiB: "
                                      "GPU of the main process, then its RSS", font=dict(size=14), y=0.99,
                                 yref="container", yanchor="top", x=0),
                      )
    return fig

