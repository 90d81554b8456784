"""Per-phase summaries computed as samples are taken: for each series, the true peak, the floor, and
the first and last values of the rows that belong to the phase.

The rows of a phase (docs/log-format.md, "Phase summaries") are its process's rows taken after the
row written right before the phase begins, up to and including the row written right before it ends.
The recorder opens a phase's summary and closes it under the sampler's lock, in the same hold as
those two rows, so no periodic row can fall between.

Cost: each row updates one running segment (O(series)), whatever the number of open phases; a phase
opening starts a new segment and a phase closing merges the segments since its start, then keeps
boundaries only where a still-open phase starts. No row is buffered.
"""
from __future__ import annotations

from typing import Any, Sequence


def series_plan(columns: Sequence[str]) -> list[tuple[str, int, int | None]]:
    """(series, level column index, true-peak column index or None) for a samples file's columns.

    Every column is a series except `<c>_peak` where `<c>` exists: that one is `<c>`'s true peak."""
    index = {c: i for i, c in enumerate(columns)}
    return [(c, i, index.get(f"{c}_peak")) for i, c in enumerate(columns)
            if not (c.endswith("_peak") and c[: -len("_peak")] in index)]


class _Segment:
    __slots__ = ("rows", "t_first", "t_last", "peak", "floor", "first", "last")

    def __init__(self, n: int):
        self.rows = 0
        self.t_first = self.t_last = None
        self.peak: list = [None] * n
        self.floor: list = [None] * n
        self.first: list = [None] * n
        self.last: list = [None] * n

    def add(self, t: float, values: Sequence, plan) -> None:
        if not self.rows:
            self.t_first = t
        self.rows += 1
        self.t_last = t
        peak, floor, first, last = self.peak, self.floor, self.first, self.last
        for k, (_, li, pi) in enumerate(plan):
            v = values[li]
            p = values[pi] if pi is not None else None
            if v is not None:
                if first[k] is None:
                    first[k] = v
                last[k] = v
                if floor[k] is None or v < floor[k]:
                    floor[k] = v
                if p is None or p < v:
                    p = v
            if p is not None and (peak[k] is None or p > peak[k]):
                peak[k] = p

    def absorb(self, later: "_Segment") -> None:
        """Extend this segment by the rows of the one right after it."""
        if not later.rows:
            return
        if not self.rows:
            self.t_first = later.t_first
        self.rows += later.rows
        self.t_last = later.t_last
        for k in range(len(self.peak)):
            lp, lf = later.peak[k], later.floor[k]
            if lp is not None and (self.peak[k] is None or lp > self.peak[k]):
                self.peak[k] = lp
            if lf is not None and (self.floor[k] is None or lf < self.floor[k]):
                self.floor[k] = lf
            if self.first[k] is None:
                self.first[k] = later.first[k]
            if later.last[k] is not None:
                self.last[k] = later.last[k]


def stamp(t: float) -> float:
    return float(f"{t:.6f}")  # the time exactly as the samples file holds it


class PhaseSummaries:
    """Running summaries of the open phases of one process. Not thread-safe: the sampler's lock guards it."""

    def __init__(self, columns: Sequence[str]):
        self._plan = series_plan(columns)
        self._segments: list[_Segment] = []
        self._starts: dict[int, _Segment] = {}  # open phase id -> its first segment

    def add(self, t: float, values: Sequence) -> None:
        if self._segments:
            self._segments[-1].add(t, values, self._plan)

    def open(self, phase_id: int) -> None:
        segment = _Segment(len(self._plan))
        self._segments.append(segment)
        self._starts[phase_id] = segment

    def close(self, phase_id: int) -> dict[str, Any] | None:
        start = self._starts.pop(phase_id, None)
        if start is None:
            return None
        at = next(i for i, s in enumerate(self._segments) if s is start)
        total = _Segment(len(self._plan))
        for segment in self._segments[at:]:
            total.absorb(segment)
        self._compact()
        return self._as_dict(total)

    def _compact(self) -> None:
        """Keep a segment boundary only where a still-open phase starts."""
        starts = {id(s) for s in self._starts.values()}
        kept: list[_Segment] = []
        for segment in self._segments:
            if id(segment) in starts:
                kept.append(segment)
            elif kept:
                kept[-1].absorb(segment)
        self._segments = kept  # later rows extend kept[-1]: every open phase started at or before it

    def _as_dict(self, total: _Segment) -> dict[str, Any]:
        series = {}
        for k, (name, _, _) in enumerate(self._plan):
            if total.peak[k] is not None or total.first[k] is not None:
                series[name] = {"peak": total.peak[k], "floor": total.floor[k],
                                "first": total.first[k], "last": total.last[k]}
        return {"rows": total.rows,
                "t_first": stamp(total.t_first) if total.t_first is not None else None,
                "t_last": stamp(total.t_last) if total.t_last is not None else None,
                "series": series}
