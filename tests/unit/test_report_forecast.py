"""miles_profile/runmodel/forecast.py on real logs: what it measures, and plans it cannot trust."""
from __future__ import annotations

import json
import shutil

import miles_profile as mp
from miles_profile.runmodel.forecast import compare, stored_plan
from tests.conftest import REPO
from miles_profile.runmodel.replan import plan_for_run


def test_measured_is_the_allocators_true_peak_over_each_phases_samples():
    run = mp.load(REPO / "sample_logs/h200/3-offload-rollout")
    pids, plan = plan_for_run(run)
    comparison = compare(run, plan, pids).set_index(["phase", "device"])
    samples, phases = run.samples, run.phases
    for name in ("generate", "offload_rollout", "train", "onload_kv"):
        # a phase's samples are those with start < t <= end (each peak covers the time since the last one)
        peaks = [samples.loc[(samples["t"] > p.start) & (samples["t"] <= p.end), "gpu0_alloc_peak"].max()
                 for p in phases[phases["name"] == name].itertuples()]
        assert comparison.at[(name, "cuda"), "measured"] == max(peaks)
        host = comparison.loc[(name, "host")]
        assert not host["judged"] and host["basis"] == "rss_growth"


def test_malformed_plan_entries_are_dropped(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(REPO / "sample_logs/cpu", run_dir)
    pids, plan = plan_for_run(mp.load(run_dir))
    plan["phases"] += [{"phase": 3}, "x", {"phase": "train", "device": "cuda", "peak": "big", "allocator": 1},
                       {"phase": "train", "device": "gpu", "peak": 1, "allocator": 1}]
    meta_path = run_dir / f"vm-{pids['trainer']}.meta.json"
    meta = json.loads(meta_path.read_text())
    meta["annotations"] = {"forecast": plan}
    meta_path.write_text(json.dumps(meta))
    found_pids, found = stored_plan(mp.load(run_dir))
    assert found_pids == pids and len(found["phases"]) == len(plan["phases"]) - 4
    comparison = compare(mp.load(run_dir), found, found_pids)
    assert len(comparison) == 10 and set(comparison["device"]) == {"host"}


def test_the_cpu_sample_log_is_judged_on_the_heap_and_a_cuda_plan_never_is(tmp_path):
    """sample_logs/cpu was recorded with --heap: every host phase judged on glibc's heap, within 5%.
    The same log with its plan marked cuda falls back to RSS growth, shown: a CUDA run's offload
    buffers are pinned memory that malloc never sees."""
    run = mp.load(REPO / "sample_logs/cpu")
    pids, plan = stored_plan(run)
    comparison = compare(run, plan, pids)
    assert len(comparison) == 10 and (comparison["basis"] == "heap").all() and comparison["judged"].all()
    assert (comparison["error"].abs() < 0.05).all()
    run_dir = tmp_path / "run"
    shutil.copytree(REPO / "sample_logs/cpu", run_dir)
    meta_path = next(run_dir.glob("vm-*.meta.json"))
    meta = json.loads(meta_path.read_text())
    meta["annotations"]["forecast"]["device"] = "cuda"
    meta_path.write_text(json.dumps(meta))
    run = mp.load(run_dir)
    pids, plan = stored_plan(run)
    comparison = compare(run, plan, pids)
    assert (comparison["basis"] == "rss_growth").all() and not comparison["judged"].any()
