"""What `python -m miles_profile.visualize` does, as one library call: load, check, render, export.

Public API:

    VisualizeOptions(paths, output=None, png=None, trace=None, json=None, csv=None, check=True,
                     thresholds=Thresholds(), max_points=100_000)
    load_inputs(paths) -> (runs, notes)      # run dirs, dirs of runs, Miles CPU-profiler CSVs, Miles dashboard dirs
    visualize(options, echo=print) -> int    # exit code: the verdicts' (engine.exit_code_of): 0, or 1 when a
        # check or gate failed; 2 bad input (a --phase or --baseline that matches nothing included)
        # (raises MilesProfileError, exit 2, when an extra export failed: after the report and verdicts)
    default_output(paths) -> Path
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from miles_profile.errors import MilesProfileError
from miles_profile.importers.miles_csv import load_miles_csv
from miles_profile.importers.miles_dashboard import is_miles_dashboard, load_miles_dashboard
from miles_profile.logdir.gc_pause import keep_loaded
from miles_profile.logdir.layout import RUN_META, find_runs
from miles_profile.logdir.reader import load_run, run_id_of, with_samples
from miles_profile.runmodel.series import sample_count
from miles_profile.report import export, fleet_report
from miles_profile.report.compare import comparison_html
from miles_profile.report.fleet_figures import fleet_heatmap
from miles_profile.report.forecast_html import forecast_lines
from miles_profile.report.gate_html import regression_html
from miles_profile.report.html import build_run_report, write_html
from miles_profile.report.selected_report import apply_selection
from miles_profile.verdicts.checks import Thresholds
from miles_profile.verdicts.engine import STATUS_LABEL, exit_code_of, overall_of
from miles_profile.verdicts.selection import selection_for


@dataclass
class VisualizeOptions:
    paths: list[str]
    output: str | None = None
    png: str | None = None
    trace: str | None = None
    json: str | None = None
    csv: str | None = None
    check: bool = True
    thresholds: Thresholds = field(default_factory=Thresholds)
    max_points: int = 100_000
    fleet_thresholds: object | None = None  # fleet_checks.FleetThresholds; None: the defaults
    lanes: str | None = None  # a multi-process run's per-GPU timelines (fleet.select_lanes); None: worst:8
    phases: str | None = None  # --phase: families/names shown and judged (phase_select); None: the run's default
    baseline: str | None = None  # --baseline: a run to compare peaks and floors with (regression.py)
    baseline_thresholds: object | None = None  # regression.RegressionThresholds; None: 5% and 256 MiB
    baseline_by_iteration: bool = False  # compare per (iteration, phase) instead of per phase name
    strict: bool = False  # --strict: a WARN exits 1 as a FAIL does


def _progress(total: int, desc: str):
    from tqdm import tqdm
    # Shown on a terminal (disable=None: not in logs or CI) once the work takes more than a moment.
    return tqdm(total=total, desc=desc, delay=1.0, file=sys.stderr, leave=False, unit="step", disable=None)


def _expand(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.exists():
        raise MilesProfileError(f"{path}: no such file or directory")
    runs = find_runs(path)  # Miles' dashboard directories too (they have a meta.json): _load_one imports them
    if not runs:
        csvs = sorted(path.glob("*.csv")) if path.is_dir() else []
        if csvs and not any(path.glob("*.samples.csv")):
            return csvs
        what = "an empty directory" if path.is_dir() and not any(path.iterdir()) else "no miles-profile run"
        raise MilesProfileError(f"{path}: {what} (no {RUN_META} in it or its subdirectories)")
    return runs


def _load_one(target: tuple[Path, ...], lazy: bool = False):
    if is_miles_dashboard(target[0]):
        return load_miles_dashboard(target[0])
    if target[0].is_file():
        return load_miles_csv(target[0])
    if not lazy:
        return load_run(*target)
    # Metas, events and summaries first; every sample only for a run of a few processes. A larger
    # run's samples are read for the lanes its report draws (fleet_report.build_fleet).
    run = load_run(*target, sample_pids=set())
    return with_samples(run) if len(run.processes) <= fleet_report.FULL_READ_MAX_PROCESSES else run


def _group_by_run_id(targets: list[Path]) -> list[tuple[Path, ...]]:
    """Run directories with the same run id (one run's hosts, each its own directory) load as one run."""
    groups: dict[str, list[Path]] = {}
    for target in targets:
        key = f"file:{target}" if target.is_file() or is_miles_dashboard(target) else run_id_of(target)
        if target not in groups.setdefault(key, []):
            groups[key].append(target)
    return [tuple(group) for group in groups.values()]


def load_inputs(paths: list[str], lazy: bool = False) -> tuple[list, list[str]]:
    """Every run under `paths`. A damaged run among several is skipped and named in `notes`.
    `lazy`: a run of more than FULL_READ_MAX_PROCESSES processes comes without samples
    (`Run.sample_pids` is empty): the report reads those of the lanes it draws."""
    targets = _group_by_run_id([p for path in paths for p in _expand(Path(path))])
    runs, notes = [], []
    with _progress(len(targets), "reading") as bar:
        for target in targets:
            try:
                run = _load_one(target, lazy)
                if not sample_count(run) and getattr(run, "sample_pids", None) is None:
                    raise MilesProfileError(f"{target[0]}: the run has no samples")
                runs.append(run)
            except MilesProfileError as exc:
                if len(targets) == 1:
                    raise
                notes.append(f"skipped {', '.join(map(str, target))}: {exc}")
            except Exception as exc:  # noqa: BLE001 - one damaged run never costs the others
                if len(targets) == 1:
                    raise
                notes.append(f"skipped {', '.join(map(str, target))}: could not read it ({type(exc).__name__}: {str(exc)[:200]})")
            bar.update()
    if not runs:
        raise MilesProfileError("; ".join(notes) or "nothing to report")
    return runs, notes


def default_output(paths: list[str]) -> Path:
    first = Path(paths[0])
    if first.is_file():
        return first.with_suffix(".report.html")
    return first / "report.html"


def _verdict_lines(reports) -> list[str]:
    """What the terminal says: each run's checks and gates, one word per status (engine.STATUS_LABEL)."""
    lines = []
    for report in reports:
        verdict = report.verdict
        lines.append(f"{verdict.run_name}:")
        if not verdict.checked:
            lines.append("  checks not run (--no-check)")
        else:  # the first screen's facts in one short block; the failing checks are the lines below
            lines += [f"  {line}" for line in report.summary.lines(failing=False)]
        # Checks that cannot apply (an RL check on a plain training loop) fold into one line when there
        # are several: the run's own findings stay on the first screen; why each is n/a is in the report.
        shown = [r for r in verdict.checks if r.status != "n/a"]
        not_applicable = [r for r in verdict.checks if r.status == "n/a"]
        if len(not_applicable) < 2:
            shown, not_applicable = verdict.checks, []
        width = max((len(r.name) for r in shown), default=0)
        for r in shown:
            lines.append(f"  {STATUS_LABEL[r.status]:5} {r.name:{width}}  {r.summary}")
        if not_applicable:
            names = ", ".join(r.name for r in not_applicable)
            lines.append(f"  {STATUS_LABEL['n/a']:5} {names} (cannot apply to this run; why: the report or --json)")
        if verdict.checks:
            lines.append(f"  {STATUS_LABEL[verdict.status]:5} {'overall':{width}}  {verdict.coverage}")
        for gate in verdict.gates:
            lines.append(f"{gate.current} against the baseline {gate.baseline}:")
            lines += gate.lines()
    return lines


def visualize(options: VisualizeOptions, echo: Callable[[str], None] = print) -> int:

    started = time.perf_counter()
    runs, notes = load_inputs(options.paths, lazy=len(options.paths) == 1)
    keep_loaded()  # the runs live until the end: no collection walks them again (logdir/gc_pause.py)
    # a bad --phase, or one matching none of a run's phases: exit 2 before any work
    selections = [selection_for(run, options.phases) for run in runs]
    baseline = _load_baseline(options.baseline) if options.baseline else None
    reports = []
    with _progress(len(runs) * 4, "reporting") as bar:
        for run, selection in zip(runs, selections):
            report = build_run_report(run, thresholds=options.thresholds, check=options.check,
                                      max_points=options.max_points, progress=bar, lanes=options.lanes,
                                      fleet_thresholds=options.fleet_thresholds, selection=options.phases,
                                      baseline=baseline, baseline_thresholds=options.baseline_thresholds,
                                      baseline_by_iteration=options.baseline_by_iteration)
            report, _ = apply_selection(report, selection, options.max_points)
            notes += report.verdict.notes
            reports.append(report)
    runs = [r.run for r in reports]  # with the samples the reports read
    verdicts = [r.verdict for r in reports]
    comparison = comparison_html(runs, max_points=options.max_points) if len(runs) > 1 else None
    output = Path(options.output) if options.output else default_output(options.paths)
    gates = [g for v in verdicts for g in v.gates]
    _write(output, lambda: write_html(output, reports, comparison=comparison, notes=tuple(notes),
                                      extra=regression_html(gates)))
    extras = [(options.png, lambda: export.write_png(_png_figure(reports[0]), options.png)),
              (options.trace, lambda: export.write_trace(runs, options.trace, max_points=options.max_points)),
              (options.csv, lambda: export.write_phase_csv(runs, options.csv)),
              (options.json, lambda: export.write_json(reports, options.json))]
    written, failed = [], []
    for path, write in extras:
        if path:
            try:
                _write(path, write)
                written.append(path)
            except MilesProfileError as exc:  # the report is written: say which extra is missing, at the end
                failed.append(str(exc))
    for note in notes:
        echo(f"warning: {note}")
    for report in reports:
        for warning in report.skipped:
            echo(f"warning: {report.run.name}: {warning}")
    echo(f"report written to {output} ({output.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s)")
    for extra in written:
        echo(f"also wrote {extra}")
    for line in _verdict_lines(reports):
        echo(line)
    for report in reports:
        for line in forecast_lines(report.run):
            echo(f"{report.run.name}: {line}")
    if failed:  # exit 2 even though the HTML exists: a CI step reading the missing file must not go on
        raise MilesProfileError(f"{'; '.join(failed)} (the report {output} was written)")
    code = exit_code_of(verdicts, options.strict)
    overall = overall_of(verdicts)
    why = "" if overall != "warn" else (" under --strict" if options.strict else "; --strict exits 1 on a WARN")
    echo(f"verdict: {STATUS_LABEL[overall]} (exit code {code}: checks and gates of "
         f"{len(verdicts)} run{'s' if len(verdicts) > 1 else ''}{why})")
    return code


def _load_baseline(path: str):
    """The one run at `path` (a run directory or the log dir above one run)."""
    runs, _ = load_inputs([path], lazy=True)  # the gate reads phase summaries: a fleet's samples stay on disk
    if len(runs) > 1:
        raise MilesProfileError(f"--baseline {path} holds {len(runs)} runs; pass one run directory")
    return runs[0]


def _png_figure(report):
    """The one timeline, or for a fleet run its heatmap."""
    if report.figure is not None or report.fleet is None or report.fleet.matrix is None:
        return report.figure
    return fleet_heatmap(report.fleet.matrix)


def _write(path, write: Callable[[], object]) -> None:
    """Run one writer; an OSError names the file being written (e.g. `--json /dev/full`), not another.
    A link or FIFO at `path` (a log dir someone sent) is refused before anything is written."""
    from miles_profile.safe_output import check_output_path
    check_output_path(path)
    try:
        write()
    except OSError as exc:
        raise MilesProfileError(f"cannot write {path}: {exc.strerror or exc}") from None
