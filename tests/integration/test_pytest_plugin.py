"""The memory_limit pytest plugin, in real inner pytest runs (pytester, a subprocess each): a real
Recorder around the test, real allocations, the verdict read back from the log it wrote."""
from __future__ import annotations

import json
import os

import pytest

from miles_profile.logdir.reader import load_run  # imported before pytester snapshots sys.modules
from tests.conftest import REPO

pytest_plugins = ["pytester"]

LIMIT_MIB = 200
INNER = f'''
import numpy as np
import pytest
import miles_profile

MiB = 1024 ** 2

def allocate(mib):
    block = np.ones(int(mib * MiB), dtype=np.uint8)  # written: every page resident
    assert block[-1] == 1
    del block  # freed before the phase ends: only the true peak (VmHWM) still sees it

@pytest.mark.memory_limit(host="{LIMIT_MIB} MiB", phase="train")
def test_over_in_train():
    with miles_profile.phase("generate"):
        pass
    with miles_profile.phase("train"):
        allocate({LIMIT_MIB} * 1.1)

@pytest.mark.memory_limit(host="{LIMIT_MIB} MiB", phase="train")
def test_under_in_train():
    with miles_profile.phase("train"):
        allocate({LIMIT_MIB} * 0.9)

@pytest.mark.memory_limit(host="{LIMIT_MIB} MiB", phase="train")
def test_over_outside_the_phase():
    allocate({LIMIT_MIB} * 1.3)
    with miles_profile.phase("train"):
        allocate({LIMIT_MIB} * 0.5)

@pytest.mark.memory_limit(host="{LIMIT_MIB} MiB")
def test_over_whole_test():
    allocate({LIMIT_MIB} * 1.1)
'''


@pytest.fixture
def inner(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # Only the plugins named by -p: every inner run names ours, and the installed ones (dash, playwright,
    # hypothesis, ...) cost ~1 CPU-s of start-up a run while no inner test uses them.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester


def run_inner(pytester, *args):
    return pytester.runpytest_subprocess("-p", "miles_profile.pytest_plugin", "--strict-markers",
                                         "-p", "no:cacheprovider", "-p", "no:dash", "-q", *args)


def test_a_test_over_its_limit_fails_and_one_under_passes(inner):
    inner.makepyfile(test_inner=INNER)
    result = run_inner(inner, "-rfE")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    # one line: measured vs limit and the phase
    # each failure is one line: measured vs limit and the phase (about 220 MiB: 1.1 x the limit)
    result.stdout.re_match_lines([r"_+ test_over_in_train _+", r"memory_limit: host RSS peak 2[12]\d\.\d MiB above "
                                  r"the test's start > limit 200\.0 MiB \(host, phase train\)$"])
    result.stdout.re_match_lines([r"_+ test_over_whole_test _+", r"memory_limit: host RSS peak 2[12]\d\.\d MiB "
                                  r"above the test's start > limit 200\.0 MiB \(host, the whole test\)$"])
    # under the limit, and memory allocated outside the selected phase, do not fail
    assert "::test_under_in_train" not in out and "::test_over_outside_the_phase" not in out


def test_gpu_limit_on_cpu_is_not_checkable_and_says_so(inner):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU limit is checkable here")
    inner.makepyfile(test_inner='''
import pytest, miles_profile
@pytest.mark.memory_limit(gpu="1 GiB", phase="train")
def test_gpu():
    with miles_profile.phase("train"):
        pass
''')
    result = run_inner(inner)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*memory_limit: gpu limit 1.000 GiB not checkable in phase train: no GPU memory "
                                 "was recorded*"])
    # a limit that judged nothing is a WARN: --memory-strict fails it, as visualize --strict exits 1
    strict = run_inner(inner, "--memory-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*WARN*0 of 1 checks judged*"])


def test_a_phase_never_opened_fails_and_a_bad_size_is_a_usage_error(inner):
    inner.makepyfile(test_inner='''
import pytest
@pytest.mark.memory_limit(host="1 GiB", phase="train")
def test_no_phase():
    pass
''')
    result = run_inner(inner, "-rf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*memory_limit: host limit 1.000 GiB not checked in phase train: the test never "
                                 "opened it (phases recorded: none)*"])
    inner.makepyfile(test_inner='''
import pytest
@pytest.mark.memory_limit(host="lots")
def test_bad():
    pass
''')
    result = run_inner(inner)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: test_inner.py::test_bad: memory_limit: not a size: 'lots'*"])


def test_memory_log_dir_keeps_the_run_with_the_test_named(inner, tmp_path):
    inner.makepyfile(test_inner='''
import pytest, miles_profile
@pytest.mark.memory_limit(host="1 GiB", phase="train")
def test_kept():
    with miles_profile.phase("train"):
        pass
''')
    logs = tmp_path / "logs"
    result = run_inner(inner, f"--memory-log-dir={logs}")
    result.assert_outcomes(passed=1)
    (run_dir,) = [p for p in logs.iterdir() if p.is_dir()]
    assert json.loads((run_dir / "meta.json").read_text())["pytest_test"] == "test_inner.py::test_kept"
    assert list(load_run(run_dir).phases["name"]) == ["train"]


def test_without_the_plugin_the_marker_is_refused_by_strict_markers(inner):
    inner.makepyfile(test_inner='''
import pytest
@pytest.mark.memory_limit(host="1 GiB")
def test_x():
    pass
''')
    result = inner.runpytest_subprocess("-p", "no:miles_profile.pytest_plugin", "--strict-markers",
                                        "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*'memory_limit' not found in `markers` configuration option*"])


MARKED = '''
import pytest
@pytest.mark.memory_limit({kwargs})
def test_marked():
    pass
'''


@pytest.mark.parametrize("kwargs, options, says", [
    ('host="1 GiB"', ["--memory-interval-ms", "0"], "--memory-interval-ms: interval must be positive"),
    ('host="1 GiB"', ["--memory-interval-ms", "inf"], "--memory-interval-ms: interval must be between"),
    ('host="1 GiB"', ["--memory-interval-ms", "0.5"], "--memory-interval-ms: interval must be between"),
    ('host="1 GiB"', ["--memory-log-dir", "/dev/null"], "--memory-log-dir /dev/null: not a directory"),
    ('host="1 GiB", phase=5', [], "memory_limit: phase= takes a phase name"),
    ("host=None, gpu=None", [], "memory_limit: give gpu= or host="),
])
def test_a_bad_option_or_marker_is_one_usage_error_before_any_test_runs(inner, kwargs, options, says):
    """Each used to fail every marked test with a traceback (or, gpu=None/host=None, pass checking nothing)."""
    inner.makepyfile(test_inner=MARKED.format(kwargs=kwargs))
    result = run_inner(inner, *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    result.stderr.fnmatch_lines([f"ERROR: *{says}*"])
