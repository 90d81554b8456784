"""The recorder: opens the probes, writes meta, runs the sampler and owns the phase bookkeeping.

One recorder is active per process at a time (`active()`); `phase()`/`mark()` talk to it.
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import numbers
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterable

from miles_profile import host_sampler, names, stacks as stack_history
from miles_profile.cluster.identity import ray_identity
from miles_profile.errors import MilesProfileError
from miles_profile.identity import (RUN_ID_ENV, cuda_identity, distributed_rank, host_name, process_identity,
                                    python_process_name)
from miles_profile.logdir.layout import new_run_dir, process_stem
from miles_profile.logdir.writer import (
    EventWriter, SampleWriter, WriteFaults, write_process_meta, write_run_meta,
)
from miles_profile.phase_summary import PhaseSummaries, stamp
from miles_profile.probes.disk import DiskProbe
from miles_profile.probes.heap import boundary_heap_unread, open_heap
from miles_profile.probes.host import HostProbe
from miles_profile.probes.nvml import open_nvml
from miles_profile.probes.process import OwnProcessProbe, ProcessTreeProbe
from miles_profile.probes.torch_allocator import open_torch_allocator
from miles_profile.sampler import Sampler

# 100 ms: the job pays about 0.3% of a launch-bound step for it on the H200 (a row's reads ~150 us and the
# host sampler's tick ~140 us of GIL-held work, ten of each a second: bench/overhead_dose.py), against ~0.9%
# at 20 ms. Every row's peaks cover the whole interval and every phase boundary is read exactly, whatever
# the interval: it sets only the timeline's resolution (the verdicts of every committed log recorded at
# 20 ms are the same re-sampled to 100 ms: bench/interval_verdicts.py).
DEFAULT_INTERVAL_MS = 100.0
DEFAULT_LOG_DIR = "/tmp/memory_logs"
OPTIONAL_PROBES = ("nvml", "torch_allocator")  # sources a user may switch off (`disable=`)
# Below 1 ms the sampler is a busy loop that takes the GIL from the job; above a minute a run has
# almost no rows between phase boundaries (and `inf` overflows the thread's wait).
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 1.0, 60_000.0

log = logging.getLogger("miles_profile")

_active: "Recorder | None" = None
_active_lock = threading.Lock()
_started: "weakref.WeakSet[Recorder]" = weakref.WeakSet()  # running recorders, forgotten by a fork child


def active() -> "Recorder | None":
    return _active


def check_interval_ms(value: float) -> float:
    """The sampling interval, or MilesProfileError when it is outside 1 ms .. 60 s (nan and inf too)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # True would read as 1 ms
        raise MilesProfileError(f"interval must be a number of milliseconds, got {value!r}")
    value = float(value)
    if not value > 0:  # nan too
        raise MilesProfileError(f"interval must be positive, got {value:g} ms")
    if not MIN_INTERVAL_MS <= value <= MAX_INTERVAL_MS:
        raise MilesProfileError(f"interval must be between {MIN_INTERVAL_MS:g} and {MAX_INTERVAL_MS:g} ms, "
                                f"got {value:g} ms")
    return value


def forget_after_fork() -> "Recorder | None":
    """In a forked child: every inherited recorder belongs to the parent (its files are named by the
    parent's pid, its sampler thread did not survive the fork), so it is dropped without writing a
    byte, and its atexit `stop()` does nothing. Returns the parent's active recorder, whose run the
    child may join as itself."""
    global _active, _active_lock
    _active_lock = threading.Lock()  # a parent thread may have held it at fork time
    parent, _active = _active, None
    for rec in list(_started):
        rec._sampler = rec._events = None  # their descriptors are close-on-exec; never written here
    _started.clear()
    return parent


def device_key(device: Any) -> str:
    """"host", or "cuda:N" in this process's CUDA order (a torch.device, "cuda", an int index)."""
    if device is None or device == names.ACCOUNT_HOST or str(device) == "cpu":
        return names.ACCOUNT_HOST
    if isinstance(device, int):
        return f"cuda:{device}"
    text = str(device)
    if text == "cuda":  # the current device, as torch means it
        torch = sys.modules.get("torch")
        index = torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else 0
        return f"cuda:{index}"
    return text


def create_run(log_dir: str | os.PathLike, command: list[str], interval_ms: float, run_id: str | None = None,
               extra_meta: dict[str, Any] | None = None) -> Path:
    """A new run directory under `log_dir`, with its run meta. `run_id` (else $MILES_PROFILE_RUN_ID,
    else the directory's name) is what the directories of one run on several hosts share.
    `extra_meta`: more run meta keys (e.g. `phase_selection`, docs/log-format.md)."""
    try:
        run_dir = new_run_dir(Path(log_dir))
    except OSError as exc:
        raise MilesProfileError(f"cannot create a run under {log_dir}: {exc.strerror or exc}") from None
    try:
        write_run_meta(run_dir, {"run_id": run_id or os.environ.get(RUN_ID_ENV) or run_dir.name,
                                 "command": command, "host": host_name(), "pid": os.getpid(),
                                 "start_time": time.time(), "interval_ms": float(interval_ms),
                                 **(extra_meta or {})})
    except OSError as exc:
        with contextlib.suppress(OSError):
            run_dir.rmdir()  # without its meta it is no run
        raise MilesProfileError(f"cannot create a run under {log_dir}: {exc.strerror or exc}") from None
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
    `heap`: True: sample glibc's heap in use at every sample (probes/heap.py); False: never; None (default):
    $MILES_PROFILE_HEAP: "1" every sample (`record --heap`), "0" never (`record --no-heap`), else at phase
    boundaries only (what offload_drop needs on the host, at two reads per phase).
    `stacks`: "peak" or a phase name: CUDA allocation stacks around one phase (stacks.py; default:
    $MILES_PROFILE_STACKS, as `record --stacks` sets it), at most `stacks_max_entries` history entries.
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, *, run_dir: str | os.PathLike | None = None,
                 interval_ms: float = DEFAULT_INTERVAL_MS, watch_dirs: Iterable[str] = (),
                 child_pid: int | None = None, command: list[str] | None = None,
                 flush_interval_s: float = 0.5, disable: Iterable[str] = (), host_sampling: bool = True,
                 run_id: str | None = None, run_meta: dict[str, Any] | None = None, heap: bool | str | None = None,
                 stacks: str | None = None, stacks_max_entries: int | None = None):
        interval_ms = check_interval_ms(interval_ms)
        self._run_meta = dict(run_meta or {})  # more run meta keys, for a run this recorder creates
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
        env = os.environ.get(names.HEAP_ENV, "")
        # "every", "boundaries" or "" (off)
        if isinstance(heap, str):  # "every", "boundaries" or "" (bench/heap_probe_cost.py compares them)
            self._heap = heap
        else:
            self._heap = ("every" if heap else "") if heap is not None else {"1": "every", "0": ""}.get(env, "boundaries")
        self.samples_heap = False  # whether the heap probe opened (phases.heap_baseline)
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
        else:  # a Ray worker says which node, job, actor and bundle it is (cluster/identity.py)
            self._identity.update(ray_identity() or {})
            name = python_process_name()
            if name:
                self._identity["process_name"] = name
        # torchrun's RANK says it; else torch.distributed once initialised (noted at a phase's begin)
        self._rank_noted = child_pid is not None or "RANK" in os.environ
        self._run_id = run_id
        self._host_sampling = host_sampling  # take part in the election of the host sampler
        self._host: host_sampler.HostSampler | None = None
        self._summaries: PhaseSummaries | None = None
        self._stacks_asked = (stacks, stacks_max_entries)
        self._stacks: stack_history.StackHistory | None = None  # record --stacks / phase(stacks=True): stacks.py
        self._cuda_noted = False
        self._faults = WriteFaults()
        self._declared: dict[tuple[str, str, str], int] = {}  # (device, category, owner) -> bytes last written
        self._declared_lock = threading.Lock()
        self._own_phases = False  # a phase not `light` was opened: every boundary reads the heap from then on

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "Recorder":
        """Start recording; a run that can't be written at all is a MilesProfileError (nothing of
        the job has run yet). Once started, no write failure leaves the recorder."""
        global _active
        if self._sampler is not None:
            return self
        run_dir = self._prepare_run_dir()
        if self._host_sampling:
            # record (the outside sampler) and local rank 0 try first (not an engine process that
            # inherited its rank's LOCAL_RANK); see host_sampler.py.
            # A Ray worker stands by: its node's sampler actor (cluster/node_sampler.py) samples the host.
            prefer = self._child_pid is not None or (self._identity["local_rank"] == 0
                                                     and self._identity["role"] != "engine"
                                                     and "ray_node_id" not in self._identity)
            self._host = host_sampler.join(run_dir, prefer=prefer)
        probes, probe_meta = self._open_probes()
        columns = Sampler.columns_of(probes)
        try:
            self._meta = self._process_meta(probes, probe_meta)
            write_process_meta(run_dir, self._stem, self._meta)
            self._events = EventWriter(run_dir, self._stem, self._faults)
            writer = SampleWriter(run_dir, self._stem, columns, self._flush_interval_s, self._faults)
        except OSError as exc:
            for probe in probes:
                probe.close()
            if self._host is not None:
                host_sampler.leave(self._host)
            raise MilesProfileError(f"cannot record into {run_dir}: {exc.strerror or exc}") from None
        self._summaries = PhaseSummaries(columns)
        if self._child_pid is None:  # another process's allocator can't be recorded from here
            self._stacks = stack_history.from_env(run_dir, self._stem, self.event, *self._stacks_asked)
        self._sampler = Sampler(probes, writer, self.interval_ms / 1000.0, self.current_phase, self._summaries.add)
        self._sampler.start()
        _started.add(self)
        with _active_lock:
            if self._child_pid is None and _active is None:
                _active = self
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Stop and flush; never raises for the log's sake (it runs in the job's `with` and at exit)."""
        global _active
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        _started.discard(self)
        try:
            if self._stacks is not None:  # a phase still recorded is dumped while events can be written
                self._stacks.stop()
            sampler.stop()
            if self._events is not None:
                self._events.close()
            if self._host is not None:
                host_sampler.leave(self._host)
        except Exception as exc:  # noqa: BLE001 - the job's exit path must not fail for the log
            self._faults.failed("samples", 0, exc)
        finally:
            with _active_lock:
                if _active is self:
                    _active = None
            atexit.unregister(self.stop)
        with contextlib.suppress(Exception):
            self._note_cuda(write=False)
        self._write_end_meta()

    def _write_end_meta(self) -> None:
        """The end time, and what was lost: in the process meta when it can be written, else on stderr."""
        faults = self._faults
        self._meta["end_time"] = time.time()
        self._refresh_disk_meta()  # which watched dirs were read in the background, stale or skipped
        if faults.error is not None:
            self._meta.update(dropped=dict(faults.dropped), write_error=faults.error)
        try:
            write_process_meta(self.run_dir, self._stem, self._meta)
        except OSError as exc:
            if faults.error is None:
                faults.failed("events", 0, exc)  # the first (and only) warning
            else:
                log.warning("miles_profile: warning: pid %d dropped %d sample rows and %d events (%s)",
                            os.getpid(), faults.dropped["samples"], faults.dropped["events"], faults.error)

    def _guarded(self, what: str, write, *args, **kwargs) -> Any:
        """Record one row of `what` for the job; a failure is counted and warned about, never raised
        into the job (write errors are counted by the writers themselves; this catches the rest).
        Returns what `write` returned, None if it failed."""
        try:
            return write(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - e.g. attrs that json can't encode; the job goes on
            self._faults.failed(what, 1, exc)
            return None

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _prepare_run_dir(self) -> Path:
        if self.run_dir is None:
            self.run_dir = create_run(self._log_dir, self._command, self.interval_ms, self._run_id, self._run_meta)
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
        elif not host_role and self._child_pid is not None:
            meta.append({"name": "nvml", "active": False, "reason": "read by this host's host sampler"})
        else:
            # Without the host role: its own GPU at its own phase boundaries only (probes/nvml.py says why).
            nvml, nvml_meta = (open_nvml(lambda: process.pids) if host_role else
                               open_nvml(lambda: process.pids, interval_s=None, which=self._own_gpu))
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
        if self._heap and self._child_pid is not None:
            meta.append({"name": "heap", "active": False,
                         "reason": "another process's heap can't be read from here (a recorded child reads its own)"})
        elif self._heap == "boundaries" and (unread := boundary_heap_unread(Sampler.columns_of(probes))):
            meta.append({"name": "heap", "active": False, "reason": unread})
        elif self._heap:
            heap, heap_meta = open_heap(every_sample=self._heap == "every")
            meta.append(heap_meta)
            if heap:
                probes.append(heap)
                # a host forecast is judged only on a heap read at every sample (boundaries miss its peaks)
                self.samples_heap = self._heap == "every"
        probes.append(self._disk)
        meta.append(self._disk.describe())
        return probes, meta

    def _process_meta(self, probes: list, probe_meta: list[dict[str, Any]]) -> dict[str, Any]:
        devices = next((m.get("devices", []) for m in probe_meta if m["name"] == "nvml"), [])
        return {
            **self._identity, "pid": os.getpid(), "ppid": os.getppid(), "stem": self._stem,
            "run_id": _run_id_of(self.run_dir),
            "host_sampler": self._host is not None and self._host.active, "gpu_uuid": None,
            "child_pid": self._child_pid, "command": list(sys.argv), "start_time": time.time(),
            "interval_ms": self.interval_ms, "devices": devices, "probes": probe_meta,
            "columns": Sampler.columns_of(probes),
        }

    # -- phases ------------------------------------------------------------------------------
    def current_phase(self) -> str:
        open_phases = self._open
        return next(reversed(open_phases.values()), "") if open_phases else ""

    def _boundary_skip(self, light: bool) -> tuple[str, ...]:
        """Probes a boundary row leaves unread. An integration's step phase (`light`, integrations/steps.py)
        skips glibc's heap (and NVML, below): it is read at boundaries for offload_drop (the level before an offload, at its
        end and in the next phase), an integration never tags an offload, and the two mallinfo2 walks were
        the largest part of a step phase's cost (bench/step_phase_cost.py). Once the process opens a phase
        of its own (an offload among them, maybe), every boundary reads it again."""
        if not light:
            self._own_phases = True
            return ()
        # NVML too: its boundary values serve the ledger's add-up at offloads, and on a CUDA process its two
        # calls were 0.27 ms of a step phase's 1.06 ms on an H100 (bench/step_phase_probes.py cuda); the
        # periodic rows still read it.
        return () if self._own_phases else ("heap", "nvml")

    def begin(self, name: str, attrs: dict[str, Any], light: bool = False) -> int:
        stack = self._stack()
        phase_id = next(self._ids)

        def opened(t_row: float) -> float:  # under the sampler's lock, right after the "before" row
            self._summaries.open(phase_id)
            with self._phase_lock:
                self._open[phase_id] = name
            return _after(t_row)

        sampler, events = self._sampler, self._events
        if sampler is None:  # stopped, or inherited across a fork: not ours to write
            return 0
        # Before the "before" row: a process without the host role reads NVML only for its own GPU, known
        # once CUDA is noted, and the first phase after CUDA init needs that reading before it.
        self._note_cuda()
        self._note_rank()
        skip = self._boundary_skip(light)
        t = self._guarded("samples", sampler.sample, then=opened, skip=skip)  # the "before" row, in the enclosing phase
        if t is None:  # the row failed before `opened` ran
            t = opened(time.time())
        self._guarded("events", events.write, names.BEGIN, name, attrs, t=t, id=phase_id,
                      parent=stack[-1] if stack else None)
        stack.append(phase_id)
        if self._stacks is not None:
            self._stacks.begin(phase_id, name, attrs)
        return phase_id

    def end(self, phase_id: int, name: str, status: str = "ok", light: bool = False) -> None:
        def closed(t_row: float) -> tuple[float, dict[str, Any] | None]:  # likewise, after the "after" row
            summary = self._summaries.close(phase_id)
            with self._phase_lock:
                self._open.pop(phase_id, None)
            return _after(t_row), summary

        sampler, events = self._sampler, self._events
        if sampler is None or phase_id == 0:
            return
        # The "after" row: its peak covers the phase's last stretch.
        done = self._guarded("samples", sampler.sample, phase=name, then=closed, skip=self._boundary_skip(light))
        t, summary = done if done is not None else closed(time.time())
        attrs: dict[str, Any] = {"status": status}
        if summary is not None:
            attrs["summary"] = summary
        self._guarded("events", events.write, names.END, name, attrs, t=t, id=phase_id)
        if self._stacks is not None:  # after the end event: a snapshot's seconds are not the phase's
            self._stacks.end(phase_id, name, summary)
        stack = self._stack()
        if phase_id in stack:
            stack.remove(phase_id)

    def event(self, kind: str, name: str, attrs: dict[str, Any]) -> None:
        events = self._events
        if events is not None:
            self._guarded("events", events.write, kind, name, attrs)

    def watch_dir(self, path: str) -> None:
        if self._sampler is None:
            return
        self._disk.watch(path)
        self._refresh_disk_meta()
        self._write_meta()

    def _refresh_disk_meta(self) -> None:
        if self._disk is not None and "probes" in self._meta:
            self._meta["probes"] = [p if p["name"] != "disk" else self._disk.describe() for p in self._meta["probes"]]

    def annotate(self, fields: dict[str, Any]) -> None:
        """Merge `fields` into this process's meta under `annotations` (the file is rewritten atomically)."""
        if self._sampler is None:
            return
        self._meta["annotations"] = {**self._meta.get("annotations", {}), **fields}
        self._write_meta()

    def account(self, category: str, nbytes: int, device: Any = "host", owner: str = "") -> None:
        """One `account` event when (device, category, owner) changes value: the log holds each change,
        never a row per sample, and the reader knows every declared value at any instant. A value that
        is no byte count is counted as a dropped event and warned about, never raised into the job."""
        self._guarded("events", self._account, category, nbytes, device, owner)

    def _account(self, category: str, nbytes: int, device: Any, owner: str) -> None:
        category, nbytes, device, owner = str(category), int(nbytes), device_key(device), str(owner)
        if nbytes < 0:
            raise ValueError(f"account({category!r}): a negative byte count ({nbytes})")
        events = self._events
        if events is None:
            return
        with self._declared_lock:  # two threads declaring the same value write it once
            if self._declared.get((device, category, owner)) == nbytes:
                return
            self._declared[(device, category, owner)] = nbytes
            attrs = {"device": device, "bytes": nbytes, **({"owner": owner} if owner else {})}
            events.write(names.ACCOUNT, category, attrs)

    def _write_meta(self) -> None:
        try:
            write_process_meta(self.run_dir, self._stem, self._meta)
        except OSError as exc:  # the stop() meta says it again, if it can
            self._faults.failed("events", 0, exc)

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
            self._write_meta()

    def _note_rank(self) -> None:
        """Ranks started without RANK (mp.spawn) take theirs from torch.distributed once it is initialised."""
        if self._rank_noted:
            return
        found = distributed_rank()
        if found is None:
            return
        self._rank_noted = True
        self._meta["rank"], self._meta["world_size"] = found
        self._write_meta()

    def _own_gpu(self) -> tuple[int, ...]:
        """The CUDA index of this process's GPU once it has initialised CUDA (else none)."""
        uuid = self._meta.get("gpu_uuid")
        return tuple(d["index"] for d in self._meta.get("cuda_devices", ()) if uuid and d.get("uuid") == uuid)

    def _stack(self) -> list[int]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack
