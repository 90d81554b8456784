"""Which integration tagged a run's steps and what it could not see, in words (integrations/, from the
process metas); what the checks judged is the verdict's own coverage line (verdicts/engine.py)."""
from __future__ import annotations

from miles_profile.integrations.tagged_by import integrations_of, tagging_text


def tagging_of(run) -> str | None:
    """Which integration tagged the steps and what it could not see; None where nothing ran with auto-tagging
    (a run that tags its own phases, or recorded without --exec), `no integration ...` where it ran and saw nothing."""
    processes = list(getattr(run, "processes", []) or [])
    found = integrations_of(processes)
    if found:
        return tagging_text(found)
    exec_parent = any(p.get("role") == "exec_parent" for p in processes if isinstance(p, dict))
    if exec_parent and run.phases.empty:
        return tagging_text({})
    return None
