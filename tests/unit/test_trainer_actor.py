"""The actor's optimizer and weight export (trainer/actor.py), in memory (no offload target used)."""
from __future__ import annotations

import pytest
import torch

from trainer.actor import BETAS, WEIGHT_DECAY, Actor, Batch
from trainer.config import ModelConfig
from trainer.model import GPT

CFG = ModelConfig(vocab_size=16, d_model=32, n_layer=2, n_head=4, max_seq_len=10)
CPU = torch.device("cpu")
RTOL, ATOL = 1e-5, 1e-7  # the tolerance actor.py states for --optimizer-cpu-offload


def _actor(**kw) -> Actor:
    args = dict(lr=1e-2, seed=0, use_critic=False, optimizer_cpu_offload=False, micro_batch_size=8,
                chunk_bytes=4096)
    return Actor(CFG, CPU, **{**args, **kw})


def _batch(seed: int, n: int = 16) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 16, (n // 4, 6), generator=g).repeat_interleave(4, dim=0)
    return Batch(prompts, torch.randint(0, 16, (n, 4), generator=g), torch.rand(n, generator=g), 4)


@pytest.mark.parametrize("use_critic", [False, True])
def test_host_optimizer_matches_device_optimizer(use_critic):
    device, host = _actor(use_critic=use_critic), _actor(use_critic=use_critic, optimizer_cpu_offload=True)
    for step in range(5):
        a, b = device.train(_batch(step)), host.train(_batch(step))
        assert a.loss == b.loss and a.grad_norm == b.grad_norm
        for m, n in zip(device.models, host.models):
            assert torch.allclose(m.params.flat, n.params.flat, rtol=RTOL, atol=ATOL)
            assert torch.equal(m.params.flat, n.params.flat)  # on CPU: the same arithmetic, bit for bit


def test_flat_adamw_equals_per_parameter_adamw():
    actor = _actor(micro_batch_size=16)
    reference = GPT(CFG)  # ordinary parameters, one lazily created AdamW state per tensor
    reference.load_state_dict({n: p.detach().clone() for n, p in actor.policy.module.named_parameters()})
    ref_params = list(reference.parameters())
    opt = torch.optim.AdamW(ref_params, lr=1e-2, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True)
    for step in range(3):
        actor.train(_batch(step, 16))
        _reference_step(reference, ref_params, opt, _batch(step, 16))
    for (name, p), q in zip(actor.policy.module.named_parameters(), ref_params):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), name


def _reference_step(model: GPT, params, opt, batch: Batch) -> None:
    from trainer import algo
    tokens = torch.cat([batch.prompts, batch.responses], 1)
    logp = algo.response_logprobs(model(tokens[:, :-1]), tokens, batch.prompts.shape[1])
    adv = algo.grpo_advantages(batch.rewards, 4, batch.responses.shape[1])
    opt.zero_grad()
    algo.policy_loss(logp, logp.detach(), adv).backward()
    norm = torch.cat([p.grad.flatten() for p in params]).norm()
    for p in params:
        p.grad.mul_(torch.clamp(1.0 / (norm + 1e-6), max=1.0))
    opt.step()


def test_micro_batches_accumulate_into_the_flat_gradient():
    whole, parts = _actor(micro_batch_size=16), _actor(micro_batch_size=4)
    grads = [_capture_grads(whole), _capture_grads(parts)]
    a, b = whole.train(_batch(0)), parts.train(_batch(0))
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
    assert torch.allclose(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-7)
    assert torch.count_nonzero(whole.policy.grads) == 0  # zeroed after the step, in place


def _capture_grads(actor: Actor) -> list[torch.Tensor]:
    seen, step = [], actor.policy.step

    def spy():
        seen.append(actor.policy.grads.clone())
        return step()
    actor.policy.step = spy
    return seen


def test_training_changes_weights_and_optimizer_state():
    actor = _actor()
    before = actor.policy.params.flat.clone()
    actor.train(_batch(0))
    policy = actor.policy
    assert not torch.equal(before, policy.params.flat)
    assert torch.count_nonzero(policy.exp_avg_sq) > 0 and policy.steps.item() == 1.0


def test_weight_chunks_cover_every_parameter_once():
    actor = _actor(chunk_bytes=2048)
    chunks = list(actor.weight_chunks())
    names = [n for c in chunks for n, _ in c]
    assert len(chunks) > 1 and names == [n for n, _ in actor.policy.module.named_parameters()]
    for chunk in chunks:
        assert sum(t.numel() * 4 for _, t in chunk) <= 2048 or len(chunk) == 1
    for (_, t), p in zip((x for c in chunks for x in c), actor.policy.module.parameters()):
        assert torch.equal(t, p)


def test_state_covers_params_grads_and_moments():
    actor = _actor(use_critic=True, optimizer_cpu_offload=True)
    names = {s.name for s in actor.state}
    for model in ("policy", "critic"):
        assert {f"{model}.{k}" for k in ("params", "grads", "exp_avg", "exp_avg_sq", "master",
                                         "master_grad")} <= names
    assert actor.state_bytes() == sum(s.tensor.numel() * 4 for s in actor.state)


def test_an_actor_trains_without_importing_torchs_compiler():
    """torch.optim.AdamW's first construction imports torch._dynamo (about 820 modules, 1.0 CPU-s, 23.7 MiB of
    heap in every rank); the actor's functional AdamW, the same kernel, imports nothing."""
    import subprocess
    import sys
    from tests.conftest import python_env
    program = ("import sys, torch\n"
               "from tests.unit.test_trainer_actor import _actor, _batch\n"
               "before = set(sys.modules)\n"
               "_actor(use_critic=True).train(_batch(0))\n"
               "print(sorted(set(sys.modules) - before))\n")
    done = subprocess.run([sys.executable, "-c", program], env=python_env(), capture_output=True, text=True,
                          timeout=120, check=True)
    imported = done.stdout.strip()
    assert "torch._dynamo" not in imported and "sympy" not in imported, imported[:500]
