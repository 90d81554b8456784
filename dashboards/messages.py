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


def message(text: str, kind: str = "error") -> html.Div:
    return html.Div(text, className=f"message message-{kind}")
