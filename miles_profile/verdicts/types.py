"""The vocabulary of verdicts: thresholds, findings and check results (dataclasses, no logic beyond
formatting), shared by the per-process checks (checks.py), the fleet checks and the dashboard."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np

from miles_profile.report.series import GiB

Status = Literal["pass", "fail", "n/a"]
MiB = 1024 ** 2


@dataclass(frozen=True)
class Thresholds:
    """Every tolerance a check uses. Shares are fractions (0.5 = 50 %); bytes are integers."""

    # offload drop: memory must fall by more than this share of the phase's expected_bytes (strictly:
    # an offload that leaves half its state behind must fail; docs/checks.md gives the measured margin) ...
    offload_min_drop_share: float = 0.8
    # ... by the end of the phase; a drop that only comes within this many seconds after it is "late".
    offload_late_window_s: float = 5.0
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
    # leak: the per-iteration floor may grow by at most this share of the run's peak plus
    # `leak_abs_bytes` from the first measured iteration to the last; iterations before
    # `leak_skip_iterations` are warm-up.
    leak_share: float = 0.05
    leak_abs_bytes: int = 64 * MiB
    leak_skip_iterations: int = 1
    # headroom: the peak may use at most this share of the device (or host) total.
    headroom_max_share: float = 0.95

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


def gib(n: float) -> str:
    return "?" if n is None or not np.isfinite(n) else f"{n / GiB:.3f} GiB"


def overall_status(results: list[CheckResult]) -> Status:
    if any(r.status == "fail" for r in results):
        return "fail"
    return "pass" if any(r.status == "pass" for r in results) else "n/a"
