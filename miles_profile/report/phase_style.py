"""How phases look in every view: their colour, their family and their order in the RL loop.

Each kind of phase has its own hue family, so a glance tells an offload from an onload even for a
colour-blind reader; members of a family differ in lightness (checked in tests/unit/test_figures_where.py):

    offloads (oranges and reds), onloads (greens and teals), train (purple), generate (blue),
    update_weights / eval / clear_memory (neutral greys).

Public API (stable):

    PHASE_COLORS, PHASE_FAMILIES, LOOP_ORDER
    phase_color(name) -> str          # "#rrggbb"; a name not listed gets a fixed colour of its family
    phase_family(name) -> str         # "offload", "onload", "train", "generate", "neutral" or "other"
    text_color(background) -> str     # black or white, whichever reads on the background
    loop_sorted(names) -> list[str]   # names in loop order, unknown names after in their given order
    iteration_text(iteration) -> str  # "setup" before the first rollout (iteration < 0), else the number
"""
from __future__ import annotations

import colorsys
import math

from miles_profile.names import iteration_text  # noqa: F401 - one vocabulary, re-exported for the figures

PHASE_COLORS = {
    "generate": "#2F6DB5", "train": "#7E57C2",
    # darkest to lightest: offload_train and offload_weights often follow each other
    "offload_train": "#8B1A1A", "offload_weights": "#C8401A", "offload_rollout": "#F28E2B", "offload_kv": "#FBD26A",
    "onload_weights": "#0F6E63", "onload_train": "#4FA33B", "onload_kv": "#8FD3C8",
    "update_weights": "#4D5968", "eval": "#8E8E8E", "clear_memory": "#C8C2B8",
}
PHASE_FAMILIES = {
    "offload": ("offload_train", "offload_weights", "offload_rollout", "offload_kv"),
    "onload": ("onload_weights", "onload_train", "onload_kv"),
    "train": ("train",), "generate": ("generate",),
    "neutral": ("update_weights", "eval", "clear_memory"),
}
# The RL loop (slime's train.py): generate, offload the rollout, train, offload training, onload, update.
LOOP_ORDER = ("generate", "offload_rollout", "offload_kv", "offload_weights", "train", "offload_train",
              "onload_train", "onload_weights", "onload_kv", "update_weights", "eval", "clear_memory")
_EXTRA = {  # names outside the canonical list, by their prefix's family
    "offload": ("#E36A3A", "#F4A261"), "onload": ("#2A9D8F", "#76C893"),
    "other": ("#B07AA1", "#9C755F", "#D4A6C8", "#BAB0AC"),
}


def phase_family(name: str) -> str:
    for family, members in PHASE_FAMILIES.items():
        if name in members:
            return family
    return "offload" if name.startswith("offload") else "onload" if name.startswith("onload") else "other"


def phase_color(name: str) -> str:
    if name in PHASE_COLORS:
        return PHASE_COLORS[name]
    choices = _EXTRA.get(phase_family(name), _EXTRA["other"])
    return choices[sum(map(ord, name)) % len(choices)]


def _rgb(color: str) -> tuple[float, float, float]:
    return tuple(int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))


def hls(color: str) -> tuple[float, float, float]:
    """(hue in degrees, lightness 0..1, saturation 0..1) of "#rrggbb"."""
    h, lightness, s = colorsys.rgb_to_hls(*_rgb(color))
    return h * 360, lightness, s


def text_color(background: str) -> str:
    # relative luminance (WCAG): white text on dark fills, near-black on light ones
    lin = [c / 12.92 if c <= 0.03928 else math.pow((c + 0.055) / 1.055, 2.4) for c in _rgb(background)]
    return "#111111" if 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] > 0.35 else "#ffffff"


def loop_sorted(names) -> list[str]:
    names = list(dict.fromkeys(str(n) for n in names))
    known = [n for n in LOOP_ORDER if n in names]
    return known + [n for n in names if n not in LOOP_ORDER]
