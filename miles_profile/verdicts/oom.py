"""Killed processes: which process the OOM killer (or a SIGKILL) ended, in which phase and iteration,
what grew in the WINDOW_S seconds before, and the cgroup's limit. Pure: reads the run's `oom` events
(miles_profile/oom.py writes them) and the processes the reader marked `died`, never a file.

    check_oom(run) -> CheckResult       # "fail" for an OOM kill, "warn" for another SIGKILL or a vanishing;
                                        # "n/a" when none was
    deaths_of(run) -> list[dict]        # the merged death records, one per process

One process, one finding, however many saw it die: `record --exec` (its exit status: the signal) and
the host sampler (it vanished; the counter moved) are merged, an OOM kill outranks a SIGKILL outranks a
vanishing. A counter move no recorded process claimed (`process_pid` null) is kept only when no
known process was OOM-killed on that host. A process the reader marked `died` (no `end_time`, logs
written before this check) without an event is a vanishing at its last record.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.command_exit import command_exit, stop_signal
from miles_profile.runmodel.series import process_label, series_arrays
from miles_profile.runmodel.stats import phase_instances
from miles_profile.sizes import format_size
from miles_profile.verdicts.types import CheckResult, Finding

NAME, TITLE = "oom", "Killed processes (OOM killer, SIGKILL)"
EXPLANATION = ("a process of the run was killed (the kernel's OOM killer, or SIGKILL) or vanished without "
               "ending its recording: the run did not finish. What grew in the last seconds says what to cut")
WINDOW_S = 10.0   # "what grew in the last N seconds before it died"
STOP_WINDOW_S = 5.0  # a process that vanished this close to a command stopped by a signal ended with it
TOP = 5           # series listed per death, the largest growths first
# Ray's memory monitor kills (SIGKILL) before the kernel would: it outranks what the host sampler saw.
_RANK = {"ray_oom_kill": -1, "oom_kill": 0, "sigkill": 1, "vanished": 2}
_HOW = {"ray_oom_kill": "killed by Ray's memory monitor (Ray's OOM killer)", "oom_kill": "killed by the OOM killer",
        "sigkill": "killed by SIGKILL",
        "vanished": "vanished without ending its recording (SIGKILL, an OOM kill or a crash)"}


def _events(run) -> list[dict]:
    events = run.events
    if events.empty:
        return []
    rows = events[events["kind"] == names.OOM]
    # Only deaths: an `oom` event of a CUDA OutOfMemoryError or MemoryError that escaped a phase (the
    # process lived to write it) has no `cause` of ours.
    return [{**a, "t": float(t), "host": str(h), "seen_by": int(p)}
            for t, h, p, a in zip(rows["t"], rows["host"], rows["pid"], rows["attrs"])
            if isinstance(a, dict) and a.get("cause") in _RANK]


def _died_without_event(run, known: set) -> list[dict]:
    """Processes the reader marked died that no event names: a vanishing at their last record."""
    out = []
    for p in run.processes:
        if not p.get("died") or (str(p.get("host")), p.get("pid")) in known:
            continue
        pid, last = p.get("pid"), None
        if len(run.samples) and "pid" in run.samples:
            t = run.samples.loc[run.samples["pid"] == pid, "t"]
            last = float(t.max()) if len(t) else None
        if last is None and len(run.events):
            t = run.events.loc[run.events["pid"] == pid, "t"]
            last = float(t.max()) if len(t) else None
        if last is not None:
            out.append({"process_pid": pid, "cause": "vanished", "t": last, "host": str(p.get("host")),
                        "role": p.get("role"), "rank": p.get("rank"), "detected_by": "reader"})
    return out


def deaths_of(run) -> list[dict]:
    """One record per dead process (host, pid), the most telling cause and the earliest time first."""
    merged: dict[tuple, dict] = {}
    unknown = []
    for event in _events(run):
        if event.get("process_pid") is None:
            unknown.append(event)
            continue
        key = (event["host"], event["process_pid"])
        if key not in merged:
            merged[key] = {**event, "detected_by": [event.get("detected_by")]}
            continue
        have = merged[key]
        better = _RANK.get(event.get("cause"), 3) < _RANK.get(have.get("cause"), 3)
        combined = {**event, **have} if not better else {**have, **event}
        combined.update(t=min(have["t"], event["t"]), detected_by=have["detected_by"] + [event.get("detected_by")])
        for k in ("signal", "returncode", "command", "role", "rank", "memory_max",  # whoever knows it
                  "ray_memory_used", "ray_memory_threshold"):
            combined[k] = have.get(k) if have.get(k) is not None else event.get(k)
        merged[key] = combined
    oom_hosts = {h for (h, _), d in merged.items() if d.get("cause") == "oom_kill"}
    deaths = list(merged.values())
    deaths += [{**e, "detected_by": [e.get("detected_by")]} for e in unknown if e["host"] not in oom_hosts]
    deaths += [{**d, "detected_by": [d["detected_by"]]} for d in _died_without_event(run, set(merged))]
    return sorted(deaths, key=lambda d: d["t"])


def _last_phase(run, pid, t: float):
    """The last phase the process entered before `t` (its own; else any process's: an exec child
    that records nothing itself ran under its descendants' phases). (name, iteration, start) or None."""
    inst = phase_instances(run)
    if inst.empty:
        return None
    began = inst[inst["start"] <= t]
    own = began[began["pid"] == pid] if pid is not None else began.iloc[0:0]
    rows = own if len(own) else began
    if rows.empty:
        return None
    row = rows.sort_values(["start", "depth"]).iloc[-1]
    return str(row["name"]), int(row["iteration"]), float(row["start"])


def _growth(t: np.ndarray, y: np.ndarray, a: float, b: float) -> tuple[float, float] | None:
    """(first, highest) of the finite values within [a, b]: the highest, not the last, since a series
    of the dead process (a tree sampled from outside) falls to nothing in its last row."""
    inside = (t >= a) & (t <= b) & np.isfinite(y)
    if inside.sum() < 2:
        return None
    values = y[inside]
    return float(values[0]), float(values.max())


def grew_before(run, t: float, window_s: float = WINDOW_S) -> list[dict]:
    """What grew in [t - window_s, t], from its first value to its highest: each process's RSS and GPU
    memory, each host's used memory and cgroup usage, each GPU's NVML used. Largest growth first."""
    a, out = t - window_s, []

    def add(what, series, first_last):
        if first_last is not None and first_last[1] > first_last[0]:
            a_, b_ = int(first_last[0]), int(first_last[1])  # bytes are integers
            out.append({"what": what, "series": series, "from": a_, "to": b_, "growth": b_ - a_})

    samples = run.samples
    if len(samples) and "pid" in samples:
        columns = [c for c in samples.columns if c == "rss" or (c.startswith("gpu") and
                                                                 c.endswith(("_alloc", "_reserved", "_proc")))]
        for pid in sorted(int(p) for p in samples["pid"].unique()):
            for column in columns:
                t_, y = series_arrays(run, pid, column)
                label = "RSS" if column == "rss" else f"GPU {column[3:].split('_')[0]} {column.split('_', 1)[1]}"
                add(f"{label} of {process_label(run, pid)}", column, _growth(t_, y, a, t))
    host = run.host_samples
    if len(host):
        for name, frame in host.groupby("host", observed=True):
            ht = frame["t"].to_numpy(float)
            used = (pd_num(frame["host_total"]) - pd_num(frame["host_available"]))
            add(f"host {name} used", "host_used", _growth(ht, used, a, t))
            add(f"cgroup of {name}", "cgroup_usage", _growth(ht, pd_num(frame["cgroup_usage"]), a, t))
    for (name, uuid), (gt, used) in run.gpu_used.items():
        add(f"GPU {uuid} on {name} (NVML used)", "gpu_used", _growth(gt, used, a, t))
    return sorted(out, key=lambda g: -g["growth"])[:TOP]


LOW_ROOM_SHARE = 0.10  # memory left, as a share of the host's (or cgroup's) total, under which a kill may be OOM


def _room_at(run, death: dict, limit: int | None) -> float | None:
    """The smallest share of memory left on the dead process's host in the WINDOW_S before its death (the
    host's available memory, and the cgroup's limit minus its usage where it has one); None unmeasured."""
    host = run.host_samples
    if not len(host) or "host_available" not in host:
        return None
    frame = host[(host["host"].astype(str) == str(death.get("host"))) & (host["t"] <= death["t"])
                 & (host["t"] >= death["t"] - WINDOW_S)]
    if frame.empty:
        return None
    shares = pd_num(frame["host_available"]) / pd_num(frame["host_total"])
    if limit and "cgroup_usage" in frame:
        shares = np.concatenate([shares, 1 - pd_num(frame["cgroup_usage"]) / float(limit)])
    shares = shares[np.isfinite(shares)]
    return float(shares.min()) if len(shares) else None


def pd_num(series) -> np.ndarray:
    return pd.to_numeric(series, errors="coerce").to_numpy(float)


def _limit(run, death: dict) -> int | None:
    """The cgroup limit when it died: the event's, else the host sampler's last reading before."""
    if isinstance(death.get("memory_max"), (int, float)):
        return int(death["memory_max"])
    host = run.host_samples
    if not len(host) or "cgroup_limit" not in host:
        return None
    frame = host[(host["host"].astype(str) == death["host"]) & (host["t"] <= death["t"])]
    limits = pd_num(frame["cgroup_limit"])
    limits = limits[np.isfinite(limits)]
    return int(limits[-1]) if len(limits) else None


def _who(run, death: dict) -> str:
    pid = death.get("process_pid")
    if pid is None:
        return f"a process of the cgroup on {death['host']} (not recorded)"
    if death.get("role") == "exec_child":
        command = " ".join(str(c) for c in death.get("command") or [])[:60]
        return f"pid {pid} (the command{f' `{command}`' if command else ''})"
    role = death.get("role")
    rank = f" rank {death['rank']}" if death.get("rank") is not None and role in (names.ROLE_ACTOR, "engine") else ""
    return (f"pid {pid} ({role}{rank})" if role else f"pid {pid}") + _ray_actor(run, death)


def _ray_actor(run, death: dict) -> str:
    """`, Ray actor Trainer 'name' on host` for a recorded Ray worker (its meta's ray_* fields), else ''."""
    meta = next((p for p in run.processes if p.get("pid") == death.get("process_pid")
                 and str(p.get("host")) == death.get("host")), {})
    if not meta.get("ray_actor_class"):
        return ""
    name = f" {meta['ray_actor_name']!r}" if meta.get("ray_actor_name") else ""
    return f", Ray actor {meta['ray_actor_class']}{name} on {death.get('host')}"


def finding_of(run, death: dict) -> Finding:
    t, pid = death["t"], death.get("process_pid")
    phase = _last_phase(run, pid, t)
    grew = grew_before(run, t)
    limit = _limit(run, death)
    where = f"in {phase[0]} of {'setup' if phase[1] < 0 else f'iteration {phase[1]}'} ({t - phase[2]:.1f} s into it)" \
        if phase else "before any phase"
    growth = ", ".join(f"{g['what']} +{format_size(g['growth'])}" for g in grew[:3]) or "nothing recorded grew"
    ray_numbers = (f" (node memory {format_size(death['ray_memory_used'])} over Ray's threshold "
                   f"{format_size(death['ray_memory_threshold'])})" if death.get("ray_memory_threshold") else "")
    message = (f"{_who(run, death)} {_HOW.get(death.get('cause'), 'died')}{ray_numbers} {where}; in the last {WINDOW_S:.0f} s: "
               f"{growth}; cgroup limit {format_size(limit) if limit else 'none (unlimited)'}")
    numbers = {"pid": pid, "host": death["host"], "cause": death.get("cause"), "t": t,
               "signal": death.get("signal"), "returncode": death.get("returncode"), "memory_max": limit,
               "oom_kill_delta": death.get("oom_kill_delta"), "phase": phase[0] if phase else None,
               "iteration": phase[1] if phase else None, "window_s": WINDOW_S, "grew": grew,
               "detected_by": [d for d in death.get("detected_by", []) if d]}
    # No `phase` on the finding: a death ends the whole run, and no --phase selection may hide it.
    # The OOM killer (its counter moved) is a memory failure, and so is a SIGKILL or a vanishing with memory
    # short. With plenty left (the host's and the cgroup's) and no OOM kill counted, it was not memory that
    # killed it (a launcher's kill -9, a scheduler's preemption): shown first, but a warning.
    room = _room_at(run, death, limit)
    status = "fail" if death.get("cause") == "oom_kill" or room is None or room < LOW_ROOM_SHARE else "warn"
    numbers["room_share"] = room
    if _is_recorder(run, death) and death.get("cause") == "vanished":
        # `record` itself died (kill -9 of the recorder): the run is cut there, whatever was judged before
        status = "warn" if status == "warn" or room is None else status
        message = (f"the recording was cut: record (pid {pid}) ended without a clean stop {where} ({_cut_note(run)}); "
                   "everything after is missing, and the checks judged what came before")
    elif status == "warn":
        message += (f"; {room:.0%} of the memory was still free and no OOM kill was counted: not judged a memory "
                    "failure")
    restarted = _restarted_as(run, death)
    if restarted is not None:  # the actor lived on in a new process: a restart, not a lost rank
        message += f"; Ray restarted the actor as pid {restarted} (max_restarts), which went on"
        numbers["ray_restarted_as"] = restarted
    return Finding(status, message, span=(t - WINDOW_S, t), numbers=numbers, cause=death.get("cause"),
                   series=grew[0]["series"] if grew else None)


def stopped_by(run) -> tuple[str, float] | None:
    """(signal name, the command's end) when `record --exec`'s command was stopped by a signal other than
    SIGKILL (command_exit.stop_signal), else None."""
    name = stop_signal(command_exit(run))
    ends = [p.get("end_time") for p in run.processes if p.get("role") == "exec_parent"]
    end = next((float(e) for e in ends if isinstance(e, (int, float))), None)
    return None if name is None or end is None else (name, end)


STALE_S = 120.0  # a recorder that wrote nothing for this long and never ended is dead, not live


def cut_recording(run, now: float | None = None) -> Finding | None:
    """`record` (exec_parent) never wrote its end_time and nothing was written for STALE_S: it was killed
    (kill -9 of the recorder) and the run is cut there. A run being written writes every 0.5 s."""
    import time
    parents = [p for p in run.processes if p.get("role") == "exec_parent" and "start_time" in p]
    if not parents or any(p.get("end_time") for p in parents):
        return None
    last = [float(run.samples["t"].max())] if len(run.samples) else []
    last += [float(run.events["t"].max())] if len(run.events) else []
    if not last or (now if now is not None else time.time()) - max(last) < STALE_S:
        return None
    t = max(last)
    pid = parents[0].get("pid")
    message = (f"the recording was cut: record (pid {pid}) never ended and nothing was written after "
               f"{t - float(parents[0]['start_time']):.1f} s ({_cut_note(run)}): record was killed; the checks "
               "judged only what came before")
    return Finding("warn", message, span=(t - WINDOW_S, t), numbers={"pid": pid, "t": t}, cause="vanished")


def _restarted_as(run, death: dict):
    """The pid Ray restarted this process's actor as (logdir/cluster.py, mark_ray_restarts), else None."""
    meta = next((p for p in run.processes if p.get("pid") == death.get("process_pid")
                 and str(p.get("host")) == str(death.get("host"))), {})
    return meta.get("ray_restarted_as")


def _is_recorder(run, death: dict) -> bool:
    meta = next((p for p in run.processes if p.get("pid") == death.get("process_pid")
                 and str(p.get("host")) == str(death.get("host"))), {})
    return meta.get("role") == "exec_parent"


def _cut_note(run) -> str:
    from miles_profile.runmodel.stats import phase_instances
    inst = phase_instances(run)
    if inst.empty or "iteration" not in inst:
        return "no phase recorded"
    return f"the last iteration recorded is {int(inst['iteration'].max())}"


def check_oom(run) -> CheckResult:
    deaths = deaths_of(run)
    # A vanishing is a death only when the run failed: a forked worker that ends with os._exit (every
    # multiprocessing fork worker, a DataLoader's) never writes its end either. When the command exited
    # 0, whatever vanished without a kill seen (a signal, the OOM counter) did its work and left; when a
    # signal stopped it (SIGTERM: Python ends without writing anything), what vanished with it, in the
    # STOP_WINDOW_S before its end, was stopped by it.
    stopped = stopped_by(run)
    # A Ray actor's process that Ray replaced (max_restarts) was killed, whatever the command's exit: kept
    vanished = [d for d in deaths if d.get("cause") == "vanished" and _restarted_as(run, d) is None]
    if command_exit(run) == 0:
        unseen = vanished
    elif stopped is not None:
        unseen = [d for d in vanished if d["t"] >= stopped[1] - STOP_WINDOW_S]
    else:
        unseen = []
    deaths = [d for d in deaths if d not in unseen]
    # A worker that vanished with memory to spare and no kill seen (a Pool worker, a forked subprocess, an
    # os._exit) ended; whatever the command's exit code, it is no death. `record` itself vanishing is kept.
    ended = [d for d in deaths if d.get("cause") == "vanished" and not _is_recorder(run, d)
             and _restarted_as(run, d) is None and (_room_at(run, d, _limit(run, d)) or 0.0) >= LOW_ROOM_SHARE]
    deaths = [d for d in deaths if d not in ended]
    cut = cut_recording(run)
    if not deaths and cut is not None:
        return CheckResult(NAME, TITLE, "warn", cut.message, EXPLANATION, cut.span, [cut], "the run's last records")
    if not deaths:
        if unseen and stopped is not None:
            said = (f"no process was killed: the command was stopped by {stopped[0]}, and {len(unseen)} recorded "
                    "process(es) ended with it without ending their recording")
        elif unseen:
            said = (f"no process was killed; {len(unseen)} recorded process(es) ended without ending their "
                    "recording while the command exited 0 (a forked worker ending with os._exit does): not deaths")
        elif ended:
            said = (f"no process was killed; {len(ended)} recorded process(es) ended without ending their recording, "
                    "with no kill seen and memory to spare (a Pool worker, a subprocess, os._exit): not deaths")
        else:
            said = "no process was killed or vanished"
        return CheckResult(NAME, TITLE, "n/a", said, EXPLANATION)
    findings = [finding_of(run, d) for d in deaths]
    span = (min(f.span[0] for f in findings), max(f.span[1] for f in findings))
    summary = findings[0].message if len(findings) == 1 else \
        f"{len(findings)} processes killed; first: {findings[0].message}"
    status = "fail" if any(f.status == "fail" for f in findings) else "warn"
    return CheckResult(NAME, TITLE, status, summary, EXPLANATION, span, findings,
                       "RSS, NVML, host and cgroup memory before the death")
