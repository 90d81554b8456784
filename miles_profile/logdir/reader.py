"""Read a run directory into pandas DataFrames, merging all its processes.

Damage is tolerated and reported, not fatal: a truncated last line (a killed writer), garbage
rows, undecodable events and out-of-order or NaN timestamps are dropped or fixed, and each is named
in `Run.warnings`. A missing run, an unknown format version or a run with no meta is an error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.command_exit import stop_signal
from miles_profile.errors import MilesProfileError
from miles_profile.logdir import completeness, gpu_used_beside, summaries_beside
from miles_profile.logdir.accounts import accounts_frame
from miles_profile.logdir.cluster import cluster_warnings, mark_ray_restarts
from miles_profile.logdir.events_reader import (  # noqa: F401 (EVENT_COLUMNS..phase_timeline: this module's API)
    EVENT_COLUMNS, PHASE_COLUMNS, drop_duplicated_events, events_frame, fill_phases_from_timeline,
    phase_timeline, phases_from_events, read_all_events,
)
from miles_profile.logdir.files import NotRegularFile, read_small
from miles_profile.logdir.host_reader import host_frames, host_meta
from miles_profile.logdir.layout import (
    EVENTS_SUFFIX, FORMAT_VERSION, PROCESS_META_SUFFIX, RUN_META, SAMPLES_SUFFIX, find_runs, pid_of,
)
from miles_profile.logdir.merge import alias_event_pids, copied_stems, pid_aliases
from miles_profile.logdir.meta_lists import PROCESS_LISTS, drop_retyped_lists
from miles_profile.logdir.ranges import drop_impossible_ceilings
from miles_profile.logdir.samples_reader import ProcessSamples, read_process_frames



@dataclass
class Run:
    path: Path
    meta: dict[str, Any]
    processes: list[dict[str, Any]]
    # t, phase, pid, then byte columns (int64, float64 where a value is absent): every process's rows merged
    # in time order. Given a ProcessSamples (what load_run reads), it is built on first use only (_samples
    # below): the report's views read `process_samples` instead.
    samples: pd.DataFrame
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
            side = self.__dict__.pop("_gpu_used_side", None)
            if side is not None:
                side.cancel()
            g = self.gpu_samples
            return {(str(h), str(u)): (f["t"].to_numpy(float), f["used"].to_numpy(float))
                    for (h, u), f in g.groupby(["host", "gpu_uuid"], sort=False, observed=True)}
        # read beside the events by load_run (gpu_used_beside.py), else here
        return gpu_used_beside.take(self.__dict__.pop("_gpu_used_side", None), self.directories, self.warnings)

    def gpu_procs_of(self, hosts) -> pd.DataFrame:
        """`gpu_procs` of some hosts only: reads just their files (unless all were read already)."""
        if "_gpu_procs" in self.__dict__:
            procs = self._gpu_procs
            return procs[procs["host"].isin([str(h) for h in hosts])]
        return host_frames(self.directories, self.warnings, samples=False, only_hosts=hosts, metas=self.hosts)[2]

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
        # made beside the phases by load_run for a fleet (summaries_beside.py), else here
        return summaries_beside.take(self.__dict__.pop("_summaries_side", None), self.events)

    @cached_property
    def accounts(self) -> pd.DataFrame:
        """t, host, pid, device, category, bytes: each value a program declared with `account()`,
        one row per change (logdir/accounts.py)."""
        return accounts_frame(self.events)

    @property
    def process_samples(self) -> ProcessSamples | None:
        """Each process's samples as read (pid -> its own frame), when the run was read from its files and
        the merged `samples` was not given or assigned instead; None otherwise (runmodel/series.py then
        takes each process's rows from `samples`)."""
        return self.__dict__.get("_process_samples")

    @property
    def sample_columns(self) -> list[str]:
        """The columns of `samples`, without building it."""
        store = self.process_samples
        return store.columns if store is not None and self.__dict__.get("_samples") is None else \
            list(self.samples.columns)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def devices(self) -> list[dict[str, Any]]:
        """GPUs as NVML saw them (index, name, uuid, total bytes), from the first process that saw any."""
        return next((p["devices"] for p in self.processes if p.get("devices")), [])

    @property
    def gpu_indices(self) -> list[int]:
        found = {int(c[3:].split("_")[0]) for c in self.sample_columns if c.startswith("gpu") and "_" in c}
        return sorted(found)

    @property
    def interval_ms(self) -> float | None:
        return self.meta.get("interval_ms")


def _get_samples(run: Run) -> pd.DataFrame:
    frame = run.__dict__.get("_samples")
    if frame is None:  # the first use of the merged frame: built from the processes' own frames
        frame = run.__dict__["_samples"] = run.__dict__["_process_samples"].merged()
    return frame


def _set_samples(run: Run, value) -> None:
    """A ProcessSamples is kept as is (the merged frame built on first use); a frame (a view's, an import's, the
    live dashboard's appended rows) replaces both."""
    if isinstance(value, ProcessSamples):
        run.__dict__["_process_samples"], run.__dict__["_samples"] = value, None
    else:
        run.__dict__["_process_samples"], run.__dict__["_samples"] = None, value


# installed after @dataclass: __init__ assigns through it, and a run read from files merges only when asked
Run.samples = property(_get_samples, _set_samples)


def replace_run(run: Run, **changes) -> Run:
    """dataclasses.replace of a run, keeping its samples as they are (per process: not merged to be copied)."""
    store = run.process_samples
    if "samples" not in changes and store is not None and run.__dict__.get("_samples") is None:
        changes["samples"] = store
    return replace(run, **changes)


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
    # a fleet's NVML used read on the other core while the events are parsed here
    gpu_used_side = gpu_used_beside.start([d for d, _ in dirs], processes, sample_pids is not None)
    without_events: list[str] = []  # stems whose events file gave no event
    for folder, _ in dirs:
        finished = {p.get("stem") for p in processes if p.get("end_time")}
        sample_frames += read_process_frames(folder, warnings, finished, sample_pids, copies.get(folder), aliases)
        event_frames.append(read_all_events(folder, warnings, copies.get(folder), without_events))
    store = ProcessSamples(sample_frames)  # not merged: see Run.samples
    events = event_frames[0] if len(event_frames) == 1 else events_frame(
        [row for frame in event_frames for row in frame.to_dict("records")])
    events = alias_event_pids(events, aliases)
    summaries_side = summaries_beside.start(events, processes, sample_pids is not None)  # while the phases are made
    warnings += mark_ray_restarts(processes)  # before _mark_dead: a restarted actor's first process is said so
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
        {s: aliases.get(s, pid_of(Path(s + EVENTS_SUFFIX), EVENTS_SUFFIX)) for s in with_rows}, warnings,
        store.names_a_phase)
    completeness.warn_planned_without_events(processes, events, warnings, store.names_a_phase)
    phases = phases_from_events(events, _last_sample(store))
    samples = _fill_outside(store, events, processes)
    run = Run(run_dir, meta, processes, samples, events, phases, completeness.collapse_repeats(warnings),
              [d for d, _ in dirs], None if sample_pids is None else frozenset(sample_pids))
    if gpu_used_side is not None:
        run.__dict__["_gpu_used_side"] = gpu_used_side  # taken by Run.gpu_used
    if summaries_side is not None:
        run.__dict__["_summaries_side"] = summaries_side  # taken by Run.phase_summaries
    return run


def _last_sample(store: ProcessSamples) -> pd.DataFrame:
    """The one row phases_from_events reads of the samples (their last time), or none."""
    last = store.last_t()
    return pd.DataFrame({"t": [] if last is None else [last]}, dtype=float)


def _fill_outside(store: ProcessSamples, events: pd.DataFrame, processes: list[dict[str, Any]]):
    """The samples as the run keeps them: per process, or, where a process was sampled from outside
    (`record --exec`: its rows take the phases of the timeline, re-coding every process's phase), merged."""
    outside = [p["pid"] for p in processes if p.get("role") == "exec_parent"]
    if outside and store.rows:
        return fill_phases_from_timeline(store.merged(), events, outside)
    return store


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
    store = ProcessSamples([f for folder in run.directories
                            for f in read_process_frames(folder, warnings, finished, pids, copies.get(folder), aliases)])
    # a lazy load read no samples: a process without events is judged against them now
    have = set(run.events["pid"].tolist()) if len(run.events) else set()
    found: list[str] = []
    without = {p["stem"]: p["pid"] for p in run.processes if isinstance(p.get("stem"), str) and p.get("pid") not in have}
    completeness.warn_phases_without_events(without, found, store.names_a_phase)
    warnings += [w for w in found if w not in run.warnings]
    # a lazy load could not tell why a process that planned phases wrote no event: its samples now can
    planned: list[str] = []
    completeness.warn_planned_without_events(run.processes, run.events, planned, store.names_a_phase)
    said = {w.split(": ", 1)[0] for w in planned}
    kept = [w for w in run.warnings if not (w.split(": ", 1)[0] in said and completeness.PLANNED in w)]
    samples = _fill_outside(store, run.events, run.processes)
    new = Run(run.path, run.meta, run.processes, samples, run.events, run.phases,
              kept + [w for w in planned if w not in kept] + warnings,
              run.directories, None if pids is None else frozenset(pids))
    # _sample_summaries: summaries computed from the files (sample_summaries.py); *_side: read beside (load_run)
    for cached in ("_host_data", "_gpu_procs", "gpu_used", "_gpu_used_side", "hosts", "phase_summaries",
                   "_summaries_side", "accounts", "_sample_summaries"):
        if cached in run.__dict__:
            new.__dict__[cached] = run.__dict__[cached]
    return new



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
    dead = [p for p in dead if not p.get("ray_restarted_as")]  # mark_ray_restarts said how those ended
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
        drop_retyped_lists(meta, PROCESS_LISTS, path.name, warnings)
        processes.append(meta)
    return processes
