"""The report's "Which code made the peak" section (record --stacks): per recorded process, the top
allocation sites at its snapshot's peak (runmodel/stacks.py) and how to open the snapshot in memory_viz.

    stacks_html(run, suffix) -> str          # "" when the run has no stacks event
    site_rows(device_peak) -> list[dict], SITE_COLUMNS   # the table as text: the report's and the dashboard's
    heading_text(found), status_text(found) -> str
"""
from __future__ import annotations

import html

from miles_profile import names
from miles_profile.runmodel.stacks import DevicePeak, StackSnapshot, how_to_open, stacks_of

MiB = 1024 ** 2
GiB = 1024 ** 3
RULE_TEXT = {"peak": "the phase kind that held the peak so far", "named": "the phase named by --stacks",
             "attribute": "phase(stacks=True)"}
SITE_COLUMNS = [("site", "allocation site (first frame outside torch)"), ("function", "function"),
                ("mib", "MiB at the peak"), ("count", "blocks"), ("share", "% of the peak")]


def _e(x) -> str:
    return html.escape(str(x))


def site_rows(dev: DevicePeak) -> list[dict[str, str]]:
    """One dict per site (SITE_COLUMNS' keys), the rest in one row; `_bytes` and `_stack` for titles."""
    rows = [{"site": s.site + (" (torch only)" if s.internal else ""), "function": s.function,
             "mib": f"{s.bytes / MiB:,.1f}", "count": f"{s.count:,}",
             "share": f"{100 * s.bytes / dev.peak_bytes:.1f}" if dev.peak_bytes else "–",
             "_bytes": s.bytes, "_stack": "\n".join(s.stack)} for s in dev.sites]
    if dev.other_count:
        rows.append({"site": f"{dev.other_count:,} blocks at other sites", "function": "",
                     "mib": f"{dev.other_bytes / MiB:,.1f}", "count": f"{dev.other_count:,}",
                     "share": f"{100 * dev.other_bytes / dev.peak_bytes:.1f}" if dev.peak_bytes else "–",
                     "_bytes": dev.other_bytes, "_stack": ""})
    return rows


def heading_text(found: StackSnapshot) -> str:
    where = f"pid {found.pid}" + (f" on {found.host}" if found.host else "")
    phase = names.instance_label(found.phase, found.iteration) if found.phase else "no phase"
    rule = RULE_TEXT.get(found.rule, found.rule)
    return f"{where}: {phase} ({rule})"


def size_text(nbytes: int) -> str:
    return f"{nbytes / GiB:.3f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.1f} MiB"


def device_text(found: StackSnapshot, dev: DevicePeak) -> str:
    recorded = ("" if found.recorded_peak is None else
                f"; the recorder's allocator peak of that phase: {size_text(found.recorded_peak)}")
    full = (f" The history was full ({dev.entries:,} entries, --stacks-max-entries): the peak may predate its "
            "oldest entry." if dev.truncated else "")
    return (f"GPU {dev.device}: {size_text(dev.peak_bytes)} requested and live at the history's peak, "
            f"{size_text(dev.end_bytes)} at the phase's end{recorded}; {dev.entries:,} history entries.{full}")


def status_text(found: StackSnapshot) -> str:
    if found.status == "written":
        return how_to_open(found)
    label = {"not_recorded": "not recorded", "failed": "failed", "missing": "snapshot missing",
             "unreadable": "snapshot unreadable"}.get(found.status, found.status)
    return f"Stacks {label}: {found.reason or 'no reason given'}."


def _table(dev: DevicePeak, table_id: str) -> str:
    rows = []
    for r in site_rows(dev):
        rows.append(f'<tr title="{_e(r["_stack"])}"><td class="site">{_e(r["site"])}</td><td>{_e(r["function"])}</td>'
                    f'<td class="num" title="{r["_bytes"]:,} B">{_e(r["mib"])}</td><td class="num">{_e(r["count"])}</td>'
                    f'<td class="num">{_e(r["share"])}</td></tr>')
    head = "".join(f"<th>{_e(h)}</th>" for _, h in SITE_COLUMNS)
    return f'<table id="{table_id}" class="data stacks"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _one(found: StackSnapshot, k: int, suffix: str) -> str:
    parts = [f'<h4>{_e(heading_text(found))}</h4>']
    for dev in found.devices:
        parts.append(f'<p class="small">{_e(device_text(found, dev))}</p>')
        if dev.sites:
            parts.append(_table(dev, f"stacks-table{suffix}-{k}-{dev.device}"))
    cls = "muted small" if found.status == "written" else "warn"
    parts.append(f'<p class="{cls}" data-status="{_e(found.status)}">{_e(status_text(found))}</p>')
    return f'<div class="stacks-process" data-pid="{found.pid}">{"".join(parts)}</div>'


def stacks_html(run, suffix: str = "") -> str:
    found = stacks_of(run)
    if not found:
        return ""
    body = "".join(_one(f, k, suffix) for k, f in enumerate(found))
    return f"""<section class="stacks" id="stacks{suffix}">
  <h3>Which code made the peak</h3>
  <p class="muted small">From the allocation history PyTorch recorded around one phase per process (record --stacks):
  the blocks live at the history's peak, by the first stack frame outside torch's own code; hover a row for its stack.
  Bytes are the sizes requested (the allocator rounds them up). (docs/stacks.md)</p>
  {body}
</section>"""
