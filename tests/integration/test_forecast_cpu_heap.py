"""The CPU forecast against glibc's heap in use, measured in a real trainer run (scripts/forecast_cpu_heap.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, python_env


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    ["--preset", "cpu", "--num-rollout", "1"],
    ["--preset", "cpu", "--num-rollout", "1", "--offload-train", "--offload-rollout", "--use-critic"],
])
def test_cpu_forecast_within_5_percent_of_the_heap_in_use(flags):
    result = subprocess.run([sys.executable, "scripts/forecast_cpu_heap.py", *flags], cwd=REPO, env=python_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| ") and "GiB" not in line]
    phases = {cells[0].strip(): (float(cells[1]), float(cells[2]), float(cells[3].strip().rstrip("%")))
              for cells in rows}
    assert {"update_weights", "generate", "train"} <= set(phases)
    for phase, (forecast, measured, error) in phases.items():
        assert measured > 0.2, phase  # the cpu preset's state and KV pool: a real measurement, not noise
        assert abs(error) < 5, (phase, forecast, measured)
