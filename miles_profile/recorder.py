"""The recorder: opens the probes, writes meta, runs the sampler and owns the phase bookkeeping.

One recorder is active per process at a time (`active()`); `phase()`/`mark()` talk to it.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from miles_profile import host_sampler, names
from miles_profile.errors import MilesProfileError
from miles_profile.identity import RUN_ID_ENV, cuda_identity, host_name, process_identity
from miles_profile.logdir.layout import new_run_dir, process_stem
from miles_profile.logdir.writer import EventWriter, SampleWriter, write_process_meta, write_run_meta
from miles_profile.phase_summary import PhaseSummaries, stamp
from miles_profile.probes.disk import DiskProbe
from miles_profile.probes.host import HostProbe
from miles_profile.probes.nvml import open_nvml
from miles_profile.probes.process import OwnProcessProbe, ProcessTreeProbe
from miles_profile.probes.torch_allocator import open_torch_allocator
from miles_profile.sampler import Sampler

# 20 ms: the overhead benchmark (docs/benchmarks.md) measured it within 1% of step time on a
# launch-bound loop; true peaks per sample make a higher rate unnecessary.
DEFAULT_INTERVAL_MS = 20.0
DEFAULT_LOG_DIR = "/tmp/memory_logs"
OPTIONAL_PROBES = ("nvml", "torch_allocator")  # sources a user may switch off (`disable=`)

_active: "Recorder | None" = None
_active_lock = threading.Lock()


def active() -> "Recorder | None":
    return _active


def create_run(log_dir: str | os.PathLike, command: list[str], interval_ms: float, run_id: str | None = None) -> Path:
    """A new run directory under `log_dir`, with its run meta. `run_id` (else $MILES_PROFILE_RUN_ID,
    else the directory's name) is what the directories of one run on several hosts share."""
    try:
        run_dir = new_run_dir(Path(log_dir))
    except OSError as exc:
        raise MilesProfileError(f"cannot create a run under {log_dir}: {exc.strerror or exc}") from None
    write_run_meta(run_dir, {"run_id": run_id or os.environ.get(RUN_ID_ENV) or run_dir.name, "command": command,
                             "host": host_name(), "pid": os.getpid(), "start_time": time.time(),
                             "interval_ms": float(interval_ms)})
    return run_dir


def _run_id_of(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / "meta.json").read_text()).get("run_id") or run_dir.name)
    except (OSError, ValueError, AttributeError):
        return run_dir.name


def _after(t_row: float) -> float:
    """An event time after the row just written, as the file holds it (6 decimals) and before any
    later row: so a phase's rows are exactly those of its process with start < t <= end."""
    return max(time.time(), stamp(t_row) + 1e-6)


class Recorder:
    """Records this process (or, with `child_pid`, a child's process tree) into a run directory.

    `log_dir`: a new run directory is created under it. `run_dir`: join an existing run (a child
    handed one by `record --exec`). `run_id`: the id that the directories of one run on several hosts
    share (default $MILES_PROFILE_RUN_ID, else the new directory's name). `host_sampling`: take part in
    electing this host's sampler (host_sampler.py); off, this process reads host memory and NVML itself.
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, *, run_dir: str | os.PathLike | None = None,
                 interval_ms: float = DEFAULT_INTERVAL_MS, watch_dirs: Iterable[str] = (),
                 child_pid: int | None = None, command: list[str] | None = None,
                 flush_interval_s: float = 0.5, disable: Iterable[str] = (), host_sampling: bool = True,
                 run_id: str | None = None):
        if interval_ms <= 0:
            raise MilesProfileError(f"interval must be positive, got {interval_ms} ms")
        self._log_dir = Path(log_dir or DEFAULT_LOG_DIR)
        self.run_dir: Path | None = Path(run_dir) if run_dir else None
        self.interval_ms = float(interval_ms)
        self._watch_dirs = tuple(watch_dirs)
        self._child_pid = child_pid
        self._command = command if command is not None else list(sys.argv)
        self._flush_interval_s = flush_interval_s
        unknown = set(disable) - set(OPTIONAL_PROBES)
        if unknown:
            raise MilesProfileError(f"unknown probe {sorted(unknown)[0]!r}; optional probes: {', '.join(OPTIONAL_PROBES)}")
        self._disable = frozenset(disable)
        self._ids = itertools.count(1)
        self._open: dict[int, str] = {}  # open phases by id, in begin order
        self._phase_lock = threading.Lock()
        self._local = threading.local()  # per-thread stack of phase ids, for parents
        self._sampler: Sampler | None = None
        self._events: EventWriter | None = None
        self._disk: DiskProbe | None = None
        self._meta: dict[str, Any] = {}
        self._stem = process_stem()
        self._identity = process_identity("exec_parent" if child_pid else "in_process")
        if child_pid:  # the reader relies on this role to tag rows sampled from outside
            self._identity["role"] = "exec_parent"
        self._run_id = run_id
        self._host_sampling = host_sampling  # take part in the election of the host sampler
        self._host: host_sampler.HostSampler | None = None
        self._summaries: PhaseSummaries | None = None
        self._cuda_noted = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "Recorder":
        global _active
        if self._sampler is not None:
            return self
        run_dir = self._prepare_run_dir()
        if self._host_sampling:
            # record (the outside sampler) and local rank 0 try first (not an engine process that
            # inherited its rank's LOCAL_RANK); see host_sampler.py.
            prefer = self._child_pid is not None or (self._identity["local_rank"] == 0
                                                     and self._identity["role"] != "engine")
            self._host = host_sampler.join(run_dir, prefer=prefer)
        probes, probe_meta = self._open_probes()
        self._meta = self._process_meta(probes, probe_meta)
        write_process_meta(run_dir, self._stem, self._meta)
        self._events = EventWriter(run_dir, self._stem)
        columns = Sampler.columns_of(probes)
        writer = SampleWriter(run_dir, self._stem, columns, self._flush_interval_s)
        self._summaries = PhaseSummaries(columns)
        self._sampler = Sampler(probes, writer, self.interval_ms / 1000.0, self.current_phase, self._summaries.add)
        self._sampler.start()
        with _active_lock:
            if self._child_pid is None and _active is None:
                _active = self
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        global _active
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        sampler.stop()
        if self._events is not None:
            self._events.close()
        if self._host is not None:
            host_sampler.leave(self._host)
        with _active_lock:
            if _active is self:
                _active = None
        self._note_cuda(write=False)
        self._meta["end_time"] = time.time()
        write_process_meta(self.run_dir, self._stem, self._meta)
        atexit.unregister(self.stop)

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _prepare_run_dir(self) -> Path:
        if self.run_dir is None:
            self.run_dir = create_run(self._log_dir, self._command, self.interval_ms, self._run_id)
        elif not self.run_dir.is_dir():
            raise MilesProfileError(f"run directory {self.run_dir} does not exist")
        return self.run_dir

    def _open_probes(self) -> tuple[list, list[dict[str, Any]]]:
        process = ProcessTreeProbe(self._child_pid) if self._child_pid else OwnProcessProbe()
        self._disk = DiskProbe(self._watch_dirs)
        probes: list = [process]
        meta = [process.describe()]
        # Host-wide sources (host memory, NVML device totals) are read once per host: only the process
        # that holds the host role at start keeps them in its own rows too (so a one-process run's
        # report is as before); the others record what only they can see.
        host_role = self._host is not None and self._host.active or not self._host_sampling
        if host_role:
            host = HostProbe()
            probes.append(host)
            meta.append(host.describe())
        else:
            meta.append({"name": "host", "active": False, "reason": "read by this host's host sampler"})
        if "nvml" in self._disable:
            meta.append({"name": "nvml", "active": False, "reason": "disabled"})
        elif not host_role:
            meta.append({"name": "nvml", "active": False, "reason": "read by this host's host sampler"})
        else:
            nvml, nvml_meta = open_nvml(lambda: process.pids)
            meta.append(nvml_meta)
            if nvml:
                probes.append(nvml)
        if "torch_allocator" in self._disable:
            meta.append({"name": "torch_allocator", "active": False, "reason": "disabled"})
        elif self._child_pid is None:  # another process's allocator can't be read from here
            allocator, allocator_meta = open_torch_allocator()
            meta.append(allocator_meta)
            if allocator:
                probes.append(allocator)
        probes.append(self._disk)
        meta.append(self._disk.describe())
        return probes, meta

    def _process_meta(self, probes: list, probe_meta: list[dict[str, Any]]) -> dict[str, Any]:
        devices = next((m.get("devices", []) for m in probe_meta if m["name"] == "nvml"), [])
        return {
            **self._identity, "pid": os.getpid(), "stem": self._stem, "run_id": _run_id_of(self.run_dir),
            "host_sampler": self._host is not None and self._host.active, "gpu_uuid": None,
            "child_pid": self._child_pid, "command": list(sys.argv), "start_time": time.time(),
            "interval_ms": self.interval_ms, "devices": devices, "probes": probe_meta,
            "columns": Sampler.columns_of(probes),
        }

    # -- phases ------------------------------------------------------------------------------
    def current_phase(self) -> str:
        open_phases = self._open
        return next(reversed(open_phases.values()), "") if open_phases else ""

    def begin(self, name: str, attrs: dict[str, Any]) -> int:
        stack = self._stack()
        phase_id = next(self._ids)

        def opened(t_row: float) -> float:  # under the sampler's lock, right after the "before" row
            self._summaries.open(phase_id)
            with self._phase_lock:
                self._open[phase_id] = name
            return _after(t_row)

        t = self._sampler.sample(then=opened)  # the "before" row, in the enclosing phase
        self._events.write(names.BEGIN, name, attrs, t=t, id=phase_id, parent=stack[-1] if stack else None)
        stack.append(phase_id)
        self._note_cuda()
        return phase_id

    def end(self, phase_id: int, name: str, status: str = "ok") -> None:
        def closed(t_row: float) -> tuple[float, dict[str, Any] | None]:  # likewise, after the "after" row
            summary = self._summaries.close(phase_id)
            with self._phase_lock:
                self._open.pop(phase_id, None)
            return _after(t_row), summary

        # The "after" row: its peak covers the phase's last stretch.
        t, summary = self._sampler.sample(phase=name, then=closed)
        attrs: dict[str, Any] = {"status": status}
        if summary is not None:
            attrs["summary"] = summary
        self._events.write(names.END, name, attrs, t=t, id=phase_id)
        stack = self._stack()
        if phase_id in stack:
            stack.remove(phase_id)

    def event(self, kind: str, name: str, attrs: dict[str, Any]) -> None:
        self._events.write(kind, name, attrs)

    def watch_dir(self, path: str) -> None:
        self._disk.watch(path)
        self._meta["probes"] = [p if p["name"] != "disk" else self._disk.describe() for p in self._meta["probes"]]
        write_process_meta(self.run_dir, self._stem, self._meta)

    def annotate(self, fields: dict[str, Any]) -> None:
        """Merge `fields` into this process's meta under `annotations` (the file is rewritten atomically)."""
        self._meta["annotations"] = {**self._meta.get("annotations", {}), **fields}
        write_process_meta(self.run_dir, self._stem, self._meta)

    def _note_cuda(self, write: bool = True) -> None:
        """Once the program has initialised CUDA, say which GPU this process uses (never before)."""
        if self._cuda_noted:
            return
        found = cuda_identity()
        if found is None:
            return
        self._cuda_noted = True
        self._meta.update(found)
        if write:
            write_process_meta(self.run_dir, self._stem, self._meta)

    def _stack(self) -> list[int]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack
