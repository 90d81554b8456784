"""Which integration tagged the processes of a run, read from their meta annotations: what `record --exec`
says when the command ends, and what the report's summary says. Reads JSON files only."""
from __future__ import annotations

import json
from pathlib import Path

from miles_profile.integrations.steps import CANNOT_SEE_KEY, INTEGRATION_KEY
from miles_profile.logdir.layout import EVENTS_SUFFIX, PROCESS_META_SUFFIX


def integrations_of(process_metas) -> dict[str, str]:
    """{integration: what it could not see} over process metas (dicts), in the order first seen."""
    found: dict[str, str] = {}
    for meta in process_metas:
        notes = meta.get("annotations") if isinstance(meta, dict) else None
        if isinstance(notes, dict) and notes.get(INTEGRATION_KEY):
            found.setdefault(str(notes[INTEGRATION_KEY]), str(notes.get(CANNOT_SEE_KEY) or ""))
    return found


def read_process_metas(run_dir: Path) -> list[dict]:
    metas = []
    for path in sorted(Path(run_dir).glob(f"*{PROCESS_META_SUFFIX}")):
        try:
            metas.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return metas


def opened_phases(run_dir: Path) -> bool:
    """Whether a process of the run opened a phase itself (`mp.phase` in the program): its steps need no tagging."""
    for path in Path(run_dir).glob(f"*{EVENTS_SUFFIX}"):
        try:
            with open(path) as events:
                if any("begin" in line and _is_begin(line) for line in events):
                    return True
        except OSError:
            continue
    return False


def _is_begin(line: str) -> bool:
    try:
        return json.loads(line).get("kind") == "begin"
    except (ValueError, AttributeError):
        return False  # a torn last line of a crashed process


def tagging_text(found: dict[str, str]) -> str:
    """One sentence for the terminal and the report."""
    if not found:
        return ("no integration tagged this run (no Trainer, Lightning or optimizer step seen, a child that is not "
                "Python, or --no-auto-tag): it is judged by time")
    parts = [f"{name} (could not see: {cannot})" if cannot else name for name, cannot in found.items()]
    return "steps tagged by " + "; ".join(parts)
