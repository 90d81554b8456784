"""What a run directory lacks, said in `Run.warnings`: nothing read from it is lost without a word.

    apply_status(run_dir, processes, warnings)   # <stem>.status.json fills what a full disk kept out of a meta
    warn_incomplete(processes, warnings)         # processes whose recording dropped rows or events
    warn_unended(dirs, processes, warnings)      # nobody recorded an end, and nothing is being written
    warn_missing_files(run_dir, processes, warnings)  # a process without its samples, events or meta
    warn_missing_ranks(processes, warnings)      # world_size says N ranks; fewer wrote a meta
    warn_clock_skew(dirs, processes, warnings)   # merged directories whose clocks disagree
    collapse_repeats(warnings)                   # 5,000 files with one problem: one line, not 5,000
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from miles_profile.errors import MilesProfileError
from miles_profile.logdir.files import read_small
from miles_profile.logdir.layout import (
    EVENTS_SUFFIX,
    PROCESS_META_SUFFIX,
    RUN_META,
    SAMPLES_SUFFIX,
    STATUS_BYTES,
    STATUS_SUFFIX,
)

# Merged hosts whose recordings start this far apart were not recording one run on one clock.
CLOCK_SKEW_WARN_S = 3600.0
SHOWN = 3  # files named in a collapsed warning
STALE_S = 600.0  # a live recorder writes samples every interval and flushes at least every second


def _who(p: dict[str, Any]) -> str:
    rank = p.get("rank")
    what = f"{p.get('role', 'process')} rank {rank}" if isinstance(rank, int) and rank >= 0 else p.get("role", "process")
    return f"{what} (pid {p.get('pid')}, {p.get('host', '?')})"


def _listed(items: list[str]) -> str:
    return ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")


def apply_status(run_dir: Path, processes: list[dict[str, Any]], warnings: list[str]) -> None:
    """Fill `end_time`, `dropped` and `write_error` of a meta that lacks them from its process's status
    file (writer.WriteFaults): a full disk leaves the meta as it was at start, the status file not."""
    for p in processes:
        stem = p.get("stem")
        if not isinstance(stem, str) or p.get("end_time"):
            continue  # the meta written at stop holds the end and any drops itself
        try:
            status = json.loads(read_small(run_dir / f"{stem}{STATUS_SUFFIX}", limit=STATUS_BYTES))
        except (MilesProfileError, OSError, ValueError, RecursionError):
            continue  # no status file (older logs), or damaged: the meta is all there is
        if not isinstance(status, dict):
            continue
        dropped = status.get("dropped")
        if isinstance(dropped, dict) and any(isinstance(v, int) and v > 0 for v in dropped.values()):
            p.setdefault("dropped", {k: v for k, v in dropped.items() if isinstance(v, int)})
            p.setdefault("write_error", str(status.get("write_error") or "unknown"))
        end = status.get("end_time")
        if not p.get("end_time") and isinstance(end, (int, float)) and not isinstance(end, bool):
            p["end_time"] = float(end)
            p["end_time_from"] = "status"


def warn_incomplete(processes: list[dict[str, Any]], warnings: list[str]) -> None:
    """One line for every process whose recording could not write all it recorded."""
    lossy = []
    for p in processes:
        dropped = p.get("dropped")
        if not isinstance(dropped, dict):
            continue
        rows, events = (dropped.get(k) if isinstance(dropped.get(k), int) else 0 for k in ("samples", "events"))
        if rows or events or p.get("write_error"):
            lossy.append(f"{_who(p)} lost {rows:,} sample rows and {events:,} events")
    if lossy:
        error = next((str(p["write_error"]) for p in processes if p.get("write_error")), "a write failed")
        warnings.append(f"the log is incomplete ({error}): {_listed(lossy)}; the report shows only what was written")


def warn_unended(dirs: list[Path], processes: list[dict[str, Any]], warnings: list[str],
                 now: float | None = None) -> None:
    """No process recorded an end (no `end_time` in any meta or status file) and no file changed for
    STALE_S: the recording stopped without a clean stop (killed with the job, a full disk on a log
    without status files), so the log may end early. A run still being written changes its files."""
    if not processes or any(p.get("end_time") for p in processes):
        return
    newest = 0.0
    for folder in dirs:
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                if entry.name.startswith("."):  # the reader's own caches: written by reading, not recording
                    continue
                with contextlib.suppress(OSError):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    idle = (time.time() if now is None else now) - newest
    if newest and idle > STALE_S:
        warnings.append(f"no process recorded an end and no file changed for {idle / 60:.0f} minutes: the "
                        "recording stopped without a clean stop (killed, or a full disk), so the log may "
                        "end before the job did")


def warn_missing_files(run_dir: Path, processes: list[dict[str, Any]], warnings: list[str]) -> None:
    """A process whose meta, samples or events file is missing would vanish from the report unsaid."""
    kinds = {"meta": PROCESS_META_SUFFIX, "samples": SAMPLES_SUFFIX, "events": EVENTS_SUFFIX}
    stems: dict[str, set[str]] = {}
    for kind, suffix in kinds.items():
        for path in run_dir.glob(f"*{suffix}"):
            if path.name != RUN_META and not path.name.startswith("."):
                stems.setdefault(path.name[: -len(suffix)], set()).add(kind)
    by_stem = {p.get("stem"): p for p in processes}
    lacking = []
    for stem, present in sorted(stems.items()):
        missing = [k for k in kinds if k not in present]
        if missing and not (missing == ["events"] and by_stem.get(stem, {}).get("role") == "exec_parent"):
            who = _who(by_stem[stem]) if stem in by_stem else stem
            lacking.append(f"{who}: no {' or '.join(missing)} file")
    if lacking:
        warnings.append(f"{len(lacking)} process(es) of {run_dir.name} lack a file, so part of them is not "
                        f"shown: {_listed(lacking)}")


def warn_missing_ranks(processes: list[dict[str, Any]], warnings: list[str]) -> None:
    """`world_size` in the metas against the ranks that wrote one: a rank with no meta is absent."""
    sizes = [p.get("world_size") for p in processes]
    sizes = [s for s in sizes if type(s) is int and 0 < s <= 1_000_000]
    if not sizes:
        return
    world = max(sizes)
    ranks = {p.get("rank") for p in processes if type(p.get("rank")) is int}
    missing = sorted(set(range(world)) - ranks)
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        warnings.append(f"world_size is {world} but no process meta of rank {shown}: "
                        f"{len(missing)} of {world} ranks are not in the report")


def warn_clock_skew(dirs: list[tuple[Path, dict[str, Any]]], warnings: list[str]) -> None:
    """Directories merged as one run (same run id) whose start times lie over CLOCK_SKEW_WARN_S apart:
    their hosts' clocks disagree (or they are not one run), so their timelines do not line up."""
    starts = [(d, m.get("start_time")) for d, m in dirs]
    starts = [(d, float(t)) for d, t in starts if isinstance(t, (int, float)) and not isinstance(t, bool)]
    if len(starts) < 2:
        return
    first, last = min(starts, key=lambda x: x[1]), max(starts, key=lambda x: x[1])
    gap = last[1] - first[1]
    if gap > CLOCK_SKEW_WARN_S:
        warnings.append(f"the merged directories start {gap / 3600:.1f} hours apart ({first[0].name} and "
                        f"{last[0].name}): their hosts' clocks disagree or they are not one run; "
                        "times across them do not line up")


_FILE_PREFIX = re.compile(r"^(?P<file>[^\s:/]+\.(?:csv|jsonl|json|status\.json)): (?P<rest>.+)$", re.DOTALL)


def collapse_repeats(warnings: list[str]) -> list[str]:
    """Warnings that differ only in the file they name (`a.csv: no t/phase header, skipped`), more than
    SHOWN of them, become one line with their count and the first few names, where the first stood."""
    groups: dict[str, list[int]] = {}
    for k, line in enumerate(warnings):
        match = _FILE_PREFIX.match(line)
        if match:
            groups.setdefault(match["rest"], []).append(k)
    out, done = [], set()
    for k, line in enumerate(warnings):
        match = _FILE_PREFIX.match(line)
        members = groups.get(match["rest"], []) if match else []
        if len(members) <= SHOWN:
            out.append(line)
        elif match["rest"] not in done:
            done.add(match["rest"])
            names = [_FILE_PREFIX.match(warnings[i])["file"] for i in members[:SHOWN]]
            out.append(f"{len(members)} files: {match['rest']} ({', '.join(names)}, ...)")
    return out


def warn_phases_without_events(without_events: dict[str, int], warnings: list[str], names_a_phase) -> None:
    """A process whose events file gave no event (emptied, cut before its first line) while its samples
    name phases: its phases, and every check of them, are missing from the report. `without_events`:
    stem -> the pid its samples carry; `names_a_phase(pid)`: whether those samples name a phase."""
    lost = sorted(stem for stem, pid in without_events.items() if names_a_phase(pid))
    if lost:
        warnings.append(f"{', '.join(s + '.events.jsonl' for s in lost[:5])}{', ...' if len(lost) > 5 else ''}: "
                        "no events, while the samples name phases (the file was emptied or lost its lines); "
                        "those phases are not judged")


PLANNED = "its meta plans phases (a forecast) but no event was read"


def why_no_events(names_a_phase: bool | None) -> str:
    """Why a process whose meta plans phases (a forecast) wrote no event, as far as its samples tell: a
    rank that failed at start (no GPU for it) ended before its first phase, and no file is to blame."""
    if names_a_phase is None:
        return "it ended before its first phase, or its events file was emptied or lost its lines"
    if names_a_phase:
        return "its samples name phases: the events file was emptied or lost its lines"
    return "its samples name no phase: it ended before its first"


def warn_planned_without_events(processes: list[dict], events, warnings: list[str], names_a_phase) -> None:
    """A process whose meta plans phases (the trainer's `forecast` annotation) and wrote no event at all:
    it ended before its first phase, or its events file was emptied or lost; a run judged without them
    would pass on nothing (issue 30). `names_a_phase(pid)`: whether its samples name a phase (None: unknown)."""
    have = set(events["pid"].unique().tolist()) if events is not None and len(events) and "pid" in events else set()
    for p in processes:
        annotations = p.get("annotations")
        plan = annotations.get("forecast") if isinstance(annotations, dict) else None
        if isinstance(plan, dict) and plan.get("phases") and p.get("pid") not in have:
            warnings.append(f"{p.get('stem', p.get('pid'))}: {PLANNED} ({why_no_events(names_a_phase(p.get('pid')))}); "
                            "its phases are not judged")
