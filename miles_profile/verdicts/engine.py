"""The one verdict engine: a run's checks, fleet checks, --phase selection and --baseline gate, judged
ONCE into a `RunVerdict` that every view only renders (visualize's lines and exit code, the HTML header
and checks table, --json, the dashboard's checks panel, the pytest marker).

    judge(run, *, thresholds=None, fleet_thresholds=None, selection=None, baseline=None,
          baseline_thresholds=None, baseline_by_iteration=False, fleet=None, check=True) -> RunVerdict
    judge_test_limits(run, gpu=None, host=None, phase=None) -> RunVerdict     # the pytest marker's
    RunVerdict.status / .exit_code / .exit_code_for(strict) / .coverage / .to_dict()
    overall_of(verdicts) -> Status; exit_code_of(verdicts, strict=False) -> int   # several runs
    STATUS_LABEL[status] -> "PASS" | "FAIL" | "WARN" | "N/A" | "SMALL"           # one word per status on screen

The rule every view shares: a RunVerdict's status is the worst of its checks' and gates' statuses
(fail > warn > pass > too small to judge > n/a), and its exit code is 1 when that status is "fail" (and,
under --strict, "warn"). A run where no check but headroom judged anything is "warn", never a bare pass
or n/a: its coverage line says what was judged ("1 of 8 checks judged: headroom").

Gates never silently pass: a --phase selection that matches none of the run's phases, and a baseline
that shares no compared value with the run, raise MilesProfileError (exit 2) instead of judging nothing.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from miles_profile.logdir.reader import with_samples
from miles_profile.phase_select import PhaseSelection
from miles_profile.runmodel import fleet
from miles_profile.runmodel.phase_table import phase_table
from miles_profile.runmodel.process_view import is_fleet
from miles_profile.verdicts.checks import run_checks
from miles_profile.verdicts.fleet_checks import run_fleet_checks
from miles_profile.verdicts.gate import compare_runs
from miles_profile.verdicts.leak_by_time import JUDGED_BY as JUDGED_BY_TIME
from miles_profile.verdicts.memory_limit import limit_results
from miles_profile.verdicts.oom import check_oom
from miles_profile.verdicts.per_process import per_process_checks
from miles_profile.verdicts.selection import not_selected_note, recorded_phases, select_checks, selection_for
from miles_profile.verdicts.types import JUDGED, TOO_SMALL, WARN, CheckResult, Status, worst_status

STATUS_LABEL: dict[str, str] = {"pass": "PASS", "fail": "FAIL", WARN: "WARN", "n/a": "N/A", TOO_SMALL: "SMALL"}
# Checks that judge on every run with memory in it (headroom) or only when something died (oom): alone,
# they say nothing about offloads, peaks or leaks, so a run judged by them alone is a warning.
ALWAYS_JUDGED = frozenset({"headroom", "oom"})


def exit_code_for(status: str, strict: bool = False) -> int:
    """1 for a failure, and under --strict for a warning; else 0."""
    return 1 if status == "fail" or (strict and status == WARN) else 0


@dataclass
class RunVerdict:
    """Everything judged about one run. `gates`: gate.RegressionResult per --baseline; `notes`: what the
    selection left out; `checked`: False under --no-check (no check ran: the status is n/a)."""
    run_name: str
    checks: list[CheckResult]
    gates: list = field(default_factory=list)
    run_path: str = ""
    notes: list[str] = field(default_factory=list)
    checked: bool = True

    @property
    def judged(self) -> list[str]:
        """Names of the checks that judged something (pass, fail or warn), in the checks' order."""
        return [c.name for c in self.checks if c.status in JUDGED]

    @property
    def judged_nothing(self) -> bool:
        """Checks ran, and none but headroom/oom judged anything, and no gate compared anything."""
        return (self.checked and bool(self.checks) and not set(self.judged) - ALWAYS_JUDGED
                and not any(g.status in JUDGED for g in self.gates))

    @property
    def coverage(self) -> str:
        """What was judged, for the overall line: "2 of 8 checks judged: headroom, leak"."""
        judged = [_judged_name(c) for c in self.checks if c.status in JUDGED]
        text = f"{len(judged)} of {len(self.checks)} checks judged" + (f": {', '.join(judged)}" if judged else "")
        return text + self._not_a_pass

    @property
    def coverage_count(self) -> str:
        """The coverage without the checks' names, for a line that names many runs: "2 of 8 checks judged"."""
        judged = sum(c.status in JUDGED for c in self.checks)
        return f"{judged} of {len(self.checks)} checks judged" + self._not_a_pass

    @property
    def _not_a_pass(self) -> str:
        return "; nothing but headroom judged: not a pass" if self.judged_nothing else ""

    @property
    def status(self) -> Status:
        status = worst_status([c.status for c in self.checks] + [g.status for g in self.gates])
        if status != "fail" and self.judged_nothing:
            return WARN
        return status

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.status)

    def exit_code_for(self, strict: bool = False) -> int:
        return exit_code_for(self.status, strict)

    def failures(self) -> list[tuple[str, str]]:
        """(name, summary) of every failed check and gate, checks first."""
        return ([(c.name, c.summary) for c in self.checks if c.status == "fail"] +
                [("baseline", g.summary) for g in self.gates if g.status == "fail"])

    def warnings(self) -> list[tuple[str, str]]:
        """(name, summary) of every check and gate that warns, and the run's own warning if it judged nothing."""
        own = [("coverage", self.coverage)] if self.judged_nothing else []
        return ([(c.name, c.summary) for c in self.checks if c.status == WARN] +
                [("baseline", g.summary) for g in self.gates if g.status == WARN] + own)

    def to_dict(self) -> dict:
        return {"name": self.run_name, "path": self.run_path, "status": self.status, "exit_code": self.exit_code,
                "exit_code_strict": self.exit_code_for(True), "coverage": self.coverage, "judged": self.judged,
                "checked": self.checked, "checks": [jsonable(asdict(c)) for c in self.checks],
                "gates": [gate_dict(g) for g in self.gates], "notes": list(self.notes)}


def overall_of(verdicts: list[RunVerdict]) -> Status:
    return worst_status(v.status for v in verdicts)


def exit_code_of(verdicts: list[RunVerdict], strict: bool = False) -> int:
    return exit_code_for(overall_of(verdicts), strict)


def gate_dict(gate) -> dict:
    """A baseline gate as --json writes it: status, summary and every compared value."""
    return {"name": "baseline", "baseline": gate.baseline, "status": gate.status, "summary": gate.summary,
            "thresholds": gate.thresholds.text, "matched_by": gate.matched_by,
            "not_compared": list(gate.not_compared), "not_selected": list(gate.not_selected),
            "compared": [{**jsonable(asdict(c)), "growth": c.growth} for c in gate.compared]}


# -- judging ------------------------------------------------------------------------------------
def judge(run, *, thresholds=None, fleet_thresholds=None, selection: str | PhaseSelection | None = None,
          baseline=None, baseline_thresholds=None, baseline_by_iteration: bool = False, fleet=None,
          check: bool = True) -> RunVerdict:
    """Judge `run` once. `selection`: --phase text or a PhaseSelection (None: the run's recorded
    default); `baseline`: a loaded run to gate against; `fleet`: (normalized phase table, GpuMatrix)
    when the caller already built them (the report's fleet view), else computed here for a fleet run.
    A run of many processes is judged per process (aggregated per check) plus the fleet checks."""
    chosen = resolve_selection(run, selection)
    checks = _checks(run, thresholds, fleet_thresholds, fleet) if check else []
    notes = []
    if chosen is not None:
        checks = select_checks(checks, chosen)
        left_out = chosen.split(recorded_phases(run))[1]
        if left_out:
            notes.append(not_selected_note(run, chosen, left_out))
    gates = []
    if baseline is not None:
        gates.append(compare_runs(run, baseline, baseline_thresholds, chosen, baseline_by_iteration,
                                  current_name=str(run.path), baseline_name=str(getattr(baseline, "path", "baseline"))))
    return RunVerdict(run.name, checks, gates, str(run.path), notes, check)


def resolve_selection(run, selection: str | PhaseSelection | None) -> PhaseSelection | None:
    """The selection as a PhaseSelection; one given (text or object) must match a recorded phase, the
    run's recorded default (selection None) need not (a run just started has no phase yet)."""
    if isinstance(selection, PhaseSelection):
        return selection_for(run, selection.text)
    return selection_for(run, selection)


def _checks(run, thresholds, fleet_thresholds, fleet) -> list[CheckResult]:
    if not is_fleet(run):
        if run.samples.empty and getattr(run, "sample_pids", None) is not None:  # loaded lazily
            run = with_samples(run)
        return run_checks(run, thresholds) + [check_oom(run)]
    table, matrix = fleet if fleet is not None else _fleet_tables(run)
    fleet_results = run_fleet_checks(table, fleet_thresholds, matrix) if len(table) else []
    return per_process_checks(run, thresholds) + list(fleet_results) + [check_oom(run)]


def _fleet_tables(run):
    table = fleet.normalize(phase_table(run))
    return table, (fleet.gpu_matrix(table) if len(table) else None)


def judge_test_limits(run, gpu=None, host=None, phase=None) -> RunVerdict:
    """The pytest marker's verdict: each memory limit as a CheckResult (verdicts/memory_limit.py)."""
    return RunVerdict(run.name, limit_results(run, gpu, host, phase), run_path=str(run.path))


def jsonable(value):
    """JSON-ready: numpy scalars to Python, non-finite floats to None, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    return str(value)


def _judged_name(check: CheckResult) -> str:
    """`leak by time` where the leak was judged over windows of time (an untagged run), else the check's name."""
    by_time = any((f.numbers or {}).get("judged_by") == JUDGED_BY_TIME for f in check.findings)
    return f"{check.name} by time" if by_time else check.name
