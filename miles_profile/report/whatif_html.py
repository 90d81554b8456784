"""The report's "What you could keep on the GPU" table (runmodel/whatif.py), inside the section of
report/transitions_html.py.

    whatif_html(run, ledger_frame, suffix) -> str
    whatif_rows(result) -> list[dict], WHATIF_COLUMNS, basis_text(result)   # the table as text, for the dashboard too
"""
from __future__ import annotations

import html

import pandas as pd

from miles_profile.runmodel.series import GiB
from miles_profile.runmodel.whatif import ALL, DOES_NOT_FIT, FITS, NO_HEADROOM, WhatIf, whatif_of

_CLASS = {FITS: "pass-text", NO_HEADROOM: "small-text", DOES_NOT_FIT: "fail-text"}


def _e(x) -> str:
    return html.escape(str(x))


def _gib(v) -> str:
    return "–" if v is None or v != v else f"{v / GiB:.2f}"


# (key, header) of the what-if table, the report's and the dashboard's alike
WHATIF_COLUMNS = [("offload", "offload"), ("kept", "kept"), ("freed", "freed GiB"), ("peak_phase", "highest phase"),
                  ("measured_peak", "its peak GiB"), ("whatif_peak", "peak if kept GiB"), ("fits", "fits?"),
                  ("onload", "brought back by"), ("round_trip_s", "round trip s")]


def whatif_rows(result: WhatIf) -> list[dict[str, str]]:
    return [{"offload": str(r["offload"]), "kept": "everything it freed" if r["category"] == ALL else str(r["category"]),
             "freed": _gib(r["freed"]), "peak_phase": str(r["peak_phase"] or "–"),
             "measured_peak": _gib(r["measured_peak"]), "whatif_peak": _gib(r["whatif_peak"]), "fits": str(r["fits"]),
             "onload": str(r["onload"]), "round_trip_s": f"{r['round_trip_s']:.3f}", "_category": str(r["category"])}
            for r in result.table.to_dict("records")]


def title_text(result: WhatIf) -> str:
    """On a run without GPUs the memory kept is the host's (an offload to disk): "on the GPU" would be wrong."""
    return "What you could keep in host memory" if result.series.startswith("RSS") else "What you could keep on the GPU"


def basis_text(result: WhatIf) -> str:
    total = ("device total unknown" if result.total is None else
             f"{result.total / GiB:.1f} GiB total, headroom threshold {result.threshold / GiB:.1f} GiB")
    return f"Peaks: {result.series}; {total} (the headroom check's threshold)."


def whatif_html(run, ledger_frame: pd.DataFrame | None, suffix: str = "") -> str:
    result = whatif_of(run, ledger_frame)
    if result.empty:
        return ""
    rows = []
    for r in whatif_rows(result):
        cells = "".join(f'<td class="{_CLASS.get(r[k], "na-text")}">{_e(r[k])}</td>' if k == "fits" else
                        f'<td class="num"><b>{_e(r[k])}</b></td>' if k == "whatif_peak" else
                        f'<td class="num">{_e(r[k])}</td>' if k in ("freed", "measured_peak", "round_trip_s") else
                        f"<td>{_e(r[k])}</td>" for k, _ in WHATIF_COLUMNS)
        rows.append(f'<tr data-offload="{_e(r["offload"])}" data-category="{_e(r["_category"])}" '
                    f'data-fits="{_e(r["fits"])}">{cells}</tr>')
    head = "".join(f"<th>{_e(h)}</th>" for _, h in WHATIF_COLUMNS)
    return f"""<h4>{_e(title_text(result))}</h4>
  <p class="muted small">For each offload and each category it freed (from the ledger): the highest peak of the phases
  that ran while those bytes were away, and that peak had they stayed. {_e(basis_text(result))} Round trip: the
  offload's seconds plus those of the onload that brought the bytes back, per iteration. How it was checked against
  measured H200 configurations: docs/transitions.md.</p>
  <table id="whatif-table{suffix}" class="data meter"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>"""
