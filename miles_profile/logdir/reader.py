"""Read a run directory into pandas DataFrames, merging all its processes.

Damage is tolerated and reported, not fatal: a truncated last line (a killed writer), garbage
rows, undecodable events and out-of-order or NaN timestamps are dropped or fixed, and each is named
in `Run.warnings`. A missing run, an unknown format version or a run with no meta is an error.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from miles_profile import names
from miles_profile.command_exit import stop_signal
from miles_profile.logdir import completeness
from miles_profile.logdir.cluster import cluster_warnings
from miles_profile.logdir.merge import alias_event_pids, copied_stems, pid_aliases
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.events import EventProblems, parse_event_lines
from miles_profile.logdir.ranges import drop_impossible_bytes, drop_impossible_ceilings
from miles_profile.logdir.damaged_csv import quiet_invalid_rows, read_damaged, usable_header
from miles_profile.logdir.files import EVENT_LINE_MAX, NotRegularFile, bounded_lines, map_regular, read_small
from miles_profile.logdir.layout import (
    EVENTS_SUFFIX, FORMAT_VERSION, PROCESS_META_SUFFIX, RUN_META, SAMPLES_SUFFIX, find_runs,
)
from miles_profile.logdir.accounts import accounts_frame
from miles_profile.logdir.host_reader import gpu_used_arrays, host_frames, host_meta
from miles_profile.logdir.summaries import summaries_frame

PHASE_COLUMNS = ["name", "start", "end", "duration", "pid", "host", "id", "parent", "depth", "status", "attrs"]
EVENT_COLUMNS = ["t", "kind", "name", "pid", "host", "id", "parent", "attrs"]


@dataclass
class Run:
    path: Path
    meta: dict[str, Any]
    processes: list[dict[str, Any]]
    samples: pd.DataFrame  # t, phase, pid, then byte columns (int64, float64 where a value is absent)
    events: pd.DataFrame
    phases: pd.DataFrame  # one row per phase instance
    warnings: list[str] = field(default_factory=list)
    directories: list[Path] = field(default_factory=list)  # every directory of the run (several hosts)

    # Samples were read only for these pids (None: all of them); see load_run(sample_pids=...).
    sample_pids: frozenset | None = None

    # Host-level data (host_sampler.py), read on first use: whole-run analysis may never need it.
    # The per-process GPU rows (millions on a 64-host run) are read apart from the host rows.
    @cached_property
    def _host_data(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        return host_frames(self.directories, self.warnings, procs=False)

    @cached_property
    def _gpu_procs(self) -> pd.DataFrame:
        return host_frames(self.directories, self.warnings, samples=False)[2]

    @cached_property
    def gpu_used(self) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
        """{(host, gpu_uuid): (t, used)}: NVML used of each GPU as arrays (the data of `gpu_samples`,
        read from the wide files without building the long frame; see host_reader.gpu_used_arrays)."""
        if "_host_data" in self.__dict__:  # already read as a frame: split it rather than read again
            g = self.gpu_samples
            return {(str(h), str(u)): (f["t"].to_numpy(float), f["used"].to_numpy(float))
                    for (h, u), f in g.groupby(["host", "gpu_uuid"], sort=False, observed=True)}
        return gpu_used_arrays(self.directories, self.warnings)

    def gpu_procs_of(self, hosts) -> pd.DataFrame:
        """`gpu_procs` of some hosts only: reads just their files (unless all were read already)."""
        if "_gpu_procs" in self.__dict__:
            procs = self._gpu_procs
            return procs[procs["host"].isin([str(h) for h in hosts])]
        return host_frames(self.directories, self.warnings, samples=False, only_hosts=hosts)[2]

    @property
    def host_samples(self) -> pd.DataFrame:
        """t, host, host_available, host_total, cgroup_usage, cgroup_limit: one row per host sample."""
        return self._host_data[0]

    @property
    def gpu_samples(self) -> pd.DataFrame:
        """t, host, gpu_uuid, used: NVML bytes used on each GPU of each host, by everyone."""
        return self._host_data[1]

    @property
    def gpu_procs(self) -> pd.DataFrame:
        """t, host, gpu_uuid, pid, bytes: every process NVML listed on each GPU at each host sample."""
        return self._gpu_procs

    @cached_property
    def hosts(self) -> list[dict[str, Any]]:
        """The host samplers' meta (host, pid, gpus with uuid/name/total, probes), one per holder."""
        return host_meta(self.directories, self.warnings)

    @cached_property
    def phase_summaries(self) -> pd.DataFrame:
        """One row per (phase instance, series) from the `end` events' summaries: host, pid, id, name,
        series, peak, floor, first, last, rows, t_first, t_last. See phase_summary.py. Phases whose
        `end` has none: logdir/sample_summaries.summaries_from_samples(run) gives the same frame,
        streamed from the samples files."""
        return summaries_frame(self.events)

    @cached_property
    def accounts(self) -> pd.DataFrame:
        """t, host, pid, device, category, bytes: each value a program declared with `account()`,
        one row per change (logdir/accounts.py)."""
        return accounts_frame(self.events)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def devices(self) -> list[dict[str, Any]]:
        """GPUs as NVML saw them (index, name, uuid, total bytes), from the first process that saw any."""
        return next((p["devices"] for p in self.processes if p.get("devices")), [])

    @property
    def gpu_indices(self) -> list[int]:
        found = {int(c[3:].split("_")[0]) for c in self.samples.columns if c.startswith("gpu") and "_" in c}
        return sorted(found)

    @property
    def interval_ms(self) -> float | None:
        return self.meta.get("interval_ms")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """A meta file: a regular file of at most META_MAX_BYTES (NotRegularFile otherwise)."""
    try:
        data = json.loads(read_small(path))
    except NotRegularFile:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise MilesProfileError(f"{path}: unreadable {what} ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise MilesProfileError(f"{path}: {what} is not a JSON object")
    version = data.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:  # `true == 1` in Python: not a version
        raise MilesProfileError(
            f"{path}: log format version {version!r}; this miles-profile reads version {FORMAT_VERSION}")
    return data


def _run_id(run_dir: Path, meta: dict[str, Any]) -> str:
    # A version-1 log from before run ids is a run of its own.
    return str(meta.get("run_id") or f"dir:{run_dir.resolve()}")


def run_id_of(run_dir: Path) -> str:
    """The run id in a run directory's meta (unreadable meta: the directory itself, the load says why)."""
    try:  # the guarded open: a FIFO meta.json would block, a sparse 2 GiB one cost gigabytes
        meta = json.loads(read_small(Path(run_dir) / RUN_META))
    except (MilesProfileError, OSError, ValueError, RecursionError):
        meta = {}
    return _run_id(Path(run_dir), meta if isinstance(meta, dict) else {})


def resolve_runs(paths: tuple[str | Path, ...]) -> list[tuple[Path, dict[str, Any]]]:
    """The directories (and run metas) of the one run that `paths` hold, oldest first.

    Directories with the same run id (one run recorded on several hosts, each into its own directory)
    are one run; different run ids are an error that names them."""
    if not paths:
        raise MilesProfileError("no run directory given")
    found: dict[Path, dict[str, Any]] = {}
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise MilesProfileError(f"{path}: no such file or directory")
        runs = find_runs(path)
        if not runs:
            raise MilesProfileError(f"{path}: no miles-profile run here (no {RUN_META} in it or its subdirectories)")
        for run_dir in runs:
            found.setdefault(run_dir.resolve(), _read_json(run_dir / RUN_META, "run meta"))
    ids = {}
    for run_dir, meta in found.items():
        ids.setdefault(_run_id(run_dir, meta), []).append(run_dir)
    if len(ids) > 1:
        where = str(paths[0]) if len(paths) == 1 else ", ".join(map(str, paths))
        example = max(found, key=lambda d: (found[d].get("start_time") or 0, str(d)))
        raise MilesProfileError(f"{where} holds {len(ids)} runs; pass one of them, e.g. {example}")
    return sorted(found.items(), key=lambda item: (item[1].get("start_time") or 0, str(item[0])))


def load_run(*paths: str | Path, sample_pids=None) -> Run:
    """One run from one or more directories: a run directory, the log dir above it, or the directories
    that the hosts of one run wrote (same run id), merged. `sample_pids`: read the samples of these
    pids only (an empty set: none; the metas, events and phase summaries are read all the same), for a
    whole-fleet view that reads samples only for the timelines it shows; `with_samples` adds them."""
    dirs = resolve_runs(paths)
    run_dir, meta = dirs[0]
    if len(dirs) > 1:
        meta = {**meta, "directories": [str(d) for d, _ in dirs]}
    warnings: list[str] = []
    meta = drop_impossible_ceilings(meta, warnings, str(run_dir / RUN_META))
    copies = copied_stems([d for d, _ in dirs], warnings)
    processes, sample_frames, event_frames = [], [], []
    for folder, _ in dirs:
        found = _read_process_metas(folder, warnings, copies.get(folder, set()))
        completeness.apply_status(folder, found, warnings)
        completeness.warn_missing_files(folder, found, warnings)
        processes += found
    aliases = pid_aliases(processes, warnings)
    without_events: list[str] = []  # stems whose events file gave no event
    for folder, _ in dirs:
        finished = {p.get("stem") for p in processes if p.get("end_time")}
        sample_frames.append(_read_all_samples(folder, warnings, finished, sample_pids, copies.get(folder), aliases))
        event_frames.append(_read_all_events(folder, warnings, copies.get(folder), without_events))
    samples = sample_frames[0] if len(sample_frames) == 1 else _merge_samples(sample_frames)
    events = event_frames[0] if len(event_frames) == 1 else events_frame(
        [row for frame in event_frames for row in frame.to_dict("records")])
    events = alias_event_pids(events, aliases)
    _mark_dead(processes, warnings)
    completeness.warn_incomplete(processes, warnings)
    completeness.warn_unended([d for d, _ in dirs], processes, warnings)
    completeness.warn_missing_ranks(processes, warnings)
    completeness.warn_clock_skew(dirs, warnings)
    for folder, _ in dirs:  # a Ray job's lost nodes and unreached workers (logdir/cluster.py)
        warnings += cluster_warnings(folder, processes)
    # only stems with samples of their own: a pid read from a name (e-7) may be another host's process 7
    with_rows = {s for s in without_events for folder, _ in dirs if _has_rows(folder / f"{s}{SAMPLES_SUFFIX}")}
    completeness.warn_phases_without_events(
        samples, {s: aliases.get(s, _pid_of(Path(s + EVENTS_SUFFIX), EVENTS_SUFFIX)) for s in with_rows}, warnings)
    phases = phases_from_events(events, samples)
    outside = [p["pid"] for p in processes if p.get("role") == "exec_parent"]
    if outside and len(samples):
        samples = _fill_phases_from_timeline(samples, events, outside)
    return Run(run_dir, meta, processes, samples, events, phases, completeness.collapse_repeats(warnings),
               [d for d, _ in dirs], None if sample_pids is None else frozenset(sample_pids))


def _has_rows(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def with_samples(run: Run, pids=None) -> Run:
    """The run with the samples of `pids` (None: every process) read in, replacing those it had;
    events, phases and host data already read are kept, not read again."""
    warnings: list[str] = []
    finished = {p.get("stem") for p in run.processes if p.get("end_time")}
    copies = copied_stems(run.directories)
    aliases = {p["stem"]: p["pid"] for p in run.processes if "os_pid" in p and isinstance(p.get("stem"), str)}
    frames = [_read_all_samples(folder, warnings, finished, pids, copies.get(folder), aliases)
              for folder in run.directories]
    samples = frames[0] if len(frames) == 1 else _merge_samples(frames)
    # a lazy load read no samples: a process without events is judged against them now
    have = set(run.events["pid"].tolist()) if len(run.events) else set()
    found: list[str] = []
    completeness.warn_phases_without_events(samples, {p["stem"]: p["pid"] for p in run.processes if isinstance(
        p.get("stem"), str) and p.get("pid") not in have}, found)
    warnings += [w for w in found if w not in run.warnings]
    outside = [p["pid"] for p in run.processes if p.get("role") == "exec_parent"]
    if outside and len(samples):
        samples = _fill_phases_from_timeline(samples, run.events, outside)
    new = Run(run.path, run.meta, run.processes, samples, run.events, run.phases, run.warnings + warnings,
              run.directories, None if pids is None else frozenset(pids))
    for cached in ("_host_data", "_gpu_procs", "gpu_used", "hosts", "phase_summaries", "accounts",
                   "_sample_summaries"):  # summaries computed from the files (sample_summaries.py)
        if cached in run.__dict__:
            new.__dict__[cached] = run.__dict__[cached]
    return new


def _merge_samples(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)] or frames[:1]
    if len(frames) == 1:
        return frames[0]
    return _concat_by_time(frames)


def _mark_dead(processes: list[dict[str, Any]], warnings: list[str]) -> None:
    """A process whose recording never ended (no `end_time`) in a run whose `record` process did end
    died with it still running (a `kill -9`, an OOM kill, a segfault): `died: True` in its meta, and
    one warning naming it. A run still being recorded (no ended `record` process) marks nobody."""
    parents = [p for p in processes if p.get("role") == "exec_parent" and p.get("end_time")]
    if not parents:
        return
    command_exit = (parents[0].get("annotations") or {}).get(names.COMMAND_EXIT)
    dead = [p for p in processes if not p.get("end_time") and p.get("role") != "exec_parent"]
    for p in dead:
        p["died"] = True
    if dead:
        who = ", ".join(f"{p.get('role', 'process')} rank {p.get('rank', '?')} (pid {p.get('pid')}, "
                        f"{p.get('host', '?')})" for p in dead[:4])
        more = f" and {len(dead) - 4} more" if len(dead) > 4 else ""
        stopped = stop_signal(command_exit)
        if command_exit == 0:  # the command succeeded: fork workers end with os._exit, which writes no end
            warnings.append(f"{len(dead)} process(es) ended without writing their end_time while the command "
                            f"exited 0 (fork workers ending with os._exit do): {who}{more}")
        elif stopped:  # SIGTERM, SIGINT: Python's default handling ends the process without writing anything
            # (which of them it stopped is the oom check's to say: only those that ended with the command)
            warnings.append(f"{len(dead)} process(es) ended without writing their end_time; the command was "
                            f"stopped by {stopped}: {who}{more}")
        else:
            warnings.append(f"{len(dead)} process(es) died before the run ended (no end_time): {who}{more}")


def _read_process_metas(run_dir: Path, warnings: list[str], skip: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Every process meta. One that can't be read (empty, damaged, a FIFO, too large, another format
    version) is skipped with a warning, as a missing one is: its samples and events are still read.
    `stem` is the file's name, whatever the meta says (a name from a file is never a path)."""
    processes = []
    for path in sorted(run_dir.glob(f"*{PROCESS_META_SUFFIX}")):
        stem = path.name[: -len(PROCESS_META_SUFFIX)]
        if path.name == RUN_META or stem in skip:
            continue
        try:
            meta = _read_json(path, "process meta")
        except MilesProfileError as exc:
            warnings.append(f"{path.name}: {str(exc).split(': ', 1)[-1]}; that process has no meta")
            continue
        meta["stem"] = stem
        processes.append(meta)
    return processes


# -- samples ---------------------------------------------------------------------------------
def _pid_of(path: Path, suffix: str) -> int:
    stem = path.name[: -len(suffix)]
    try:
        return int(stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


# -- columnar cache -----------------------------------------------------------------------------
# Parsing a 10-million-row CSV costs seconds; a finished process's samples never change, so the
# first read of a large one leaves an Arrow IPC copy beside it (hidden, `.<name>.arrow`) that later
# reads memory-map instead. It is keyed by the CSV's size and mtime, skipped for files still being
# written (no end_time in the process meta yet) and when the directory is read-only, and disabled by
# MILES_PROFILE_CACHE=0. Deleting it is always safe.
CACHE_MIN_BYTES = 64 * 1024 * 1024
_CACHE_TAG = b"miles-profile-samples-cache-1"


def _cache_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.arrow")


def _cache_key(path: Path) -> dict[bytes, bytes]:
    stat = path.stat()
    return {b"format": _CACHE_TAG, b"size": str(stat.st_size).encode(), b"mtime_ns": str(stat.st_mtime_ns).encode()}


def _cache_enabled(path: Path) -> bool:
    return os.environ.get("MILES_PROFILE_CACHE", "1") != "0" and path.stat().st_size >= CACHE_MIN_BYTES


def _read_cache(path: Path, warnings: list[str]) -> pd.DataFrame | None:
    cache = _cache_path(path)
    if not cache.is_file():
        return None
    try:
        with pa.memory_map(str(cache)) as source:
            table = pa.ipc.open_file(source).read_all()
        meta = table.schema.metadata or {}
        key = _cache_key(path)
        if any(meta.get(k) != v for k, v in key.items()):
            return None
        schema = table.schema
        if "t" not in schema.names or "phase" not in schema.names or schema.field("t").type != pa.float64():
            return None  # damaged, or not ours: the CSV is the record
        cached = json.loads(meta.get(b"warnings", b"[]"))
        if not isinstance(cached, list) or not all(isinstance(w, str) for w in cached):
            return None
        warnings.extend(cached)
        return table.to_pandas(split_blocks=True, self_destruct=True)
    except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, RecursionError):
        return None


def _write_cache(path: Path, table: pa.Table, warnings: list[str]) -> None:
    cache = _cache_path(path)
    tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
    try:
        metadata = {**(table.schema.metadata or {}), **_cache_key(path), b"warnings": json.dumps(warnings).encode()}
        table = table.replace_schema_metadata(metadata)
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, cache)
    except (OSError, pa.ArrowException):
        tmp.unlink(missing_ok=True)


def _read_samples_cached(path: Path, warnings: list[str], finished: bool) -> pd.DataFrame | None:
    use_cache = finished and _cache_enabled(path)
    if use_cache:
        frame = _read_cache(path, warnings)
        if frame is not None:
            return frame
    return _read_samples(path, warnings, cache=use_cache)


def _read_samples(path: Path, warnings: list[str], cache: bool = False) -> pd.DataFrame | None:
    """Parse one samples CSV; with `cache`, leave the parsed columns for the next read (see above).
    Only a regular file is read (NotRegularFile otherwise); damage goes to `read_damaged`, whose cost
    stays near the fast path's."""
    mapped, extents = map_regular(path)
    data = memoryview(mapped)
    end = bytes(data[-65536:]).rfind(b"\n") if len(data) else -1
    if end >= 0:
        end += max(0, len(data) - 65536) + 1
    header = bytes(data[:4096]).split(b"\n", 1)[0].decode(errors="replace").split(",")
    if not usable_header(header):
        warnings.append(f"{path.name}: no t/phase header, skipped")
        return None
    skipped = []

    def on_invalid(row) -> str:
        skipped.append(row.number)
        return "skip"

    types = {c: pa.int64() for c in header if c not in ("t", "phase")}
    types.update(t=pa.float64(), phase=pa.dictionary(pa.int32(), pa.string()))
    # A malformed row that is not UTF-8 fails inside pyarrow's row handler; the read then fails and
    # read_damaged takes over (quiet_invalid_rows keeps pyarrow's "Exception ignored" off the terminal).
    with quiet_invalid_rows():
        try:
            if end < 0:  # no newline in the last 64 KiB: a long damaged tail (or no line at all)
                raise pa.ArrowInvalid("no line end near the end of the file")
            # A complete file parses fastest from its path (pyarrow overlaps reading and parsing);
            # a file with a truncated last line is parsed from a buffer cut before that line.
            table = pacsv.read_csv(
                str(path) if end == len(data) else pa.py_buffer(data[:end]),
                read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),  # names as decoded above
                parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid),
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
        threading.Thread(target=_write_cache, name="miles_profile-cache", args=(
            path, pa.Table.from_pandas(frame, preserve_index=False), parsed)).start()
    return frame


def _read_all_samples(run_dir: Path, warnings: list[str], finished: set | frozenset = frozenset(),
                      pids=None, skip: set[str] | None = None, aliases: dict[str, int] | None = None) -> pd.DataFrame:
    frames = []
    for path in sorted(run_dir.glob(f"*{SAMPLES_SUFFIX}")):
        stem = path.name[: -len(SAMPLES_SUFFIX)]
        pid = (aliases or {}).get(stem, _pid_of(path, SAMPLES_SUFFIX))
        if pids is not None and pid not in pids:
            continue
        if skip and stem in skip:
            continue
        try:
            frame = _read_samples_cached(path, warnings, path.name[: -len(SAMPLES_SUFFIX)] in finished)
        except NotRegularFile as exc:
            warnings.append(str(exc))
            continue
        if frame is not None and len(frame):
            frame = _clean_times(frame, warnings, path.name)
            frame = drop_impossible_bytes(frame, warnings, path.name)
            frame.insert(2, "pid", np.int64(pid))
            frames.append(frame)
    if not frames:
        return pd.DataFrame({"t": pd.Series(dtype=float), "phase": pd.Series(dtype="category"),
                             "pid": pd.Series(dtype="int64")})
    if len(frames) == 1:
        return frames[0]
    return _concat_by_time(frames)  # processes interleave in time


def _concat_by_time(frames: list[pd.DataFrame]) -> pd.DataFrame:
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
    columns = list(dict.fromkeys(c for f in frames for c in f.columns))
    out = {}
    for column in columns:
        have = [column in f for f in frames]
        if column == "phase":
            codes = np.concatenate([f["phase"].cat.codes.to_numpy() for f in frames])
            out[column] = pd.Categorical.from_codes(codes[order], dtype=frames[0]["phase"].dtype)
            continue
        dtypes = {f[column].dtype for f in frames if column in f}
        if all(have) and len(dtypes) == 1 and next(iter(dtypes)) != object:
            values = np.concatenate([f[column].to_numpy() for f in frames])
        else:
            values = np.full(sum(sizes), np.nan)
            for f, start, size in zip(frames, starts, sizes):
                if column in f:
                    values[start:start + size] = f[column].to_numpy(np.float64, na_value=np.nan)
        out[column] = values[order]
    return pd.DataFrame(out)


def _same_phase_categories(frames: list[pd.DataFrame]) -> None:
    """Give every frame's `phase` the same sorted categories (what `.astype(str).astype("category")` of
    the concatenated column gave), so pd.concat keeps it categorical instead of making 10M strings."""
    from pandas.api.types import union_categoricals
    columns = [f["phase"].astype(str).astype("category") if not isinstance(f["phase"].dtype, pd.CategoricalDtype)
               else f["phase"] for f in frames]
    categories = union_categoricals(columns, sort_categories=True).categories
    for frame, column in zip(frames, columns):
        frame["phase"] = column.cat.set_categories(categories)


def _clean_times(samples: pd.DataFrame, warnings: list[str], source: str) -> pd.DataFrame:
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


# -- events and phases -------------------------------------------------------------------------
def _read_all_events(run_dir: Path, warnings: list[str], skip: set[str] | None = None,
                     without_events: list[str] | None = None) -> pd.DataFrame:
    rows, problems, too_long = [], EventProblems(), [0]
    for path in sorted(run_dir.glob(f"*{EVENTS_SUFFIX}")):
        if skip and path.name[: -len(EVENTS_SUFFIX)] in skip:
            continue
        host = path.name[: -len(EVENTS_SUFFIX)].rsplit("-", 1)[0]
        try:  # a regular file; no line over EVENT_LINE_MAX (dropped and counted)
            data = b"".join(bounded_lines(path, too_long=too_long))
        except NotRegularFile as exc:
            warnings.append(str(exc))
            continue
        events, duplicated = drop_duplicated_events(parse_event_lines(data, _pid_of(path, EVENTS_SUFFIX), problems,
                                                                        path.name))
        if not events and without_events is not None:
            without_events.append(path.name[: -len(EVENTS_SUFFIX)])
        if duplicated:
            warnings.append(f"{path.name}: dropped {duplicated} duplicated event line{'s' * (duplicated != 1)} "
                            "(a phase begun or ended twice under one id, or a line repeated; the first kept)")
        for event in events:
            if not isinstance(event.get("host"), str):
                event["host"] = host
            rows.append(event)
    warnings.extend(problems.warnings())
    if too_long[0]:
        warnings.append(f"skipped {too_long[0]} event lines over {EVENT_LINE_MAX:,} bytes")
    return events_frame(rows)


def drop_duplicated_events(events: list[dict]) -> tuple[list[dict], int]:
    """One file's events without repeats, and how many were dropped. A phase id is begun and ended once
    per process, so a second begin (or end) of an id is a copied line (`cat E E > E`, a re-sent log); any
    other event repeated whole (same time, kind, name and attributes) is too. Every view keys phases by
    (host, pid, id): a repeat would make that key ambiguous."""
    seen: set = set()
    kept = []
    for event in events:
        if event["kind"] in (names.BEGIN, names.END) and event.get("id") is not None:
            key = (event["kind"], event["pid"], event["id"])
        else:
            key = (event["kind"], event["pid"], event["name"], event["t"], repr(event.get("attrs")))
        if key not in seen:
            seen.add(key)
            kept.append(event)
    return kept, len(events) - len(kept)


def events_frame(rows: list[dict]) -> pd.DataFrame:
    """Event dicts as the `Run.events` frame: dict attrs, float times, sorted by time."""
    events = pd.DataFrame(rows, columns=EVENT_COLUMNS)
    events["attrs"] = events["attrs"].map(lambda a: a if isinstance(a, dict) else {})
    events["t"] = events["t"].astype(float)
    return events.sort_values("t", kind="stable").reset_index(drop=True)


def phases_from_events(events: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """One row per phase instance; a phase never ended (a crash) ends at the last sample, status 'open'."""
    begins = events[events["kind"] == names.BEGIN]
    if begins.empty:
        return pd.DataFrame(columns=PHASE_COLUMNS)
    ends = events[events["kind"] == names.END]
    last_t = float(samples["t"].max()) if len(samples) else float(events["t"].max())
    # ends matched to begins by (host, pid, id) as columns (a 1,024-process run has 150,000 phases)
    def keys(frame):
        ids = pd.to_numeric(frame["id"], errors="coerce").fillna(-1).astype(np.int64)
        return pd.MultiIndex.from_arrays([_hosts(frame), frame["pid"].astype(np.int64).to_numpy(), ids.to_numpy()])
    end_keys = keys(ends)
    last_end = ~end_keys.duplicated(keep="last")  # as a dict would: the last end of an id wins
    at = end_keys[last_end].get_indexer(keys(begins))
    found = at >= 0
    # padded by one: a begin without an end (at = -1) reads the pad, replaced below
    end_t = np.append(ends["t"].to_numpy(float)[last_end], np.nan)[at]
    end_status = np.append(np.array([a.get("status", "ok") for a in ends["attrs"]], dtype=object)[last_end],
                           "open")[at]
    t = begins["t"].to_numpy(float)
    end = np.where(found, end_t, np.maximum(last_t, t))
    ids, parents = begins["id"], begins["parent"]
    rows = {"name": begins["name"].to_numpy(), "start": t, "end": end, "duration": end - t,
            "pid": begins["pid"].astype(int).to_numpy(), "host": _hosts(begins),
            "id": pd.to_numeric(ids, errors="coerce").fillna(-1).astype(int).to_numpy(),
            "parent": pd.to_numeric(parents, errors="coerce").fillna(-1).astype(int).to_numpy(),
            "status": np.where(found, end_status, "open"), "attrs": begins["attrs"].to_numpy()}
    phases = pd.DataFrame(rows)
    phases["status"] = phases["status"].astype(object)
    phases["depth"] = _depths(phases)
    extra = pd.DataFrame([{k: v for k, v in a.items() if k not in PHASE_COLUMNS} for a in phases["attrs"]],
                         index=phases.index)
    phases = pd.concat([phases[PHASE_COLUMNS], extra], axis=1)
    return phases.sort_values(["start", "depth"], kind="stable").reset_index(drop=True)


def _hosts(events: pd.DataFrame) -> list[str]:
    """The host of each event ("" where unknown: fakes, tails of old logs)."""
    if "host" not in events:
        return [""] * len(events)
    return ["" if h is None or h != h else str(h) for h in events["host"].tolist()]


def _depths(phases: pd.DataFrame) -> list[int]:
    keys = list(zip(phases["host"], phases["pid"]))
    parent_of = {(*k, i): par for k, i, par in zip(keys, phases["id"], phases["parent"])}
    depths = []
    for key, phase_id in zip(keys, phases["id"]):
        depth, parent = 0, parent_of.get((*key, phase_id), -1)
        while parent != -1 and depth < 64:
            depth, parent = depth + 1, parent_of.get((*key, parent), -1)
        depths.append(depth)
    return depths


def _fill_phases_from_timeline(samples: pd.DataFrame, events: pd.DataFrame, pids: list[int]) -> pd.DataFrame:
    """Rows sampled from outside (`record --exec`) get the innermost phase open at their time."""
    times, labels = phase_timeline(events)
    if not len(times):
        return samples
    mask = samples["pid"].isin(pids).to_numpy()
    at = np.searchsorted(times, samples["t"].to_numpy()[mask], side="right") - 1
    filled = np.where(at >= 0, np.asarray(labels, dtype=object)[np.maximum(at, 0)], "")
    phase = samples["phase"].astype(str).to_numpy(dtype=object)
    phase[mask] = filled
    samples["phase"] = pd.Categorical(phase)
    return samples


def phase_timeline(events: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Step function: from times[k] on, the innermost open phase is labels[k] ('' when none)."""
    open_phases: dict[tuple, str] = {}
    times, labels = [], []
    for kind, host, pid, phase_id, name, t in zip(events["kind"], _hosts(events), events["pid"], events["id"],
                                                  events["name"], events["t"]):
        if kind == names.BEGIN:
            open_phases[(host, pid, phase_id)] = name
        elif kind == names.END:
            open_phases.pop((host, pid, phase_id), None)
        else:
            continue
        times.append(t)
        labels.append(next(reversed(open_phases.values()), ""))
    return np.asarray(times, dtype=float), labels
