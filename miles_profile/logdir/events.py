"""One events line into a clean event dict, or a reason why it can't be one (no pandas, no numpy).

The events file is written by user code (`phase(name, **attrs)` takes any JSON value), so a line can
hold anything: a string `rollout_id`, a dict `id`, a float `pid`, NaN bytes, 100,000 nested brackets
or a lone surrogate. One such line must cost the report that line, never the run: the reader keeps
what is well-formed, drops an event whose structure is broken, and drops (only) an attribute the
checks read whose type is wrong, each counted in one warning (`EventProblems.warnings()`).

    parse_event_line(line, default_pid, problems) -> dict | None
    EventProblems()                                 # counts and first examples; .warnings() -> list[str]
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

try:  # a file's events parsed by orjson in half json's time; json where absent (the same events)
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _fast_loads = json.loads

# Nesting deeper than this is no phase attribute anyone writes; bounding it keeps every later
# recursive walk (JSON export, HTML) far from Python's recursion limit.
MAX_DEPTH = 32
INT64 = 2 ** 63
MAX_BYTES = 2 ** 50  # as logdir/ranges.py: no process, GPU or host holds a pebibyte
_REAL = (int, float)


@dataclass
class EventProblems:
    """What was dropped while reading events: counts, and the first reason of each kind."""
    bad_lines: int = 0
    first_bad: str = ""
    bad_attrs: int = 0
    attr_examples: list[str] = field(default_factory=list)
    where: str = ""  # the file and line being read, set by parse_event_lines: named in the examples
    # or, while a whole file's events are checked, its name and the line (an int set per event: a
    # string made per event cost a tenth of a second at 1,024 processes)
    file: str = ""
    line_no: int = 0

    def line(self, reason: str) -> None:
        self.bad_lines += 1
        self.first_bad = self.first_bad or reason

    def attr(self, example: str) -> None:
        self.bad_attrs += 1
        where = self.where or (f"{self.file} line {self.line_no}" if self.file else "")
        example = f"{where}: {example}" if where else example
        if len(self.attr_examples) < 3 and example not in self.attr_examples:
            self.attr_examples.append(example)

    def warnings(self, where: str = "") -> list[str]:
        prefix = f"{where}: " if where else ""
        out = []
        if self.bad_lines:
            out.append(f"{prefix}dropped {self.bad_lines} bad event line{'s' * (self.bad_lines != 1)} "
                       f"(first: {self.first_bad})")
        if self.bad_attrs:
            out.append(f"{prefix}ignored {self.bad_attrs} event attribute{'s' * (self.bad_attrs != 1)} of the wrong "
                       f"type ({', '.join(self.attr_examples)}{', ...' if self.bad_attrs > len(self.attr_examples) else ''})")
        return out


def _is_int(value: Any) -> bool:
    return type(value) is int and -INT64 < value < INT64  # bool is an int in Python: not here


def _is_number(value: Any) -> bool:
    return type(value) in _REAL and math.isfinite(value) and abs(value) < INT64


def _shape_problem(value: Any) -> str | None:
    """Too deep, or a string that is not valid Unicode (a lone surrogate can't be written as UTF-8)."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return "a string that is not valid Unicode"
        elif isinstance(node, dict):
            stack.extend((k, depth + 1) for k in node.keys())
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return None


def _plainly_shallow(line: bytes | str) -> bool:
    """A line that can be neither too deep nor hold a lone surrogate, so the walk over every value
    (most of a 64-host run's event-reading time) can be skipped: strict UTF-8 bytes with no `\\u`
    escape, and fewer brackets than the depth limit."""
    if isinstance(line, str) or b"\\u" in line or line.count(b"{") + line.count(b"[") > MAX_DEPTH:
        return False
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# Every byte but the brackets and newlines, deleted by bytes.translate: what is left of each line is
# its bracket count, so a whole file is checked against MAX_DEPTH in C.
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"{[\n")
# Each digit made "0" and every other byte " ": 19 digits in a row (an integer orjson would turn into a
# float, past 64 bits, where json keeps it exact) are then found by a plain substring search, in C (a
# regular expression took most of a second on a 1,024-process run's digits).
_DIGITS_AS_ZERO = bytes(b"0"[0] if chr(b).isdigit() and b < 128 else b" "[0] for b in range(256))
_LONG_DIGITS = b"0" * 19


def _plain_file(data: bytes) -> bool:
    """`_plainly_shallow` for every line of a file at once, the file complete and without empty lines:
    the few whole-file scans below in place of four per line (a third of a second at 1,024 processes)."""
    if not data.endswith(b"\n") or data.startswith(b"\n") or b"\n\n" in data or b"\\u" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return max(map(len, data.translate(None, _NOT_BRACKET).split(b"\n"))) <= MAX_DEPTH


def _parse_many(body: bytes) -> Any:
    """`json.loads` of a JSON array; orjson where it gives the same values (no integer past 64 bits:
    orjson would give a float). orjson is stricter (NaN, 1e400): its refusal is json's turn."""
    if _LONG_DIGITS not in body.translate(_DIGITS_AS_ZERO):
        try:
            return _fast_loads(body)
        except ValueError:
            pass
    return json.loads(body)


def _structure_problem(event: dict, default_pid: int, shallow: bool = False) -> str | None:
    if not _is_number(event.get("t")):
        return "no finite number t"
    if not isinstance(event.get("kind"), str) or not isinstance(event.get("name"), str):
        return "kind or name is not a string"
    if not _is_int(event.setdefault("pid", default_pid)):
        return f"pid {str(event['pid'])[:40]!r} is not an integer"
    for key in ("id", "parent"):
        if event.get(key) is not None and not _is_int(event[key]):
            return f"{key} {str(event[key])[:40]!r} is not an integer"
    if event.get("attrs") is None:
        event["attrs"] = {}
    if not isinstance(event["attrs"], dict):
        return "attrs is not an object"
    return None if shallow else _shape_problem(event)


def _tags_ok(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


# The attributes the checks and statistics read, and what each must be. `None` means "not given".
_ATTR_TYPES = {
    "rollout_id": _is_int,
    "expected_bytes": lambda v: _is_number(v) and 0 <= v <= MAX_BYTES,
    "weights_bytes": lambda v: _is_number(v) and 0 <= v <= MAX_BYTES,
    "target": lambda v: isinstance(v, str),
    "tags": _tags_ok,
    "status": lambda v: isinstance(v, str),
}


def _is_bytes(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= MAX_BYTES


def _clean_summary(summary: Any, problems: EventProblems) -> None:
    """An `end` event's per-series summary (phase_summary.py): a byte value that is no count of bytes
    (negative, over 2**50, a float, a string) is set absent, as the series' own samples would be."""
    series = summary.get("series") if isinstance(summary, dict) else None
    if not isinstance(series, dict):
        return
    for name, stats in series.items():
        if not isinstance(stats, dict):
            continue
        for key in ("peak", "floor", "first", "last"):
            value = stats.get(key)
            # _is_bytes, inline: 60,000 phase ends x their series x 4 at 1,024 processes
            if value is not None and not (type(value) is int and 0 <= value <= MAX_BYTES):
                stats[key] = None
                problems.attr(f"summary.{str(name)[:20]}.{key}={json.dumps(value)[:30]}")


def _clean_account(attrs: dict, problems: EventProblems) -> None:
    """An `account` event (miles_profile.account()) whose bytes are no count of bytes (10**20, -1, 1.5)
    or whose device is no name declares nothing: dropped here, said, rather than skipped in silence."""
    value, device = attrs.get("bytes"), attrs.get("device")
    if not _is_bytes(value):
        attrs.pop("bytes", None)
        problems.attr(f"account bytes={json.dumps(value)[:40]}")
    elif not isinstance(device, str):
        attrs.pop("bytes", None)
        problems.attr(f"account device={json.dumps(device)[:40]}")


def _clean_attrs(attrs: dict, problems: EventProblems, kind: Any = None) -> None:
    if kind == "account":  # names.ACCOUNT (this module imports nothing of the project)
        _clean_account(attrs, problems)
    if "summary" in attrs:
        _clean_summary(attrs["summary"], problems)
    for key, ok in _ATTR_TYPES.items():
        if key not in attrs:
            continue
        value = attrs[key]
        if type(value) is float and value.is_integer() and key == "rollout_id" and abs(value) < 2 ** 53:
            attrs[key] = int(value)  # 3.0 written by a float counter means rollout 3
        elif value is None:
            del attrs[key]
        elif not ok(value):
            del attrs[key]
            problems.attr(f"{key}={json.dumps(value)[:40]}")


def parse_event_line(line: bytes | str, default_pid: int, problems: EventProblems) -> dict | None:
    """The event on `line` with `pid` filled in and only well-typed known attributes, or None (counted)."""
    try:
        event = json.loads(line)
    except ValueError:
        problems.line("not JSON")
        return None
    except RecursionError:  # thousands of nested brackets
        problems.line(f"nested deeper than {MAX_DEPTH} levels")
        return None
    if not isinstance(event, dict):
        problems.line("not a JSON object")
        return None
    reason = _structure_problem(event, default_pid, _plainly_shallow(line))
    if reason:
        problems.line(reason)
        return None
    _clean_attrs(event["attrs"], problems, event["kind"])
    return event


def parse_event_lines(data: bytes, default_pid: int, problems: EventProblems, file: str = "") -> list[dict]:
    """Every event of a file's bytes, as `parse_event_line` gives them line by line. A file of plain
    lines (each `_plainly_shallow`, none empty, the last one complete) is parsed in one json call:
    at 1,024 processes the per-line calls cost seconds. `file` names the file in the problems' examples
    (with the line)."""
    if _plain_file(data):
        try:
            events = _parse_many(b"[" + data[:-1].replace(b"\n", b",") + b"]")
        except (ValueError, RecursionError):
            events = None
        if events is not None and all(type(e) is dict for e in events):
            return _checked(events, default_pid, problems, file)
    lines = data.split(b"\n")
    out = []
    for k, line in enumerate(lines):
        if k == len(lines) - 1 and line == b"":
            break
        problems.where = f"{file} line {k + 1}" if file else ""
        event = parse_event_line(line + b"\n" if k < len(lines) - 1 else line, default_pid, problems)
        if event is not None:
            out.append(event)
    problems.where = ""
    return out


def _checked(events: list[dict], default_pid: int, problems: EventProblems, file: str) -> list[dict]:
    """A file's parsed events through `_structure_problem` and `_clean_attrs`, with the structure of
    the usual event (finite t; string kind and name; integer pid, id, parent or none; object attrs)
    checked inline first: the two calls per event were a third of reading 276,000 events. Any event
    that the inline test does not pass goes through `_structure_problem` itself, so it is judged and
    said the same."""
    out = []
    problems.where, problems.file = "", file
    for k, event in enumerate(events):
        t, pid = event.get("t"), event.setdefault("pid", default_pid)
        phase_id, parent, attrs = event.get("id"), event.get("parent"), event.get("attrs")
        if not ((type(t) is float or type(t) is int) and -INT64 < t < INT64 and type(event.get("kind")) is str
                and type(event.get("name")) is str and type(pid) is int and -INT64 < pid < INT64
                and (phase_id is None or (type(phase_id) is int and -INT64 < phase_id < INT64))
                and (parent is None or (type(parent) is int and -INT64 < parent < INT64)) and type(attrs) is dict):
            reason = _structure_problem(event, default_pid, True)
            if reason:
                problems.line(reason)
                continue
            attrs = event["attrs"]
        problems.line_no = k + 1
        _clean_attrs(attrs, problems, event["kind"])
        out.append(event)
    problems.file, problems.line_no = "", 0
    return out
