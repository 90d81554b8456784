"""Reading one run from several directories: copies read once, one pid on several hosts kept apart.

    copied_stems(dirs, warnings) -> {directory: stems to skip}   # run-a.bak beside run-a, or A given twice
    pid_aliases(processes, warnings) -> {stem: pid}              # the same pid on two hosts (containers)
    alias_event_pids(events, aliases) -> events                  # events carry the alias their samples do
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from miles_profile.logdir.layout import PROCESS_META_SUFFIX, RUN_META


def event_hosts(events: pd.DataFrame) -> list[str]:
    """The host of each event ("" where unknown)."""
    if "host" not in events:
        return [""] * len(events)
    return ["" if h is None or h != h else str(h) for h in events["host"].tolist()]


def copied_stems(dirs: list[Path], warnings: list[str] | None = None) -> dict[Path, set[str]]:
    """{directory: process stems to skip there}: a process (host-pid) whose files a directory read
    earlier already holds is a copy (`run-a.bak`, or one directory given twice): read once, said once."""
    seen: dict[str, Path] = {}
    skip: dict[Path, set[str]] = {}
    for folder in dirs:
        for path in folder.glob(f"*{PROCESS_META_SUFFIX}"):
            stem = path.name[: -len(PROCESS_META_SUFFIX)]
            if path.name == RUN_META:
                continue
            if stem in seen:
                skip.setdefault(folder, set()).add(stem)
            else:
                seen[stem] = folder
    if warnings is not None:
        for folder, stems in skip.items():
            warnings.append(f"{folder.name}: {len(stems)} process(es) also in {seen[next(iter(stems))].name} "
                            "(a copy of the same run?): read once, from the first")
    return skip


PID_ALIAS_STEP = 2 ** 32  # above any Linux pid (at most 2**22): an alias never meets a real pid


def pid_aliases(processes: list[dict[str, Any]], warnings: list[str] | None = None) -> dict[str, int]:
    """{stem: pid} for processes whose pid another host's process also has (containers start at the
    same pids). Samples are keyed by pid, so the first host keeps it and the k-th other host's process
    reads as pid + k * 2**32 (its meta keeps the real one as `os_pid`): never two processes' samples in
    one series. Events and phases, keyed by (host, pid), get the same alias, so all stays consistent."""
    hosts_of: dict[Any, list] = {}
    for p in processes:
        hosts = hosts_of.setdefault(p.get("pid"), [])
        if p.get("host") not in hosts:
            hosts.append(p.get("host"))
    aliases = {}
    for p in processes:
        hosts = hosts_of[p.get("pid")]
        k = hosts.index(p.get("host"))
        if k and type(p.get("pid")) is int and isinstance(p.get("stem"), str):
            p["os_pid"], p["pid"] = p["pid"], p["pid"] + k * PID_ALIAS_STEP
            aliases[p["stem"]] = p["pid"]
    shared = sorted(pid for pid, hosts in hosts_of.items() if len(hosts) > 1 and type(pid) is int)
    if shared and warnings is not None:
        warnings.append(f"pid {shared[0]} (and {len(shared) - 1} more) runs on several hosts: the processes "
                        f"of the later hosts are shown as pid + k x {PID_ALIAS_STEP:,} (their meta's os_pid "
                        "is the real one)")
    return aliases


def alias_event_pids(events: pd.DataFrame, aliases: dict[str, int]) -> pd.DataFrame:
    """Events of an aliased process (its host and real pid) carry its alias, as its samples do."""
    if not aliases or events.empty:
        return events
    by_key = {(stem.rsplit("-", 1)[0], pid % PID_ALIAS_STEP): pid for stem, pid in aliases.items()}
    pids = events["pid"].tolist()
    new = [by_key.get((h, p), p) for h, p in zip(event_hosts(events), pids)]
    if new != pids:
        events = events.assign(pid=np.asarray(new, dtype=np.int64))
    return events
