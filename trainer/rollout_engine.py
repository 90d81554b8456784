"""The rollout engine: generation with SGLang's memory API.

Memory, by tag (`miles_profile.names`):
- `weights`: the engine's own copy of the policy (bf16 on CUDA, fp32 on CPU), one flat buffer.
- `kv_cache`: a pool allocated up front, `kv_cache_bytes` in size (`kv_cache.KVPool`).
- `cuda_graph`: captured decode steps and their private pool (CUDA, when enabled).

Semantics, as in SGLang with torch_memory_saver:
- `release_memory_occupation(tags)` frees that memory for real (CUDA: back to the driver; host:
  unmapped), inside the call. Released weights are discarded unless the engine was built with
  `weights_cpu_backup=True`, which copies them to host memory first and restores them on resume.
- `resume_memory_occupation(tags)` reallocates in the order cuda_graph -> weights -> kv_cache. Resumed
  KV is zeroed; resumed weights without a backup are zeros and must be refilled by
  `update_weights_from_tensor` before the engine serves again. Graphs are re-captured once weights and
  KV are both present (they hold raw addresses, see `cuda_graphs`).
- `update_weights_from_tensor(named_tensors)` copies each tensor into the existing weight buffer
  (casting dtype in the copy): no second copy of the weights is ever allocated, so callers send chunks.
  An update starts with the first tensor sent while the weights are complete and ends when every
  parameter has been received; until then `generate` refuses to run, so the engine never serves a mix
  of old and new weights. A completed update flushes the cache.
- `flush_cache()` zeroes the KV pool (there is no prefix cache to drop between calls).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from miles_profile.names import CUDA_GRAPH, KV_CACHE, TAGS, WEIGHTS
from trainer import cuda_graphs
from trainer.config import ModelConfig
from trainer.errors import EngineError
from trainer.flat import FlatParams, alloc_storage, free_storage, is_allocated, trim_host_heap
from trainer.kv_cache import KVPool
from trainer.model import GPT
from trainer.offload import host_buffer

RESUME_ORDER = (CUDA_GRAPH, WEIGHTS, KV_CACHE)


class RolloutEngine:
    def __init__(self, cfg: ModelConfig, device: torch.device, kv_cache_bytes: int,
                 cuda_graph: bool = False, weights_cpu_backup: bool = False):
        self.cfg, self.device = cfg, device
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        with torch.device("meta"):
            self.model = GPT(cfg).eval()
        self.weights = FlatParams(self.model, device, self.dtype, requires_grad=False)
        self.weights.flat.zero_()
        self._params = dict(self.weights.views(self.weights.flat))
        self._missing = set(self._params)  # parameters not yet filled by the current update
        self._updating = False
        self.kv = KVPool(cfg, kv_cache_bytes, device, self.dtype)
        self._backup = host_buffer(self.weights.flat) if weights_cpu_backup else None
        self._use_graphs = cuda_graph and device.type == "cuda"  # turned off if a capture fails
        self._graphs_released = False
        self._graphs: dict[tuple[int, int], cuda_graphs.DecodeGraph] = {}
        self._graph_bytes = self._last_graph_bytes = 0
        self._last_shape: tuple[int, int] | None = None

    # --- generation -----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, response_len: int, seed: int,
                 temperature: float = 1.0) -> torch.Tensor:
        """prompts (N, P) int64 -> sampled responses (N, R) int64 on CPU."""
        self._check_can_serve()
        generator = torch.Generator(self.device).manual_seed(seed)
        seq_len = prompts.shape[1] + response_len
        step = min(len(prompts), self.kv.max_batch(seq_len))
        out = [self._generate_batch(prompts[i:i + step].to(self.device), response_len, generator, temperature)
               for i in range(0, len(prompts), step)]
        return torch.cat(out).cpu()

    def _generate_batch(self, prompts: torch.Tensor, response_len: int, generator: torch.Generator,
                        temperature: float) -> torch.Tensor:
        B, P = prompts.shape
        kv = self.kv.views(B, P + response_len)
        decode = self._decoder(kv, B, P + response_len)
        logits = self.model(prompts, kv)[:, -1]  # prefill; (B, V)
        tokens = []
        for t in range(response_len):
            probs = F.softmax(logits.float() / temperature, dim=-1)
            tokens.append(torch.multinomial(probs, 1, generator=generator))  # (B, 1)
            if t + 1 < response_len:
                logits = decode(tokens[-1], P + t)[:, -1]
        return torch.cat(tokens, dim=1)

    def _decoder(self, kv, batch: int, seq_len: int):
        """A captured graph for this shape when graphs are on, else an eager decode step."""
        if self._use_graphs and not self._graphs_released:
            self._last_shape = (batch, seq_len)
            if (batch, seq_len) not in self._graphs:
                self._capture(batch, seq_len)
            if (batch, seq_len) in self._graphs:
                return self._graphs[(batch, seq_len)]
        return lambda tokens, pos: self.model(tokens, kv, torch.tensor([pos], device=self.device))

    def _capture(self, batch: int, seq_len: int) -> None:
        graph, nbytes = cuda_graphs.capture(self.model, self.kv.views(batch, seq_len), batch)
        if graph is None:
            self._use_graphs = False
            return
        self._graphs[(batch, seq_len)] = graph
        self._graph_bytes += nbytes
        self._last_graph_bytes = self._graph_bytes

    def _check_can_serve(self) -> None:
        if not is_allocated(self.weights.flat):
            raise EngineError("generate called while the engine's weights are released")
        if not self.kv.allocated:
            raise EngineError("generate called while the KV cache is released")
        if self._missing:
            raise EngineError(f"weights incomplete: {len(self._missing)} of {len(self._params)} tensors "
                              "not updated yet; refusing to serve a mix of old and new weights")

    # --- memory API -----------------------------------------------------------------------------

    def occupied_bytes(self, tags: Sequence[str]) -> int:
        """Bytes that releasing `tags` would free from the engine's device (host on a CPU run)."""
        tags = _check_tags(tags)
        total = 0
        if WEIGHTS in tags and is_allocated(self.weights.flat):
            total += self.weights.flat.numel() * self.weights.flat.element_size()
        if KV_CACHE in tags and self.kv.allocated:
            total += self.kv.nbytes
        if self._graphs and set(tags) & {CUDA_GRAPH, WEIGHTS, KV_CACHE}:
            total += self._graph_bytes
        if WEIGHTS in tags and self._backup is not None and self.device.type == "cpu":
            total -= self.weights.flat.numel() * self.weights.flat.element_size()  # the backup stays
        return max(total, 0)

    def released_bytes(self, tags: Sequence[str]) -> int:
        """Bytes that resuming `tags` would allocate again (graphs: their size when last captured)."""
        tags = _check_tags(tags)
        total = 0
        if WEIGHTS in tags and not is_allocated(self.weights.flat):
            total += self.weights_bytes
        if KV_CACHE in tags and not self.kv.allocated:
            total += self.kv.nbytes
        if CUDA_GRAPH in tags and self._use_graphs and not self._graphs:
            total += self._last_graph_bytes
        return total

    def release_memory_occupation(self, tags: Sequence[str]) -> None:
        tags = _check_tags(tags)
        if self._graphs:  # graphs point into weights and KV: they go whenever either goes
            self._graphs.clear()
            self._graph_bytes = 0
        if CUDA_GRAPH in tags:
            self._graphs_released = True
        if WEIGHTS in tags and is_allocated(self.weights.flat):
            self._release_weights()
        if KV_CACHE in tags and self.kv.allocated:
            self.kv.release()
        _return_memory(self.device)

    def resume_memory_occupation(self, tags: Sequence[str]) -> None:
        tags = _check_tags(tags)
        for tag in RESUME_ORDER:
            if tag == CUDA_GRAPH and tag in tags:
                self._graphs_released = False
            elif tag == WEIGHTS and tag in tags and not is_allocated(self.weights.flat):
                self._resume_weights()
            elif tag == KV_CACHE and tag in tags and not self.kv.allocated:
                self.kv.resume()
        if CUDA_GRAPH in tags and self._use_graphs and self._last_shape and self._can_capture():
            self._capture(*self._last_shape)

    def _can_capture(self) -> bool:
        return is_allocated(self.weights.flat) and self.kv.allocated and not self._graphs

    def _release_weights(self) -> None:
        if self._backup is not None:
            self._backup.copy_(self.weights.flat)
        else:
            self._missing = set(self._params)
            self._updating = False
        free_storage(self.weights.flat)
        trim_host_heap()

    def _resume_weights(self) -> None:
        alloc_storage(self.weights.flat)
        if self._backup is not None:
            self.weights.flat.copy_(self._backup)
        else:
            self.weights.flat.zero_()

    # --- weights --------------------------------------------------------------------------------

    @torch.no_grad()
    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy a chunk of (name, tensor) into the existing weight buffers; see the module docstring."""
        if not is_allocated(self.weights.flat):
            raise EngineError("update_weights_from_tensor called while the engine's weights are released")
        if not self._updating:
            self._missing, self._updating = set(self._params), True
        for name, tensor in named_tensors:
            dst = self._params.get(name)
            if dst is None or dst.shape != tensor.shape:
                raise EngineError(f"update_weights_from_tensor: no parameter {name} of shape {tuple(tensor.shape)}")
            dst.copy_(tensor, non_blocking=True)
            self._missing.discard(name)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the caller may reuse the source buffer right away
        if not self._missing:
            self._updating = False
            self.flush_cache()

    def flush_cache(self) -> None:
        if self.kv.allocated:
            self.kv.clear()

    @property
    def weights_bytes(self) -> int:
        return self.weights.flat.numel() * self.weights.flat.element_size()

    @property
    def serving_ready(self) -> bool:
        return is_allocated(self.weights.flat) and self.kv.allocated and not self._missing


def _check_tags(tags: Sequence[str]) -> tuple[str, ...]:
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise ValueError(f"unknown memory tag(s) {unknown}; known: {list(TAGS)}")
    return tuple(tags)


def _return_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        # cuBLAS keeps a workspace (32 MiB + 1 MiB on Hopper) per stream it ran on, cached for the
        # life of the process: the graph's warm-up and capture streams each left one, the capture's
        # inside the graph's private pool, which it kept alive (measured on the H200: 66 of 130 MiB
        # came back without this, all of it with). torch's own CUDA-graph trees clear them too.
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
