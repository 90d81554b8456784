"""Byte sizes the memory forecast (`plan.py`) derives from the model's shapes, without building it:
the flat parameter layout of `model.GPT`, the chunks `flat.FlatParams.chunk_ranges` cuts, and what one
micro-batch of the training step keeps alive (the derivation is in plan.py's docstring).
Pure integer arithmetic; tests/unit/test_trainer_plan.py holds each against the real objects."""
from __future__ import annotations

from trainer.config import ModelConfig


def param_numels(cfg: ModelConfig, out_dim: int | None = None) -> list[int]:
    """Element counts of `model.GPT`'s parameters in `named_parameters()` order (the flat layout)."""
    d, out = cfg.d_model, cfg.vocab_size if out_dim is None else out_dim
    block = [d, d, d, d, 3 * d * d, 3 * d, d * d, d, 4 * d * d, 4 * d, 4 * d * d, d]  # ln1, ln2, qkv, proj, fc, out
    return [cfg.vocab_size * d, cfg.max_seq_len * d, *block * cfg.n_layer, d, d, d * out, out]


def max_chunk_numel(numels: list[int], max_bytes: int, itemsize: int) -> int:
    """The largest range of `flat.FlatParams.chunk_ranges` (same cutting rule)."""
    sizes, start, offset = [], 0, 0
    for n in numels:
        if (offset + n - start) * itemsize > max_bytes and offset > start:
            sizes.append(offset - start)
            start = offset
        offset += n
    return max(sizes + [offset - start])


def _linear_numel(cfg: ModelConfig, out_dim: int | None) -> int:
    d, out = cfg.d_model, cfg.vocab_size if out_dim is None else out_dim
    return cfg.n_layer * (12 * d * d + 9 * d) + d * out + out


def train_activation_bytes(cfg: ModelConfig, cuda: bool, micro_batch: int, out_dims: list[int | None]) -> dict[str, int]:
    """Bytes one micro-batch's forward leaves for backward, plus backward's first transient."""
    n = micro_batch * (cfg.max_seq_len - 1)  # tokens per micro-batch (inputs are tokens[:, :-1])
    d, total = cfg.d_model, 0
    for out in out_dims:
        per_token = 36 * d if cuda else 64 * d
        total += cfg.n_layer * per_token * n + (6 if cuda else 8) * d * n  # + ln_f input and output
        total += n * (cfg.vocab_size if out is None else out) * (2 + 4 + 4)  # logits, fp32 log-softmax
        if cuda:
            total += 2 * _linear_numel(cfg, out)  # bf16 weight copies, saved for backward
    largest = 4 * cfg.d_model * cfg.d_model
    total += (6 if cuda else 4) * largest  # the first weight gradient (bf16 and its fp32 cast)
    return {"activations": total}
