"""Checks across the fleet: pure functions PhaseTable (see fleet.py) + FleetThresholds -> FleetCheckResult.

A `FleetCheckResult` is a checks.CheckResult (same status, summary, explanation, span, findings) that
also says how many lanes (GPUs, or ranks' host memory) and processes it judged (`judged`) and which
was worst (`worst`: lane, label, host, gpu_uuid, pid where it applies, the number that made it
worst). There is one Finding per lane (or per process) judged, naming its worst phase instance;
`Finding.numbers` holds lane, label, host, gpu_uuid (and pid) so a UI can link to that timeline.

    FleetThresholds(...)
    check_rank_imbalance(table, th) / check_floor_trend_leak(table, th) / check_serialized_peaks_per_gpu(table, th)
    run_fleet_checks(table, thresholds=None) -> list[FleetCheckResult]

Each check lives in its own module (rank_imbalance.py, floor_trend_leak.py, serialized_per_gpu.py), what
they share in fleet_types.py; the public names stay importable from here.
"""
from __future__ import annotations

import pandas as pd

from miles_profile.runmodel import fleet
from miles_profile.verdicts.floor_trend_leak import check_floor_trend_leak
from miles_profile.verdicts.fleet_types import FleetCheckResult, FleetThresholds
from miles_profile.verdicts.rank_imbalance import check_rank_imbalance
from miles_profile.verdicts.serialized_per_gpu import check_serialized_peaks_per_gpu

__all__ = ["FleetCheckResult", "FleetThresholds", "check_floor_trend_leak", "check_rank_imbalance",
           "check_serialized_peaks_per_gpu", "run_fleet_checks"]


def run_fleet_checks(table: pd.DataFrame, thresholds: FleetThresholds | None = None,
                     matrix: fleet.GpuMatrix | None = None) -> list[FleetCheckResult]:
    th = thresholds or FleetThresholds()
    df = fleet.normalize(table)
    return [check_rank_imbalance(df, th, matrix), check_floor_trend_leak(df, th), check_serialized_peaks_per_gpu(df, th)]
