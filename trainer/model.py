"""A small decoder-only transformer (GPT-2 style, pre-LayerNorm, learned positions).

One forward serves three uses: training (`kv=None`, causal over the whole sequence), prefill (`kv`
given, `pos=None`: writes positions 0..T-1 of the cache) and decode (`kv` and a (1,) `pos` tensor: one
token per sequence, written at `pos`, attending to 0..pos through a mask). Decode keeps every shape
static and reads `pos` from a tensor, so a CUDA graph can capture it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig

KV = tuple[torch.Tensor, torch.Tensor]  # per layer: keys, values, each (B, S, H, D)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.n_head = cfg.n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, kv: KV | None, pos: torch.Tensor | None) -> torch.Tensor:
        x = x + self.proj(self._attend(self.ln1(x), kv, pos))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

    def _attend(self, x: torch.Tensor, kv: KV | None, pos: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).unbind(2)  # (B, T, H, D)
        if kv is None:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
        elif pos is None:  # prefill from position 0
            kv[0][:, :T], kv[1][:, :T] = k, v
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
        else:  # decode one token at `pos`; positions after it hold stale values, masked out
            kv[0].index_copy_(1, pos, k)
            kv[1].index_copy_(1, pos, v)
            visible = (torch.arange(kv[0].shape[1], device=x.device) <= pos).view(1, 1, 1, -1)  # (1, 1, 1, S)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kv[0].transpose(1, 2),
                                               kv[1].transpose(1, 2), attn_mask=visible)
        return y.transpose(1, 2).reshape(B, T, C)


class Embedding(nn.Embedding):
    """nn.Embedding that leaves a meta-device weight uninitialised. torch has no C++ meta kernel for
    `normal_`: its Python one imports about 820 modules the first time (1.0 CPU-s and 23.7 MiB of heap in
    every process that builds the model on the meta device, as the actor and the engine do); a meta
    weight holds no values to initialise, and `init_weights` initialises the real one."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class GPT(nn.Module):
    """Token ids (B, T) -> (B, T, out_dim): logits by default, one value per position for a critic."""

    def __init__(self, cfg: ModelConfig, out_dim: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size if out_dim is None else out_dim)

    def forward(self, idx: torch.Tensor, kv: list[KV] | None = None,
                pos: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device) if pos is None else pos
        x = self.tok_emb(idx) + self.pos_emb(positions)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, None if kv is None else kv[i], pos)
        return self.head(self.ln_f(x))


@torch.no_grad()
def init_weights(model: GPT, generator: torch.Generator | None = None) -> None:
    """GPT-2 init in place (works on parameters that are views into a flat buffer)."""
    residual_std = 0.02 / math.sqrt(2 * model.cfg.n_layer)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif ".ln" in name or name.startswith("ln"):
            p.fill_(1.0)
        else:
            std = residual_std if name.endswith(("proj.weight", "out.weight")) else 0.02
            p.normal_(0.0, std, generator=generator)


def settle_torch(cfg: ModelConfig) -> None:
    """Build the model once on the meta device, allocating nothing of it: whatever torch does once per
    process for the first model (lazy imports, initialisation) is then a cost of the process, like its
    libraries, that a heap baseline read afterwards (`mp.heap_baseline`) leaves out of what the host forecast
    is compared with. (It was 23.7 MiB, all of it the Python meta kernel of `normal_`, now never run: see
    `Embedding`; the trainer's optimizer imports nothing either, see `TrainModel._adamw`.)"""
    with torch.device("meta"):
        GPT(cfg)
