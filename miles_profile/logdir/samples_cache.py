"""The reader's columnar cache of large finished samples files (an Arrow IPC copy beside the CSV)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa

# Parsing a 10-million-row CSV costs seconds; a finished process's samples never change, so the
# first read of a large one leaves an Arrow IPC copy beside it (hidden, `.<name>.arrow`) that later
# reads memory-map instead. It is keyed by the CSV's size and mtime, skipped for files still being
# written (no end_time in the process meta yet) and when the directory is read-only, and disabled by
# MILES_PROFILE_CACHE=0. Deleting it is always safe.
CACHE_MIN_BYTES = 64 * 1024 * 1024
_CACHE_TAG = b"miles-profile-samples-cache-1"


def _cache_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.arrow")


def _cache_key(path: Path) -> dict[bytes, bytes]:
    stat = path.stat()
    return {b"format": _CACHE_TAG, b"size": str(stat.st_size).encode(), b"mtime_ns": str(stat.st_mtime_ns).encode()}


def cache_enabled(path: Path) -> bool:
    return os.environ.get("MILES_PROFILE_CACHE", "1") != "0" and path.stat().st_size >= CACHE_MIN_BYTES


def read_cache(path: Path, warnings: list[str]) -> pd.DataFrame | None:
    cache = _cache_path(path)
    if not cache.is_file():
        return None
    try:
        with pa.memory_map(str(cache)) as source:
            table = pa.ipc.open_file(source).read_all()
        meta = table.schema.metadata or {}
        key = _cache_key(path)
        if any(meta.get(k) != v for k, v in key.items()):
            return None
        schema = table.schema
        if "t" not in schema.names or "phase" not in schema.names or schema.field("t").type != pa.float64():
            return None  # damaged, or not ours: the CSV is the record
        cached = json.loads(meta.get(b"warnings", b"[]"))
        if not isinstance(cached, list) or not all(isinstance(w, str) for w in cached):
            return None
        warnings.extend(cached)
        return table.to_pandas(split_blocks=True, self_destruct=True)
    except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, RecursionError):
        return None


def write_cache(path: Path, table: pa.Table, warnings: list[str]) -> None:
    cache = _cache_path(path)
    tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
    try:
        metadata = {**(table.schema.metadata or {}), **_cache_key(path), b"warnings": json.dumps(warnings).encode()}
        table = table.replace_schema_metadata(metadata)
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, cache)
    except (OSError, pa.ArrowException):
        tmp.unlink(missing_ok=True)

