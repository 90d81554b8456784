"""The cyclic garbage collector paused while a run's many small objects are made.

A 1,024-process run's events are a million dicts and lists (276,000 events, their attributes and
phase summaries) and its summaries frame 276,000 row tuples; none of them is garbage. Made with the
collector on, each few hundred of them set off a collection that walks every object made so far:
about as much CPU as parsing them. Paused, they are walked once, at the next collection after.

    with gc_paused():
        ...
    with gc_relaxed():   # a one-shot command (visualize): fewer collections throughout
        ...              # read the runs
        keep_loaded()    # and leave them out of the collections after
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block, back on after it if it was on (a caller that had turned it
    off keeps it off; a thread pausing beside another at worst lets it run again early)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()



# A young generation of 50,000 objects instead of 700, the older ones collected 20 times less often:
# `visualize` of a 1,024-process fleet makes millions of long-lived objects (events, frames, figures),
# and the default thresholds walked them again and again for no garbage.
RELAXED_THRESHOLDS = (50_000, 20, 20)
_relaxed: list[bool] = []  # per open gc_relaxed block: may keep_loaded freeze (its caller had frozen nothing)


@contextmanager
def gc_relaxed() -> Iterator[None]:
    """For a command's whole run: the collector at RELAXED_THRESHOLDS, and what `keep_loaded` froze
    unfrozen at the end; the caller's thresholds after it (a test calling the command in its own
    process keeps its settings). A caller that froze objects of its own (a test worker, a server after
    its imports) keeps them frozen: `gc.unfreeze` cannot tell theirs from ours, so nothing is frozen here."""
    before = gc.get_threshold()
    gc.set_threshold(*RELAXED_THRESHOLDS)
    _relaxed.append(gc.get_freeze_count() == 0)
    try:
        yield
    finally:
        if _relaxed.pop():
            gc.unfreeze()
        gc.set_threshold(*before)


def keep_loaded() -> None:
    """Inside `gc_relaxed`, once the runs are read: every object made so far (the runs' events, frames
    and phase summaries: live until the command ends) is left out of every later collection, which
    walked them all each time (gc.freeze). Outside one, nothing: a long-lived caller (the dashboard, a
    test process) would never collect a cycle frozen there."""
    if _relaxed and _relaxed[-1]:
        gc.freeze()
