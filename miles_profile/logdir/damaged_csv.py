"""Read a damaged samples CSV at about the cost of an intact one.

The reader parses samples with pyarrow's typed CSV reader. That fails for the whole file on one
cell it can't convert (`12x4` in a byte column, bytes that are not UTF-8) and on a line longer than
its block (the zeros of a sparse file's hole, junk without a newline). The old answer, pandas'
Python engine over the decoded text, cost 55 s and 6.1 GB for one bad cell in 3M rows. Here the
file is read again, still by pyarrow and numpy. Where pyarrow names the column it could not convert
(the usual damage: a few bad cells), only that column is re-read as raw bytes and the parse is
repeated, up to BAD_COLUMNS_RETRIED times: about one more intact parse. Otherwise (long lines, more
bad columns):

1. a numpy scan of the file's data extents (a sparse file's holes are skipped, never read) finds
   the last complete line and the lines over LINE_MAX bytes, which are cut out;
2. every column is read as raw bytes, so no cell can fail;
3. each column is cast in one call; a column where that fails keeps the cells that are numbers and
   makes the others absent (counted in a warning), with one vectorised regular expression.

Measured in tests/faults/test_faults_files.py (300k rows, one bad cell): see docs/log-format.md.
"""
from __future__ import annotations

import contextlib
import re
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from miles_profile.logdir.arrow_csv import read_csv

LINE_MAX = 64 * 1024  # a samples row is ~25 bytes a column: 64 KiB is 2,500 columns
_SCAN_CHUNK = 64 * 1024 * 1024  # bytes compared at once (a bool per byte: bounded memory)
BAD_COLUMNS_RETRIED = 3
_CONVERSION = re.compile(r"In CSV column #(\d+): CSV conversion error")
_INTEGER = r"^-?[0-9]{1,18}$"  # what pyarrow casts to int64 without overflow
_FLOAT = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,3})?$"


@contextlib.contextmanager
def quiet_invalid_rows():
    """pyarrow decodes a malformed row as UTF-8 before its handler sees it; a row that is not UTF-8
    fails there and Python prints "Exception ignored ..." with a traceback. The read then fails and
    is handled: keep that noise off the user's terminal (as the reader does around its fast path)."""
    unraisable, sys.unraisablehook = sys.unraisablehook, lambda _: None
    try:
        yield
    finally:
        sys.unraisablehook = unraisable


def scan_lines(data, extents: list[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
    """(end of the last complete line, [start, end) of each line over LINE_MAX bytes, newline
    included) of `data`, looking only at `extents` (the rest is zeros: no newline there)."""
    long_lines, previous = [], -1  # position of the newline before the current line
    for start, end in extents:
        for low in range(start, end, _SCAN_CHUNK):
            high = min(low + _SCAN_CHUNK, end)
            newlines = np.flatnonzero(np.frombuffer(data, np.uint8, high - low, low) == 10) + low
            if not len(newlines):
                continue
            before = np.concatenate(([previous], newlines[:-1]))
            over = np.flatnonzero(newlines - before - 1 > LINE_MAX)
            long_lines += zip((before[over] + 1).tolist(), (newlines[over] + 1).tolist())
            previous = int(newlines[-1])
    return previous + 1, long_lines


def _body(data, start: int, end: int, long_lines: list[tuple[int, int]]) -> pa.Buffer:
    """data[start:end] without the long lines; no copy when there are none."""
    view = memoryview(data)
    if not long_lines:
        return pa.py_buffer(view[start:end])
    pieces, at = [], start
    for low, high in long_lines:
        if low > at:
            pieces.append(view[at:low])
        at = max(at, high)
    pieces.append(view[at:end])
    return pa.py_buffer(b"".join(pieces))


def _to_number(column: pa.ChunkedArray, kind: pa.DataType) -> tuple[pa.ChunkedArray, int, int]:
    """`column` (raw bytes) cast to `kind`; cells that are no number become null: (result, how many,
    the row of the first, -1 for none)."""
    column = pc.if_else(pc.equal(pc.binary_length(column), 0), pa.scalar(None, pa.binary()), column)  # absent
    hexadecimal = pc.any(pc.match_substring_regex(column, "^[+-]?0[xX]")).as_py()  # a cast reads `0x10` as 16
    try:
        if not hexadecimal:
            return pc.cast(pc.cast(column, pa.string()), kind), 0, -1
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    number = pc.match_substring_regex(column, _INTEGER if pa.types.is_integer(kind) else _FLOAT)
    not_number = pc.fill_null(pc.invert(number), False)
    bad = pc.sum(pc.cast(not_number, pa.int64())).as_py() or 0
    first = pc.index(not_number, True).as_py() if bad else -1
    kept = pc.if_else(number, column, pa.scalar(None, pa.binary()))
    return pc.cast(pc.cast(kept, pa.string()), kind), bad, first


def _to_phase(column: pa.ChunkedArray) -> pa.Array:
    """Phase names as a dictionary array, bytes that are not UTF-8 replaced, absent as ''."""
    encoded = pc.dictionary_encode(column.combine_chunks())
    names = pa.array([b.decode("utf-8", errors="replace") for b in encoded.dictionary.to_pylist()], pa.string())
    return pc.dictionary_encode(pc.fill_null(pc.take(names, encoded.indices), ""))  # two bad names may read alike


def _types(header: list[str], raw: set[str]) -> dict[str, pa.DataType]:
    types = {c: pa.binary() if c in raw else pa.int64() for c in header}
    if "t" in types and "t" not in raw:
        types["t"] = pa.float64()
    if "phase" in types and "phase" not in raw:
        types["phase"] = pa.dictionary(pa.int32(), pa.string())
    return types


def _converted(table: pa.Table, raw: set[str], name: str, warnings: list[str]) -> pa.Table:
    """`table` with its raw (bytes) columns converted: phase to names, the rest to numbers."""
    columns, bad, first = {}, 0, []
    for column in table.column_names:
        if column not in raw:
            columns[column] = table[column]
        elif column == "phase":
            columns[column] = _to_phase(table[column])
        else:
            columns[column], count, at = _to_number(table[column], pa.float64() if column == "t" else pa.int64())
            bad += count
            if count:
                first.append((at, column))
    if bad:  # the line of the first: its row after the header (exact unless rows before it were skipped)
        at, column = min(first)
        warnings.append(f"{name}: {bad} unreadable values set to absent (first: line {at + 2}, column {column})")
    return pa.table(columns)


def _retry_bad_columns(source: pa.Buffer, header: list[str], error: str, name: str,
                       warnings: list[str]) -> pa.Table | None:
    """Parse again with the columns pyarrow failed to convert read as raw bytes; None when pyarrow
    names no column or more than BAD_COLUMNS_RETRIED fail."""
    raw: set[str] = set()
    skipped = []
    for _ in range(BAD_COLUMNS_RETRIED):
        match = _CONVERSION.search(error)
        if match is None or not int(match.group(1)) < len(header):
            return None
        raw.add(header[int(match.group(1))])
        skipped.clear()
        try:
            table = read_csv(source, skipped, read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),
                             convert_options=pacsv.ConvertOptions(column_types=_types(header, raw),
                                                                  strings_can_be_null=False, null_values=[""]))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            error = str(exc)
            continue
        except UnicodeDecodeError:  # a malformed row that is not UTF-8: see read_damaged
            return None
        if skipped:
            warnings.append(f"{name}: skipped {len(skipped)} malformed rows")
        return _converted(table, raw, name, warnings)
    return None


def _read_raw(body: pa.Buffer, header: list[str], skipped: list[int]) -> pa.Table | None:
    """Every column as raw bytes (no cell can fail to convert); None when pyarrow still fails."""
    try:
        return read_csv(
            body, skipped, read_options=pacsv.ReadOptions(column_names=header),
            parse_options=pacsv.ParseOptions(quote_char=False),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.binary() for c in header},
                                                 null_values=[""], strings_can_be_null=True))
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError):
        return None


def hexadecimal_cell(mapped, extents: list[tuple[int, int]], body: int) -> bool:
    """A cell that starts `0x`/`0X` after the header (the recorder writes decimals): damage to say, as
    the damaged paths do, not the number pyarrow would make of it. Holes are skipped, and the two-byte search
    (~1 ms a MB) runs only where memchr (~0.1 ms a MB) found an x at all: a phase named with an x pays it,
    a phase named `0x...` only the slow path."""
    for start, stop in extents:
        start = max(start, body)
        if start < stop and (mapped.find(b"x", start, stop) >= 0 or mapped.find(b"X", start, stop) >= 0):
            if mapped.find(b",0x", start, stop) >= 0 or mapped.find(b",0X", start, stop) >= 0:
                return True
    return False


def usable_header(header: list[str]) -> bool:
    """A samples header names t and phase, each column once."""
    return "t" in header and "phase" in header and len(set(header)) == len(header)


def read_damaged(data, extents: list[tuple[int, int]], header: list[str], name: str,
                 warnings: list[str], error: str = "", end: int = -1) -> tuple[pa.Table | None, int]:
    """The samples in `data` (a whole file, header line included) as the fast path types them
    (t float64, phase dictionary, the rest int64) after the fast path failed with `error` on
    data[:end]: (table or None when nothing is readable, end of the last complete line). Cut lines,
    skipped rows and unreadable cells are named in `warnings`."""
    if end > 0:
        table = _retry_bad_columns(pa.py_buffer(memoryview(data)[:end]), header, error, name, warnings)
        if table is not None:
            return table, end
    end, long_lines = scan_lines(data, extents)
    header_end = bytes(memoryview(data)[: min(end, LINE_MAX + 1)]).find(b"\n") + 1
    if end == 0 or header_end == 0:
        warnings.append(f"{name}: no complete line, skipped")
        return None, end
    long_lines = [(low, high) for low, high in long_lines if high > header_end]
    if long_lines:
        warnings.append(f"{name}: dropped {len(long_lines)} lines over {LINE_MAX:,} bytes "
                        f"({sum(h - l for l, h in long_lines):,} bytes)")
    skipped: list[int] = []
    body = _body(data, header_end, end, long_lines)
    table = _read_raw(body, header, skipped)
    if table is None:
        # pyarrow decodes a malformed row as UTF-8 to hand it over, and fails on one that is not:
        # only then is the text decoded with replacement (a copy, about one more parse).
        skipped.clear()
        table = _read_raw(pa.py_buffer(bytes(body).decode("utf-8", "replace").encode()), header, skipped)
    if table is None:
        warnings.append(f"{name}: unreadable, skipped")
        return None, end
    if skipped:
        warnings.append(f"{name}: skipped {len(skipped)} malformed rows")
    return _converted(table, set(header), name, warnings), end
