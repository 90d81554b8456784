"""A fleet's phase summaries frame (summaries.summaries_frame: a Python loop over 138,000 phase ends
at 1,024 processes, ~0.9 s) made on the other core while this one makes the phases from the same
events; the fleet view needs it next (runmodel/phase_table.py).

    start(events, processes, lazy) -> SideProcess | None   # once the events are read; None: not worth it
    take(side, events) -> frame                             # the child's, else made here

The frame is a pure function of the events (no warning, nothing read): the child's is the same
frame, sent back pickled (Arrow-backed columns: ~0.03 s). logdir/side_process.py says when it forks.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from miles_profile.logdir import side_process
from miles_profile.logdir.summaries import summaries_frame

# Forking and sending the frame back cost ~0.05 s; the frame is ~0.9 ms a process: only a fleet's pays.
SIDE_MIN_PROCESSES = 256


def start(events: pd.DataFrame, processes: list[dict[str, Any]], lazy: bool) -> side_process.SideProcess | None:
    """`lazy`: the run is read without its samples (visualize of a fleet)."""
    if not lazy or len(processes) < SIDE_MIN_PROCESSES:
        return None
    return side_process.start(summaries_frame, events)


def take(side: side_process.SideProcess | None, events: pd.DataFrame) -> pd.DataFrame:
    ok, value = side.result() if side is not None else (False, None)
    return value if ok and isinstance(value, pd.DataFrame) else summaries_frame(events)
