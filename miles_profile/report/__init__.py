"""Reporting: pure statistics and checks over a loaded run, and the Plotly figures built from them.

Layers (imports go one way): `series` and `reduce` (numpy) → `stats` and `checks` (pandas, pure
functions returning DataFrames and dataclasses) → `figures`/`compare` (plotly) → `html`/`export`.
The Dash dashboard imports `figures`, `reduce`, `stats` and `checks`; it builds no figures of its own.
Importing this package imports nothing heavy: import the submodule you need.
"""
