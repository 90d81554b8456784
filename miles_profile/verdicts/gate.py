"""The regression gate: did a phase's peak (or floor) grow against a baseline run?

A pure function over two loaded runs, from their phase summaries (`phase_table`: one row per process
and phase instance), never their samples: cost grows with phases x processes.

    RegressionThresholds(share=0.05, abs_bytes=256 MiB); RegressionThresholds.parse("5%,256MiB")
    phase_measures(run, by_iteration=False) -> DataFrame   # what is compared, per run
    compare_runs(current, baseline, thresholds=..., selection=None, by_iteration=False) -> RegressionResult

What is compared, per phase name (or per iteration and phase name) and per subject:

- a GPU's device memory, NVML used (where the host sampler or the process recorded it);
- each process's own GPU memory (NVML per process, else allocator reserved, else allocated: fleet.py's
  `own_series`) on its GPU;
- each process's host RSS.

`peak` is the highest true peak of the phase's instances; `floor` the highest of their floors (the most
memory the phase held throughout, in its worst instance: a floor that rose in any iteration shows).
A value regressed when it grew by more than `share` of the baseline **and** more than `abs_bytes`.
A baseline that shares no compared value with the run (its keys match nothing) is a MilesProfileError
(exit 2): a gate that compares nothing must not pass.

Subjects are matched by identity: a GPU by (host, NVML UUID), a process by (host, GPU UUID, role, rank).
When those differ between the runs (another machine, another node), by rank instead: a GPU by the ranks
of its processes, a process by (role, rank). What one run has and the other lacks (a phase, a GPU, a
process, a series) is listed in `not_compared`, never silently dropped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from miles_profile.errors import MilesProfileError
from miles_profile.names import instance_label
from miles_profile.runmodel import fleet
from miles_profile.runmodel.phase_table import phase_table
from miles_profile.sizes import format_size, parse_share, parse_size
from miles_profile.words import role_text

MiB = 1024 ** 2
MEASURE_COLUMNS = ["phase", "iteration", "exact_key", "rank_key", "subject", "gpu", "memory", "peak", "floor"]
GPU_USED = "GPU used (NVML, device)"
HOST_RSS = "host RSS"


@dataclass(frozen=True)
class RegressionThresholds:
    """A value regressed when it grew by more than `share` of the baseline and more than `abs_bytes`."""
    share: float = 0.05
    abs_bytes: int = 256 * MiB

    @classmethod
    def parse(cls, text: str) -> "RegressionThresholds":
        """"SHARE,SIZE", strictly: the share ends in % ("5%"), the size is a size ("256MiB", "0" bytes);
        either alone keeps the other's default. "5%,0" is 5% and 0 bytes: any growth over 5% fails.
        Anything else (two shares, a bare fraction, garbage) is a MilesProfileError (exit 2)."""
        parts = [p.strip() for p in str(text).split(",")]
        usage = f"--baseline-threshold {text!r}: expected SHARE,SIZE such as 5%,256MiB (or one of them)"
        if not 1 <= len(parts) <= 2 or not all(parts):
            raise MilesProfileError(usage)
        shares = [p for p in parts if p.endswith("%")]
        sizes = [p for p in parts if not p.endswith("%")]
        if len(shares) > 1 or len(sizes) > 1:
            raise MilesProfileError(usage)
        if sizes and "." in sizes[0] and sizes[0].replace(".", "", 1).isdigit():  # "0.05": a share without %?
            raise MilesProfileError(f"{usage}; a share is written with % (5%), a size in whole bytes or with a unit")
        try:
            share = parse_share(shares[0]) if shares else cls.share
            abs_bytes = parse_size(sizes[0]) if sizes else cls.abs_bytes
        except MilesProfileError as exc:
            raise MilesProfileError(f"{usage} ({exc})") from None
        return cls(share, abs_bytes)

    @property
    def text(self) -> str:
        return f"{self.share * 100:g}% and {format_size(self.abs_bytes)}"


@dataclass(frozen=True)
class Comparison:
    """One compared value: a subject's memory in a phase, in both runs."""
    phase: str
    iteration: int | None  # None: all instances of the phase
    subject: str           # "vm:gpu0", "actor rank 0 on vm:gpu0"
    gpu: str               # the GPU's label, "" for host memory of a CPU run
    memory: str            # GPU_USED, "GPU own (proc)", HOST_RSS
    stat: Literal["peak", "floor", "floor_growth"]  # floor_growth: runs without phases (gate_by_time.py)
    baseline: int
    current: int
    regressed: bool

    @property
    def growth(self) -> int:
        return self.current - self.baseline

    @property
    def share(self) -> float:
        return self.growth / self.baseline if self.baseline > 0 else float("inf") if self.growth > 0 else 0.0

    @property
    def where(self) -> str:
        return self.phase if self.iteration is None else instance_label(self.phase, self.iteration)

    @property
    def message(self) -> str:
        return (f"{self.where}: {self.memory} {self.stat.replace('_', ' ')} of {self.subject} {format_size(self.baseline)} -> "
                f"{format_size(self.current)} ({self.growth / MiB:+,.0f} MiB, {self.share * 100:+.1f}%)")


@dataclass(frozen=True)
class RegressionResult:
    current: str
    baseline: str
    thresholds: RegressionThresholds
    compared: tuple[Comparison, ...]
    not_compared: tuple[str, ...]   # what only one run has, one line each
    not_selected: tuple[str, ...]   # phase names left out by the selection (--phase)
    matched_by: str                 # "identity" (host, UUID) or "rank"

    @property
    def regressions(self) -> list[Comparison]:
        return sorted((c for c in self.compared if c.regressed), key=lambda c: -c.growth)

    @property
    def status(self) -> Literal["pass", "fail", "n/a"]:
        return "fail" if self.regressions else "pass" if self.compared else "n/a"

    @property
    def summary(self) -> str:
        bad = self.regressions
        if bad:
            phases = ", ".join(dict.fromkeys(c.where for c in bad))
            gpus = ", ".join(dict.fromkeys(c.gpu for c in bad if c.gpu))
            return (f"{len(bad)} of {len(self.compared)} values grew by more than {self.thresholds.text} "
                    f"against {self.baseline}: phases {phases}; " + (f"GPUs {gpus}" if gpus else "host memory only"))
        if not self.compared:
            return f"nothing to compare with {self.baseline}" + (f" ({self.not_compared[0]})" if self.not_compared else "")
        worst = max(self.compared, key=lambda c: c.growth)
        return (f"{len(self.compared)} values within {self.thresholds.text} of {self.baseline} "
                f"(largest growth: {worst.message})")

    def lines(self, limit: int = 20) -> list[str]:
        """The verdict as printed by visualize: status, summary, each regression, what was not compared."""
        out = [f"  {self.status.upper():4}  baseline  {self.summary}"]
        out += [f"        regressed: {c.message}" for c in self.regressions[:limit]]
        if len(self.regressions) > limit:
            out.append(f"        ... and {len(self.regressions) - limit} more regressions")
        if self.matched_by == "rank":
            out.append("        GPUs and processes matched by rank: their hosts or GPU UUIDs differ between the runs")
        out += [f"        not compared: {n}" for n in self.not_compared[:limit]]
        if len(self.not_compared) > limit:
            out.append(f"        ... and {len(self.not_compared) - limit} more not compared")
        if self.not_selected:
            out.append(f"        phases not selected (--phase): {', '.join(self.not_selected)}")
        return out


# -- what each run holds ------------------------------------------------------------------------
def phase_measures(run, by_iteration: bool = False) -> pd.DataFrame:
    """One row per (phase[, iteration], subject, memory): its highest peak and highest floor (bytes,
    float). Keys: `exact_key` (host, UUID, role, rank) and `rank_key` (role, rank)."""
    raw = phase_table(run)
    if raw.empty:
        return pd.DataFrame(columns=MEASURE_COLUMNS)
    df = fleet.normalize(raw)
    lanes = fleet.lanes(df).set_index("lane")
    df["lane_label"] = lanes["label"].reindex(df["lane"]).to_numpy()
    df["lane_ranks"] = lanes["ranks"].reindex(df["lane"]).to_numpy()
    df["iteration"] = df["iteration"] if by_iteration else -2
    procs = _process_keys(df)
    df = df.merge(procs, on=["host", "pid"], how="left")
    on_gpu = df["lane_kind"] == "gpu"
    gpu_label = np.where(on_gpu, df["lane_label"], "")
    parts = [
        # each process's own GPU memory, on its GPU
        pd.DataFrame({"exact_key": "proc|" + df["proc_exact"], "rank_key": "proc|" + df["proc_rank"],
                      "subject": df["proc_label"], "gpu": gpu_label,
                      "memory": "GPU own (" + df["own_series"].astype(str) + ")",
                      "peak": df["own_peak"], "floor": df["own_floor"]})[on_gpu.to_numpy()],
        # each process's host RSS
        pd.DataFrame({"exact_key": "proc|" + df["proc_exact"], "rank_key": "proc|" + df["proc_rank"],
                      "subject": df["proc_label"], "gpu": gpu_label, "memory": HOST_RSS,
                      "peak": df["rss_peak"], "floor": df["rss_floor"]}),
        # the device, whoever holds it
        pd.DataFrame({"exact_key": "gpu|" + df["host"] + "|" + df["gpu_uuid"],
                      "rank_key": "gpu|ranks " + df["lane_ranks"].astype(str).where(df["lane_ranks"] != "",
                                                                                   df["lane_label"]),
                      "subject": df["lane_label"], "gpu": gpu_label, "memory": GPU_USED,
                      "peak": df["used_peak"], "floor": df["used_floor"]})[on_gpu.to_numpy()],
    ]
    keys = ["phase", "iteration", "exact_key", "rank_key", "subject", "gpu", "memory"]
    long = pd.concat([p.assign(phase=df["phase"][p.index], iteration=df["iteration"][p.index]) for p in parts],
                     ignore_index=True)
    long = long[np.isfinite(long["peak"].to_numpy(float)) | np.isfinite(long["floor"].to_numpy(float))]
    out = long.groupby(keys, sort=False, dropna=False).agg(peak=("peak", "max"), floor=("floor", "max"))
    return out.reset_index()[MEASURE_COLUMNS]


def _process_keys(df: pd.DataFrame) -> pd.DataFrame:
    """Per (host, pid): its keys and label. Processes that share (host, GPU, role, rank) are told apart
    by the order they first ran in (occurrence)."""
    procs = df.groupby(["host", "pid"], sort=False).agg(
        gpu_uuid=("gpu_uuid", "first"), role=("role", "first"), rank=("rank", "first"),
        lane_label=("lane_label", "first"), start=("t0", "min")).reset_index().sort_values("start", kind="stable")
    exact = procs["host"] + "|" + procs["gpu_uuid"] + "|" + procs["role"] + "|" + procs["rank"].astype(str)
    by_rank = procs["role"] + "|" + procs["rank"].astype(str)
    procs["proc_exact"] = exact + "|" + procs.groupby(exact).cumcount().astype(str)
    procs["proc_rank"] = by_rank + "|" + procs.groupby(by_rank).cumcount().astype(str)
    who = np.where(procs["rank"] >= 0, (procs["role"].map(role_text) + " rank " +
                                        procs["rank"].astype(str)), "pid " + procs["pid"].astype(str))
    # a rank's own host lane ("vm:rank0") adds nothing to "trainer rank 0" but its host
    lane = procs["lane_label"].astype(str)
    own_lane = lane == procs["host"].astype(str) + ":rank" + procs["rank"].astype(str)
    procs["proc_label"] = who + " on " + np.where(own_lane, procs["host"].astype(str), lane)
    return procs[["host", "pid", "proc_exact", "proc_rank", "proc_label"]]


# -- the comparison -----------------------------------------------------------------------------
def _choose_key(current: pd.DataFrame, baseline: pd.DataFrame) -> str:
    """Identity when it matches every subject of both runs, else whichever key matches more of them."""
    overlap = {}
    for key in ("exact_key", "rank_key"):
        a, b = set(current[key]), set(baseline[key])
        if a == b:
            return key
        overlap[key] = len(a & b)
    return "rank_key" if overlap["rank_key"] > overlap["exact_key"] else "exact_key"


def compare_runs(current, baseline, thresholds: RegressionThresholds | None = None, selection=None,
                 by_iteration: bool = False, current_name: str | None = None,
                 baseline_name: str | None = None) -> RegressionResult:
    """`current` against `baseline` (loaded runs, or `phase_measures` frames). `selection`: a
    phase_select.PhaseSelection; phases it leaves out are listed in `not_selected`, not compared."""
    th = thresholds or RegressionThresholds()
    if th.share < 0 or th.abs_bytes < 0:
        raise MilesProfileError("regression thresholds must not be negative")
    cur = current if isinstance(current, pd.DataFrame) else phase_measures(current, by_iteration)
    base = baseline if isinstance(baseline, pd.DataFrame) else phase_measures(baseline, by_iteration)
    cur_name = current_name or getattr(current, "name", "this run")
    base_name = baseline_name or getattr(baseline, "name", "the baseline")
    if (cur.empty or base.empty) and not isinstance(current, pd.DataFrame) and not isinstance(baseline, pd.DataFrame):
        # a run without phases (nothing tagged its steps): both compared as whole runs, by time
        from miles_profile.verdicts.gate_by_time import time_measures
        cur, base = time_measures(current), time_measures(baseline)
    not_selected: list[str] = []
    if selection is not None:
        _, not_selected = selection.split([*cur["phase"], *base["phase"]])
        cur, base = cur[cur["phase"].map(selection.matches)], base[base["phase"].map(selection.matches)]
    key = _choose_key(cur, base) if len(cur) and len(base) else "exact_key"
    on = ["phase", "iteration", key, "memory"]
    merged = cur.merge(base, on=on, how="outer", suffixes=("", "_base"), indicator=True)
    not_compared = _not_compared(merged, on, cur_name, base_name)
    both = merged[merged["_merge"] == "both"]
    compared = []
    for row in both.itertuples(index=False):
        for stat in ("peak", "floor", "floor_growth"):
            now, before = getattr(row, stat, np.nan), getattr(row, f"{stat}_base", np.nan)
            if not (np.isfinite(now) and np.isfinite(before)):
                continue
            growth = now - before
            # the floor's growth is measured against the baseline's floor (its own baseline may be ~0)
            scale = row.floor_base if stat == "floor_growth" else before
            regressed = bool(growth > th.abs_bytes and growth > th.share * scale)
            compared.append(Comparison(row.phase, None if row.iteration == -2 else int(row.iteration), row.subject,
                                       row.gpu, row.memory, stat, int(before), int(now), regressed))
    if not compared:  # a gate that compares nothing would pass forever: say so and stop (exit 2)
        raise MilesProfileError(f"--baseline {base_name} shares no measured phase, GPU or process with {cur_name}: "
                                f"nothing to compare ({'; '.join(not_compared[:3]) or 'no phases in either run'}"
                                f"{'; ...' if len(not_compared) > 3 else ''})")
    return RegressionResult(cur_name, base_name, th, tuple(compared), tuple(not_compared), tuple(not_selected),
                            "identity" if key == "exact_key" else "rank")


def _not_compared(merged: pd.DataFrame, on: list[str], cur_name: str, base_name: str) -> list[str]:
    """One line per phase found in one run only, then per (subject, memory) found in one run only."""
    lines = []
    where = {"left_only": f"only in {cur_name}", "right_only": f"only in the baseline {base_name}"}
    phase_side = merged.groupby(["phase", "iteration"], sort=False)["_merge"].agg(set)
    lonely_phases = set()
    for (phase, iteration), sides in phase_side.items():
        if "both" not in sides and len(sides) == 1:
            side = next(iter(sides))
            label = phase if iteration == -2 else instance_label(phase, iteration)
            lines.append(f"phase {label}: {where[side]}")
            lonely_phases.add((phase, iteration))
    rest = merged[(merged["_merge"] != "both") &
                  ~pd.Series(list(zip(merged["phase"], merged["iteration"])), index=merged.index).isin(lonely_phases)]
    subject = rest["subject"].where(rest["subject"].notna(), rest.get("subject_base"))
    for (who, memory, side), group in rest.assign(_who=subject).groupby(["_who", "memory", "_merge"], sort=False,
                                                                        observed=True):
        phases = ", ".join(dict.fromkeys(group["phase"].astype(str)))
        lines.append(f"{memory} of {who}: {where[str(side)]} (phases {phases})")
    return lines
