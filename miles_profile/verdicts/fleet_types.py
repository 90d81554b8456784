"""What every fleet check shares: its thresholds (`FleetThresholds`), its result (`FleetCheckResult`: a
CheckResult that also says how many lanes and processes it judged and which was worst), and the words and
status rules of that result (fleet_result, fleet_na, with_too_small, lane_where, lanes_word, count_text).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd

from miles_profile.verdicts.types import TOO_SMALL, WARN, CheckResult, Finding

GiB = 1024 ** 3
MiB = 1024 ** 2


@dataclass(frozen=True)
class FleetThresholds:
    """Every tolerance of the fleet checks. Shares are fractions; bytes are integers."""

    # rank_imbalance: a lane's peak in one (iteration, phase) fails when it exceeds the median of its
    # peers in that cell by more than the largest of: `imbalance_spread_z` x their spread (the median
    # absolute deviation scaled to a standard deviation: 3.5 is Iglewicz and Hoaglin's outlier cut for
    # the modified z-score), `imbalance_share` of the median, and `imbalance_resolution_multiple` x the
    # series' resolution (below that it is too small to judge). A cell is judged only with at least
    # `imbalance_min_peers` lanes in it (with two, neither is the odd one).
    imbalance_spread_z: float = 3.5
    imbalance_share: float = 0.10
    imbalance_resolution_multiple: float = 2.0
    imbalance_min_peers: int = 3
    # ... and an outlier fails only when it matters and recurs: its excess is above
    # `imbalance_total_share` of the lane's total (the GPU's memory, or the host's) in at least
    # `imbalance_min_iterations` iterations. An outlier that differs once, or by little against the
    # total in several iterations, is a warning; once and by little, a pass (a process hosting the
    # sampler, a one-time buffer). Peers' spread counts their variation over the iterations of a phase too.
    imbalance_total_share: float = 0.02
    imbalance_min_iterations: int = 2
    # floor_trend_leak: the leak rule of verdicts/trend.py per GPU and per process: the lower bound of
    # the Theil-Sen slope's 95 % interval times the iterations judged fails when above the largest of
    # `floor_trend_abs_bytes`, `floor_trend_share` of the lane's total and
    # `floor_trend_resolution_multiple` x the series' resolution; the first
    # `floor_trend_skip_iterations` are warm-up; a series needs `floor_trend_min_iterations` floors
    # after them (fewer give an interval wider than the floors' spread).
    floor_trend_abs_bytes: int = 256 * MiB
    floor_trend_share: float = 0.02
    floor_trend_resolution_multiple: float = 2.0
    floor_trend_skip_iterations: int = 1
    floor_trend_min_iterations: int = 5
    # serialized_peaks_per_gpu: during a footprint phase (train, generate) the lane's processes may
    # hold together, above their own lowest levels, the larger footprint plus this share of the
    # smaller plus `serialized_abs_bytes`.
    serialized_overlap_share: float = 0.5
    serialized_abs_bytes: int = 64 * MiB
    # a failing phase is blamed on both footprints only when what it held above its own footprint is
    # within this share of the other footprint (as serialized_peaks: 1 - offload_min_drop_share); else
    # it is a residual.
    serialized_match_share: float = 0.2

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class FleetCheckResult(CheckResult):
    judged: dict[str, int] = field(default_factory=dict)   # {"lanes": n, "processes": m}
    worst: dict[str, Any] | None = None


def count_text(n: int, words: str) -> str:
    """"1 lane", "2 lanes", "1 GPU held ...": the first word of `words` (a plural) agrees with n."""
    first, _, rest = words.partition(" ")
    if n == 1:
        first = "process" if first == "processes" else first[:-1] if first.endswith("s") else first
    return f"{n} {first}" + (f" {rest}" if rest else "")


def fleet_result(name, title, explanation, findings, judged, worst, series, ok, bad) -> FleetCheckResult:
    failed = [f for f in findings if f.status == "fail"]
    counted = ", ".join(count_text(v, k) for k, v in judged.items() if v)
    where = f"; worst {worst['label']}" + (f" pid {worst['pid']}" if worst.get("pid") is not None else "") + \
        f": {worst['message']}" if worst else ""
    spans = [f.span for f in findings if f.span]
    span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
    warned = [f for f in findings if f.status == WARN]
    if failed:
        summary = f"{len(failed)} of {len(findings)} {bad} (judged {counted}){where}"
        status = "fail"
    elif warned:
        summary = f"{len(warned)} of {len(findings)} unsure (judged {counted}); first: {warned[0].message}"
        status = WARN
    else:
        summary = f"{count_text(len(findings), ok)} (judged {counted}){where}"
        status = "pass"
    return FleetCheckResult(name, title, status, summary, explanation, span, findings, series, judged=judged,
                            worst=worst)


def fleet_na(name, title, explanation, why) -> FleetCheckResult:
    return FleetCheckResult(name, title, "n/a", why, explanation, judged={})


def lane_where(lane_row, **extra) -> dict:
    return dict(lane=lane_row["lane"], label=lane_row["label"], host=lane_row["host"],
                gpu_uuid=lane_row["gpu_uuid"], **extra)


def lanes_word(lanes: pd.DataFrame) -> str:
    """What a fleet's lanes are, for messages: GPUs, or ranks' host memory on a run without GPUs."""
    kinds = set(lanes["kind"]) if "kind" in lanes else {"gpu"}
    return "GPUs" if kinds == {"gpu"} else ("ranks' host memory" if kinds == {"host"} else "lanes")


def with_too_small(result: FleetCheckResult, findings: list[Finding]) -> FleetCheckResult:
    """_result knows pass and fail: a fleet check whose judged findings are all too small says so."""
    resolutions = [f.resolution for f in findings if f.resolution is not None]
    result.resolution = max(resolutions) if resolutions else None
    small = [f for f in findings if f.status == TOO_SMALL]
    if result.status == "pass" and small and not any(f.status == "pass" for f in findings):
        result.status = TOO_SMALL
    if small and result.status != TOO_SMALL:
        result.summary += f"; {len(small)} too small to judge"
    return result
