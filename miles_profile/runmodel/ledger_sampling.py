"""Which iterations a view's ledger covers. Past `LEDGER_MAX_INSTANCES` phase instances (a loop with a phase
per step) the report and the dashboard account for some iterations only: the ledger costs about 0.8 ms an
instance, and its bar chart draws a bar pair for each (a 10,000-step loop: 16 s of a 18 s report, 16 MB of
HTML). `ledger(run)` itself covers every instance; a frame of some records it (`attrs["sampled"]`).

    sampled_iterations(run) -> frozenset[int] | None    # None: all of them
    sampled_text(frame) -> str | None                   # "197 of 10,000 iterations shown ..."
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.runmodel.ledger import phase_iterations
from miles_profile.runmodel.peak import highest_peak

LEDGER_MAX_INSTANCES = 400


def sampled_iterations(run, most: int = LEDGER_MAX_INSTANCES) -> frozenset[int] | None:
    """The iterations a view's ledger covers: None (all of them) up to `most` phase instances; else the
    setup (-1), the run's peak's, the first two and the last two, and iterations evenly spaced between,
    about `most` phase instances in all."""
    phases = run.phases
    if len(phases) <= most:
        return None
    iterations = phase_iterations(phases)[1]
    counted = pd.Series(iterations).value_counts().sort_index()
    judged = counted[counted.index >= 0]
    peak = highest_peak(run)
    chosen = {-1, *judged.index[:2], *judged.index[-2:]}
    if peak is not None and peak.iteration is not None:
        chosen.add(peak.iteration)
    per_iteration = max(1.0, float(judged.median())) if len(judged) else 1.0
    spaced = max(0, int(most / per_iteration) - len(chosen))
    if spaced and len(judged):
        chosen.update(judged.index[np.unique(np.linspace(0, len(judged) - 1, spaced).round().astype(int))])
    return frozenset(int(i) for i in chosen)


def sampled_text(frame: pd.DataFrame) -> str | None:
    """'197 of 10,000 iterations shown ...' where the frame covers some iterations, else None."""
    if "sampled" not in frame.attrs:
        return None
    covered, total = frame.attrs["sampled"]
    return (f"{covered:,} of {total:,} iterations shown (more than {LEDGER_MAX_INSTANCES} phase instances): "
            "the peak's, the first and last two, and iterations evenly spaced between.")
