"""Memory sources, one module each. A probe exposes `columns` and `read()` (one value per column,
None when unknown), and `describe()` for the run's meta. A missing source yields no probe and one
log line, never a crash: see `open_probes`."""
from __future__ import annotations

import logging
from typing import Any, Protocol, Sequence

log = logging.getLogger("miles_profile")


class Probe(Protocol):
    name: str
    columns: tuple[str, ...]

    def read(self) -> Sequence[int | None]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def absent(name: str, reason: str) -> dict[str, Any]:
    """Meta entry for a source that is not there; logged once."""
    log.info("miles_profile: probe %s absent: %s", name, reason)
    return {"name": name, "active": False, "reason": reason}
