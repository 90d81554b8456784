"""One phase per optimizer step, opened and closed by hand: for loops the user does not own, where a
`with` block can't wrap the step (a callback's begin and end hooks, a framework's step function).

    steps = StepPhases(integration="my_framework")
    steps.begin(step=n)      # in the framework's "step begins" hook
    steps.end()              # in its "step ended" hook

    @step()                  # or: each call of the decorated function is one step
    def train_step(batch): ...

Each step is a top-level `train` phase, so each one is an iteration for the checks (the reader makes
the most frequent top-level phase open each iteration). Nothing here ever raises into the training: a
failure to record is one warning line on stderr and the step runs untagged.

Only one integration tags a process: the first whose hook fires claims it (`claim`), so the generic
optimizer-step hook stands aside once a Trainer or Lightning callback has seen a step.
"""
from __future__ import annotations

import functools
import sys
import time
from typing import Any, Callable

from miles_profile import names, phases

INTEGRATION_KEY = "integration"            # process annotation: which integration tagged it
CANNOT_SEE_KEY = "integration_cannot_see"  # ... and what it could not see, in words

_owner: str | None = None   # the integration that tags this process (None: none yet)
_warned: set[str] = set()


def warn_once(what: str, text: str) -> None:
    """One line on stderr per kind of trouble; the training goes on."""
    if what not in _warned:
        _warned.add(what)
        print(f"miles_profile: warning: {text}", file=sys.stderr, flush=True)


def claim(integration: str, cannot_see: str = "") -> bool:
    """Make `integration` the one that tags this process (said in its meta); False when another already does."""
    global _owner
    if _owner == integration:
        return True
    if _owner is not None and not _owner.startswith(GENERIC):
        return False
    previous, _owner = _owner, integration
    for hook in _claim_hooks:
        hook(previous)
    try:
        phases.annotate(**{INTEGRATION_KEY: integration, CANNOT_SEE_KEY: cannot_see})
    except Exception as exc:  # noqa: BLE001 -- never an error in the user's training
        warn_once("annotate", f"could not note the integration in the run meta: {exc}")
    return True


def owner() -> str | None:
    return _owner


GENERIC = "torch optimizer step hook"   # the fallback's name (optimizer_steps.py); any callback wins over it
_claim_hooks: list[Callable[[str | None], None]] = []


def when_claimed(hook: Callable[[str | None], None]) -> None:
    """Call `hook(previous owner)` whenever an integration claims the process (the fallback closes its phase)."""
    _claim_hooks.append(hook)


# The integrations' shortest phase: a step shorter than this joins the open phase, so that the phase's
# begin and end rows and events (~0.5 ms of CPU on a loaded 2-core VM, ~0.1 ms back to back) stay within
# 0.5% of the time they tag (0.26% of a 50 ms step: bench/integration_cost.py). The phase's `rollout_id` is its first step, so floors stay per step.
MIN_PHASE_S = 0.2


class StepPhases:
    """begin()/end() around each step; a begin while a step is open closes that one first. With
    `min_phase_s`, steps are grouped: a phase younger than that is left open and the next step joins it."""

    def __init__(self, integration: str = "manual", name: str = names.TRAIN, cannot_see: str = "",
                 min_phase_s: float = 0.0):
        self.integration, self.name, self.cannot_see = integration, name, cannot_see
        self.min_phase_s = min_phase_s
        self._open: Any = None
        self._opened_at = 0.0
        self.steps = 0    # steps begun
        self.phases = 0   # phases opened (fewer than steps where short steps are grouped)

    def _young(self) -> bool:
        return self.min_phase_s > 0 and time.monotonic() - self._opened_at < self.min_phase_s

    def begin(self, **attrs: Any) -> None:
        self.steps += 1
        if self._open is not None:
            if self._young():
                return  # this step joins the open phase
            self.end(force=True)
        if not claim(self.integration, self.cannot_see):
            return
        try:
            opened = phases.step_phase(self.name, **attrs)
            opened.__enter__()
            self._open, self._opened_at = opened, time.monotonic()
            self.phases += 1
        except Exception as exc:  # noqa: BLE001
            warn_once("begin", f"{self.integration}: step not tagged: {exc}")

    def end(self, exc: BaseException | None = None, force: bool = False) -> None:
        """Close the open phase (unless it is still young and grouping: the next step joins it)."""
        if self._open is None or (not force and exc is None and self._young()):
            return
        opened, self._open = self._open, None
        try:
            opened.__exit__(type(exc) if exc else None, exc, None)
        except Exception as error:  # noqa: BLE001
            warn_once("end", f"{self.integration}: step end not recorded: {error}")

    @property
    def is_open(self) -> bool:
        return self._open is not None


_default = StepPhases()


def begin_step(**attrs: Any) -> None:
    """Open this process's step phase (`train`), closing the previous one if it is still open."""
    _default.begin(**attrs)


def end_step() -> None:
    """Close the step phase `begin_step` opened; nothing when none is open."""
    _default.end()


def step(name: str = names.TRAIN, integration: str = "manual") -> Callable:
    """A decorator: each call of the function is one step phase (an exception inside is logged and re-raised)."""
    def wrap(fn: Callable) -> Callable:
        steps = StepPhases(integration, name)

        @functools.wraps(fn)
        def stepped(*args, **kwargs):
            steps.begin()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                steps.end(exc, force=True)
                raise
            steps.end(force=True)
            return result
        return stepped
    return wrap
