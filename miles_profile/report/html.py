"""The self-contained HTML report: one file, plotly.js inlined (plotly_bundle.py: which build), opens offline.

Public API:

    RunReport(run, verdict, phases, phases_by_iteration, figure, skipped)   # .checks: verdict.checks
    build_run_report(run, *, thresholds=None, check=True, max_points=100_000, selection=None,
                     baseline=None, ...) -> RunReport      # its verdict from verdicts/engine.judge, once
    render_html(reports, *, comparison=None, notes=()) -> str
    write_html(path, reports, *, comparison=None, notes=()) -> Path

The report renders the verdict and judges nothing: the header's overall verdict is the exit code's
(checks and --baseline gates of every run), each run's badge its RunVerdict's status.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from miles_profile.verdicts import checks as checks_mod
from miles_profile.verdicts.engine import RunVerdict, exit_code_for, judge, overall_of
from miles_profile.verdicts.types import TOO_SMALL
from miles_profile.report.figures import run_start, timeline_figure
from miles_profile.report.run_fold import DEFER_SCRIPT, FOLD_SCRIPT, fold_close, fold_open
from miles_profile.report.forecast_html import forecast_html
from miles_profile.runmodel.series import GiB, first_and_last_t, sample_columns, sample_count
from miles_profile.report.summary import Summary, summarize
from miles_profile.report.summary_html import SUMMARY_CSS, SUMMARY_SCRIPT, summary_html
from miles_profile.report.transitions_html import SECTION_CSS as MOVING_CSS, transitions_html
from miles_profile.report.stacks_html import stacks_html
from miles_profile.runmodel.stats import phase_instances, phase_table, stat_metrics
from miles_profile.safe_output import write_text_nofollow
from miles_profile.logdir.reader import with_samples
from miles_profile.report import fleet_report
from miles_profile.report.figures import phase_color
from miles_profile.report.fleet_report import ZOOM_SCRIPT
from miles_profile.report.fleet_report import fleet_html
from miles_profile.report.fleet_report import report_data
from miles_profile.report import ledger_beside
from miles_profile.report.ledger_html import ledger_html
from miles_profile.report.miles_series import miles_series_html
from miles_profile.report.plotly_bundle import figure_div, plotly_js

TABLE_ROW_LIMIT = 200
_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


@dataclass
class RunReport:
    run: object
    verdict: RunVerdict
    phases: pd.DataFrame
    phases_by_iteration: pd.DataFrame
    figure: go.Figure | None
    skipped: list[str] = field(default_factory=list)
    fleet: object | None = None  # fleet_report.FleetView for a run of many processes
    ledger: pd.DataFrame | None = None  # runmodel/ledger.py; a fleet's: the processes of the lanes drawn

    @property
    def checks(self) -> list[checks_mod.CheckResult]:
        return self.verdict.checks

    @cached_property
    def summary(self) -> Summary:
        """The first screen (report/summary.py), from this verdict: the HTML, the CLI and --json render it."""
        v = self.verdict
        return summarize(self.run, v.checks, v.status, v.coverage if v.checked and v.checks else "")


def build_run_report(run, *, thresholds: checks_mod.Thresholds | None = None, check: bool = True,
                     max_points: int = 100_000, progress=None, lanes: str | None = None,
                     fleet_thresholds=None, selection=None, baseline=None, baseline_thresholds=None,
                     baseline_by_iteration: bool = False) -> RunReport:
    """Statistics, the verdict and the timeline of one run. `progress`: a tqdm bar advanced by 4 steps.
    A run of many processes (fleet_report.is_fleet) gets the fleet view instead of the one timeline
    (`lanes` picks its per-GPU timelines: fleet.select_lanes; default: all up to 8, else worst:8), and
    the engine judges it per process plus the fleet checks on the view's tables. `selection`,
    `baseline*`: verdicts/engine.judge's."""

    def step(what: str) -> None:
        if progress is not None:
            progress.set_postfix_str(f"{run.name}: {what}", refresh=False)
            progress.update()

    view = None
    if fleet_report.is_fleet(run):
        view = fleet_report.build_fleet(run, lanes, max_points=max_points)
        run = view.run
    elif not sample_count(run) and getattr(run, "sample_pids", None) is not None:
        run = with_samples(run)
    phase_instances(run)
    step("phase statistics")
    side = ledger_beside.start(run, view)  # a fleet's ledger and meter on the other core while this one judges
    try:
        verdict = judge(run, thresholds=thresholds, fleet_thresholds=fleet_thresholds, selection=selection,
                        baseline=baseline, baseline_thresholds=baseline_thresholds,
                        baseline_by_iteration=baseline_by_iteration, check=check,
                        fleet=None if view is None or view.matrix is None else (view.table, view.matrix))
        step("checks")
        figure = None if view is not None else timeline_figure(run, max_points=max_points)
        step("timeline reduced")
        report = RunReport(run, verdict, phase_table(run), phase_table(run, by_iteration=True), figure,
                           list(run.warnings), view, ledger_beside.collect(side, run, view))
    finally:  # an error or ^C above: the child is killed and reaped, never left running
        if side is not None:
            side.cancel()
    step("tables")
    return report


# -- formatting --------------------------------------------------------------------------------
def _total_text(total) -> str:
    # An imported run (Miles' dashboard) may not know a device's total: say so, never "0.0 GiB".
    return f"{total / GiB:.1f} GiB" if isinstance(total, (int, float)) else "total unknown"


def _e(x) -> str:
    return html.escape(str(x))


def _gib_cell(v) -> str:
    if v is None or pd.isna(v):
        return '<td class="num muted">–</td>'
    return f'<td class="num" title="{int(v):,} B">{int(v) / GiB:.3f}</td>'


def _phase_table_html(run, table: pd.DataFrame, by_iteration: bool, table_id: str) -> str:
    if table.empty:
        return '<p class="muted">No phases were recorded in this run.</p>'
    metrics = stat_metrics(run)
    head1 = ('<tr><th rowspan="2">iteration</th>' if by_iteration else "<tr>") + \
        '<th rowspan="2">phase</th><th rowspan="2">count</th><th rowspan="2">total s</th><th rowspan="2">mean s</th>' + \
        "".join(f'<th colspan="3">{_e(m.label)} (GiB)</th>' for m in metrics) + "</tr>"
    head2 = "<tr>" + "<th>floor</th><th>mean</th><th>peak</th>" * len(metrics) + "</tr>"
    rows = []
    note = ""
    if len(table) > TABLE_ROW_LIMIT:  # thousands of iterations: the head and tail here, all of it via --csv
        half = TABLE_ROW_LIMIT // 2
        note = (f'<p class="muted small">{len(table):,} rows: showing the first and last {half}; '
                "write them all with --csv.</p>")
        table = table.iloc[list(range(half)) + list(range(len(table) - half, len(table)))]
    for r in table.to_dict("records"):
        cells = [f'<td class="num">{"setup" if r["iteration"] < 0 else r["iteration"]}</td>'] if by_iteration else []
        cells += [f'<td><span class="swatch" style="background:{_color(r["name"])}"></span>{_e(r["name"])}</td>',
                  f'<td class="num">{r["count"]}</td>', f'<td class="num">{r["total_s"]:.3f}</td>',
                  f'<td class="num">{r["mean_s"]:.3f}</td>']
        for m in metrics:
            cells += [_gib_cell(r[f"{m.name}_floor"]), _gib_cell(r[f"{m.name}_mean"]),
                      f'<td class="num peak"{_gib_cell(r[f"{m.name}_peak"])[3:]}']
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (note + f'<table id="{table_id}" class="data"><thead>{head1}{head2}</thead><tbody>' + "".join(rows) +
            "</tbody></table>")


def _color(name: str) -> str:
    return phase_color(str(name))


# One badge per status, the same words as the CLI's (engine.STATUS_LABEL) but "too small" spelled out.
_BADGE = {"pass": ("pass", "PASS"), "fail": ("fail", "FAIL"), "warn": ("warn", "WARN"), "n/a": ("na", "n/a"),
          TOO_SMALL: ("small", "TOO SMALL")}


def _checks_html(results: list[checks_mod.CheckResult], t0: float, table_id: str) -> str:
    if not results:
        return '<p class="muted">Checks were not run (--no-check).</p>'
    rows = []
    # Checks that cannot apply (an RL check on a plain training loop) fold into one row when there are
    # several, as the CLI folds them into one line: the run's own findings stay on the first screen.
    not_applicable = [r for r in results if r.status == "n/a"]
    if len(not_applicable) >= 2:
        results = [r for r in results if r.status != "n/a"]
    for r in results:
        cls, text = _BADGE[r.status]
        span = "–" if r.span is None else f"{r.span[0] - t0:.2f} s – {r.span[1] - t0:.2f} s"
        details = ""
        judged = [f for f in r.findings if f.status != "n/a"] or r.findings
        if len(judged) > 1 or (judged and judged[0].message != r.summary):
            items = "".join(f'<li class="{_BADGE[f.status][0]}-text">{_e(_BADGE[f.status][1])}: {_e(f.message)}</li>'
                            for f in judged[:200])
            more = f"<li>… {len(judged) - 200} more</li>" if len(judged) > 200 else ""
            details = f"<details><summary>{len(judged)} findings</summary><ul>{items}{more}</ul></details>"
        rows.append(
            f'<tr class="check-{cls}" data-check="{_e(r.name)}" data-status="{_e(r.status)}"><td><b>{_e(r.title)}</b>'
            f'<div class="muted small">{_e(r.name)}</div></td>'
            f'<td><span class="badge {cls}">{text}</span></td>'
            f"<td>{_e(r.summary)}{details}</td><td class=\"nowrap\">{_e(span)}</td>"
            f'<td class="small">{_e(r.explanation)}<div class="muted">judged on: {_e(r.series or "–")}</div></td></tr>')
    if len(not_applicable) >= 2:
        rows.append(_not_applicable_row(not_applicable))
    return (f'<table id="{table_id}" class="checks"><thead><tr><th>check</th><th>verdict</th><th>numbers</th>'
            f"<th>time span</th><th>what it means</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _not_applicable_row(results: list[checks_mod.CheckResult]) -> str:
    """One row for the checks that cannot apply to this run: their names, and each one's reason folded."""
    names = ", ".join(r.name for r in results)
    reasons = "".join(f'<li data-check="{_e(r.name)}"><b>{_e(r.title)}</b> ({_e(r.name)}): {_e(r.summary)}</li>'
                      for r in results)
    return (f'<tr class="check-na" data-check="not_applicable" data-status="n/a" data-checks="{_e(names)}">'
            f'<td><b>Cannot apply to this run</b><div class="muted small">{len(results)} checks</div></td>'
            f'<td><span class="badge na">n/a</span></td>'
            f'<td>{_e(names)}<details><summary>why, check by check</summary><ul>{reasons}</ul></details></td>'
            f'<td class="nowrap">–</td><td class="small">Each looks for something this run did not do or record '
            f'(why: above): nothing was judged, which is not a pass.</td></tr>')


def _facts_html(run) -> str:
    meta = run.meta
    command = meta.get("command")
    command = " ".join(map(str, command)) if isinstance(command, list) else (command or "–")
    start = run_start(run)
    span = first_and_last_t(run)  # the samples are in time order: the last row's time is the latest
    duration = (span[1] - start) if span is not None else float("nan")
    devices = ", ".join(f"GPU {d.get('index')}: {d.get('name') or '?'} ({_total_text(d.get('total'))})"
                        for d in run.devices) or "no GPU seen (NVML absent): host memory only"
    processes = ", ".join(f"pid {p.get('pid')} ({p.get('role', '?')}, rank {p.get('rank', 0)})"
                          for p in run.processes[:16]) or "–"
    if len(run.processes) > 16:
        processes += f", … {len(run.processes) - 16} more ({len(run.processes)} in all)"
    interval = meta.get("interval_ms")
    when = _dt.datetime.fromtimestamp(start).strftime("%Y-%m-%d %H:%M:%S") if start > 1e8 else "–"
    # Imports (Miles' CSV, Miles' dashboard) have levels only: no peak column, no claim of true peaks.
    peaks = ("true peaks between samples are kept" if any(str(c).endswith("_peak") for c in sample_columns(run))
             else "sampled levels only: a peak between two samples is not seen")
    rows = [("run", str(run.path)), ("command", command), ("host", meta.get("host", "–")), ("started", when),
            ("duration", f"{duration:.1f} s" if np.isfinite(duration) else "–"),
            ("sampling interval", f"{interval:g} ms ({peaks})" if interval else "–"),
            ("samples", f"{sample_count(run):,}"), ("phases", f"{len(run.phases):,}"),
            ("devices", devices), ("processes", processes)]
    return '<table class="facts">' + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


def _run_section(report: RunReport, k: int, single: bool) -> str:
    run = report.run
    t0 = run_start(run)
    cls, text = _BADGE[report.verdict.status]
    skipped = ""
    if report.skipped:
        skipped = ('<div class="warn"><b>Read with repairs</b> — these parts of the log were skipped or fixed:<ul>' +
                   "".join(f"<li>{_e(w)}</li>" for w in report.skipped) + "</ul></div>")
    suffix = "" if single else f"-{k}"
    if report.fleet is not None:
        fleet = f'<div id="fleet{suffix}">{fleet_html(report.fleet, k, t0)}</div>'
        timeline = ""
        per_phase_note = ('<p class="muted small">Over the processes whose samples were read (those in the lanes '
                          'shown); the fleet view above covers every process.</p>')
    else:
        figure = figure_div(report.figure, div_id=f"timeline-{k}", config=_CONFIG)
        fleet, per_phase_note = "", ""
        timeline = f"""<h3>Timeline</h3>
  <p class="muted small">Drag to zoom, double-click to reset. Every phase's peak and the global peak are drawn exactly
  as recorded; the red envelope is the true peak between samples. Exact bytes: hover a table cell.</p>
  <div class="figure">{figure}</div>"""
    timeline += miles_series_html(run, suffix, align_to=report.figure)
    if report.ledger is not None:  # also for a few processes in the fleet view (an actor and its engine server)
        timeline += ledger_html(report.ledger, t0, suffix, align_to=report.figure)
    # First screen: the summary (verdict, peak, offloads, failing checks), then the memory itself; the
    # checks' details, what moving memory cost and the run's facts follow.
    return f"""
<section class="run" id="run{suffix}">
  <h2>{_e(run.name)}{"" if report.verdict.checked else f' <span class="badge {cls}">{text}</span>'}</h2>
  {summary_html(report.summary, t0, f"run{suffix}") if report.verdict.checked else ""}
  {fold_open(single)}
  {fleet}
  {skipped}
  {timeline}
  <h3>Checks</h3>
  {_checks_html(report.checks, t0, "checks" + suffix)}
  {transitions_html(run, report.ledger, suffix)}
  {stacks_html(run, suffix)}
  <details class="run-facts"><summary>Run details (command, host, devices, processes)</summary>{_facts_html(run)}</details>
  <h3>Per phase</h3>{per_phase_note}
  {_phase_table_html(run, report.phases, False, "phases" + suffix)}
  <details><summary>Per iteration</summary>
  {_phase_table_html(run, report.phases_by_iteration, True, "phases-by-iteration" + suffix)}</details>
  {forecast_html(run, "forecast" + suffix)}
  {fold_close(single)}
</section>"""


_CSS = """
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1400px;margin:0 auto;padding:20px 28px 60px}
h1{font-size:22px;margin:6px 0 2px} h2{font-size:19px;margin:28px 0 10px;border-bottom:1px solid #dde1e7;padding-bottom:6px}
h3{font-size:15px;margin:22px 0 8px;color:#3a4354}
.muted{color:#6b7385}.small{font-size:12px}.nowrap{white-space:nowrap}
table{border-collapse:collapse;background:#fff;border:1px solid #dde1e7}
th,td{padding:5px 9px;border-bottom:1px solid #eceff3;text-align:left;vertical-align:top}
thead th{background:#eef1f5;font-weight:600;font-size:12px;text-align:center}
table.facts th{background:#eef1f5;font-weight:600;width:150px} table.facts td{font-family:ui-monospace,Menlo,monospace;font-size:12px;word-break:break-all}
table.checks{width:100%} table.checks td:nth-child(3){width:38%}
table.data td.num{text-align:right;font-variant-numeric:tabular-nums;font-family:ui-monospace,Menlo,monospace;font-size:12px}
td.peak{font-weight:600}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:700;color:#fff;vertical-align:middle}
.badge.pass{background:#2e8540}.badge.fail{background:#c62828}.badge.na{background:#8a93a3}.badge.small{background:#b07d12}.badge.warn{background:#e65100}
tr.check-fail{background:#fff4f4} .fail-text{color:#b71c1c} .pass-text{color:#2e7d32} .na-text{color:#6b7385} .small-text{color:#8a6100} tr.check-warn{background:#fff8ec} .warn-text{color:#bf4300}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
.figure{background:#fff;border:1px solid #dde1e7;padding:4px}
.warn{background:#fff8e1;border:1px solid #f3d27a;padding:8px 12px;margin:10px 0}
details{margin:6px 0} summary{cursor:pointer;color:#33507a}
.verdict{font-size:15px;margin:8px 0 0}
h4{font-size:13px;margin:16px 0 6px;color:#3a4354} .lane{margin:10px 0} table.outliers td.num{text-align:right}
"""


def _overall_coverage(reports, single: bool) -> str:
    """One run: which checks it judged. Several: each run named with how many (its section lists them):
    nine runs' lists of check names in a row read as one list of no run's."""
    if single:
        return "; ".join(r.verdict.coverage for r in reports if r.verdict.checks)
    judged = [f"{r.run.name}: {r.verdict.coverage_count}" for r in reports if r.verdict.checks]
    return "· per run: " + " · ".join(judged) if judged else ""


def render_html(reports: list[RunReport], *, comparison: str | None = None, notes: tuple[str, ...] = (),
                extra: str = "") -> str:
    """`extra`: HTML sections placed before the comparison (e.g. the baseline gate, gate_html.py)."""
    single = len(reports) == 1
    title = f"miles-profile: {reports[0].run.name}" if single else f"miles-profile: {len(reports)} runs compared"
    overall = overall_of([r.verdict for r in reports])  # checks and gates: what the exit code says
    cls, text = _BADGE[overall]
    note_html = "".join(f'<div class="warn">{_e(n)}</div>' for n in notes)
    nav = ""
    if not single:
        nav = "<p>Runs: " + " · ".join(f'<a href="#run-{k}">{_e(r.run.name)}</a>' for k, r in enumerate(reports)) + "</p>"
    body = "".join(_run_section(r, k, single) for k, r in enumerate(reports))
    comparison_html = f'<section id="comparison"><h2>Comparison by phase</h2>{comparison}</section>' if comparison else ""
    generated = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{_CSS}{SUMMARY_CSS}{MOVING_CSS}</style>
<script type="text/javascript">{plotly_js(extra + comparison_html + body)}</script>
{"" if single else DEFER_SCRIPT}
</head><body><main>
<h1>{_e(title)}</h1>
<div class="muted small">memory report written {generated} by python -m miles_profile.visualize · GiB = 1024³ bytes</div>
<p class="verdict">Overall: <span class="badge {cls}" id="overall" data-status="{_e(overall)}">{text}</span>
<span class="muted small" id="overall-exit">exit code {exit_code_for(overall)}{" (1 with --strict)" if overall == "warn" else ""}</span>
<span class="muted small" id="overall-coverage">{_e(_overall_coverage(reports, single))}</span></p>
{_failing_html(reports, single)}{note_html}{nav}{extra}{comparison_html}{body}
<script type="application/json" id="report-data">{_report_data(reports, overall)}</script>
<script>{SUMMARY_SCRIPT}</script>
{_zoom_script(reports)}{"" if single else FOLD_SCRIPT}
</main></body></html>
"""


def _failing_html(reports: list[RunReport], single: bool) -> str:
    """Under the overall badge: which run failed which check (or gate), each linked to its checks table,
    so a comparison's first screen says what failed without scrolling past every run."""
    parts = []
    for k, report in enumerate(reports):
        names = [name for name, _ in report.verdict.failures()]
        if names:
            suffix = "" if single else f"-{k}"
            parts.append(f'<a href="#checks{suffix}">{_e(report.run.name)}</a>: '
                         f'{_e(", ".join(dict.fromkeys(names)))}')
    return f'<p class="verdict small" id="overall-failing">failed: {" · ".join(parts)}</p>' if parts else ""


def _report_data(reports: list[RunReport], overall: str) -> str:
    data = {"runs": [r.run.name for r in reports], "overall": overall,
            "exit_code": exit_code_for(overall), "exit_code_strict": exit_code_for(overall, True), "statuses": [r.verdict.status for r in reports]}
    fleets = [r.fleet for r in reports if r.fleet is not None]
    if fleets:
        data["fleet"] = [report_data(f) for f in fleets]
    return json.dumps(data).replace("</", "<\\/")


def _zoom_script(reports: list[RunReport]) -> str:
    if not any(r.fleet is not None for r in reports):
        return ""
    return f"<script>{ZOOM_SCRIPT}</script>"


def write_html(path: str | Path, reports: list[RunReport], *, comparison: str | None = None,
               notes: tuple[str, ...] = (), extra: str = "") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_nofollow(path, render_html(reports, comparison=comparison, notes=notes, extra=extra))
    return path
