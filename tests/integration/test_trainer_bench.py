"""bench/bench_offload.py runs from source on CPU and reports both ratios."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO, python_env


def test_offload_bench_runs_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "bench/bench_offload.py", "--preset", "tiny", "--device", "cpu", "--repeats", "1",
         "--disk-dir", str(tmp_path / "disk"), "--out", str(out)],
        cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "offload_train" in result.stdout and "onload_train" in result.stdout
    (disk,) = json.loads(out.read_text())["results"]
    assert disk["target"] == "disk" and isinstance(disk["bytes"], int) and disk["bytes"] > 0
    assert disk["offload_ratio"] > 0 and disk["onload_ratio"] > 0
    assert not list((tmp_path / "disk").iterdir())  # the bench removes what it wrote
