"""The run's one verdict (miles_profile.verdicts.engine.judge), computed once per version of a live run:
every panel that shows a verdict (summary, checks) reads it from here, so no two panels can disagree."""
from __future__ import annotations
from miles_profile.verdicts.engine import judge


def verdict_of(live_run, phases: str | None):
    return live_run.memo("verdict", lambda run: judge(run, selection=phases))
