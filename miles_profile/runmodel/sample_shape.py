"""The shape of a run's samples without merging them (no plotly): a run read from its files keeps each
process's samples as read (logdir.reader.Run.process_samples); `Run.samples`, every process's rows merged,
is built on first use only. These answer what the views asked of `Run.samples` from either form; re-exported
by runmodel/series.py, where the views import them.

    sample_store(run) -> ProcessSamples | None   # the samples per process, while the merged frame is not the source
    sample_columns(run) / has_column(run, column) / sample_count(run) / first_and_last_t(run)
    columns_of(frame, columns) -> DataFrame      # frame[columns] sharing the data
"""
from __future__ import annotations

import pandas as pd


def sample_store(run):
    """The run's samples per process (logdir.reader.Run.process_samples) while the merged frame is not
    the source (a view's or an import's frame, the live dashboard's rows): None then."""
    store = getattr(run, "process_samples", None)
    return store if store is not None and run.__dict__.get("_samples") is None else None


def sample_columns(run) -> list[str]:
    """The columns of `run.samples`, without merging a run read per process (the run's own answer where it
    has one: logdir.reader.Run.sample_columns)."""
    own = getattr(run, "sample_columns", None)
    return own if own is not None else list(run.samples.columns)


def has_column(run, column: str) -> bool:
    """`column in run.samples`, without merging a run read per process."""
    store = sample_store(run)
    return column in store.columns if store is not None else column in run.samples


def sample_count(run) -> int:
    """len(run.samples), without merging a run read per process."""
    store = sample_store(run)
    return store.rows if store is not None else len(run.samples)


def first_and_last_t(run) -> tuple[float, float] | None:
    """(run.samples["t"].iloc[0], run.samples["t"].max()), or None without samples."""
    store = sample_store(run)
    if store is not None:
        if not store.rows:
            return None
        return (min(float(f["t"].iloc[0]) for f in store.frames), max(float(f["t"].max()) for f in store.frames))
    if not len(run.samples):
        return None
    return float(run.samples["t"].iloc[0]), float(run.samples["t"].max())


def columns_of(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """`frame[columns]` sharing the columns' data (pandas would copy them): a process's frame of a run read
    per process is the run's own, and a view of it costs nothing."""
    return pd.DataFrame({c: frame[c] for c in columns}, columns=columns, copy=False)
