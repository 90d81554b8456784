"""Do the ledger's categories add up to what NVML (or RSS) says, at each phase end and device?"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from miles_profile.runmodel.ledger_categories import HOST, ends


@dataclass
class AddUp:
    """How far the categories, negatives counted as errors, are from the reference at each boundary."""
    worst_error: float | None  # relative: sum of |negative residuals| / total; None: nothing to judge
    worst: dict | None  # the boundary with the worst error: phase, iteration, pid, device, t, total, negatives
    boundaries: int  # boundaries judged (phase end x device with a measured total)
    table: pd.DataFrame  # one row per boundary: host, pid, id, phase, iteration, device, t, total, sum, error

    def passes(self, tolerance: float = 0.02) -> bool | None:
        return None if self.worst_error is None else self.worst_error <= tolerance


def add_up(frame: pd.DataFrame, device_kind: str = "gpu") -> AddUp:
    """At each phase end and device (`gpu`: every GPU; `host`: every process's RSS), the categories
    summed with every negative residual counted as missing memory: |sum of positives - total| / total.
    By construction the signed sum equals the total when all sources were read in one row, so the error
    is exactly what the sources disagree on (stale per-process NVML, pauses the allocator can't see,
    declarations larger than the allocations)."""
    if frame.empty:
        return AddUp(None, None, 0, pd.DataFrame())
    frame = ends(frame)  # a peak's row mixes a true peak with levels read a moment later: not judged
    picked = frame[(frame["device"] == HOST) if device_kind == "host" else (frame["device"] != HOST)]
    picked = picked[picked["total"].notna() & (picked["total"] > 0)]
    if picked.empty:
        return AddUp(None, None, 0, pd.DataFrame())
    keys = ["host", "pid", "id", "phase", "iteration", "device", "t"]
    picked = picked.assign(positive=picked["bytes"].clip(lower=0), negative=(-picked["bytes"]).clip(lower=0))
    table = picked.groupby(keys, sort=False).agg(total=("total", "first"), signed=("bytes", "sum"),
                                                 positive=("positive", "sum"), negative=("negative", "sum")).reset_index()
    table["error"] = (table["positive"] - table["total"]).abs() / table["total"]
    worst = table.loc[table["error"].idxmax()]
    return AddUp(float(worst["error"]), {k: (v.item() if hasattr(v, "item") else v) for k, v in worst.items()},
                 len(table), table)
