"""Any torch training loop (an `accelerate launch`ed script, a plain loop, a trainer we have no callback
for): each span between two optimizer steps is a `train` phase, through torch's global optimizer
step hook (`torch.optim.optimizer.register_optimizer_step_post_hook`), so the program needs no edit.

The first phase opens at the end of the first optimizer step (what came before is setup) and the
last one closes when the program exits. Steps shorter than steps.MIN_PHASE_S share a phase (`rollout_id`:
its first step), so the phase rows cost at most 0.5% of the time they tag. A program that tags its own
phases (a step inside one of them) is left alone. When a Trainer or Lightning callback sees a step, it
claims the process (steps.claim) and this hook stands aside. Several optimizers stepped together (a GAN, a
critic) open one phase per step of the first optimizer seen. Imported only once torch is.
"""
from __future__ import annotations

import atexit

from miles_profile import recorder
from miles_profile.integrations import steps

CANNOT_SEE = ("each phase runs from one optimizer step's end to the next: generation, evaluation and offloads "
              "inside it are not phases of their own")

_steps = steps.StepPhases(steps.GENERIC, cannot_see=CANNOT_SEE, min_phase_s=steps.MIN_PHASE_S)
_lead: int | None = None   # id of the optimizer whose steps open phases
_installed = False
_ASIDE = -1                # _lead once the program was seen tagging its own phases


def _after_step(optimizer, args, kwargs) -> None:
    global _lead
    if steps.owner() not in (None, steps.GENERIC):
        return
    if _lead is None:
        _lead = id(optimizer)
    if id(optimizer) != _lead:
        return
    if _steps.is_open:
        n = _steps.steps + 1
        _steps.begin(step=n, rollout_id=n)  # joins the open phase while it is young, else closes it and opens one
        return
    rec = recorder.active()
    if rec is not None and rec.current_phase():
        # the program tags its own phases (a step inside one of them): ours would only cut across them
        _lead = _ASIDE
        return
    n = _steps.steps + 1
    _steps.begin(step=n, rollout_id=n)
    if _steps.is_open and not _atexit_registered:
        # registered after the recorder's own atexit stop (started by that first phase), so it runs before it
        _register_exit()


_atexit_registered = False


def _register_exit() -> None:
    global _atexit_registered
    atexit.register(_steps.end, force=True)
    _atexit_registered = True


def _stand_aside(previous: str | None) -> None:
    if previous == steps.GENERIC:
        _steps.end(force=True)


def install() -> bool:
    """Register the hook once; False when this torch has no global optimizer hook (torch < 2.0)."""
    global _installed
    if _installed:
        return True
    import torch.optim.optimizer as optim
    register = getattr(optim, "register_optimizer_step_post_hook", None)
    if register is None:
        steps.warn_once("torch", "this torch has no global optimizer step hook: optimizer steps not tagged")
        return False
    register(_after_step)
    steps.when_claimed(_stand_aside)
    _installed = True
    return True
