"""Values that no memory or link can have, dropped where they are read, each kind in one warning.

A byte count below zero or above a pebibyte, or a link ceiling that is not a finite positive number of
bytes per second below 10**15, is damage (a bit flip, a hand edit, a writer's bug), never a measurement:
one such cell flipped a verdict before (a negative RSS cell made `serialized_peaks` FAIL at
"-930.970 GiB"; a calibration link of 10**30 made the report exit 2). The value is set absent (NaN,
as an empty field is) and the warning names the file, the row and the value, so the report says what
it did not use instead of judging it.

    MAX_BYTES                                       # 2**50: no process, GPU or host holds a pebibyte
    drop_impossible_bytes(frame, warnings, source, first_row=2) -> frame
    drop_impossible_ceilings(meta, warnings, source) -> meta
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

MAX_BYTES = 2 ** 50
MAX_BYTES_PER_S = 1e15  # a petabyte per second: no memory link is faster
NOT_BYTES = frozenset({"t", "phase", "pid", "host", "gpu_uuid", "gpu", "index", "rank"})


def drop_impossible_bytes(frame: pd.DataFrame, warnings: list[str], source: str, first_row: int = 2) -> pd.DataFrame:
    """`frame` with every byte cell below 0 or over MAX_BYTES set absent; one warning naming the first
    (its line in the file: `first_row` is the line of the frame's first row)."""
    bad_count, first = 0, None
    for column in frame.columns:
        if column in NOT_BYTES or not pd.api.types.is_numeric_dtype(frame[column].dtype):
            continue
        values = frame[column].to_numpy()
        with np.errstate(invalid="ignore"):
            bad = (values < 0) | (values > MAX_BYTES)
        if not bad.any():
            continue
        at = int(np.flatnonzero(bad)[0])
        if first is None or at < first[0]:
            first = (at, column, values[at])
        bad_count += int(bad.sum())
        frame[column] = np.where(bad, np.nan, values.astype(float))
    if bad_count:
        at, column, value = first
        warnings.append(f"{source}: dropped {bad_count} byte value{'s' * (bad_count != 1)} out of range (below 0 or "
                        f"over 2**50; first: line {at + first_row}, {column} = {value:.6g})")
    return frame


def _ceiling_ok(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0 < value < MAX_BYTES_PER_S


def drop_impossible_ceilings(meta: dict, warnings: list[str], source: str) -> dict:
    """The run meta without calibration links that are no number of bytes/s (docs/transitions.md)."""
    found = meta.get("calibration")
    if not isinstance(found, dict) or not isinstance(found.get("links"), dict):
        return meta
    bad = {k: v for k, v in found["links"].items() if not _ceiling_ok(v)}
    if not bad:
        return meta
    name, value = next(iter(bad.items()))
    warnings.append(f"{source}: dropped {len(bad)} calibration link{'s' * (len(bad) != 1)} that are no number of "
                    f"bytes/s below 10**15 (first: calibration.links.{str(name)[:40]} = {str(value)[:40]})")
    links = {k: v for k, v in found["links"].items() if k not in bad}
    return {**meta, "calibration": {**found, "links": links}}
