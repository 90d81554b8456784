"""Errors become a sentence in the page and one line in the server log, never a traceback."""
from __future__ import annotations

import logging

from dash import html

from miles_profile.errors import MilesProfileError

log = logging.getLogger("dashboards")


def describe(exc: BaseException) -> str:
    if isinstance(exc, MilesProfileError):
        return str(exc)
    log.warning("%s: %s", exc.__class__.__name__, exc)
    return f"could not read this run ({exc.__class__.__name__}: {exc})"


def problem(exc: BaseException) -> html.Div:
    """The message for a failure: a run still being read is news, not an error."""
    from dashboards.live_run import RunLoading  # pandas and the reader: only once a run is asked for
    return message(describe(exc), "info" if isinstance(exc, RunLoading) else "error")


def message(text: str, kind: str = "error") -> html.Div:
    return html.Div(text, className=f"message message-{kind}")
