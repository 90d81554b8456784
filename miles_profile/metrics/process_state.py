"""One recording process's live state, followed through its files (samples, events, meta) at each read:
a scrape's, or the follower's between scrapes (host_state.py).

Only what a scrape needs is kept: the last value of each exported column, the true peak per phase
since the previous scrape (the follower's passes fold into it, the scrape takes it), the open phases,
the last instance of each offload and transition, and the floor of the current iteration.
"""
from __future__ import annotations

import bisect
import collections
import json
import math
import os
from itertools import groupby, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

from miles_profile import names
from miles_profile.logdir.layout import EVENTS_SUFFIX, PROCESS_META_SUFFIX, SAMPLES_SUFFIX
from miles_profile.logdir.line_tail import LineTail
from miles_profile.metrics.readings import Offload, ProcessReading

try:  # an event line parsed by orjson costs a third of json's (bench/metrics_events.py); json where absent
    from orjson import loads
except ImportError:  # a GPU host without network: the same dicts, slower
    from json import loads

# The report's offload_drop rule, judged live without importing the verdict layer (it pulls the report in):
# the share of expected_bytes that must be freed inside the phase (verdicts/types.py Thresholds) and the
# resolution of each series (verdicts/resolution.py); tests/unit/test_metrics_state.py keeps them equal.
DROP_SHARE = 0.8
RESOLUTION_BYTES = {"allocated": 2 * 1024**2, "resident": 8 * 1024**2}
_RECENT_ROWS = 512  # rows kept to find the level right before a phase began
# A read (a scrape's or the follower's) takes at most this much of one file: a scraper that comes back
# after hours reads the backlog over several reads instead of stalling one.
MAX_READ_BYTES = 8 * 1024 * 1024
_TRANSITION = (names.OFFLOAD_PREFIX, names.ONLOAD_PREFIX, names.UPDATE_WEIGHTS)
_BEGIN, _END, _OFFLOAD = names.BEGIN, names.END, names.OFFLOAD_PREFIX


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is an int in Python: not here


def _is_number(value: Any) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


def _id(value: Any) -> int | None:
    """A phase's id or parent as the writer gives it (an integer), else None."""
    return value if type(value) is int else None


def _stat(series: dict, col: str, field: str) -> int | float | None:
    """`field` (peak, floor, first, last) of column `col` in an end event's summary series, None when
    the phase has none (phase_summary.py writes them)."""
    values = series.get(col)
    value = values.get(field) if isinstance(values, dict) else None
    return value if _is_number(value) else None


def offload_tag(name: str, attrs: dict[str, Any]) -> str:
    """What an offload moved, as one bounded label value: its `tags` joined, else the training state."""
    tags = attrs.get("tags")
    if isinstance(tags, (list, tuple)) and tags:
        return ",".join(sorted(str(t) for t in tags))
    return names.TRAIN_STATE if name == names.OFFLOAD_TRAIN else "none"


def judge(declared: int | None, freed: int | None, series: str) -> str:
    """The live verdict of one offload: freed against the share of declared the report asks for."""
    if not declared or freed is None:
        return "n/a"
    if declared < RESOLUTION_BYTES[series]:
        return "too_small"
    return "pass" if freed >= DROP_SHARE * declared else "fail"


class ProcessState:
    def __init__(self, run_dir: Path, stem: str):
        self.stem = stem
        self._meta_path = run_dir / f"{stem}{PROCESS_META_SUFFIX}"
        self._meta_mtime = -1.0
        self.meta: dict[str, Any] = {}
        self._samples = LineTail(run_dir / f"{stem}{SAMPLES_SUFFIX}", MAX_READ_BYTES)
        self._events = LineTail(run_dir / f"{stem}{EVENTS_SUFFIX}", MAX_READ_BYTES)
        self._cols: dict[str, int] | None = None
        self._cuda_index = 0  # the process's own GPU in its CUDA order (meta's gpu_uuid), else 0
        self._alloc_series = "gpu0_alloc"  # its allocator's column in the phase summaries
        self._width = 0
        self._alloc_col = self._reserved_col = self._alloc_peak_col = self._rss_col = self._rss_peak_col = None
        self.reading = ProcessReading(rank="0", role="", pid=0)
        self._peaks: dict[bytes, list[int]] = {}  # phase as written -> [allocated, RSS] peaks, -1 for none
        self._last: tuple[str, int | None, int | None] | None = None  # the last row: phase, allocated, RSS
        self._recent: list[bytes] = []  # the last rows' lines (_RECENT_ROWS to twice that)
        # The times of _recent's first rows (all of them once an offload was judged): -inf for a damaged
        # one, so the list stays sorted.
        self._recent_t: list[float] = []
        self._open: dict[int | None, tuple[str, float, dict, Any]] = {}  # phase id -> (name, begin t, attrs, rollout_id)
        self._ended: list[tuple[str, float, float, dict, dict]] = []  # offloads awaiting rows, with their summary series
        self._iteration: Any = None
        self._floor: list[int | None] = [None, None]
        self.kills: collections.Counter = collections.Counter()
        self.dead_pids: set[int] = set()  # the processes those deaths name
        self._finished = False

    @property
    def ended(self) -> bool:
        return bool(self.meta.get("end_time"))

    def refresh(self, meta: bool = True) -> None:
        """Read what the files gained. `meta`: look at the meta file too (it changes at a process's start
        and end only: the host looks every few seconds, not at every scrape)."""
        self.add_rows(self.read_new(meta))

    def read_new(self, meta: bool = True) -> bytes:
        """refresh()'s first half: the meta and the new events read, the new rows returned unread
        (whole lines, the header taken), for add_rows() after the host folded them with the other
        processes' (host_state.py)."""
        if self._finished:
            return b""
        if meta or not self.meta:
            self._read_meta()
        data = self._events.read()
        if data:
            for line in data.split(b"\n"):
                self._event(line)
            self.reading.phase = next(reversed(self._open.values()))[0] if self._open else "none"
        data = self._samples.read()
        if data and self._cols is None:
            end = data.index(b"\n")  # LineTail gives whole lines
            header = data[:end].decode(errors="replace").split(",")
            self._cols, self._width = {c: k for k, c in enumerate(header)}, len(header)
            self._find_columns()
            data = data[end + 1:]
        return data

    def row_layout(self) -> tuple[int, tuple[int | None, int | None]]:
        """(cells a row, the columns the peaks are taken from: allocated, RSS): processes whose rows
        share it are folded together (row_peaks.fold)."""
        ap = self._alloc_peak_col if self._alloc_peak_col is not None else self._alloc_col
        rsp = self._rss_peak_col if self._rss_peak_col is not None else self._rss_col
        return self._width, (ap, rsp)

    def add_rows(self, data: bytes, folded: tuple[list[tuple[bytes, int, int]], list[float]] | None = None) -> None:
        """refresh()'s second half: the new rows (`folded`: their peaks per run of one phase and their
        times, from row_peaks.fold; else folded here), then the offloads they complete judged."""
        if self._finished:
            return
        if data:
            self._rows(data, folded)
        self._judge_ended()
        if self.ended:  # it wrote its end time last: all it wrote is read; its files need no descriptor
            self.close()
            self._finished = True

    def close(self) -> None:
        self._samples.close()
        self._events.close()

    def take_peaks(self) -> dict[str, tuple[int | None, int | None]]:
        """The peaks since the previous call, per phase; the next scrape starts afresh. With no row
        since then (rows reach the file every 0.5 s), the last row's level: the series stays present,
        and a higher peak not yet written is in the next scrape."""
        peaks = self.peaks()
        self._peaks = {}
        return peaks

    def peaks(self) -> dict[str, tuple[int | None, int | None]]:
        """What take_peaks() would answer now, left for it (the follower renders ahead of a scrape)."""
        peaks = self._peaks
        if not peaks and self._last is not None:
            phase, alloc, rss = self._last
            return {phase: (alloc, rss)}
        return {(phase.decode(errors="replace") or "none"): (p[0] if p[0] >= 0 else None, p[1] if p[1] >= 0 else None)
                for phase, p in peaks.items()}

    # -- meta ------------------------------------------------------------------------------
    def _read_meta(self) -> None:
        try:
            mtime = os.stat(self._meta_path).st_mtime
        except OSError:
            return
        if mtime == self._meta_mtime:
            return
        try:
            meta = json.loads(self._meta_path.read_bytes())
        except (OSError, ValueError):
            return  # replaced atomically: a failed read is a vanished file; try at the next scrape
        self._meta_mtime, self.meta = mtime, meta
        r = self.reading
        r.rank, r.role, r.pid = str(meta.get("rank", 0)), str(meta.get("role", "")), int(meta.get("pid", 0))
        r.uuid = str(meta.get("gpu_uuid") or "")
        index = next((d.get("index") for d in meta.get("cuda_devices", ()) if r.uuid and d.get("uuid") == r.uuid), 0)
        self._cuda_index, self._alloc_series = index, f"gpu{index}_alloc"
        if self._cols is not None:
            self._find_columns()

    # -- samples ---------------------------------------------------------------------------
    def _find_columns(self) -> None:
        cols, i = self._cols, self._cuda_index
        self._alloc_col = cols.get(f"gpu{i}_alloc")
        self._alloc_peak_col = cols.get(f"gpu{i}_alloc_peak")
        self._reserved_col = cols.get(f"gpu{i}_reserved")
        self._rss_col, self._rss_peak_col = cols.get("rss"), cols.get("rss_peak")

    def _rows(self, data: bytes, folded: tuple[list[tuple[bytes, int, int]], list[float]] | None) -> None:
        """The hot part of a scrape (every row since the previous one). A row's peak cell is never
        below its level (the probes read both at once), so an empty peak cell falls back to the level.
        Levels come from the last row alone."""
        lines = data.split(b"\n")
        lines.pop()  # after the last newline: nothing
        if not lines:
            return
        if folded is not None:
            runs, times = folded
            self._fold_runs(runs)
        else:
            rows = list(map(bytes.split, lines, repeat(b",")))
            if not self._peaks_by_column(rows):
                lines = self._peaks_by_row(lines, rows)
            times = None  # read from the lines when an offload is judged (_recent_times)
        if lines:
            if times is not None and len(self._recent_t) == len(self._recent):
                self._recent_t += times
            self._recent += lines  # lines, not their cells: bytes are no work for the garbage collector
            if len(self._recent) > 2 * _RECENT_ROWS:
                cut = len(self._recent) - _RECENT_ROWS
                del self._recent[:cut]
                del self._recent_t[:cut]  # all of it when it covered fewer rows
            self._levels(lines[-1].split(b","))

    def _recent_times(self) -> list[float]:
        """The times of the rows in _recent (those the batch gave, the rest read from their lines now)."""
        known = len(self._recent_t)
        if known < len(self._recent):
            self._recent_t += map(_time, self._recent[known:])
        return self._recent_t

    def _fold_runs(self, runs) -> None:
        """Each run's peaks (phase as written, allocated, RSS; -1 for none) into the peaks since the
        previous scrape."""
        peaks = self._peaks
        for phase, top_alloc, top_rss in runs:
            p = peaks.get(phase)
            if p is None:
                peaks[phase] = [top_alloc, top_rss]
            else:
                if top_alloc > p[0]:
                    p[0] = top_alloc
                if top_rss > p[1]:
                    p[1] = top_rss

    def _peaks_by_column(self, rows: list[list[bytes]]) -> bool:
        """Every row's peaks at once, each column converted in one C loop (no bytecode a row), folded
        per run of one phase. False, with nothing changed, when a row is torn or a needed cell is
        empty or not a number: then row by row."""
        ap, rsp = self.row_layout()[1]
        if set(map(len, rows)) != {self._width}:
            return False
        try:
            alloc = list(map(int, map(itemgetter(ap), rows))) if ap is not None else None
            rss = list(map(int, map(itemgetter(rsp), rows))) if rsp is not None else None
        except ValueError:  # an empty cell (a peak the probe did not read) or damage
            return False
        runs, lo = [], 0
        for phase, run in groupby(map(itemgetter(1), rows)):  # rows come in runs of one phase
            hi = lo + len(list(run))
            runs.append((phase, max(alloc[lo:hi]) if alloc is not None else -1,
                         max(rss[lo:hi]) if rss is not None else -1))
            lo = hi
        self._fold_runs(runs)
        return True

    def _peaks_by_row(self, lines: list[bytes], rows: list[list[bytes]]) -> list[bytes]:
        """The lines whose cells read, each folded into the peaks on its own."""
        a, ap, rs, rsp = self._alloc_col, self._alloc_peak_col, self._rss_col, self._rss_peak_col
        ap = ap if ap is not None else a
        rsp = rsp if rsp is not None else rs
        peaks, kept, width = self._peaks, [], self._width
        for line, cells in zip(lines, rows):
            if len(cells) != width:  # a torn line: the reader drops it too
                continue
            try:
                alloc = int(cells[ap] or (cells[a] if a is not None else b"") or -1) if ap is not None else -1
                rss = int(cells[rsp] or cells[rs] or -1) if rsp is not None else -1
            except ValueError:
                continue
            p = peaks.get(cells[1])
            if p is None:
                peaks[cells[1]] = [alloc, rss]
            else:
                if alloc > p[0]:
                    p[0] = alloc
                if rss > p[1]:
                    p[1] = rss
            kept.append(line)
        return kept

    def _levels(self, cells: list[bytes]) -> None:
        r = self.reading
        for attr, col in (("allocated", self._alloc_col), ("reserved", self._reserved_col), ("resident", self._rss_col)):
            if col is not None and cells[col].isdigit():
                setattr(r, attr, int(cells[col]))
        phase = cells[1].decode(errors="replace") or "none"
        self._last = (phase, r.allocated if self._alloc_col is not None else None,
                      r.resident if self._rss_col is not None else None)

    @staticmethod
    def _cell(line: bytes, col: int | None) -> int | None:
        try:
            return int(line.split(b",")[col]) if col is not None else None
        except (ValueError, IndexError):  # empty or damaged
            return None

    # -- events ----------------------------------------------------------------------------
    def _event(self, line: bytes) -> None:
        # 1,920 lines a 15 s scrape of 64 processes: type() checks and direct lookups, not helpers.
        if not line:
            return
        try:
            ev = loads(line)
        except (ValueError, RecursionError):  # a damaged line (orjson's error is a ValueError too)
            return
        if type(ev) is not dict:
            return
        t = ev.get("t")
        if not (type(t) is int or (type(t) is float and math.isfinite(t))):
            return
        attrs = ev.get("attrs")
        if type(attrs) is not dict:
            attrs = {}
        kind = ev.get("kind")
        if kind == _BEGIN:
            self._begin(ev, attrs)
        elif kind == _END:
            self._end(ev, attrs)
        elif kind == names.OOM and attrs.get("cause"):  # a death, seen by a witness (oom.py); not an OOM error
            self.kills[str(attrs["cause"])] += 1
            if _is_int(attrs.get("process_pid")):
                self.dead_pids.add(attrs["process_pid"])

    def _begin(self, ev: dict, attrs: dict) -> None:
        rid = attrs.get("rollout_id")
        if type(rid) is not int:
            rid = None
        name = str(ev.get("name", ""))
        # An offload's attrs are judged at its end (expected_bytes, tags, backend).
        self._open[_id(ev.get("id"))] = (name, ev["t"], attrs if name.startswith(_OFFLOAD) else {}, rid)
        if rid is not None and rid != self._iteration and type(ev.get("parent")) is not int:
            if self._iteration is not None:  # a new iteration: the previous one is complete
                self.reading.floor_allocated, self.reading.floor_resident = self._floor
                self.reading.iterations += 1
            self._iteration, self._floor = rid, [None, None]

    def _end(self, ev: dict, attrs: dict) -> None:
        opened = self._open.pop(_id(ev.get("id")), None)
        if opened is None:
            return
        name, begin_t, begin_attrs, rid = opened
        summary = attrs.get("summary")
        if type(summary) is not dict:
            summary = {}
        series = summary.get("series")
        if type(series) is not dict:
            series = {}
        if rid == self._iteration and rid is not None:
            floor = self._floor
            for k, col in enumerate((self._alloc_series, "rss")):
                stats = series.get(col)
                value = stats.get("floor") if type(stats) is dict else None
                if (type(value) is int or (type(value) is float and math.isfinite(value))) \
                        and (floor[k] is None or value < floor[k]):
                    floor[k] = value
        if name.startswith(_TRANSITION):
            self.reading.transitions[name] = ev["t"] - begin_t
        if name.startswith(_OFFLOAD):
            closing = summary.get("t_last")  # the phase's last row: its level at the end
            self._ended.append((name, begin_t, closing if _is_number(closing) else ev["t"], begin_attrs, series))

    def _judge_ended(self) -> None:
        """Offloads whose rows have arrived: freed = the level before the phase minus the level at its end."""
        if not self._ended:
            return
        recent, recent_t = self._recent, self._recent_times()
        while self._ended and recent_t and recent_t[-1] >= self._ended[0][2] - 1e-6:
            name, begin_t, end_t, attrs, series = self._ended.pop(0)
            col = self._alloc_series
            has_alloc = _stat(series, col, "first") is not None or _stat(series, col, "peak") is not None
            which, k, col = ("allocated", self._alloc_col, col) if has_alloc else ("resident", self._rss_col, "rss")
            # The level in the last row before the phase began (rows are in time order: a bisection).
            before = None
            for i in range(bisect.bisect_right(recent_t, begin_t) - 1 if k is not None else -1, -1, -1):
                before = self._cell(recent[i], k)
                if before is not None:
                    break
            if before is None:
                before = _stat(series, col, "first")
            after = _stat(series, col, "last")
            freed = None if before is None or after is None else int(before) - int(after)
            if attrs.get("backend") == names.TORCH_MEMORY_SAVER:
                # A pause is invisible to the allocator's counters (the report judges it on NVML per
                # process, which a process's own rows lack): not judged live.
                freed = None
            declared = attrs.get("expected_bytes")
            declared = int(declared) if isinstance(declared, (int, float)) and not isinstance(declared, bool) else None
            key = (name, offload_tag(name, attrs))
            count = self.reading.offloads[key].count if key in self.reading.offloads else 0
            self.reading.offloads[key] = Offload(declared, freed, which, judge(declared, freed, which), count + 1)


def _time(line: bytes) -> float:
    try:
        return float(line[: line.index(b",")])
    except ValueError:  # a damaged time cell: before every time, so a bisection stays ordered
        return float("-inf")
