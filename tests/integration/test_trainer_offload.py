"""Offload round trips and disk faults on real files and file systems (trainer/offload.py)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from trainer import disk_store
from trainer.actor import Actor, Batch
from trainer.config import ModelConfig
from trainer.errors import OffloadError
from trainer.flat import is_allocated
from trainer.offload import DiskOffloader

CFG = ModelConfig(vocab_size=16, d_model=32, n_layer=2, n_head=4, max_seq_len=10)
CPU = torch.device("cpu")


def _actor(target: str, disk_dir: Path | None, **kw) -> Actor:
    args = dict(lr=1e-2, seed=0, use_critic=False, optimizer_cpu_offload=False, micro_batch_size=16,
                chunk_bytes=8192)
    return Actor(CFG, CPU, offload_target=target, disk_dir=disk_dir, **{**args, **kw})


def _batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 16, (4, 6), generator=g).repeat_interleave(4, dim=0)
    return Batch(prompts, torch.randint(0, 16, (16, 4), generator=g), torch.rand(16, generator=g), 4)


def _snapshot(actor: Actor) -> dict[str, torch.Tensor]:
    snap = {s.name: s.tensor.clone() for s in actor.state}
    for m in actor.models:
        snap[f"{m.name}.step"] = m.steps.clone()
        for name, p in m.module.named_parameters():  # through the model's own views too
            snap[f"{m.name}.module.{name}"] = p.detach().clone()
    return snap


def _assert_same(actor: Actor, snap: dict[str, torch.Tensor]) -> None:
    now = _snapshot(actor)
    assert now.keys() == snap.keys()
    for name in snap:
        assert torch.equal(now[name], snap[name]), name  # bit for bit (NaN-free state)


@pytest.mark.parametrize("target", ["cpu", "disk"])
@pytest.mark.parametrize("host_optimizer", [False, True])
@pytest.mark.parametrize("use_critic", [False, True])
def test_round_trips_are_bit_exact_over_many_cycles(tmp_path, target, host_optimizer, use_critic):
    actor = _actor(target, tmp_path / "off", optimizer_cpu_offload=host_optimizer, use_critic=use_critic)
    for cycle in range(6):
        if cycle % 2:
            actor.train(_batch(cycle))  # the state changes between cycles
        snap = _snapshot(actor)
        actor.offload()
        freed = [not is_allocated(s.tensor) for s in actor.state]
        assert all(freed) if target == "disk" else not any(freed)  # a CPU run keeps host state in place
        actor.onload()
        _assert_same(actor, snap)
    actor.close()


def test_weights_stream_from_disk_chunks_while_offloaded(tmp_path):
    actor = _actor("disk", tmp_path, optimizer_cpu_offload=True)
    actor.train(_batch(0))
    expected = {n: p.detach().clone() for n, p in actor.policy.module.named_parameters()}
    actor.offload()
    streamed = {n: t.clone() for chunk in actor.weight_chunks() for n, t in chunk}
    assert streamed.keys() == expected.keys()
    assert all(torch.equal(streamed[n], expected[n]) for n in expected)


def test_chunks_are_safetensors_files_with_checksums(tmp_path):
    actor = _actor("disk", tmp_path)
    actor.offload()
    entries = disk_store.read_manifest(tmp_path)
    assert len(entries) > 4 and {e.tensor for e in entries} == {s.name for s in actor.state}
    actor.onload()
    flat = actor.policy.params.flat
    actor.offload()
    for e in entries:
        with safe_open(str(tmp_path / e.file), framework="pt") as f:
            assert int(f.metadata()["crc32"], 16) == e.crc32
            data = f.get_tensor("data")
        if e.tensor == "policy.params":
            actor.onload()
            assert torch.equal(data, flat[e.start:e.start + e.numel])
            actor.offload()


def test_corrupted_chunk_is_reported_and_the_state_stays_offloaded(tmp_path):
    actor = _actor("disk", tmp_path)
    actor.offload()
    victim = tmp_path / disk_store.read_manifest(tmp_path)[3].file
    raw = bytearray(victim.read_bytes())
    raw[-5] ^= 0x01  # one bit in the data
    victim.write_bytes(bytes(raw))
    with pytest.raises(OffloadError, match=f"{victim.name} is corrupted: CRC-32"):
        actor.onload()
    assert actor.offloader.offloaded and not any(is_allocated(s.tensor) for s in actor.state)


def test_missing_chunk_is_reported(tmp_path):
    actor = _actor("disk", tmp_path)
    actor.offload()
    (tmp_path / disk_store.read_manifest(tmp_path)[0].file).unlink()
    with pytest.raises(OffloadError, match="cannot be opened"):
        actor.onload()


@pytest.fixture
def mount_tmpfs(tmp_path):
    """Mount a tmpfs of a given size (and options) under tmp_path; unmounted afterwards."""
    mounted = []

    def mount(size: int, readonly: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        opts = f"size={size}" + (",ro" if readonly else "")
        if os.geteuid() != 0:
            pytest.skip("mounting a size-limited tmpfs needs root")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"mount not permitted here: {result.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def test_full_disk_is_caught_before_writing(mount_tmpfs):
    point = mount_tmpfs(256 * 1024)
    actor = _actor("disk", point / "off")
    snap = _snapshot(actor)
    with pytest.raises(OffloadError, match="is full: the training state needs"):
        actor.offload()
    _assert_same(actor, snap)


def test_disk_filling_up_mid_write_keeps_the_state_in_memory(mount_tmpfs, monkeypatch):
    point = mount_tmpfs(256 * 1024)  # the state is ~640 KB: the real ENOSPC comes partway through
    monkeypatch.setattr(DiskOffloader, "_check_space", lambda self: None)
    actor = _actor("disk", point / "off", optimizer_cpu_offload=True)
    actor.train(_batch(0))
    snap = _snapshot(actor)
    with pytest.raises(OffloadError, match="is full .*No space left on device.*stays in memory"):
        actor.offload()
    _assert_same(actor, snap)
    assert not list((point / "off").iterdir())  # the partial copy is removed
    actor.train(_batch(1))  # and training goes on


def test_read_only_file_system_is_reported(mount_tmpfs):
    point = mount_tmpfs(1024 * 1024, readonly=True)
    actor = _actor("disk", point)
    snap = _snapshot(actor)
    with pytest.raises(OffloadError, match="is not writable"):
        actor.offload()
    _assert_same(actor, snap)
