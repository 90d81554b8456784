"""Captured decode steps (CUDA only): the memory tagged `cuda_graph`.

A graph records raw device addresses. With the builtin memory backend weights and the KV pool get new
addresses whenever they are released and resumed, so releasing either drops the graphs, and they are
captured again once both are back (at the end of `resume_memory_occupation`, or at the next
`generate`). With torch_memory_saver the addresses survive a pause, so the graphs are kept.
"""
from __future__ import annotations

from typing import Callable, ContextManager

import torch

from trainer.model import GPT, KV


class DecodeGraph:
    """One decode step for a fixed batch size and fixed KV views."""

    def __init__(self, model: GPT, kv: list[KV], batch: int,
                 capture: Callable[["torch.cuda.CUDAGraph"], ContextManager]):
        device = kv[0][0].device
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        side = _warmup_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up kernels and workspaces outside the capture
            for _ in range(2):
                model(self.tokens, kv, self.pos)
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_reserved(device)
        self.graph = torch.cuda.CUDAGraph()
        with capture(self.graph):  # the memory backend's capture context (memory_backend.*.graph)
            self.logits = model(self.tokens, kv, self.pos)  # (B, 1, V), overwritten by each replay
        torch.cuda.synchronize(device)
        # What the capture itself put in its pool (the warm-up's blocks and workspaces are not in it):
        # the bytes a torch_memory_saver pause of `cuda_graph` returns.
        self.capture_bytes = max(0, torch.cuda.memory_reserved(device) - before)

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
def capture(model: GPT, kv: list[KV], batch: int,
            context: Callable[["torch.cuda.CUDAGraph"], ContextManager]) -> tuple[DecodeGraph | None, int]:
    """(graph, bytes its memory pool reserved); (None, 0) with one printed line if capture fails,
    and the engine decodes eagerly."""
    device = kv[0][0].device
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_reserved(device)
    try:
        graph = DecodeGraph(model, kv, batch, context)
    except RuntimeError as exc:
        print(f"trainer: CUDA graph capture failed, decoding eagerly: {str(exc).splitlines()[0]}", flush=True)
        return None, 0
    torch.cuda.synchronize(device)
    return graph, max(0, torch.cuda.memory_reserved(device) - before)
