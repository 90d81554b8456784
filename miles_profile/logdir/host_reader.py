"""Read the host samplers' files of a run (docs/log-format.md, "Host files") into long frames.

    host_meta(dirs)          -> list of host meta dicts (host, pid, gpus, probes, ...)
    host_frames(dirs, warn, *, samples=True, procs=True, only_hosts=None)
                             -> (host_samples, gpu_samples, gpu_procs)
        host_samples: t, host, host_available, host_total, cgroup_usage, cgroup_limit
        gpu_samples:  t, host, gpu_uuid, used
        gpu_procs:    t, host, gpu_uuid, pid, bytes

A GPU is (host, gpu_uuid). A host whose role passed to another process (its holder died) has one file
set per holder; they are concatenated in time. Damage is handled as for process samples: a truncated
last line is dropped, a malformed row skipped, each named in the warnings.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from miles_profile.logdir.arrow_csv import read_csv
from miles_profile.logdir.meta_lists import HOST_LISTS, drop_retyped_lists
from miles_profile.logdir.damaged_csv import hexadecimal_cell, quiet_invalid_rows
from miles_profile.logdir.ranges import drop_impossible_bytes
from miles_profile.logdir.files import DATA_MAX_BYTES, NotRegularFile, data_extents, open_regular, read_data, read_small
from miles_profile.logdir.layout import FORMAT_VERSION, GPU_PROCS_SUFFIX, HOST_META_SUFFIX, HOST_SAMPLES_SUFFIX

HOST_COLUMNS = ["t", "host", "host_available", "host_total", "cgroup_usage", "cgroup_limit"]
GPU_SAMPLE_COLUMNS = ["t", "host", "gpu_uuid", "used"]
GPU_PROC_COLUMNS = ["t", "host", "gpu_uuid", "pid", "bytes"]
_USED_PREFIX = "gpu_used:"


def host_meta(dirs: Iterable[Path], warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """Every readable host meta of `dirs`. Its `stem` is always its file's name: a name written in a
    file is never a path (`"stem": "../../x"` would read outside the run)."""
    found, problems, seen = [], [], set()
    for run_dir in dirs:
        for path in sorted(Path(run_dir).glob(f"*{HOST_META_SUFFIX}")):
            if path.name in seen:  # a copy of a directory read already (reader.copied_stems)
                continue
            seen.add(path.name)
            meta = _one_host_meta(path, problems)
            if meta is not None:
                stem = path.name[: -len(HOST_META_SUFFIX)]
                if meta.get("stem", stem) != stem:  # ignored as it should be, but said: the file was edited
                    problems.append(f"{path.name}: its stem {str(meta['stem'])[:80]!r} is not its file's name; "
                                    f"read as {stem!r}")
                meta["stem"] = stem
                meta["dir"] = str(run_dir)
                drop_retyped_lists(meta, HOST_LISTS, path.name, problems)
                found.append(meta)
    if warnings is not None:
        warnings.extend(p for p in problems if p not in warnings)  # read again per view: said once
    return found


def _one_host_meta(path: Path, problems: list[str]) -> dict[str, Any] | None:
    """A host meta through the guarded open (a FIFO or /dev/zero link is refused, not waited on)."""
    try:
        meta = json.loads(read_small(path))
    except NotRegularFile as exc:
        problems.append(f"{exc}; that host's samples are not shown")
        return None
    except (ValueError, RecursionError):
        problems.append(f"{path.name}: unreadable host meta; that host's samples are not shown")
        return None
    if not isinstance(meta, dict):
        problems.append(f"{path.name}: host meta is not a JSON object; that host's samples are not shown")
        return None
    version = meta.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        problems.append(f"{path.name}: host log format version {version!r}, this miles-profile reads "
                        f"{FORMAT_VERSION}; that host's samples are not shown")
        return None
    return meta


_SCAN_CHUNK = 8 * 1024 * 1024


def _clean_file(path: Path) -> list[str] | None:
    """The header of a host CSV that pyarrow can parse straight from its path (a regular file without
    holes, under DATA_MAX_BYTES, ending with a complete line, no hexadecimal cell), else None (and
    _read_csv reads it whole, damage said). Scanned 8 MiB at a time: the 170 MB of a 300,000-sample
    gpu_procs.csv read whole stood on top of the report's memory."""
    try:
        fd = open_regular(path)
    except NotRegularFile:
        return None
    try:
        size = os.fstat(fd).st_size
        if not size or size > DATA_MAX_BYTES or data_extents(fd, size) != [(0, size)] or \
                os.pread(fd, 1, size - 1) != b"\n":
            return None
        first = os.pread(fd, 65536, 0)
        body = first.find(b"\n") + 1
        if body <= 0:
            return None
        try:  # a header that is not UTF-8 is damage pandas' path says; pyarrow would fail only in to_pandas
            header = first[: body - 1].decode().split(",")
        except UnicodeDecodeError:
            return None
        at, tail = body, b""
        while at < size:
            chunk = tail + os.pread(fd, _SCAN_CHUNK, at)
            if hexadecimal_cell(chunk, [(0, len(chunk))], 0):
                return None
            at += len(chunk) - len(tail)
            tail = chunk[-2:]  # ",0" at a chunk's end and "x" at the next one's start
        return header
    except OSError:
        return None
    finally:
        os.close(fd)


def _arrow_options(header: list[str]) -> dict[str, Any]:
    """pyarrow's options for a host CSV (malformed rows are skipped by arrow_csv.read_csv): integer
    columns, t as float, gpu_uuid as categories (a few GPUs' names over millions of rows, 2.4 million per host
    on 16 processes of 300,000 samples, made as many Python strings: 3x the frame's memory and a slow groupby
    per GPU), and only an empty cell absent ("nan", "NULL", "N/A" are damage to say)."""
    types = {c: pa.int64() for c in header}
    types.update(t=pa.float64(), gpu_uuid=pa.dictionary(pa.int32(), pa.string()))
    return {"convert_options": pacsv.ConvertOptions(column_types=types, null_values=[""])}


def _read_clean(path: Path, header: list[str], warnings: list[str]) -> pd.DataFrame | None:
    """A clean host CSV (_clean_file) parsed from its path; None where pyarrow still fails (then read whole)."""
    if "t" not in header:
        return None
    bad: list = []
    try:
        with quiet_invalid_rows():
            table = read_csv(str(path), bad, **_arrow_options(header))
        frame = table.to_pandas(split_blocks=True, self_destruct=True)  # no consolidation copy
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError, OSError):
        return None
    del table
    if bad:
        warnings.append(f"{path.name}: skipped {len(bad)} malformed rows")
    finite = np.isfinite(frame["t"].to_numpy(dtype=float))
    return drop_impossible_bytes(frame if finite.all() else frame[finite].copy(), warnings, path.name)


def _read_csv(path: Path, warnings: list[str]) -> pd.DataFrame | None:
    """One host CSV (wide or long): pyarrow's parser (a 64-host run has millions of process rows),
    pandas' cell by cell where a field is garbage."""
    header = _clean_file(path)
    if header is not None:
        frame = _read_clean(path, header, warnings)
        if frame is not None:
            return frame
    try:  # regular files only, holes skipped, at most DATA_MAX_BYTES
        data, cut = read_data(path)
    except NotRegularFile as exc:
        warnings.append(str(exc))
        return None
    if cut:
        warnings.append(f"{path.name}: over {len(data):,} data bytes; only its beginning was read")
    end = data.rfind(b"\n")
    if end < 0:
        _say(warnings, f"{path.name}: {'empty' if not data else 'no complete line'}; not read")
        return None
    if end + 1 < len(data):
        warnings.append(f"{path.name}: dropped a truncated last line")
    data = data[: end + 1]
    header = data[: data.find(b"\n")].decode(errors="replace").split(",")
    if "t" not in header:
        _say(warnings, f"{path.name}: no t column in its header; not read")
        return None
    bad: list = []
    try:
        if hexadecimal_cell(data, [(0, len(data))], data.find(b"\n") + 1):
            raise pa.ArrowInvalid("a hexadecimal cell")  # pyarrow reads `0x10` as 16; pandas' cells do not
        with quiet_invalid_rows():  # a malformed row that is not UTF-8 fails inside pyarrow: the fallback below
            frame = read_csv(pa.py_buffer(data), bad, **_arrow_options(header)).to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError):
        bad = []
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False, na_values=[""],
                            encoding_errors="replace", on_bad_lines=lambda row: bad.append(row), engine="python")
        first = []  # (row, column) of each column's first cell that is no number
        for column in frame.columns:
            if column != "gpu_uuid":
                given = frame[column].notna().to_numpy()
                frame[column] = pd.to_numeric(frame[column], errors="coerce")
                lost = np.flatnonzero(given & frame[column].isna().to_numpy())
                if len(lost):
                    first.append((int(lost[0]), column))
        at = f" (first: line {min(first)[0] + 2}, column {min(first)[1]})" if first else ""
        warnings.append(f"{path.name}: unreadable values set to absent{at}")
    if bad:
        warnings.append(f"{path.name}: skipped {len(bad)} malformed rows")
    return drop_impossible_bytes(frame[np.isfinite(frame["t"].to_numpy(dtype=float))].copy(), warnings, path.name)


def host_frames(dirs: Iterable[Path], warnings: list[str], *, samples: bool = True, procs: bool = True,
                only_hosts: Iterable[str] | None = None,
                metas: list[dict[str, Any]] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """`samples`/`procs`: read the host.csv / gpu_procs.csv files (an unread part comes back empty);
    `only_hosts`: only these hosts' files (the per-process rows of a 64-host run are millions);
    `metas`: host_meta(dirs) read already (asked host by host, 64 hosts read 64 x 66 metas: 0.4 s)."""
    hosts, gpus, proc_frames = [], [], []
    wanted = None if only_hosts is None else {str(h) for h in only_hosts}
    for meta_ in host_meta(dirs, warnings) if metas is None else metas:
        stem, host = meta_["stem"], _host_of(meta_)
        if wanted is not None and host not in wanted:
            continue
        path = Path(meta_["dir"]) / f"{stem}{HOST_SAMPLES_SUFFIX}"
        if samples and not _exists(path):
            _say(warnings, f"{stem}{HOST_META_SUFFIX}: no {path.name} beside it; that host's samples are not shown")
        wide = _read_csv(path, warnings) if samples and _exists(path) else None
        if wide is not None and len(wide):
            wide.insert(1, "host", host)
            hosts.append(wide.reindex(columns=HOST_COLUMNS))
            used = [c for c in wide.columns if c.startswith(_USED_PREFIX)]
            if used:
                long = wide[["t", *used]].melt(id_vars="t", var_name="gpu_uuid", value_name="used")
                long["gpu_uuid"] = long["gpu_uuid"].str[len(_USED_PREFIX):]
                long.insert(1, "host", host)
                gpus.append(long)
        proc_path = path.with_name(f"{stem}{GPU_PROCS_SUFFIX}")
        if procs and not _exists(proc_path) and _nvml_active(meta_):
            _say(warnings, f"{stem}{HOST_META_SUFFIX}: no {proc_path.name} beside it; that host's per-process GPU "
                           "memory is not shown")
        frame = _read_csv(proc_path, warnings) if procs and _exists(proc_path) else None
        if frame is not None and len(frame):
            # one category (what _concat makes of it): not 2.4 million references to one string per host
            frame.insert(1, "host", pd.Categorical.from_codes(np.zeros(len(frame), dtype=np.int8), [host]))
            proc_frames.append(frame.reindex(columns=GPU_PROC_COLUMNS))
    if samples:
        _warn_orphans(dirs, warnings)
    return (_concat(hosts, HOST_COLUMNS), _concat(gpus, GPU_SAMPLE_COLUMNS),
            _concat(proc_frames, GPU_PROC_COLUMNS))


def _say(warnings: list[str], line: str) -> None:
    if line not in warnings:  # host data is read again per view: said once
        warnings.append(line)


def _nvml_active(meta: dict[str, Any]) -> bool:
    probes = meta.get("probes")
    return isinstance(probes, list) and any(isinstance(p, dict) and p.get("name") == "nvml_host" and p.get("active") is True
                                            for p in probes)


def _warn_orphans(dirs: Iterable[Path], warnings: list[str]) -> None:
    """A host samples file whose host meta is gone: its rows can't be placed, and are not shown."""
    for run_dir in dirs:
        for path in sorted(Path(run_dir).glob(f"*{HOST_SAMPLES_SUFFIX}")):
            stem = path.name[: -len(HOST_SAMPLES_SUFFIX)]
            if not _exists(path.with_name(f"{stem}{HOST_META_SUFFIX}")):
                _say(warnings, f"{path.name}: no {stem}{HOST_META_SUFFIX} beside it; that host's samples are not shown")


def gpu_used_arrays(dirs: Iterable[Path], warnings: list[str]) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """{(host, gpu_uuid): (t, used)} float arrays sorted by t, straight from the wide host.csv files:
    what a per-phase pass over every GPU needs, without the long frame (64 hosts x 8 GPUs at 100 ms
    for 30 minutes is 9 million rows as `gpu_samples`)."""
    parts: dict[tuple[str, str], list] = {}
    for meta_ in host_meta(dirs, warnings):
        stem, host = meta_["stem"], _host_of(meta_)
        path = Path(meta_["dir"]) / f"{stem}{HOST_SAMPLES_SUFFIX}"
        wide = _read_csv(path, warnings) if _exists(path) else None
        if wide is None or not len(wide):
            continue
        t = wide["t"].to_numpy(dtype=float)
        for column in wide.columns:
            if column.startswith(_USED_PREFIX):
                used = pd.to_numeric(wide[column], errors="coerce").to_numpy(dtype=float)
                parts.setdefault((host, column[len(_USED_PREFIX):]), []).append((t, used))
    out = {}
    for key, chunks in parts.items():
        t = np.concatenate([c[0] for c in chunks])
        used = np.concatenate([c[1] for c in chunks])
        order = np.argsort(t, kind="stable")
        out[key] = (t[order], used[order])
    return out


def _host_of(meta: dict[str, Any]) -> str:
    host = meta.get("host")
    return host if isinstance(host, str) and host else meta["stem"].rsplit("-", 1)[0]


def _exists(path: Path) -> bool:
    """Present at all (a FIFO too: _read_csv refuses it with a warning instead of skipping it unsaid)."""
    return os.path.lexists(path)


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=str if c in ("host", "gpu_uuid") else float) for c in columns})
    frame = pd.concat(frames, ignore_index=True)
    if not frame["t"].is_monotonic_increasing:  # a host's file is in time order: no sorted copy of it
        frame = frame.sort_values("t", kind="stable").reset_index(drop=True)
    for column in columns:
        if column in ("host", "gpu_uuid"):
            frame[column] = frame[column].astype("category")
        elif column != "t" and frame[column].notna().all():
            frame[column] = frame[column].astype("int64")  # bytes are integers; absent stays NaN
    return frame
