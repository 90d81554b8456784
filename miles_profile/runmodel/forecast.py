"""Forecast beside measured, per phase: pure functions over a run and a stored plan.

    stored_plan(run) -> (pids, plan dict) | None    # the `forecast` annotation of the process that ran
                                                    # the trainer (trainer/plan.py, docs/log-format.md);
                                                    # pids: plan process ("trainer", "engine") -> pid
    compare(run, plan, pids, tolerance=0.05) -> DataFrame
        one row per (process, phase, device) the plan forecasts: process, phase, device, basis,
        forecast, measured, error (signed share of measured), outside (|error| > tolerance), judged

What "measured" is, per device (`basis`):
- `allocator` (cuda): the highest true peak of torch's `memory_allocated` over the phase's instances
  (`gpu{i}_alloc_peak`), compared with the plan's allocator view (torch_memory_saver pauses stay
  counted there, as torch counts them);
- `heap` (host, judged): on a CPU run (plan device `cpu`) whose process was recorded with `--heap` and
  stored a `heap_baseline` annotation before allocating (mp.heap_baseline): the highest glibc heap in
  use the recorder saw in the phase (`heap_used`, read at each sample and boundary; its peak is the
  higher of two consecutive reads, so the level entering the phase counts, but it is no true peak)
  minus that baseline. Not on a CUDA run: its offload buffers come from torch's pinned pool
  (cudaHostAlloc), which malloc never sees;
- `rss_growth` (host, shown): otherwise, the process's highest RSS in the phase minus its RSS at its
  first sample, i.e. what the process grew by since the recorder started. That growth holds the
  trainer's tensors and more (libraries loaded later, torch's lazy initialisation, glibc's retained
  heap: 0.1-0.16 GiB on the cpu preset, 1 GiB with CUDA), so it is shown, never judged.
Measured values come from the phase table (`phase_table.phase_table`: the end events' summaries,
the samples only for phases without one), so the comparison costs per phase.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.runmodel.phase_table import phase_table

TOLERANCE = 0.05
COLUMNS = ["process", "phase", "device", "basis", "forecast", "measured", "error", "outside", "judged"]


def stored_plan(run) -> tuple[dict[str, int], dict] | None:
    """The first process whose meta annotations carry a `forecast`, with its pids. Entries that are
    not well formed (a hand-edited or foreign meta) are dropped, never a traceback."""
    for process in run.processes:
        annotations = process.get("annotations")
        plan = annotations.get("forecast") if isinstance(annotations, dict) else None
        if isinstance(plan, dict) and isinstance(plan.get("phases"), list):
            phases = [p for p in plan["phases"] if _well_formed(p)]
            return plan_pids(run, process), {**plan, "phases": phases}
    return None


def _well_formed(entry) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("phase"), str) and entry.get("device") in ("cuda", "host")
            and all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in ("peak", "allocator"))
            and isinstance(entry.get("process", "trainer"), str))


def plan_pids(run, trainer: dict) -> dict[str, int]:
    """{"trainer": its pid, "engine": the pid of its engine server (same host and rank), if any}."""
    pids = {"trainer": int(trainer.get("pid", -1))}
    engine = next((p for p in run.processes if p.get("role") == "engine" and p.get("host") == trainer.get("host")
                   and p.get("rank") == trainer.get("rank")), None)
    if engine is not None:
        pids["engine"] = int(engine["pid"])
    return pids


def _first_rss(run, pid: int) -> float | None:
    samples = run.samples
    if samples.empty or "rss" not in samples or "pid" not in samples:
        return None
    rss = samples.loc[samples["pid"] == pid, "rss"].dropna()
    return float(rss.iloc[0]) if len(rss) else None


def compare(run, plan: dict, pids: dict[str, int], tolerance: float = TOLERANCE) -> pd.DataFrame:
    """Forecast beside measured for each (process, phase, device) of `plan` that its process ran."""
    table = phase_table(run)
    rows = []
    for process, pid in pids.items():
        mine = table[table["pid"] == pid]
        measured = mine.groupby("phase", sort=False).agg(alloc=("alloc_peak", "max"), rss=("rss_peak", "max"))
        # A CUDA run's offload buffers come from torch's pinned pool (cudaHostAlloc): malloc never sees them.
        heap = _heap_growth(run, pid, mine) if plan.get("device") == "cpu" else None
        if heap is not None:
            measured["heap"] = heap
        wanted = [p for p in plan["phases"] if p.get("process", "trainer") == process and p["phase"] in measured.index]
        rows += _rows(wanted, measured, _first_rss(run, pid), tolerance, process)
    return pd.DataFrame(rows, columns=COLUMNS)


def _heap_growth(run, pid: int, phases: pd.DataFrame) -> pd.Series | None:
    """Per phase name, the highest `heap_used` of its instances (their end-event summaries) minus the
    process's `heap_baseline`; None when the process has no baseline or no heap summaries."""
    meta = next((p for p in run.processes if int(p.get("pid", -1)) == pid), {})
    annotations = meta.get("annotations")
    baseline = annotations.get("heap_baseline") if isinstance(annotations, dict) else None
    summaries = run.phase_summaries
    if not isinstance(baseline, int) or isinstance(baseline, bool) or summaries.empty:
        return None
    heap = summaries[(summaries["series"] == "heap_used") & (summaries["pid"].astype(np.int64) == pid)]
    if heap.empty:
        return None
    peaks = heap.set_index(heap["id"].astype(np.int64))["peak"].astype(float)
    by_phase = pd.Series(peaks.reindex(phases["phase_id"].astype(np.int64)).to_numpy(), index=phases["phase"].to_numpy())
    return by_phase.groupby(level=0, sort=False).max() - baseline


def _rows(phases: list[dict], measured: pd.DataFrame, baseline: float | None, tolerance: float,
          process: str) -> list[dict]:
    rows = []
    for p in phases:
        heap = measured.at[p["phase"], "heap"] if "heap" in measured else np.nan
        if p["device"] == "cuda":
            basis, forecast, value = "allocator", p["allocator"], measured.at[p["phase"], "alloc"]
        elif pd.notna(heap):
            basis, forecast, value = "heap", p["peak"], heap
        else:
            basis, forecast = "rss_growth", p["peak"]
            rss = measured.at[p["phase"], "rss"]
            value = rss - baseline if baseline is not None and pd.notna(rss) else np.nan
        judged = basis != "rss_growth"  # RSS growth holds more than tensors: shown only
        error = (forecast - value) / value if pd.notna(value) and value > 0 else np.nan
        rows.append({"process": process, "phase": p["phase"], "device": p["device"], "basis": basis,
                     "forecast": int(forecast), "measured": value, "error": error,
                     "outside": bool(judged and pd.notna(error) and abs(error) > tolerance), "judged": judged})
    return rows


def outside(comparison: pd.DataFrame) -> pd.DataFrame:
    """The judged rows whose forecast is off by more than the tolerance, worst first."""
    bad = comparison[comparison["outside"].astype(bool)]  # an empty, object-typed column must still select rows
    return bad.reindex(bad["error"].abs().sort_values(ascending=False).index)


def worst(comparison: pd.DataFrame) -> pd.Series | None:
    """The judged row with the largest |error|, or None."""
    judged = comparison[comparison["judged"] & comparison["error"].notna()]
    if judged.empty:
        return None
    return judged.loc[judged["error"].abs().idxmax()]
