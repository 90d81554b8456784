"""`make test`'s grouping (tests/conftest.py under `pytest -n 2 --dist loadgroup`): the tests of a module that
share a module-scoped fixture run on one worker, so the fixture (a Ray cluster, a Prometheus server, a recorded
run) is built once. Under pytest 9.2 it had silently split every such module over both workers."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO, python_env

MODULE = '''
import os
import pytest

@pytest.fixture(scope="module")
def built_once():
    return os.environ["PYTEST_XDIST_WORKER"]

@pytest.mark.parametrize("i", range(8))
def test_shares_the_module_fixture(built_once, i, tmp_path_factory):
    with open(os.environ["WORKERS_FILE"], "a") as f:
        f.write(built_once + "\\n")
'''


def test_a_module_fixtures_tests_run_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(MODULE)
    workers = tmp_path / "workers.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist.plugin", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path / "test_grouped.py")],
        # Only xdist and our conftest: the installed plugins (dash, playwright, ...) cost ~2 CPU-s a process.
        cwd=REPO, env=dict(python_env(), WORKERS_FILE=str(workers), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(workers.read_text().split()) == 8
    assert len(set(workers.read_text().split())) == 1, workers.read_text()
