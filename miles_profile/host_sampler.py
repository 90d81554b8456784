"""One sampler per host: NVML for every GPU of the host and every process on it (whoever started it),
host memory and the container's cgroup, written once per host, not once per rank.

Who samples: the process that holds an exclusive `flock` on `<run_dir>/<host>.host.lock`. Every
recording process of the run on that host takes part; `record` and local rank 0 try at once, the
others only after `standby_s`, so one of those normally wins, and several starting together still
get exactly one holder (the kernel grants the lock to one). The others retry every `standby_s`: when
the holder dies the kernel drops its lock and the next retry takes over, writing files of its own.
The lock descriptor is close-on-exec and closed in forked children, so no other process inherits it.
Where the file system refuses `flock` (some shared file systems), the preferred process (record or
local rank 0) samples without a lock and meta says so.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import psutil

from miles_profile.identity import host_name
from miles_profile.logdir.writer import EventWriter
from miles_profile.logdir.host_writer import HostWriter, write_host_meta
from miles_profile.logdir.layout import HOST_LOCK_SUFFIX, process_stem
from miles_profile.oom import DeathWatch, write_death
from miles_profile.probes.cgroup import CgroupProbe
from miles_profile.probes.nvml_host import NvmlBackend, open_host_gpus
from miles_profile.probes.procfs import ProcFile, kib_fields

log = logging.getLogger("miles_profile")

DEFAULT_HOST_INTERVAL_S = 0.1  # NVML's cadence before this split (probes/nvml.py): no peak to lose
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_held_roles: "weakref.WeakSet[HostRole]" = weakref.WeakSet()


class HostRole:
    """The per-host lock. `take()` is non-blocking; the kernel releases it when the holder dies."""

    def __init__(self, run_dir: Path, host: str):
        self.path = Path(run_dir) / f"{host}{HOST_LOCK_SUFFIX}"
        self._fd: int | None = None
        self.held = False
        self.unlocked_reason = ""  # set when the file system has no flock

    def take(self, fallback: bool) -> bool:
        if self.held:
            return True
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
            self.unlocked_reason = f"flock refused on this file system ({exc.strerror}): the preferred process samples"
            if not fallback:
                return False
        self.held = True
        _held_roles.add(self)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
        self._fd, self.held = None, False

    def forget_in_child(self) -> None:
        """After fork: the child's copy of the descriptor must not keep the parent's lock alive."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd, self.held = None, False


def _after_fork_in_child() -> None:
    for role in list(_held_roles):
        role.forget_in_child()
    global _running
    _running = None  # the parent's sampler thread does not exist here


os.register_at_fork(after_in_child=_after_fork_in_child)


class HostMemoryProbe:
    name = "host_memory"
    columns = ("host_available", "host_total")

    def __init__(self) -> None:
        try:
            self._meminfo: ProcFile | None = ProcFile("/proc/meminfo")
        except OSError:
            self._meminfo = None

    def read(self) -> tuple[int | None, int | None]:
        if self._meminfo is None:
            vm = psutil.virtual_memory()
            return vm.available, vm.total
        available, total = kib_fields(self._meminfo.read(), b"MemAvailable:", b"MemTotal:")
        return available, total

    def close(self) -> None:
        if self._meminfo is not None:
            self._meminfo.close()


class HostSampler:
    """Takes part in the election for its host and, while it holds the role, samples the host.

    `prefer`: try at once (record, local rank 0); else only after `standby_s`. `backend`: the NVML
    backend (default: nvidia-ml-py); NVML absent leaves the GPU columns out, never the rest."""

    def __init__(self, run_dir: str | os.PathLike, *, interval_s: float = DEFAULT_HOST_INTERVAL_S,
                 prefer: bool = False, backend: NvmlBackend | None = None, standby_s: float = 1.0,
                 flush_interval_s: float = 0.5):
        self.run_dir = Path(run_dir)
        self.host = host_name()
        self.stem = process_stem()
        self.interval_s = interval_s
        self.prefer = prefer
        self._backend = backend
        self._standby_s = standby_s
        self._flush_interval_s = flush_interval_s
        self._role = HostRole(self.run_dir, self.host)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="miles_profile-host", daemon=True)
        self._writer: HostWriter | None = None
        self._probes: list = []
        self._gpus = None
        self._deaths: DeathWatch | None = None  # recorded processes that vanish, the OOM killer's counter
        self._death_events: EventWriter | None = None
        self.meta: dict[str, Any] = {}

    @property
    def active(self) -> bool:
        return self._writer is not None

    def start(self) -> "HostSampler":
        try:
            taken = self.prefer and self._role.take(fallback=True)
        except OSError as exc:  # e.g. a read-only run directory: the program goes on unsampled
            log.warning("miles_profile: host sampler lock unusable: %s", exc)
            return self
        if taken:
            self._activate_or_give_up()
        if not self._stop.is_set():
            self._thread.start()
        return self

    def _activate_or_give_up(self) -> bool:
        try:
            self._activate()
            return True
        except Exception as exc:  # never the program's problem: let another process of the host sample
            log.warning("miles_profile: host sampler could not start, leaving the role: %s", exc)
            self._give_up()
            return False

    def _give_up(self) -> None:
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass
        self._close_probes()
        self._role.release()
        self._stop.set()

    def _close_probes(self) -> None:
        if self._death_events is not None:
            self._death_events.close()
            self._death_events = None
        probes, self._probes = self._probes, []
        if self._gpus is not None:
            probes.append(self._gpus)
            self._gpus = None
        for probe in probes:
            try:
                probe.close()
            except Exception:
                pass

    def _activate(self) -> None:
        memory, cgroup = HostMemoryProbe(), CgroupProbe()
        self._gpus, gpu_meta = open_host_gpus(self._backend)
        self._probes = [memory, cgroup]
        columns = [*memory.columns, *cgroup.columns, *(self._gpus.columns if self._gpus else ())]
        self.meta = {"host": self.host, "pid": os.getpid(), "stem": self.stem, "start_time": time.time(),
                     "interval_ms": self.interval_s * 1000.0, "lock": self._role.unlocked_reason or "flock",
                     "probes": [{"name": memory.name, "active": True}, cgroup.describe(), gpu_meta],
                     "gpus": gpu_meta.get("gpus", []), "columns": columns}
        write_host_meta(self.run_dir, self.stem, self.meta)
        self._writer = HostWriter(self.run_dir, self.stem, columns, self._flush_interval_s)
        self._deaths = DeathWatch(self.run_dir, self.host)
        self.sample()

    def sample(self) -> None:
        with self._lock:
            if self._writer is None:
                return
            values: list[int | None] = []
            for probe in self._probes:
                values.extend(probe.read())
            procs: list = []
            if self._gpus is not None:
                used, procs = self._gpus.read()
                values.extend(used)
            self._writer.append(time.time(), values, procs)
        self._record_deaths(self._deaths.poll() if self._deaths is not None else [])

    def _record_deaths(self, deaths: list) -> None:
        """Each death as an `oom` event in this process's events file, written at once (oom.py)."""
        try:
            for attrs in deaths:
                if self._death_events is None:
                    self._death_events = EventWriter(self.run_dir, self.stem)
                write_death(self._death_events, attrs)
        except OSError as exc:  # the host's samples go on without it
            log.warning("miles_profile: could not record a death: %s", exc)

    def _run(self) -> None:
        next_due = time.monotonic()
        while True:
            if not self.active:
                if self._stop.wait(self._standby_s):
                    return
                try:
                    taken = self._role.take(fallback=self.prefer)
                except OSError as exc:
                    log.warning("miles_profile: host sampler lock unusable: %s", exc)
                    return
                if taken and not self._activate_or_give_up():
                    return
                next_due = time.monotonic()
                continue
            next_due += self.interval_s
            delay = next_due - time.monotonic()
            if delay < 0:
                next_due, delay = time.monotonic(), 0.0
            if self._stop.wait(delay):
                return
            try:
                self.sample()
            except Exception as exc:
                log.warning("miles_profile: host sampler failed, leaving the role to another process: %s", exc)
                self._give_up()
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.active:
            try:
                self.sample()
                if self._deaths is not None:
                    self._record_deaths(self._deaths.finish())
                with self._lock:
                    self._writer.close()
                self.meta["end_time"] = time.time()
                write_host_meta(self.run_dir, self.stem, self.meta)
            except OSError as exc:  # a full disk at exit loses the last rows, never the program's exit
                log.warning("miles_profile: host sampler could not finish its files: %s", exc)
            self._writer = None
            self._close_probes()
        self._role.release()


# -- one per process ----------------------------------------------------------------------------
_running: HostSampler | None = None
_users = 0
_running_lock = threading.Lock()


def join(run_dir: str | os.PathLike, prefer: bool, interval_s: float = DEFAULT_HOST_INTERVAL_S) -> HostSampler:
    """This process's host sampler for `run_dir` (started on the first call; shared by later ones)."""
    global _running, _users
    with _running_lock:
        if _running is not None and _running.run_dir == Path(run_dir):
            _users += 1
            return _running
        sampler = HostSampler(run_dir, interval_s=interval_s, prefer=prefer).start()
        if _running is None:
            _running, _users = sampler, 1
        return sampler


def leave(sampler: HostSampler) -> None:
    global _running, _users
    with _running_lock:
        if sampler is _running:
            _users -= 1
            if _users > 0:
                return
            _running = None
    sampler.stop()
