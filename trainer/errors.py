"""The trainer's one error type: turned into a one-line message and an exit code only in `train.main`."""
from __future__ import annotations


class TrainerError(Exception):
    """A failure the user can act on (full disk, corrupted chunk, ...), reported without a traceback."""

    exit_code = 1


class OffloadError(TrainerError):
    """Training state could not be moved to or back from its offload target; nothing was lost."""


class EngineError(TrainerError):
    """The rollout engine was asked for something its memory state does not allow."""
