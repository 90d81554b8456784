"""Phase summaries computed from the samples files, for phases whose `end` event carries none (a log
written before summaries, by another tool, or by a process that crashed).

The numbers are those the recorder writes (phase_summary.py, docs/log-format.md "Phase summaries"), in
the frame of `summaries.summaries_frame`: per finished phase instance, over its process's rows with
start < t <= end, per series the true peak (the level and its `<c>_peak` column), the floor, the first
and last values, with the row count and the first and last row times. A series with no value in the
phase has no row, as in a recorded summary.

One pass per file and no whole-run DataFrame: each file is cut at line ends into chunks of about
CHUNK_BYTES, the chunks of every file are parsed by a pool of threads (pyarrow parses without the
GIL, so the cores are used whether one file is large or many are small) and each chunk is reduced at
once to per-phase partial statistics, merged per file in order. Memory grows with the number of
phases and the chunks in flight, not with the samples. The `phase` column is not parsed: the phases
come from the events.

A file the fast parse can't take (a cell that is not a number, NUL bytes, holes of a sparse file, time
going backwards or absent) is read whole by the reader's damage-tolerant path and reduced the same way.

The cache: the summaries of a samples file whose process finished (or that has not changed for
completeness.STALE_S) are kept beside it as `.<host>-<pid>.samples.csv.summaries.arrow` (Arrow IPC:
read without parsing), keyed by the CSV's size and modification time and by a digest of the phase
windows it was computed for, with a digest of its own values. A stale, damaged or foreign cache is
ignored; a directory that can't be
written gets none (silently); MILES_PROFILE_CACHE=0 disables it; deleting it is always safe. Its name
starts with a dot and ends in `.arrow`, so no reader of log files (`*.samples.csv`, `*.csv`) takes it.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from miles_profile.logdir.completeness import STALE_S
from miles_profile.logdir.damaged_csv import quiet_invalid_rows, usable_header
from miles_profile.logdir.files import NotRegularFile, map_regular, open_regular
from miles_profile.logdir.layout import SAMPLES_SUFFIX
from miles_profile.logdir.merge import copied_stems
from miles_profile.logdir.samples_reader import clean_times, read_samples
from miles_profile.logdir.summaries import SUMMARY_COLUMNS, summaries_frame
from miles_profile.phase_summary import series_plan

CHUNK_BYTES = 32 * 1024 * 1024  # ~250,000 rows of a one-GPU process: a few tens of MB of columns
CACHE_MIN_BYTES = 4 * 1024 * 1024  # below it the parse takes milliseconds: no file worth leaving
CACHE_SUFFIX = ".summaries.arrow"
_CACHE_TAG = b"miles-profile-sample-summaries-1"
CACHE_MAX_BYTES = 256 * 1024 ** 2  # 150,000 phases x 20 series fit; a larger file by that name is not ours
_STATS = ("peak", "floor", "first", "last")
_CACHE_SCHEMA = pa.schema([("id", pa.int64()), ("series", pa.string()), *[(s, pa.int64()) for s in _STATS],
                           ("rows", pa.int64()), ("t_first", pa.float64()), ("t_last", pa.float64())])


def workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


class _FullRead(Exception):
    """The fast chunked parse can't take this file: read it whole, damage-tolerant."""


@dataclass
class _File:
    path: Path
    host: str
    pid: int
    ids: np.ndarray      # the process's finished phases: id, name, start, end
    names: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    cacheable: bool
    warnings: list[str] = field(default_factory=list)

    def digest(self, header: list[str]) -> bytes:
        h = hashlib.sha1(json.dumps(header).encode())
        for a in (self.ids.astype(np.int64), self.starts.astype(np.float64), self.ends.astype(np.float64)):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest().encode()


# -- the per-phase reduction, on numpy arrays -------------------------------------------------------
class _Windows:
    """Running per-window statistics of every series, fed chunk by chunk in time order."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, plan: list[tuple[str, int, int | None]]):
        self.starts, self.ends, self.plan = starts, ends, plan
        k, s = len(starts), len(plan)
        self.rows = np.zeros(k, dtype=np.int64)
        self.t_first = np.full(k, np.nan)
        self.t_last = np.full(k, np.nan)
        self.stats = {stat: np.full((s, k), np.nan) for stat in _STATS}
        self.t_end = -np.inf  # time of the last row fed

    def feed(self, part: dict) -> None:
        if part["t0"] < self.t_end:
            raise _FullRead("time goes backwards across chunks")
        self.t_end = max(self.t_end, part["t1"])  # a chunk outside every phase counts too
        if part["rows"] is None:
            return
        live = part["live"]
        self.rows[live] += part["rows"]
        self.t_first[live] = np.where(np.isnan(self.t_first[live]), part["t_first"], self.t_first[live])
        self.t_last[live] = part["t_last"]
        for stat in _STATS:
            mine, new = self.stats[stat][:, live], part[stat]
            if stat == "peak":
                mine = np.fmax(mine, new)
            elif stat == "floor":
                mine = np.fmin(mine, new)
            elif stat == "first":
                mine = np.where(np.isnan(mine), new, mine)
            else:
                mine = np.where(np.isnan(new), mine, new)
            self.stats[stat][:, live] = mine


def reduce_chunk(t: np.ndarray, columns: list[np.ndarray | None], starts: np.ndarray, ends: np.ndarray,
                 plan: list[tuple[str, int, int | None]]) -> dict:
    """Per-window partial statistics of one chunk of rows (t sorted, finite). `columns[i]` holds the
    values of header column i: int64 when none is absent, float64 with NaN otherwise, None when all
    are absent. The windows are start < t <= end."""
    n = len(t)
    part = {"t0": float(t[0]) if n else np.inf, "t1": float(t[-1]) if n else -np.inf, "rows": None}
    if not n:
        return part
    i0 = np.searchsorted(t, starts, "right")
    i1 = np.searchsorted(t, ends, "right")
    live = np.flatnonzero(i1 > i0)
    if not len(live):
        return part
    a, b = i0[live], i1[live]
    part.update(live=live, rows=b - a, t_first=t[a], t_last=t[b - 1])
    bounds = np.column_stack([a, np.minimum(b, n - 1)]).ravel()
    at_end = b == n
    out = {stat: np.full((len(plan), len(live)), np.nan) for stat in _STATS}
    for k, (_, level, peak) in enumerate(plan):
        y = columns[level]
        p = columns[peak] if peak is not None else None
        tops = [_window_reduce(np.fmax, x, bounds, at_end) for x in (y, p) if x is not None]
        if not tops:
            continue
        out["peak"][k] = tops[0] if len(tops) == 1 else np.fmax(tops[0], tops[1])
        if y is None:
            continue
        out["floor"][k] = _window_reduce(np.fmin, y, bounds, at_end)
        if y.dtype.kind != "f" or not (np.isnan(y[a]).any() or np.isnan(y[b - 1]).any()):
            out["first"][k], out["last"][k] = y[a], y[b - 1]
        else:  # the first/last finite value: next finite at or after a, last finite before b
            finite = ~np.isnan(y)
            idx = np.arange(n)
            next_ok = np.minimum.accumulate(np.where(finite, idx, n)[::-1])[::-1]
            prev_ok = np.maximum.accumulate(np.where(finite, idx, -1))
            first_at, last_at = np.append(next_ok, n)[a], prev_ok[b - 1]
            padded = np.append(y, np.nan)
            out["first"][k] = np.where(first_at < b, padded[first_at], np.nan)
            out["last"][k] = np.where(last_at >= a, padded[last_at], np.nan)
    part.update(out)
    return part


def _window_reduce(ufunc, x: np.ndarray, bounds: np.ndarray, at_end: np.ndarray) -> np.ndarray:
    """ufunc (np.fmax or np.fmin: NaN ignored) over each window [a, b), from `bounds` = interleaved
    (a, min(b, n - 1)): reduceat takes no index n, so a window reaching the end was reduced one short
    and gets its last element here. No temporary the size of x."""
    out = ufunc.reduceat(x, bounds)[::2].astype(np.float64)
    if at_end.any():
        out[at_end] = ufunc(out[at_end], float(x[-1]))
    return out


def _values(column: pa.ChunkedArray | pa.Array | None) -> np.ndarray | None:
    """int64 as parsed (no copy) when no value is absent; float64 with NaN for the absent ones."""
    if column is None or column.null_count == len(column):
        return None
    if column.null_count:
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
    return column.to_numpy()


def _reduce_table(table: pa.Table, header: list[str], file: _File, plan) -> dict:
    t = table.column("t")
    if t.null_count:
        raise _FullRead("a row without a time")
    t = np.asarray(t.to_numpy(), dtype=np.float64)
    if len(t) and (not np.isfinite(t).all() or (np.diff(t) < 0).any()):
        raise _FullRead("times not finite or not in order")
    columns = [_values(table.column(c)) if c in table.column_names and c not in ("t", "phase") else None
               for c in header]
    return reduce_chunk(t, columns, file.starts, file.ends, plan)


# -- parsing a file in chunks -------------------------------------------------------------------------
def _chunk_bounds(data, start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) cut at line ends into equal pieces of at most about CHUNK_BYTES (a 38 MB file in
    two of 19 MB, not 32 + 6: the pool's threads finish together)."""
    pieces = max(1, -(-(end - start) // CHUNK_BYTES))
    size = -(-(end - start) // pieces)
    bounds, at = [], start
    while at < end:
        stop = min(at + size, end)
        if stop < end:
            nl = data.find(b"\n", stop - 1, end)  # mmap.find: no copy
            stop = end if nl < 0 else nl + 1
        bounds.append((at, stop))
        at = stop
    return bounds


def _parse_chunk(data, lo: int, hi: int, header: list[str], file: _File, plan) -> tuple[dict, int]:
    skipped = [0]

    def on_invalid(_row) -> str:
        skipped[0] += 1
        return "skip"

    types = {c: pa.int64() for c in header if c not in ("t", "phase")}
    types["t"] = pa.float64()
    try:
        table = pacsv.read_csv(
            pa.py_buffer(memoryview(data)[lo:hi]),
            # one block per chunk: each column comes as one array, viewed by numpy without a copy
            read_options=pacsv.ReadOptions(column_names=header, use_threads=False, block_size=hi - lo + 1),
            parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=[c for c in header if c != "phase"]))
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError, UnicodeDecodeError) as exc:
        raise _FullRead(str(exc)) from None
    finally:
        _drop_pages(data, lo, hi)
    return _reduce_table(table, header, file, plan), skipped[0]


def _drop_pages(data, lo: int, hi: int) -> None:
    """Unmap the parsed chunk's pages from this process (they stay in the page cache): a mapped file's
    touched pages count in the RSS, and 32 files of 38 MB held mapped were 1.2 GB of it."""
    if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        start = lo - lo % mmap.PAGESIZE
        try:
            data.madvise(mmap.MADV_DONTNEED, start, hi - start)
        except (OSError, ValueError):
            pass


class _Plan:
    """One file's parse: its header, series plan, chunks and the merge of their partials."""

    def __init__(self, file: _File):
        self.file = file
        self.mapped, extents = map_regular(file.path)
        self.size = len(self.mapped)
        self.header: list[str] = []
        self.chunks: list[tuple[int, int]] = []
        self.truncated = False
        if not self.size:
            return
        # the header as samples_reader.read_samples decodes it (the first line of the first 4 KiB)
        self.header = bytes(self.mapped[:4096]).split(b"\n", 1)[0].decode(errors="replace").split(",")
        first_nl = self.mapped.find(b"\n", 0, min(self.size, 4097))
        if not usable_header(self.header) or first_nl < 0:
            return
        if sum(e - s for s, e in extents) < self.size:
            raise _FullRead("a sparse file")
        end = self.mapped.rfind(b"\n") + 1
        self.truncated = end < self.size
        self.chunks = _chunk_bounds(self.mapped, first_nl + 1, end)
        self.plan = series_plan([c for c in self.header if c not in ("t", "phase")])
        # plan indices into the header (series_plan indexed the columns without t and phase)
        values = [i for i, c in enumerate(self.header) if c not in ("t", "phase")]
        self.plan = [(name, values[li], None if pi is None else values[pi]) for name, li, pi in self.plan]


def _summaries_of(file: _File, windows: _Windows) -> pd.DataFrame:
    """One file's rows of the summaries frame: every (finished phase, series) with a value, in the
    order of a recorded summary (by phase, then series)."""
    has = np.isfinite(windows.stats["peak"]) | np.isfinite(windows.stats["first"])
    has &= (windows.rows > 0)[None, :]
    w_at, s_at = np.nonzero(has.T)  # by window, then series
    series = np.array([name for name, _, _ in windows.plan] or [""], dtype=object)
    frame = {"host": np.full(len(w_at), file.host, dtype=object), "pid": np.full(len(w_at), file.pid, dtype=np.int64),
             "id": file.ids[w_at].astype(np.int64), "name": file.names[w_at].astype(object),
             "series": series[s_at]}
    for stat in _STATS:
        values = windows.stats[stat][s_at, w_at]
        absent = np.isnan(values)  # bytes below 2**53 are exact in float64
        frame[stat] = pd.arrays.IntegerArray(np.where(absent, 0, values).astype(np.int64), absent)
    frame["rows"] = pd.arrays.IntegerArray(windows.rows[w_at].astype(np.int64), np.zeros(len(w_at), dtype=bool))
    frame["t_first"], frame["t_last"] = windows.t_first[w_at], windows.t_last[w_at]
    return pd.DataFrame(frame)[SUMMARY_COLUMNS]


def _from_frame(samples: pd.DataFrame, file: _File) -> pd.DataFrame:
    """The damage-tolerant path's frame (samples_reader.read_samples, times cleaned) reduced in one piece."""
    header = list(samples.columns)
    values = [c for c in header if c not in ("t", "phase")]
    plan = [(name, header.index(values[li]), None if pi is None else header.index(values[pi]))
            for name, li, pi in series_plan(values)]
    columns = [None if c in ("t", "phase") else samples[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in header]
    columns = [None if c is None or np.isnan(c).all() else c for c in columns]
    windows = _Windows(file.starts, file.ends, plan)
    windows.feed(reduce_chunk(samples["t"].to_numpy(np.float64), columns, file.starts, file.ends, plan))
    return _summaries_of(file, windows)


def _read_whole(file: _File) -> pd.DataFrame:
    try:
        samples = read_samples(file.path, file.warnings)
    except NotRegularFile as exc:
        file.warnings.append(str(exc))
        return _empty()
    if samples is None or not len(samples):
        return _empty()
    return _from_frame(clean_times(samples, file.warnings, file.path.name), file)


# -- the cache ------------------------------------------------------------------------------------------
def cache_path(samples_csv: Path) -> Path:
    return samples_csv.with_name(f".{samples_csv.name}{CACHE_SUFFIX}")


def _cache_key(stat: os.stat_result, digest: bytes) -> dict[bytes, bytes]:
    return {b"format": _CACHE_TAG, b"size": str(stat.st_size).encode(),
            b"mtime_ns": str(stat.st_mtime_ns).encode(), b"windows": digest}


def _content_digest(table: pa.Table) -> bytes:
    """A digest of every value (and every absent one): a flipped bit in the data is caught, not read."""
    h = hashlib.sha1()
    for column in table.columns:
        h.update(np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool).tobytes())
        if pa.types.is_string(column.type):
            h.update("\0".join(column.fill_null("").to_pylist()).encode("utf-8", "surrogatepass"))
        else:
            h.update(column.fill_null(0).to_numpy().tobytes())
    return h.hexdigest().encode()


def _cache_enabled(stat: os.stat_result, file: _File) -> bool:
    """A finished (or long unchanged) file large enough to be worth it, whose phase ids name one
    phase each (damaged events can repeat an id: the cache keys its rows by id)."""
    return (os.environ.get("MILES_PROFILE_CACHE", "1") != "0" and stat.st_size >= CACHE_MIN_BYTES
            and (file.cacheable or time.time() - stat.st_mtime > STALE_S)
            and len(np.unique(file.ids)) == len(file.ids))


def _read_cache(file: _File, stat: os.stat_result, header: list[str]) -> pd.DataFrame | None:
    """The cached rows if the cache is intact and made from this very CSV and these phases; else None."""
    try:
        fd = open_regular(cache_path(file.path))  # a FIFO or a device by that name is never opened
    except NotRegularFile:
        return None
    try:
        with os.fdopen(fd, "rb") as source:
            if os.fstat(source.fileno()).st_size > CACHE_MAX_BYTES:
                return None
            data = source.read(CACHE_MAX_BYTES + 1)
        if len(data) > CACHE_MAX_BYTES:
            return None
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        meta = table.schema.metadata or {}
        if any(meta.get(k) != v for k, v in _cache_key(stat, file.digest(header)).items()):
            return None
        if not table.schema.remove_metadata().equals(_CACHE_SCHEMA):
            return None
        table.validate(full=True)
        if meta.get(b"content") != _content_digest(table):
            return None
        warnings = json.loads(meta.get(b"warnings", b"[]"))
        if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
            return None
        if table.column("id").null_count or table.column("rows").null_count or table.column("series").null_count:
            return None
        ids = table.column("id").to_numpy()
        order = np.argsort(file.ids, kind="stable")
        at = order[np.minimum(np.searchsorted(file.ids[order], ids), len(order) - 1)] if len(order) else ids[:0]
        if len(ids) and (not len(order) or (file.ids[at] != ids).any()):
            return None  # a phase this file does not have
        frame = {"host": np.full(len(ids), file.host, dtype=object), "pid": np.full(len(ids), file.pid, dtype=np.int64),
                 "id": ids.astype(np.int64), "name": file.names[at].astype(object),
                 "series": table.column("series").to_numpy(zero_copy_only=False).astype(object)}
        for stat in _STATS:
            frame[stat] = table.column(stat).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get).array
        rows = table.column("rows").to_numpy()
        frame["rows"] = pd.arrays.IntegerArray(rows.astype(np.int64), np.zeros(len(rows), dtype=bool))
        frame["t_first"] = table.column("t_first").to_numpy(zero_copy_only=False)
        frame["t_last"] = table.column("t_last").to_numpy(zero_copy_only=False)
        file.warnings.extend(warnings)
        return pd.DataFrame(frame)[SUMMARY_COLUMNS]
    except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, RecursionError):
        return None


def _write_cache(file: _File, stat: os.stat_result, header: list[str], frame: pd.DataFrame) -> None:
    """Leave the rows beside the CSV, atomically; a directory that can't be written gets none."""
    cache = cache_path(file.path)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        columns = {f.name: pa.array(frame[f.name].to_numpy(dtype=object if f.type == pa.string() else None)
                                    if f.name in ("id", "series", "t_first", "t_last") else frame[f.name],
                                    type=f.type, from_pandas=True) for f in _CACHE_SCHEMA}
        table = pa.table(columns, schema=_CACHE_SCHEMA)
        table = table.replace_schema_metadata({**_cache_key(stat, file.digest(header)), b"content": _content_digest(table),
                                               b"warnings": json.dumps(file.warnings).encode()})
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, cache)
    except (OSError, pa.ArrowException, ValueError, TypeError):
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


# -- a run ------------------------------------------------------------------------------------------------
def _empty() -> pd.DataFrame:
    return summaries_frame(pd.DataFrame({"kind": [], "host": [], "pid": [], "id": [], "name": [], "attrs": []}))


def _files(run, who: set[tuple[str, int]] | None) -> list[_File]:
    """The samples files of the processes (in `who`) that have finished phases, with those phases."""
    phases = run.phases
    if phases.empty:
        return []
    phases = phases[phases["status"].astype(str) != "open"]
    hosts = phases["host"].fillna("").astype(str).to_numpy() if "host" in phases else np.full(len(phases), "")
    by_process = pd.Series(np.arange(len(phases))).groupby([hosts, phases["pid"].to_numpy(np.int64)]).indices
    ids, names = phases["id"].to_numpy(np.int64), phases["name"].astype(str).to_numpy(dtype=object)
    starts, ends = phases["start"].to_numpy(np.float64), phases["end"].to_numpy(np.float64)
    aliases = {p["stem"]: p["pid"] for p in run.processes if "os_pid" in p and isinstance(p.get("stem"), str)}
    finished = {p.get("stem") for p in run.processes if p.get("end_time") or p.get("died")}
    copies = copied_stems(list(run.directories))
    files = []
    for folder in run.directories:
        for path in sorted(Path(folder).glob(f"*{SAMPLES_SUFFIX}")):
            stem = path.name[: -len(SAMPLES_SUFFIX)]
            host, _, pid_text = stem.rpartition("-")
            if stem in copies.get(folder, ()) or not host:
                continue
            try:
                pid = int(aliases.get(stem, pid_text))
            except ValueError:
                continue
            rows = by_process.get((host, pid))
            if rows is None or (who is not None and (host, pid) not in who):
                continue
            files.append(_File(path, host, pid, ids[rows], names[rows], starts[rows], ends[rows], stem in finished))
    return files


def summaries_from_samples(run, who: set[tuple[str, int]] | None = None, loaded=None) -> pd.DataFrame:
    """The phase summaries of `run`'s finished phases computed from its samples files (for the
    processes `who`, as (host, pid), or all), in the frame of `summaries.summaries_frame`. Computed
    once per process and run (kept in the run), read from the cache beside each file where it is
    valid. Warnings about damaged files go to `run.warnings` (each once). `loaded(pid)`: that process's
    samples already in memory (a frame with t, phase and its columns), or None: reduced from memory
    instead of parsing its file a second time."""
    done: dict = run.__dict__.setdefault("_sample_summaries", {})
    todo = [f for f in _files(run, who) if (f.host, f.pid) not in done]
    if loaded is not None:
        on_disk = []
        for file in todo:
            frame = loaded(file.pid)
            if frame is None or not len(frame):
                on_disk.append(file)
            else:
                done[(file.host, file.pid)] = _from_frame(frame.drop(columns=["pid"], errors="ignore"), file)
        todo = on_disk
    for file, frame in zip(todo, _compute(todo)):
        done[(file.host, file.pid)] = frame
        run.warnings.extend(w for w in file.warnings if w not in run.warnings)
    frames = [frame for key, frame in done.items() if (who is None or key in who) and len(frame)]
    if not frames:
        return _empty()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def processes_read(run) -> set[tuple[str, int]]:
    """The (host, pid) whose samples files `summaries_from_samples` has read (or found cached) so far."""
    return set(run.__dict__.get("_sample_summaries", {}))


def _compute(files: list[_File]) -> list[pd.DataFrame]:
    """Each file's rows: from its cache, else parsed in chunks by the pool, else read whole."""
    results: list[pd.DataFrame | None] = [None] * len(files)
    plans: dict[int, _Plan] = {}
    stats: dict[int, os.stat_result] = {}
    for k, file in enumerate(files):
        try:
            stats[k] = os.stat(file.path)
            plan = _Plan(file)
        except _FullRead:
            continue  # read whole below
        except (NotRegularFile, OSError) as exc:
            file.warnings.append(str(exc) if isinstance(exc, NotRegularFile) else f"{file.path.name}: unreadable")
            results[k] = _empty()
            continue
        if plan.size and not usable_header(plan.header):
            file.warnings.append(f"{file.path.name}: no t/phase header, skipped")
        if not plan.chunks:  # empty, header only, or no usable header
            results[k] = _empty()
            continue
        cached = _read_cache(file, stats[k], plan.header) if _cache_enabled(stats[k], file) else None
        if cached is not None:
            results[k] = cached
        else:
            plans[k] = plan
    for k, frame in _parse_all(plans, stats).items():
        results[k] = frame
    for k, file in enumerate(files):
        if results[k] is None:  # damaged: the reader's tolerant path, then the same reduction
            file.warnings.clear()
            results[k] = _read_whole(file)
            header = plans[k].header if k in plans else _header_of(file.path)
            if k in stats and header and _cache_enabled(stats[k], file):
                _write_cache(file, stats[k], header, results[k])
    return results


def _parse_all(plans: dict[int, "_Plan"], stats: dict[int, os.stat_result]) -> dict[int, pd.DataFrame | None]:
    """The chunks of every file parsed and reduced by a pool of threads; the thread that reduces a
    file's last chunk merges them, builds its rows and writes its cache, while the other parses on.
    {file: rows, or None where the fast parse failed}."""
    parts: dict[int, list | None] = {k: [None] * len(p.chunks) for k, p in plans.items()}
    left = {k: len(p.chunks) for k, p in plans.items()}
    done: dict[int, pd.DataFrame | None] = {}
    lock = threading.Lock()

    def one(task):
        k, i = task
        if parts[k] is None:
            return
        plan = plans[k]
        lo, hi = plan.chunks[i]
        try:
            result = _parse_chunk(plan.mapped, lo, hi, plan.header, plan.file, plan.plan)
        except _FullRead:
            result = None
        with lock:
            if parts[k] is None:
                return
            if result is None:
                parts[k] = None
                return
            parts[k][i] = result
            left[k] -= 1
            last = not left[k]
        if last:
            done[k] = _finish(plan, parts[k], stats[k])

    with quiet_invalid_rows(), ThreadPoolExecutor(max_workers=workers()) as pool:
        list(pool.map(one, [(k, i) for k, plan in plans.items() for i in range(len(plan.chunks))]))
    return done


def _finish(plan: "_Plan", parts: list, stat: os.stat_result) -> pd.DataFrame | None:
    """One file's partials merged in order into its rows (None: times out of order, read it whole)."""
    file = plan.file
    try:
        windows = _Windows(file.starts, file.ends, plan.plan)
        for part, _ in parts:
            windows.feed(part)
    except _FullRead:
        return None
    skipped = sum(bad for _, bad in parts)
    if skipped:
        file.warnings.append(f"{file.path.name}: skipped {skipped} malformed rows")
    if plan.truncated:
        file.warnings.append(f"{file.path.name}: dropped a truncated last line")
    frame = _summaries_of(file, windows)
    if stat.st_size == plan.size and _cache_enabled(stat, file):
        _write_cache(file, stat, plan.header, frame)
    return frame


def _header_of(path: Path) -> list[str]:
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            return f.readline(4096).decode(errors="replace").rstrip("\n").split(",")
    except (NotRegularFile, OSError):
        return []
