"""Which phases to show and judge: `--phase offload,train,rollout` on `record`, `visualize` and the
dashboard, as Miles' profiler is asked for phases (docs/checks.md, "Selecting phases").

A selection is a comma-separated list of tokens, each one of:

- a family: `offload` (every `offload_*` phase), `onload` (every `onload_*`), `rollout` (the rollout
  engine's side: `generate`, `offload_rollout`, `offload_kv`, `offload_weights`, `onload_weights`,
  `onload_kv`, `update_weights`), `all`;
- a phase name: a canonical one (miles_profile.names) or, where the caller knows them, one the run
  itself recorded (user code may open any phase); `train` is the phase `train` alone: the training
  state's moves (`offload_train`, `onload_train`) are in `offload` and `onload`;
- a shell pattern (`offload_*`, `*_kv`).

An unknown token is a one-line MilesProfileError (exit 2) listing what is known.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable

from miles_profile import names
from miles_profile.errors import MilesProfileError

ROLLOUT_SIDE = (names.GENERATE, names.OFFLOAD_ROLLOUT, names.OFFLOAD_KV, names.OFFLOAD_WEIGHTS,
                names.ONLOAD_WEIGHTS, names.ONLOAD_KV, names.UPDATE_WEIGHTS)
# family -> the shell pattern(s) its phases match
FAMILIES: dict[str, tuple[str, ...]] = {
    "offload": (names.OFFLOAD_PREFIX + "*",),
    "onload": (names.ONLOAD_PREFIX + "*",),
    "rollout": ROLLOUT_SIDE,
    "all": ("*",),
}


@dataclass(frozen=True)
class PhaseSelection:
    """The tokens as given, and the shell patterns they stand for."""
    tokens: tuple[str, ...]
    patterns: tuple[str, ...]

    def matches(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(str(name), p) for p in self.patterns)

    def split(self, phase_names: Iterable[str]) -> tuple[list[str], list[str]]:
        """(selected, not selected) among `phase_names`, each in first-seen order without repeats."""
        unique = list(dict.fromkeys(str(n) for n in phase_names))
        return [n for n in unique if self.matches(n)], [n for n in unique if not self.matches(n)]

    @property
    def text(self) -> str:
        return ",".join(self.tokens)


def known_tokens(extra_names: Iterable[str] = ()) -> list[str]:
    return list(dict.fromkeys([*FAMILIES, *names.PHASES, *(str(n) for n in extra_names if str(n))]))


def parse_phases(text: str | Iterable[str] | None, extra_names: Iterable[str] = ()) -> PhaseSelection | None:
    """The selection `text` names (None or "" select everything: None). `extra_names`: phase names a
    loaded run recorded, accepted besides the canonical ones."""
    if text is None:
        return None
    raw = text.split(",") if isinstance(text, str) else [t for part in text for t in str(part).split(",")]
    tokens = tuple(dict.fromkeys(t.strip() for t in raw if t.strip()))
    if not tokens:
        return None
    extra = {str(n) for n in extra_names}
    patterns: list[str] = []
    for token in tokens:
        if token in FAMILIES:
            patterns += FAMILIES[token]
        elif token in names.PHASES or token in extra or any(c in token for c in "*?["):
            patterns.append(token)
        else:
            raise MilesProfileError(f"unknown phase {token!r} in --phase; known: {', '.join(known_tokens(extra))}")
    return PhaseSelection(tokens, tuple(dict.fromkeys(patterns)))
