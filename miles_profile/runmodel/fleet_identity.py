"""Processes of a PhaseTable whose identity is unknown (their meta was unreadable), and what that does to
a comparison among peers.

A process whose meta can't be read still has samples and events, but no rank, role or GPU: the table
gives it rank -1 (a lane of its own) and `identified` False. Compared with the others it is no peer of
anyone, and the rank it belonged to now lacks it: with few ranks, a complete rank then stands out as an
outlier it is not (issue 33: a two-rank run with one damaged meta failed rank_imbalance).

    unidentified(df) -> (identified rows, [pid, ...] left out, [lane, ...] that may lack them)
"""
from __future__ import annotations

import pandas as pd


def unidentified(df: pd.DataFrame) -> tuple[pd.DataFrame, list[int], list[str]]:
    """`df` is a normalized PhaseTable (fleet.normalize). Returns its rows of identified processes, the
    pids left out (sorted), and the lanes whose memory is a sum of their processes' (no device total
    that sees every process) and whose roles are a strict part of another lane's of their kind (a
    rank holding an engine and no actor where others hold both): the lanes an unidentified process
    may have belonged to. Nothing is left out when every process is identified (a table without the
    `identified` column is)."""
    if "identified" not in df or bool(df["identified"].all()):
        return df, [], []
    known = df["identified"].fillna(True).astype(bool).to_numpy()
    pids = sorted({int(p) for p in df.loc[~known, "pid"]})
    kept = df[known]
    # a lane with the device's own `used` sees every process on it, identified or not
    summed = kept.groupby("lane", sort=False)["used_peak"].apply(lambda s: not s.notna().any())
    roles = kept.groupby("lane", sort=False).agg(kind=("lane_kind", "first"),
                                                 roles=("role", lambda r: frozenset(x for x in r if x)))
    incomplete = []
    for _, part in roles.groupby("kind", sort=False):
        sets = set(part["roles"])
        incomplete += [lane for lane, r in part["roles"].items()
                       if summed.get(lane, True) and any(r < other for other in sets)]
    return kept, pids, sorted(incomplete)
