"""Issue 21's diagnoses on real logs: the tiny preset recorded on the H200 (sample_logs/h200-tiny:
`record -- --preset tiny --num-rollout 3 --offload-train --offload-rollout --colocate-memory-peak-device gpu
--offload-rollout-level kv_cache weight`) exits 0, its few-MiB footprints and KiB weights too small to
judge; a multi-process CPU run recorded here has its host's headroom judged."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "sample_logs" / "h200-tiny"


def _visualize(run: Path, tmp_path: Path) -> tuple[int, dict, str]:
    out = tmp_path / "verdicts.json"
    proc = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(run), "--json", str(out),
                           "-o", str(tmp_path / "report.html")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    checks = {c["name"]: c for c in json.loads(out.read_text())["runs"][0]["checks"]} if out.exists() else {}
    return proc.returncode, checks, proc.stdout + proc.stderr


def test_the_tiny_preset_on_the_h200_exits_0_its_small_footprints_too_small(tmp_path):
    # before: serialized_peaks failed 6 of 6 phases ("0.688 GiB resident >= 0.669 GiB: both footprints
    # held at once") and host_weight_copies "host RSS grew 0.016 GiB, weights 0.000 GiB"
    code, checks, output = _visualize(TINY, tmp_path)
    assert code == 0, output
    serialized = checks["serialized_peaks"]
    assert serialized["status"] != "fail", serialized["summary"]
    generate = [f for f in serialized["findings"] if f["phase"] == "generate"]
    assert generate and all(f["status"] == "too small to judge" for f in generate), generate
    assert "below the resolution" in generate[0]["message"]
    weights = checks["host_weight_copies"]
    assert weights["status"] == "too small to judge", weights["summary"]
    assert "90% of the weights, 0.2 MiB below the resolution" in weights["summary"]


@pytest.mark.slow
def test_headroom_of_a_multi_process_cpu_run_is_judged_on_the_host(tmp_path):
    # before: n/a in every process ("host total unknown"): the total is in the host sampler's files only
    log = tmp_path / "log"
    subprocess.run([sys.executable, "-m", "miles_profile.record", "--log-dir", str(log), "--", "--nproc-per-node", "2",
                    "--preset", "tiny", "--num-rollout", "2"], cwd=ROOT, check=True, capture_output=True, timeout=240)
    code, checks, output = _visualize(log, tmp_path)
    assert code == 0, output
    headroom = checks["headroom"]
    assert headroom["status"] == "pass", headroom["summary"]
    assert "used (total − available)" in headroom["summary"]
    # every process judged the host (no "host total unknown")
    assert not any("unknown" in f["message"] for f in headroom["findings"])
