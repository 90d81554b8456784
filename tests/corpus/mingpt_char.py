"""A minGPT-style character transformer learning to reverse digit strings, written the way minGPT is.

    python tests/corpus/mingpt_char.py [--defect D] [--device cpu|cuda] [--iters N] [--size small|large|tiny]

Each iteration: train (AdamW steps) -> offload_train (the AdamW state to host memory by hand: on CUDA
`.to("cpu")` + empty_cache; on CPU to a file) -> generate (minGPT's sampling loop, cropping the context)
-> onload_train. On CPU the small model's state (~13 MiB of AdamW state) lies below what host RSS resolves:
its offloads must come out "too small to judge" or pass, never fail.

Defects (planted; healthy = none):
  late_free   the old state dict sits in a reference cycle: only the collector, run inside the next
              phase, frees it (offload_drop/freed_late)
  leak        the validation loss of each iteration computed with autograd on and kept as a tensor
              (`losses.append(loss)` without `.item()`): its graph's activations leak (leak/sustained_growth)
"""
from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import miles_profile as mp
from offload_tools import device_of, log, offload_dir, optimizer_bytes, parse_args, release_cache

DEFECTS = ("late_free", "leak")
DIGITS = 8          # reverse 8 digits: the sequence is the digits, then their reverse
VOCAB = 10


@dataclass
class GPTConfig:
    block_size: int = 2 * DIGITS - 1
    vocab_size: int = VOCAB
    n_layer: int = 4
    n_head: int = 8
    n_embd: int = 256


SIZES = {"small": GPTConfig(), "large": GPTConfig(n_layer=12, n_head=16, n_embd=1024),
         "tiny": GPTConfig(n_layer=1, n_head=2, n_embd=8)}
BATCH = {"small": 64, "large": 512, "tiny": 16}
STEPS = 2


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.n_head = cfg.n_head
        self.register_buffer("bias", torch.tril(torch.ones(cfg.block_size, cfg.block_size))
                             .view(1, 1, cfg.block_size, cfg.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T), kept by autograd
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.n_embd), CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(cfg.n_embd), nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                                            ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens):
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.cfg.block_size:])
            idx = torch.cat((idx, logits[:, -1, :].argmax(-1, keepdim=True)), dim=1)
        return idx


def reverse_batch(batch: int, device):
    """x: digits then their reverse (less the last); y: the next token, -1 where no loss is taken."""
    digits = torch.randint(0, VOCAB, (batch, DIGITS))
    seq = torch.cat([digits, digits.flip(1)], dim=1)
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    y[:, :DIGITS - 1] = -1
    return x.to(device), y.to(device)


class Trainer:
    def __init__(self, args):
        self.args, self.device = args, device_of(args)
        self.model = GPT(SIZES[args.size]).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4, betas=(0.9, 0.95))
        self.path = os.path.join(offload_dir("mingpt"), "optimizer.pt")
        self.losses = []

    def train(self) -> float:
        self.model.train()
        for _ in range(STEPS):
            x, y = reverse_batch(BATCH[self.args.size], self.device)
            _, loss = self.model(x, y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.losses.append(self.validate())
        return float(loss)

    def validate(self):
        """The validation loss, logged. The leak: computed with autograd on and kept as a tensor, so
        each iteration's graph, with the activations it saved, lives on in `self.losses`."""
        self.model.eval()
        x, y = reverse_batch(64, self.device)
        if self.args.defect == "leak":
            return self.model(x, y)[1]
        with torch.no_grad():
            return self.model(x, y)[1].item()

    def offload_train(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        state = self.optimizer.state
        if self.args.device == "cuda":
            moved = {p: {k: (v.to("cpu") if torch.is_tensor(v) else v) for k, v in s.items()} for p, s in state.items()}
        else:
            torch.save(self.optimizer.state_dict(), self.path)
            moved = {}
        if self.args.defect == "late_free":
            old = dict(state)
            old["cycle"] = old  # a cycle: refcounting cannot free it, only the collector can
        state.clear()
        state.update(moved)
        if self.args.defect == "late_free":
            del old
            gc.disable()  # as a job that tunes the collector away from its hot loop would
            if self.args.device == "cuda":
                torch.cuda.empty_cache()
        else:
            release_cache(self.args.device)

    def generate(self) -> str:
        prompt, _ = reverse_batch(BATCH[self.args.size] // 4, self.device)
        out = self.model.generate(prompt[:, :DIGITS], DIGITS)
        if self.args.defect == "late_free":
            gc.enable()
            release_cache(self.args.device)  # the collector runs at last, in this phase
        return "".join(map(str, out[0].tolist()))

    def onload_train(self) -> None:
        if self.args.device == "cuda":
            for s in self.optimizer.state.values():
                for k, v in s.items():
                    if torch.is_tensor(v) and v.dim() > 0:
                        s[k] = v.to(self.device)
        else:
            self.optimizer.load_state_dict(torch.load(self.path))
            os.remove(self.path)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], DEFECTS, iters=8, sizes=tuple(SIZES))
    trainer = Trainer(args)
    for it in range(args.iters):
        with mp.phase("train", rollout_id=it):
            loss = trainer.train()
        with mp.phase("offload_train", rollout_id=it, target="cpu" if args.device == "cuda" else "disk",
                      expected_bytes=optimizer_bytes(trainer.optimizer), tags=["optimizer"]):
            trainer.offload_train()
        with mp.phase("generate", rollout_id=it):
            sample = trainer.generate()
        with mp.phase("onload_train", rollout_id=it):
            trainer.onload_train()
        log(f"iteration {it}: loss {loss:.4f}, sample {sample}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
