"""Append-only writer of one host sampler's two files (docs/log-format.md, "Host files").

`<stem>.host.csv`: one wide row per host sample (`t`, host memory, cgroup, then `gpu_used:<UUID>` per
GPU). `<stem>.gpu_procs.csv`: long rows `t,gpu_uuid,pid,bytes`, one per process NVML lists on a GPU
at that sample, with the very same `t` text as the wide row. Crash safety as writer.py: whole lines,
one `os.write` per file per flush, flushed at least every `flush_interval_s`.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

from miles_profile.logdir.layout import FORMAT_VERSION, GPU_PROCS_SUFFIX, HOST_META_SUFFIX, HOST_SAMPLES_SUFFIX
from miles_profile.logdir.writer import _cell, _open_append, write_json

GPU_PROCS_COLUMNS = ("t", "gpu_uuid", "pid", "bytes")


def write_host_meta(run_dir: Path, stem: str, meta: dict[str, Any]) -> None:
    write_json(run_dir / f"{stem}{HOST_META_SUFFIX}", {"format_version": FORMAT_VERSION, **meta})


class HostWriter:
    def __init__(self, run_dir: Path, stem: str, columns: Sequence[str], flush_interval_s: float = 0.5):
        self.samples_path = run_dir / f"{stem}{HOST_SAMPLES_SUFFIX}"
        self.procs_path = run_dir / f"{stem}{GPU_PROCS_SUFFIX}"
        self._samples = _open_append(self.samples_path)
        self._procs = _open_append(self.procs_path)
        self._rows: list[str] = []
        self._proc_rows: list[str] = []
        self._flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        # A sampler of the same process taking the role again appends under the existing header.
        if not os.fstat(self._samples).st_size:
            os.write(self._samples, (",".join(["t", *columns]) + "\n").encode())
        if not os.fstat(self._procs).st_size:
            os.write(self._procs, (",".join(GPU_PROCS_COLUMNS) + "\n").encode())

    def append(self, t: float, values: Sequence[Any], procs: Sequence[tuple[str, int, int | None]]) -> None:
        stamp = f"{t:.6f}"
        self._rows.append(f"{stamp},{','.join(map(_cell, values))}\n")
        self._proc_rows.extend(f"{stamp},{uuid},{pid},{_cell(nbytes)}\n" for uuid, pid, nbytes in procs)
        if time.monotonic() - self._last_flush >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        # Processes first: a wide row on disk means its process rows are on disk too.
        if self._proc_rows:
            os.write(self._procs, "".join(self._proc_rows).encode())
            self._proc_rows.clear()
        if self._rows:
            os.write(self._samples, "".join(self._rows).encode())
            self._rows.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()
        os.close(self._samples)
        os.close(self._procs)
