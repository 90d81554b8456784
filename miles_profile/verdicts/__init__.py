"""The verdict engine: every check, fleet check, baseline gate and pytest limit, computed once per run.

Views (the visualize CLI and its exit code, the HTML report, --json, the dashboard, the pytest plugin)
render these objects and never judge anything themselves.
"""
