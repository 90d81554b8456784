"""The cyclic garbage collector paused while a run's many small objects are made.

A 1,024-process run's events are a million dicts and lists (276,000 events, their attributes and
phase summaries) and its summaries frame 276,000 row tuples; none of them is garbage. Made with the
collector on, each few hundred of them set off a collection that walks every object made so far:
about as much CPU as parsing them. Paused, they are walked once, at the next collection after.

    with gc_paused():
        ...
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
