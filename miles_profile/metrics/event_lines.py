"""The few fields a scrape needs from an event line, without parsing the whole line when the recorder wrote it.

A phase's `end` event carries the phase's summary, a series per sampled column (about 1 KB on a GPU
rank): parsing it whole costs ~20 us on a loaded core, and a scrape of 64 processes at a 15 s interval
meets hundreds. The recorder's own writer (logdir/writer.py EventWriter, phase_summary.py) always lays
the head out as `{"t":..,"kind":..,"name":..,"pid":..,"host":..[,"id":..][,"parent":..],"attrs":{..}}`
and a series as `"col":{"peak":..,"floor":..,"first":..,"last":..}`: those are matched by pattern, and
anything else (escapes, another writer's key order) falls back to `json`, so nothing is misread.
"""
from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

_NUM = rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_HEAD = re.compile(rb'\{"t":([-+.\deE]+),"kind":"(begin|end)","name":"([^"\\]*)","pid":-?\d+,'
                   rb'"host":"[^"\\]*"(?:,"id":(-?\d+))?(?:,"parent":(-?\d+))?,"attrs":')
_WANTED = re.compile(rb'"kind":\s*"(?:begin|end|oom)"')  # other kinds (marks, accounts) are never parsed
_T_LAST = re.compile(rb'"t_last":(' + _NUM + rb'|null)[,}]')
_decode = json.JSONDecoder().decode  # on str: json.loads on bytes first guesses the encoding, every line


_ROLLOUT_ID = re.compile(rb'"rollout_id":(-?\d+)[,}]')


class Event(NamedTuple):
    kind: str
    name: str
    t: float
    id: int | None
    parent: int | None
    parsed: dict | None  # the attrs when the line was parsed whole; else None, and `attrs()` parses them
    line: bytes
    attrs_at: int = 0    # where the attrs object begins in `line`

    def attrs(self) -> dict:
        if self.parsed is not None:
            return self.parsed
        try:
            attrs = _decode(self.line[self.attrs_at:-1].decode())
        except (ValueError, UnicodeDecodeError):
            attrs = None
        return attrs if isinstance(attrs, dict) else {}

    def rollout_id(self) -> Any:
        """attrs' rollout_id, found without parsing the attrs where the recorder wrote an integer."""
        if self.parsed is None:
            m = _ROLLOUT_ID.search(self.line, self.attrs_at)
            if m is not None:
                return int(m.group(1))
            if b'"rollout_id":' not in self.line[self.attrs_at:]:
                return None
        return self.attrs().get("rollout_id")


def parse(line: bytes) -> Event | None:
    """A begin, end or oom event of `line`; None for other kinds and for what can't be read. The attrs
    of a line the recorder wrote are left unparsed until asked for."""
    m = _HEAD.match(line)
    if m is not None and line.endswith(b"}"):
        t, kind, name, id_, parent = m.groups()
        try:
            when = float(t)
        except ValueError:
            return _parse_json(line)
        return Event(kind.decode(), name.decode(), when, id_ and int(id_), parent and int(parent), None, line, m.end())
    if _WANTED.search(line):
        return _parse_json(line)
    return None  # marks, accounts, stacks: nothing a scrape reports


def _parse_json(line: bytes) -> Event | None:
    try:
        ev = _decode(line.decode())
        kind, t, attrs = ev["kind"], float(ev["t"]), ev.get("attrs") or {}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return None
    if kind not in ("begin", "end", "oom") or not isinstance(attrs, dict):
        return None
    ids = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in (ev.get("id"), ev.get("parent"))]
    return Event(kind, str(ev.get("name", "")), t, ids[0], ids[1], attrs, line)


_PATTERNS: dict[str, re.Pattern] = {}


def _series_pattern(col: str) -> re.Pattern:
    if col not in _PATTERNS:
        _PATTERNS[col] = _compile_series(col)
    return _PATTERNS[col]


def _compile_series(col: str) -> re.Pattern:
    value = rb"(" + _NUM + rb"|null)"
    return re.compile(b'"' + re.escape(col.encode()) + rb'":\{"peak":' + value + rb',"floor":' + value
                      + rb',"first":' + value + rb',"last":' + value + rb"\}")


def _number(group: bytes) -> int | float | None:
    if group == b"null":
        return None
    return int(group) if group.lstrip(b"-").isdigit() else float(group)


class EndSummary:
    """The summary of an `end` event, read field by field; the whole line is parsed at most once, and
    only when a field is not where the recorder writes it."""

    _FIELDS = {"peak": 1, "floor": 2, "first": 3, "last": 4}

    def __init__(self, event: Event):
        self._line = event.line
        self._summary: dict | None = None if event.parsed is None else (event.parsed.get("summary") or {})
        self._found: dict[str, re.Match | None] = {}

    def _parsed(self) -> dict:
        if self._summary is None:
            try:
                attrs = _decode(self._line.decode()).get("attrs") or {}
                summary = attrs.get("summary") if isinstance(attrs, dict) else None
            except (ValueError, AttributeError, UnicodeDecodeError):
                summary = None
            self._summary = summary if isinstance(summary, dict) else {}
        return self._summary

    def _match(self, col: str) -> re.Match | None:
        if col not in self._found:
            self._found[col] = _series_pattern(col).search(self._line)
        return self._found[col]

    def has(self, col: str) -> bool:
        """Whether the phase has a series for column `col`."""
        return self.get(col, "first") is not None or self.get(col, "peak") is not None

    def get(self, col: str, field: str) -> int | float | None:
        """`field` (peak, floor, first, last) of column `col` over the phase; None when it has none."""
        if self._summary is None:
            m = self._match(col)
            if m is not None:
                return _number(m.group(self._FIELDS[field]))
            if f'"{col}":'.encode() not in self._line:
                return None
        series = self._parsed().get("series")
        values = series.get(col) if isinstance(series, dict) else None
        value = values.get(field) if isinstance(values, dict) else None
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def t_last(self) -> float | None:
        """The time of the phase's last row, None when it had none."""
        if self._summary is None:
            m = _T_LAST.search(self._line)
            if m is not None:
                return None if m.group(1) == b"null" else float(m.group(1))
        value = self._parsed().get("t_last")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
