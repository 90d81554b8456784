"""Several runs side by side, aligned by phase (iteration k, phase p) rather than by wall clock.

Each top-level phase instance of a run's main process gets a slot keyed by (iteration, phase name,
occurrence within the iteration); slots are ordered by iteration, then by when each phase first
appeared. The figure shows, per phase and configuration, a stacked bar of the ledger (what fills the
GPU and the host at the phase's end, by category); the table gives every slot's true peak per run.
(The figure drew each run's samples as lines aligned by slot before: eight zig-zag lines over
dozens of slots were hard to read at a glance.)

Public API (stable; shared with the Dash dashboard):

    slot_keys(run) -> DataFrame            # start, end, key per top-level phase of the main process
    phase_peak_comparison(runs) -> DataFrame
        # one row per (iteration, phase); per run "<run>: device peak" and "<run>: host peak" (bytes)
    peak_matrix(runs, kind="device"|"host") -> DataFrame   # runs x phases (loop order): highest peak, bytes
    comparison_figure(runs, *, max_points=100_000) -> go.Figure   # stacked ledger bars per phase and run
    comparison_html(runs, *, max_points=100_000) -> str   # peak matrices + figure (+ the per-iteration
                                                          # table, folded), for the report
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from miles_profile.report.ledger_figures import ledger_comparison_figure
from miles_profile.report.phase_style import iteration_text, loop_sorted
from miles_profile.runmodel.ledger import ledger
from miles_profile.runmodel.reduce import phase_ranges
from miles_profile.runmodel.series import GiB, device_track, host_track, main_pid
from miles_profile.runmodel.stats import phase_instances, range_stats
from miles_profile.report.plotly_bundle import figure_div


def iteration_label(iteration) -> str:
    """Phases before the first rollout_id (iteration -1) are the run's setup."""
    return iteration_text(iteration)


def slot_keys(run) -> pd.DataFrame:
    inst = phase_instances(run)
    pid = main_pid(run)
    top = inst[(inst["depth"] == 0) & (inst["pid"] == pid)].sort_values("start").reset_index(drop=True)
    occurrence = top.groupby(["iteration", "name"]).cumcount()
    top = top.assign(occurrence=occurrence.to_numpy())
    top["key"] = list(zip(top["iteration"], top["name"], top["occurrence"]))
    return top


def _slot_order(runs) -> list[tuple]:
    seen: dict[tuple, tuple] = {}
    for r, run in enumerate(runs):
        for pos, key in enumerate(slot_keys(run)["key"]):
            seen.setdefault(key, (key[0], pos, r))
    return sorted(seen, key=lambda k: seen[k])


def _run_names(runs) -> list[str]:
    parents = {run.path.parent.name for run in runs}
    names = [f"{run.path.parent.name}/{run.name}" if len(parents) > 1 else run.name for run in runs]
    return [n if names.count(n) == 1 else f"{n} ({k})" for k, n in enumerate(names)]


def _tracks(run):
    pid = main_pid(run)
    return {"device": device_track(run, pid), "host": host_track(run, pid)}


def phase_peak_comparison(runs) -> pd.DataFrame:
    order = _slot_order(runs)
    table = pd.DataFrame({"iteration": [k[0] for k in order], "phase": [k[1] for k in order]})
    names = _run_names(runs)
    for name, run in zip(names, runs):
        slots = slot_keys(run)
        position = {key: j for j, key in enumerate(order)}
        for kind, track in _tracks(run).items():
            values = np.full(len(order), np.nan)
            if track is not None and len(slots):
                i0, i1 = phase_ranges(track.t, slots["start"], slots["end"])
                peaks = range_stats(track.value, i0, i1, track.peak)[2]
                for key, peak in zip(slots["key"], peaks):
                    values[position[key]] = peak
            if np.isfinite(values).any():
                table[f"{name}: {kind} peak"] = pd.array(np.where(np.isfinite(values), np.round(values), np.nan),
                                                         dtype="Float64").astype("Int64")
    return table


def _phase_order(runs) -> list[str]:
    """Phase names in loop order (generate, offloads of the rollout, train, offload_train, onloads,
    update_weights, ...), names outside the loop after, in the order they first appear."""
    return loop_sorted(str(key[1]) for key in _slot_order(runs))


def peak_matrix(runs, kind: str = "device") -> pd.DataFrame:
    """Runs (rows, in the given order) x phases (columns, loop order): each phase's highest true peak
    over its iterations, in bytes (Int64, <NA> where a run has no such phase); `.attrs["iteration"]`
    holds, in a frame of the same shape, the iteration of each peak. Rows and columns without any
    value are dropped. kind: "device" (the main process's GPU memory) or "host" (its RSS)."""
    table = phase_peak_comparison(runs)
    names = _run_names(runs)
    phases = _phase_order(runs)
    values = pd.DataFrame(np.nan, index=names, columns=phases)
    where = pd.DataFrame(-1, index=names, columns=phases)
    for name in names:
        column = f"{name}: {kind} peak"
        if column not in table:
            continue
        peaks = table[["iteration", "phase", column]].dropna(subset=[column])
        for phase, rows in peaks.groupby("phase", sort=False):
            best = rows.loc[rows[column].astype(float).idxmax()]
            values.loc[name, str(phase)] = float(best[column])
            where.loc[name, str(phase)] = int(best["iteration"])
    keep_rows, keep_cols = values.notna().any(axis=1), values.notna().any(axis=0)
    matrix = values.loc[keep_rows, keep_cols].round().astype("Int64")
    matrix.attrs["iteration"] = where.loc[keep_rows, keep_cols]
    return matrix


def comparison_figure(runs, *, max_points: int = 100_000) -> go.Figure:
    """Stacked bars per (phase, configuration): the ledger (runmodel/ledger.py) of each run's main
    process at the end of each phase's worst iteration, GPU then host. Built from the phase
    summaries and account events (per phase, not per sample): `max_points` is unused, kept for callers."""
    frames = [ledger(run) for run in runs]
    return ledger_comparison_figure(frames, _run_names(runs), [main_pid(run) for run in runs], _phase_order(runs))


def _matrix_html(matrix: pd.DataFrame, what: str, table_id: str) -> str:
    """A run x phase table of peaks in GiB, each cell shaded by its share of the table's highest."""
    if matrix.empty:
        return ""
    top = float(np.nanmax(matrix.to_numpy(dtype=float, na_value=np.nan))) or 1.0
    iterations = matrix.attrs.get("iteration")
    head = "<tr><th>run</th>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in matrix.columns) + "</tr>"
    rows = []
    for name, values in matrix.iterrows():
        cells = [f'<th class="run-name">{html.escape(str(name))}</th>']
        for phase, v in values.items():
            if pd.isna(v):
                cells.append('<td class="num muted">–</td>')
                continue
            it = iteration_label(iterations.loc[name, phase]) if iterations is not None else "–"
            shade = f"rgba(214,70,31,{0.08 + 0.5 * int(v) / top:.2f})"
            cells.append(f'<td class="num" style="background:{shade}" title="{int(v):,} B, iteration {it}">'
                         f'{int(v) / GiB:.2f}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<h4>{html.escape(what)}</h4><table id=\"{table_id}\" class=\"data peak-matrix\">"
            f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>")


_MATRIX_CSS = ("<style>table.peak-matrix th,table.peak-matrix td{white-space:nowrap;font-size:12px;padding:4px 8px}"
               "table.peak-matrix th.run-name{text-align:left;background:#fff;font-weight:600}</style>")


def comparison_html(runs, *, max_points: int = 100_000) -> str:
    fig = comparison_figure(runs, max_points=max_points)
    table = phase_peak_comparison(runs)
    value_columns = [c for c in table.columns if c not in ("iteration", "phase")]
    head = "<tr><th>iteration</th><th>phase</th>" + "".join(f"<th>{html.escape(c)} (GiB)</th>" for c in value_columns)
    rows = []
    for r in table.to_dict("records"):
        cells = [f'<td class="num">{iteration_label(r["iteration"])}</td><td>{html.escape(str(r["phase"]))}</td>']
        for c in value_columns:
            v = r[c]
            cells.append('<td class="num muted">–</td>' if v is None or pd.isna(v) else
                         f'<td class="num" title="{int(v):,} B">{int(v) / GiB:.3f}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    figure = figure_div(fig, div_id="comparison-figure", config={"displaylogo": False, "responsive": True})
    matrices = (_matrix_html(peak_matrix(runs, "device"), "GPU memory of the main process: highest peak per "
                             "phase (GiB; hover a cell for bytes and its iteration)", "comparison-matrix-device") +
                _matrix_html(peak_matrix(runs, "host"), "Host RSS of the main process: highest peak per phase (GiB)",
                             "comparison-matrix-host"))
    return (f'{_MATRIX_CSS}<h3>Peak of each phase, per run</h3>{matrices}'
            f'<div class="figure">{figure}</div>'
            f'<details><summary>Peak of every phase instance, per iteration ({len(table)} rows)</summary>'
            f'<table id="comparison-table" class="data"><thead>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
            f'</table></details>')
