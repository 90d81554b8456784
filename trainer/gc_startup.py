"""Python's cyclic collector and the objects a trainer process makes before it trains.

Importing torch makes about 175,000 objects that live as long as the process (modules, functions,
operator schemas), none of them garbage. With the default thresholds the collector walks all of them in
full three times while they load (about 145 ms of CPU), and every `clear_memory` (`gc.collect()`
between phases, as Miles does) walks them again: 90 ms a step on the CPU preset. `perf` put 32 % of
`python -m trainer.train --preset tiny --num-rollout 2` in the collector; with these, the run takes 1.56
CPU-s instead of 2.46 (docs/benchmarks.md, Round 12). A process's entry point calls
`defer_collections` before its imports and `freeze_imports` once they are done: the imports are walked
at most once, then left out of every later collection (`gc.freeze`), which walks only what the run made.

Only a process's own entry point calls them: freezing in a caller that lives on (a test process calling
`train.main`) would keep a cycle made before the freeze from ever being collected.
"""
from __future__ import annotations

import gc

_DEFAULT_THRESHOLDS = gc.get_threshold()
_IMPORT_THRESHOLDS = (100_000, 20, 20)  # the young generation at 100,000: import torch sees one or two collections


def defer_collections() -> None:
    """Before the imports: collect rarely while they make their lasting objects."""
    gc.set_threshold(*_IMPORT_THRESHOLDS)


def freeze_imports() -> None:
    """After the imports: leave every object made so far out of later collections, and collect at the
    default thresholds again (what the run makes is collected as in any process)."""
    gc.freeze()
    gc.set_threshold(*_DEFAULT_THRESHOLDS)
