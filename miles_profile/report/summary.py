"""The first screen of every view: the overall verdict, where the peak is, whether every offload worked,
and the failing checks first. Built from the run and its one verdict (verdicts/engine.py), never by
judging anything again. Pure (no plotly): the CLI, the HTML report, --json and the dashboard render it.

    summarize(run, checks, status) -> Summary
    Summary.lines() -> list[str]       # the terminal block
    Summary.to_dict() -> dict          # --json
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from miles_profile import names
from miles_profile.command_exit import command_exit, signal_name, stop_signal
from miles_profile.runmodel.peak import Peak, device_peak, highest_peak, iteration_text
from miles_profile.report.run_tagging import tagging_of
from miles_profile.runmodel.series import GiB
from miles_profile.verdicts.types import TOO_SMALL, CheckResult, Finding

OFFLOAD_CHECK = "offload_drop"
HEADROOM_CHECK = "headroom"
OOM_CHECK = "oom"  # verdicts/oom.py: a killed process is the first thing every view says
MiB = 1024 ** 2


@dataclass
class OffloadKind:
    """Every instance of one offload phase name, as offload_drop judged them."""
    name: str
    count: int
    failed: int
    too_small: int
    not_judged: int
    declared: float | None          # median declared bytes (expected_bytes)
    freed: float | None             # median bytes measured gone, on the series judged
    worst: Finding | None           # a failed instance first, else the one that freed the least of its declared

    def freed_text(self, between: str = " / ") -> str:
        """`0.33 of 0.33 GiB`, in MiB when the declared bytes are under 0.1 GiB (0.00 GiB says nothing)."""
        if self.declared is None:
            return "–"
        unit, scale = ("MiB", MiB) if self.declared < 0.1 * GiB else ("GiB", GiB)
        freed = "?" if self.freed is None else f"{self.freed / scale:.2f}"
        return f"{freed}{between}{self.declared / scale:.2f} {unit}"

    def text(self) -> str:
        parts = [f"{self.name} ×{self.count}:"]
        if self.declared is not None:
            parts.append(f"freed {self.freed_text(' of ')} declared (median)")
        status = []
        if self.failed:
            status.append(f"{self.failed} FAILED")
        if self.too_small:
            status.append(f"{self.too_small} too small to judge")
        if self.not_judged:
            status.append(f"{self.not_judged} not judged")
        verdict = ", ".join(status) if status else "all passed"
        if self.declared is not None:
            parts[-1] += ";"
        parts.append(verdict)
        if self.worst is not None and self.failed:
            parts.append(f"— worst: {self.worst.message}")
        return " ".join(parts)


@dataclass(frozen=True)
class Headroom:
    """What the headroom check judged closest to its total (its numbers, never computed again here)."""
    peak: float
    total: float
    series: str
    status: str

    @property
    def left(self) -> float:
        return self.total - self.peak

    def text(self) -> str:
        return (f"headroom {self.left / GiB:.2f} GiB left: {self.series} peaked at {self.peak / GiB:.2f} of "
                f"{self.total / GiB:.1f} GiB ({self.peak / self.total:.0%})")


@dataclass
class Summary:
    status: str
    peak: Peak | None
    offloads: list[OffloadKind] = field(default_factory=list)
    failing: list[tuple[CheckResult, Finding | None]] = field(default_factory=list)
    headroom: Headroom | None = None
    killed: list[Finding] = field(default_factory=list)  # the oom check's findings, one per killed process
    command_exit: int | None = None  # `record --exec`'s command, when it failed and no kill explains it
    warning: list[tuple[CheckResult, Finding | None]] = field(default_factory=list)  # checks that warn
    coverage: str = ""  # what was judged: "2 of 8 checks judged: headroom, leak" (RunVerdict.coverage)
    tagged_by: str | None = None     # which integration tagged the steps, and what it could not see

    def exit_text(self) -> str | None:
        """The recorded command's own failure: not a memory verdict, but nobody should read PASS and miss it."""
        code = self.command_exit
        if not code:
            return None
        if code < 0:
            how = f"was stopped by {signal_name(-code)}"
        else:
            through_shell = stop_signal(code)
            how = f"exited with code {code}" + (f" ({through_shell}, through a shell)" if through_shell else "")
        return f"the recorded command {how}; the checks judge its memory up to then"

    def lines(self, failing: bool = True) -> list[str]:
        out = [f"KILLED: {f.message}" for f in self.killed]
        if self.exit_text():
            out.append(f"COMMAND FAILED: {self.exit_text()}")
        out.append(f"verdict: {self.status.upper()}")
        if self.coverage:
            out.append(f"judged: {self.coverage}")
        if self.tagged_by:
            out.append(self.tagged_by)
        out.append(self.peak.text() if self.peak else "peak: no memory samples")
        if self.headroom is not None:
            out.append(self.headroom.text())
        for kind in self.offloads:
            out.append(f"offload {kind.text()}")
        if not self.offloads:
            out.append("offloads: none in this run")
        for check, finding in self.failing if failing else ():
            out.append(f"FAIL {check.name}: {finding.message if finding else check.summary}")
        for check, finding in self.warning if failing else ():
            out.append(f"WARN {check.name}: {finding.message if finding else check.summary}")
        return out

    def to_dict(self) -> dict:
        peak = None
        if self.peak is not None:
            p = self.peak
            peak = {"bytes": int(p.bytes), "where": p.where, "series": p.series, "column": p.column, "pid": p.pid,
                    "t": p.t, "total": p.total, "share": p.share, "headroom_bytes": p.headroom,
                    "phase": p.phase, "iteration": p.iteration, "iteration_text": iteration_text(p.iteration)
                    if p.phase else None, "span": list(p.span) if p.span else None, "outside": p.outside or None,
                    "text": p.text()}
        headroom = None if self.headroom is None else {
            "peak_bytes": self.headroom.peak, "total_bytes": self.headroom.total, "left_bytes": self.headroom.left,
            "series": self.headroom.series, "status": self.headroom.status, "text": self.headroom.text()}
        return {
            "killed": [killed_dict(f) for f in self.killed],
            "command_exit": self.command_exit, "command_exit_text": self.exit_text(),
            "status": self.status, "judged": self.coverage, "tagged_by": self.tagged_by, "peak": peak, "headroom": headroom,
            "offloads": [{"name": k.name, "count": k.count, "failed": k.failed, "too_small": k.too_small,
                          "not_judged": k.not_judged, "declared_bytes": k.declared, "freed_bytes": k.freed,
                          "worst": None if k.worst is None else {
                              "message": k.worst.message, "span": list(k.worst.span) if k.worst.span else None,
                              "cause": k.worst.cause},
                          "text": k.text()} for k in self.offloads],
            "failing": [{"check": c.name, "title": c.title, "message": f.message if f else c.summary,
                         "cause": f.cause if f else None,
                         "span": list((f.span if f and f.span else c.span) or []) or None}
                        for c, f in self.failing],
            "warning": [{"check": c.name, "title": c.title, "message": f.message if f else c.summary,
                         "cause": f.cause if f else None} for c, f in self.warning],
            "coverage": self.coverage,
        }


def summarize(run, checks: list[CheckResult], status: str, coverage: str = "") -> Summary:
    failing = [(c, _first_failure(c)) for c in checks if c.status == "fail"]
    warning = [(c, next((f for f in c.findings if f.status == "warn"), None)) for c in checks if c.status == "warn"]
    killed = next((c.findings for c in checks if c.name == OOM_CHECK and c.status in ("fail", "warn")), [])
    code = command_exit(run)
    # a fleet is read without its processes' samples (those of the lanes drawn at most): its GPUs' own
    peak = highest_peak(run) or device_peak(run)
    return Summary(status, peak, _offload_kinds(checks), failing, _headroom(checks), list(killed),
                   None if killed else code, warning, coverage,  # a kill already says why the command ended
                   tagging_of(run))


def killed_dict(f: Finding) -> dict:
    """A killed process as --json states it: who, how, where, what grew before, the cgroup limit."""
    n = f.numbers
    return {"message": f.message, "cause": f.cause, "pid": n.get("pid"), "host": n.get("host"), "t": n.get("t"),
            "signal": n.get("signal"), "phase": n.get("phase"), "iteration": n.get("iteration"),
            "memory_max": n.get("memory_max"), "window_s": n.get("window_s"), "grew": n.get("grew", []),
            "span": list(f.span) if f.span else None}


def _headroom(checks: list[CheckResult]) -> Headroom | None:
    """The headroom check's finding closest to its total: the summary states it, never a figure of its own."""
    check = next((c for c in checks if c.name == HEADROOM_CHECK), None)
    judged = [f for f in (check.findings if check else []) if f.status in ("pass", "fail", "warn")
              and _number(f, ("peak",)) is not None and _number(f, ("total",))]
    if not judged:
        return None
    worst = max(judged, key=lambda f: f.numbers["peak"] / f.numbers["total"])
    return Headroom(float(worst.numbers["peak"]), float(worst.numbers["total"]),
                    str(worst.numbers.get("series") or worst.series or check.series), worst.status)


def _first_failure(check: CheckResult) -> Finding | None:
    return next((f for f in check.findings if f.status == "fail"), None)


# Numbers offload_drop may record for the bytes measured gone, preferred first.
_FREED_KEYS = ("freed", "dropped_alloc", "dropped_driver", "dropped_inside")
_DECLARED_KEYS = ("declared", "expected_bytes")


def _number(finding: Finding, keys) -> float | None:
    for key in keys:
        value = finding.numbers.get(key)
        if isinstance(value, (int, float)) and np.isfinite(value):
            return float(value)
    return None


def _offload_kinds(checks: list[CheckResult]) -> list[OffloadKind]:
    check = next((c for c in checks if c.name == OFFLOAD_CHECK), None)
    if check is None:
        return []
    by_name: dict[str, list[Finding]] = {}
    for finding in check.findings:
        if finding.phase and finding.phase.startswith(names.OFFLOAD_PREFIX):
            by_name.setdefault(finding.phase, []).append(finding)
    return [_kind(name, found) for name, found in by_name.items()]


def _kind(name: str, found: list[Finding]) -> OffloadKind:
    declared = [d for d in (_number(f, _DECLARED_KEYS) for f in found) if d is not None]
    freed = [d for d in (_number(f, _FREED_KEYS) for f in found if f.status != "n/a") if d is not None]
    failed = [f for f in found if f.status == "fail"]

    def freed_share(f: Finding) -> float:
        d, g = _number(f, _DECLARED_KEYS), _number(f, _FREED_KEYS)
        return g / d if d and g is not None else np.inf

    judged = [f for f in found if f.status in ("pass", "fail")]
    warned = [f for f in found if f.status == "warn"]  # fragmentation: shown before a pass
    worst = failed[0] if failed else warned[0] if warned else (min(judged, key=freed_share) if judged else None)
    return OffloadKind(name, len(found), len(failed), sum(f.status == TOO_SMALL for f in found),
                       sum(f.status == "n/a" for f in found),
                       float(np.median(declared)) if declared else None,
                       float(np.median(freed)) if freed else None, worst)
