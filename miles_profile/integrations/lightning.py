"""A Lightning `Callback` that makes each training batch a `train` phase (an iteration) and each
validation loop an `eval` phase.

    trainer = L.Trainer(..., callbacks=[lightning_callback()])   # or: record --exec adds it by itself

Works with `lightning.pytorch` and the older `pytorch_lightning`: `lightning_callback(module)` builds
the class on the package's own `Callback`. With `accumulate_grad_batches=k` a phase is one batch, not
one optimizer step (Lightning's hooks fire per batch): the floors are then per batch.
"""
from __future__ import annotations

import importlib

from miles_profile import names
from miles_profile.integrations import steps

NAME = "Lightning callback"
CANNOT_SEE = ("with accumulate_grad_batches > 1 each batch is one phase, not each optimizer step; offloads "
              "a strategy does inside the step (DeepSpeed, FSDP) are inside the step's phase")
_classes: dict[str, type] = {}


def callback_class(package: str = "lightning.pytorch") -> type:
    """The callback class built on `package`'s Callback (`lightning.pytorch` or `pytorch_lightning`)."""
    if package not in _classes:
        base = importlib.import_module(package).Callback

        class MilesProfileLightningCallback(base):
            def __init__(self):
                self.steps = steps.StepPhases(NAME, cannot_see=CANNOT_SEE, min_phase_s=steps.MIN_PHASE_S)
                self.evals = steps.StepPhases(NAME, names.EVAL, cannot_see=CANNOT_SEE)

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                n = int(trainer.global_step) + 1
                self.steps.begin(step=n, rollout_id=n, batch=int(batch_idx))

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.steps.end()

            def on_validation_start(self, trainer, pl_module):
                if not trainer.sanity_checking:
                    self.steps.end(force=True)  # a grouped train phase ends where evaluation begins
                    self.evals.begin()

            def on_validation_end(self, trainer, pl_module):
                self.evals.end(force=True)

            def on_train_end(self, trainer, pl_module):
                self.steps.end(force=True)

            def on_exception(self, trainer, pl_module, exception):
                self.steps.end(exception, force=True)
                self.evals.end(exception, force=True)

        _classes[package] = MilesProfileLightningCallback
    return _classes[package]


def lightning_callback(package: str = "lightning.pytorch"):
    """A new callback instance for `package`'s Trainer."""
    return callback_class(package)()
