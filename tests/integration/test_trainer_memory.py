"""Releasing engine memory and offloading training state to disk really lower this process's RSS
(psutil), at the sizes of the cpu preset, so the recorder's checks see real drops on CPU."""
from __future__ import annotations

import psutil
import pytest
import torch

from trainer.actor import Actor
from trainer.config import PRESETS, model_config
from trainer.rollout_engine import RolloutEngine

PRESET = PRESETS["cpu"]
CFG = model_config(PRESET, PRESET.digits)
CPU = torch.device("cpu")
SHARE = 0.9  # at least this share of the bytes a phase says it moved must show in RSS


def _rss() -> int:
    return psutil.Process().memory_info().rss


@pytest.mark.parametrize("tags", [["kv_cache"], ["weights"], ["kv_cache", "weights", "cuda_graph"]])
def test_engine_release_and_resume_move_rss(tags):
    engine = RolloutEngine(CFG, CPU, PRESET.kv_cache_bytes)
    expected = engine.occupied_bytes(tags)
    assert expected >= 30 * 1024**2
    before = _rss()
    engine.release_memory_occupation(tags)
    after_release = _rss()
    assert before - after_release >= SHARE * expected
    assert engine.released_bytes(tags) == expected
    engine.resume_memory_occupation(tags)
    assert _rss() - after_release >= SHARE * expected


def test_disk_offload_moves_the_training_state_out_of_rss(tmp_path):
    actor = Actor(CFG, CPU, lr=1e-3, seed=0, use_critic=False, optimizer_cpu_offload=False,
                  micro_batch_size=16, offload_target="disk", disk_dir=tmp_path, chunk_bytes=PRESET.chunk_bytes)
    expected = actor.offloader.expected_bytes()
    assert expected == actor.state_bytes() >= 100 * 10**6  # the preset's promise: >= 100 MB of state
    before = _rss()
    actor.offload()
    after = _rss()
    assert before - after >= SHARE * expected
    actor.onload()
    assert _rss() - after >= SHARE * expected
    actor.close()


def test_cpu_target_on_a_cpu_run_moves_nothing():
    actor = Actor(CFG, CPU, lr=1e-3, seed=0, use_critic=False, optimizer_cpu_offload=False,
                  micro_batch_size=16, chunk_bytes=PRESET.chunk_bytes)
    before = _rss()
    actor.offload()
    assert actor.offloader.expected_bytes() == 0
    assert abs(_rss() - before) < 8 * 1024**2
