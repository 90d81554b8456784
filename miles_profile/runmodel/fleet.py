"""Fleet view: pure functions over a per-phase summary table (numpy/pandas, no plotly).

Whole-run analysis of a run of many processes on many GPUs and hosts reads one row per phase
instance, never the samples: its cost grows with phases x processes.

The input, a `PhaseTable`, is a pandas DataFrame with one row per (lane, process, phase instance):

    host         str    host name
    gpu_uuid     str    NVML UUID of the process's GPU; "" for a host-memory lane (CPU run)
    gpu_total    float  the lane's total bytes (the GPU's memory; for a host lane the host's or the
                        cgroup limit), NaN if unknown
    pid          int
    rank         int    -1 unknown; an engine process carries the rank it serves
    role         str    "actor", "engine", ...
    phase        str    canonical name (miles_profile.names)
    phase_id     str|int  unique within the process
    iteration    int    rollout_id, -1 if none
    t0, t1       float  Unix seconds
    expected_bytes float  NaN if none
    S_peak, S_floor, S_first, S_last   for S in SERIES, float bytes, NaN when absent:
                 used (NVML, the whole device), proc (NVML, this process), alloc, reserved (torch
                 allocator of this process), rss (this process's host memory)
    gpu_index    int    optional: the GPU's NVML index on its host, only for labels
    identified   bool   optional (default True): False where the process's meta was unreadable, so its
                        rank, role and GPU are unknown (rank_imbalance leaves it out: fleet_identity.py)

A *lane* is one GPU (host, gpu_uuid); on a run without GPUs it is one rank's host memory (host,
rank: the actor and the engine serving it share the lane; rank -1 gives each process its own).
A process's own memory is read from its first series with any value among proc, reserved (GPU
lanes) or rss (host lanes): `own_series(table)`.

Public API:

    normalize(table) -> DataFrame          # validated copy with `lane`, `own_*` columns added
    gpu_matrix(table) -> GpuMatrix         # lanes x (iteration, phase), peak as share of the total
    coarsen(matrix, max_columns) -> GpuMatrix   # consecutive iterations merged, peaks kept
    rank_outliers(table, top=10) -> Outliers
    floor_slopes(table) -> DataFrame       # Theil-Sen slope of each process's per-iteration floor
    select_lanes(table, spec) -> list[str] # "rank:0-7,host:node3,worst:5,gpu:GPU-1a2b"
    levels_during(t0, t1, peak, last, w0, w1) -> array   # a process's highest level in windows
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from miles_profile import names
from miles_profile.errors import MilesProfileError
from miles_profile.names import iteration_tag, iteration_text
from miles_profile.runmodel.floor_trend import floor_trends

SERIES = ("used", "proc", "alloc", "reserved", "rss")
STATS = ("peak", "floor", "first", "last")
REQUIRED = ("host", "gpu_uuid", "pid", "phase", "t0", "t1")
_DEFAULTS = {"gpu_total": np.nan, "rank": -1, "role": "", "phase_id": None, "iteration": -1,
             "expected_bytes": np.nan, "identified": True}
# A process's own memory: the first of these with any value (NVML per process includes the CUDA
# context and anything the allocator does not see; reserved is the next best).
OWN_GPU_SERIES = ("proc", "reserved", "alloc")
OWN_HOST_SERIES = ("rss",)


def normalize(table: pd.DataFrame) -> pd.DataFrame:
    """A copy with every column of the schema (absent ones NaN/default), typed, plus `lane`, `lane_kind`
    and `own_peak/floor/first/last/own_series` (the process's own memory). Raises MilesProfileError on a
    table that lacks a required column."""
    if table.attrs.get("_lane_normalized") and {"lane_code", "own_peak", "own_last"} <= set(table.columns):
        return table
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise MilesProfileError(f"phase table lacks column(s) {', '.join(missing)}")
    df = table.copy()
    for column, default in _DEFAULTS.items():
        if column not in df:
            df[column] = default if default is not None else np.arange(len(df))
    for s in SERIES:
        for stat in STATS:
            column = f"{s}_{stat}"
            df[column] = pd.to_numeric(df[column], errors="coerce").astype(float) if column in df else np.nan
    df["host"] = df["host"].astype(str)
    df["gpu_uuid"] = df["gpu_uuid"].fillna("").astype(str)
    df["role"] = df["role"].fillna("").astype(str)
    df["phase"] = df["phase"].astype(str)
    df["pid"] = df["pid"].astype(np.int64)
    df["rank"] = pd.to_numeric(df["rank"], errors="coerce").fillna(-1).astype(np.int64)
    df["iteration"] = pd.to_numeric(df["iteration"], errors="coerce").fillna(-1).astype(np.int64)
    if df["identified"].dtype != bool:  # a column of bools is kept as it is (600,000 rows on a large fleet)
        df["identified"] = df["identified"].astype(object).where(df["identified"].notna(), True).astype(bool)
    for column in ("t0", "t1", "gpu_total", "expected_bytes"):
        df[column] = pd.to_numeric(df[column], errors="coerce").astype(float)
    # lane ids are built once per (host, gpu, rank, pid), not per row: string work on 600,000 rows costs seconds
    keys = ["host", "gpu_uuid", "rank", "pid"]
    code = df.groupby(keys, sort=False).ngroup().to_numpy()  # numbered in order of first appearance
    u = df[keys].drop_duplicates().reset_index(drop=True)
    gpu = u["gpu_uuid"].to_numpy(dtype=object) != ""
    host_key = [f"rank{r}" if r >= 0 else f"pid{p}" for r, p in zip(u["rank"], u["pid"])]
    lane = np.array([f"{h}|{g if on else k}" for h, g, on, k in zip(u["host"], u["gpu_uuid"], gpu, host_key)],
                    dtype=object)
    df["lane"] = lane[code]
    df["lane_code"] = pd.factorize(lane)[0][code]  # an integer per lane: fast masks and groupings
    df["lane_kind"] = np.where(gpu, "gpu", "host").astype(object)[code]
    _add_own(df)
    df.attrs["_lane_normalized"] = True
    return df


def _add_own(df: pd.DataFrame) -> None:
    """Per process, its own memory series: the first with any finite peak among the candidates."""
    chosen = pd.Series("", index=df.index, dtype=object)
    for candidates, kind in ((OWN_GPU_SERIES, "gpu"), (OWN_HOST_SERIES, "host")):
        rows = df["lane_kind"] == kind
        for s in reversed(candidates):  # the last assignment wins: the first candidate present
            has = df[f"{s}_peak"].notna().groupby(df["pid"]).transform("any") & rows
            chosen[has] = s
    df["own_series"] = chosen
    for stat in STATS:
        values = np.full(len(df), np.nan)
        for s in set(chosen) - {""}:
            rows = (chosen == s).to_numpy()
            values[rows] = df[f"{s}_{stat}"].to_numpy()[rows]
        df[f"own_{stat}"] = values


def _natural(text: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


# -- lanes -------------------------------------------------------------------------------------
def lanes(table: pd.DataFrame) -> pd.DataFrame:
    """One row per lane in display order (hosts in natural order, then the GPU's index on its host):
    lane, host, gpu_uuid, kind, label ("node3:gpu2" or "node3:rank5"), ranks, roles, pids, total.

    A GPU's index is the `gpu_index` column when the table has one, else its position on the host
    ordered by the lowest rank of its processes (one training rank per GPU makes these the local
    ranks), then by UUID."""
    df = normalize(table)
    # one row per (lane, process): the aggregations below then loop over processes, not phases
    cols = ["lane", "host", "gpu_uuid", "lane_kind", "gpu_total", "rank", "role", "pid"] + \
        (["gpu_index"] if "gpu_index" in df else [])
    procs = df[cols].drop_duplicates(["lane", "pid", "rank", "role"])
    procs = procs.assign(_rank=procs["rank"].where(procs["rank"] >= 0),
                         gpu_total=df.groupby(["lane", "pid"], sort=False)["gpu_total"].transform("max")
                         .loc[procs.index])
    grouped = procs.groupby("lane", sort=False)
    out = grouped.agg(host=("host", "first"), gpu_uuid=("gpu_uuid", "first"), kind=("lane_kind", "first"),
                      total=("gpu_total", "max"), first_rank=("_rank", "min")).reset_index()
    out["index"] = grouped["gpu_index"].min().reindex(out["lane"]).to_numpy() if "gpu_index" in procs else np.nan
    ranks = grouped["rank"].agg(lambda r: ",".join(map(str, sorted({int(x) for x in r if x >= 0}))))
    roles = grouped["role"].agg(lambda r: "+".join(sorted({x for x in r if x}, key=_role_order)))
    pids = grouped["pid"].agg(lambda p: tuple(sorted(set(int(x) for x in p))))
    out["ranks"], out["roles"], out["pids"] = (ranks.reindex(out["lane"]).to_numpy(),
                                               roles.reindex(out["lane"]).to_numpy(),
                                               pids.reindex(out["lane"]).to_numpy())
    out["_host_key"] = out["host"].map(_natural)
    order_key = out["index"].fillna(out["first_rank"].fillna(1e18))
    out = out.assign(_order=order_key).sort_values(["_host_key", "kind", "_order", "gpu_uuid", "lane"])
    position = out.groupby(["host", "kind"]).cumcount()
    index = out["index"].where(out["index"].notna(), position).astype(int)
    out["label"] = np.where(out["kind"] == "gpu", out["host"] + ":gpu" + index.astype(str),
                            out["host"] + ":" + out["lane"].str.split("|").str[1])
    return out.drop(columns=["_host_key", "_order", "first_rank"]).reset_index(drop=True)


def _role_order(role: str) -> tuple:
    return ({"actor": 0, "engine": 1}.get(role, 2), role)


# -- a process's level in time windows ---------------------------------------------------------
def levels_during(t0, t1, peak, last, w0, w1) -> np.ndarray:
    """For each window [w0, w1], the highest level one process held in it, from its phase summaries:
    the largest peak of its phases overlapping the window (t0 < w1 and t1 > w0), and at least the last
    level of its latest phase that ended by w0 (what it held entering the window: between phases a
    process holds what its last phase left). NaN where neither exists.

    Cost O((phases + windows) log phases). Nested phases are fine: a phase inside an enclosing one that
    overlaps the window is counted too, and its peak is at most the enclosing phase's."""
    t0, t1, peak, last = (np.asarray(a, dtype=float) for a in (t0, t1, peak, last))
    w0, w1 = np.asarray(w0, dtype=float), np.asarray(w1, dtype=float)
    n = len(t0)
    if n == 0:
        return np.full(len(w0), np.nan)
    order = np.argsort(t0, kind="stable")
    starts, peaks = t0[order], peak[order]
    reach = np.maximum.accumulate(t1[order])       # monotone: the first row reaching past w0
    i0 = np.searchsorted(reach, w0, "right")
    i1 = np.searchsorted(starts, w1, "left")
    padded = np.append(peaks, np.nan)              # reduceat needs indices < len: pad for i = n
    flat = np.column_stack((np.minimum(i0, n), np.minimum(i1, n))).ravel()
    over = np.fmax.reduceat(padded, flat)[::2]
    over = np.where(i1 > i0, over, np.nan)
    by_end = np.argsort(t1, kind="stable")
    j = np.searchsorted(t1[by_end], w0, "right") - 1
    held = np.where(j >= 0, last[by_end][np.maximum(j, 0)], np.nan)
    return np.fmax(over, held)


# -- the GPU x (iteration, phase) matrix -------------------------------------------------------
@dataclass(frozen=True)
class GpuMatrix:
    """`lanes` (rows, see `lanes()`, plus `source`: what a row's values are), `columns` (iteration,
    iteration_last, phase, t0, t1, label; in time order), `bytes` and `fraction` (rows x columns
    float64, NaN where the lane had no such phase)."""

    lanes: pd.DataFrame
    columns: pd.DataFrame
    bytes: np.ndarray
    fraction: np.ndarray


SOURCE_USED = "NVML used (device)"
SOURCE_SUM = "sum of its processes' own peaks"


def cell_codes(df: pd.DataFrame) -> tuple[np.ndarray, int]:
    """Per row, the code of its (iteration, phase) cell, numbered by the cell's earliest start."""
    key = df["iteration"].astype(str) + ":" + df["phase"]
    col_code, uniques = pd.factorize(key)
    t0 = np.full(len(uniques), np.inf)
    np.fmin.at(t0, col_code, df["t0"].to_numpy())
    rank = np.empty(len(uniques), dtype=np.int64)
    rank[np.argsort(t0, kind="stable")] = np.arange(len(uniques))
    return rank[col_code], len(uniques)


def _codes(df: pd.DataFrame, lane_order: pd.Series):
    """Row codes (lane order) and column codes (cell_codes)."""
    row = pd.Index(lane_order).get_indexer(df["lane"])
    col, n_cols = cell_codes(df)
    return row, col, n_cols


def gpu_matrix(table: pd.DataFrame) -> GpuMatrix:
    """Rows: lanes; columns: (iteration, phase) ordered by their earliest start across the fleet;
    value: the lane's peak during that phase, in bytes and as a share of the lane's total.

    A GPU lane with NVML device `used_peak` takes the highest `used_peak` of its rows in that cell
    (the device's own total, whoever recorded the phase). Without it, the value is the sum over the
    lane's processes of each process's highest own level (proc, else reserved/alloc; rss on a host
    lane) in the cell's window [earliest t0, latest t1]: its phases overlapping the window, or what
    its last phase left when it had none there (`levels_during`). That sum can only overstate (two
    processes' peaks inside one window need not coincide), never miss a process idle in the window.
    """
    df = normalize(table)
    lane_rows = lanes(df)
    row, col, n_cols = _codes(df, lane_rows["lane"])
    n_rows = len(lane_rows)
    values = np.full((n_rows, n_cols), np.nan)
    used = df["used_peak"].to_numpy()
    has_used = pd.Series(np.isfinite(used)).groupby(row).any().reindex(range(n_rows), fill_value=False).to_numpy()
    ok = has_used[row] & np.isfinite(used)
    np.fmax.at(values, (row[ok], col[ok]), used[ok])
    if not has_used.all():
        w0, w1 = _cell_windows(df, row, col, n_rows, n_cols)
        summed = _sum_of_processes(df, row, w0, w1, ~has_used)
        values[~has_used] = summed[~has_used]
    columns = cell_columns(df, col, n_cols)
    lanes_out = lane_rows.assign(source=np.where(has_used, SOURCE_USED, SOURCE_SUM))
    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = values / lanes_out["total"].to_numpy(float)[:, None]
    return GpuMatrix(lanes_out, columns, values, fraction)


def _cell_windows(df, row, col, n_rows, n_cols):
    w0 = np.full((n_rows, n_cols), np.inf)
    w1 = np.full((n_rows, n_cols), -np.inf)
    np.fmin.at(w0, (row, col), df["t0"].to_numpy())
    np.fmax.at(w1, (row, col), df["t1"].to_numpy())
    return w0, w1


def _sum_of_processes(df, row, w0, w1, todo) -> np.ndarray:
    """Per lane and cell: the sum over the lane's processes of levels_during in the cell's window.
    One pass over the rows sorted by (lane, pid), one levels_during call per process."""
    out = np.zeros(w0.shape)
    seen = np.zeros(w0.shape, dtype=bool)
    pid = df["pid"].to_numpy()
    order = np.lexsort((pid, row))
    r_sorted, p_sorted = row[order], pid[order]
    cuts = np.flatnonzero((np.diff(r_sorted) != 0) | (np.diff(p_sorted) != 0)) + 1
    arrays = [df[c].to_numpy(dtype=float)[order] for c in ("t0", "t1", "own_peak", "own_last")]
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(order)]):
        r = r_sorted[a]
        if not todo[r]:
            continue
        cells = np.isfinite(w0[r])
        level = levels_during(*(x[a:b] for x in arrays), w0[r][cells], w1[r][cells])
        out[r, cells] += np.nan_to_num(level)
        seen[r, cells] |= np.isfinite(level)
    return np.where(seen, out, np.nan)


def cell_columns(df, col, n_cols) -> pd.DataFrame:
    """The cells' iteration, phase, t0 (earliest), t1 (latest), label; index = cell code."""
    frame = pd.DataFrame({"col": col, "iteration": df["iteration"].to_numpy(), "phase": df["phase"].to_numpy(),
                          "t0": df["t0"].to_numpy(), "t1": df["t1"].to_numpy()})
    out = frame.groupby("col").agg(iteration=("iteration", "first"), phase=("phase", "first"),
                                   t0=("t0", "min"), t1=("t1", "max")).reindex(range(n_cols))
    out["iteration_last"] = out["iteration"]
    out["label"] = _column_labels(out)
    return out.reset_index(drop=True)


def _column_labels(columns: pd.DataFrame) -> list[str]:
    return [f"{iteration_tag(a)} {p}" if a == b else f"{iteration_tag(a)}–{iteration_text(b)} {p}"
            for a, b, p in zip(columns["iteration"], columns["iteration_last"], columns["phase"])]


def coarsen(matrix: GpuMatrix, max_columns: int) -> GpuMatrix:
    """At most about `max_columns` columns: consecutive iterations merged into equal buckets, each
    (bucket, phase) keeping the highest value of its cells (no peak is lost). Phases without an
    iteration (-1) keep their own columns."""
    cols = matrix.columns
    iterations = np.unique(cols["iteration"][cols["iteration"] >= 0])
    if len(cols) <= max_columns or len(iterations) < 2:
        return matrix
    per_iteration = max(1, int(np.ceil(len(cols) / max(len(iterations), 1))))
    buckets_wanted = max(1, max_columns // per_iteration)
    width = int(np.ceil(len(iterations) / buckets_wanted))
    bucket = np.where(cols["iteration"] >= 0, np.searchsorted(iterations, cols["iteration"]) // width, -1)
    key = pd.Series(bucket).astype(str) + ":" + cols["phase"].astype(str)
    code, uniques = pd.factorize(key)
    t0 = np.full(len(uniques), np.inf)
    np.fmin.at(t0, code, cols["t0"].to_numpy())
    order = np.empty(len(uniques), dtype=np.int64)
    order[np.argsort(t0, kind="stable")] = np.arange(len(uniques))
    new = order[code]
    values = np.full((len(matrix.lanes), len(uniques)), np.nan)
    for k in range(len(cols)):  # columns, not cells: a few thousand fmax over lane vectors
        values[:, new[k]] = np.fmax(values[:, new[k]], matrix.bytes[:, k])
    merged = cols.assign(col=new).groupby("col").agg(
        iteration=("iteration", "min"), iteration_last=("iteration", "max"), phase=("phase", "first"),
        t0=("t0", "min"), t1=("t1", "max")).reset_index(drop=True)
    merged["label"] = _column_labels(merged)
    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = values / matrix.lanes["total"].to_numpy(float)[:, None]
    return replace(matrix, columns=merged, bytes=values, fraction=fraction)


# -- outliers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outliers:
    """Ranked tables, worst first. Every row has lane, host, gpu_uuid, label, phase, iteration, t0, t1
    (where a UI links to: that lane's timeline at that phase) and `value` (bytes, or bytes per
    iteration for the floor slope).

    peak: one row per lane, its highest cell (fraction of its total and bytes);
    floor_slope: one row per process, the Theil-Sen slope of its per-iteration floor (bytes/iteration,
      with its interval; floors only from series read throughout each iteration) and the rise it
      implies over the run; linked to its floor phase in its last iteration;
    shortfall: one row per offload_* phase that dropped less than its expected_bytes (expected minus
      the drop first -> last of the process's own memory), largest first."""

    peak: pd.DataFrame
    floor_slope: pd.DataFrame
    shortfall: pd.DataFrame


_LINK = ["lane", "host", "gpu_uuid", "label", "phase", "iteration", "t0", "t1"]


def rank_outliers(table: pd.DataFrame, top: int = 10, matrix: GpuMatrix | None = None,
                  skip_iterations: int = 1) -> Outliers:
    """`skip_iterations`: warm-up iterations left out of the floor slopes (as floor_trend_leak does:
    the first iteration's floor is below the steady one in every process)."""
    df = normalize(table)
    matrix = matrix if matrix is not None else gpu_matrix(df)
    labels = dict(zip(matrix.lanes["lane"], matrix.lanes["label"]))
    return Outliers(_peak_outliers(matrix).head(top), floor_slopes(df, labels, skip_iterations).head(top),
                    _shortfalls(df, labels).head(top))


def _peak_outliers(matrix: GpuMatrix) -> pd.DataFrame:
    score = np.where(np.isfinite(matrix.fraction), matrix.fraction, np.nan)
    rows = []
    for r in range(len(matrix.lanes)):
        by = score[r] if np.isfinite(score[r]).any() else matrix.bytes[r]
        if not np.isfinite(by).any():
            continue
        c = int(np.nanargmax(by))
        lane, col = matrix.lanes.iloc[r], matrix.columns.iloc[c]
        rows.append(dict(lane=lane["lane"], host=lane["host"], gpu_uuid=lane["gpu_uuid"], label=lane["label"],
                         ranks=lane["ranks"], roles=lane["roles"], phase=col["phase"],
                         iteration=int(col["iteration"]), t0=col["t0"], t1=col["t1"],
                         value=matrix.bytes[r, c], fraction=matrix.fraction[r, c], total=lane["total"]))
    out = pd.DataFrame(rows, columns=_LINK + ["ranks", "roles", "value", "fraction", "total"])
    return out.sort_values(["fraction", "value"], ascending=False, na_position="last").reset_index(drop=True)


def floor_slopes(table: pd.DataFrame, labels: dict | None = None, skip: int = 0) -> pd.DataFrame:
    """One row per process: the Theil-Sen slope of its per-iteration floor (bytes/iteration, with its 95 %
    interval `slope_low`..`slope_high`), fastest first; floors only from a series read throughout each
    iteration (floor_trend.dense_floors: never from NVML readings that fall at a few phase ends)."""
    df = normalize(table)
    labels = labels if labels is not None else dict(zip(*lanes(df)[["lane", "label"]].to_numpy().T))
    fits = floor_trends(df, "pid", skip)
    out = fits.assign(label=fits["lane"].map(labels) if len(fits) else [], value=fits.get("slope"),
                      own_series=fits.get("series"))
    cols = _LINK + ["pid", "rank", "role", "value", "slope_low", "slope_high", "rise", "n", "own_series"]
    return out.reindex(columns=cols).sort_values("value", ascending=False, na_position="last").reset_index(drop=True)


_ROLLOUT_OFFLOADS = (names.OFFLOAD_ROLLOUT, names.OFFLOAD_KV, names.OFFLOAD_WEIGHTS)


def _shortfalls(df: pd.DataFrame, labels: dict) -> pd.DataFrame:
    offloads = df[df["phase"].str.startswith(names.OFFLOAD_PREFIX) & (df["expected_bytes"] > 0)]
    drops = _drops(df)
    dropped = drops.reindex(offloads.index)
    # An actor's rollout offload whose engine runs as a server of the same lane frees the engine's
    # memory, not the actor's: its drop is that of the engine's same-named phase inside its window.
    engines = df[(df["role"] == "engine") & df["phase"].isin(_ROLLOUT_OFFLOADS)]
    delegated = offloads[(offloads["role"] == "actor") & offloads["phase"].isin(_ROLLOUT_OFFLOADS)
                         & offloads["lane"].isin(engines["lane"])]
    if len(delegated):
        found = pd.merge_asof(
            delegated[["lane", "phase", "t0", "t1"]].assign(row=delegated.index).sort_values("t0"),
            engines[["lane", "phase", "t0"]].assign(e_drop=drops.reindex(engines.index))
            .rename(columns={"t0": "e_t0"}).sort_values("e_t0"),
            left_on="t0", right_on="e_t0", by=["lane", "phase"], direction="forward")
        inside = found["e_t0"] <= found["t1"]
        dropped.loc[found.loc[inside, "row"].to_numpy()] = found.loc[inside, "e_drop"].to_numpy()
    out = offloads.assign(dropped=dropped, value=offloads["expected_bytes"] - dropped)
    out = out[out["value"] > 0].assign(label=lambda o: o["lane"].map(labels))
    cols = _LINK + ["pid", "rank", "role", "value", "expected_bytes", "dropped", "own_series"]
    return out.reindex(columns=cols).sort_values("value", ascending=False).reset_index(drop=True)


def _drops(df: pd.DataFrame) -> pd.Series:
    """What each phase dropped: the largest drop any of its process's series saw, from the higher of the
    phase's first level and what the process's previous phase left, to its last. Every series, not the
    own one alone: NVML per-process bytes come every 100 ms from the host sampler (stale across a short
    release) while the allocator misses a torch_memory_saver pause; a shortfall is one no series saw
    freed. A phase shorter than the sampling interval has one row, after the release: the level before
    it is the previous phase's last."""
    lasts = [f"{s}_last" for s in ("reserved", "alloc", "proc", "rss") if f"{s}_last" in df]
    # sorted with the columns read only (the table's str columns were most of the sort)
    order = df[["pid", "t0", *lasts]].sort_values(["pid", "t0"], kind="stable")
    best = pd.Series(np.nan, index=df.index)
    for s in ("reserved", "alloc", "proc", "rss"):
        first, last = f"{s}_first", f"{s}_last"
        if first not in df or last not in df:
            continue
        prev = order.groupby("pid", sort=False)[last].shift(1).reindex(df.index)
        best = np.fmax(best, np.fmax(df[first], prev) - df[last])
    return best


# -- lane selection ----------------------------------------------------------------------------
_TERM = re.compile(r"^(rank|host|worst|gpu):(.+)$")


def select_lanes(table: pd.DataFrame, spec: str, matrix: GpuMatrix | None = None) -> list[str]:
    """The lanes (ids, display order) a spec picks. Terms, comma-combined (a union):
    `rank:A` or `rank:A-B` (lanes holding a process of those ranks), `host:NAME` (shell-style
    wildcards allowed: `host:node1*`), `worst:K` (the K lanes with the highest peak share),
    `gpu:PREFIX` (UUID prefix). Each term must match a lane; otherwise, or on a malformed term, a
    MilesProfileError with one line saying why."""
    df = normalize(table)
    all_lanes = lanes(df)
    picked: set[str] = set()
    terms = [t.strip() for t in str(spec).split(",")]
    if not any(terms):
        raise MilesProfileError("empty lane spec: use e.g. rank:0-7, host:node3, worst:5, gpu:GPU-1a2b")
    for term in terms:
        found = _match(term, df, all_lanes, matrix)
        if not found:
            raise MilesProfileError(f"lane spec term {term!r} matches no lane")
        picked |= found
    return [lane for lane in all_lanes["lane"] if lane in picked]


def _match(term: str, df: pd.DataFrame, all_lanes: pd.DataFrame, matrix: GpuMatrix | None) -> set[str]:
    m = _TERM.match(term)
    if not m:
        raise MilesProfileError(f"bad lane spec term {term!r}: expected rank:A-B, host:NAME, worst:K or gpu:PREFIX")
    kind, arg = m.group(1), m.group(2).strip()
    if kind == "rank":
        r = re.fullmatch(r"(\d+)(?:-(\d+))?", arg)
        if not r or (r.group(2) and int(r.group(2)) < int(r.group(1))):
            raise MilesProfileError(f"bad rank range {arg!r} in lane spec: expected N or A-B with A <= B")
        lo, hi = int(r.group(1)), int(r.group(2) or r.group(1))
        return set(df.loc[df["rank"].between(lo, hi), "lane"])
    if kind == "host":
        return set(all_lanes.loc[[fnmatch.fnmatchcase(h, arg) for h in all_lanes["host"]], "lane"])
    if kind == "gpu":
        return set(all_lanes.loc[(all_lanes["kind"] == "gpu") & all_lanes["gpu_uuid"].str.startswith(arg), "lane"])
    if not arg.isdigit() or int(arg) < 1:
        raise MilesProfileError(f"bad count {arg!r} in lane spec worst:K: expected a positive integer")
    peaks = _peak_outliers(matrix if matrix is not None else gpu_matrix(df))
    return set(peaks["lane"].head(int(arg)))
