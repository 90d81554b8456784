"""What a run's verdict rests on, in words: which checks judged anything (a leak judged over time named as
such) and which integration tagged the steps (integrations/, from the process metas). Pure: the summary
states them; nothing is judged here."""
from __future__ import annotations

from miles_profile.integrations.tagged_by import integrations_of, tagging_text
from miles_profile.verdicts.types import CheckResult

BY_TIME = "time"  # verdicts/leak_by_time.py's numbers["judged_by"]


def judged_name(check: CheckResult) -> str:
    if any((f.numbers or {}).get("judged_by") == BY_TIME for f in check.findings):
        return f"{check.name} by time"
    return check.name


def judged_text(checks: list[CheckResult]) -> str:
    """`2 of 8 checks judged: headroom, leak by time` (pass or fail; n/a and too small to judge are not judged)."""
    judged = [judged_name(c) for c in checks if c.status in ("pass", "fail")]
    return f"{len(judged)} of {len(checks)} checks judged" + (f": {', '.join(judged)}" if judged else "")


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
