"""The one project error type: CLIs turn it into a one-line message and an exit code."""
from __future__ import annotations


class MilesProfileError(Exception):
    """A user-facing error (bad path, bad log, bad flag). `exit_code` 2 means bad input."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
