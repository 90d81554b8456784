"""A run held in memory and kept current while its recorder writes.

The first look reads the run with the project's reader (`miles_profile.load`); later looks append
only the rows and events written since (`miles_profile.logdir.tail`), so following a long run costs
what it wrote in the last second, not its whole history. Each change makes a new `Run` object and
bumps `version`; readers take `current` and never see a half-updated run.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

import miles_profile
from miles_profile.logdir.layout import EVENTS_SUFFIX, SAMPLES_SUFFIX
from miles_profile.logdir.merge import PID_ALIAS_STEP, alias_event_pids
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.reader import Run, load_run, phases_from_events
from miles_profile.logdir.tail import EventsTail, SamplesTail, label_outside_samples
from dashboards.paths import LogRoot
from miles_profile.words import counted


def _pid_of(path: Path, suffix: str) -> int:
    try:
        return int(path.name[: -len(suffix)].rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def _host_of(stem: str) -> str:
    return stem.rsplit("-", 1)[0]


def _merge_sorted(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Append `new` to time-sorted `old`, re-sorting only the overlap (processes flush at different times)."""
    if old.empty:
        return new.sort_values("t", kind="stable").reset_index(drop=True)
    new = new.sort_values("t", kind="stable")
    cut = int(np.searchsorted(old["t"].to_numpy(), new["t"].iloc[0], side="right"))
    if cut == len(old):
        merged = pd.concat([old, new], ignore_index=True)
    else:
        overlap = pd.concat([old.iloc[cut:], new], ignore_index=True).sort_values("t", kind="stable")
        merged = pd.concat([old.iloc[:cut], overlap], ignore_index=True)
    if not isinstance(merged["phase"].dtype, pd.CategoricalDtype):
        merged["phase"] = merged["phase"].astype(str).astype("category")
    return merged


# A callback waits this long for a run being read, then says so and asks again at the next poll: a
# small run answers as before, a fleet's minutes of reading hold no request (and no browser connection).
PAGE_WAIT_S = 2.0
MEMO_KEYS = 32  # results kept per run: the whole-run ones and the last zoom windows


class LiveRun:
    """One run, loaded once, then refreshed from what its files gained."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self.version = 0
        self._reading = False  # a refresh is reading the files now
        self._memo: dict[str, tuple[int, object]] = {}
        self._memo_locks: OrderedDict[str, threading.Lock] = OrderedDict()
        self._load()

    def _meta_stamp(self) -> tuple:
        """The metas' names, sizes and times: a recorder rewrites its meta when it stops (end_time), which
        is what tells the checks an iteration is finished; no appended row says so."""
        stamp = []
        for path in sorted([*self.run_dir.glob("*meta.json"), *self.run_dir.glob("*.host.json")]):
            try:
                st = path.stat()
            except OSError:
                continue
            stamp.append((path.name, st.st_mtime_ns, st.st_size))
        return tuple(stamp)

    def _load(self) -> None:
        """The whole run through the reader, and the tails to follow it from there."""
        run_dir = self.run_dir
        self._stamp = self._meta_stamp()  # before the read: a change during it is read again next time
        sizes = {p: p.stat().st_size for p in self._files(SAMPLES_SUFFIX) + self._files(EVENTS_SUFFIX)}
        run = miles_profile.load(run_dir)  # the reader: damage handling and warnings as everywhere
        # A process is its file stem (host-pid): the same pid on two hosts writing here (containers) is
        # two processes, which the reader told apart by an alias (logdir/merge.py); appended rows keep it.
        self._pids: dict[str, int] = {p["stem"]: p["pid"] for p in run.processes
                                      if isinstance(p.get("stem"), str) and type(p.get("pid")) is int}
        self._samples_tails: dict[Path, SamplesTail] = {}
        last_t = run.samples.groupby("pid")["t"].max().to_dict() if len(run.samples) else {}
        for path in self._files(SAMPLES_SUFFIX):
            pid = self._pid(path, SAMPLES_SUFFIX)
            self._samples_tails[path] = SamplesTail(path, sizes.get(path, 0), last_t.get(pid, -np.inf))
        self._events_tails = {p: EventsTail(p, _pid_of(p, EVENTS_SUFFIX), sizes.get(p, 0))
                              for p in self._files(EVENTS_SUFFIX)}
        self._outside_pids = [int(p["pid"]) for p in run.processes if p.get("role") == "exec_parent"]
        self.current: Run = run

    def memo(self, key: str, compute):
        """`compute(run)` for the current version, computed once per version (a 10M-sample run's full
        figure or checks take seconds: a poll that finds nothing new must not redo them, and requests
        that arrive while it is computed wait for it instead of computing it again)."""
        with self._lock:
            lock = self._memo_locks.setdefault(key, threading.Lock())
            self._memo_locks.move_to_end(key)
            while len(self._memo_locks) > MEMO_KEYS:  # least recently used: windows zoomed to long ago
                oldest = next(iter(self._memo_locks))
                self._memo_locks.pop(oldest)
                self._memo.pop(oldest, None)
        with lock:  # a second caller waits for the first instead of computing it again
            with self._lock:
                version, run = self.version, self.current
            hit = self._memo.get(key)
            if hit is not None and hit[0] == version:
                return hit[1]
            value = compute(run)
            self._memo[key] = (version, value)
            return value

    def _pid(self, path: Path, suffix: str) -> int:
        """The pid the run shows for a file's process: the reader's (an alias where another host's
        process has the same pid); a process that appeared since the load gets the next free alias."""
        stem = path.name[: -len(suffix)]
        if stem not in self._pids:
            pid = _pid_of(path, suffix)
            taken = [p // PID_ALIAS_STEP for s, p in self._pids.items()
                     if p % PID_ALIAS_STEP == pid and _host_of(s) != _host_of(stem)]
            self._pids[stem] = pid + (max(taken) + 1) * PID_ALIAS_STEP if taken and pid >= 0 else pid
        return self._pids[stem]

    def _files(self, suffix: str) -> list[Path]:
        return sorted(p for p in self.run_dir.glob(f"*{suffix}") if not p.is_symlink())

    def refresh(self) -> bool:
        """Read what was appended since the last call; True when the run changed.

        The panels of a page ask together (one poll tick) and reading a fleet run's 2,048 file tails
        takes 0.12-0.18 s: a caller that asks while a refresh reads shares it (False) instead of
        reading every file again; what was written meanwhile comes with the next poll."""
        shared = self._reading  # read without the lock: a refresh in progress when we asked
        with self._lock:
            if shared:  # it has finished now that we hold the lock
                return False
            self._reading = True
            try:
                return self._read_appended()
            finally:
                self._reading = False

    def _read_appended(self) -> bool:
        if self._meta_stamp() != self._stamp:  # a process stopped (or started): its meta is the truth, so
            self._load()                       # read the run again once, as a restarted dashboard would
            self.version += 1
            return True
        for path in self._files(SAMPLES_SUFFIX):
            self._samples_tails.setdefault(path, SamplesTail(path))
        for path in self._files(EVENTS_SUFFIX):
            self._events_tails.setdefault(path, EventsTail(path, _pid_of(path, EVENTS_SUFFIX)))
        new_rows = [self._with_pid(tail) for tail in self._samples_tails.values()]
        new_rows = [f for f in new_rows if f is not None]
        new_events = [f for f in (tail.read() for tail in self._events_tails.values()) if f is not None]
        if not new_rows and not new_events:
            return False
        self.current = self._updated(self.current, new_rows, new_events)
        self.version += 1
        return True

    def _with_pid(self, tail: SamplesTail) -> pd.DataFrame | None:
        frame = tail.read()
        if frame is not None:
            frame.insert(2, "pid", np.int64(self._pid(tail.path, SAMPLES_SUFFIX)))
        return frame

    def _updated(self, run: Run, new_rows: list[pd.DataFrame], new_events: list[pd.DataFrame]) -> Run:
        samples, events = run.samples, run.events
        since = np.inf
        if new_rows:
            rows = pd.concat(new_rows, ignore_index=True)
            since = float(rows["t"].min())
            samples = _merge_sorted(samples, rows)
        if new_events:
            added = pd.concat(new_events, ignore_index=True)
            added = alias_event_pids(added, {s: p for s, p in self._pids.items() if p >= PID_ALIAS_STEP})
            since = min(since, float(added["t"].min()))
            # The tail started where the first load began; events written during that load come twice.
            events = pd.concat([events, added], ignore_index=True)
            events = events.loc[~events.duplicated(["t", "kind", "name", "pid", "id"])]
            events = events.sort_values("t", kind="stable").reset_index(drop=True)
        samples = label_outside_samples(samples, events, self._outside_pids, since)
        phases = phases_from_events(events, samples)
        return dataclasses.replace(run, samples=samples, events=events, phases=phases)


class RunLoading(MilesProfileError):
    """The run is being read by another request or the preload: the panel says so and asks again at the
    next poll, instead of holding a request (and one of the browser's six connections) for minutes."""


@dataclass
class _Load:
    done: threading.Event
    started: float = 0.0  # time.monotonic() of the read's start
    live: LiveRun | None = None
    error: BaseException | None = None


class FirstLook:
    """A run's metas, events and phase summaries without its samples (`sample_pids=()`): what a fleet's
    first screen (heatmap, outliers, one GPU's timeline from the host files) needs, read in seconds where
    the whole run takes minutes. Not followed: the page moves to the LiveRun once it is read."""

    # before every LiveRun version (and the -1 of a panel's failed draw): a panel drawn from it redraws
    # once the run is read
    version = -2

    def __init__(self, run_dir: Path):
        self.current: Run = load_run(run_dir, sample_pids=())
        self._memo: dict[str, object] = {}
        self._lock = threading.Lock()

    def refresh(self) -> bool:
        return False  # never followed: the LiveRun is

    def memo(self, key: str, compute):
        with self._lock:  # computed once: concurrent callers wait for the first
            if key not in self._memo:
                self._memo[key] = compute(self.current)
            return self._memo[key]


class RunCache:
    """Loaded runs by id, the least recently used dropped past `capacity` (a 10M-sample run is ~1 GB).

    A run is read on a thread of its own: `get(run_id, wait=s)` waits at most s seconds for it and then
    raises RunLoading (a small run is read within that and answers as before); `get(run_id)` waits."""

    def __init__(self, root: LogRoot, capacity: int = 3):
        self.root = root
        self.capacity = capacity
        self._runs: OrderedDict[str, LiveRun] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[str, _Load] = {}
        self._first: OrderedDict[str, FirstLook] = OrderedDict()
        self._first_locks: dict[str, threading.Lock] = {}
        self._held: dict[str, int] = {}  # run id -> holders: its whole read waits (holding)
        self._notes: dict[str, str] = {}  # run id -> what RunLoading says (a stat of every file: once)

    def get(self, run_id: object, wait: float | None = None) -> LiveRun:
        """The loaded run (resolving `run_id` through the allow-list); raises MilesProfileError, and
        RunLoading when it is not read within `wait` seconds (None: wait until it is)."""
        run_dir = self.root.resolve(run_id)
        with self._lock:
            if run_id in self._runs:
                self._runs.move_to_end(run_id)
                return self._runs[run_id]
            job = self._loading.get(run_id)
            if job is None and wait is not None and self._held.get(run_id):
                raise self._still_reading(run_id, run_dir)
            if job is None:  # two callbacks asking for one run load it once
                job = self._loading[run_id] = _Load(threading.Event(), time.monotonic())
                threading.Thread(target=self._load, args=(run_id, run_dir, job), name="dashboards-load",
                                 daemon=True).start()
        # only the read's first `wait` seconds are waited for: later asks answer at once, so polls of a
        # read lasting minutes hold no request (a click's callback queued behind them otherwise)
        if not job.done.wait(None if wait is None else max(0.0, job.started + wait - time.monotonic())):
            raise self._still_reading(run_id, run_dir)
        if job.error is not None:
            raise job.error
        return job.live

    def _still_reading(self, run_id: str, run_dir: Path) -> RunLoading:
        if run_id not in self._notes:
            self._notes[run_id] = f"Reading this run ({_size_of(run_dir)}): this panel fills in once it is read."
        return RunLoading(self._notes[run_id])

    def for_page(self, run_id: object) -> LiveRun:
        """`get` as a page's callback asks: a run read within PAGE_WAIT_S answers, else RunLoading."""
        return self.get(run_id, wait=PAGE_WAIT_S)

    @contextmanager
    def holding(self, run_id: object):
        """While held, a page's `get` starts no whole read of the run (it says RunLoading): the first
        screen is computed from the first look with the CPU to itself (two cores, one GIL: read beside
        it, a 1,024-process fleet's first screen took twice as long). A waiting `get` reads regardless."""
        with self._lock:
            self._held[run_id] = self._held.get(run_id, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._held[run_id] -= 1
                if not self._held[run_id]:
                    del self._held[run_id]

    def loaded(self, run_id: object) -> LiveRun | None:
        """The run if it is read already, else None (nothing is started)."""
        with self._lock:
            return self._runs.get(run_id)

    def _load(self, run_id: str, run_dir: Path, job: _Load) -> None:
        try:
            job.live = LiveRun(run_dir)
        except BaseException as exc:  # noqa: BLE001 - raised to every caller that waits; the next get reads again
            job.error = exc
        with self._lock:
            if job.live is not None:
                self._runs[run_id] = job.live
                while len(self._runs) > self.capacity:
                    self._runs.popitem(last=False)
                self._first.pop(run_id, None)  # the page reads the whole run from now on
            self._loading.pop(run_id, None)
        job.done.set()

    def first_look(self, run_id: object) -> FirstLook:
        """The run without its samples (FirstLook), read once; for a fleet's first screen while `get` reads."""
        run_dir = self.root.resolve(run_id)
        with self._lock:
            lock = self._first_locks.setdefault(run_id, threading.Lock())
        with lock:
            with self._lock:
                found = self._first.get(run_id)
            if found is None:
                found = FirstLook(run_dir)
                with self._lock:
                    if run_id not in self._runs:  # else the whole run is read: no use keeping this
                        self._first[run_id] = found
                        while len(self._first) > self.capacity:
                            self._first.popitem(last=False)
            return found


def _size_of(run_dir: Path) -> str:
    """How much there is to read, in words: the processes' samples files and their bytes."""
    files = [p for p in run_dir.glob(f"*{SAMPLES_SUFFIX}") if not p.is_symlink()]
    size = 0
    for p in files:
        try:
            size += p.stat().st_size
        except OSError:
            pass
    return f"{counted(len(files), 'samples files')}, {size / 1e9:.1f} GB" if size >= 1e8 else counted(len(files), "samples files")
