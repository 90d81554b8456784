"""headroom: the highest true peak against the device (or host) total."""
from __future__ import annotations

import numpy as np

from miles_profile.verdicts.types import CheckResult, Finding, Thresholds, gib
from miles_profile.verdicts.common import (
    nanmax, not_applicable, verdict)


def _host_total(run) -> float:
    for process in run.processes:
        for probe in process.get("probes", []):
            if probe.get("name") == "host" and isinstance(probe.get("total"), (int, float)):
                return float(probe["total"])
    return float("nan")


def check_headroom(run, th: Thresholds) -> CheckResult:
    name, title = "headroom", "Headroom against the device total"
    explanation = (f"The highest true peak must stay below {th.headroom_max_share:.0%} of the device's total memory "
                   "(on a run without GPU columns: of the host's), so the next, slightly larger batch does not OOM.")
    from miles_profile.report.series import pids_with, series_arrays
    findings = []
    for device in run.devices if run.gpu_indices else []:
        i = int(device.get("index", -1))
        total = device.get("total")
        columns = [c for c in (f"gpu{i}_used", f"gpu{i}_alloc_peak", f"gpu{i}_reserved") if pids_with(run, c)]
        if not columns or not isinstance(total, (int, float)) or total <= 0:
            continue
        # an engine server's samples in an actor's view (fleet_report) are its engine's to judge, not its own
        peers = {p.get("pid") for p in run.processes if p.get("view_peer")}
        owners = {c: [p for p in pids_with(run, c) if p not in peers][:8] for c in columns}
        if not any(owners.values()):
            continue
        peak = max(nanmax(series_arrays(run, p, c)[1]) for c in columns for p in owners[c])
        findings.append(_headroom_finding(f"GPU {i}", peak, float(total), th))
    if not run.gpu_indices:
        total = _host_total(run)
        column = "rss_peak" if pids_with(run, "rss_peak") else "rss"
        peaks = [nanmax(series_arrays(run, p, column)[1]) for p in pids_with(run, column)]
        if peaks and np.isfinite(total):
            findings.append(_headroom_finding("host", max(peaks), total, th))
    if not findings:
        why = ("host total unknown (no host probe in meta)" if not run.gpu_indices
               else "device totals unknown (no NVML devices in meta)" if not run.devices
               else "device totals not recorded (an import: NVML used without the total)")
        return not_applicable(name, title, explanation, why)
    t = run.samples["t"]
    span = (float(t.iloc[0]), float(t.iloc[-1])) if len(t) else None
    for f in findings:
        f.span = span
    return verdict(name, title, explanation, findings, "GPU" if run.gpu_indices else "host RSS (no GPU columns)",
                    "of the memories checked kept headroom", "memories near their total")


def _headroom_finding(what: str, peak: float, total: float, th: Thresholds) -> Finding:
    share = peak / total
    return Finding("fail" if share > th.headroom_max_share else "pass",
                   f"{what}: peak {gib(peak)} of {gib(total)} ({share:.0%})",
                   numbers=dict(peak=peak, total=total, share=share))

