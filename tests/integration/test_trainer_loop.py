"""The RL loop end to end on CPU, in process: the phase order of every configuration, identical
losses with and without offloading, and a reward that rises."""
from __future__ import annotations

import contextlib
import gc

import pytest

import miles_profile as mp
from trainer import train
from trainer.args import parse_args

TINY = ["--preset", "tiny", "--seed", "7"]
OFFLOAD = ["--offload-train", "--offload-rollout"]
SETUP = ["update_weights"]
CPU_ALL = ["generate", "offload_rollout", "onload_train", "train", "offload_train", "onload_weights",
           "update_weights", "onload_kv"]
GPU_ALL = ["generate", "offload_kv", "onload_train", "offload_weights", "train", "clear_memory",
           "onload_weights", "offload_train", "update_weights", "onload_kv"]

CONFIGS = {  # flags -> phases of one rollout
    "none": ([], ["generate", "train", "clear_memory", "update_weights"]),
    "cpu-all": (OFFLOAD, CPU_ALL),
    "cpu-train-only": (["--offload-train"], ["generate", "onload_train", "train", "offload_train",
                                             "update_weights"]),
    "cpu-kv-only": (["--offload-rollout", "--offload-rollout-level", "kv_cache"],
                    ["generate", "offload_rollout", "train", "clear_memory", "update_weights", "onload_kv"]),
    "cpu-critic": ([*OFFLOAD, "--use-critic"], CPU_ALL),
    "gpu-all": ([*OFFLOAD, "--colocate-memory-peak-device", "gpu"], GPU_ALL),
    "gpu-kv-only": ([*OFFLOAD, "--colocate-memory-peak-device", "gpu", "--offload-rollout-level", "kv_cache"],
                    ["generate", "offload_kv", "onload_train", "train", "clear_memory", "offload_train",
                     "update_weights", "onload_kv"]),
    "gpu-weight-only": ([*OFFLOAD, "--colocate-memory-peak-device", "gpu", "--offload-rollout-level", "weight"],
                        ["generate", "onload_train", "offload_weights", "train", "clear_memory",
                         "onload_weights", "offload_train", "update_weights", "onload_kv"]),
}


@pytest.fixture(scope="module", autouse=True)
def worker_heap_frozen():
    """The trainer collects between phases (`gc.collect()` in clear_memory, as Miles does); in this worker
    each call walked everything the worker held (600,000 objects, 0.36 s a call: 23 of the module's 32
    CPU-s). Left out while the module runs (gc.freeze), as a trainer process leaves its imports out
    (trainer/gc_startup.py), and given back to the collector after."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def phases(monkeypatch):
    seen: list[tuple[str, dict]] = []

    @contextlib.contextmanager
    def fake_phase(name, **attrs):
        seen.append((name, attrs))
        yield

    monkeypatch.setattr(mp, "phase", fake_phase)
    return seen


def _target_flags(target: str, tmp_path) -> list[str]:
    if target == "disk":
        return ["--offload-train-target", "disk", "--offload-train-disk-dir", str(tmp_path)]
    return []


CASES = [(name, target) for name in sorted(CONFIGS) for target in ("cpu", "disk")
         if target == "cpu" or "--offload-train" in CONFIGS[name][0]]  # disk needs --offload-train


@pytest.mark.slow
@pytest.mark.parametrize("name, target", CASES)
def test_phase_order_of_every_configuration(phases, tmp_path, name, target):
    flags, per_rollout = CONFIGS[name]
    argv = [*TINY, "--num-rollout", "2", *flags, *_target_flags(target, tmp_path)]
    assert train.main(argv) == 0
    setup = (["offload_train"] if "--offload-train" in flags else []) + SETUP
    assert [n for n, _ in phases] == setup + per_rollout + per_rollout
    for n, attrs in phases[len(setup):]:
        assert attrs["rollout_id"] in (0, 1), n
        if n.startswith(("offload_", "onload_")):
            assert isinstance(attrs["expected_bytes"], int) and attrs["expected_bytes"] >= 0
        if n.endswith("_train") and n != "train":
            assert attrs["target"] == target
            assert (attrs["expected_bytes"] > 0) == (target == "disk")  # a CPU run moves nothing to cpu
        if n in ("offload_rollout", "offload_kv"):
            assert "cuda_graph" in attrs["tags"] and attrs["expected_bytes"] > 0
    assert not list(tmp_path.iterdir())  # the run removes its disk offload files


def _history(argv):
    return [(reward, stats.loss, stats.grad_norm) for reward, stats in train.run(parse_args(argv))]


@pytest.mark.slow
@pytest.mark.parametrize("order, critic", [("cpu", []), ("cpu", ["--use-critic"]), ("gpu", [])])
def test_offloading_changes_no_loss(tmp_path, order, critic):
    base = [*TINY, "--num-rollout", "3", *critic]
    everything = [*base, *OFFLOAD, "--optimizer-cpu-offload", "--offload-rollout-level", "kv_cache,weight",
                  "--colocate-memory-peak-device", order, *_target_flags("disk", tmp_path)]
    plain, offloaded = _history(base), _history(everything)
    assert plain == offloaded  # exact: same floats, rollout by rollout
    assert len({h[2] for h in plain}) == 3  # the runs really trained (the check can fail)


@pytest.mark.slow
def test_reward_rises_on_cpu():
    history = _history(["--preset", "tiny", "--seed", "1", "--num-rollout", "40"])
    rewards = [r for r, _, _ in history]
    early, late = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert late > early + 0.05, (early, late)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["the model", "the engine"])
def test_a_ctrl_c_while_the_run_starts_removes_its_disk_offload_dir(monkeypatch, tmp_path, where):
    # A Ctrl-C a moment after `record` said "recording to" landed while the model was built, before the
    # cleanup's try: the run's trainer-<pid> directory stayed (a flaky Ctrl-C test of the suite, 2026-12-06)
    real = train.Actor if where == "the model" else train._start_engine

    def interrupted(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "Actor" if where == "the model" else "_start_engine", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train.run(parse_args([*TINY, "--num-rollout", "1", *OFFLOAD, *_target_flags("disk", tmp_path)]))
    assert not list(tmp_path.iterdir())
