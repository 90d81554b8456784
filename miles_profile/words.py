"""Counts in words for every view: "1 lane", "2 lanes", "1 process", "3 processes".

    counted(n, plural) -> str
"""
from __future__ import annotations

_SINGULAR = {"processes": "process", "lanes": "lane", "GPUs": "GPU", "ranks": "rank", "runs": "run"}


def counted(n: int, plural: str) -> str:
    """`n` and the noun `plural` agreeing with it (its last letter dropped where no exception is known)."""
    noun = plural if n != 1 else _SINGULAR.get(plural, plural[:-1] if plural.endswith("s") else plural)
    return f"{n:,} {noun}"


# The recorder's role names as a person reads them: "in_process" is how record ran the trainer, not a role.
_ROLE_TEXT = {"in_process": "trainer", "exec_parent": "process tree", "": "process"}


def role_text(role: str | None) -> str:
    """A process's role for a sentence: actor, engine, trainer (record's own process), process tree."""
    return _ROLE_TEXT.get(role or "", role)
