"""Imported by Python at start-up in a child of `record --exec` (this directory is first on its
PYTHONPATH): installs miles_profile's import hooks (integrations/autotag.py), then runs the
sitecustomize this one hides, if any. Never stops the program: a failure is one line on stderr."""
import os
import sys


def _run_hidden_sitecustomize():
    """Import the next `sitecustomize` on the path (a distribution's or the user's), as if we were not here."""
    import importlib
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        hidden = sys.modules.get("sitecustomize")
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        if hidden is not None and hidden is not ours:
            sys.modules["miles_profile_hidden_sitecustomize"] = hidden


def _install():
    if os.environ.get("MILES_PROFILE_AUTOTAG", "1") == "0" or not os.environ.get("MILES_PROFILE_RUN_DIR"):
        return
    try:
        # by path, not through the miles_profile package: its imports would cost every process 0.25 s
        import importlib.util
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "autotag.py")
        spec = importlib.util.spec_from_file_location("miles_profile_autotag", path)
        autotag = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = autotag
        spec.loader.exec_module(autotag)
        autotag.install()
    except Exception as exc:  # noqa: BLE001 -- the user's program runs whatever happens here
        print(f"miles_profile: warning: steps not tagged in this process (pid {os.getpid()}): "
              f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


_run_hidden_sitecustomize()
_install()
