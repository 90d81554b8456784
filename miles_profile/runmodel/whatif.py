"""The offload what-if: for every offload (or release) and every category of memory it freed, the peak
the phases after it would have had had that memory stayed on the device, against the device total and
the headroom threshold, and what the round trip (the offload and the onload that brought it back)
cost. A pure function of a Run and its ledger (runmodel/ledger.py); docs/transitions.md explains it.

    whatif(run, ledger_frame=None, thresholds=None) -> WhatIf
        .table                 one row per (offload phase, category), plus `all` per offload phase
        .peak_if_kept(names)   the run's device peak had the offloads named stayed (e.g. ["offload_kv"])
        .measured_peak         the run's device peak as recorded (same series, same phases)
    whatif_of(run, ledger_frame) -> WhatIf      # the same, cached per run and ledger (report and --json share it)

How: the ledger says, per offload instance, which declared categories of the working device (GPU; the
host on a CPU run) it freed and how many bytes. Those bytes are away until the first later phase of
the same process that gives at least half of them back (the onload); every phase in between would
have held them on top of its own peak. Phase peaks are NVML's device used (what counts against the
device total, and what sees a torch_memory_saver pause), else the allocator's true peak; on a CPU run
the process's RSS true peak against the host total. The headroom threshold is the headroom check's
(verdicts/headroom.py: Thresholds.headroom_max_share, default peak.HEADROOM_MAX_SHARE); this module judges
nothing, it only compares.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.runmodel.ledger import ledger
from miles_profile.runmodel.peak import HEADROOM_MAX_SHARE, host_total
from miles_profile.runmodel.stats import phase_instances
from miles_profile.runmodel.transitions import OFFLOAD, ONLOAD, kind_of, phase_ends

ALL = "all"
FITS, NO_HEADROOM, DOES_NOT_FIT, UNKNOWN = "fits", "fits the device, not the headroom", "does not fit", "total unknown"
_NOT_WORKING = {names.PINNED_BUFFERS, names.OFFLOADED_STATE, names.PAUSED}
_BYTES = {"freed", "measured_peak", "whatif_peak", "run_peak_if_kept", "total", "threshold"}
BACK_SHARE = 0.5  # an onload gives back at least this share of what the offload freed

TABLE_COLUMNS = ["offload", "category", "instances", "freed", "peak_phase", "measured_peak", "whatif_peak",
                 "run_peak_if_kept", "total", "threshold", "fits", "offload_s", "onload", "onload_s",
                 "round_trip_s", "series"]


@dataclass
class WhatIf:
    table: pd.DataFrame
    measured_peak: float | None
    series: str  # the peak series: "NVML used", "allocated, true peak", "RSS, true peak"
    total: float | None
    threshold: float | None
    _peaks: np.ndarray | None = None  # per phase of the process judged
    _extra: pd.DataFrame | None = None  # per phase x (offload, category): bytes it would have held more
    _names: np.ndarray | None = None  # per phase: its name
    _iterations: np.ndarray | None = None  # per phase: its iteration (-1: setup, before the first rollout)

    @property
    def empty(self) -> bool:
        return self.table.empty

    def peak_if_kept(self, offloads, categories=None) -> float | None:
        """The device peak over every phase had the named offloads (phase names) kept their
        categories (all of them, or those in `categories`)."""
        if self._extra is None or self._peaks is None or not len(self._peaks):
            return None
        cols = [c for c in self._extra.columns if c[0] in set(offloads)
                and (categories is None or c[1] in set(categories))]
        extra = self._extra[cols].sum(axis=1).to_numpy(float) if cols else 0.0
        return _top(self._peaks + extra)

    def peaks_by_phase(self, offloads=(), categories=None) -> dict[str, float]:
        """Per phase name, its highest peak over the loop's iterations (setup left out: an offload
        that opens the run has no boundary before it, so what it freed is unknown), had the named
        offloads kept their categories (none named: as measured)."""
        if self._peaks is None or self._names is None or not len(self._peaks):
            return {}
        cols = [c for c in self._extra.columns if c[0] in set(offloads)
                and (categories is None or c[1] in set(categories))]
        peaks = self._peaks + (self._extra[cols].sum(axis=1).to_numpy(float) if cols else 0.0)
        loop = self._iterations >= 0
        return {str(n): float(v) for n, v in pd.Series(peaks[loop]).groupby(self._names[loop]).max().items()}

    def to_dict(self) -> dict:
        rows = [{k: None if v is None or (isinstance(v, float) and v != v) else
                 int(round(v)) if k in _BYTES else v for k, v in r.items()} for r in self.table.to_dict("records")]
        def whole(v):
            return None if v is None or v != v else int(round(v))
        return {"series": self.series, "total": whole(self.total), "threshold": whole(self.threshold),
                "measured_peak": whole(self.measured_peak), "rows": rows}


def _top(values: np.ndarray) -> float:
    """The highest finite value, NaN when there is none (a phase without samples has no peak)."""
    finite = values[np.isfinite(values)]
    return float(finite.max()) if len(finite) else float("nan")


def _peak_series(run, instances: pd.DataFrame) -> tuple[str | None, str]:
    """The column of phase_instances holding each phase's device peak, and its name for a person."""
    for i in sorted(int(d.get("index", 0)) for d in run.devices) or [0]:
        for column, what in ((f"gpu{i}_used_peak", "NVML used"), (f"gpu{i}_alloc_peak", "allocated, true peak")):
            if column in instances and instances[column].notna().any():
                return column, what
    return ("rss_peak", "RSS, true peak") if "rss_peak" in instances else (None, "")


def _total(run, column: str | None) -> float | None:
    if column is None:
        return None
    if column.startswith("gpu"):
        index = int(column[3:].split("_")[0])
        found = [d.get("total") for d in run.devices if int(d.get("index", -1)) == index]
        return float(found[0]) if found and isinstance(found[0], (int, float)) and found[0] > 0 else None
    return host_total(run)  # the headroom check's host total too


def _working(ledger_frame: pd.DataFrame, host: str, pid: int) -> pd.DataFrame:
    """Declared bytes of the working device per phase id (rows) and category (columns), in time order."""
    frame = phase_ends(ledger_frame)
    rows = frame[(frame["host"] == host) & (frame["pid"] == pid)]
    on_gpu = (rows["device"] != names.ACCOUNT_HOST).any()
    w = rows[(rows["source"] == "declared") & ~rows["category"].isin(_NOT_WORKING)
             & ((rows["device"] != names.ACCOUNT_HOST) == on_gpu)]
    order = rows.drop_duplicates("id").sort_values("t")["id"].to_list()
    return w.pivot_table(index="id", columns="category", values="bytes", aggfunc="sum").reindex(order).fillna(0.0)


@dataclass(frozen=True)
class _Phase:
    """What matching an offload with its onload needs of a phase (plain values: a long run has thousands)."""
    name: str
    tags: frozenset
    seconds: float
    phase_id: object

    @property
    def kind(self) -> str | None:
        return kind_of(self.name)


def _phase_records(phases: pd.DataFrame, rows: np.ndarray) -> list[_Phase]:
    out = []
    for name, attrs, seconds, phase_id in zip(phases["name"].astype(str).to_numpy()[rows], phases["attrs"].to_numpy()[rows],
                                              phases["duration"].to_numpy(float)[rows], phases["id"].to_numpy()[rows]):
        tags = attrs.get("tags") if isinstance(attrs, dict) else None
        out.append(_Phase(name, frozenset(map(str, tags)) if isinstance(tags, (list, tuple)) else frozenset(),
                          float(seconds), phase_id))
    return out


def _gives_back(offload: _Phase, onload: _Phase, category: str) -> bool:
    """Whether `onload` is the phase that brings back what `offload` freed of `category`: by tags
    (offload_rollout's kv_cache comes back in onload_kv), else by name (offload_train -> onload_train).
    Not by bytes alone: the ledger sums a category over owners (the actor's and the engine's weights)."""
    if onload.kind != ONLOAD:
        return False
    freed, back = offload.tags, onload.tags
    if freed and back:
        return category in back if category in freed else bool(freed & back)
    return not freed and not back and offload.name.split("_", 1)[-1] == onload.name.split("_", 1)[-1]


def _onload_of(mine: list[_Phase], j: int, category: str, nbytes: float, working: pd.DataFrame,
               named: bool) -> int | None:
    """The position of the phase that brings back what the offload at `j` freed of `category`: the first
    later one matching it by tags or name; where no phase of the run does (`named` False), the first
    that gives at least BACK_SHARE of the bytes back."""
    if named:
        return next((m for m in range(j + 1, len(mine)) if _gives_back(mine[j], mine[m], category)), None)
    held = working[category] if category in working else None
    for m in range(j + 1, len(mine)):
        at = working.index.get_loc(mine[m].phase_id) if held is not None and mine[m].phase_id in working.index else 0
        if at > 0 and held.iloc[at] - held.iloc[at - 1] >= BACK_SHARE * nbytes:
            return m
    return None


def _judged_process(phases: pd.DataFrame, hosts: pd.Series, ledger_frame: pd.DataFrame) -> tuple[str, int]:
    """The process that offloads the most (its NVML reads see the whole device), among those of the
    ledger (a fleet's holds the lanes drawn); a run without offloads: the one with the most phases."""
    # lists, not the str (Arrow) columns, and each name's kind once: 138,000 phases at 1,024 processes
    names_ = phases["name"].astype(str).tolist()
    kind_by_name = {n: kind_of(n) for n in set(names_)}
    kinds = [kind_by_name[n] for n in names_]
    keys = list(zip(hosts.tolist(), phases["pid"].astype(int).tolist()))
    in_ledger = set(zip(ledger_frame["host"].astype(str), ledger_frame["pid"].astype(int)))
    offloads = [key for key, kind in zip(keys, kinds) if kind == OFFLOAD]
    candidates = [key for key in offloads if key in in_ledger] or offloads or keys
    return max(dict.fromkeys(candidates), key=candidates.count)


def _judge(peak: float, total: float | None, threshold: float | None) -> str:
    if total is None or peak != peak:
        return UNKNOWN
    return FITS if peak <= threshold else NO_HEADROOM if peak <= total else DOES_NOT_FIT


def whatif(run, ledger_frame: pd.DataFrame | None = None, thresholds=None) -> WhatIf:
    """`thresholds`: the verdicts' Thresholds (only its headroom_max_share is read); None: the default share."""
    if ledger_frame is None:
        ledger_frame = ledger(run)
    share = HEADROOM_MAX_SHARE if thresholds is None else thresholds.headroom_max_share
    phases = run.phases.reset_index(drop=True)
    empty = WhatIf(pd.DataFrame(columns=TABLE_COLUMNS), None, "", None, None)
    if phases.empty or ledger_frame is None or ledger_frame.empty:
        return empty
    instances = phase_instances(run).reset_index(drop=True)
    column, series = _peak_series(run, instances)
    if column is None:
        return empty
    hosts = phases["host"].fillna("").astype(str) if "host" in phases else pd.Series([""] * len(phases))
    host, pid = _judged_process(phases, hosts, ledger_frame)
    own = np.flatnonzero((hosts.to_numpy() == host) & (phases["pid"].to_numpy(np.int64) == pid))
    own = own[np.argsort(phases["start"].to_numpy(float)[own], kind="stable")]
    mine = _phase_records(phases, own)
    peaks = pd.to_numeric(instances[column], errors="coerce").astype(float).to_numpy()[own]
    working = _working(ledger_frame, host, pid)
    total = _total(run, column)
    threshold = None if total is None else share * total
    extra: dict[tuple[str, str], np.ndarray] = {}  # (offload, category) -> bytes each phase would have held more
    trips: dict[tuple[str, str], list] = {}  # (offload, category) -> (bytes, offload s, (onload, s), position)
    named: dict[tuple[str, str], bool] = {}
    for j, phase in enumerate(mine):
        if phase.kind != OFFLOAD or phase.phase_id not in working.index:
            continue
        at = working.index.get_loc(phase.phase_id)
        if at == 0:  # the run's first phase end: what it freed is unknown
            continue
        freed = (working.iloc[at - 1] - working.iloc[at]).clip(lower=0)
        for category, nbytes in freed[freed > 0].items():
            key = (phase.name, category)
            if key not in named:
                named[key] = any(_gives_back(phase, other, category) for other in mine)
            back = _onload_of(mine, j, category, nbytes, working, named[key])
            extra.setdefault(key, np.zeros(len(mine)))[j + 1:len(mine) if back is None else back] += nbytes
            onload = None if back is None else (mine[back].name, mine[back].seconds)
            trips.setdefault(key, []).append((float(nbytes), phase.seconds, onload, j))
    frame = pd.DataFrame(extra, index=range(len(mine)))
    result = WhatIf(pd.DataFrame(columns=TABLE_COLUMNS), _top(peaks) if np.isfinite(peaks).any() else None, series,
                    total, threshold, peaks, frame, np.array([p.name for p in mine]),
                    instances["iteration"].to_numpy(np.int64)[own])
    rows = []
    for offload in dict.fromkeys(name for name, _ in trips):
        cats = [c for (n, c) in trips if n == offload]
        for category in [*cats, ALL] if len(cats) > 1 else cats:
            picked = [trips[(offload, c)] for c in (cats if category == ALL else [category])]
            rows.append(_row(offload, category, picked, peaks, frame, mine, result, total, threshold))
    result.table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    return result


def _row(offload, category, picked, peaks, frame, mine, result, total, threshold) -> tuple:
    cols = [(offload, c) for c in frame.columns.get_level_values(1).unique() if (offload, c) in frame.columns
            and (category == ALL or c == category)]
    held = frame[cols].sum(axis=1).to_numpy(float)
    window = held > 0
    whatif_peak, measured = _top((peaks + held)[window]), _top(peaks[window])
    ranked = np.where(window & np.isfinite(peaks), peaks + held, -np.inf)
    at = int(np.argmax(ranked)) if np.isfinite(ranked).any() else None
    by_instance: dict[int, list] = {}  # offload instance (its position) -> its trips, one per category
    for group in picked:
        for trip in group:
            by_instance.setdefault(trip[3], []).append(trip)
    freed = float(np.mean([sum(t[0] for t in trips) for trips in by_instance.values()]))
    offload_s = float(np.mean([trips[0][1] for trips in by_instance.values()]))
    onloads = [t[2] for trips in by_instance.values() for t in trips if t[2] is not None]
    onload_names = ", ".join(dict.fromkeys(o[0] for o in onloads)) or "never (not given back)"
    # per instance, each distinct onload once (offload_rollout's kv and weights come back in two)
    per_instance = [sum(dict(t[2] for t in trips if t[2] is not None).values()) for trips in by_instance.values()]
    onload_s = float(np.mean(per_instance)) if onloads else np.nan
    return (offload, category, len(by_instance), freed, None if at is None else mine[at].name,
            measured, whatif_peak, result.peak_if_kept([offload], None if category == ALL else [category]),
            total, threshold, _judge(whatif_peak, total, threshold), offload_s, onload_names, onload_s,
            offload_s + (onload_s if onload_s == onload_s else 0.0), result.series)


def whatif_of(run, ledger_frame: pd.DataFrame | None) -> WhatIf:
    cache = run.__dict__.setdefault("_report_cache", {})
    key = ("whatif", id(ledger_frame))
    if key not in cache:
        cache[key] = whatif(run, ledger_frame)
    return cache[key]
