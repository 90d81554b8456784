"""Model shapes and size presets. Bytes are ints everywhere; GiB appears only in printed lines."""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1024**2
GiB = 1024**3


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layer: int
    n_head: int
    max_seq_len: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def num_params(self, out_dim: int | None = None) -> int:
        """Parameters of `model.GPT` with an output head of `out_dim` (vocab by default)."""
        d, out = self.d_model, self.vocab_size if out_dim is None else out_dim
        block = 12 * d * d + 13 * d  # qkv, proj, fc, out weights and biases, two LayerNorms
        return (self.vocab_size + self.max_seq_len) * d + self.n_layer * block + 2 * d + d * out + out

    def kv_bytes_per_token(self, itemsize: int) -> int:
        return self.n_layer * 2 * self.d_model * itemsize


@dataclass(frozen=True)
class Preset:
    d_model: int
    n_layer: int
    n_head: int
    digits: int                # task: reverse a string of this many digits
    rollout_batch_size: int    # prompts per rollout
    n_samples_per_prompt: int  # GRPO group size
    micro_batch_size: int      # sequences per forward/backward
    kv_cache_bytes: int        # rollout engine KV pool, allocated up front
    chunk_bytes: int           # offload / weight-update chunk
    lr: float
    # None: torch's default. The small presets' matmuls gain little from threads and lose 5-10x when
    # other processes hold the cores (OpenMP workers wait on each other at every op).
    torch_threads: int | None = None


PRESETS: dict[str, Preset] = {
    # Seconds per rollout; for tests and the learning check.
    "tiny": Preset(d_model=64, n_layer=2, n_head=4, digits=4, rollout_batch_size=32,
                   n_samples_per_prompt=8, micro_batch_size=256, kv_cache_bytes=2 * MiB,
                   chunk_bytes=256 * 1024, lr=3e-3, torch_threads=1),
    # ~14.8M params: weights + grads + AdamW ~ 236 MB and a 192 MiB KV pool, so every drop stands far
    # above allocator noise on CPU; micro-batches of 16 keep activations (~50 MB) well below both.
    "cpu": Preset(d_model=320, n_layer=12, n_head=8, digits=6, rollout_batch_size=16,
                  n_samples_per_prompt=8, micro_batch_size=16, kv_cache_bytes=192 * MiB,
                  chunk_bytes=16 * MiB, lr=1e-3, torch_threads=1),
    # ~1.1B params: ~17.7 GB of fp32 training state and a 12 GiB KV pool on one H200. Micro-batches
    # of 32 keep activations plus autocast's bf16 weight copies near 4 GB.
    "gpu": Preset(d_model=2048, n_layer=22, n_head=16, digits=12, rollout_batch_size=64,
                  n_samples_per_prompt=8, micro_batch_size=32, kv_cache_bytes=12 * GiB,
                  chunk_bytes=256 * MiB, lr=2e-5),
}

VOCAB_SIZE = 16  # digits 0-9, BOS, SEP, and padding to a round size


def model_config(preset: Preset, digits: int) -> ModelConfig:
    from trainer.task import sequence_lengths  # task imports torch; the planner reads this module without it
    prompt_len, response_len = sequence_lengths(digits)
    return ModelConfig(VOCAB_SIZE, preset.d_model, preset.n_layer, preset.n_head,
                       max_seq_len=prompt_len + response_len)


def gib(nbytes: int) -> str:
    """Bytes as GiB, for the screen only."""
    return f"{nbytes / GiB:.3f} GiB"
