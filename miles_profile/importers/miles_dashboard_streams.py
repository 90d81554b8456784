"""Read the streams of a Miles dashboard directory (see importers/miles_dashboard.py for the schema).

    gpu_frame(root, warnings)   -> ts, node, gpu, mem_mb       (every gpu_util partition, by time)
    proc_frame(root, warnings)  -> ts, node, gpu, pid, mem_mb   (gpu_processes, newer Miles; may be empty)
    phase_frame(root, warnings, lost=None) -> name, t0, t1, node, gpu, rank, role   (open markers resolved;
                                   `lost` gets the time spans of intervals lost to damage)
    (the topology stream: importers/miles_topology.py, topology(root, warnings))

Each reads the v1 flat `<stream>.jsonl` and the hourly `<stream>/<YYYYMMDD_HH>.jsonl` partitions, only
complete lines (a partial last line is a writer mid-append, Miles' own rule); a malformed line is
skipped and counted in `warnings`. Links are not followed.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson

from miles_profile.logdir.files import NotRegularFile, read_data

OPEN_T1 = -1.0  # PhaseEvent.OPEN_T1: the interval was still open when written
GPU_SCHEMA = pa.schema([("ts", pa.float64()), ("node", pa.string()), ("gpu", pa.int64()), ("mem_mb", pa.int64())])
# GpuProcessSample, in a later store.py than the commit read for the rest (gpu_sampler.py at 3e08b1bf
# writes it every 5 s): NVML's per-process usedGpuMemory >> 20, where None (not reported) was written as 0.
PROC_SCHEMA = pa.schema([("ts", pa.float64()), ("node", pa.string()), ("gpu", pa.int64()), ("pid", pa.int64()),
                         ("mem_mb", pa.int64())])
PHASE_SCHEMA = pa.schema([("name", pa.string()), ("t0", pa.float64()), ("t1", pa.float64()), ("node", pa.string()),
                          ("gpus", pa.list_(pa.int64())), ("rank", pa.int64()), ("role", pa.string())])


def stream_files(root: Path, stream: str) -> list[Path]:
    # Links are not followed: the dashboard serves what is under its root only (dashboards/paths.py).
    # A FIFO or device is listed: _complete_lines refuses it with a warning (never opens it blocking).
    legacy = root / f"{stream}.jsonl"
    folder = root / stream
    parts = sorted(folder.glob("*.jsonl")) if folder.is_dir() and not folder.is_symlink() else []
    return [p for p in ([legacy] if legacy.exists() else []) + parts if not p.is_symlink()]


def _complete_lines(path: Path, stream: str, warnings: list[str], lossy: list[bool] | None = None) -> bytes:
    """The file's complete lines; `lossy` (when given) gets True appended where lines were lost."""
    lost = False
    try:  # regular files only, holes skipped, at most DATA_MAX_BYTES (logdir/files.py)
        data, cut = read_data(path)
    except NotRegularFile as exc:
        warnings.append(f"{stream}/{exc}, skipped")
        data, cut, lost = b"", False, True
    if cut:
        warnings.append(f"{stream}/{path.name}: only its first {len(data):,} data bytes were read")
        lost = True
    end = data.rfind(b"\n")
    if end + 1 < len(data):
        line = data[: end + 1].count(b"\n") + 1
        warnings.append(f"{stream}/{path.name}: dropped a truncated last line (line {line})")
        lost = True
    if lossy is not None:
        lossy.append(lost)
    return data[: end + 1]


def _lines_slowly(data: bytes, schema: pa.Schema) -> tuple[pd.DataFrame, int]:
    """Line by line where Arrow's parser refused the file: the good lines, and how many were not."""
    rows, bad = [], 0
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif line.strip():
            bad += 1
    frame = pd.DataFrame(rows, columns=schema.names)
    for f in schema:
        if pa.types.is_floating(f.type) or pa.types.is_integer(f.type):
            frame[f.name] = pd.to_numeric(frame[f.name], errors="coerce")
        elif pa.types.is_string(f.type):
            frame[f.name] = frame[f.name].map(lambda v: v if isinstance(v, str) else None).astype(object)
        else:
            frame[f.name] = frame[f.name].map(lambda v: v if isinstance(v, list) else []).astype(object)
    return frame, bad


def _stream_frame(root: Path, stream: str, schema: pa.Schema, warnings: list[str],
                  lossy: list[bool] | None = None) -> pd.DataFrame:
    """Every complete line of a stream as columns (Arrow's JSON reader: a 512-GPU hour is 1.8 million
    gpu_util lines; Python's json takes seconds for them); fields outside `schema` are ignored. With
    `lossy`, each row also gets `_part` (its file's position among the stream's files) and `lossy[k]`
    says whether file k lost lines (cut, malformed, unreadable)."""
    frames, bad = [], 0
    options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    for k, path in enumerate(stream_files(root, stream)):
        data = _complete_lines(path, stream, warnings, lossy)
        if not data.strip():
            continue
        try:
            frame = pajson.read_json(io.BytesIO(data), parse_options=options).to_pandas()
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            frame, n = _lines_slowly(data, schema)
            bad += n
            if lossy is not None and n:
                lossy[k] = True
        frames.append(frame.assign(_part=k) if lossy is not None else frame)
    if bad:
        warnings.append(f"{stream}: skipped {bad} malformed lines")
    if not frames:
        empty = {f.name: pd.Series(dtype=object) for f in schema}
        return pd.DataFrame({**empty, "_part": pd.Series(dtype="int64")} if lossy is not None else empty)
    return pd.concat(frames, ignore_index=True)


def gpu_frame(root: Path, warnings: list[str], lost: list | None = None) -> pd.DataFrame:
    """`lost` (when given) gets the time span of each partition that lost lines (cut, malformed): a
    phase there may have lost the samples that held its peak, so no boundary there is judged."""
    lossy: list[bool] | None = [] if lost is not None else None
    frame = _stream_frame(root, "gpu_util", GPU_SCHEMA, warnings, lossy)
    if lost is not None and lossy and any(lossy):
        ts = pd.to_numeric(frame["ts"], errors="coerce").to_numpy(float)
        part = frame["_part"].to_numpy(np.int64) if len(frame) else np.zeros(0, np.int64)
        for k in (k for k, bad in enumerate(lossy) if bad):
            before, after = ts[(part < k) & np.isfinite(ts)], ts[(part > k) & np.isfinite(ts)]
            lost.append((float(before.max()) if len(before) else None, float(after.min()) if len(after) else None))
    frame = frame.drop(columns="_part", errors="ignore")
    for column in ("ts", "gpu", "mem_mb"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    good = frame[["ts", "gpu", "mem_mb", "node"]].notna().all(axis=1)
    if (~good).any():
        warnings.append(f"gpu_util: skipped {int((~good).sum())} samples without ts, node, gpu or mem_mb")
    negative = good & (frame["mem_mb"] < 0)  # NVML used >> 20 is never negative: damage, not a value
    if negative.any():
        warnings.append(f"gpu_util: skipped {int(negative.sum())} samples with a negative mem_mb")
    frame = frame[good & ~negative].astype({"ts": "float64", "gpu": "int64", "mem_mb": "int64", "node": str})
    return frame.sort_values("ts", kind="stable").reset_index(drop=True)


def proc_frame(root: Path, warnings: list[str]) -> pd.DataFrame:
    frame = _stream_frame(root, "gpu_processes", PROC_SCHEMA, warnings)
    for column in ("ts", "gpu", "pid", "mem_mb"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    good = frame[["ts", "gpu", "pid", "node"]].notna().all(axis=1)
    if (~good).any():
        warnings.append(f"gpu_processes: skipped {int((~good).sum())} samples without ts, node, gpu or pid")
    frame = frame[good].astype({"ts": "float64", "gpu": "int64", "pid": "int64", "mem_mb": "float64", "node": str})
    return frame.sort_values("ts", kind="stable").reset_index(drop=True)


def _first_gpu(gpus) -> int | None:
    """The first index of a `gpus` list (-1 for none); None where it is no GPU index ("", 1.5, "x")."""
    if gpus is None:
        return -1
    if isinstance(gpus, (str, bytes)) or not hasattr(gpus, "__len__"):
        return None
    if not len(gpus):
        return -1
    first = gpus[0]
    try:
        index = int(first)
    except (TypeError, ValueError, OverflowError):
        return None
    return index if 0 <= index < 1 << 16 and index == first else None


def phase_frame(root: Path, warnings: list[str], lost: list[tuple[float | None, float | None]] | None = None
                ) -> pd.DataFrame:
    """gpu is the first of `gpus` (-1 for none); an open marker whose closing event exists (same node,
    rank, name, t0) and exact duplicates are dropped. `lost` (when given) gets the time spans where an
    interval was lost: a dropped interval's own [t0, t1] where both are times, else the whole span of
    the file it was in (from the latest time of the files before it to the earliest of those after)."""
    lossy: list[bool] = []
    frame = _stream_frame(root, "phases", PHASE_SCHEMA, warnings, lossy)
    good = frame[["name", "t0", "t1", "node"]].notna().all(axis=1)
    if (~good).any():
        warnings.append(f"phases: skipped {int((~good).sum())} intervals without name, t0, t1 or node")
    gpus_all = [_first_gpu(g) for g in frame["gpus"]]
    if lost is not None:
        _lost_spans(frame, good.to_numpy() & np.array([g is not None for g in gpus_all], dtype=bool), lossy, lost)
    frame = frame[good]
    gpus = [g for g, ok in zip(gpus_all, good) if ok]
    if any(g is None for g in gpus):
        warnings.append(f"phases: {sum(g is None for g in gpus)} intervals with `gpus` that are no GPU indices; "
                        "placed on no GPU")
    out = pd.DataFrame({
        "name": frame["name"].astype(str).to_numpy(object),
        "t0": pd.to_numeric(frame["t0"], errors="coerce").to_numpy(float),
        "t1": pd.to_numeric(frame["t1"], errors="coerce").to_numpy(float),
        "node": frame["node"].astype(str).to_numpy(object),
        "gpu": [-1 if g is None else g for g in gpus],
        "rank": pd.to_numeric(frame["rank"], errors="coerce").fillna(-1).to_numpy(np.int64),
        "role": frame["role"].fillna("").astype(str).to_numpy(object),
    })
    # an interval that ends before it starts (a retyped t0 or t1) is no interval: where it began is kept,
    # so the gap it leaves is not judged as memory held outside any phase
    backwards = ((out["t1"] != OPEN_T1) & ~(out["t1"] >= out["t0"])).to_numpy()
    if backwards.any():
        first = out[backwards].iloc[0]
        warnings.append(f"phases: skipped {int(backwards.sum())} intervals that end before they start (first: "
                        f"{first['name']!r} of rank {first['rank']} on {first['node']}, t0 {first['t0']}, "
                        f"t1 {first['t1']})")
        if lost is not None:
            lost += [(t, t) for t in np.r_[out["t0"].to_numpy()[backwards], out["t1"].to_numpy()[backwards]]
                     if np.isfinite(t)]
        out = out[~backwards]
    key = pd.MultiIndex.from_frame(out[["node", "rank", "name", "t0"]])
    opened = (out["t1"] == OPEN_T1).to_numpy()
    out = out[~(opened & key.isin(key[~opened]))].drop_duplicates()
    return out.sort_values(["t0", "t1"], ascending=[True, False], kind="stable").reset_index(drop=True)


def _lost_spans(frame: pd.DataFrame, placed: np.ndarray, lossy: list[bool], lost: list) -> None:
    """Spans of the intervals `placed` leaves out (their own times where both are), and of the files
    that lost lines (the whole of the file's time: its lines are not in time order)."""
    t0 = pd.to_numeric(frame["t0"], errors="coerce").to_numpy(float)
    t1 = pd.to_numeric(frame["t1"], errors="coerce").to_numpy(float)
    part = frame["_part"].to_numpy(np.int64) if len(frame) else np.zeros(0, np.int64)
    lossy = list(lossy)
    timed = np.isfinite(t0) & np.isfinite(t1)
    for k in np.flatnonzero(~placed):
        if timed[k]:  # an open marker's interval is its closing line's: only its start is known here
            lost.append((float(t0[k]), float(t0[k]) if t1[k] == OPEN_T1 else float(t1[k])))
        elif 0 <= part[k] < len(lossy):
            lossy[part[k]] = True
    stamp = np.where(t1 == OPEN_T1, t0, np.fmax(t0, t1))
    for k in (k for k, bad in enumerate(lossy) if bad):
        before = stamp[(part < k) & np.isfinite(stamp)]
        after = t0[(part > k) & np.isfinite(t0)]
        lost.append((float(before.max()) if len(before) else None, float(after.min()) if len(after) else None))
