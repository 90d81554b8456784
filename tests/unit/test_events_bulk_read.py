"""A whole events file read at once (issue 35: orjson, the structure checked inline, the file read in
one call) gives what reading it line by line gives, on damaged files too: the line-by-line path
(`parse_event_line` per line, the stdlib's json) is the reference every damage case was fixed on."""
from __future__ import annotations

import gc
import json
import random

from miles_profile.logdir.events import EventProblems, parse_event_line, parse_event_lines
from miles_profile.logdir.events_reader import read_all_events
from miles_profile.logdir.files import bounded_lines, read_lines_bounded


def _events() -> list[bytes]:
    """A process's events as the recorder writes them: begins, ends with summaries, a mark, an account."""
    lines = []
    for k in range(6):
        begin = {"t": 1.78e9 + k, "kind": "begin", "name": "train", "pid": 7, "host": "h", "id": k + 1,
                 "parent": None, "attrs": {"rollout_id": k, "expected_bytes": 2 ** 30}}
        end = {"t": 1.78e9 + k + 0.5, "kind": "end", "name": "train", "pid": 7, "host": "h", "id": k + 1,
               "parent": None, "attrs": {"status": "ok", "summary": {"rows": 9, "t_first": 1.78e9 + k,
                                         "t_last": 1.78e9 + k + 0.5, "series": {
                                             "gpu0_proc": {"peak": 3 * 2 ** 30, "floor": 2 ** 30,
                                                           "first": 2 ** 30, "last": 2 ** 30}}}}}
        lines += [json.dumps(begin).encode(), json.dumps(end).encode()]
    lines.append(b'{"t": 1780000009.5, "kind": "mark", "name": "step", "attrs": {"tags": ["a"]}}')
    lines.append(b'{"t": 1780000009.6, "kind": "account", "name": "kv", "attrs": {"bytes": 4096, "device": "gpu0"}}')
    return lines


# Values that orjson and json read differently (integers past 64 bits: orjson gives a float; NaN, 1e400:
# orjson refuses) or that a check refuses, each put in place of one event's value.
_VALUES = [b"18446744073709551616", b"-9223372036854775809", b"123456789012345678901234", b"9223372036854775808",
           b"NaN", b"Infinity", b"1e400", b"null", b'"7"', b"[]", b"{}", b"true", b"1.5", b"3.0", b"-1",
           b"1125899906842625", b'"\\ud800"', b"[" * 40 + b"]" * 40]
_FIELDS = [b'"t": ', b'"pid": 7', b'"id": ', b'"parent": null', b'"rollout_id": ', b'"expected_bytes": ',
           b'"peak": ', b'"last": ', b'"bytes": ', b'"kind": ', b'"attrs": ']


def _damaged(rng: random.Random) -> bytes:
    lines = _events()
    for _ in range(rng.randint(1, 3)):
        k, field = rng.randrange(len(lines)), rng.choice(_FIELDS)
        line, at = lines[k], lines[k].find(field)
        if at < 0:
            continue
        start = at + field.index(b":") + 2
        end = start
        while end < len(line) and line[end:end + 1] not in b",}":
            end += 1
        if line[start:start + 1] in b"{[":  # an object or list value: swap the key's whole line instead
            lines[k] = line[:start] + rng.choice(_VALUES) + b"}"
        else:
            lines[k] = line[:start] + rng.choice(_VALUES) + line[end:]
    return b"\n".join(lines) + b"\n"


def _line_by_line(data: bytes, problems: EventProblems) -> list[dict]:
    out = []
    for k, line in enumerate(data.split(b"\n")[:-1]):
        problems.where = f"e.events.jsonl line {k + 1}"
        event = parse_event_line(line + b"\n", 5, problems)
        if event is not None:
            out.append(event)
    problems.where = ""
    return out


def test_a_whole_file_read_at_once_equals_it_read_line_by_line_on_damaged_files():
    rng = random.Random(35)
    whole_files = 0
    for _ in range(400):
        data = _damaged(rng)
        bulk, single = EventProblems(), EventProblems()
        got = parse_event_lines(data, 5, bulk, "e.events.jsonl")
        want = _line_by_line(data, single)
        assert repr(got) == repr(want), data  # repr: 1.0 and 1 (or a float for a huge integer) differ
        assert bulk.warnings() == single.warnings(), data
        whole_files += not single.bad_lines  # no line dropped: the file read at once, not by line
    assert whole_files > 100  # the damage mostly leaves every line parseable: the bulk path was taken


def test_a_small_file_read_in_one_call_equals_it_read_line_by_line(tmp_path):
    cases = {"plain": b"a\nbb\n", "no-newline": b"a\nbb", "empty": b"", "long": b"x" * 40 + b"\nok\n" + b"y" * 41}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        for limit in (40, 1024):
            want_long, got_long = [0], [0]
            assert read_lines_bounded(path, limit, got_long) == b"".join(bounded_lines(path, limit, want_long))
            assert got_long == want_long, name


def test_reading_a_run_s_events_leaves_the_collector_as_it_was(tmp_path):
    (tmp_path / "h-5.events.jsonl").write_bytes(b"\n".join(_events()) + b"\n")
    assert gc.isenabled()
    assert len(read_all_events(tmp_path, [])) == 14 and gc.isenabled()
    gc.disable()
    try:
        read_all_events(tmp_path, [])
        assert not gc.isenabled()
    finally:
        gc.enable()
