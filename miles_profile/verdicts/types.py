"""The vocabulary of verdicts: thresholds, findings and check results (dataclasses, no logic beyond
formatting), shared by the per-process checks (checks.py), the fleet checks and the dashboard."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np

from miles_profile.runmodel.peak import HEADROOM_MAX_SHARE
from miles_profile.runmodel.series import GiB

Status = Literal["pass", "fail", "warn", "n/a", "too small to judge"]
# A comparison whose quantity (an expected size, a margin, a growth) lies below what its series can
# resolve (verdicts/resolution.py) is neither a pass nor a failure: it says so.
TOO_SMALL: Status = "too small to judge"
# Ambiguous evidence (too few iterations for a trend, one process differing once, a drop within the
# series' noise, or a run where nothing but headroom was judged): neither a clear pass nor a clear
# failure. It exits 0 unless --strict; every view shows it as WARN.
WARN: Status = "warn"
# A finding or check with one of these statuses judged something; the others did not.
JUDGED: tuple[str, ...] = ("pass", "fail", WARN)
# Worst first: how statuses are ordered in every view, and how a check's status follows its findings'.
STATUS_ORDER: dict[str, int] = {"fail": 0, WARN: 1, "pass": 2, TOO_SMALL: 3, "n/a": 4}
MiB = 1024 ** 2


@dataclass(frozen=True)
class Thresholds:
    """Every tolerance a check uses. Shares are fractions (0.5 = 50 %); bytes are integers."""

    # offload drop: memory must fall by more than this share of the phase's expected_bytes (strictly:
    # an offload that leaves half its state behind must fail; docs/checks.md gives the measured margin) ...
    offload_min_drop_share: float = 0.8
    # ... by the end of the phase; a drop that only comes within the next this-many phase instances of the
    # same process is "freed late" (never seconds: a loop's next phases can be 80 iterations in 5 s).
    offload_late_phases: int = 1
    # serialized peaks: fail when device memory reaches floor + train bytes + rollout bytes minus
    # this share of the smaller of the two (both footprints held at one instant).
    serialized_overlap_share: float = 0.5
    # transition spikes: the peak between two phases may exceed the larger neighbour's peak by this
    # share of it plus `transition_abs_bytes`.
    transition_tolerance_share: float = 0.10
    transition_abs_bytes: int = 64 * MiB
    # disk offload keeps host RSS flat: RSS may rise at most by this share of expected_bytes plus
    # `host_flat_abs_bytes` during an offload to disk.
    host_flat_share: float = 0.25
    host_flat_abs_bytes: int = 128 * MiB
    # two host copies of the weights: a weight-moving phase may grow host RSS by less than this share
    # of the weights' bytes.
    weight_copy_share: float = 0.9
    # leak: a Theil-Sen trend through the per-iteration floors after `leak_skip_iterations` (warm-up)
    # fails when the lower bound of its 95 % interval, over the iterations judged, exceeds this share
    # of the run's peak plus the larger of `leak_abs_bytes` and `leak_resolution_multiple` x the
    # series' resolution (verdicts/trend.py). Below `leak_min_iterations` floors it is n/a: five
    # points are the fewest for which the interval is narrower than the spread of the floors.
    leak_share: float = 0.02
    leak_abs_bytes: int = 64 * MiB
    leak_resolution_multiple: float = 2.0
    leak_skip_iterations: int = 1
    leak_min_iterations: int = 5
    # an iteration's floor counts only from a series read throughout it, at least `leak_min_reads`
    # times (an NVML column read at a few phase ends is not a floor). No rule on the gaps between
    # readings: on this 2-core machine a sampler 20 ms apart left gaps of 60-80 % of a 1 s iteration
    # under load (tests/integration/test_fleet_report.py's 4 processes), with 15-24 readings each.
    leak_min_reads: int = 5
    # iterations too short for `leak_min_reads` are judged in windows of consecutive iterations, only from
    # a series read inside at least this share of the process's phase instances (each boundary is read:
    # a column read at one phase end of each iteration is always the same moment, never a floor).
    leak_window_coverage: float = 0.9
    # headroom: the peak may use at most this share of the device (or host) total.
    headroom_max_share: float = HEADROOM_MAX_SHARE

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class Finding:
    status: Status
    message: str
    span: tuple[float, float] | None = None      # Unix seconds
    phase: str | None = None
    iteration: int | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    # Why it failed (or what was found), as a stable id a test or a CI rule can match: one of CAUSES.
    cause: str | None = None
    # The series judged ("allocator allocated", "NVML per process", "host RSS", ...) and what it can
    # resolve in bytes: below that a difference is noise (verdicts/resolution.py).
    series: str | None = None
    resolution: float | None = None


# Every cause a finding may name. A check's module says which it uses; views print `message`, the
# corpus benchmark (bench/verdicts.py) matches `cause`.
CAUSES = {
    # offload_drop
    "still_referenced": "the declared tensors are still allocated: something keeps a reference to them",
    "cached_not_returned": "freed, but the allocator kept the blocks cached: call torch.cuda.empty_cache()",
    "freed_late": "freed only after the phase ended, within the next phase of the same process",
    "late_or_own_free": "the drop came in the next phase, which always follows the offload, and was not the declared "
                        "bytes: the offload's late free or that phase's own free, the levels cannot tell: a warning",
    "within_noise": "the drop lies within the series' noise of what the check needs: neither a clear pass nor a "
                    "clear failure, a warning",
    "fragmentation": "the tensors left and the cache was returned, but segments that still hold live blocks "
                     "kept part of it: a warning",
    "never_freed": "the memory was never freed",
    "paused_not_released": "a torch_memory_saver pause that did not return memory to the driver",
    # leak and floor_trend_leak
    "sustained_growth": "the per-iteration floor keeps rising after warm-up",
    "one_time_step": "the floor stepped up once and stayed flat: allocator or glibc retention, not a leak",
    "growth_stopped": "the floor rose, then levelled off before the run ended: bounded, not a leak",
    "few_iterations": "the floor rose in every iteration, but over too few iterations for a trend: a warning",
    "heap_flat": "the resident floor kept rising, glibc's heap in use did not: memory glibc keeps, or memory "
                 "outside malloc (a library's own mapping), which the series cannot tell apart: a warning",
    # serialized_peaks
    "both_footprints": "the training and rollout footprints were resident at once",
    "residual": "more than one footprint is resident, but less than the other footprint: a residual",
    # fleet
    "rank_outlier": "one rank's peak lies far outside its peers' spread",
    "differs_once": "one process differed from its peers in one iteration only, or by little against the total",
    # headroom, spikes, host memory
    "near_total": "the peak is near the device (or host) total",
    "transition_spike": "memory held between two phases above both: states coexisting during the hand-over, "
                        "or untagged work",
    "host_staging": "a disk offload staged the state in host memory",
    "host_weight_copy": "moving the weights made a second host copy",
    # oom (verdicts/oom.py)
    "oom_kill": "the kernel's OOM killer killed the process (the cgroup's oom_kill counter moved)",
    "sigkill": "the process was killed by SIGKILL (record --exec saw its exit status)",
    "vanished": "the process ended without ending its recording: SIGKILL, an OOM kill or a crash",
}


@dataclass
class CheckResult:
    name: str
    title: str
    status: Status
    summary: str
    explanation: str
    span: tuple[float, float] | None = None      # Unix seconds: what the check looked at
    findings: list[Finding] = field(default_factory=list)
    series: str = ""                             # which memory it judged
    resolution: float | None = None              # bytes the judged series can resolve (the coarsest used)


def gib(n: float) -> str:
    # + 0.0: a few KiB below zero prints 0.000, not -0.000 (the first screen said "dropped -0.000 GiB")
    return "?" if n is None or not np.isfinite(n) else f"{round(n / GiB, 3) + 0.0:.3f} GiB"


def worst_status(statuses) -> Status:
    """fail > warn > pass > too small to judge > n/a: one failure fails; one warning warns; a pass over
    anything is a pass."""
    statuses = list(statuses)
    return min(statuses, key=lambda s: STATUS_ORDER.get(s, 9)) if statuses else "n/a"


def overall_status(results: list[CheckResult]) -> Status:
    return worst_status(r.status for r in results)
