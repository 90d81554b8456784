"""Counts in words for every view: "1 lane", "2 lanes", "1 process", "3 processes".

    counted(n, plural) -> str
"""
from __future__ import annotations

_SINGULAR = {"processes": "process", "lanes": "lane", "GPUs": "GPU", "ranks": "rank", "runs": "run"}


def counted(n: int, plural: str) -> str:
    """`n` and the noun `plural` agreeing with it (its last letter dropped where no exception is known)."""
    noun = plural if n != 1 else _SINGULAR.get(plural, plural[:-1] if plural.endswith("s") else plural)
    return f"{n:,} {noun}"
