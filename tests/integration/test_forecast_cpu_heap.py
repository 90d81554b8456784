"""The CPU forecast judged in the report against glibc's heap in use (`record --heap`): real trainer
runs recorded in a subprocess, the comparison read from their logs, and a plan made wrong on purpose
listed by `visualize`."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import miles_profile as mp
from miles_profile.runmodel.forecast import compare, stored_plan
from tests.conftest import REPO, python_env, record_once

GiB = 1024**3


def _record(log_dir, *flags: str) -> None:
    subprocess.run([sys.executable, "-m", "miles_profile.record", "--heap", "--log-dir", str(log_dir), "--",
                    "--preset", "cpu", "--num-rollout", "1", *flags],
                   cwd=REPO, env=python_env(), check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def heap_cpu_run(tmp_path_factory) -> Path:
    """The plain cpu preset recorded with --heap once: the judged forecast and the forecast made wrong both
    read it (the second from a copy), one trainer run less."""
    return record_once(tmp_path_factory, "recorded-heap-cpu-run", ["--preset", "cpu", "--num-rollout", "1"],
                       record_flags=("--heap",))


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    [],
    ["--offload-train", "--offload-rollout", "--use-critic"],
    ["--rollout-engine", "server", "--offload-rollout"],  # the engine's own process, its own baseline
])
def test_cpu_forecast_is_judged_against_the_heap_and_within_5_percent(tmp_path, flags, request):
    if flags:
        _record(tmp_path, *flags)
    run = mp.load(tmp_path if flags else request.getfixturevalue("heap_cpu_run"))
    pids, plan = stored_plan(run)
    comparison = compare(run, plan, pids)
    assert {"update_weights", "generate", "train"} <= set(comparison["phase"])
    assert (comparison["basis"] == "heap").all() and comparison["judged"].all()
    assert (comparison["measured"] > 0.05 * GiB).all()  # the cpu preset's state, weights, KV pool: not noise
    assert (comparison["error"].abs() < 0.05).all(), comparison.to_string()
    assert set(comparison["process"]) == ({"trainer", "engine"} if "server" in flags else {"trainer"})
    if "--use-critic" in flags:  # an offload's peak is the level entering it: the read before the phase counts
        offload = comparison.set_index("phase").loc["offload_rollout"]
        assert abs(offload["error"]) < 0.05 and offload["measured"] > 0.4 * GiB


@pytest.mark.slow
def test_a_forecast_10_percent_off_is_listed_by_visualize(tmp_path, heap_cpu_run):
    log_dir = tmp_path / "logs"
    shutil.copytree(heap_cpu_run, log_dir, ignore=shutil.ignore_patterns(".*"))  # not the readers' caches
    meta_path = next(log_dir.glob("*/vm-*.meta.json"))
    meta = json.loads(meta_path.read_text())
    train = next(p for p in meta["annotations"]["forecast"]["phases"] if p["phase"] == "train")
    train["peak"] = int(train["peak"] * 1.1)
    meta_path.write_text(json.dumps(meta))
    result = subprocess.run([sys.executable, "-m", "miles_profile.visualize", str(log_dir), "-o",
                             str(tmp_path / "report.html")], cwd=REPO, env=python_env(), capture_output=True,
                            text=True, timeout=300)
    listed = [line for line in result.stdout.splitlines() + result.stderr.splitlines() if "forecast outside" in line]
    assert len(listed) == 1 and "train on host" in listed[0] and "(heap)" in listed[0], result.stdout
    assert "forecast-outside" in (tmp_path / "report.html").read_text()


def test_without_heap_the_host_forecast_is_shown_not_judged(recorded_cpu_run):
    run = mp.load(recorded_cpu_run)
    pids, plan = stored_plan(run)
    comparison = compare(run, plan, pids)
    assert not comparison.empty and (comparison["basis"] == "rss_growth").all() and not comparison["judged"].any()
    # without --heap the heap is read at phase boundaries only (issue 30): too sparse to judge a forecast by
    heap = run.samples["heap_used"] if "heap_used" in run.samples else None
    assert heap is None or heap.notna().sum() < len(run.samples) / 2
