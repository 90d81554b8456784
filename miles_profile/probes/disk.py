"""Bytes in files under watched directories (offload dirs), e.g. an `--offload-train-disk-dir`.

Watching a directory must never block the job: a boundary row is taken in the job's own thread, and
`--watch-dir /usr` (140,000 entries, 0.48 s a walk) once made a 9.5 s run take over 300 s. So a
directory is walked where the row is read only while it is small (INLINE_MAX_ENTRIES, about 1 ms);
the first walk that finds more gives up there and hands that directory to one background walker,
which re-walks it at a bounded duty cycle. Its rows then carry the last complete walk (stale by up
to one walk cycle), and are left empty (skipped) until one exists or when it is too old or the tree
outgrows WALK_MAX_ENTRIES / WALK_MAX_S. Which directories went to the background, how stale their
readings were and how many were skipped is in the probe's meta (`describe()`), written at stop.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("miles_profile")

# Walked in the reading thread up to this many entries: ~3.4 us an entry measured on /usr, so ~1 ms.
INLINE_MAX_ENTRIES = 256
# A background walk gives up past these (the reading is then skipped): a bounded cost whatever is watched.
WALK_MAX_ENTRIES = 2_000_000
WALK_MAX_S = 30.0  # of walking, the pauses not counted
# A background walk sleeps this many times each stretch of its work (walk_tree): it holds the GIL, which
# the job's Python thread needs, at most 1 / (1 + BACKGROUND_PAUSE) of the time (/usr: ~5 s a walk).
BACKGROUND_PAUSE = 9.0
# A background reading older than this many walk cycles (and STALE_MIN_S) is skipped, not written.
STALE_CYCLES, STALE_MIN_S = 3.0, 5.0
CHECK_EVERY = 256  # entries between two looks at the clock during a walk


@dataclass(frozen=True)
class Walk:
    bytes: int
    entries: int
    complete: bool  # False: stopped at a bound, `bytes` is a lower bound and not written
    seconds: float


def walk_tree(path: str, max_entries: int, max_s: float | None = None,
              cancelled: threading.Event | None = None, pause: float = 0.0) -> Walk:
    """Bytes of the regular files below `path` (symlinks not followed), stopping past `max_entries`
    entries, `max_s` seconds of walking or once `cancelled` is set. With `pause`, it sleeps `pause`
    times each stretch of CHECK_EVERY entries after it: a background walk then holds the GIL (which
    the job's Python thread needs) at most 1 / (1 + pause) of the time. Iterative: a deep tree can't
    exhaust the recursion limit."""
    total = entries = 0
    busy, stretch = 0.0, time.monotonic()
    pending = [path]
    while pending:
        try:
            with os.scandir(pending.pop()) as found:
                for entry in found:
                    entries += 1
                    if entries > max_entries:
                        return Walk(total, entries, False, busy + time.monotonic() - stretch)
                    if entries % CHECK_EVERY == 0:
                        now = time.monotonic()
                        busy += now - stretch
                        if (max_s is not None and busy > max_s) or (cancelled is not None and cancelled.is_set()):
                            return Walk(total, entries, False, busy)
                        if pause:
                            (cancelled or threading.Event()).wait(pause * (now - stretch))
                        stretch = time.monotonic()
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:  # removed meanwhile
                        pass
        except OSError:  # removed or unreadable meanwhile
            pass
    return Walk(total, entries, True, busy + time.monotonic() - stretch)


@dataclass
class Watched:
    """One watched directory; `last` is replaced whole by the walker (one assignment: no lock)."""
    path: str
    background: bool = False
    last: tuple[Walk, float] | None = None  # the last complete background walk, and when it ended
    stale_reads: int = 0  # rows that carried a background reading
    skipped_reads: int = 0  # rows left empty: no complete walk yet, too old, or past a bound
    max_age_s: float = 0.0  # the oldest background reading written into a row
    truncated: bool = False
    truncated_at: int | None = None  # entries seen by the walk that stopped at a bound

    def describe(self) -> dict[str, Any]:
        walk = self.last[0] if self.last else None
        return {"path": self.path, "mode": "background" if self.background else "inline",
                "entries": walk.entries if walk else None, "walk_s": round(walk.seconds, 4) if walk else None,
                "stale_reads": self.stale_reads, "skipped_reads": self.skipped_reads,
                "max_age_s": round(self.max_age_s, 3), "truncated": self.truncated,
                **({"truncated_at_entries": self.truncated_at} if self.truncated else {})}


class DiskProbe:
    """Always present so that dirs can be watched after the recorder started; empty until then.

    Like NVML, read at every phase boundary and at most every INTERVAL_S in between: a small offload
    directory costs 20-50 us a read (16 files, docs/benchmarks.md) and file sizes have no peak to
    lose, while the boundary rows give each offload's exact before and after. A large one is read in
    the background (see the module's docstring)."""

    name = "disk"
    columns = ("disk",)
    partial_reads = True  # the sampler passes full=False to periodic reads
    INTERVAL_S = 0.1

    def __init__(self, dirs: tuple[str, ...] = ()):
        self._watched: tuple[Watched, ...] = ()
        self._next_read = 0.0
        self._stop = threading.Event()
        self._walker: threading.Thread | None = None
        self._walker_lock = threading.Lock()
        for path in dirs:
            self.watch(path)

    @property
    def dirs(self) -> tuple[str, ...]:
        return tuple(w.path for w in self._watched)

    def watch(self, path: str) -> None:
        path = os.path.abspath(path)
        if path not in self.dirs:
            self._watched = self._watched + (Watched(path),)  # replaced, not mutated: other threads read it

    def read(self, full: bool = True) -> tuple[int | None]:
        watched, now = self._watched, time.monotonic()
        if not watched or (not full and now < self._next_read):
            return (None,)
        self._next_read = now + self.INTERVAL_S
        values = [self._read_one(w, now) for w in watched]
        return (None,) if None in values else (sum(values),)

    def _read_one(self, watched: Watched, now: float) -> int | None:
        if not watched.background:
            walk = walk_tree(watched.path, INLINE_MAX_ENTRIES)
            if walk.complete:
                return walk.bytes
            self._to_background(watched)
        last = watched.last
        age = now - last[1] if last else None
        if last is None or watched.truncated or age > self._stale_after(last[0]):
            watched.skipped_reads += 1
            return None
        watched.stale_reads += 1
        watched.max_age_s = max(watched.max_age_s, age)
        return last[0].bytes

    def _stale_after(self, walk: Walk) -> float:
        """Older than this, a background reading says more about the walker than the directory."""
        return max(STALE_MIN_S, STALE_CYCLES * ((1 + BACKGROUND_PAUSE) * walk.seconds + self.INTERVAL_S))

    def _to_background(self, watched: Watched) -> None:
        watched.background = True
        log.warning("miles_profile: --watch-dir %s holds more than %d entries: its bytes are now read in the "
                    "background, so its rows carry the last complete walk (stale; counts in the run's meta)",
                    watched.path, INLINE_MAX_ENTRIES)
        with self._walker_lock:
            if self._walker is None and not self._stop.is_set():
                self._walker = threading.Thread(target=self._walk_forever, name="miles_profile-disk", daemon=True)
                self._walker.start()

    def _walk_forever(self) -> None:
        while not self._stop.is_set():
            for watched in self._watched:
                if watched.background and not self._stop.is_set():
                    self._walk_background(watched)
            self._stop.wait(self.INTERVAL_S)

    def _walk_background(self, watched: Watched) -> None:
        walk = walk_tree(watched.path, WALK_MAX_ENTRIES, WALK_MAX_S, self._stop, pause=BACKGROUND_PAUSE)
        if self._stop.is_set():
            return
        if not walk.complete and not watched.truncated:
            log.warning("miles_profile: --watch-dir %s: a walk stopped after %d entries / %.1f s; its disk bytes "
                        "are not recorded", watched.path, walk.entries, walk.seconds)
        watched.truncated = not walk.complete
        watched.truncated_at = None if walk.complete else walk.entries
        if walk.complete:
            watched.last = (walk, time.monotonic())

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "active": True, "dirs": list(self.dirs),
                "watched": [w.describe() for w in self._watched]}

    def close(self) -> None:
        self._stop.set()
        walker = self._walker
        if walker is not None and walker is not threading.current_thread():
            walker.join(timeout=1.0)  # a walk looks at the stop flag every CHECK_EVERY entries
