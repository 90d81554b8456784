"""A list of Python strings as pandas' str column, made by pyarrow in one call.

pandas 3 turns a list into its str dtype (Arrow `large_string` under `StringDtype(na_value=nan)`)
after a Python-level pass over every value; at 276,000 events or phase summaries that was 0.13 s a
column, 0.04 s through pyarrow directly. The column is the same (dtype, values, Arrow type): where
pandas or pyarrow would not make it so (another pandas), pandas' own conversion is used.

    str_array(values) -> ExtensionArray    # every value a str (the caller checks)
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

_STR = pd.Series([""], dtype=str).dtype  # pandas' default str dtype


def str_array(values: list[str]):
    try:
        made = pd.arrays.ArrowStringArray(pa.array(values, type=pa.large_string()), dtype=_STR)
        if made.dtype == _STR:
            return made
    except (TypeError, ValueError, AttributeError, pa.ArrowException):
        pass
    return pd.array(values, dtype=str)
