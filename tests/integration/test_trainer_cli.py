"""`python -m trainer.train` and `python -m miles_profile.record -- ...` as real processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import miles_profile as mp
from tests.conftest import REPO, python_env

ALL_FLAGS = ["--offload-train", "--offload-rollout", "--colocate-memory-peak-device", "gpu",
             "--offload-rollout-level", "kv_cache", "weight", "--optimizer-cpu-offload"]


def _train(*argv: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.train", *argv], cwd=REPO, env=python_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv", [
    ["--colocate-memory-peak-device", "gpu"],
    ["--colocate-memory-peak-device", "gpu", "--offload-train", "--offload-rollout", "--use-critic"],
    ["--offload-rollout", "--offload-rollout-level", "kv_cache,disk"],
    ["--offload-train", "--offload-train-target", "disk"],
    ["--device", "tpu"],
    ["--bogus-flag"],
    ["--device", "cpu", "--rollout-memory-backend", "torch_memory_saver"],
])
@pytest.mark.slow
def test_bad_flags_exit_2_with_one_line(argv):
    result = _train(*argv)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "error:" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("argv", [["--bogus-flag"], ["--device", "tpu"], ["--help"]])
def test_a_typo_or_help_is_answered_before_torch_loads(argv):
    """argparse's own errors and --help need no torch (seconds to import): they answer at once."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "trainer.train", *argv], cwd=REPO,
                            env=python_env(), capture_output=True, text=True, timeout=60)
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert imported and "torch" not in imported, result.stderr[-500:]
    assert result.returncode == (0 if argv == ["--help"] else 2)


@pytest.mark.slow
def test_a_run_prints_one_line_per_rollout():
    result = _train("--preset", "tiny", "--num-rollout", "3", *ALL_FLAGS)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("rollout ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert all("reward" in line and "loss" in line and "step" in line for line in lines)


def test_full_disk_at_runtime_is_one_line_and_exit_1(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    point = tmp_path / "small"
    point.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(point)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"mount not permitted here: {mount.stderr.strip()}")
    try:
        result = _train("--preset", "tiny", "--num-rollout", "1", "--offload-train",
                        "--offload-train-target", "disk", "--offload-train-disk-dir", str(point))
    finally:
        subprocess.run(["umount", str(point)], check=False)
    assert result.returncode == 1
    assert result.stderr.strip().startswith("trainer: error: offload dir") and "is full" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.slow
def test_recorded_cpu_preset_run_with_every_offload_flag(tmp_path, ram_dir):
    """The `make demo` configuration: under 2 minutes, and every offload really drops RSS."""
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "miles_profile.record", "--log-dir", str(tmp_path / "logs"), "--",
         "--preset", "cpu", "--num-rollout", "2", *ALL_FLAGS, "--offload-train-target", "disk",
         "--offload-train-disk-dir", str(ram_dir / "offload")],
        cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=180)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert elapsed < 120, elapsed
    run = mp.load(next((tmp_path / "logs").iterdir()))
    phases, samples = run.phases, run.samples
    offloads = phases[phases["name"].str.startswith("offload_")]
    assert set(offloads["name"]) == {"offload_kv", "offload_weights", "offload_train"}
    for _, p in offloads.iterrows():
        # the rows the recorder takes at the phase's begin and end (just before each boundary); the first
        # row after the end can be an interval later, when the next phase has grown RSS again
        before = samples[samples.t <= p.start].rss.iloc[-1]
        after = samples[samples.t <= p.end].rss.iloc[-1]
        assert before - after >= 0.8 * p.expected_bytes, (p["name"], before, after, p.expected_bytes)
