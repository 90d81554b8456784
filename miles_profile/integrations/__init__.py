"""Integrations: tag the steps of training loops that the user does not write (docs/integrations.md).

Recorder layer: these modules import only `phase()`/`annotate()` and the recorder, never plotly or dash,
and import transformers or Lightning only when the program already uses them.

- `steps`: a begin/end API and a decorator, one phase per optimizer step, for loops the user does not own;
- `hf`: a `transformers.TrainerCallback` (every TRL trainer is a Trainer);
- `lightning`: a Lightning `Callback` (`lightning.pytorch` or `pytorch_lightning`);
- `optimizer_steps`: any torch loop (accelerate, plain), through torch's global optimizer step hook;
- `autotag`: what `record --exec` puts on a Python child's path so that all of the above apply with no edits.
"""
from miles_profile.integrations.steps import StepPhases, end_step, begin_step, step

__all__ = ["StepPhases", "begin_step", "end_step", "step"]
