"""Where a run's memory peaked: the highest true peak, on which device, when, in which phase and
iteration, against the device's (or host's) total. Pure numpy/pandas (no plotly).

    highest_peak(run) -> Peak | None
    device_peak(run) -> Peak | None     # without process samples: the host samplers' NVML used per GPU
    host_total(run) -> float | None     # the host's memory, from the host probe of any process

GPU runs: per GPU the device as NVML saw it (`gpu{i}_used`, every process on it), else the highest
allocator true peak (`gpu{i}_alloc_peak`) or reserved of one process. Runs without GPU columns: the
highest host RSS true peak (`rss_peak`) of one process. The headroom check judges this same Peak.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from miles_profile.runmodel.series import GiB, pids_with, process_label, series_arrays
from miles_profile.runmodel.stats import phase_instances

# The share of a device's (or the host's) total a peak may reach and still leave headroom: the default of
# the headroom check (verdicts/types.py Thresholds.headroom_max_share) and of the what-if (whatif.py).
HEADROOM_MAX_SHARE = 0.95
SETUP = "setup"  # the name every view gives the phases before the first iteration (iteration -1)


@dataclass(frozen=True)
class Peak:
    bytes: float
    where: str                  # "GPU 0" or "host"
    series: str                 # what was measured, e.g. "NVML used (device)"
    column: str
    pid: int
    t: float                    # Unix seconds of the sample that holds the peak
    total: float | None         # the device's (or host's) memory, when known
    phase: str | None = None    # the innermost phase running at t (of the peak's process, else any)
    iteration: int | None = None
    span: tuple[float, float] | None = None  # that phase's start and end (a link target)
    outside: str = ""           # without a phase: "before the first phase", "between offload_kv and train", ...
    limit: str = ""             # what `total` is when it is not a device's own: "cgroup limit", "host memory"

    @property
    def share(self) -> float | None:
        return self.bytes / self.total if self.total else None

    @property
    def headroom(self) -> float | None:
        return self.total - self.bytes if self.total else None

    def text(self) -> str:
        where = f"in {self.phase} of {iteration_text(self.iteration)}" if self.phase else self.outside
        limit = f" {self.limit}" if self.limit else ""
        total = f" of {self.total / GiB:.1f} GiB{limit} ({self.share:.0%})" if self.total else ""
        return f"peak {self.bytes / GiB:.2f} GiB{total} on {self.where} {where} ({self.series})"


def iteration_text(iteration: int | None) -> str:
    """One vocabulary in every view: iteration 3, or setup for what runs before the first."""
    if iteration is None:
        return "the run"
    return SETUP if iteration < 0 else f"iteration {iteration}"


def host_total(run) -> float | None:
    for process in run.processes:
        for probe in process.get("probes", []):
            if probe.get("name") == "host" and isinstance(probe.get("total"), (int, float)):
                return float(probe["total"])
    return None


_host_total = host_total  # the name this module's own code calls it by (merged branches edit those lines)


def _candidates(run):
    """(where, series text, column, peak column, total) in order of preference per device."""
    if run.gpu_indices:
        totals = {int(d.get("index", -1)): d.get("total") for d in run.devices}
        for i in run.gpu_indices:
            total = totals.get(i)
            total = float(total) if isinstance(total, (int, float)) and total > 0 else None
            for kind, text, peak in (("used", "NVML used (device)", "used"),
                                     ("alloc", "allocator allocated, true peak", "alloc_peak"),
                                     ("reserved", "allocator reserved", "reserved")):
                if pids_with(run, f"gpu{i}_{kind}"):
                    yield f"GPU {i}", text, f"gpu{i}_{kind}", f"gpu{i}_{peak}", total
                    break
    else:
        peak = "rss_peak" if pids_with(run, "rss_peak") else "rss"
        yield "host", "host RSS, true peak", "rss", peak, _host_limit(run)


def _host_limit(run) -> tuple[float | None, str]:
    """What a host process's peak is held against: the cgroup's limit where one was set and is below
    the host's memory (the OOM killer stops the run there, not at the machine's total), else the host's."""
    total = _host_total(run)
    limits = run.host_samples["cgroup_limit"].to_numpy(float) if "cgroup_limit" in run.host_samples else np.array([])
    limits = limits[np.isfinite(limits) & (limits > 0)]
    if len(limits) and (total is None or limits.min() < total):
        return float(limits.min()), "cgroup limit"
    return total, "host memory" if total else ""


def highest_peak(run) -> Peak | None:
    """The highest true peak of the run's samples, located in time and phase; None without samples."""
    best = None
    for where, text, column, peak_column, total in _candidates(run):
        for pid in pids_with(run, column):
            t, y = series_arrays(run, pid, peak_column)
            if not np.isfinite(y).any():
                t, y = series_arrays(run, pid, column)
            if not np.isfinite(y).any():
                continue
            k = int(np.nanargmax(y))
            if best is None or y[k] > best[0]:
                label = text if column.endswith("_used") else f"{text} of {process_label(run, pid)}"
                best = (float(y[k]), where, label, column, pid, float(t[k]), total)
    if best is None:
        return None
    value, where, label, column, pid, t, total = best
    total, limit = total if isinstance(total, tuple) else (total, "")
    phase, iteration, span, outside = _phase_at(run, pid, t)
    return Peak(value, where, label, column, pid, t, total, phase, iteration, span, outside, limit)


def device_peak(run) -> Peak | None:
    """Without process samples (a fleet read from its phase summaries: visualize and the dashboard read
    only the samples of the lanes they draw, or a run whose samples files were lost): the highest NVML
    used of any GPU in the host samplers' files (`Run.gpu_used`), in the phase a process on that GPU was
    running then. None where no host sampler recorded a GPU."""
    best = None
    for (host, uuid), (t, used) in run.gpu_used.items():
        if not len(used) or not np.isfinite(used).any():
            continue
        k = int(np.nanargmax(used))
        if best is None or used[k] > best[0]:
            best = (float(used[k]), str(host), str(uuid), float(t[k]))
    if best is None:
        return None
    value, host, uuid, t = best
    index, total = next(((g.get("index"), g.get("total")) for h in run.hosts if str(h.get("host", "")) == host
                         for g in h.get("gpus") or () if g.get("uuid") == uuid), (None, None))
    total = float(total) if isinstance(total, (int, float)) and total > 0 else None
    on_gpu = [int(p["pid"]) for p in run.processes
              if p.get("gpu_uuid") == uuid and str(p.get("host", "")) == host and isinstance(p.get("pid"), int)]
    where = f"GPU {index}" if isinstance(index, int) else f"GPU {uuid}"
    if len({str(p.get("host", "")) for p in run.processes}) > 1:
        where += f" of {host}"
    phase, iteration, span, outside = _phase_on(run, on_gpu, t)
    return Peak(value, where, "NVML used (device)", f"gpu{index}_used" if isinstance(index, int) else "gpu_used",
                on_gpu[0] if on_gpu else -1, t, total, phase, iteration, span, outside)


def _phase_on(run, pids: list[int], t: float):
    """The innermost phase holding `t` among the processes `pids` (those on one GPU), else any's. NVML used
    is a level read at `t` (not a true peak over the interval before it, as a process's peak columns are):
    a phase that starts at `t` holds it, and of two, the later-starting one (the fleet view's outliers
    name the same phase)."""
    inst = phase_instances(run)
    if len(pids) and not inst.empty:
        holding = inst[(inst["start"] <= t) & (inst["end"] >= t) & inst["pid"].isin(pids)]
        if len(holding):
            row = holding.sort_values(["depth", "start"]).iloc[-1]
            return str(row["name"]), int(row["iteration"]), (float(row["start"]), float(row["end"])), ""
    return _phase_at(run, pids[0] if pids else -1, t)


def _phase_at(run, pid: int, t: float):
    """The innermost phase holding `t`: the peak's own process first, else any process's. A sample's
    true peak covers the interval that ends at its time, so a phase that ended at t still holds it."""
    inst = phase_instances(run)
    if inst.empty:
        return None, None, None, "in a run without phases"
    holding = inst[(inst["start"] < t) & (inst["end"] >= t)]
    own = holding[holding["pid"] == pid]
    rows = own if len(own) else holding
    if rows.empty:
        return None, None, None, _outside(inst[inst["pid"] == pid] if (inst["pid"] == pid).any() else inst, t)
    row = rows.sort_values(["depth", "start"]).iloc[-1]
    return str(row["name"]), int(row["iteration"]), (float(row["start"]), float(row["end"])), ""


def _outside(inst, t: float) -> str:
    """Where a peak outside every phase lies, in words."""
    top = inst[inst["depth"] == 0].sort_values("start")
    before, after = top[top["end"] < t], top[top["start"] >= t]
    if before.empty:
        return "before the first phase"
    if after.empty:
        return f"after the last phase ({before.iloc[-1]['name']} of {iteration_text(int(before.iloc[-1]['iteration']))})"
    return f"between {before.iloc[-1]['name']} and {after.iloc[0]['name']} of {iteration_text(int(after.iloc[0]['iteration']))}"
