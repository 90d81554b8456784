"""Advantages and losses: GRPO (group-normalised rewards) and PPO with a learned critic (GAE).

Rewards are per sequence and arrive at the last response token. One optimizer step per rollout, on
policy, so the importance ratio is exp(logp - logp.detach()) = 1 in value and carries the gradient;
the clipped form is kept so more steps per rollout would need no change here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CLIP_EPS = 0.2
GAE_LAMBDA = 0.95  # gamma is 1: episodes are a dozen tokens long


def grpo_advantages(rewards: torch.Tensor, group_size: int, response_len: int) -> torch.Tensor:
    """(N,) rewards in consecutive groups -> (N, R) advantages: (r - group mean) / (group std + eps)."""
    groups = rewards.view(-1, group_size)
    adv = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + 1e-6)
    return adv.reshape(-1, 1).expand(-1, response_len)


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, lam: float = GAE_LAMBDA) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards (N,), values (N, R) -> (advantages, returns), each (N, R), with gamma = 1."""
    N, R = values.shape
    token_rewards = torch.zeros_like(values)
    token_rewards[:, -1] = rewards
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    deltas = token_rewards + next_values - values
    adv = torch.zeros_like(values)
    running = torch.zeros(N, dtype=values.dtype, device=values.device)
    for t in reversed(range(R)):
        running = deltas[:, t] + lam * running
        adv[:, t] = running
    return adv, adv + values


def whiten(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / (x.std() + 1e-6)


def response_logprobs(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """logits (N, T-1, V) for inputs tokens[:, :-1] -> (N, R) log-probs of the response tokens."""
    logp = F.log_softmax(logits[:, prompt_len - 1:].float(), dim=-1)
    return logp.gather(-1, tokens[:, prompt_len:].unsqueeze(-1)).squeeze(-1)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS)
    return -torch.minimum(ratio * adv, clipped * adv).mean()


def value_loss(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    return 0.5 * (values.float() - returns).pow(2).mean()
