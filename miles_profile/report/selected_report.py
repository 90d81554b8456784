"""A run's report limited to the phases selected (`--phase`): its per-phase tables and the timeline's phase
bands. The checks are the verdict engine's, selected there (verdicts/selection.py).

    apply_selection(report, selection, max_points) -> (RunReport, not_selected)
"""
from __future__ import annotations

from miles_profile.phase_select import PhaseSelection
from miles_profile.report.figures import timeline_figure
from miles_profile.verdicts.selection import recorded_phases, select_run


def apply_selection(report, selection: PhaseSelection | None, max_points: int = 100_000):
    """The report with its per-phase tables and timeline phase bands limited to `selection`; and the
    names of the recorded phases it left out. (Its checks are the engine's, selected there.)"""
    if selection is None:
        return report, []
    run = report.run
    _, not_selected = selection.split(recorded_phases(run))
    for attr in ("phases", "phases_by_iteration"):
        table = getattr(report, attr)
        if len(table) and "name" in table:
            setattr(report, attr, table[table["name"].astype(str).map(selection.matches)].reset_index(drop=True))
    if report.figure is not None:
        report.figure = timeline_figure(select_run(run, selection), max_points=max_points)
    return report, not_selected
