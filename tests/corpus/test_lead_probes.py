"""Logs of the lead's probes (tests/corpus/lead_probes/README.md) judged as a user meets them."""
from __future__ import annotations

import subprocess
import sys
import tarfile

from miles_profile.logdir.reader import load_run
from miles_profile.verdicts.engine import judge
from tests.conftest import REPO, python_env

PROBES = REPO / "tests" / "corpus" / "lead_probes"


def test_a_ray_driver_that_crashed_during_start_up_is_no_leak_by_time(tmp_path):
    with tarfile.open(PROBES / "ray_driver_crashed_at_start.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    (run_dir,) = tmp_path.glob("run-*")
    leak = next(c for c in judge(load_run(run_dir)).checks if c.name == "leak")
    finding = leak.findings[0]
    assert leak.status == "warn" and finding.cause == "short_untagged_run", finding.message
    assert "too short to tell a program's start-up from a leak" in finding.message


def test_two_ray_actors_of_one_job_pass_and_are_told_apart(tmp_path):
    """The policy and reference actors (ray_actor_ref.py, recorded on a cluster started before the job):
    PASS with 4 checks judged; each named by its class, not both "trainer rank 0"; a lane each (both were
    "rank 0" of no process group: one lane summed them, 0.836 GiB beside the report's 0.50 GiB peak)."""
    with tarfile.open(PROBES / "ray_actor_ref.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    done = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(tmp_path)], env=python_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: PASS" in done.stdout and "4 of 11 checks judged" in done.stdout
    assert "(1 Ray actor Policy, 1 Ray actor Reference)" in done.stdout, done.stdout
    page = (tmp_path / "report.html").read_text()
    assert "2 processes with phases on 2 lanes (" in page and "vm:pid20774" in page and "vm:pid20807" in page
    assert "0.502 GiB (2%)" in page and "0.836 GiB" not in page, page[page.find("0.836") - 300:page.find("0.836") + 40]
    assert "rank -1" not in page


def test_a_ray_actor_and_its_critic_training_on_one_gpu_pass(tmp_path):
    """scripts/ray_gpu.sh on an H100 (2026-12-05): `--launcher ray --use-critic`, the rank, its critic and
    its engine as three processes on one GPU, the critic training beside the actor as Miles trains them.
    serialized_peaks_per_gpu FAILed it (the critic's 20 GiB of training taken for a residual held
    during the actor's train); their two training states are one training footprint."""
    with tarfile.open(PROBES / "ray_gpu_critic.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    (run_dir,) = tmp_path.glob("run-*")
    checks = {c.name: c for c in judge(load_run(run_dir)).checks}
    per_gpu = checks["serialized_peaks_per_gpu"]
    assert per_gpu.status == "pass" and per_gpu.judged == {"lanes": 1, "processes": 3}, per_gpu.summary
    assert per_gpu.worst["together"] > 40 * 2**30  # actor and critic training together: really judged
    assert checks["offload_drop"].status == "pass" and checks["headroom"].status == "pass"
