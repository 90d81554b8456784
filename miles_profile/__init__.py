"""miles-profile: phase-tagged GPU and host memory recording for colocated RL training.

The recorder side imports only the standard library, psutil, nvidia-ml-py (and torch if the program
uses it); `load` imports pandas on first use.
"""
from miles_profile.errors import MilesProfileError
from miles_profile.phases import (account, account_tensors, annotate, heap_baseline, mark, phase, samples_heap,
                                  watch_dir)
from miles_profile.recorder import Recorder

__all__ = ["MilesProfileError", "Recorder", "account", "account_tensors", "annotate", "heap_baseline", "load", "mark",
           "phase", "samples_heap", "watch_dir"]


def load(*paths):
    """Read a run into a `Run` (samples, phases, events, meta, host data, phase summaries). Several
    paths: the directories of one run (same run id, e.g. one per host), merged. See logdir.reader.
    A directory Miles' `--use-miles-dashboard` wrote is imported (importers/miles_dashboard.py)."""
    # pandas and pyarrow only once a run is read: `import miles_profile` in a training script stays light
    from miles_profile.importers.miles_dashboard import find_miles_dashboard, load_miles_dashboard
    if len(paths) == 1 and find_miles_dashboard(paths[0]) is not None:
        return load_miles_dashboard(paths[0])
    from miles_profile.logdir.reader import load_run
    return load_run(*paths)
