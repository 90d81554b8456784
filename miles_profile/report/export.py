"""Exports: the timeline as PNG, a Chrome trace / Perfetto JSON, the per-phase table as CSV, JSON.

Public API:

    write_png(figure, path, *, width=1600)          # kaleido, through Debian's Chromium
    trace_events(run, *, max_points=100_000) -> list[dict]
    write_trace(runs, path, *, max_points=100_000)  # {"traceEvents": [...]}: open in ui.perfetto.dev
    phase_csv_frame(runs) -> DataFrame; write_phase_csv(runs, path)
    write_json(reports, path)                       # the engine's verdicts (RunVerdict.to_dict) + phases
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd

from miles_profile.errors import MilesProfileError
from miles_profile.report.figures import run_start
from miles_profile.runmodel.ledger import ledger_records
from miles_profile.runmodel.reduce import phase_ranges, reduce_series
from miles_profile.runmodel.series import GiB, series_arrays, timeline_series
from miles_profile.runmodel.stacks import stacks_of, stacks_records
from miles_profile.runmodel.stats import phase_table
from miles_profile.runmodel.transitions import meter_of
from miles_profile.runmodel.whatif import whatif_of
from miles_profile.verdicts.engine import exit_code_of, jsonable, overall_of

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def _chromium() -> str | None:
    configured = os.environ.get("MILES_PROFILE_CHROMIUM") or os.environ.get("BROWSER_PATH")
    if configured and os.path.exists(configured):
        return configured
    return next((c for c in CHROMIUM_CANDIDATES if os.path.exists(c)), None) or shutil.which("chromium")


def write_png(figure, path: str | Path, *, width: int = 1600) -> Path:
    browser = _chromium()
    if browser:
        os.environ.setdefault("BROWSER_PATH", browser)  # where kaleido's choreographer looks
    height = int(figure.layout.height or 800)
    for attempt in (1, 2):
        try:
            figure.write_image(str(path), format="png", width=width, height=height, scale=1)
            return Path(path)
        except Exception as exc:  # kaleido/choreographer raise many types when no browser works
            # kaleido can call its page before the page's script has loaded ("kaleido_scopes is not
            # defined"), seen under load (three test workers on two cores): a second browser is ready
            if attempt == 1 and "is not defined" in str(exc):
                continue
            raise MilesProfileError(f"PNG export failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                                    "it needs kaleido and Chromium (apt install chromium)") from None
    raise AssertionError("unreachable")


def trace_events(run, *, max_points: int = 100_000, pid_offset: int = 0) -> list[dict]:
    """Phases as complete slices ("X") per process, memory series as counter tracks ("C"), marks as instants."""
    t0 = run_start(run)
    us = lambda t: round((float(t) - t0) * 1e6, 3)  # noqa: E731
    events: list[dict] = []
    pids = sorted(set(run.samples["pid"].unique().tolist()) | set(run.phases["pid"].unique().tolist()
                                                                     if len(run.phases) else []))
    for pid in pids:
        role = next((p.get("role") for p in run.processes if p.get("pid") == pid), "")
        events.append({"ph": "M", "name": "process_name", "pid": int(pid) + pid_offset,
                       "args": {"name": f"{run.name} pid {pid}{' (' + role + ')' if role else ''}"}})
    for row in run.phases.itertuples():
        events.append({"ph": "X", "name": str(row.name), "cat": "phase", "ts": us(row.start),
                       "dur": max(0.0, round(float(row.duration) * 1e6, 3)), "pid": int(row.pid) + pid_offset,
                       "tid": int(row.pid), "args": jsonable({**(row.attrs or {}), "status": row.status})})
    for row in run.events[~run.events["kind"].isin(["begin", "end", "account"])].itertuples():
        events.append({"ph": "i", "s": "p", "name": f"{row.kind}: {row.name}", "ts": us(row.t),
                       "pid": int(row.pid) + pid_offset, "tid": int(row.pid), "args": jsonable(row.attrs)})
    series = timeline_series(run)
    bounds = (run.phases["start"].to_numpy(float), run.phases["end"].to_numpy(float)) if len(run.phases) else None
    n_out = max(200, max_points // max(1, len(series)))
    for s in series:
        t, y = series_arrays(run, s.pid, s.column)
        keep = reduce_series(t, y, n_out, phase_ranges(t, *bounds) if bounds else None)
        name = f"{s.group}: {s.label} (GiB)"
        for ts, value in zip(t[keep], y[keep]):
            if math.isfinite(value):
                events.append({"ph": "C", "name": name, "ts": us(ts), "pid": s.pid + pid_offset,
                               "args": {"GiB": round(value / GiB, 6)}})
    return events


def write_trace(runs, path: str | Path, *, max_points: int = 100_000) -> Path:
    events = []
    for k, run in enumerate(runs):
        events += trace_events(run, max_points=max_points, pid_offset=k * 10_000_000 if len(runs) > 1 else 0)
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, separators=(",", ":")))
    return Path(path)


def phase_csv_frame(runs) -> pd.DataFrame:
    frames = []
    for run in runs:
        overall = phase_table(run).assign(iteration="all")
        per = phase_table(run, by_iteration=True).astype({"iteration": str})
        frame = pd.concat([overall, per], ignore_index=True)
        frame.insert(0, "run", run.name)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    first = ["run", "iteration", "name"]
    return table[first + [c for c in table.columns if c not in first]]


def write_phase_csv(runs, path: str | Path) -> Path:
    phase_csv_frame(runs).to_csv(path, index=False)
    return Path(path)


def moving_memory(report) -> dict:
    """`transitions` (runmodel/transitions.py: per phase, per kind and tag, per step, the link ceilings) and
    `whatif` (runmodel/whatif.py: per offload and category) of one run, as the HTML report shows them."""
    frame = getattr(report, "ledger", None)
    return {"transitions": jsonable(meter_of(report.run, frame).to_dict()),
            "whatif": jsonable(whatif_of(report.run, frame).to_dict())}


def write_json(reports, path: str | Path) -> Path:
    """Each run's verdict as the engine gives it (RunVerdict.to_dict: `status`, `exit_code`, `checks`,
    `gates`), its warnings, per-phase statistics and `ledger` (runmodel/ledger.py ledger_records: bytes by
    category at each top-level phase's end and peak; `ledger_sampled`: [shown, of] iterations where it
    covers some), `transitions` and `whatif` (moving_memory), `stacks` (runmodel/stacks.py: the top allocation sites at each
    `record --stacks` snapshot's peak, [] without one); at the
    top the overall `status` and `exit_code` (those of visualize). With --baseline, `baseline` repeats the run's gate (`status`, `summary`, every
    compared value) where CI scripts read it."""
    verdicts = [r.verdict for r in reports]
    runs = []
    for report, verdict in zip(reports, verdicts):
        run = {**verdict.to_dict(), "name": report.run.name, "path": str(report.run.path),
               "summary": jsonable(report.summary.to_dict()) if verdict.checked else None,
               "warnings": report.skipped,
               "phases": jsonable(report.phases.astype(object).where(report.phases.notna(), None).to_dict("records")),
               "ledger": None if getattr(report, "ledger", None) is None else ledger_records(report.ledger),
               # [shown, of] iterations where the ledger covers some (a loop with a phase per step), else null
               "ledger_sampled": None if getattr(report, "ledger", None) is None
               else list(report.ledger.attrs.get("sampled", ())) or None}
        run.update(moving_memory(report))
        run["stacks"] = stacks_records(stacks_of(report.run))  # record --stacks: the sites at each snapshot's peak
        if run["gates"]:
            run["baseline"] = run["gates"][0]
        runs.append(run)
    data = {"status": overall_of(verdicts), "exit_code": exit_code_of(verdicts),
            "exit_code_strict": exit_code_of(verdicts, strict=True), "runs": runs}
    Path(path).write_text(json.dumps(data, indent=1))
    return Path(path)
