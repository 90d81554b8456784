"""The regression gate's verdict as a small HTML table for the report (report/regression.py)."""
from __future__ import annotations

import html

from miles_profile.sizes import format_size

_BADGE = {"pass": ("pass", "PASS"), "fail": ("fail", "FAIL"), "warn": ("warn", "WARN"), "n/a": ("na", "N/A")}
ROW_LIMIT = 50


def regression_html(results) -> str:
    """One section for the RegressionResults of every run against the baseline."""
    if not results:
        return ""
    parts = ['<section id="baseline"><h2>Against the baseline</h2>']
    for result in results:
        cls, text = _BADGE[result.status]
        e = html.escape
        parts.append(f'<h3>{e(result.current)} vs {e(result.baseline)} <span class="badge {cls}">{text}</span></h3>'
                     f'<p class="small">{e(result.summary)}</p>')
        shown = result.regressions or sorted(result.compared, key=lambda c: -c.growth)[:10]
        if shown:
            caption = "regressions" if result.regressions else "largest changes (none over the threshold)"
            rows = "".join(
                f'<tr class="{"check-fail" if c.regressed else ""}"><td>{e(c.where)}</td><td>{e(c.subject)}</td>'
                f'<td>{e(c.memory)}</td><td>{c.stat}</td><td class="num">{e(format_size(c.baseline))}</td>'
                f'<td class="num">{e(format_size(c.current))}</td><td class="num">{c.share * 100:+.1f}%</td></tr>'
                for c in shown[:ROW_LIMIT])
            parts.append(f'<p class="muted small">{caption}, threshold {e(result.thresholds.text)}</p>'
                         '<table class="data baseline"><thead><tr><th>phase</th><th>GPU / process</th><th>memory</th>'
                         '<th>stat</th><th>baseline</th><th>this run</th><th>growth</th></tr></thead>'
                         f'<tbody>{rows}</tbody></table>')
        lines = list(result.not_compared)
        if result.matched_by == "rank":
            lines.insert(0, "GPUs and processes matched by rank: their hosts or GPU UUIDs differ between the runs")
        if result.not_selected:
            lines.append(f"phases not selected (--phase): {', '.join(result.not_selected)}")
        if lines:
            parts.append(f'<details><summary>{len(lines)} note(s): not compared, not selected</summary><ul>' +
                         "".join(f"<li>{html.escape(n)}</li>" for n in lines) + "</ul></details>")
    parts.append("</section>")
    return "".join(parts)
