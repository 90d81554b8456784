"""The ledger's part of the HTML report: the stacked area over time, the stacked bar per phase, and
whether the categories add up (report/ledger.py, report/ledger_figures.py)."""
from __future__ import annotations

import html

import pandas as pd

from miles_profile.report.ledger import add_up
from miles_profile.report.ledger_figures import ledger_area_figure, ledger_bar_figure

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
    declared = (frame["source"] == "declared").any()
    note = ("" if declared else " This run declared nothing (no <code>miles_profile.account()</code> calls): "
            "every byte the allocator holds shows as allocated, nothing declared.")
    area = ledger_area_figure(frame, t0, **alignment(align_to)).to_html(full_html=False, include_plotlyjs=False,
                                                 div_id=f"ledger-area{suffix}", config=_CONFIG)
    bars = ledger_bar_figure(frame).to_html(full_html=False, include_plotlyjs=False,
                                            div_id=f"ledger-bars{suffix}", config=_CONFIG)
    return f"""<h3>Where the bytes are</h3>
  <p class="muted small">At each phase's end, per GPU and per process's RSS: what the program declared
  (weights, gradients, optimizer state, KV cache, ...) and what the recorded series leave for the rest
  (docs/ledger.md). Negative residuals are drawn below zero, hatched.{note}</p>
  <p class="small" id="ledger-add-up{suffix}">{html.escape(add_up_text(frame))}</p>
  <div class="figure">{area}</div>
  <div class="figure">{bars}</div>"""
