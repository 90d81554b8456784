"""The static views: the self-contained HTML report, the Plotly figure builders it shares with the Dash
dashboard, the first screen's summary, and the exports (PNG, Chrome trace, CSV, JSON).

The numbers come from the run model (miles_profile/runmodel/) and the verdicts from verdicts/engine.py;
nothing here computes a statistic a check judges, or judges anything (docs/architecture.md).
Importing this package imports nothing heavy: import the submodule you need.
"""
