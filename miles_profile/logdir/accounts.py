"""The `account` events (`miles_profile.account()`: what a program says it holds) as one frame.

A program writes one event per change of a (device, category) value, so this frame grows with the
changes, not the samples; the value at any instant is the last event at or before it (`declared_at`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from miles_profile import names

ACCOUNT_COLUMNS = ["t", "host", "pid", "device", "category", "owner", "bytes"]


def accounts_frame(events: pd.DataFrame) -> pd.DataFrame:
    """t, host, pid, device ("host" or "cuda:N" in that process's CUDA order), category, owner ("" when
    not given), bytes. An event whose `bytes` is not a non-negative integer or whose `device` is not a
    string, or a count of 2**63 or more, is skipped."""
    rows = []
    found = events[events["kind"] == names.ACCOUNT] if len(events) else events
    hosts = found["host"].tolist() if "host" in found else [""] * len(found)
    for t, host, pid, name, attrs in zip(found["t"].tolist(), hosts, found["pid"].tolist(),
                                         found["name"].tolist(), found["attrs"].tolist()):
        value = attrs.get("bytes") if isinstance(attrs, dict) else None
        device = attrs.get("device") if isinstance(attrs, dict) else None
        # over int64: no machine holds it, and the frame's int64 column could not (account() refuses it)
        if type(value) is not int or not 0 <= value < 2 ** 63 or not isinstance(device, str):
            continue
        owner = attrs.get("owner")
        rows.append((float(t), "" if host is None or host != host else str(host), int(pid), device, str(name),
                     owner if isinstance(owner, str) else "", value))
    frame = pd.DataFrame(rows, columns=ACCOUNT_COLUMNS)
    frame["bytes"] = frame["bytes"].astype(np.int64)
    frame["pid"] = frame["pid"].astype(np.int64)
    frame["t"] = frame["t"].astype(float)
    return frame.sort_values("t", kind="stable").reset_index(drop=True)


def declared_at(accounts: pd.DataFrame, t: float) -> dict[tuple[str, str], int]:
    """{(device, category): bytes} that the process of `accounts` (one process's rows) had declared at
    time t (its events at or before t; owners summed)."""
    mine = accounts[accounts["t"] <= t]
    last = mine.groupby(["device", "category", "owner"], sort=False)["bytes"].last()
    found: dict[tuple[str, str], int] = {}
    for (device, category, _), v in last.items():
        found[(device, category)] = found.get((device, category), 0) + int(v)
    return found
