"""The report's "What moving memory cost" section, placed after the summary: the share of each step
spent in transitions (a bar per phase kind), the transition meter per phase kind and tag
(report/transitions.py) and the offload what-if (report/whatif_html.py).

    transitions_html(run, ledger_frame, suffix) -> str
    meter_lines(meter) -> list[str]                 # the headline, for a person (CLI, dashboard)
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

from miles_profile.report.phase_style import phase_color
from miles_profile.report.series import GiB
from miles_profile.report.transitions import GB, NO_COPY, Transitions, meter_of

NOT_MEASURED = "ceiling not measured"
LINK_TEXT = {"pinned_d2h": "pinned, device→host", "pinned_h2d": "pinned, host→device",
             "pageable_d2h": "pageable, device→host", "pageable_h2d": "pageable, host→device",
             "device_copy": "device copy", "host_copy": "host memcpy", "disk_write": "disk write",
             "disk_read": "disk read", NO_COPY: NO_COPY}
SECTION_CSS = """
.share-bar{display:flex;height:18px;width:100%;max-width:900px;background:#eef1f5;border:1px solid #dde1e7;margin:4px 0 2px}
.share-bar span{display:block;height:100%}
table.meter td.num{text-align:right;font-variant-numeric:tabular-nums;font-family:ui-monospace,Menlo,monospace;font-size:12px}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _num(v, fmt: str, scale: float = 1.0) -> str:
    if v is None or v != v:
        return '<td class="num muted">–</td>'
    return f'<td class="num">{v / scale:{fmt}}</td>'


def ratio_text(row: dict) -> str:
    if row["link"] == NO_COPY:
        return "no copy"
    if row["ceiling"] != row["ceiling"]:
        return NOT_MEASURED
    return f"{row['ratio']:.2f} of {row['ceiling'] / GB:.1f} GB/s"


def meter_lines(meter: Transitions) -> list[str]:
    """What a person reads first: the share of the step, then each copying link's rate."""
    if meter.empty:
        return []
    lines = []
    if meter.share is not None:
        lines.append(f"moving memory: {meter.share:.0%} of the step ({len(meter.steps)} iterations)")
    for r in meter.by_kind.to_dict("records"):
        if r["link"] == NO_COPY or r["setup"] or r["rate"] != r["rate"]:
            continue
        lines.append(f"{r['phase']} ({r['tags']}): {r['rate'] / GB:.2f} GB/s over {LINK_TEXT.get(r['link'], r['link'])}, "
                     f"{ratio_text(r)}")
    return lines


def _bar(meter: Transitions) -> str:
    loop = meter.by_kind[~meter.by_kind["setup"].astype(bool)]
    segments = "".join(
        f'<span style="width:{100 * r["share_of_step"]:.2f}%;background:{phase_color(str(r["phase"]))}" '
        f'title="{_e(r["phase"])} ({_e(r["tags"])}): {r["share_of_step"]:.1%} of the step"></span>'
        for r in loop.to_dict("records") if r["share_of_step"] == r["share_of_step"] and r["share_of_step"] > 0)
    return f'<div class="share-bar" aria-label="share of the step spent moving memory">{segments}</div>'


def _rate(row: dict) -> str:
    if row["link"] != NO_COPY or row["rate"] != row["rate"]:
        return _num(row["rate"], ".2f", GB)
    # memory given back or taken, nothing copied: how fast, but no transfer rate
    return (f'<td class="num muted" title="bytes released or taken again per second: nothing was copied">'
            f'{row["rate"] / GB:.0f}</td>')


def _ceilings_text(meter: Transitions) -> str:
    if not meter.ceilings:
        return ("No calibration in this log (record --calibrate): every ratio says "
                f"<b>{NOT_MEASURED}</b>; no ceiling is assumed.")
    return "Link ceilings measured on this host (record --calibrate): " + ", ".join(
        f"{_e(LINK_TEXT.get(k, k))} {v / GB:.1f} GB/s" for k, v in meter.ceilings.items()) + "."


def _table(meter: Transitions, table_id: str) -> str:
    rows = []
    for r in meter.by_kind.to_dict("records"):
        when = "setup" if r["setup"] else "loop"
        rows.append(
            f'<tr data-phase="{_e(r["phase"])}" data-link="{_e(r["link"])}" data-setup="{int(bool(r["setup"]))}">'
            f'<td><span class="swatch" style="background:{phase_color(str(r["phase"]))}"></span>{_e(r["phase"])}</td>'
            f'<td>{_e(r["tags"])}</td><td>{when}</td><td class="num">{r["count"]}</td>'
            f'{_num(r["declared"], ".2f", GiB)}{_num(r["measured"], ".2f", GiB)}{_num(r["seconds"], ".3f")}'
            f'{_rate(r)}<td>{_e(LINK_TEXT.get(r["link"], r["link"]))}</td>'
            f'<td class="ratio">{_e(ratio_text(r))}</td>{_num(r["share_of_step"] * 100 if r["share_of_step"] == r["share_of_step"] else np.nan, ".1f")}</tr>')
    return (f'<table id="{table_id}" class="data meter"><thead><tr><th>phase</th><th>tags</th><th>when</th><th>count</th>'
            "<th>declared GiB</th><th>measured GiB</th><th>seconds</th><th>GB/s</th><th>link</th><th>ratio to ceiling</th>"
            f"<th>% of step</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def transitions_html(run, ledger_frame: pd.DataFrame | None, suffix: str = "") -> str:
    from miles_profile.report.whatif_html import whatif_html
    meter = meter_of(run, ledger_frame)
    if meter.empty:
        return ""
    share = ("–" if meter.share is None else f"{meter.share:.0%}")
    return f"""<section class="moving" id="moving{suffix}">
  <h3>What moving memory cost</h3>
  <p id="moving-share{suffix}" data-share="{'' if meter.share is None else f'{meter.share:.4f}'}"><b>{share}</b> of each step
  (iterations 0–{len(meter.steps) - 1}, first phase's start to last phase's end) was spent in offload, onload and
  weight-update phases:</p>
  {_bar(meter)}
  <p class="muted small">Bytes per phase kind and tag: declared (the phase's expected_bytes), measured by the ledger
  (what the working device's declared categories lost or gained). GB/s = 1e9 bytes/s. A release that copied nothing
  has no link. {_ceilings_text(meter)} (docs/transitions.md)</p>
  {_table(meter, "moving-table" + suffix)}
  {whatif_html(run, ledger_frame, suffix)}
</section>"""
