"""The report's "What moving memory cost" section, placed after the summary: the share of each step
spent in transitions (a bar per phase kind), the transition meter per phase kind and tag
(runmodel/transitions.py) and the offload what-if (report/whatif_html.py).

    transitions_html(run, ledger_frame, suffix) -> str
    meter_rows(meter) -> list[dict], METER_COLUMNS  # the table as text: the report's and the dashboard's
    share_text(meter), ceilings_text(meter) -> str
"""
from __future__ import annotations

import html

import pandas as pd

from miles_profile.report.phase_style import phase_color
from miles_profile.report.whatif_html import whatif_html
from miles_profile.runmodel.series import GiB
from miles_profile.runmodel.transitions import GB, NO_COPY, Transitions, meter_of

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


def _fmt(v, fmt: str, scale: float = 1.0) -> str:
    return "–" if v is None or v != v else f"{v / scale:{fmt}}"


def ratio_text(row: dict) -> str:
    if row["link"] == NO_COPY:
        return "no copy"
    if row["ceiling"] != row["ceiling"]:
        return NOT_MEASURED
    text = f"{row['ratio']:.2f} of {row['ceiling'] / GB:.1f} GB/s"
    # faster than the calibrated disk (written with fsync, read past the page cache): the page cache served it
    return text + " (page cache)" if str(row["link"]).startswith("disk") and row["ratio"] > 1.0 else text


# (key, header) of the meter's table, the report's and the dashboard's alike
METER_COLUMNS = [("phase", "phase"), ("tags", "tags"), ("when", "when"), ("count", "count"),
                 ("declared", "declared GiB"), ("measured", "measured GiB"), ("seconds", "seconds"),
                 ("rate", "GB/s"), ("link", "link"), ("ratio", "ratio to ceiling"), ("share", "% of step")]


def meter_rows(meter: Transitions) -> list[dict[str, str]]:
    """The meter per phase kind and tag as text, one dict per row (METER_COLUMNS' keys)."""
    rows = []
    for r in meter.by_kind.to_dict("records"):
        # a release: how fast memory was given back or taken, nothing copied (no transfer rate): no decimals
        rate = _fmt(r["rate"], ".2f" if r["link"] != NO_COPY else ".0f", GB)
        if rate.strip("0.") == "" and r["rate"] > 0:  # a slow release is not "0 GB/s": under the shown precision
            rate = "< 0.01" if r["link"] != NO_COPY else "< 1"
        rows.append({"phase": str(r["phase"]), "tags": str(r["tags"]), "when": "setup" if r["setup"] else "loop",
                     "count": str(r["count"]), "declared": _fmt(r["declared"], ".2f", GiB),
                     "measured": _fmt(r["measured"], ".2f", GiB), "seconds": _fmt(r["seconds"], ".3f"),
                     "rate": rate, "link": LINK_TEXT.get(r["link"], r["link"]), "ratio": ratio_text(r),
                     "share": _fmt(r["share_of_step"], ".1f", 0.01), "_link": r["link"], "_setup": bool(r["setup"])})
    return rows


def _bar(meter: Transitions) -> str:
    loop = meter.by_kind[~meter.by_kind["setup"].astype(bool)]
    segments = "".join(
        f'<span style="width:{100 * r["share_of_step"]:.2f}%;background:{phase_color(str(r["phase"]))}" '
        f'title="{_e(r["phase"])} ({_e(r["tags"])}): {r["share_of_step"]:.1%} of the step"></span>'
        for r in loop.to_dict("records") if r["share_of_step"] == r["share_of_step"] and r["share_of_step"] > 0)
    return f'<div class="share-bar" aria-label="share of the step spent moving memory">{segments}</div>'


def ceilings_text(meter: Transitions) -> str:
    if not meter.ceilings:
        return f"No calibration in this log (record --calibrate): {NOT_MEASURED}; no ceiling is assumed."
    return "Link ceilings measured on this host (record --calibrate): " + ", ".join(
        f"{LINK_TEXT.get(k, k)} {v / GB:.1f} GB/s" for k, v in meter.ceilings.items()) + "."


def share_text(meter: Transitions) -> str:
    if meter.share is None:
        return "No iteration: no step to share."
    its = meter.steps["iteration"]
    processes = len(meter.steps.groupby(["host", "pid"]))
    who = "" if processes == 1 else f", over {processes} processes"
    return (f"{meter.share:.0%} of each step (iterations {its.min()}–{its.max()}{who}, first phase's start to last "
            "phase's end) was spent in offload, onload and weight-update phases.")


def _table(meter: Transitions, table_id: str) -> str:
    rows = []
    for r in meter_rows(meter):
        cells = "".join(f'<td class="num{" muted" if k == "rate" and r["_link"] == NO_COPY else ""}">{_e(r[k])}</td>'
                        if k in ("count", "declared", "measured", "seconds", "rate", "share") else
                        f'<td class="{k}">{_e(r[k])}</td>' for k, _ in METER_COLUMNS[1:])
        rows.append(f'<tr data-phase="{_e(r["phase"])}" data-link="{_e(r["_link"])}" data-setup="{int(r["_setup"])}">'
                    f'<td><span class="swatch" style="background:{phase_color(r["phase"])}"></span>{_e(r["phase"])}</td>'
                    f"{cells}</tr>")
    head = "".join(f"<th>{_e(h)}</th>" for _, h in METER_COLUMNS)
    return (f'<table id="{table_id}" class="data meter"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def transitions_html(run, ledger_frame: pd.DataFrame | None, suffix: str = "") -> str:
    meter = meter_of(run, ledger_frame)
    if meter.empty:
        return ""
    share = "" if meter.share is None else f"{meter.share:.4f}"
    return f"""<section class="moving" id="moving{suffix}">
  <h3>What moving memory cost</h3>
  <p id="moving-share{suffix}" data-share="{share}">{_e(share_text(meter))}</p>
  {_bar(meter)}
  <p class="muted small">Bytes per phase kind and tag: declared (the phase's expected_bytes), measured by the ledger
  (what the working device's declared categories lost or gained). GB/s = 1e9 bytes/s. A release that copied nothing
  has no link. {_e(ceilings_text(meter))} (docs/transitions.md)</p>
  {_table(meter, "moving-table" + suffix)}
  {whatif_html(run, ledger_frame, suffix)}
</section>"""
