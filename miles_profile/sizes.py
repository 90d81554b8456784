"""Human sizes and shares on the command line and in markers: "20 GiB", "512MiB", "1.5G", "5%".

Binary units throughout (the project's GiB is 1024**3; DESIGN.md): K/KiB, M/MiB, G/GiB, T/TiB, and a
bare number or "B" is bytes. "GB" is read as GiB too: a size limit typed by a person is never meant as
powers of ten here, and one meaning per unit avoids a 7 % surprise.
"""
from __future__ import annotations

import re

from miles_profile.errors import MilesProfileError

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int | float) -> int:
    """Bytes of "20 GiB" (an int or float passes through); MilesProfileError on anything else."""
    if isinstance(text, bool):
        raise MilesProfileError(f"not a size: {text!r}")
    if isinstance(text, (int, float)):
        value, factor = float(text), 1
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise MilesProfileError(f"not a size: {text!r} (e.g. 20 GiB, 512 MiB, 1048576)")
        value, factor = float(match.group(1)), _UNITS[match.group(2).lower()]
    if not value >= 0 or value == float("inf"):
        raise MilesProfileError(f"not a size: {text!r}")
    return int(round(value * factor))


def parse_share(text: str | float) -> float:
    """A share: "5%" -> 0.05, "0.05" -> 0.05."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise MilesProfileError(f"not a share: {text!r} (e.g. 5% or 0.05)") from None
    if not 0 <= value < float("inf"):
        raise MilesProfileError(f"not a share: {text!r}")
    return value


def format_size(n: float) -> str:
    """Bytes on screen: GiB with 3 decimals above 1 GiB, else MiB with 1."""
    if abs(n) >= 1024 ** 3:
        return f"{n / 1024 ** 3:.3f} GiB"
    return f"{n / 1024 ** 2:.1f} MiB"
