"""The report's "Forecast vs measured" table (forecast.py's comparison), for a run that stored a plan."""
from __future__ import annotations

import html

from miles_profile.runmodel.forecast import TOLERANCE, compare, outside, stored_plan
from miles_profile.runmodel.series import GiB


def _where(row: dict) -> str:
    return row["device"] if row["process"] == "trainer" else f"{row['device']} ({row['process']})"


def forecast_lines(run) -> list[str]:
    """One line per phase outside the tolerance (for the CLI), or [] (no plan, or every phase within)."""
    found = stored_plan(run)
    if found is None:
        return []
    bad = outside(compare(run, found[1], found[0]))
    return [f"forecast outside {TOLERANCE:.0%}: {r['phase']} on {_where(r)}: forecast "
            f"{r['forecast'] / GiB:.3f} GiB, measured {r['measured'] / GiB:.3f} GiB ({r['basis']}), "
            f"error {r['error']:+.1%}" for r in bad.to_dict("records")]


def forecast_html(run, table_id: str = "forecast") -> str:
    found = stored_plan(run)
    if found is None:
        return ""
    comparison = compare(run, found[1], found[0])
    if comparison.empty:
        return ""
    rows = []
    for r in comparison.to_dict("records"):
        err = "–" if r["error"] != r["error"] else f"{r['error']:+.1%}"
        cls = ' class="check-fail"' if r["outside"] else ""
        note = "" if r["judged"] else ' <span class="muted small">(not judged)</span>'
        measured = "–" if r["measured"] != r["measured"] else f"{r['measured'] / GiB:.3f}"
        rows.append(f"<tr{cls}><td>{html.escape(r['phase'])}</td><td>{_where(r)}</td><td>{r['basis']}</td>"
                    f'<td class="num">{r["forecast"] / GiB:.3f}</td><td class="num">{measured}</td>'
                    f'<td class="num">{err}{note}</td></tr>')
    bad = outside(comparison)
    judged = int(comparison["judged"].sum())
    listing = (f'<p class="pass-text">Every judged phase ({judged}) within {TOLERANCE:.0%} of its forecast.</p>'
               if bad.empty and judged else
               '<p class="muted">Nothing judged: no allocator here, and the heap was not sampled (record --heap).</p>'
               if bad.empty else
               f'<div class="warn" id="{table_id}-outside"><b>Outside {TOLERANCE:.0%}</b><ul>' +
               "".join(f"<li>{html.escape(r['phase'])} on {_where(r)}: forecast {r['forecast'] / GiB:.3f} GiB, "
                       f"measured {r['measured'] / GiB:.3f} GiB ({r['error']:+.1%})</li>"
                       for r in bad.to_dict("records")) + "</ul></div>")
    return f"""<h3>Forecast vs measured</h3>
  <p class="muted small">The plan the trainer stored before allocating (python -m trainer.train --plan): cuda is
  compared with the allocator's true peak; host with glibc's heap in use above the level before the trainer allocated
  (basis heap, recorded with record --heap; sampled, no true peak), else shown beside the process's RSS growth since its
  first sample, which holds libraries and retained heap too, so it is not judged (docs/forecast.md).</p>
  {listing}
  <table id="{table_id}" class="data"><thead><tr><th>phase</th><th>device</th><th>basis</th><th>forecast GiB</th>
  <th>measured GiB</th><th>error</th></tr></thead><tbody>{"".join(rows)}</tbody></table>"""
