"""Advantages, losses and the task's reward (trainer/algo.py, trainer/task.py)."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer import algo, task


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(2, 8), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_grpo_advantages_are_normalised_within_each_group(groups, size, resp_len, seed):
    rewards = torch.rand(groups * size, generator=torch.Generator().manual_seed(seed))
    adv = algo.grpo_advantages(rewards, size, resp_len)
    assert adv.shape == (groups * size, resp_len)
    per_group = adv[:, 0].view(groups, size)
    # Centred rewards cancel up to float32 rounding of the rewards, which dividing by the group's std
    # magnifies: a group of near-equal rewards is spread to about +-1 from differences of a few ulps.
    grouped = rewards.view(groups, size)
    rounding = size * torch.finfo(torch.float32).eps * grouped.abs().amax(dim=1) / (grouped.std(dim=1) + 1e-6)
    assert torch.all(per_group.mean(dim=1).abs() <= 1e-5 + rounding)
    assert torch.all(adv == adv[:, :1])  # the sequence's advantage on every token


def test_grpo_ranks_better_samples_higher():
    adv = algo.grpo_advantages(torch.tensor([0.0, 1.0, 0.5, 0.5]), 2, 1)[:, 0]
    assert adv[1] > 0 > adv[0] and torch.allclose(adv[2:], torch.zeros(2))


def test_gae_with_lambda_one_is_return_minus_value():
    values = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.0, -0.5]])
    rewards = torch.tensor([1.0, 0.0])
    adv, returns = algo.gae_advantages(rewards, values, lam=1.0)
    assert torch.allclose(adv, rewards[:, None] - values)
    assert torch.allclose(returns, rewards[:, None].expand_as(values))


def test_gae_with_lambda_zero_is_one_step_td():
    values = torch.tensor([[0.1, 0.2, 0.3]])
    adv, _ = algo.gae_advantages(torch.tensor([1.0]), values, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[0.2 - 0.1, 0.3 - 0.2, 1.0 - 0.3]]))


def test_policy_gradient_raises_logprob_of_positive_advantage():
    logits = torch.zeros(2, 3, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[:, 0]
    algo.policy_loss(logp, logp.detach(), torch.tensor([1.0, -1.0])).backward()
    assert logits.grad[0, 0] < 0 < logits.grad[1, 0]  # descent raises row 0's token, lowers row 1's


def test_policy_loss_clips_large_ratios():
    logp = torch.tensor([1.0], requires_grad=True)
    algo.policy_loss(logp, torch.tensor([0.0]), torch.tensor([1.0])).backward()
    assert logp.grad.item() == 0.0  # ratio e > 1.2 with positive advantage: no further push


def test_response_logprobs_picks_response_positions():
    tokens = torch.tensor([[1, 2, 3, 4]])  # prompt [1, 2], response [3, 4]
    logits = torch.full((1, 3, 5), -1e9)
    logits[0, 1, 3] = 0.0  # position 1 predicts token 3
    logits[0, 2, 4] = 0.0
    assert torch.allclose(algo.response_logprobs(logits, tokens, prompt_len=2), torch.zeros(1, 2))


def test_reward_counts_reversed_digits():
    prompts = task.sample_prompts(4, 5, torch.Generator().manual_seed(0))
    assert prompts.shape == (4, 7) and (prompts[:, 0] == task.BOS).all() and (prompts[:, -1] == task.SEP).all()
    perfect = task.targets(prompts)
    assert torch.equal(perfect, prompts[:, 1:-1].flip(1))
    assert torch.all(task.reward(prompts, perfect) == 1.0)
    wrong = (perfect + 1) % 10
    assert torch.all(task.reward(prompts, wrong) == 0.0)
    half = perfect.clone()
    half[:, :2] = (half[:, :2] + 1) % 10
    assert torch.allclose(task.reward(prompts, half), torch.full((4,), 3 / 5))
