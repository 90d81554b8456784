"""A fleet report's ledger and transition meter made on the other core while this one judges the run.

    ledger_of(run, view) -> ledger frame                 # in-process (what the report shows)
    start(run, view) -> SideProcess | None               # a forked child making both; None: not worth one
    collect(side, run, view) -> ledger frame             # the child's, its meter cached for the report
                                                         # and --json; in-process if it did not deliver

Measured on the 1,024-process fleet (docs/benchmarks.md, issue 35 round 7): the checks take ~1.6 s and
the ledger and meter ~1.5 s, both reading the same loaded run and neither the other's result; the
child (logdir/side_process.py) is a fork, so the run is not sent, and the ledger and the meter come
back pickled in ~0.05 s. The output is the same either way: the same functions of the same run.
"""
from __future__ import annotations

import pandas as pd

from miles_profile.logdir import side_process
from miles_profile.report.fleet_report import drawn_processes
from miles_profile.runmodel.ledger import LEDGER_MAX_PROCESSES, fleet_ledger, ledger
from miles_profile.runmodel.ledger_sampling import sampled_iterations
from miles_profile.runmodel.transitions import meter_of, meter_key

# Forking and sending back cost ~0.1 s; the ledger and meter of a fleet are ~1.5 ms a process: below
# a few hundred processes the child would not pay for itself (tests' runs and sample_logs/ have <= 64).
SIDE_MIN_PROCESSES = 256


def ledger_of(run, view) -> pd.DataFrame:
    """Every process's ledger, at each phase's end and peak; for a fleet, the GPUs of the lanes drawn, with every process on them."""
    chosen = sampled_iterations(run)  # a loop with a phase per step: some of its iterations
    if view is None or len(run.processes) <= LEDGER_MAX_PROCESSES:
        return ledger(run, peaks=True, iterations=chosen)
    return fleet_ledger(run, drawn_processes(view), peaks=True, iterations=chosen)


def start(run, view) -> side_process.SideProcess | None:
    if view is None or len(run.processes) < SIDE_MIN_PROCESSES:
        return None
    return side_process.start(_made, run, view)


def collect(side: side_process.SideProcess | None, run, view) -> pd.DataFrame:
    ok, value = side.result() if side is not None else (False, None)
    if not ok or value is None:  # not forked, failed, or the run changed under it: here, as before
        return ledger_of(run, view)
    frame, meter = value
    run.__dict__.setdefault("_report_cache", {})[meter_key(frame)] = meter
    return frame


def _made(run, view):
    """In the child: the ledger and its meter; None when making them added a warning to the run (read
    lazily from the logs: the parent, which would not see it, makes them itself)."""
    warned = len(run.warnings)
    frame = ledger_of(run, view)
    meter = meter_of(run, frame)
    return None if len(run.warnings) != warned else (frame, meter)
