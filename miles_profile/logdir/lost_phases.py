"""Where a reader dropped a line that may have held a phase: time spans kept in the run's meta.

An importer that skips a damaged line (a Miles CSV row whose marker is lost, a Miles dashboard phase
interval cut or retyped) leaves a gap between two phases where that phase was. The memory held in the
gap belongs to the lost phase, not to "outside any phase": a check that judges boundaries
(transition_spikes) leaves a boundary whose gap meets one of these spans unjudged and says why.

    add_lost_span(meta, lo, hi)   # lo/hi: Unix seconds; None (or a non-finite value) for an open end
    lost_spans(meta) -> [(lo, hi), ...]    # floats, -inf/inf for open ends
    meets_lost_span(spans, t0, t1) -> bool # the window [t0, t1] meets a span
"""
from __future__ import annotations

import math
from typing import Any

LOST_KEY = "phase_lines_lost"  # run meta: [[lo, hi], ...], JSON-safe (None for an open end)


def add_lost_span(meta: dict[str, Any], lo: float | None, hi: float | None) -> None:
    def safe(v):
        return float(v) if v is not None and math.isfinite(float(v)) else None
    meta.setdefault(LOST_KEY, []).append([safe(lo), safe(hi)])


def lost_spans(meta: dict[str, Any]) -> list[tuple[float, float]]:
    out = []
    for span in meta.get(LOST_KEY) or ():
        try:
            lo, hi = span
            out.append((-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi)))
        except (TypeError, ValueError):  # a meta written by hand: a span that is no pair is no span
            continue
    return out


def meets_lost_span(spans: list[tuple[float, float]], t0: float, t1: float) -> bool:
    return any(lo <= t1 and hi >= t0 for lo, hi in spans)
