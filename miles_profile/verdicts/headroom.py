"""headroom: the highest true peak against the device (or host) total.

On a run without GPU columns the host is judged by its host sampler's series: used = host_total -
host_available (MemAvailable) at each read, and the cgroup's usage against its limit where one is set.
Not the sum of the processes' RSS peaks: RSS counts the pages the ranks share (every rank maps the same
torch libraries) once per rank, and peaks of different processes need not coincide; the host's used
memory is one instant, every process on the host included, and is what an OOM follows. Without a host
sampler the highest RSS peak of the run's processes is judged against the host total in their meta.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.runmodel.peak import host_total
from miles_profile.runmodel.series import pids_with, series_arrays
from miles_profile.verdicts.resolution import resolution_of
from miles_profile.verdicts.types import CheckResult, Finding, Thresholds, gib
from miles_profile.verdicts.common import (
    nanmax, not_applicable, verdict)


def check_headroom(run, th: Thresholds) -> CheckResult:
    name, title = "headroom", "Headroom against the device total"
    explanation = (f"The highest true peak must stay below {th.headroom_max_share:.0%} of the device's total memory "
                   "(on a run without GPU columns: the host's used memory, total minus available, read by the host "
                   "sampler, against its total, and a cgroup's usage against its limit), so the next, slightly "
                   "larger batch does not OOM.")
    findings = _gpu_findings(run, th) if run.gpu_indices else _host_findings(run, th)
    if not findings:
        why = ("host total unknown (no host sampler and no host probe in meta)" if not run.gpu_indices
               else "device totals unknown (no NVML devices in meta)" if not run.devices
               else "device totals not recorded (an import: NVML used without the total)")
        return not_applicable(name, title, explanation, why)
    t = run.samples["t"]
    span = (float(t.iloc[0]), float(t.iloc[-1])) if len(t) else None
    for f in findings:
        f.span = span
    return verdict(name, title, explanation, findings, "GPU" if run.gpu_indices else findings[0].series,
                   "of the memories checked kept headroom", "memories near their total")


_KIND_TEXT = {"used": "NVML used", "alloc_peak": "allocated, true peak", "reserved": "allocator reserved"}


def _gpu_findings(run, th: Thresholds) -> list[Finding]:
    findings = []
    # an engine server's samples in an actor's view (fleet_report) are its engine's to judge, not its own
    peers = {p.get("pid") for p in run.processes if p.get("view_peer")}
    for device in run.devices:
        i = int(device.get("index", -1))
        total = device.get("total")
        columns = [c for c in (f"gpu{i}_used", f"gpu{i}_alloc_peak", f"gpu{i}_reserved") if pids_with(run, c)]
        if not columns or not isinstance(total, (int, float)) or total <= 0:
            continue
        owners = {c: [p for p in pids_with(run, c) if p not in peers][:8] for c in columns}
        if not any(owners.values()):
            continue
        peak, column = max((nanmax(series_arrays(run, p, c)[1]), c) for c in columns for p in owners[c])
        series = f"GPU {i} {_KIND_TEXT.get(column.split('_', 1)[1], column)} (the highest of {', '.join(c for c in columns if owners[c])})"
        findings.append(_headroom_finding(f"GPU {i}", peak, float(total), th, series,
                                          resolution_of([c for c in columns if owners[c]])))
    return findings


def _host_findings(run, th: Thresholds) -> list[Finding]:
    """Per host the sampler read while this run's samples were taken; else the highest RSS peak."""
    frame = _host_samples(run)
    findings = []
    for host, rows in frame.groupby("host", sort=True) if len(frame) else ():
        used = (rows["host_total"] - rows["host_available"]).to_numpy(float)
        total = nanmax(rows["host_total"].to_numpy(float))
        if np.isfinite(total) and np.isfinite(used).any():
            findings.append(_headroom_finding(f"host {host}: used (total − available)", nanmax(used), total, th,
                                              f"host used of {host} (host sampler)", resolution_of("host_used")))
        limit = nanmax(rows["cgroup_limit"].to_numpy(float))
        usage = nanmax(rows["cgroup_usage"].to_numpy(float))
        if np.isfinite(limit) and limit > 0 and np.isfinite(usage):
            findings.append(_headroom_finding(f"host {host}: cgroup usage", usage, limit, th,
                                              f"cgroup usage of {host} (host sampler)", resolution_of("cgroup_usage")))
    if findings:
        return findings
    total = host_total(run)
    column = "rss_peak" if pids_with(run, "rss_peak") else "rss"
    peaks = [nanmax(series_arrays(run, p, column)[1]) for p in pids_with(run, column)]
    if peaks and total is not None:
        return [_headroom_finding("host", max(peaks), total, th, "host RSS (highest process)", resolution_of(column))]
    return []


def _host_samples(run) -> pd.DataFrame:
    """The host sampler's rows within this run's samples (one process's lifetime in a per-process view)."""
    try:
        frame = run.host_samples
    except (AttributeError, OSError, ValueError):
        return pd.DataFrame()
    t = run.samples["t"] if len(run.samples) else None
    if frame is None or not len(frame) or t is None:
        return pd.DataFrame()
    return frame[(frame["t"] >= float(t.min())) & (frame["t"] <= float(t.max()))]


def _headroom_finding(what: str, peak: float, total: float, th: Thresholds, series: str,
                      resolution: float) -> Finding:
    share = peak / total
    near = share > th.headroom_max_share
    return Finding("fail" if near else "pass", f"{what}: peak {gib(peak)} of {gib(total)} ({share:.0%})",
                   numbers=dict(peak=peak, total=total, share=share, series=series),
                   cause="near_total" if near else None, series=series, resolution=resolution)
