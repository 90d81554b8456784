"""A `transformers.TrainerCallback` that makes each optimizer step a `train` phase (an iteration).

    trainer = Trainer(..., callbacks=[MilesProfileCallback()])   # or: record --exec adds it by itself

Every TRL trainer (GRPO, PPO, RLOO, DPO, SFT) is a `transformers.Trainer`, so it is tagged the same
way. TRL's online trainers generate inside the step and have no public hook around generation, so
generation and training are one phase per step there; the run meta says so (`integration_cannot_see`),
and so does the report. Imports transformers: only a program that already uses it imports this.
"""
from __future__ import annotations

from transformers import TrainerCallback

from miles_profile.integrations import steps

NAME = "transformers.Trainer callback"
CANNOT_SEE = ("offloads done inside the trainer's step (DeepSpeed or FSDP optimizer offload, ZeRO-3 gathers) "
              "are inside the step's phase, not phases of their own")
# Trainers that generate inside their step (TRL's online trainers): no public hook separates the two.
ONLINE = ("GRPOTrainer", "RLOOTrainer", "PPOTrainer", "OnlineDPOTrainer", "NashMDTrainer", "XPOTrainer",
          "GKDTrainer")


def cannot_see(trainer) -> str:
    """What this callback can't tell apart in `trainer`'s steps, in words."""
    online = [c.__name__ for c in type(trainer).__mro__ if c.__name__ in ONLINE] if trainer is not None else []
    if online:
        return (f"{online[0]} generates inside each optimizer step and has no public hook around its "
                f"generation: generation and training are one phase per step; " + CANNOT_SEE)
    return CANNOT_SEE


class MilesProfileCallback(TrainerCallback):
    """One `train` phase per optimizer step (gradient accumulation included), attributes `step` and
    `rollout_id` (the iteration); steps shorter than steps.MIN_PHASE_S share a phase (its first step's id)."""

    def __init__(self, trainer=None):
        self.trainer = trainer  # only to say what it can't see (an online TRL trainer)
        self.steps = steps.StepPhases(NAME, min_phase_s=steps.MIN_PHASE_S)

    def on_train_begin(self, args, state, control, **kwargs):
        self.steps.cannot_see = cannot_see(self.trainer)

    def on_step_begin(self, args, state, control, **kwargs):
        n = int(state.global_step) + 1
        self.steps.begin(step=n, rollout_id=n)

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.end()

    def on_train_end(self, args, state, control, **kwargs):
        self.steps.end(force=True)
