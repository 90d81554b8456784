"""The ledger's part of the HTML report: the stacked area over time, the stacked bar per phase, and
whether the categories add up (runmodel/ledger.py, report/ledger_figures.py)."""
from __future__ import annotations

import html

import pandas as pd

from miles_profile.names import iteration_text
from miles_profile.runmodel.ledger import AT_END, AT_PEAK, OTHER_PROCESSES, add_up
from miles_profile.runmodel.ledger_sampling import sampled_text
from miles_profile.report.ledger_figures import category_text, ledger_area_figure, ledger_bar_figure, lane_name
from miles_profile.runmodel.series import GiB
from miles_profile.report.plotly_bundle import figure_div

_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


def add_up_text(frame: pd.DataFrame) -> str:
    """One sentence per lane kind: the worst relative error at a phase boundary, and where."""
    parts = []
    for kind, what in (("gpu", "NVML device used"), ("host", "RSS")):
        result = add_up(frame, kind)
        if result.worst_error is None:
            continue
        w = result.worst
        over = int((result.table["error"] > 0.02).sum())
        where = f"{w['phase']} (iteration {'setup' if w['iteration'] < 0 else w['iteration']}, pid {w['pid']})"
        parts.append(f"{'GPU' if kind == 'gpu' else 'host'}: the categories add up to {what} within "
                     f"{result.worst_error:.2%} at worst over {result.boundaries} phase ends ({over} over 2%; "
                     f"worst at the end of {where}).")
    return " ".join(parts)


def peak_rise(frame: pd.DataFrame) -> dict | None:
    """The category that stood highest above its phase's end at the phase's peak, and where: {phase,
    iteration, pid, lane, category, category_peak, category_end, peak, end} (bytes; peak and end the
    lane's totals), or None without peak rows. Among top-level phases that move no state, where any
    is left: an offload's peak is the state it frees, an onload's the state it has not declared yet."""
    if "at" not in frame or not (frame["at"] == AT_PEAK).any():
        return None
    top = frame[frame["depth"] == 0]
    working = top[~top["phase"].astype(str).str.startswith(("offload_", "onload_"))]
    top = working if len(working) else top
    keys = ["host", "pid", "id", "phase", "iteration", "label"]
    wide = top.pivot_table(index=[*keys, "category"], columns="at", values="bytes", aggfunc="sum")
    if AT_END not in wide or AT_PEAK not in wide:
        return None
    wide = wide.fillna(0.0)
    rise = wide[AT_PEAK] - wide[AT_END]
    if rise.empty or rise.max() <= 0:
        return None
    key = rise.idxmax()
    host, pid, _, phase, iteration, label, category = key
    totals = wide.xs(key[:-1], level=keys).sum()
    return {"phase": phase, "iteration": int(iteration), "pid": int(pid),
            "lane": lane_name(top[top["host"] == host], label), "category": category,
            "category_peak": float(wide.loc[key, AT_PEAK]), "category_end": float(wide.loc[key, AT_END]),
            "peak": float(totals[AT_PEAK]), "end": float(totals[AT_END])}


def peak_text(frame: pd.DataFrame) -> str:
    """One sentence: what a phase's peak held most beyond its end, and where."""
    rise = peak_rise(frame)
    if rise is None:
        return ""
    return (f"Most held at a phase's peak beyond its end: {category_text(rise['category'])}, "
            f"{rise['category_peak'] / GiB:.2f} GiB at the peak of {rise['phase']} (iteration "
            f"{iteration_text(rise['iteration'])}, pid {rise['pid']}) on {rise['lane']}, "
            f"{rise['category_end'] / GiB:.2f} GiB at its end (the lane: {rise['peak'] / GiB:.2f} GiB at the peak, "
            f"{rise['end'] / GiB:.2f} GiB at the end).")


def unsplit_reason(frame: pd.DataFrame) -> str:
    """Why a ledger splits nothing ("" when it splits): every byte in one category, NVML's device used
    with no recorded process on the GPU (a Miles dashboard import records no allocator, no per-process
    bytes and no declarations)."""
    if frame.empty or set(frame["category"]) != {OTHER_PROCESSES}:
        return ""
    return ("Nothing to split here: this run has only NVML's device used for each GPU (no allocator, no "
            "per-process bytes, no declarations, as a Miles dashboard import), so every byte would be 'other "
            "processes and driver'. The timeline shows that level.")


def alignment(timeline) -> dict:
    """The x range and side margins of a timeline figure (or {}): the ledger over time drawn with them
    lines up with the timeline above it, second for second."""
    if timeline is None or timeline.layout.xaxis.range is None:
        return {}
    margin = timeline.layout.margin
    return dict(x_range=tuple(timeline.layout.xaxis.range), margin_left=margin.l, margin_right=margin.r)


def ledger_html(frame: pd.DataFrame, t0: float, suffix: str, align_to=None) -> str:
    """`align_to`: the run's timeline figure, whose x range and margins the ledger over time takes."""
    if frame.empty:
        return ""
    if unsplit_reason(frame):
        return f"""<h3>Where the bytes are</h3>
  <p class="small" id="ledger-unsplit{suffix}">{html.escape(unsplit_reason(frame))}</p>"""
    declared = (frame["source"] == "declared").any()
    note = ("" if declared else " This run declared nothing (no <code>miles_profile.account()</code> calls): "
            "every byte the allocator holds shows as allocated, nothing declared.")
    area = figure_div(ledger_area_figure(frame, t0, **alignment(align_to)), div_id=f"ledger-area{suffix}", config=_CONFIG)
    bars = figure_div(ledger_bar_figure(frame), div_id=f"ledger-bars{suffix}", config=_CONFIG)
    when = ("At each phase's peak (▲, its highest sample: allocated's true peak on a GPU, RSS's on the host) "
            "and at its end" if "at" in frame and (frame["at"] == AT_PEAK).any() else "At each phase's end")
    rise = peak_text(frame)
    rise = f'\n  <p class="small" id="ledger-peak{suffix}">{html.escape(rise)}</p>' if rise else ""
    if sampled_text(frame):
        rise += f'\n  <p class="small" id="ledger-sampled{suffix}">{html.escape(sampled_text(frame))}</p>'
    return f"""<h3>Where the bytes are</h3>
  <p class="muted small">{when}, per GPU and per process's RSS: what the program declared
  (weights, gradients, optimizer state, KV cache, ...) and what the recorded series leave for the rest
  (docs/ledger.md). Negative residuals are drawn below zero, hatched.{note}</p>{rise}
  <p class="small" id="ledger-add-up{suffix}">{html.escape(add_up_text(frame))}</p>
  <div class="figure">{area}</div>
  <div class="figure">{bars}</div>"""
