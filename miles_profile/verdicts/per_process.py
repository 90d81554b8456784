"""The per-process checks of a run of many processes: checks.py's checks run on each actor/in_process/engine
process whose samples are read (an actor's view carries its engine server's meta and samples), aggregated
per check: it fails if any process fails, and names how many were judged and the worst one.

    per_process_checks(run, thresholds=None) -> list[FleetCheckResult]

(Moved here from report/fleet_report.py so that the verdict engine, engine.py, owns every judgement;
runmodel/process_view.py says which processes are judged and cuts out each one's view of the run.)
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from miles_profile.runmodel.series import pids, process_rows, sample_store
from miles_profile.runmodel.process_view import (
    judged_processes,
    phase_processes,
    process_view,
)
from miles_profile.verdicts import checks as checks_mod
from miles_profile.verdicts import fleet_checks
from miles_profile.verdicts.types import JUDGED, STATUS_ORDER, worst_status
from miles_profile.words import role_text

# How close a finding came to failing, from the numbers the checks record: (value, limit) pairs where
# more is worse, and the offload drop where less dropped is worse.
_RATIOS = (("growth", "limit"), ("spike", "limit"), ("resident", "limit"), ("rise", "allowed"),
           ("growth", "weights_bytes"), ("share", None))


def _who(meta: dict) -> str:
    """The role in words, or a Ray actor's class or a multiprocessing child's name where the program named no
    role: a policy and a reference of one job were both "trainer rank 0" (each is rank 0 of its own)."""
    if meta.get("role") in (None, "", "in_process"):
        for field, word in (("ray_actor_class", "Ray actor"), ("process_name", "process")):
            name = meta.get(field)
            if isinstance(name, str) and name:
                return f"{word} {name}"
    return role_text(meta.get("role"))


def _label(meta: dict) -> str:
    # a multiprocessing child in no process group is no rank: its "rank 0" only repeated its parent's
    rank = "" if meta.get("process_name") and meta.get("world_size") in (None, 1) else f" rank {meta.get('rank', '?')}"
    return f"{_who(meta)}{rank} (pid {meta.get('pid')}, {meta.get('host')})"


def per_process_checks(run, thresholds: checks_mod.Thresholds | None = None) -> list[checks_mod.CheckResult]:
    judged = judged_processes(run)
    total = len(phase_processes(run))
    # each process's rows from the run's one index (report/series.process_rows), shared with the figures
    # (a run read per process has no such rows: its views are its processes' own frames)
    rows_of = {p: None for p in pids(run)} if sample_store(run) is not None else \
        {p: np.arange(len(run.samples)) if (r := process_rows(run, p)) is None else r for p in pids(run)}
    per_check: dict[str, list] = {}
    # processes with phases but no readable meta: an actor's engine server may be one of them
    unidentified = phase_processes(run) - {(str(p.get("host") or ""), int(p.get("pid", -1))) for p in run.processes}
    for host, pid, meta in judged:
        sub = process_view(run, host, pid, rows_of, unidentified)
        for result in checks_mod.run_checks(sub, thresholds):
            per_check.setdefault(result.name, []).append((meta, result))
    if not per_check:  # nothing read (no samples): the checks say why, as on one process
        return checks_mod.run_checks(run, thresholds)
    results = [_aggregate(items, len(judged), total) for items in per_check.values()]
    return [_whole_run_headroom(run, thresholds) or r if r.name == "headroom" else r for r in results]


def _whole_run_headroom(run, thresholds) -> checks_mod.CheckResult | None:
    """Headroom is a device's (and a host's), not a process's: an actor and its engine server on one GPU
    each stay below the total their sum reaches. Judged on the whole run (NVML device used from the host
    sampler, the host's used memory) where it can be; else the per-process verdicts stand."""
    whole = checks_mod.check_headroom(run, thresholds or checks_mod.Thresholds())
    return whole if whole.status != "n/a" else None


def _severity(finding: checks_mod.Finding) -> float:
    n = finding.numbers
    if "needed" in n and "dropped_inside" in n:
        return float(n["needed"]) / max(float(n["dropped_inside"]), 1.0)
    for value, limit in _RATIOS:
        if value in n:
            try:
                v = float(n[value]) if limit is None else float(n[value]) / max(float(n.get(limit) or 0), 1.0)
            except (TypeError, ValueError):
                continue
            if np.isfinite(v):
                return v
    return -np.inf


def _worst_key(item) -> tuple:
    result = item[1]
    judged = [f for f in result.findings if f.status in JUDGED]
    return (STATUS_ORDER.get(result.status, 9), -sum(f.status == "fail" for f in judged),
            -max((_severity(f) for f in judged), default=-np.inf))


def _aggregate(items: list, n_judged: int, n_total: int) -> checks_mod.CheckResult:
    first = items[0][1]
    worst_meta, worst = min(items, key=_worst_key)
    statuses = [r.status for _, r in items]
    status = worst_status(statuses)  # one failing process fails it; too small to judge is kept as such
    roles = pd.Series([_who(m) for m, _ in items]).value_counts()
    counted = ", ".join(f"{v} {k}" for k, v in roles.items())
    failing = statuses.count("fail")
    warning = statuses.count("warn")
    head = f"judged {n_judged} processes" + "".join(f", {n} {word}" for n, word in ((failing, "fail"), (warning, "warn")) if n)
    unread = f"; {n_total - n_judged} more not judged here (samples not read: outside the lanes shown)" \
        if n_total > n_judged else ""
    if status == "n/a":
        summary = f"not judged in any of {n_judged} processes ({counted}){unread}; {_label(worst_meta)}: {worst.summary}"
    else:
        summary = f"{head} ({counted}){unread}; worst {_label(worst_meta)}: {worst.summary}"
    # Each finding keeps its cause, series and resolution; it gains the process it was found in.
    findings = [replace(f, message=f"{_label(meta)}: {f.message}",
                        numbers={**f.numbers, "pid": meta.get("pid"), "host": meta.get("host")})
                for meta, result in items for f in result.findings]
    spans = [r.span for _, r in items if r.span]
    span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
    resolutions = [r.resolution for _, r in items if r.resolution is not None]
    return fleet_checks.FleetCheckResult(
        first.name, first.title, status, summary, first.explanation, span, findings, worst.series,
        max(resolutions) if resolutions else None, judged={"processes": n_judged},
        worst={"label": _label(worst_meta), "pid": worst_meta.get("pid"), "host": worst_meta.get("host"),
               "message": worst.summary})
