"""What the regression gate compares when a run has no phases (nothing tagged its steps): the whole run
by time, per memory series of its main process (host RSS, and its device memory on a GPU run).

    time_measures(run) -> DataFrame   # gate.MEASURE_COLUMNS + floor_growth, one row per series

- `peak`: the series' highest true peak over the run;
- `floor`: the lowest level in the last window judged by leak_by_time (the floor the run ended on);
- `floor_growth`: that floor minus the first judged window's floor: how much the floor rose, from the same
  windows of time as the leak check (after start-up, before the exit), so two runs of different lengths
  are aligned by their share of the run.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile.runmodel.series import main_pid, process_label
from miles_profile.verdicts.common import Tracks, nanmax
from miles_profile.verdicts.leak import iteration_floors
from miles_profile.verdicts.leak_by_time import time_windows
from miles_profile.verdicts.types import Thresholds

WHOLE_RUN = "whole run (by time)"
FLOOR_GROWTH = "floor_growth"


def time_measures(run, th: Thresholds | None = None) -> pd.DataFrame:
    from miles_profile.verdicts.gate import HOST_RSS, MEASURE_COLUMNS
    th = th or Thresholds()
    pid = main_pid(run)
    tracks = Tracks(run)
    rows = []
    for track in filter(None, (tracks.device(pid), tracks.host(pid))) if pid is not None else ():
        starts, ends = time_windows(track, th)
        floors = iteration_floors(track, starts, ends, th)
        floors = floors[np.isfinite(floors)]
        memory = HOST_RSS if track.name == "host" else f"GPU own ({track.label})"
        rows.append({"phase": WHOLE_RUN, "iteration": -2, "exact_key": f"main|{track.name}",
                     "rank_key": f"main|{track.name}", "subject": f"the recorded program ({process_label(run, pid)})",
                     "gpu": "" if track.name == "host" else track.name, "memory": memory,
                     "peak": float(nanmax(track.peak)),
                     "floor": float(floors[-1]) if len(floors) else np.nan,
                     FLOOR_GROWTH: float(floors[-1] - floors[0]) if len(floors) > 1 else np.nan})
    return pd.DataFrame(rows, columns=[*MEASURE_COLUMNS, FLOOR_GROWTH])
