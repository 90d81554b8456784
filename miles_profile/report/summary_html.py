"""The summary block at the top of a run's report (report/summary.py rendered as HTML): the verdict,
where the peak is, each offload kind's freed against declared, the failing checks first. Every span is
a link that zooms the run's timelines to exactly that window.

    summary_html(summary, t0, section_id) -> str
    SUMMARY_CSS, SUMMARY_SCRIPT
"""
from __future__ import annotations

import html

from miles_profile.runmodel.peak import iteration_text
from miles_profile.runmodel.series import GiB
from miles_profile.report.summary import Summary

_BADGE = {"pass": "pass", "fail": "fail", "warn": "warn", "n/a": "na", "too small to judge": "small"}
_WORD = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "n/a": "N/A", "too small to judge": "TOO SMALL TO JUDGE"}


def _e(x) -> str:
    return html.escape(str(x))


def _zoom(span, t0: float, section_id: str, text: str) -> str:
    """A link that zooms every timeline of the run's section to `span` (Unix seconds)."""
    if not span:
        return _e(text)
    a, b = span[0] - t0, span[1] - t0
    return (f'<a href="#{_e(section_id)}" class="zoom-link" data-section="{_e(section_id)}" '
            f'data-t0="{a:.4f}" data-t1="{b:.4f}" title="show {a:.2f}–{b:.2f} s on the timeline">{_e(text)}</a>')


def _peak_html(summary: Summary, t0: float, section_id: str) -> str:
    peak = summary.peak
    if peak is None:
        return '<div class="fact"><div class="fact-label">Highest peak</div><div class="fact-value">–</div>' \
               '<div class="fact-detail">no memory samples</div></div>'
    where = (f"{peak.phase} · {iteration_text(peak.iteration)}" if peak.phase else peak.outside)
    at = f"at {peak.t - t0:.2f} s"
    share = f"{peak.share:.0%} of {peak.total / GiB:.1f} GiB {peak.limit}".rstrip() if peak.total else "device total unknown"
    if summary.headroom is not None:  # the headroom check's figure: one verdict, not a second computation
        h = summary.headroom
        share += (f' · <b>{h.left / GiB:.2f} GiB left</b> <span class="muted" title="{_e(h.text())}">'
                  f'({_e(h.series)})</span>')
    link = _zoom(peak.span or (peak.t - 0.5, peak.t + 0.5), t0, section_id, f"{where}, {at}")
    return (f'<div class="fact" id="{_e(section_id)}-peak" data-peak-bytes="{int(peak.bytes)}" '
            f'data-peak-phase="{_e(peak.phase or "")}" data-peak-iteration="{"" if peak.iteration is None else peak.iteration}">'
            f'<div class="fact-label">Highest peak · {_e(peak.where)}</div>'
            f'<div class="fact-value">{peak.bytes / GiB:.2f} GiB</div>'
            f'<div class="fact-detail">{link}</div><div class="fact-detail">{share}</div>'
            f'<div class="fact-detail muted">{_e(peak.series)}</div></div>')


def _offloads_html(summary: Summary, t0: float, section_id: str) -> str:
    if not summary.offloads:
        return ('<div class="fact"><div class="fact-label">Offloads</div>'
                '<div class="fact-detail muted">no offload_* phase in this run</div></div>')
    rows = []
    for kind in summary.offloads:
        state = "fail" if kind.failed else ("pass" if kind.count > kind.too_small + kind.not_judged else
                                            ("too small to judge" if kind.too_small else "n/a"))
        counts = [f"{kind.failed} failed"] if kind.failed else []
        counts += [f"{kind.too_small} too small"] if kind.too_small else []
        counts += [f"{kind.not_judged} not judged"] if kind.not_judged else []
        freed = kind.freed_text()
        worst = _zoom(kind.worst.span, t0, section_id, kind.worst.message) if kind.worst is not None and kind.failed else ""
        rows.append(f'<tr data-offload="{_e(kind.name)}" data-status="{_e(state)}"><td><b>{_e(kind.name)}</b> ×{kind.count}</td>'
                    f'<td class="num">{freed}</td><td><span class="badge {_BADGE[state]}">{_WORD[state]}</span> '
                    f'<span class="small muted">{_e(", ".join(counts))}</span><div class="small">{worst}</div></td></tr>')
    return ('<div class="fact fact-wide"><div class="fact-label">Did every offload work?</div>'
            '<table class="offloads"><thead><tr><th>offload</th><th>freed / declared (median)</th><th>verdict</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def _failing_html(summary: Summary, t0: float, section_id: str) -> str:
    if not summary.failing:
        return ""
    items = "".join(f'<li data-check="{_e(c.name)}"><b>{_e(c.name)}</b>: '
                    f'{_zoom(f.span if f and f.span else c.span, t0, section_id, f.message if f else c.summary)}</li>'
                    for c, f in summary.failing)
    return f'<div class="failing"><div class="fact-label">Failing checks (click to see the window)</div><ol>{items}</ol></div>'


def _warning_html(summary: Summary, t0: float, section_id: str) -> str:
    """Checks whose evidence is ambiguous (WARN): after the failures, the same links."""
    if not summary.warning:
        return ""
    items = "".join(f'<li data-check="{_e(c.name)}"><b>{_e(c.name)}</b>: '
                    f'{_zoom(f.span if f and f.span else c.span, t0, section_id, f.message if f else c.summary)}</li>'
                    for c, f in summary.warning)
    return (f'<div class="warning"><div class="fact-label">Unsure (WARN: exit 0, 1 with --strict)</div>'
            f'<ol>{items}</ol></div>')


def _killed_html(summary: Summary, t0: float, section_id: str) -> str:
    """Killed processes first (verdicts/oom.py): who, how, where, what grew before, the cgroup limit."""
    if not summary.killed:
        return ""
    items = []
    for f in summary.killed:
        grew = "".join(f'<li>{_e(g["what"])}: +{g["growth"] / GiB:.3f} GiB '
                       f'<span class="muted">({g["from"] / GiB:.3f} → {g["to"] / GiB:.3f} GiB)</span></li>'
                       for g in f.numbers.get("grew", []))
        items.append(f'<li data-cause="{_e(f.cause or "")}" data-pid="{_e(f.numbers.get("pid"))}">'
                     f'{_zoom(f.span, t0, section_id, f.message)}'
                     f'{f"<ul class=small>{grew}</ul>" if grew else ""}</li>')
    return (f'<div class="killed" id="{_e(section_id)}-killed"><div class="fact-label">Killed '
            f'(the last {summary.killed[0].numbers.get("window_s", 10):.0f} s before: click to see them)</div>'
            f'<ol>{"".join(items)}</ol></div>')


def _command_failed_html(summary: Summary, section_id: str) -> str:
    text = summary.exit_text()
    if text is None:
        return ""
    return (f'<div class="command-exit" id="{_e(section_id)}-command-exit" data-code="{summary.command_exit}">'
            f'<b>Command failed:</b> {_e(text)}</div>')


def summary_html(summary: Summary, t0: float, section_id: str) -> str:
    cls = _BADGE.get(summary.status, "na")
    return (f'<div class="summary summary-{cls}" id="{_e(section_id)}-summary" data-status="{_e(summary.status)}">'
            f'{_killed_html(summary, t0, section_id)}{_command_failed_html(summary, section_id)}'
            f'<div class="summary-verdict"><span class="badge big {cls}">{_WORD.get(summary.status, summary.status)}</span>'
            f' <span class="muted small summary-coverage">{_e(summary.coverage)}</span>'
            + (f'<div class="tagged-by">{_e(summary.tagged_by)}</div>' if summary.tagged_by else '') + '</div>'
            f'<div class="facts-row">{_peak_html(summary, t0, section_id)}{_offloads_html(summary, t0, section_id)}</div>'
            f'{_failing_html(summary, t0, section_id)}{_warning_html(summary, t0, section_id)}</div>')


SUMMARY_CSS = """
.summary{background:#fff;border:1px solid #dde1e7;border-left:6px solid #8a93a3;padding:10px 14px;margin:8px 0 14px}
.summary-fail{border-left-color:#c62828}.summary-pass{border-left-color:#2e8540}.summary-small{border-left-color:#b07d12}.summary-warn{border-left-color:#e65100}
.summary-verdict{margin-bottom:6px}.badge.big{font-size:15px;padding:3px 12px}
.facts-row{display:flex;gap:18px;flex-wrap:wrap;align-items:flex-start}
.fact{min-width:260px}.fact-wide{flex:1}.fact-label{font-size:12px;color:#6b7385;text-transform:uppercase;letter-spacing:.03em}
.fact-value{font-size:26px;font-weight:700;font-variant-numeric:tabular-nums}.fact-detail{font-size:13px}
table.offloads{width:auto;min-width:480px;font-size:13px} table.offloads td.num{text-align:right;font-variant-numeric:tabular-nums}
.failing ol{margin:4px 0 0 18px;padding:0} .failing li{margin:2px 0;color:#b71c1c}
.warning ol{margin:4px 0 0 18px;padding:0} .warning li{margin:2px 0;color:#bf4300} .badge.warn{background:#e65100}
.killed{background:#fdecea;border:1px solid #c62828;padding:6px 10px;margin-bottom:8px}
.killed ol{margin:4px 0 0 18px;padding:0} .killed>ol>li{margin:2px 0;color:#b71c1c;font-weight:600}
.killed ul{font-weight:400;color:#333}
.command-exit{background:#fff4e5;border:1px solid #b07d12;padding:6px 10px;margin-bottom:8px;color:#6d4c00}
a.zoom-link{color:#1f4e99;text-decoration:underline dotted;cursor:pointer}
"""

# A click zooms every Plotly figure of the run's section (its timeline, or its fleet's lanes) to the window.
SUMMARY_SCRIPT = """
document.addEventListener('click', function (ev) {
  var a = ev.target.closest && ev.target.closest('a.zoom-link');
  if (!a || !window.Plotly) return;
  ev.preventDefault();
  var section = document.getElementById(a.dataset.section);
  var t0 = parseFloat(a.dataset.t0), t1 = parseFloat(a.dataset.t1), pad = (t1 - t0) * 0.02;
  // time axes only: a bar chart of categories (the ledger by phase) keeps its own x axis
  var figs = Array.prototype.filter.call(section ? section.querySelectorAll('.js-plotly-plot') : [], function (fig) {
    var x = fig._fullLayout && fig._fullLayout.xaxis;
    return x && x.type !== 'category';
  });
  figs.forEach(function (fig) {
    var update = {};
    Object.keys(fig.layout || {}).forEach(function (k) {
      if (/^xaxis\\d*$/.test(k)) update[k + '.range'] = [t0 - pad, t1 + pad];
    });
    if (!Object.keys(update).length) update['xaxis.range'] = [t0 - pad, t1 + pad];
    Plotly.relayout(fig, update);
  });
  if (figs.length) figs[0].scrollIntoView({behavior: 'instant', block: 'center'});
});
"""
