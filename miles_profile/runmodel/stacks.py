"""Which code made the peak: the top allocation sites of a `record --stacks` snapshot, at its peak.

A snapshot (PyTorch's `torch.cuda.memory._snapshot()`, docs/stacks.md) holds the blocks live when it was
taken (`segments[].blocks[]`, each with the `frames` of its allocation when history was on) and the
history of the recorded phase (`device_traces[d]`: `alloc`, `free_requested`, `free_completed`, ...
with `addr`, `size`, `frames`). The live set at the peak is rebuilt from both: the blocks live before
the history's first entry (live at the end and never touched by it, or freed by it before any
allocation at their address), then the history replayed, an allocation adding its block and a
`free_completed` removing it (as PyTorch's own `_memory_viz.trace` counts), the highest total kept.
Each block is then charged to its site: the innermost frame outside torch's own code.

    peak_sites(snapshot, *, limit=10, max_entries=None) -> list[DevicePeak]   # pure, one per device
    load_snapshot(path) -> dict        # plain data only: a log directory's pickle never runs code
    stacks_of(run, *, limit=10) -> list[StackSnapshot]   # one per `stacks` event of the run
    stacks_records(found) -> list[dict]                   # --json
    how_to_open(snapshot) -> str                          # the memory_viz line every view shows
"""
from __future__ import annotations

import functools
import gc
import numbers
import os
import pickle
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from miles_profile.runmodel.timeline_marks import with_iterations
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.files import open_regular
from miles_profile.stacks import DEFAULT_MAX_ENTRIES

MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"
# A snapshot is bounded by --stacks-max-entries; past this a file is no snapshot of ours (or needs
# PyTorch's own tools): refused before it is read.
MAX_SNAPSHOT_BYTES = 1024 ** 3
BEFORE_HISTORY = "(allocated before history started: no stack)"
EVENT_KIND = "stacks"  # miles_profile/stacks.py's events
_NATIVE_SUFFIXES = (".cpp", ".cc", ".c", ".h", ".hpp", ".cu", ".cuh")


@dataclass(frozen=True)
class Site:
    """Live bytes at the peak charged to one line of code."""
    site: str  # "path/to/file.py:123", or BEFORE_HISTORY
    file: str
    line: int | None
    function: str
    bytes: int
    count: int  # blocks
    internal: bool = False  # no frame outside torch: the outermost frame stands for the caller
    stack: tuple[str, ...] = ()  # up to 6 frames from the site outwards, "file:line (function)"


@dataclass
class DevicePeak:
    device: int
    peak_bytes: int  # requested bytes live at the peak
    end_bytes: int  # at the snapshot (the phase's end)
    entries: int  # history entries on this device
    truncated: bool  # the history was full: the peak may predate its oldest entry
    sites: list[Site] = field(default_factory=list)  # the top `limit`, most bytes first
    other_bytes: int = 0  # live at the peak, in sites past the top
    other_count: int = 0
    peak_entry: int = -1  # index of the history entry that reached the peak (-1: before the history)
    peak_time_us: int | None = None  # that entry's time_us, where PyTorch records it


# -- the pure part: a snapshot dict in, the sites at its peak out ------------------------------------
def _internal(filename: str) -> bool:
    """Torch's own Python code, native frames (stacks="all") and the import machinery."""
    f = str(filename).replace("\\", "/")
    return ("/torch/" in f or f.startswith("torch/") or f.startswith("<frozen") or f in ("", "??")
            or f.endswith(_NATIVE_SUFFIXES))


def _frame_text(frame: dict) -> str:
    return f"{frame.get('filename', '?')}:{frame.get('line', '?')} ({frame.get('name', '?')})"


def _site_of(frames: list[dict]) -> tuple[str, int | None, str, bool, tuple[str, ...]]:
    """(file, line, function, internal, stack): the innermost frame outside torch (frames are innermost
    first); the outermost frame when all are torch's; BEFORE_HISTORY when there are none."""
    if not frames:
        return BEFORE_HISTORY, None, "", False, ()
    at = next((k for k, f in enumerate(frames) if not _internal(f.get("filename", ""))), None)
    internal = at is None
    at = len(frames) - 1 if internal else at
    f = frames[at]
    line = f.get("line")
    return (str(f.get("filename", "?")), int(line) if isinstance(line, int) else None, str(f.get("name", "")),
            internal, tuple(_frame_text(x) for x in frames[at:at + 6]))


def _live_blocks(snapshot: dict, device: int) -> dict[int, tuple[int, list]]:
    """{address: (requested bytes, frames)} of the blocks in use when the snapshot was taken."""
    live: dict[int, tuple[int, list]] = {}
    for seg in snapshot.get("segments") or ():
        if int(seg.get("device", 0) or 0) != device:
            continue
        address = int(seg.get("address", 0) or 0)
        for block in seg.get("blocks") or ():
            size = int(block.get("size", 0) or 0)
            at = int(block.get("address", address))  # old snapshots: blocks follow each other in the segment
            address = at + size
            if str(block.get("state", "")).startswith("active"):  # allocated, or freed awaiting its stream
                live[at] = (int(block.get("requested_size", size) or 0), list(block.get("frames") or ()))
    return live


def _start_state(live_end: dict, trace: list[dict]) -> dict[int, tuple[int, list]]:
    """The blocks live before the history's first entry."""
    first: dict[int, dict] = {}
    for e in trace:
        if e.get("action") in ("alloc", "free_completed") and e.get("addr") is not None:
            first.setdefault(int(e["addr"]), e)
    start = {a: v for a, v in live_end.items() if a not in first}
    for addr, e in first.items():
        if e["action"] == "free_completed":  # freed before anything was allocated there: live at the start
            start[addr] = (int(e.get("size", 0) or 0), list(e.get("frames") or ()))
    return start


def _replay(start: dict, trace: list[dict], stop_at: int | None = None) -> tuple[dict, int, int]:
    """(live set, peak total, index of the entry that reached it): the history replayed from `start`,
    up to and including entry `stop_at` when given (then the live set is the one after it)."""
    live = dict(start)
    total = sum(size for size, _ in live.values())
    peak, peak_at = total, -1
    for k, e in enumerate(trace if stop_at is None else trace[:stop_at + 1]):
        action, addr = e.get("action"), e.get("addr")
        if addr is None:
            continue
        if action == "alloc":
            old = live.get(int(addr))
            total += int(e.get("size", 0) or 0) - (old[0] if old else 0)
            live[int(addr)] = (int(e.get("size", 0) or 0), list(e.get("frames") or ()))
        elif action == "free_completed" and int(addr) in live:
            total -= live.pop(int(addr))[0]
        if total > peak:
            peak, peak_at = total, k
    return live, peak, peak_at


def _sites(live: dict, limit: int) -> tuple[list[Site], int, int]:
    by_site: dict[tuple, list] = {}
    for size, frames in live.values():
        file, line, function, internal, stack = _site_of(frames)
        entry = by_site.setdefault((file, line, function), [0, 0, internal, stack])
        entry[0] += size
        entry[1] += 1
    ranked = sorted(by_site.items(), key=lambda kv: (-kv[1][0], -kv[1][1], str(kv[0])))
    sites = [Site(site=file if line is None else f"{file}:{line}", file=file, line=line, function=function,
                  bytes=b, count=n, internal=internal, stack=stack)
             for (file, line, function), (b, n, internal, stack) in ranked[:limit]]
    rest = ranked[limit:]
    return sites, sum(v[0] for _, v in rest), sum(v[1] for _, v in rest)


def _devices(snapshot: dict) -> list[int]:
    traces = snapshot.get("device_traces") or []
    found = {k for k, t in enumerate(traces) if t}
    found |= {int(s.get("device", 0) or 0) for s in snapshot.get("segments") or ()}
    return sorted(found)


def peak_sites(snapshot: dict, *, limit: int = 10, max_entries: int | None = None) -> list[DevicePeak]:
    """Per device of the snapshot, the live requested bytes at the history's peak by allocation site.
    `max_entries`: the history's bound, to say when it was full."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments", []), list):
        raise ValueError("not a PyTorch memory snapshot (no segments list)")
    traces = snapshot.get("device_traces") or []
    bound = int(max_entries) if max_entries else DEFAULT_MAX_ENTRIES
    out = []
    for device in _devices(snapshot):
        # PyTorch keeps the latest max_entries entries: a longer history is no file the recorder wrote,
        # and only its latest `bound` entries are replayed (the work follows the entries used, not the file)
        kept = ((traces[device] if device < len(traces) else None) or ())[-bound:]
        trace = [e for e in kept if isinstance(e, dict)]
        if len(trace) < len(kept):  # damage, not a history: said as unreadable rather than shown as "nothing"
            raise ValueError(f"{len(kept) - len(trace)} history entries of device {device} are no allocation records")
        live_end = _live_blocks(snapshot, device)
        start = _start_state(live_end, trace)
        _, peak, peak_at = _replay(start, trace)
        at_peak = start if peak_at < 0 else _replay(start, trace, peak_at)[0]
        sites, other_bytes, other_count = _sites(at_peak, limit)
        when = trace[peak_at].get("time_us") if peak_at >= 0 else None
        out.append(DevicePeak(device=device, peak_bytes=peak, end_bytes=sum(s for s, _ in live_end.values()),
                              entries=len(trace), truncated=bool(max_entries) and len(trace) >= int(max_entries),
                              sites=sites, other_bytes=other_bytes, other_count=other_count, peak_entry=peak_at,
                              peak_time_us=int(when) if isinstance(when, (int, float)) else None))
    return out


# -- reading a snapshot file ------------------------------------------------------------------
class _PlainData(pickle.Unpickler):
    """A snapshot is dicts, lists, tuples, strings and numbers: any class in the file is refused, so
    reporting a log directory someone sent never runs their code."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refused {module}.{name}: a memory snapshot holds plain data only")


def load_snapshot(path: str | os.PathLike) -> dict:
    """The snapshot dict of a `.stacks.pickle` file; ValueError with the reason when it is none."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_SNAPSHOT_BYTES:
        raise ValueError(f"{path.name} is {size / 1024 ** 2:.0f} MiB, over the {MAX_SNAPSHOT_BYTES // 1024 ** 2} MiB "
                         "this report reads; open it in memory_viz")
    # Millions of small dicts: the cyclic collector would walk the growing heap again and again while
    # they are built (a 2M-entry, 101 MiB history unpickled in 20 s with it, 6 s without).
    collecting = gc.isenabled()
    gc.disable()
    try:
        with open(open_regular(path), "rb") as f:  # a FIFO or a device is refused, never waited on
            data = _PlainData(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            MemoryError, RecursionError) as exc:
        raise ValueError(f"{path.name} is no readable snapshot ({type(exc).__name__}: {exc})"[:300]) from None
    finally:
        if collecting:
            gc.enable()
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} is no memory snapshot (a {type(data).__name__}, not a dict)")
    return data


@functools.lru_cache(maxsize=8)
def _parsed(path: str, mtime_ns: int, size: int, limit: int, max_entries: int | None) -> tuple[DevicePeak, ...]:
    """The report, --json and the dashboard read one snapshot once (keyed by its stat)."""
    return tuple(peak_sites(load_snapshot(path), limit=limit, max_entries=max_entries))


# -- the run's snapshots ------------------------------------------------------------------------------
@dataclass
class StackSnapshot:
    """One process's `stacks` event, with its sites at the peak when the snapshot was written and read."""
    host: str
    pid: int
    status: str  # written, not_recorded, failed, missing (the file is not beside the log), unreadable
    rule: str = ""  # peak, named, attribute (miles_profile/stacks.py)
    phase: str = ""
    phase_id: int | None = None
    iteration: int | None = None
    file: str | None = None
    path: str | None = None  # where the report found it
    reason: str = ""  # why there are no sites
    max_entries: int | None = None
    recorded_peak: int | None = None  # the recorder's allocator peak of that phase (its end summary)
    devices: list[DevicePeak] = field(default_factory=list)

    @property
    def top(self) -> DevicePeak | None:
        """The device whose peak was highest (a process records on one GPU, as a rule)."""
        return max(self.devices, key=lambda d: d.peak_bytes, default=None)


def how_to_open(found: StackSnapshot) -> str:
    where = found.path or found.file or "the .stacks.pickle file"
    return (f"Open the snapshot in PyTorch's memory_viz: go to {MEMORY_VIZ_URL} and drag {where} onto the page "
            "(it is read in the browser, nothing is uploaded); the Active Memory Timeline shows every block with "
            "its stack.")


def _int(value) -> int | None:
    """An integer from JSON or numpy (np.int64 is no int), None for anything else (bool, NaN, text)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value
    return int(value) if ok else None


def _phase_facts(run, keys: set[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[int | None, int | None]]:
    """{(host, pid, phase id): (iteration, the recorder's allocator peak)} of the phases snapshots were taken
    around: one pass over the phases and the end events, whatever the number of processes."""
    if not keys or run.phases.empty:
        return {}
    phases = with_iterations(run.phases)
    iterations = {}
    for host, pid, phase_id, iteration in zip(phases["host"].astype(str), phases["pid"], phases["id"],
                                              phases["iteration"]):
        for key in ((host, int(pid), int(phase_id)), ("", int(pid), int(phase_id))):
            if key in keys:
                iterations[key] = None if iteration < 0 else int(iteration)
    events = run.events
    ends = events[(events["kind"] == "end") & events["id"].notna()]
    hosts = ends["host"].astype(str) if "host" in ends else [""] * len(ends)
    peaks = {}
    for host, pid, phase_id, attrs in zip(hosts, ends["pid"], ends["id"], ends["attrs"]):
        for key in ((host, int(pid), int(phase_id)), ("", int(pid), int(phase_id))):
            if key in keys:
                series = ((attrs or {}).get("summary") or {}).get("series") or {}
                found = [v.get("peak") for name, v in series.items()
                         if name.startswith("gpu") and name.endswith("_alloc") and isinstance(v, dict)]
                found = [p for p in found if isinstance(p, (int, float))]
                peaks[key] = int(max(found)) if found else None
    return {key: (iterations.get(key), peaks.get(key)) for key in keys}


def _locate(run, name: str) -> Path | None:
    for folder in [*(getattr(run, "directories", None) or ()), run.path]:
        candidate = Path(folder) / name
        if os.path.lexists(candidate):  # a FIFO or link there is refused when read, and said so
            return candidate
    return None


def stacks_of(run, *, limit: int = 10) -> list[StackSnapshot]:
    """Every `stacks` event of the run, each with its sites at the peak when its snapshot can be read."""
    events = run.events
    if events is None or events.empty:
        return []
    rows = events[events["kind"] == EVENT_KIND]
    out = []
    for row in rows.to_dict("records"):
        attrs = row.get("attrs") or {}
        host = "" if row.get("host") is None or row.get("host") != row.get("host") else str(row["host"])
        out.append(StackSnapshot(host=host, pid=int(row["pid"]), status=str(attrs.get("status", "")),
                                 rule=str(attrs.get("rule", "")), phase=str(attrs.get("phase", "")),
                                 phase_id=_int(attrs.get("phase_id")), file=attrs.get("file"),
                                 reason=str(attrs.get("reason") or attrs.get("error") or ""),
                                 max_entries=_int(attrs.get("max_entries"))))
    facts = _phase_facts(run, {(f.host, f.pid, f.phase_id) for f in out if f.phase_id is not None})
    for found in out:
        found.iteration, found.recorded_peak = facts.get((found.host, found.pid, found.phase_id), (None, None))
        if found.status == "written" and isinstance(found.file, str):
            _read_into(run, found, limit)
    return out


def _read_into(run, found: StackSnapshot, limit: int) -> None:
    path = _locate(run, Path(found.file).name)  # a bare name beside the log, never a path the log chose
    if path is None:
        found.status, found.reason = "missing", f"{found.file} is not beside the log (copied without it?)"
        return
    found.path = str(path)
    try:
        stat = path.stat()
        found.devices = list(_parsed(str(path), stat.st_mtime_ns, stat.st_size, limit, found.max_entries))
    except (OSError, ValueError, MilesProfileError) as exc:
        found.status, found.reason = "unreadable", str(exc) if path.name in str(exc) else f"{path.name}: {exc}"
    except (TypeError, AttributeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        # plain data of the wrong shape (segments as ints, a trace that is a number): this snapshot
        # loses its section, never the report
        found.status, found.reason = "unreadable", (f"{path.name} is no memory snapshot of PyTorch's shape "
                                                    f"({type(exc).__name__}: {exc})")[:300]


def stacks_records(found: list[StackSnapshot]) -> list[dict[str, Any]]:
    """The run's snapshots for --json: everything above, bytes as integers, plus `open_with`."""
    out = []
    for s in found:
        record = asdict(s)
        for device in record["devices"]:
            for site in device["sites"]:
                site["stack"] = list(site["stack"])
        record["open_with"] = how_to_open(s) if s.status == "written" else None
        out.append(record)
    return out
