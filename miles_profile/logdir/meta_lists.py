"""Meta fields that readers iterate: a retyped one (a number where a list was written) is dropped with a
warning naming the file, so every view reads an absent field instead of failing on it."""
from __future__ import annotations

from typing import Any

PROCESS_LISTS = ("columns", "devices", "cuda_devices")  # of a process meta
HOST_LISTS = ("gpus",)                                   # of a host meta
LISTS_OF_OBJECTS = ("devices", "cuda_devices", "gpus")    # whose items are objects


def drop_retyped_lists(meta: dict[str, Any], keys: tuple[str, ...], name: str, warnings: list[str]) -> None:
    for key in keys:
        if key not in meta or meta[key] is None:
            continue
        value = meta[key]
        if not isinstance(value, list):
            del meta[key]
            warnings.append(f"{name}: its {key!r} is {type(value).__name__}, not a list: ignored")
        elif key in LISTS_OF_OBJECTS and not all(isinstance(item, dict) for item in value):
            meta[key] = [item for item in value if isinstance(item, dict)]
            warnings.append(f"{name}: {len(value) - len(meta[key])} item(s) of its {key!r} are not objects: ignored")
