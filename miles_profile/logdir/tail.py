"""Follow a run that a recorder is still writing: read only what was appended since the last look.

A live view re-reads nothing: each `SamplesTail` / `EventsTail` keeps a byte offset into one file and
parses the complete lines after it (a line being written stays for the next call). Column types are
those of `reader.py`, so appended rows concatenate with a frame that `load_run` returned.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from miles_profile.logdir.arrow_csv import read_csv
from miles_profile.logdir.events import EventProblems, parse_event_line
from miles_profile.logdir.damaged_csv import quiet_invalid_rows, read_damaged, usable_header
from miles_profile.logdir.files import EVENT_LINE_MAX
from miles_profile.logdir.line_tail import read_regular, whole_lines
from miles_profile.logdir.reader import EVENT_COLUMNS, phase_timeline

_CHUNK = 64 * 1024 * 1024  # at most this much per call: a huge backlog is read over several calls


def _read_lines_from(path: Path, offset: int) -> tuple[bytes, int]:
    """(bytes from `offset` up to the last complete line, bytes consumed), at most _CHUNK a call."""
    return whole_lines(read_regular(path, offset, _CHUNK), _CHUNK)


def sample_column_types(header: list[str]) -> dict[str, pa.DataType]:
    types = {c: pa.int64() for c in header if c not in ("t", "phase")}
    types.update(t=pa.float64(), phase=pa.string())
    return types


def parse_sample_rows(data: bytes, header: list[str]) -> tuple[pd.DataFrame, int]:
    """CSV rows without a header line -> (frame, number of malformed rows skipped)."""
    skipped: list[int] = []
    with quiet_invalid_rows():
        try:
            table = read_csv(
                pa.py_buffer(data), skipped,
                read_options=pacsv.ReadOptions(column_names=header),
                convert_options=pacsv.ConvertOptions(column_types=sample_column_types(header),
                                                     strings_can_be_null=False))
            frame = table.to_pandas()
        except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError) as exc:
            # Garbage in a field, a line too long: still pyarrow; what can't be read becomes absent.
            skipped.clear()
            whole = (",".join(header) + "\n").encode() + data
            table = read_damaged(whole, [(0, len(whole))], header, "", [], str(exc), len(whole))[0]
            frame = table.to_pandas() if table is not None else pd.DataFrame({c: [] for c in header})
            skipped.append(-1)
    frame["phase"] = frame["phase"].fillna("").astype(str)
    finite = np.isfinite(frame["t"].to_numpy(dtype=float))
    return frame.loc[finite].reset_index(drop=True), len(skipped) + int((~finite).sum())


class SamplesTail:
    """The rows appended to one `*.samples.csv` since the previous `read()`.

    `offset` may start past a file's beginning (where a full load ended): the partial line there is
    skipped, and rows at or before `after_t` (already loaded) are dropped.
    """

    def __init__(self, path: Path, offset: int = 0, after_t: float = -np.inf):
        self.path = Path(path)
        self.offset = offset
        self.after_t = after_t
        self.header: list[str] | None = None
        self.skipped_rows = 0

    def _read_header(self) -> bool:
        head = read_regular(self.path, 0, 65536)
        if b"\n" not in head:
            return False
        first = head.split(b"\n", 1)[0]
        header = first.decode(errors="replace").split(",")
        if not first or not usable_header(header):  # nothing of it can be read: no rows, ever
            return False
        self.header = header
        if self.offset == 0:
            self.offset = len(first) + 1
        return True

    def read(self) -> pd.DataFrame | None:
        """New complete rows (columns as in the header), or None when there are none."""
        if self.header is None and not self._read_header():
            return None
        data, consumed = _read_lines_from(self.path, self.offset)
        if not data:
            self.offset += consumed
            return None
        start = 0
        if self.offset > 0 and read_regular(self.path, self.offset - 1, 1) != b"\n":
            start = data.find(b"\n") + 1  # resume mid-line: that line was loaded (or dropped) already
        self.offset += consumed
        frame, skipped = parse_sample_rows(data[start:], self.header) if data[start:] else (None, 0)
        self.skipped_rows += skipped
        if frame is None:
            return None
        frame = frame.loc[frame["t"].to_numpy() > self.after_t]
        if frame.empty:
            return None
        self.after_t = float(frame["t"].max())
        return frame.reset_index(drop=True)


class EventsTail:
    """The events appended to one `*.events.jsonl` since the previous `read()`."""

    def __init__(self, path: Path, pid: int, offset: int = 0):
        self.path = Path(path)
        self.pid = pid
        self.offset = offset
        self.skipped_lines = 0
        self.problems = EventProblems()  # what the reader would warn about, counted the same way

    def read(self) -> pd.DataFrame | None:
        data, consumed = _read_lines_from(self.path, self.offset)
        self.offset += consumed
        if not data:
            return None
        rows = []
        for line in data.splitlines():
            if len(line) > EVENT_LINE_MAX:  # as the reader: damage, never parsed
                self.problems.line(f"a line over {EVENT_LINE_MAX:,} bytes")
                continue
            event = parse_event_line(line, self.pid, self.problems)
            if event is not None:
                if not isinstance(event.get("host"), str):
                    event["host"] = self.path.name.rsplit(".events.jsonl", 1)[0].rsplit("-", 1)[0]
                rows.append(event)
        self.skipped_lines = self.problems.bad_lines
        if not rows:
            return None
        events = pd.DataFrame(rows, columns=EVENT_COLUMNS)
        events["attrs"] = events["attrs"].map(lambda a: a if isinstance(a, dict) else {})
        events["t"] = events["t"].astype(float)
        return events


def label_outside_samples(samples: pd.DataFrame, events: pd.DataFrame, pids: list[int],
                          since_t: float = -np.inf) -> pd.DataFrame:
    """Give rows sampled from outside (`record --exec`) at or after `since_t` the innermost open phase."""
    times, labels = phase_timeline(events)
    if not len(times) or not pids or samples.empty:
        return samples
    t = samples["t"].to_numpy()
    mask = samples["pid"].isin(pids).to_numpy() & (t >= since_t)
    if not mask.any():
        return samples
    at = np.searchsorted(times, t[mask], side="right") - 1
    filled = np.where(at >= 0, np.asarray(labels, dtype=object)[np.maximum(at, 0)], "")
    phase = samples["phase"].astype(str).to_numpy(dtype=object)
    phase[mask] = filled
    samples = samples.copy(deep=False)
    samples["phase"] = pd.Categorical(phase)
    return samples
