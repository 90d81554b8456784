"""Logs of the lead's probes (tests/corpus/lead_probes/README.md) judged as a user meets them."""
from __future__ import annotations

import tarfile

from miles_profile.logdir.reader import load_run
from miles_profile.verdicts.engine import judge
from tests.conftest import REPO

PROBES = REPO / "tests" / "corpus" / "lead_probes"


def test_a_ray_driver_that_crashed_during_start_up_is_no_leak_by_time(tmp_path):
    with tarfile.open(PROBES / "ray_driver_crashed_at_start.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    (run_dir,) = tmp_path.glob("run-*")
    leak = next(c for c in judge(load_run(run_dir)).checks if c.name == "leak")
    finding = leak.findings[0]
    assert leak.status == "warn" and finding.cause == "short_untagged_run", finding.message
    assert "too short to tell a program's start-up from a leak" in finding.message
