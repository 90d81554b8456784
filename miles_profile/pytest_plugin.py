"""pytest plugin: `@pytest.mark.memory_limit(gpu="20 GiB", host="512 MiB", phase="train")` records the
test with a real Recorder and fails it when a peak goes over its limit (docs/checks.md, "Memory limits
in tests").

Registered through the `pytest11` entry point of the installed package; from a source checkout,
`pytest -p miles_profile.pytest_plugin`. Nothing is imported beyond this module until a test carries
the marker: an installed miles-profile costs other test suites nothing.

- `gpu`, `host`: sizes ("20 GiB", "512MiB", bytes); either or both. Measured above the level at the
  test's start (report/memory_limit.py says what exactly).
- `phase`: a --phase selection (`train`, `offload`, `rollout`, a name the test opens); without it,
  the whole test. A phase the test never opened fails the test.
- On a machine without CUDA a `gpu` limit is not checkable: the test runs and is judged on the rest,
  and a PytestWarning names it (it shows in the warnings summary; `-W error::pytest.PytestWarning`
  turns it into a failure for a CI that must check GPU limits).
- `--memory-log-dir DIR` keeps each marked test's run under DIR (its meta names the test); by default
  the run is written to a temporary directory and removed.
- Usage errors (exit 4, one line, before any test runs): a marker without gpu= or host= (or with both
  None), a phase= that is not a name or a list of names, a size that is not one, an
  --memory-interval-ms outside 1 ms .. 60 s, an --memory-log-dir that is not a writable directory.
- The verdict is the engine's (verdicts/engine.judge_test_limits): each limit a CheckResult.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from miles_profile.errors import MilesProfileError
from miles_profile.recorder import Recorder, check_interval_ms
from miles_profile.sizes import parse_size

MARKER = "memory_limit"


def pytest_addoption(parser):
    group = parser.getgroup("miles-profile")
    group.addoption("--memory-log-dir", default=None, metavar="DIR",
                    help="keep the miles-profile run of each memory_limit test under DIR (default: a temporary "
                         "directory, removed)")
    group.addoption("--memory-interval-ms", type=float, default=10.0, metavar="MS",
                    help="sampling interval of memory_limit tests (default: %(default)s; true peaks between "
                         "samples are kept whatever it is)")
    group.addoption("--memory-strict", action="store_true", default=False,
                    help="fail a memory_limit test whose verdict is WARN (ambiguous evidence) as visualize "
                         "--strict exits 1 on it; default: a pytest warning")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{MARKER}(gpu=None, host=None, phase=None): record the test with miles-profile and fail it "
                   "when the GPU or host memory peak it adds (in the phase(s), else the whole test) exceeds the "
                   "limit, e.g. gpu='20 GiB'")


def _limits(item) -> dict | None:
    marker = item.get_closest_marker(MARKER)
    return None if marker is None else dict(marker.kwargs)


def pytest_collection_modifyitems(config, items):
    """A malformed marker or option is the test author's mistake: a usage error (exit 4, one line)
    before any test runs, never a traceback in every marked test."""
    marked = [(item, item.get_closest_marker(MARKER)) for item in items]
    marked = [(item, marker) for item, marker in marked if marker is not None]
    if not marked:
        return
    _check_options(config)
    for item, marker in marked:
        problem = _marker_problem(marker)
        if problem:
            raise pytest.UsageError(f"{item.nodeid}: {MARKER}: {problem}")


def _check_options(config) -> None:
    try:
        check_interval_ms(config.getoption("--memory-interval-ms"))
    except MilesProfileError as exc:
        raise pytest.UsageError(f"--memory-interval-ms: {exc}") from None
    keep = config.getoption("--memory-log-dir")
    if keep is not None:
        try:
            os.makedirs(keep, exist_ok=True)
        except OSError as exc:
            raise pytest.UsageError(f"--memory-log-dir {keep}: not a directory we can write "
                                    f"({exc.strerror or exc})") from None
        if not os.access(keep, os.W_OK | os.X_OK):
            raise pytest.UsageError(f"--memory-log-dir {keep}: not writable")


def _marker_problem(marker) -> str | None:
    """What is wrong with a memory_limit marker, in one line; None when it is well formed. A limit
    must name at least one size (gpu=None, host=None checks nothing and would pass forever)."""
    unknown = sorted(set(marker.kwargs) - {"gpu", "host", "phase"})
    if marker.args or unknown:
        return f"takes gpu=, host= (at least one) and phase=; got {marker.args or ''}{unknown or ''}"
    limits = {k: marker.kwargs.get(k) for k in ("gpu", "host") if marker.kwargs.get(k) is not None}
    if not limits:
        return "give gpu= or host= (a size such as '20 GiB'); without one it checks nothing"
    phase = marker.kwargs.get("phase")
    if phase is not None and not (isinstance(phase, str) or (isinstance(phase, (list, tuple)) and phase
                                                               and all(isinstance(p, str) for p in phase))):
        return f"phase= takes a phase name or selection such as 'train' or 'offload,train', got {phase!r}"
    try:
        for value in limits.values():
            parse_size(value)
    except MilesProfileError as exc:
        return str(exc)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    limits = _limits(item)
    if limits is None:
        return (yield)
    keep = item.config.getoption("--memory-log-dir")
    log_dir = keep or tempfile.mkdtemp(prefix="miles-profile-test-")
    recorder = Recorder(log_dir, interval_ms=item.config.getoption("--memory-interval-ms"),
                        command=["pytest", item.nodeid], host_sampling=False, run_meta={"pytest_test": item.nodeid})
    recorder.start()
    try:
        result = yield
    finally:
        recorder.stop()
    try:
        _judge(item, recorder.run_dir, limits)
    finally:
        if not keep:
            shutil.rmtree(log_dir, ignore_errors=True)
    return result


def _judge(item, run_dir, limits: dict) -> None:
    """Render the engine's verdict of the test's limits: failures fail it, an unjudgeable limit warns."""
    # pandas and the verdicts only once a marked test ran: pytest loads this plugin in every session
    from miles_profile.logdir.reader import load_run
    from miles_profile.verdicts.engine import judge_test_limits
    try:
        verdict = judge_test_limits(load_run(run_dir), limits.get("gpu"), limits.get("host"), limits.get("phase"))
    except MilesProfileError as exc:  # e.g. an unknown phase family
        pytest.fail(f"{MARKER}: {exc}", pytrace=False)
    for check in verdict.checks:
        if check.status == "n/a":
            item.warn(pytest.PytestWarning(check.summary))
    for name, summary in verdict.warnings():
        if name != "coverage":  # a limit that judged nothing has said so above
            item.warn(pytest.PytestWarning(f"WARN {name}: {summary}"))
    strict = bool(item.config.getoption("--memory-strict", default=False))
    if verdict.exit_code_for(strict):
        reasons = verdict.failures() or verdict.warnings()
        pytest.fail("; ".join(f"{'WARN ' if verdict.status == 'warn' else ''}{summary}" for _, summary in reasons),
                    pytrace=False)
