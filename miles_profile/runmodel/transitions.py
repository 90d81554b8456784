"""The transition meter: what every offload, onload, release, resume and weight update cost. A pure
function of a Run and its ledger (runmodel/ledger.py); docs/transitions.md explains each column.

    transitions(run, ledger_frame=None) -> Transitions
    meter_of(run, ledger_frame) -> Transitions   # the same, cached per run and ledger (report and --json share it)
    meter_key(ledger_frame) -> tuple              # its key in the run's cache
        .table      one row per transition phase instance (TABLE_COLUMNS)
        .by_kind    per (phase, tags, link): count, bytes, seconds, GB/s, ratio to the ceiling
        .steps      per process and iteration: step seconds, seconds in transitions, share
        .share      seconds in transitions / seconds of the iterations, over the processes that made
                    transitions (None: no iteration)
        .ceilings   link -> bytes/s from the run's calibration (record --calibrate); {} when none

Bytes moved, three ways, never mixed: `declared` is the phase's `expected_bytes` (`weights_bytes` for
update_weights); `measured` is what the ledger's declared categories of the working device (the GPU,
the host on a CPU run; host buffers and pauses left out) lost in an offload or gained in an onload,
from the previous phase end of the same process to this one; `nvml` is the change of NVML device used
over the same span. The rate is measured bytes (else declared) per second of the phase.

A ceiling is the link's calibrated bytes/s: pinned host<->device for a training-state offload to cpu
on a GPU, disk write/read for one to disk, memcpy on a CPU run; update_weights reads the policy's
weights where the training state is (device copy, pinned host->device after an offload to cpu, disk
read after one to disk: trainer/actor.py weight_chunks); a
release/resume of engine tags is a copy only where host memory took the bytes (otherwise the memory
was given up, nothing was copied, and no ceiling applies). No calibration: no ratio ("ceiling not
measured"). Rates are GB/s (1e9 bytes per second), as link specifications and docs/benchmarks.md state them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.calibrate import ceilings_of
from miles_profile.runmodel.ledger import ledger
from miles_profile.runmodel.stats import process_iterations

GB = 1e9  # bandwidth unit; sizes stay GiB on screen
OFFLOAD, ONLOAD, UPDATE = "offload", "onload", names.UPDATE_WEIGHTS
# Host-side and bookkeeping categories: not the working state a transition moves on or off the device.
_NOT_WORKING = {names.PINNED_BUFFERS, names.OFFLOADED_STATE, names.PAUSED}
# A release whose host memory grew by at least this share of the bytes freed copied them there.
COPY_SHARE = 0.5
NO_COPY = "released (no copy)"

TABLE_COLUMNS = ["host", "pid", "id", "phase", "kind", "iteration", "tags", "target", "backend", "start",
                 "seconds", "declared", "measured", "nvml", "copied", "link", "rate", "ceiling", "ratio"]


@dataclass
class Transitions:
    table: pd.DataFrame
    by_kind: pd.DataFrame
    steps: pd.DataFrame
    share: float | None
    ceilings: dict[str, float] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.table.empty

    def to_dict(self) -> dict:
        """What --json writes: bytes as integers, rates in bytes/s, None where not measured."""
        def records(frame: pd.DataFrame) -> list[dict]:
            return [{k: _json_value(k, v) for k, v in r.items()} for r in frame.to_dict("records")]
        return {"ceilings": self.ceilings, "calibrated": bool(self.ceilings), "share_of_step": self.share,
                "by_kind": records(self.by_kind), "steps": records(self.steps), "phases": records(self.table)}


_BYTES = {"declared", "measured", "nvml"}


def _json_value(key: str, value):
    """None for what was not measured; bytes as integers."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return int(round(value)) if key in _BYTES else value


def kind_of(name: str) -> str | None:
    if name == names.UPDATE_WEIGHTS:
        return UPDATE
    if name.startswith(names.OFFLOAD_PREFIX) or name in ("release", "release_memory_occupation", "sleep"):
        return OFFLOAD
    if name.startswith(names.ONLOAD_PREFIX) or name in ("resume", "resume_memory_occupation", "wake_up"):
        return ONLOAD
    return None


_NO_ATTRS: dict = {}


def _attr(attrs, key):
    return attrs.get(key) if isinstance(attrs, dict) else None


def _tags_of(name: str, attrs) -> str:
    tags = _attr(attrs, "tags")
    if isinstance(tags, (list, tuple)) and tags:
        return "+".join(map(str, tags))
    if name == names.UPDATE_WEIGHTS:
        return names.WEIGHTS
    return names.TRAIN_STATE if name.endswith("_train") else ""


def phase_ends(ledger_frame: pd.DataFrame) -> pd.DataFrame:
    """The ledger's rows at phase ends (a ledger with peaks has rows at each phase's peak as well)."""
    if "at" not in ledger_frame or ledger_frame.empty:
        return ledger_frame
    return ledger_frame[ledger_frame["at"].fillna("end") == "end"]


def _declares(attrs) -> bool:
    # no generator per phase: 138,000 of them at 1,024 processes
    return isinstance(attrs, dict) and (isinstance(attrs.get("expected_bytes"), (int, float))
                                        or isinstance(attrs.get("weights_bytes"), (int, float)))


def _mirrors(phases: pd.DataFrame, hosts: list, attrs: list) -> np.ndarray:
    """True for the server side of a call the client recorded: a phase that declares no bytes, inside a
    same-named phase of another process that does (an engine server's /release_memory_occupation inside
    the actor's offload_kv). Ranks' own phases, which declare their bytes, overlap and are all kept."""
    out = np.zeros(len(phases), dtype=bool)
    key = np.array([f"{h}:{p}" for h, p in zip(hosts, phases["pid"].tolist())], dtype=object)
    declares = np.array([_declares(a) for a in attrs], dtype=bool)
    for _, rows in phases.groupby("name", sort=False).indices.items():
        clients, servers = rows[declares[rows]], rows[~declares[rows]]
        if not len(clients) or not len(servers):
            continue
        s, e = phases["start"].to_numpy(float), phases["end"].to_numpy(float)
        for j in servers:
            out[j] = bool(np.any((key[clients] != key[j]) & (s[clients] <= s[j]) & (e[clients] >= e[j])))
    return out


@dataclass
class _Boundaries:
    """One process's phase ends in time order: declared bytes of its working device per category, its
    declared host buffers, NVML device used and host RSS (NaN where not measured)."""
    at: dict  # phase id -> row
    working: np.ndarray  # (phase ends, categories)
    host_kept: np.ndarray
    used: np.ndarray
    rss: np.ndarray

    def deltas(self, phase_id: int) -> tuple[float, float, float, float] | None:
        """(freed, taken, NVML change, host change) from the phase end before `phase_id`'s to its own."""
        k = self.at.get(phase_id)
        if k is None or k == 0:
            return None
        change = self.working[k] - self.working[k - 1]
        host = np.fmax(self.rss[k] - self.rss[k - 1], self.host_kept[k] - self.host_kept[k - 1])  # NaN: unknown
        return (float(np.clip(-change, 0, None).sum()), float(np.clip(change, 0, None).sum()),
                float(self.used[k] - self.used[k - 1]), float(host))


def _boundaries(ledger_frame: pd.DataFrame | None) -> dict[tuple[str, int], _Boundaries]:
    out: dict[tuple[str, int], _Boundaries] = {}
    if ledger_frame is None or ledger_frame.empty:
        return out
    frame = phase_ends(ledger_frame)
    for (host, pid), rows in frame.groupby(["host", "pid"], sort=False):
        ids = rows.drop_duplicates("id").sort_values("t")["id"].to_list()
        on_gpu = bool((rows["device"] != names.ACCOUNT_HOST).any())
        declared = rows["source"] == "declared"
        device = (rows["device"] != names.ACCOUNT_HOST) == on_gpu
        working = rows[declared & ~rows["category"].isin(_NOT_WORKING) & device]
        cats = working.pivot_table(index="id", columns=["device", "category"], values="bytes", aggfunc="sum")
        kept = rows[declared & (rows["device"] == names.ACCOUNT_HOST) & rows["category"].isin(_NOT_WORKING)]
        used = rows[device].groupby(["id", "device"])["total"].first().groupby("id").sum(min_count=1)
        rss = rows[rows["device"] == names.ACCOUNT_HOST].groupby("id")["total"].first()
        out[(str(host), int(pid))] = _Boundaries(
            {i: k for k, i in enumerate(ids)}, cats.reindex(ids).fillna(0.0).to_numpy(float).reshape(len(ids), -1),
            kept.groupby("id")["bytes"].sum().reindex(ids).to_numpy(float),
            used.reindex(ids).to_numpy(float), rss.reindex(ids).to_numpy(float))
    return out


def _link(kind: str, name: str, target, on_gpu: bool, copied: bool, train_at=None) -> str | None:
    """`train_at`: where the training state is (the target of the last offload_train still in effect,
    None: on the device): update_weights reads the policy's weights from there."""
    if not copied:
        return None
    if kind == UPDATE:
        if train_at == "disk":
            return "disk_read"
        if train_at == "cpu" and on_gpu:
            return "pinned_h2d"
        return "device_copy" if on_gpu else "host_copy"
    if target == "disk":
        return "disk_write" if kind == OFFLOAD else "disk_read"
    if not on_gpu:
        return "host_copy"
    return "pinned_d2h" if kind == OFFLOAD else "pinned_h2d"


def _phase_hosts(phases: pd.DataFrame) -> list[str]:
    # a plain list: iterating the str (Arrow) column itself costs a microsecond a value
    return phases["host"].fillna("").astype(str).tolist() if "host" in phases else [""] * len(phases)


def _rows(run, ledger_frame: pd.DataFrame, ceilings: dict[str, float], hosts_: list[str],
          iterations: np.ndarray) -> pd.DataFrame:
    """`hosts_`, `iterations`: each phase's host and iteration (`transitions` makes them once, `_steps`
    reads them too)."""
    phases = run.phases
    if phases.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    phases = phases.reset_index(drop=True)
    # plain lists: a fleet has tens of thousands of phases, and a pandas row costs 0.5 ms
    names_, attrs_, pids_ = phases["name"].astype(str).tolist(), phases["attrs"].tolist(), phases["pid"].tolist()
    kind_by_name = {n: kind_of(n) for n in set(names_)}  # few names, 138,000 phases at 1,024 processes
    kinds = [kind_by_name[n] for n in names_]
    mirrors = _mirrors(phases, hosts_, attrs_)
    bounds = _boundaries(ledger_frame)
    gpu_pids = set()
    if ledger_frame is not None and len(ledger_frame):
        g = phase_ends(ledger_frame)
        g = g[g["device"] != names.ACCOUNT_HOST]
        gpu_pids = {(str(h), int(p)) for h, p in zip(g["host"], g["pid"])}
    copied_last: dict[tuple, bool] = {}  # (host, pid, tags) -> whether its last release copied
    train_at: dict[tuple, str | None] = {}  # (host, pid) -> where its training state is (None: on the device)
    out = []
    ids_, starts, durations = phases["id"].tolist(), phases["start"].tolist(), phases["duration"].tolist()
    still_open = (phases["status"].astype(str) == names.OPEN).to_numpy() if "status" in phases else np.zeros(len(phases), bool)
    for k in np.argsort(phases["start"].to_numpy(float), kind="stable"):
        kind = kinds[k]
        if kind is None or mirrors[k] or still_open[k]:  # a phase still running has no cost yet
            continue
        name, attrs, host, pid = names_[k], attrs_[k], hosts_[k], int(pids_[k])
        attrs = attrs if isinstance(attrs, dict) else _NO_ATTRS  # _attr's test once, not per key
        pid_id = int(ids_[k]) if ids_[k] == ids_[k] else -1
        tags, target = _tags_of(name, attrs), attrs.get("target")
        declared = attrs.get("weights_bytes" if kind == UPDATE else "expected_bytes")
        declared = float(declared) if isinstance(declared, (int, float)) else np.nan
        d = bounds[(host, pid)].deltas(pid_id) if (host, pid) in bounds else None
        freed, taken, nvml, host_change = d if d is not None else (np.nan,) * 4
        measured = np.nan if kind == UPDATE or d is None else (freed if kind == OFFLOAD else taken)
        if kind == UPDATE or target is not None or name.endswith("_train"):
            copied = True  # the training state goes somewhere; weights are copied into the engine
        elif kind == OFFLOAD:
            copied = bool(measured > 0 and host_change >= COPY_SHARE * measured)
            copied_last[(host, pid, tags)] = copied
        else:
            copied = copied_last.get((host, pid, tags), False)
        link = _link(kind, name, target, (host, pid) in gpu_pids, copied, train_at.get((host, pid)))
        if name.endswith("_train"):
            train_at[(host, pid)] = target if kind == OFFLOAD else None
        seconds = float(durations[k])
        nbytes = measured if measured == measured and measured > 0 else declared
        rate = nbytes / seconds if seconds > 0 and nbytes == nbytes else np.nan
        ceiling = ceilings.get(link, np.nan) if link else np.nan
        out.append((host, pid, pid_id, name, kind, int(iterations[k]), tags, target, attrs.get("backend"),
                    float(starts[k]), seconds, declared, measured, nvml, copied, link or NO_COPY, rate, ceiling,
                    rate / ceiling if ceiling == ceiling and rate == rate else np.nan))
    return pd.DataFrame(out, columns=TABLE_COLUMNS)


def _by_kind(table: pd.DataFrame, step_seconds: float | None) -> pd.DataFrame:
    cols = ["phase", "tags", "link", "setup", "count", "declared", "measured", "seconds", "rate", "ceiling", "ratio",
            "share_of_step"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    t = table.assign(moved=table["measured"].where(table["measured"] > 0, table["declared"]),
                     in_step=table["seconds"].where(table["iteration"] >= 0, 0.0), setup=table["iteration"] < 0)
    # the first offload before the loop allocates (and pins) its buffers: apart from the loop's
    g = t.groupby(["phase", "tags", "link", "setup"], sort=False, dropna=False).agg(
        count=("seconds", "size"), declared=("declared", "sum"), measured=("measured", lambda m: m.sum(min_count=1)),
        seconds=("seconds", "sum"), moved=("moved", lambda m: m.sum(min_count=1)), ceiling=("ceiling", "first"),
        in_step=("in_step", "sum"), first=("start", "min")).reset_index()
    g["rate"] = g["moved"] / g["seconds"].where(g["seconds"] > 0)
    g["ratio"] = g["rate"] / g["ceiling"]
    g["share_of_step"] = g["in_step"] / step_seconds if step_seconds else np.nan  # setup is no step
    return g.sort_values("first")[cols].reset_index(drop=True)


def _union_seconds(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -np.inf
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def _steps(run, table: pd.DataFrame, hosts: list[str], its: np.ndarray) -> pd.DataFrame:
    """Per process that made transitions and per iteration (rollout): its span from the first phase's
    start to the last one's end, the seconds inside its transition phases (overlaps counted once), and
    their share. Per process, so that ranks moving memory at the same time are not added into one step."""
    cols = ["host", "pid", "iteration", "seconds", "transition_seconds", "share"]
    phases = run.phases
    if phases.empty or table.empty:
        return pd.DataFrame(columns=cols)
    pids_ = phases["pid"].to_numpy(np.int64)
    spans = pd.DataFrame({"host": np.array(hosts, dtype=object), "pid": pids_, "iteration": its,
                          "start": phases["start"].to_numpy(float), "end": phases["end"].to_numpy(float)})
    table_hosts = table["host"].tolist()  # lists, not the str columns: iterated per phase
    movers = set(zip(table_hosts, table["pid"].tolist()))
    spans = spans[(its >= 0) & np.array([k in movers for k in zip(hosts, pids_.tolist())], dtype=bool)]
    keys = ["host", "pid", "iteration"]
    steps = spans.groupby(keys).agg(first=("start", "min"), last=("end", "max")).reset_index()
    busy: dict[tuple, list] = {}
    for key, begin, seconds in zip(zip(table_hosts, table["pid"].tolist(), table["iteration"].tolist()),
                                   table["start"].tolist(), table["seconds"].tolist()):
        busy.setdefault(key, []).append((begin, begin + seconds))
    out = []
    for host, pid, it, first, last in steps.itertuples(index=False):
        step = float(last - first)
        moving = _union_seconds(busy.get((host, pid, it), []))
        out.append((host, int(pid), int(it), step, moving, moving / step if step > 0 else np.nan))
    return pd.DataFrame(out, columns=cols)


def transitions(run, ledger_frame: pd.DataFrame | None = None) -> Transitions:
    """The meter for one run; `ledger_frame`: the run's ledger when the caller has it (else computed)."""
    if ledger_frame is None:
        ledger_frame = ledger(run)
    ceilings = ceilings_of(run.meta)
    hosts = _phase_hosts(run.phases)
    iterations = process_iterations(run.phases, hosts) if len(run.phases) else np.zeros(0, np.int64)
    table = _rows(run, ledger_frame, ceilings, hosts, iterations)
    steps = _steps(run, table, hosts, iterations)
    total = float(steps["seconds"].sum()) if len(steps) else 0.0
    share = float(steps["transition_seconds"].sum() / total) if total > 0 else None
    return Transitions(table, _by_kind(table, total or None), steps, share, ceilings)


def meter_key(ledger_frame: pd.DataFrame | None) -> tuple:
    """meter_of's key in the run's cache (report/ledger_beside.py puts a meter made elsewhere there)."""
    return "transitions", id(ledger_frame)


def meter_of(run, ledger_frame: pd.DataFrame | None) -> Transitions:
    cache = run.__dict__.setdefault("_report_cache", {})
    key = meter_key(ledger_frame)
    if key not in cache:  # keyed by the frame object: a report holds its ledger for its life
        cache[key] = transitions(run, ledger_frame)
    return cache[key]
