"""Show and judge only some phases (`--phase`, miles_profile.phase_select): pure functions over a run
and its check results (the report's tables and bands: report/selected_report.py).

    selection_for(run, text) -> PhaseSelection | None    # `text`, else the run's recorded default
    select_run(run, selection) -> Run                    # phases/events of the others left out
    select_checks(results, selection) -> list[CheckResult]

The checks are run on the whole run and their findings filtered afterwards, never run on a run with
phases cut out: a check that looks between phases (transition spikes) or across iterations (leak)
would otherwise see the left-out phases' memory as a gap's and misjudge it. A finding without a phase
(a whole-run judgement: leak, headroom) is kept.
"""
from __future__ import annotations

from dataclasses import replace

from miles_profile import names
from miles_profile.errors import MilesProfileError
from miles_profile.logdir.layout import PHASE_SELECTION_KEY
from miles_profile.phase_select import PhaseSelection, parse_phases
from miles_profile.verdicts.types import JUDGED, TOO_SMALL, WARN


def selection_for(run, text: str | None) -> PhaseSelection | None:
    """The selection `text` gives (phase names this run recorded are accepted too), else the one its
    recording asked for (`record --phase`), else None (everything). A `text` that matches none of the
    phases the run recorded is an error (MilesProfileError, exit 2): a gate that judges nothing would
    pass forever. (The recorded default is not held to that: a run just started has no phase yet.)"""
    recorded = recorded_phases(run)
    if text is None:
        default = run.meta.get(PHASE_SELECTION_KEY) if isinstance(run.meta, dict) else None
        return parse_phases(default, extra_names=recorded)
    selection = parse_phases(text, extra_names=recorded)
    if selection is not None and not selection.split(recorded)[0]:
        raise MilesProfileError(f"{run.name}: --phase {selection.text} matches none of the phases this run "
                                f"recorded ({', '.join(recorded) or 'none'})")
    return selection


def recorded_phases(run) -> list[str]:
    return run.phases["name"].astype(str).unique().tolist() if len(run.phases) else []


def select_run(run, selection: PhaseSelection | None):
    """The run without the phases `selection` leaves out (their begin/end events and phase rows);
    its samples are all kept: the timeline still shows the memory, only the phase bands go."""
    if selection is None or run.phases.empty:
        return run
    phases = run.phases[run.phases["name"].astype(str).map(selection.matches)]
    events = run.events
    phase_event = events["kind"].isin([names.BEGIN, names.END])
    keep = ~phase_event | events["name"].astype(str).map(selection.matches)
    return replace(run, events=events[keep].reset_index(drop=True), phases=phases.reset_index(drop=True))


def select_checks(results: list, selection: PhaseSelection | None) -> list:
    return results if selection is None else [_select_findings(r, selection) for r in results]


def _select_findings(result, selection: PhaseSelection):
    kept = [f for f in result.findings if not f.phase or selection.matches(f.phase)]
    dropped = len(result.findings) - len(kept)
    if not dropped:
        return result
    note = f"{dropped} finding(s) in phases not selected (--phase {selection.text})"
    failed = [f for f in kept if f.status == "fail"]
    judged = [f for f in kept if f.status in JUDGED]
    warned = [f for f in kept if f.status == WARN]
    small = [f for f in kept if f.status == TOO_SMALL]
    if failed:
        status, summary = "fail", f"{len(failed)} of {len(judged)} failed; first: {failed[0].message}; {note}"
    elif warned:
        status, summary = WARN, f"{len(warned)} of {len(judged)} unsure; first: {warned[0].message}; {note}"
    elif judged:
        status, summary = "pass", f"{len(judged)} pass in the selected phases; {note}"
    elif small:
        status, summary = TOO_SMALL, f"{len(small)} too small to judge; first: {small[0].message}; {note}"
    else:
        status, summary = "n/a", f"nothing judged in the selected phases; {note}"
    return replace(result, status=status, summary=summary, findings=kept)


def not_selected_note(run, selection: PhaseSelection, not_selected: list[str]) -> str:
    return (f"{run.name}: phases not selected (--phase {selection.text}), neither shown nor judged: "
            f"{', '.join(not_selected)}")
