"""Captured decode steps (CUDA only): the memory tagged `cuda_graph`.

A graph records raw device addresses. Weights and the KV pool get new addresses whenever they are
released and resumed, so releasing either drops the graphs, and they are captured again once both are
back (at the end of `resume_memory_occupation`, or at the next `generate`).
"""
from __future__ import annotations

import torch

from trainer.model import GPT, KV


class DecodeGraph:
    """One decode step for a fixed batch size and fixed KV views."""

    def __init__(self, model: GPT, kv: list[KV], batch: int):
        device = kv[0][0].device
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        side = _warmup_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up kernels and workspaces outside the capture
            for _ in range(2):
                model(self.tokens, kv, self.pos)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the recorder's sampler thread may query the allocator during the capture.
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.logits = model(self.tokens, kv, self.pos)  # (B, 1, V), overwritten by each replay

    def __call__(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.pos.fill_(pos)
        self.graph.replay()
        return self.logits


_WARMUP_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _warmup_stream(device: torch.device) -> torch.cuda.Stream:
    """One warm-up stream per device for every capture: each new stream costs a cuBLAS workspace."""
    if device not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[device] = torch.cuda.Stream(device)
    return _WARMUP_STREAMS[device]


@torch.no_grad()
def capture(model: GPT, kv: list[KV], batch: int) -> tuple[DecodeGraph | None, int]:
    """(graph, bytes its private pool reserved); (None, 0) with one printed line if capture fails,
    and the engine decodes eagerly."""
    device = kv[0][0].device
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_reserved(device)
    try:
        graph = DecodeGraph(model, kv, batch)
    except RuntimeError as exc:
        print(f"trainer: CUDA graph capture failed, decoding eagerly: {str(exc).splitlines()[0]}", flush=True)
        return None, 0
    torch.cuda.synchronize(device)
    return graph, max(0, torch.cuda.memory_reserved(device) - before)
