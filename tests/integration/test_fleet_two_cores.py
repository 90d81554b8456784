"""visualize of a fleet with its side work on the second core (logdir/gpu_used_beside.py,
report/ledger_beside.py): the same report, JSON and terminal output as done on one core, also when
the children die or hang (then the work is done in-process), and no child left behind."""
from __future__ import annotations

import os
import re
import time

import psutil
import pytest

from bench.bench_fleet_visualize import write_run
from miles_profile import visualize
from miles_profile.logdir import gpu_used_beside, side_process
from miles_profile.report import ledger_beside

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("fleet2"), 32, minutes=0.5)


def _report(run_dir, out, capsys):
    html, js = out / "r.html", out / "r.json"
    code = visualize.main([str(run_dir), "-o", str(html), "--json", str(js)])
    said = capsys.readouterr()
    page = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", html.read_text())
    page = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d)?", "TIME", page)
    lines = re.sub(r"\(\d+\.\d MB, \d+\.\d s\)", "", said.out.replace(str(out), "OUT"))
    return code, js.read_text(), page, lines, said.err


def _hang(*args):
    time.sleep(60)


def test_the_same_report_with_children_that_work_die_or_hang(fleet_dir, tmp_path, monkeypatch, capsys):
    forked, pids = [], []
    start = side_process.start

    def counted(fn, *args):
        side = start(fn, *args)
        if side is not None:
            forked.append(fn.__module__)
            pids.append(side.pid)
        return side

    monkeypatch.setattr(side_process, "start", counted)
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir(), (tmp_path / "bad").mkdir()
    one_core = _report(fleet_dir, tmp_path / "one", capsys)  # 32 processes: under the thresholds
    assert forked == [] and one_core[0] == 1 and "verdict: FAIL" in one_core[3]
    monkeypatch.setattr(gpu_used_beside, "SIDE_MIN_PROCESSES", 1)
    monkeypatch.setattr(ledger_beside, "SIDE_MIN_PROCESSES", 1)
    assert _report(fleet_dir, tmp_path / "two", capsys) == one_core
    assert sorted(forked) == ["miles_profile.logdir.gpu_used_beside", "miles_profile.report.ledger_beside"]
    # one child dies, the other hangs past the wait: each's work done in-process, nothing said of it
    monkeypatch.setattr(gpu_used_beside, "_read", lambda dirs: os._exit(3))
    monkeypatch.setattr(ledger_beside, "_made", _hang)
    monkeypatch.setattr(side_process, "WAIT_S", 0.5)
    assert _report(fleet_dir, tmp_path / "bad", capsys) == one_core
    # the children forked here are reaped (the test process has others: a session's browser driver)
    assert len(forked) == 4 and not {c.pid for c in psutil.Process().children()} & set(pids)
