"""One background thread that reads every probe at a fixed interval and appends a row.

A row's peaks cover the whole time since the previous row (the probes reset them), so the rate only
sets the time resolution, never whether a spike is seen. Keep each sample cheap: the thread takes the
GIL from the training loop for as long as it reads.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Container, Sequence

from miles_profile.logdir.writer import SampleWriter
from miles_profile.probes import Probe

log = logging.getLogger("miles_profile")


class Sampler:
    def __init__(self, probes: Sequence[Probe], writer: SampleWriter, interval_s: float,
                 current_phase: Callable[[], str],
                 on_row: Callable[[float, Sequence[int | None]], None] | None = None):
        self._probes = list(probes)
        self._on_row = on_row  # sees every row, under the lock (phase summaries)
        # (probe, columns it fills, whether it takes `full`), worked out once: this is the hot path.
        self._plan = [(p, len(p.columns), getattr(p, "partial_reads", False)) for p in self._probes]
        self._failed: set[str] = set()
        self._writer = writer
        self._interval_s = interval_s
        self._current_phase = current_phase
        self._lock = threading.Lock()  # a row's reads and peak resets happen together
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="miles_profile-sampler", daemon=True)

    @staticmethod
    def columns_of(probes: Sequence[Probe]) -> list[str]:
        return [c for p in probes for c in p.columns]

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def sample(self, phase: str | None = None, full: bool = True, then: Callable[[float], Any] | None = None,
               skip: Container[str] = ()) -> Any:
        """Take one row now; `phase` overrides the current phase (a phase's closing sample). Periodic
        rows are not `full`: probes with `partial_reads` may then leave their costly columns empty.
        `then(t)` runs in the same hold of the lock right after the row taken at `t` (a phase opening
        or closing there, so no other row falls between); its result is returned. Probes named in
        `skip` are not read for this row (their columns empty, as in a periodic row)."""
        with self._lock:
            values: list[int | None] = []
            for probe, width, partial in self._plan:
                if skip and probe.name in skip:
                    values.extend((None,) * width)
                    continue
                values.extend(self._read(probe, width, partial, full))
            t = time.time()
            self._writer.append(t, self._current_phase() if phase is None else phase, values)
            if self._on_row is not None:
                self._on_row(t, values)
            return then(t) if then is not None else None

    def _read(self, probe: Probe, width: int, partial: bool, full: bool) -> Sequence[int | None]:
        if probe.name in self._failed:
            return [None] * width
        try:
            return probe.read(full) if partial else probe.read()
        except Exception as exc:  # a source that broke mid-run goes absent, the run goes on
            self._failed.add(probe.name)
            log.warning("miles_profile: probe %s failed and is now absent: %s", probe.name, exc)
            return [None] * width

    def _run(self) -> None:
        next_due = time.monotonic()
        while True:
            next_due += self._interval_s
            delay = next_due - time.monotonic()
            if delay < 0:  # fell behind (a long GIL hold): skip, don't burst
                next_due, delay = time.monotonic(), 0.0
            if self._stop.wait(delay):
                return
            try:
                self.sample(full=False)
            except Exception as exc:  # noqa: BLE001 - the row is lost and counted; the thread goes on
                self._writer.faults.failed("samples", 1, exc)

    def stop(self) -> None:
        """Stop the thread, take the final row and flush everything."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()
        with self._lock:
            self._writer.close()
        for probe in self._probes:
            probe.close()
