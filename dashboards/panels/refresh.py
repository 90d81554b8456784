"""When a panel that summarizes the whole run recomputes: on a new run, else on new data, at most every few seconds."""
from __future__ import annotations

import time

SUMMARY_EVERY_S = 3.0  # checks and tables of a live run: recomputed at most this often


def due(run_id: str, version: int, rendered: object, now: float | None = None) -> dict | None:
    """The new `rendered` key when the panel should recompute, else None."""
    now = time.time() if now is None else now
    key = {"run": run_id, "version": version, "at": now}
    if not isinstance(rendered, dict) or rendered.get("run") != run_id:
        return key
    if rendered.get("version") == version:
        return None
    return key if now - float(rendered.get("at", 0)) >= SUMMARY_EVERY_S else None
