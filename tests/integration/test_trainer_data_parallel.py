"""Data parallelism at the actor level: two gloo ranks, each on half of a batch, take the same optimizer
steps as one process on the whole batch (gradients averaged across ranks; PPO advantages whitened with
the whole batch's statistics). Ranks are real processes (torch.multiprocessing.spawn)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from trainer.actor import Actor, Batch
from trainer.config import ModelConfig

CFG = ModelConfig(vocab_size=16, d_model=32, n_layer=2, n_head=4, max_seq_len=10)
STEPS, N, GROUP, LR = 3, 16, 4, 1e-2
# float32 sums in another order (all-reduce of halves vs one backward) differ in the last bits. The
# gradient norm shows that directly; AdamW then divides each gradient by its own running RMS, so an
# element whose gradient is ~0 may move by up to lr in either direction: the weights are compared to a
# small fraction of lr per step, while a wrong gradient (the last test) moves them by about lr.
NORM_RTOL = 1e-5
WEIGHT_ATOL = 0.01 * LR * STEPS


def _actor(use_critic: bool, optimizer_cpu_offload: bool) -> Actor:
    return Actor(CFG, torch.device("cpu"), lr=LR, seed=0, use_critic=use_critic,
                 optimizer_cpu_offload=optimizer_cpu_offload, micro_batch_size=4, chunk_bytes=4096)


def _batch(step: int, part: slice = slice(None)) -> Batch:
    g = torch.Generator().manual_seed(step)
    prompts = torch.randint(0, 10, (N // GROUP, 6), generator=g).repeat_interleave(GROUP, dim=0)
    responses, rewards = torch.randint(0, 16, (N, 4), generator=g), torch.rand(N, generator=g)
    return Batch(prompts[part], responses[part], rewards[part], GROUP)


def _train(actor: Actor, part: slice = slice(None)) -> tuple[list[float], list[torch.Tensor]]:
    norms = [actor.train(_batch(step, part)).grad_norm for step in range(STEPS)]
    return norms, [m.params.flat.clone() for m in actor.models]


def _rank(rank: int, world: int, init_file: str, flags: tuple[bool, bool], out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        share = N // world
        out[rank] = _train(_actor(*flags), slice(rank * share, (rank + 1) * share))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("use_critic,optimizer_cpu_offload", [(False, False), (True, False), (False, True)])
def test_two_ranks_on_half_batches_equal_one_rank_on_the_full_batch(tmp_path, use_critic, optimizer_cpu_offload):
    flags = (use_critic, optimizer_cpu_offload)
    single = _train(_actor(*flags))
    with tmp.Manager() as manager:
        out = manager.dict()
        tmp.spawn(_rank, args=(2, str(tmp_path / "init"), flags, out), nprocs=2, join=True)
        ranks = [out[0], out[1]]
    for norms, weights in ranks:
        assert norms == pytest.approx(single[0], rel=NORM_RTOL)  # the averaged gradient is the full batch's
        for got, want in zip(weights, single[1]):
            torch.testing.assert_close(got, want, rtol=0, atol=WEIGHT_ATOL)
    assert torch.equal(ranks[0][1][0], ranks[1][1][0])  # the ranks stay identical, bit for bit


def test_one_rank_alone_is_not_the_full_batch_update():
    """The test above can fail: half a batch without the other rank's gradient gives other weights."""
    half, full = _train(_actor(False, False), slice(0, N // 2)), _train(_actor(False, False))
    assert half[0] != pytest.approx(full[0], rel=NORM_RTOL)
    assert (half[1][0] - full[1][0]).abs().max() > 10 * WEIGHT_ATOL
