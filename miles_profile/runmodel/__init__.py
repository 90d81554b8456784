"""The run model: pure computations over a loaded run (logdir.reader's `Run`), with no plotting and no
verdicts: which series a run has, per-phase statistics, the ledger, transitions and their what-if, the
fleet's phase table, peaks, the forecast beside measured, allocation stacks.

Layers (imports go one way, docs/architecture.md): logdir -> runmodel -> verdicts -> views (report/,
dashboards/, metrics) -> CLIs. Nothing here imports plotly, dash, verdicts or a view.
Importing this package imports nothing heavy: import the submodule you need.
"""
