"""The on-disk log format: the only package that knows file names, columns and the version.

See docs/log-format.md. `writer` is imported by the recorder (no pandas needed at record time);
`reader` turns a run directory into pandas DataFrames.
"""
from miles_profile.logdir.layout import FORMAT_VERSION, find_runs, is_run_dir

__all__ = ["FORMAT_VERSION", "find_runs", "is_run_dir"]
