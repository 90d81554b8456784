"""Read the topology stream of a Miles dashboard directory (schema: importers/miles_dashboard.py).

    topology(root, warnings) -> [{t0, t1, workers: [{addr, engine_rank, node, gpu, uuid}], new: [...]}]

Snapshots have validity windows [t0, t1) (snapshot N holds until N+1); `new` are the workers no earlier
snapshot (in file order) listed. Engines registering one at a time make Miles write N snapshots of
1..N engines: at 3,000 engines 4.5 million listings, 700 MB of JSON whose decoding took 70 of an
import's 100 s. So a line whose engines array begins with the previous snapshot's array, byte for byte,
and appends to it is decoded only in what it appends: equal text up to an element boundary is equal
elements (a JSON value ends where its own text ends), and those elements' workers are the previous
snapshot's. Any other line (another key order, an engine gone, a first line) is decoded whole.
A worker seen in many snapshots is one dict shared by them. The file is mapped, not read: its 700 MB
are compared in the page cache, never copied (reading them cost 1.6 GB and seconds).
"""
from __future__ import annotations

import json
import mmap
import re
from pathlib import Path

import numpy as np

from miles_profile.importers.miles_dashboard_streams import stream_files
from miles_profile.logdir.files import DATA_MAX_BYTES, NotRegularFile, map_regular

# `{"ts":<number>,"engines":[` as Miles' json.dumps writes it (any spacing): the lines the prefix applies to.
_HEAD = re.compile(rb'\{\s*"ts"\s*:\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*,\s*"engines"\s*:\s*(?=\[)')
_MALFORMED = (AttributeError, KeyError, TypeError, ValueError, RecursionError)


class _Reader:
    """Snapshots in file order; `known` maps (addr, engine_rank) to the workers built for each variant."""

    def __init__(self) -> None:
        self.snapshots: list[dict] = []
        self.known: dict = {}
        self.prefix: bytes | None = None  # the last snapshot's engines array without its closing bracket
        self.prefix_workers: list[dict] = []

    def line(self, data: mmap.mmap | bytes, start: int, end: int) -> None:
        """Read data[start:end] as one snapshot; raises one of _MALFORMED for a damaged line."""
        try:
            if self._by_prefix(data, start, end):
                return
        except (ValueError, RecursionError):  # e.g. `"engines":[...],"more":[...]}`: not the array's end
            pass
        row = json.loads(data[start:end])
        self._add(float(row["ts"]), [], row.get("engines") or [], None)

    def _by_prefix(self, data: mmap.mmap | bytes, start: int, end: int) -> bool:
        """Add the line if it is `{"ts":T,"engines":[...]}`, decoding only what it appends to the previous
        snapshot's array; False for any other shape. Raises ValueError where `[...]` is no array."""
        head = _HEAD.match(data, start, end)
        close = data.rfind(b"]", start, end)
        if head is None or close < head.end() or data[close + 1:end].strip() != b"}":
            return False
        t0, array, prefix = float(head[1]), head.end(), self.prefix
        after = array + len(prefix) if prefix is not None else -1
        if array < after <= close and data.find(prefix, array, after) == array:  # a memcmp, no copy
            if after == close:  # the same engines as the snapshot before
                self._add(t0, self.prefix_workers, [], prefix)
                return True
            if data[after] == ord(","):  # what this line appends, as an array of its own
                appended = json.loads(b"[" + data[after + 1:close + 1])
                self._add(t0, self.prefix_workers, appended, data[array:close])
                return True
        engines = json.loads(data[array:close + 1])  # an array: the head ends at its bracket
        self._add(t0, [], engines, data[array:close] if engines else None)
        return True

    def _add(self, t0: float, listed: list[dict], engines: list, prefix: bytes | None) -> None:
        """Append a snapshot of the `listed` workers plus those of `engines`; it becomes the next prefix."""
        workers, new, first = list(listed), [], []  # `first`: engines new in this line, kept if it reads whole
        for engine in engines:
            found = _known_workers(self.known, engine)
            if found is None:
                found = _engine_workers(engine)
                first.append((engine, found))
                new += found
            workers += found
        self.snapshots.append({"t0": t0, "workers": workers, "new": new})
        for engine, found in first:
            self.known.setdefault((engine["addr"], engine.get("engine_rank")), []).append(
                (engine.get("gpus"), engine.get("gpu_uuids"), found))
        self.prefix, self.prefix_workers = prefix, workers


def topology(root: Path, warnings: list[str]) -> list[dict]:
    reader, bad = _Reader(), 0
    for path in stream_files(root, "topology"):
        data, regions = _mapped(path, warnings)
        try:
            for start, stop in regions:
                while start < stop:
                    end = data.find(b"\n", start, stop)
                    end = stop if end < 0 else end
                    try:
                        reader.line(data, start, end)
                    except _MALFORMED:
                        bad += bool(data[start:end].strip())
                        reader.prefix = None  # the next line is decoded whole
                    start = end + 1
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
    if bad:  # one line however many: a damaged topology stream of 3,000 snapshots is one problem
        warnings.append(f"topology: skipped {bad} malformed snapshot{'s' * (bad != 1)}")
    snapshots = sorted(reader.snapshots, key=lambda s: s["t0"])
    for snapshot, after in zip(snapshots, snapshots[1:] + [None]):
        snapshot["t1"] = after["t0"] if after else np.inf
    return snapshots


def _mapped(path: Path, warnings: list[str]) -> tuple[mmap.mmap | bytes, list[tuple[int, int]]]:
    """The file mapped read-only and its [start, end) ranges of complete lines, by the rules of the
    streams' guarded read (logdir/files.py read_data): regular files only, holes skipped (a line cut
    by one reads as two malformed lines), at most DATA_MAX_BYTES, a truncated last line dropped."""
    try:
        data, extents = map_regular(path)
    except NotRegularFile as exc:
        warnings.append(f"topology/{exc}, skipped")
        return b"", []
    regions, left = [], DATA_MAX_BYTES
    for start, end in extents:
        regions.append((start, min(end, start + left)))
        left -= regions[-1][1] - start
        if left <= 0:
            break
    if left <= 0 and sum(e - s for s, e in extents) > DATA_MAX_BYTES:
        warnings.append(f"topology/{path.name}: only its first {DATA_MAX_BYTES:,} data bytes were read")
    if regions:
        start, end = regions[-1]
        complete = data.rfind(b"\n", start, end) + 1
        if complete < end:
            warnings.append(f"topology/{path.name}: dropped a truncated last line")
        regions[-1] = (start, max(start, complete))
    return data, regions


def _known_workers(known: dict, engine: dict) -> list[dict] | None:
    """The workers of an engine an earlier snapshot listed alike (address, rank, GPUs and UUIDs
    equal: list comparison in C, no key built per engine and snapshot), else None."""
    for gpus, uuids, workers in known.get((engine["addr"], engine.get("engine_rank")), ()):
        if gpus == engine.get("gpus") and uuids == engine.get("gpu_uuids"):
            return workers
    return None


def _engine_workers(engine: dict) -> list[dict]:
    uuids = list(engine.get("gpu_uuids") or [])
    workers = []
    for k, (node, gpu) in enumerate(engine.get("gpus") or []):
        uuid = uuids[k] if k < len(uuids) and isinstance(uuids[k], str) and uuids[k] else None
        workers.append({"addr": str(engine["addr"]), "engine_rank": int(engine.get("engine_rank", -1)),
                        "node": str(node), "gpu": int(gpu), "uuid": uuid})
    return workers
