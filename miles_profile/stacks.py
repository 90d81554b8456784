"""Stacks at the peak, opt-in: PyTorch's CUDA allocation history around ONE phase of this process.

`record --stacks [PHASE]` (or $MILES_PROFILE_STACKS, or `phase(name, stacks=True)` in code) turns on
`torch.cuda.memory._record_memory_history(max_entries=N)` when a phase begins and, when it ends, dumps
`torch.cuda.memory._snapshot()` beside the log as `<host>-<pid>.stacks.pickle`, turns history off and
writes a `stacks` event saying where. Once per process: history costs on every allocation, so it is never
on for more than one phase (docs/stacks.md).

Which phase (`rule`):
  * `named`: $MILES_PROFILE_STACKS names a phase kind: its first instance.
  * `attribute`: the first phase entered with `stacks=True`.
  * `peak` (the default): the first phase that begins while its kind holds this process's highest
    allocator peak among the phases ended so far. Decided online from the phase summaries, so the first
    instance of every kind is never recorded (its kind has held nothing yet): in an RL loop the first
    iteration ranks the kinds and the second records the one that held the peak. A later run of the same
    kind is where the peak recurs; the first iteration's own peak is seen in no stack.

Without CUDA: one line ("--stacks needs CUDA; recording without stacks") and the run goes on.
Imports torch only from `sys.modules`: a program that never imported it pays nothing.
"""
from __future__ import annotations

import os
import pickle
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from miles_profile.logdir.layout import STACKS_SUFFIX

STACKS_ENV = "MILES_PROFILE_STACKS"  # "peak" or a phase name: record --stacks [PHASE]
MAX_ENTRIES_ENV = "MILES_PROFILE_STACKS_MAX_ENTRIES"  # record --stacks-max-entries N
PEAK = "peak"
# PyTorch's own default is unbounded. 100,000 entries is a phase of thousands of steps of a small model,
# or a few of a large one; the ring buffer keeps the latest, and the report says when it was full.
DEFAULT_MAX_ENTRIES = 100_000
EVENT_KIND = "stacks"  # the event's kind and name (docs/log-format.md)
NO_CUDA_NOTICE = "--stacks needs CUDA; recording without stacks"
ATTRIBUTE = "stacks"  # phase(name, stacks=True)

_ALLOC_SERIES = re.compile(r"gpu\d+_alloc$")  # what the allocator's history shows: its allocated bytes
_PROC_SERIES = re.compile(r"gpu\d+_proc$")  # else NVML's bytes of this process (allocator probe off)


def requested_mode() -> str | None:
    """What $MILES_PROFILE_STACKS asks for: "peak", a phase name, or None (off)."""
    value = os.environ.get(STACKS_ENV, "").strip()
    return value or None


def requested_max_entries() -> int:
    try:
        value = int(os.environ.get(MAX_ENTRIES_ENV, "") or DEFAULT_MAX_ENTRIES)
    except ValueError:
        return DEFAULT_MAX_ENTRIES
    return value if value > 0 else DEFAULT_MAX_ENTRIES


def phase_peak(summary: dict[str, Any] | None) -> int | None:
    """The highest allocator peak (else NVML per-process peak) of a phase summary's GPU series."""
    series = (summary or {}).get("series") or {}
    for pattern in (_ALLOC_SERIES, _PROC_SERIES):
        peaks = [s.get("peak") for name, s in series.items() if pattern.match(name) and isinstance(s, dict)]
        peaks = [p for p in peaks if isinstance(p, (int, float))]
        if peaks:
            return int(max(peaks))
    return None


def _say(text: str) -> None:
    print(f"miles_profile: {text}", file=sys.stderr, flush=True)


def _cuda() -> Any:
    """torch, when this program imported it and CUDA is there; False when it is not; None: not yet known."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_available() else False
    except Exception:  # noqa: BLE001 - a broken driver is no CUDA, never the job's failure
        return False


class StackHistory:
    """One process's allocation history around one phase. `write_event(kind, name, attrs)` writes to
    the process's events. Every method is called by the recorder and never raises into the job."""

    def __init__(self, run_dir: Path, stem: str, write_event: Callable[[str, str, dict], None],
                 mode: str | None = None, max_entries: int = DEFAULT_MAX_ENTRIES):
        self.mode = mode  # None: only a phase attribute turns it on
        self.max_entries = int(max_entries)
        self.path = Path(run_dir) / f"{stem}{STACKS_SUFFIX}"
        self._write_event = write_event
        self._lock = threading.Lock()
        self._recording: tuple[int, str, str] | None = None  # (phase id, name, rule)
        self._done = False  # one snapshot per process
        self._cuda_known = False
        self._holder: str | None = None  # the kind that holds the highest peak of the phases ended so far
        self._holder_peak = 0

    # -- the recorder's hooks -------------------------------------------------------------------
    def begin(self, phase_id: int, name: str, attrs: dict[str, Any]) -> None:
        asked = bool(attrs.get(ATTRIBUTE)) if attrs else False
        if self._done or (self.mode is None and not asked):
            return
        with self._lock:
            if self._done or self._recording is not None:
                return
            if not self._cuda_known:
                found = _cuda()
                if found is False:  # torch is here, CUDA is not: say so at once
                    self._no_cuda(asked)
                    return
                self._cuda_known = bool(found)  # None: torch not imported yet
            rule = self._rule_for(name, asked)
            if rule is None:
                return
            if not self._cuda_known:  # the phase to record began before the program imported torch
                self._no_cuda(asked)
                return
            torch = sys.modules["torch"]
            try:
                torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                         max_entries=self.max_entries)
            except Exception as exc:  # noqa: BLE001 - an old torch, a driver error: the job goes on
                self._done = True
                self._event({"status": "failed", "phase": name, "phase_id": phase_id, "rule": rule,
                             "error": f"cannot record allocation history: {type(exc).__name__}: {exc}"[:300]})
                _say(f"warning: stacks not recorded: {exc}")
                return
            self._recording = (phase_id, name, rule)

    def end(self, phase_id: int, name: str, summary: dict[str, Any] | None) -> None:
        if self._done or (self._recording is None and self.mode != PEAK):
            return
        with self._lock:
            if self._recording is not None and self._recording[0] == phase_id:
                self._dump()
                return
            if self.mode == PEAK and self._recording is None:
                peak = phase_peak(summary)
                if peak is not None and peak > self._holder_peak:  # ties keep the earlier (inner) phase
                    self._holder, self._holder_peak = name, peak

    def stop(self) -> None:
        """At the recorder's stop: a phase still recorded is dumped; a request never met is said."""
        with self._lock:
            if self._recording is not None:
                self._dump()
                return
            if self._done or self.mode is None:
                return
            self._done = True
            if not self._cuda_known and not _cuda():
                self._no_cuda(False)
                return
            if self.mode == PEAK:
                reason = ("no phase of this process allocated CUDA memory" if self._holder is None else
                          f"the phase kind that held the peak ({self._holder}) did not run again")
            else:
                reason = f"no phase named {self.mode!r} ran in this process"
            self._event({"status": "not_recorded", "rule": self._rule_name(), "reason": reason})

    # -- helpers --------------------------------------------------------------------------------
    def _rule_for(self, name: str, asked: bool) -> str | None:
        if asked:
            return "attribute"
        if self.mode == PEAK:
            return PEAK if name == self._holder else None
        return "named" if name == self.mode else None

    def _rule_name(self) -> str:
        return PEAK if self.mode == PEAK else "named"

    def _no_cuda(self, asked: bool) -> None:
        self._done = True
        _say(NO_CUDA_NOTICE if not asked else "phase(stacks=True) needs CUDA; recording without stacks")
        self._event({"status": "not_recorded", "rule": "attribute" if asked else self._rule_name(),
                     "reason": "no CUDA in this process"})

    def _dump(self) -> None:
        """Snapshot, history off, the pickle written atomically, one event. Under the lock."""
        phase_id, name, rule = self._recording
        self._recording, self._done = None, True
        torch = sys.modules["torch"]
        started = time.perf_counter()
        attrs: dict[str, Any] = {"phase": name, "phase_id": phase_id, "rule": rule, "max_entries": self.max_entries}
        try:
            snapshot = torch.cuda.memory._snapshot()
        except Exception as exc:  # noqa: BLE001
            snapshot, attrs["error"] = None, f"snapshot failed: {type(exc).__name__}: {exc}"[:300]
        finally:
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001 - history stays on; nothing more we can do
                pass
        if snapshot is not None:
            try:
                partial = self.path.with_name(self.path.name + ".partial")
                with open(partial, "wb") as f:
                    pickle.dump(snapshot, f)
                os.replace(partial, self.path)
                attrs.update(file=self.path.name, path=str(self.path), bytes=self.path.stat().st_size,
                             entries=sum(len(t) for t in snapshot.get("device_traces") or ()))
            except OSError as exc:
                attrs["error"] = f"cannot write {self.path}: {exc.strerror or exc}"
        attrs["status"] = "failed" if "error" in attrs else "written"
        attrs["seconds"] = round(time.perf_counter() - started, 4)
        self._event(attrs)
        if "error" in attrs:
            _say(f"warning: stacks not written: {attrs['error']}")

    def _event(self, attrs: dict[str, Any]) -> None:
        try:
            self._write_event(EVENT_KIND, EVENT_KIND, attrs)
        except Exception:  # noqa: BLE001 - the recorder counts its own write failures
            pass


def from_env(run_dir: Path, stem: str, write_event: Callable[[str, str, dict], None], mode: str | None = None,
             max_entries: int | None = None) -> StackHistory:
    """The history of a recorder: `mode` and `max_entries` when given (Recorder(stacks=...)), else what
    $MILES_PROFILE_STACKS (record --stacks) asks; off without either, except for phases entered with
    `stacks=True`."""
    return StackHistory(run_dir, stem, write_event, mode or requested_mode(),
                        max_entries if max_entries and max_entries > 0 else requested_max_entries())
