"""The report's "What you could keep on the GPU" table (report/whatif.py), inside the section of
report/transitions_html.py.

    whatif_html(run, ledger_frame, suffix) -> str
"""
from __future__ import annotations

import html

import pandas as pd

from miles_profile.report.series import GiB
from miles_profile.report.whatif import ALL, DOES_NOT_FIT, FITS, NO_HEADROOM, whatif_of

_CLASS = {FITS: "pass-text", NO_HEADROOM: "small-text", DOES_NOT_FIT: "fail-text"}


def _e(x) -> str:
    return html.escape(str(x))


def _gib(v) -> str:
    return "–" if v is None or v != v else f"{v / GiB:.2f}"


def whatif_html(run, ledger_frame: pd.DataFrame | None, suffix: str = "") -> str:
    result = whatif_of(run, ledger_frame)
    if result.empty:
        return ""
    rows = []
    for r in result.table.to_dict("records"):
        what = "everything it freed" if r["category"] == ALL else r["category"]
        rows.append(
            f'<tr data-offload="{_e(r["offload"])}" data-category="{_e(r["category"])}" data-fits="{_e(r["fits"])}">'
            f'<td>{_e(r["offload"])}</td><td>{_e(what)}</td><td class="num">{_gib(r["freed"])}</td>'
            f'<td>{_e(r["peak_phase"] or "–")}</td><td class="num">{_gib(r["measured_peak"])}</td>'
            f'<td class="num"><b>{_gib(r["whatif_peak"])}</b></td>'
            f'<td class="{_CLASS.get(r["fits"], "na-text")}">{_e(r["fits"])}</td>'
            f'<td>{_e(r["onload"])}</td><td class="num">{r["round_trip_s"]:.3f}</td></tr>')
    total = ("device total unknown" if result.total is None else
             f"{result.total / GiB:.1f} GiB total, headroom threshold {result.threshold / GiB:.1f} GiB")
    return f"""<h4>What you could keep on the GPU</h4>
  <p class="muted small">For each offload and each category it freed (from the ledger): the highest peak of the phases
  that ran while those bytes were away, and that peak had they stayed ({_e(result.series)}; {total}; the headroom
  check's threshold). Round trip: the offload's seconds plus the onload's that brought them back, per iteration.
  How it was checked against measured H200 configurations: docs/transitions.md.</p>
  <table id="whatif-table{suffix}" class="data meter"><thead><tr><th>offload</th><th>kept</th><th>freed GiB</th>
  <th>highest phase</th><th>its peak GiB</th><th>peak if kept GiB</th><th>fits?</th><th>brought back by</th>
  <th>round trip s</th></tr></thead><tbody>{"".join(rows)}</tbody></table>"""
