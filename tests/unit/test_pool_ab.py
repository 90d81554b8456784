"""bench/pool_ab.py: several alternation runs pooled into one ratio (docs/benchmarks.md)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.pool_ab import pooled_ratio

ROOT = Path(__file__).resolve().parents[2]


def _run(step_s: float, ratio: float, quads: int, noise: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    a = step_s * 2 * (1 + noise * rng.standard_normal(quads))
    b = a * ratio * (1 + noise * rng.standard_normal(quads))
    return {"interval_ms": 100.0, "blocks": 4 * quads, "step_ms_a": step_s * 1e3, "ratio": float(b.sum() / a.sum()),
            "ci95": [0.0, 0.0], "quad_seconds_a": a.tolist(), "quad_seconds_b": b.tolist()}


def test_one_run_pools_to_its_own_ratio():
    run = _run(0.005, 1.01, 200, 0.01, 0)
    ratio, lo, hi = pooled_ratio([run])
    assert ratio == pytest.approx(run["ratio"])
    assert lo < ratio < hi


def test_runs_of_different_step_times_weigh_alike_and_narrow_the_interval():
    slow, fast = _run(0.007, 1.02, 300, 0.01, 1), _run(0.0045, 1.00, 300, 0.01, 2)
    ratio, lo, hi = pooled_ratio([slow, fast])
    # scaled by their own steps, the slow run's seconds do not outweigh the fast one's
    assert ratio == pytest.approx((slow["ratio"] + fast["ratio"]) / 2, abs=0.002)
    _, lo1, hi1 = pooled_ratio([slow])
    assert hi - lo < hi1 - lo1


def test_a_run_without_quads_is_a_one_line_error(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"interval_ms": 100.0, "blocks": 8, "step_ms_a": 5.0, "ratio": 1.0, "ci95": [1, 1]}))
    done = subprocess.run([sys.executable, "bench/pool_ab.py", str(path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "per-quad seconds" in done.stderr
