"""One process's samples file read into a frame (typed columns, damage dropped and said), and the
processes' frames of a run merged in time order."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from miles_profile.logdir.arrow_csv import read_csv
from miles_profile.logdir.damaged_csv import hexadecimal_cell, quiet_invalid_rows, read_damaged, usable_header
from miles_profile.logdir.files import NotRegularFile, map_regular
from miles_profile.logdir.layout import SAMPLES_SUFFIX, pid_of
from miles_profile.logdir.ranges import drop_impossible_bytes
from miles_profile.logdir.samples_cache import cache_enabled, read_cache, write_cache


def read_samples_cached(path: Path, warnings: list[str], finished: bool) -> pd.DataFrame | None:
    use_cache = finished and cache_enabled(path)
    if use_cache:
        frame = read_cache(path, warnings)
        if frame is not None:
            return frame
    return read_samples(path, warnings, cache=use_cache)


def read_samples(path: Path, warnings: list[str], cache: bool = False) -> pd.DataFrame | None:
    """Parse one samples CSV; with `cache`, leave the parsed columns for the next read
    (samples_cache.py).
    Only a regular file is read (NotRegularFile otherwise); damage goes to `read_damaged`, whose cost
    stays near the fast path's."""
    mapped, extents = map_regular(path)
    data = memoryview(mapped)
    end = bytes(data[-65536:]).rfind(b"\n") if len(data) else -1
    if end >= 0:
        end += max(0, len(data) - 65536) + 1
    header_line = bytes(data[:4096]).split(b"\n", 1)[0]
    header = header_line.decode(errors="replace").split(",")
    if not usable_header(header):
        warnings.append(f"{path.name}: no t/phase header, skipped")
        return None
    skipped: list[int] = []
    types = {c: pa.int64() for c in header if c not in ("t", "phase")}
    types.update(t=pa.float64(), phase=pa.dictionary(pa.int32(), pa.string()))
    # A malformed row that is not UTF-8 fails inside pyarrow's row handler; the read then fails and
    # read_damaged takes over (quiet_invalid_rows keeps pyarrow's "Exception ignored" off the terminal).
    with quiet_invalid_rows():
        try:
            if end < 0:  # no newline in the last 64 KiB: a long damaged tail (or no line at all)
                raise pa.ArrowInvalid("no line end near the end of the file")
            if hexadecimal_cell(mapped, extents, len(header_line) + 1):  # pyarrow reads `0x10` as 16
                raise pa.ArrowInvalid("a hexadecimal cell")
            # A complete file parses fastest from its path (pyarrow overlaps reading and parsing);
            # a file with a truncated last line is parsed from a buffer cut before that line.
            table = read_csv(
                str(path) if end == len(data) else pa.py_buffer(data[:end]), skipped,
                read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),  # names as decoded above
                # only an empty cell is absent: pyarrow's default null words ("nan", "NULL", "N/A") are damage to say
                convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False, null_values=[""]),
            )
            if skipped:
                warnings.append(f"{path.name}: skipped {len(skipped)} malformed rows")
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError, UnicodeDecodeError) as exc:
            table, end = read_damaged(data, extents, header, path.name, warnings, str(exc), end)
            if table is None:
                return None
    if end < len(data):
        warnings.append(f"{path.name}: dropped a truncated last line")
    if "t" not in table.column_names or "phase" not in table.column_names:
        warnings.append(f"{path.name}: no t/phase header, skipped")
        return None
    frame = table.to_pandas(split_blocks=True, self_destruct=True)  # no consolidation copy
    del table
    if cache:  # from the frame: one chunk, one dictionary, so the next read converts in a blink
        parsed = [w for w in warnings if w.startswith(path.name)]
        # Written by a thread while the caller goes on (the interpreter waits for it at exit).
        threading.Thread(target=write_cache, name="miles_profile-cache", args=(
            path, pa.Table.from_pandas(frame, preserve_index=False), parsed)).start()
    return frame


def read_process_frames(run_dir: Path, warnings: list[str], finished: set | frozenset = frozenset(), pids=None,
                        skip: set[str] | None = None, aliases: dict[str, int] | None = None) -> list[pd.DataFrame]:
    """Each samples file of `run_dir` read (in name order) into a frame of its own: t, phase, pid, then its
    own columns, times cleaned and impossible bytes dropped; files without rows left out."""
    frames = []
    for path in sorted(run_dir.glob(f"*{SAMPLES_SUFFIX}")):
        stem = path.name[: -len(SAMPLES_SUFFIX)]
        pid = (aliases or {}).get(stem, pid_of(path, SAMPLES_SUFFIX))
        if pids is not None and pid not in pids:
            continue
        if skip and stem in skip:
            continue
        try:
            frame = read_samples_cached(path, warnings, path.name[: -len(SAMPLES_SUFFIX)] in finished)
        except NotRegularFile as exc:
            warnings.append(str(exc))
            continue
        if frame is not None and len(frame):
            frame = clean_times(frame, warnings, path.name)
            frame = drop_impossible_bytes(frame, warnings, path.name)
            frame.insert(2, "pid", np.int64(pid))
            frames.append(frame)
    return frames


def rows_naming_a_phase(phase: pd.Series) -> pd.Series:
    """Which rows of a `phase` column name a phase (outside a phase it is empty, or NaN once read)."""
    named = phase.astype(str)
    return (named != "") & (named != "nan")


def phase_named(phase: pd.Series) -> bool:
    """Whether a `phase` column names a phase in any row."""
    return bool(rows_naming_a_phase(phase).any())


def empty_samples() -> pd.DataFrame:
    return pd.DataFrame({"t": pd.Series(dtype=float), "phase": pd.Series(dtype="category"),
                         "pid": pd.Series(dtype="int64")})


def read_all_samples(run_dir: Path, warnings: list[str], finished: set | frozenset = frozenset(),
                     pids=None, skip: set[str] | None = None, aliases: dict[str, int] | None = None) -> pd.DataFrame:
    frames = read_process_frames(run_dir, warnings, finished, pids, skip, aliases)
    if not frames:
        return empty_samples()
    if len(frames) == 1:
        return frames[0]
    return _concat_by_time(frames)  # processes interleave in time


# how many times a run's merged frame was built from its processes' frames (ProcessSamples.merged): a
# report that reads only the processes' own frames leaves it unchanged (tests/unit/test_process_samples.py)
merges_built = 0


class ProcessSamples:
    """A run's samples kept per process, as read: no merged frame of every process's columns (on 32
    processes of 300,000 rows, 9.6 million rows x 11 columns, 7/8 of each GPU column empty, the most
    of visualize's memory). `frames`: in read order; `by_pid`: pid -> its frame (t, phase, pid and the
    columns of its own file, in time order). With more than one frame every `phase` has the sorted union
    of the phase names as categories, as the merged frame's has, so a process's codes are the merged
    frame's. `merged()`: the frame `read_all_samples`/`merge_samples` gave, built on demand."""

    def __init__(self, frames: list[pd.DataFrame]):
        frames = [f for f in frames if len(f)]
        if len(frames) > 1:
            _same_phase_categories(frames)
            _merged_dtypes(frames)
        self.frames = frames
        grouped: dict[int, list[pd.DataFrame]] = {}
        for frame in frames:
            grouped.setdefault(int(frame["pid"].iat[0]), []).append(frame)
        # a pid read from two files (two directories of one host): one frame in time order, as in the merge
        self.by_pid = {pid: found[0] if len(found) == 1 else _concat_by_time(found, release=False)
                       for pid, found in grouped.items()}
        # the merged frame's columns, in its order: the union in order of appearance
        self.columns = list(dict.fromkeys(c for f in frames for c in f.columns)) if frames else ["t", "phase", "pid"]
        self.rows = sum(len(f) for f in frames)

    def own_columns(self, pid: int) -> list[str]:
        """t, phase, pid and the columns `pid`'s frame has a value in, in the merged frame's order."""
        cache = self.__dict__.setdefault("_own", {})
        if pid not in cache:
            frame = self.by_pid[pid]
            cache[pid] = [c for c in self.columns if c in frame and (
                c in ("t", "phase", "pid") or not frame[c].hasnans or frame[c].notna().any())]
        return cache[pid]

    def empty_merged(self) -> pd.DataFrame:
        """`merged().iloc[:0]`: its columns and dtypes, no rows."""
        if not self.frames:
            return empty_samples()
        dtypes = {}
        for frame in self.frames:
            for c in frame.columns:
                dtypes.setdefault(c, frame[c].dtype)
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in dtypes.items()}, columns=self.columns)

    def merged(self) -> pd.DataFrame:
        global merges_built
        merges_built += 1
        if not self.frames:
            return empty_samples()
        if len(self.frames) == 1:
            return self.frames[0]
        return _concat_by_time(self.frames, release=False)

    def names_a_phase(self, pid: int) -> bool | None:
        """Whether any row of `pid` names a phase; None where it has no rows."""
        frame = self.by_pid.get(pid)
        return None if frame is None else phase_named(frame["phase"])

    def last_t(self) -> float | None:
        return max(float(f["t"].max()) for f in self.frames) if self.frames else None


def _concat_by_time(frames: list[pd.DataFrame], release: bool = True) -> pd.DataFrame:
    """`pd.concat(frames).sort_values("t", kind="stable").reset_index(drop=True)`, built one column at a
    time: the frames' column sets differ (gpu3_proc in one process, gpu5_proc in another), and the
    concat filled every hole and copied the whole wide frame twice more to sort it (40 % of visualize on
    32 processes of 300,000 rows). The same frame: the union of columns in order of appearance, int64
    where every frame has the column as int64, float64 with NaN otherwise, `phase` categorical with
    the sorted union of categories."""
    _same_phase_categories(frames)
    sizes = [len(f) for f in frames]
    starts = np.cumsum([0, *sizes[:-1]])
    order = np.argsort(np.concatenate([f["t"].to_numpy(np.float64) for f in frames]), kind="stable")
    # where each frame's rows go: each column is scattered there frame by frame, so a column only a few
    # processes have (gpu3_proc) moves only their rows, and no concatenated copy is made to be sorted
    where = np.empty_like(order)
    where[order] = np.arange(len(order))
    slots = [where[a:a + n] for a, n in zip(starts, sizes)]
    columns = list(dict.fromkeys(c for f in frames for c in f.columns))
    out = {}
    for column in columns:
        have = [column in f for f in frames]
        if column == "phase":
            codes = np.empty(len(order), dtype=frames[0]["phase"].cat.codes.dtype)
            for f, slot in zip(frames, slots):
                codes[slot] = f["phase"].cat.codes.to_numpy()
            out[column] = pd.Categorical.from_codes(codes, dtype=frames[0]["phase"].dtype)
            if release:
                _release(frames, column)
            continue
        dtypes = {f[column].dtype for f in frames if column in f}
        dtype = next(iter(dtypes))
        if all(have) and len(dtypes) == 1 and isinstance(dtype, np.dtype) and dtype != object:
            values = np.empty(len(order), dtype=dtype)
            for f, slot in zip(frames, slots):
                values[slot] = f[column].to_numpy()
        elif all(have) and len(dtypes) == 1 and dtype != object:  # an extension dtype: as pd.concat would
            values = np.concatenate([f[column].to_numpy() for f in frames])[order]
        else:
            values = np.full(len(order), np.nan)
            for f, slot in zip(frames, slots):
                if column in f:
                    values[slot] = f[column].to_numpy(np.float64, na_value=np.nan)
        out[column] = values
        if release:  # not when the frames are kept (ProcessSamples)
            _release(frames, column)
    # no consolidation: pandas would copy the columns into one 2-D block, doubling the 0.8 GB frame of
    # 32 x 300,000 rows at the moment of the peak
    return pd.DataFrame(out, copy=False)


def _merged_dtypes(frames: list[pd.DataFrame]) -> None:
    """Give each frame's columns the dtype the merged frame has (_concat_by_time): float64 with NaN where
    not every frame has the column as one dtype, so a process's frame holds what its rows of the merged
    frame would."""
    for column in dict.fromkeys(c for f in frames for c in f.columns):
        if column == "phase":
            continue
        have = [f for f in frames if column in f]
        dtypes = {f[column].dtype for f in have}
        if len(have) == len(frames) and len(dtypes) == 1 and next(iter(dtypes)) != object:
            continue
        for f in have:
            if f[column].dtype != np.float64:
                f[column] = f[column].to_numpy(np.float64, na_value=np.nan)


def _release(frames: list[pd.DataFrame], column: str) -> None:
    """Drop a merged column from the processes' frames (the callers' own, read for this merge alone), so
    what was read is given back while the merged frame grows: the peak is one copy of the samples."""
    for frame in frames:
        if column in frame:
            del frame[column]


def _same_phase_categories(frames: list[pd.DataFrame]) -> None:
    """Give every frame's `phase` the same sorted categories (what `.astype(str).astype("category")` of
    the concatenated column gave), so pd.concat keeps it categorical instead of making 10M strings."""
    from pandas.api.types import union_categoricals
    columns = [f["phase"].astype(str).astype("category") if not isinstance(f["phase"].dtype, pd.CategoricalDtype)
               else f["phase"] for f in frames]
    categories = union_categoricals(columns, sort_categories=True).categories
    for frame, column in zip(frames, columns):
        frame["phase"] = column.cat.set_categories(categories)


def clean_times(samples: pd.DataFrame, warnings: list[str], source: str) -> pd.DataFrame:
    t = samples["t"].to_numpy()
    bad = ~np.isfinite(t)
    if bad.any():
        warnings.append(f"{source}: dropped {int(bad.sum())} samples without a valid time")
        samples = samples.loc[~bad]
        t = samples["t"].to_numpy()
    if len(t) > 1 and (np.diff(t) < 0).any():
        warnings.append(f"{source}: samples were out of time order; sorted")
        samples = samples.sort_values("t", kind="stable")
    return samples.reset_index(drop=True)


def merge_samples(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)] or frames[:1]
    if len(frames) == 1:
        return frames[0]
    return _concat_by_time(frames)

