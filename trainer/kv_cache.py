"""The rollout engine's KV-cache pool: one buffer allocated up front, sized in bytes by a flag.

Layout (n_layer, 2, capacity_tokens, n_head, head_dim). A batch of B sequences of S tokens uses the
first B*S token slots of every layer, viewed as (B, S, H, D); the engine splits a larger batch into
sub-batches that fit, so the pool size bounds concurrency, not correctness. The engine releases and
resumes the buffer through its memory backend (`memory_backend`).
"""
from __future__ import annotations

import torch

from trainer.config import ModelConfig
from trainer.errors import EngineError
from trainer.model import KV


class KVPool:
    def __init__(self, cfg: ModelConfig, nbytes: int, device: torch.device, dtype: torch.dtype):
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.capacity_tokens = nbytes // cfg.kv_bytes_per_token(itemsize)
        if self.capacity_tokens < cfg.max_seq_len:
            raise EngineError(f"KV cache of {nbytes} bytes holds {self.capacity_tokens} tokens, "
                              f"less than one sequence ({cfg.max_seq_len})")
        shape = (cfg.n_layer, 2, self.capacity_tokens, cfg.n_head, cfg.head_dim)
        # Zeroed, so host pages are really committed (RSS shows the pool, like a GPU allocation).
        self.buffer = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def max_batch(self, seq_len: int) -> int:
        return self.capacity_tokens // seq_len

    def views(self, batch: int, seq_len: int) -> list[KV]:
        n = batch * seq_len
        _, _, _, H, D = self.buffer.shape
        return [(layer[0, :n].view(batch, seq_len, H, D), layer[1, :n].view(batch, seq_len, H, D))
                for layer in self.buffer]

    def clear(self) -> None:
        self.buffer.zero_()
