"""The synthetic task: reverse a digit string. Verifiable, dense reward, learnable from scratch by RL.

Prompt  = [BOS, d1 .. dn, SEP]; the response is exactly n tokens (no EOS, so every sequence in a batch
has the same length and the KV cache needs no padding). Reward = share of positions equal to the
reversed digits, in [0, 1]; a uniform random policy scores 1/VOCAB_SIZE.
"""
from __future__ import annotations

import torch

BOS, SEP = 10, 11


def sequence_lengths(digits: int) -> tuple[int, int]:
    """(prompt_len, response_len) for strings of `digits` digits."""
    return digits + 2, digits


def sample_prompts(n: int, digits: int, generator: torch.Generator) -> torch.Tensor:
    """(n, digits + 2) int64 prompts on CPU."""
    body = torch.randint(0, 10, (n, digits), generator=generator)
    bos = torch.full((n, 1), BOS, dtype=torch.long)
    sep = torch.full((n, 1), SEP, dtype=torch.long)
    return torch.cat([bos, body, sep], dim=1)


def targets(prompts: torch.Tensor) -> torch.Tensor:
    """(n, digits): the digits of each prompt, reversed."""
    return prompts[:, 1:-1].flip(1)


def reward(prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """(n,) float32: share of response tokens that match the reversed digits."""
    return (responses.to(prompts.device) == targets(prompts)).float().mean(dim=1)
