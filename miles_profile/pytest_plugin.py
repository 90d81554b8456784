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
"""
from __future__ import annotations

import shutil
import tempfile

import pytest

MARKER = "memory_limit"


def pytest_addoption(parser):
    group = parser.getgroup("miles-profile")
    group.addoption("--memory-log-dir", default=None, metavar="DIR",
                    help="keep the miles-profile run of each memory_limit test under DIR (default: a temporary "
                         "directory, removed)")
    group.addoption("--memory-interval-ms", type=float, default=10.0, metavar="MS",
                    help="sampling interval of memory_limit tests (default: %(default)s; true peaks between "
                         "samples are kept whatever it is)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{MARKER}(gpu=None, host=None, phase=None): record the test with miles-profile and fail it "
                   "when the GPU or host memory peak it adds (in the phase(s), else the whole test) exceeds the "
                   "limit, e.g. gpu='20 GiB'")


def _limits(item) -> dict | None:
    marker = item.get_closest_marker(MARKER)
    return None if marker is None else dict(marker.kwargs)


def pytest_collection_modifyitems(config, items):
    """A malformed marker is the test author's mistake: a usage error (exit 4) before any test runs."""
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            continue
        unknown = sorted(set(marker.kwargs) - {"gpu", "host", "phase"})
        if marker.args or unknown or not ({"gpu", "host"} & set(marker.kwargs)):
            raise pytest.UsageError(f"{item.nodeid}: {MARKER} takes gpu=, host= (at least one) and phase=; "
                                    f"got {marker.args or ''}{unknown or ''}")
        from miles_profile.errors import MilesProfileError
        from miles_profile.sizes import parse_size
        try:
            for kind in ("gpu", "host"):
                if marker.kwargs.get(kind) is not None:
                    parse_size(marker.kwargs[kind])
        except MilesProfileError as exc:
            raise pytest.UsageError(f"{item.nodeid}: {MARKER}: {exc}") from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    limits = _limits(item)
    if limits is None:
        return (yield)
    from miles_profile.recorder import Recorder
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
    from miles_profile.errors import MilesProfileError
    from miles_profile.logdir.reader import load_run
    from miles_profile.verdicts.memory_limit import judge_limits
    try:
        verdicts = judge_limits(load_run(run_dir), limits.get("gpu"), limits.get("host"), limits.get("phase"))
    except MilesProfileError as exc:  # e.g. an unknown phase family
        pytest.fail(f"{MARKER}: {exc}", pytrace=False)
    for verdict in verdicts:
        if verdict.status == "not checkable":
            item.warn(pytest.PytestWarning(verdict.message))
    failed = [v.message for v in verdicts if v.status == "fail"]
    if failed:
        pytest.fail("; ".join(failed), pytrace=False)
